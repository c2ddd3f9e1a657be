"""lm-evaluation-harness adapter: any attnlab :class:`LanguageModel` as an lm-eval model.

Registered as ``attnlab`` when this module is imported::

    python -m attnlab.eval.lm_eval_cli --model attnlab --model_args path=RUN_DIR,batch_size=8 \\
        --tasks attnlab_cloze_local --include_path src/attnlab/eval/tasks

``path`` takes every target ``attnlab eval`` takes (run or checkpoint dir, probe dir,
``hf:ID_OR_DIR``, a ``.gguf`` file). lm-eval 0.4.13 has no plugin discovery for models, so the
stock ``lm_eval`` command does not import this module: use ``attnlab.eval.lm_eval_cli`` (the
same CLI with this model registered), or ``import attnlab.eval.harness`` before calling
``lm_eval.simple_evaluate(model="attnlab", ...)``.

Semantics follow lm-eval's ``HFLM``: ``loglikelihood`` uses lm-eval's context/continuation
tokenization (``TemplateLM``) and returns ``(logprob, is_greedy)``; ``loglikelihood_rolling``
scores every token once with disjoint windows (``stride = max_length`` by default, lm-eval's
``context_len=1``); ``generate_until`` decodes greedily until a stop string, EOS or
``max_gen_toks``. A continuation longer than the context, where HFLM stops on an ``assert``, is
scored on its last ``max_length`` tokens with one counted warning (:func:`fit_continuations`).
"""

from __future__ import annotations

import logging
from typing import Any

# lm-eval's own models must be registered first: get_model imports them only while the
# registry is empty, so registering "attnlab" alone would hide "hf" and the others.
import lm_eval.models  # noqa: F401
import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from attnlab.eval.lm import LanguageModel
from attnlab.eval.perplexity import document_logprobs
from attnlab.eval.scoring import score_continuations
from attnlab.eval.targets import load_language_model

log = logging.getLogger(__name__)


def _device_arg(device: str | None) -> str:
    """lm-eval's CLI defaults to ``cuda:0``; like HFLM, fall back to ``auto`` when CUDA is
    missing. This maps lm-eval's default, it resolves nothing: ``auto`` is resolved by
    :func:`attnlab.runs.device.resolve_device` when the model loads."""
    if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):
        return "auto"
    return str(device)


def _batch_size_arg(batch_size: Any) -> int:
    """An int; lm-eval's ``auto`` / ``auto:N`` become 8 (no automatic search here)."""
    if batch_size is None or str(batch_size).startswith("auto"):
        return 8
    return max(1, int(batch_size))


def fit_continuations(
    pairs: list[tuple[list[int], list[int]]], max_length: int
) -> tuple[list[tuple[list[int], list[int]]], list[int]]:
    """Requests whose continuation is longer than ``max_length``, cut from the left to its last
    ``max_length`` tokens (the cut tokens become the context: the window is the continuation's
    last ``max_length + 1`` tokens); returns the pairs and the indices of those cut."""
    out, cut = [], []
    for i, (ctx, cont) in enumerate(pairs):
        if len(cont) > max_length:
            ctx, cont = list(cont[:-max_length]), list(cont[-max_length:])
            cut.append(i)
        out.append((ctx, cont))
    return out, cut


def _request_label(req: Any) -> str:
    """``task 'NAME', doc_id N`` for an lm-eval ``Instance`` (what lm-eval's samples show)."""
    task, doc = getattr(req, "task_name", None), getattr(req, "doc_id", None)
    where = f"task {task!r}, " if task else ""
    return f"{where}doc_id {doc}" if doc is not None else f"{where}request {req.idx}"


@register_model("attnlab")
class AttnlabEvalLM(TemplateLM):
    """lm-eval model over an attnlab :class:`LanguageModel`."""

    def __init__(
        self,
        path: str | None = None,
        pretrained: str | None = None,
        lm: LanguageModel | None = None,
        batch_size: int | str | None = 8,
        max_batch_size: int | None = None,
        device: str | None = None,
        dtype: str | None = None,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        stride: int | None = None,
        trust_remote_code: bool | str = False,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if kwargs:
            log.warning("attnlab model ignores unknown model_args: %s", ", ".join(kwargs))
        if lm is None:
            target = path or pretrained
            if not target:
                raise ValueError(
                    "the attnlab model needs model_args path=RUN_DIR (or hf:ID, a .gguf file, a "
                    "probe dir)"
                )
            lm = load_language_model(
                target,
                device=_device_arg(device),
                dtype=dtype,
                max_length=int(max_length) if max_length else None,
                trust_remote_code=str(trust_remote_code).lower() in ("true", "1", "yes"),
            )
        elif max_length:
            lm.limit_context(int(max_length))
        self.lm = lm
        self._batch_size = _batch_size_arg(batch_size)
        self._max_gen_toks = int(max_gen_toks)
        self.stride = int(stride) if stride else None

    @classmethod
    def create_from_arg_string(
        cls, arg_string: str, additional_config: dict | None = None
    ) -> AttnlabEvalLM:
        """``--model_args`` win over the CLI's ``--batch_size`` / ``--device`` (which always
        arrive, with defaults), instead of clashing with them."""
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(
        cls, arg_dict: dict[str, Any], additional_config: dict | None = None
    ) -> AttnlabEvalLM:
        extra = {
            k: v
            for k, v in (additional_config or {}).items()
            if v is not None and k not in arg_dict
        }
        return cls(**arg_dict, **extra)

    # ---------------------------------------------------------------- properties lm-eval reads

    @property
    def eot_token_id(self) -> int:
        return self.lm.eos_id

    @property
    def prefix_token_id(self) -> int:
        return self.lm.prefix_id

    @property
    def max_length(self) -> int:
        return self.lm.max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def device(self) -> torch.device:
        return self.lm.device

    @property
    def tokenizer_name(self) -> str:
        return self.lm.tokenizer_name

    def get_model_info(self) -> dict[str, Any]:
        return {f"attnlab_{k}": v for k, v in self.lm.info().items()}

    # -------------------------------------------------------------------------- tokenization

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs
    ) -> list[int]:
        return self.lm.encode(string)

    def tok_decode(self, tokens: list[int], **kwargs) -> str:
        return self.lm.decode(tokens)

    # ------------------------------------------------------------------------------- scoring

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """lm-eval's tokenization (``TemplateLM``); a continuation longer than the context is
        scored on its last ``max_length`` tokens (cut from the left, as lm-eval cuts contexts),
        with one warning counting such requests and naming the first (task, ``doc_id``): lm-eval
        scores every task's requests in one call, so a refusal would stop them all."""
        self._labels = [_request_label(req) for req in requests]
        try:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        finally:
            self._labels = None

    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str], list[int], list[int]]],
        disable_tqdm: bool = False,
        override_bs: int | None = None,
    ) -> list[tuple[float, bool]]:
        labels = getattr(self, "_labels", None)
        if labels is None or len(labels) != len(requests):
            labels = [f"request {i}" for i in range(len(requests))]
        pairs, cut = fit_continuations([(ctx, cont) for _, ctx, cont in requests], self.max_length)
        if cut:
            named = ", ".join(labels[i] for i in cut[:3]) + (" ..." if len(cut) > 3 else "")
            log.warning(
                "%d request(s) have a continuation longer than the model's context of %d tokens "
                "(%s); each was scored on its last %d tokens, cut from the left as lm-eval cuts "
                "contexts, so its score leaves out the first tokens",
                len(cut),
                self.max_length,
                named,
                self.max_length,
            )
        scores = score_continuations(
            self.lm, pairs, override_bs or self.batch_size, progress=not disable_tqdm, labels=labels
        )
        out = []
        for (key, _, _), s in zip(requests, scores):
            answer = (s.logprob, s.is_greedy)
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
            out.append(answer)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        strings = [req.args[0] for req in requests]
        docs = [self.tok_encode(s) for s in strings]
        totals = document_logprobs(
            self.lm,
            docs,
            stride=self.stride or self.lm.max_length,
            batch_size=self.batch_size,
            progress=not disable_tqdm,
        )
        for s, total in zip(strings, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", (s,), total)
        return totals

    # ---------------------------------------------------------------------------- generation

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        eos_text = self.lm.decode([self.lm.eos_id])
        out = []
        for req in requests:
            context, gen_kwargs = req.args
            kwargs = dict(gen_kwargs or {})
            if kwargs.get("do_sample") or float(kwargs.get("temperature", 0.0) or 0.0) > 0:
                log.warning("attnlab model decodes greedily; ignoring sampling settings")
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            if eos_text and eos_text not in until:
                until.append(eos_text)
            max_new = int(
                kwargs.get("max_gen_toks") or kwargs.get("max_new_tokens") or self.max_gen_toks
            )
            room = max(1, self.max_length - max_new)
            ids = self.tok_encode(context)[-room:] if context else [self.lm.prefix_id]

            def stop(generated: list[int], until: list[str] = until) -> bool:
                text = self.lm.decode(generated)
                return any(u and u in text for u in until)

            text = self.lm.decode(self.lm.greedy_generate(ids, max_new, stop))
            for u in until:
                if u:
                    text = text.split(u)[0]
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            out.append(text)
        return out
