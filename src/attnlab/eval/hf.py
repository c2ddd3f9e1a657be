"""A Hugging Face causal LM (hub id, local directory or GGUF file) as a :class:`LanguageModel`."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.base.errors import UserError
from attnlab.base.params import n_params
from attnlab.eval.lm import LanguageModel
from attnlab.runs.device import resolve_device

#: used when neither the config nor the tokenizer states a context length (as lm-eval does)
DEFAULT_MAX_LENGTH = 2048
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFCausalLM(LanguageModel):
    """``transformers`` causal LM + tokenizer. Text is encoded without special tokens; the
    prefix token is BOS when the tokenizer has one, else EOS (as lm-eval's HFLM)."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        name: str = "hf",
        max_length: int | None = None,
        device: str | torch.device | None = None,
        results_dir: Path | None = None,
    ) -> None:
        if tokenizer.eos_token_id is None and tokenizer.bos_token_id is None:
            raise UserError(f"the tokenizer of {name} has neither an EOS nor a BOS token")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.results_dir = results_dir
        self._device = resolve_device(device) if device is not None else model.device
        self.model.to(self._device)
        self._max_length = _context_length(model.config, tokenizer)
        self.limit_context(max_length)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        *,
        gguf_file: str | None = None,
        device: str | torch.device | None = "auto",
        dtype: str | None = None,
        max_length: int | None = None,
        trust_remote_code: bool = False,
        **model_kwargs: Any,
    ) -> HFCausalLM:
        """Load with ``AutoModelForCausalLM`` / ``AutoTokenizer``: a hub id (online), a local
        directory, or ``gguf_file`` inside the directory ``name_or_path`` (de-quantized to
        ``dtype``, float32 by default; needs the ``gguf`` package).

        ``trust_remote_code`` is the user's consent to run code the folder carries (its
        ``auto_map`` modules, an attnlab export's plugin files: :mod:`attnlab.base.consent`);
        without it such a folder is refused, naming the code and ``--trust-remote-code``."""
        from attnlab.base.consent import FLAG, trusting_remote_code
        from attnlab.base.extras import require

        require("eval", "transformers", what=f"evaluating the Hugging Face model {name_or_path}")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        src = str(name_or_path)
        if _is_attnlab_export(src):
            import attnlab.hf  # noqa: F401  (registers the classes: no remote code needed)
        extra: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
        if dtype is not None and dtype not in _DTYPES:
            raise UserError(f"dtype={dtype!r} is not one of {', '.join(_DTYPES)}")
        extra["trust_remote_code"] = bool(trust_remote_code)  # never transformers' prompt
        try:
            with trusting_remote_code(trust_remote_code):
                tokenizer = AutoTokenizer.from_pretrained(src, **extra)
                model = AutoModelForCausalLM.from_pretrained(
                    src, dtype=_DTYPES[dtype or "float32"], **extra, **model_kwargs
                )
        except UserError:
            raise
        except ImportError as e:
            raise UserError(
                f"loading {src!r} needs a package that is missing ({e}); GGUF files need "
                "`pip install gguf accelerate`"
            ) from None
        except Exception as e:  # transformers raises many kinds for files it cannot use
            where = f"{src}/{gguf_file}" if gguf_file else src
            reason = " ".join(str(e).split())[:400] or type(e).__name__
            if "trust_remote_code" in str(e) and not trust_remote_code:
                raise UserError(
                    f"{where!r} holds its own modeling code, which loading it would run; "
                    f"attnlab runs a folder's code only with your consent: read its .py files, "
                    f"then pass {FLAG}"
                ) from None
            raise UserError(
                f"cannot load the Hugging Face model {where!r} ({type(e).__name__}: {reason}). "
                "Give a local directory with config.json, tokenizer files and intact weights, a "
                ".gguf file, or a hub id while online"
            ) from None
        name = f"hf:{src}" if not gguf_file else str(Path(src) / gguf_file)
        return cls(
            model,
            tokenizer,
            name=name,
            max_length=max_length,
            device=resolve_device(device),
        )

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def eos_id(self) -> int:
        eos = self.tokenizer.eos_token_id
        return int(eos if eos is not None else self.tokenizer.bos_token_id)

    @property
    def prefix_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return int(bos if bos is not None else self.eos_id)

    @property
    def tokenizer_name(self) -> str:
        return f"hf:{getattr(self.tokenizer, 'name_or_path', '') or self.name}"

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    @torch.no_grad()
    def logits(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits.float()

    @torch.no_grad()
    def greedy_generate(
        self,
        context: Sequence[int],
        max_new_tokens: int,
        should_stop: Callable[[list[int]], bool] | None = None,
    ) -> list[int]:
        """Greedy decoding with the model's KV cache (one token per forward after the prompt)
        while prompt + output fit the context; past it, the window slides without a cache."""
        from attnlab.hf.modeling import CACHE_FIELD  # cache= (transformers 5) or past_key_values=

        prompt = list(context)[-self.max_length :]
        step = torch.tensor([prompt], device=self.device)
        past, out = None, []
        while len(out) < max_new_tokens and len(prompt) + len(out) < self.max_length:
            res = self.model(input_ids=step, use_cache=True, **{CACHE_FIELD: past})
            past = getattr(res, CACHE_FIELD)
            nxt = int(res.logits[0, -1].argmax())
            if nxt == self.eos_id:
                return out
            out.append(nxt)
            if should_stop is not None and should_stop(out):
                return out
            step = torch.tensor([[nxt]], device=self.device)
        if len(out) == max_new_tokens:
            return out
        done = list(out)

        def stop(generated: list[int]) -> bool:
            return should_stop is not None and should_stop(done + generated)

        rest = super().greedy_generate(list(context) + done, max_new_tokens - len(done), stop)
        return done + rest

    def info(self) -> dict[str, object]:
        return super().info() | {"backend": "hf", "parameters": n_params(self.model)}


def _is_attnlab_export(src: str) -> bool:
    """A folder written by ``attnlab export`` (``model_type`` "attnlab" in its config.json)."""
    try:
        return json.loads((Path(src) / "config.json").read_text())["model_type"] == "attnlab"
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _context_length(config: Any, tokenizer: Any) -> int:
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    if isinstance(value, int) and 0 < value < 10**9:
        return value
    return DEFAULT_MAX_LENGTH
