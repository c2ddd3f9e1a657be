"""An attnlab model (a run directory or one of its checkpoints) as a :class:`LanguageModel`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from attnlab.base.errors import UserError
from attnlab.base.params import n_params
from attnlab.eval.lm import LanguageModel
from attnlab.parts import families
from attnlab.parts.family import LM_ROUTE, RETRIEVAL_ROUTE
from attnlab.runs.device import resolve_device


class Tokenizer(Protocol):
    """The attnlab tokenizer contract (``attnlab.data.load_tokenizer``)."""

    name: str
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class AttnlabLM(LanguageModel):
    """Any module whose forward maps ``input_ids [B, T]`` to an object with ``.logits`` (or a
    tensor), plus an attnlab tokenizer.

    attnlab decoders are causal and take no padding mask: right padding cannot reach a scored
    position, so the mask is ignored. Positions beyond ``max_length`` (the config's
    ``model.max_seq_len``) are never fed; a run's perplexity windows are ``data.seq_len`` long
    (``trained_length``) unless a context length is chosen.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Tokenizer,
        max_length: int,
        *,
        name: str = "attnlab",
        device: str | torch.device | None = None,
        results_dir: Path | None = None,
        data_dir: Path | None = None,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self._max_length = int(max_length)
        self._device = resolve_device(device) if device is not None else _module_device(model)
        self.model.to(self._device)
        self.name = name
        self.results_dir = results_dir
        self.data_dir = data_dir
        self.config: Any = None  # the run's Config when loaded from a run
        self.step: int | None = None  # the checkpoint's step when one was chosen
        cfg = getattr(model, "cfg", None)
        if hasattr(cfg, "position_limit"):  # an attnlab model: its position part says
            self.extrapolates = cfg.position_limit is None
            if not self.extrapolates:
                from attnlab.parts import registry

                kind = cfg.position.kind
                reason = registry.get("position", kind).cls.limit_reason or "a length limit"
                self.limit_reason = f" (model.position.kind={kind!r}: {reason})"

    @classmethod
    def from_run(
        cls,
        path: str | Path,
        device: str | torch.device | None = "auto",
        checkpoint: str | None = None,
    ) -> AttnlabLM:
        """Load a run directory through :func:`attnlab.runs.load.load_run_model` (its newest
        intact checkpoint); ``checkpoint`` names one directory under ``checkpoints/`` to load
        instead (verified against its recorded sha256 like any other)."""
        from attnlab.runs.checkpoint import CheckpointError, read_checkpoint
        from attnlab.runs.load import load_run_model

        run_dir = Path(path)
        dev = resolve_device(device)
        model, cfg, tokenizer = load_run_model(run_dir, device="cpu")
        step = None
        if checkpoint is not None:
            try:
                ckpt = read_checkpoint(run_dir / "checkpoints" / checkpoint, with_optim=False)
            except CheckpointError as e:
                raise UserError(f"cannot read checkpoint {checkpoint} of {run_dir}: {e}") from None
            model.load_state_dict(ckpt.model, strict=True)
            step = ckpt.step
        if not families.of(cfg.model).evaluates(LM_ROUTE):
            raise UserError(
                f"{run_dir} is a model.family='{cfg.model.family}' model; perplexity, cloze and "
                f"multiple choice score a causal LM, so only "
                f"{families.where(lambda f: f.evaluates(LM_ROUTE))} runs can be evaluated"
                + _other_routes(cfg.model)
            )
        lm = cls(
            model,
            tokenizer,
            cfg.model.max_seq_len,
            name=str(run_dir) if checkpoint is None else f"{run_dir}@{checkpoint}",
            device=dev,
            results_dir=run_dir,
            data_dir=_data_dir_of(cfg),
        )
        lm.config, lm.step = cfg, step
        lm.trained_length = cfg.data.seq_len  # the perplexity tasks' default window

        return lm

    def reconfigure(self, overrides: Sequence[str]) -> AttnlabLM:
        """Rebuild the model with ``model.KEY=VALUE`` overrides of its config and the same
        weights: an evaluation-time change that adds no parameters (RoPE scaling:
        ``model.position.scaling=yarn``, ``model.position.factor=16``). Result keys get the
        overrides appended (:attr:`tag`). Returns ``self``."""
        from attnlab.config import ConfigError, apply_overrides, validate
        from attnlab.model import build_model

        overrides = list(overrides)
        if not overrides:
            return self
        bad = [o for o in overrides if not o.startswith("model.")]
        if bad or self.config is None:
            raise UserError(
                f"--set {', '.join(bad) or overrides[0]}: evaluation can change only model.* "
                "keys of an attnlab run (e.g. model.position.scaling=yarn)"
            )
        try:
            cfg = validate(apply_overrides(self.config.to_dict(), overrides))
        except ConfigError as e:
            raise UserError(f"--set {' '.join(overrides)}: {e}") from None
        model = build_model(cfg.model).to(self._device)
        try:
            model.load_state_dict(self.model.state_dict(), strict=True)
        except RuntimeError as e:
            first = str(e).splitlines()[0]
            raise UserError(
                f"--set {' '.join(overrides)} changes the model's weights ({first}); evaluation "
                "can only change settings that keep them, such as the position part's options"
            ) from None
        self.model, self.config = model.eval(), cfg
        limit = cfg.model.position_limit
        self.extrapolates = limit is None
        self.tag = "+" + "+".join(o.removeprefix("model.") for o in overrides)
        return self

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def eos_id(self) -> int:
        return int(self.tokenizer.eos_id)

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name", type(self.tokenizer).__name__))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    @torch.no_grad()
    def logits(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, scored_from: int = 0
    ) -> Tensor:
        """The model's family scores it (:meth:`~attnlab.parts.family.Family.score_logits`: a
        family whose positions see ahead, as a prefix LM's prefix, keeps the contract that
        position t reads only tokens <= t; ``scored_from``: the first position read, see
        :meth:`scored_logits`); any other module is called as it is."""
        cfg = getattr(self.model, "cfg", None)
        if hasattr(cfg, "family"):
            family = families.of(cfg)
            return family.score_logits(self.model, input_ids, scored_from).float()
        out = self.model(input_ids)
        logits = out if isinstance(out, Tensor) else out.logits
        return logits.float()

    def scored_logits(
        self, input_ids: Tensor, attention_mask: Tensor | None, scored_from: int
    ) -> Tensor:
        return self.logits(input_ids, attention_mask, scored_from=scored_from)

    def info(self) -> dict[str, object]:
        out = super().info() | {"backend": "attnlab", "parameters": n_params(self.model)}
        return out if self.step is None else out | {"step": self.step}


def _other_routes(model_cfg: Any) -> str:
    """The evaluation a family has instead, for the refusal's advice."""
    if families.of(model_cfg).evaluates(RETRIEVAL_ROUTE):
        return "; its loss with and without neighbours is `attnlab eval RUN --tasks retrieval`"
    return ""


def _module_device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _data_dir_of(cfg: Any) -> Path:
    """The prepared corpus of a run's config: ``data.dir`` or the data layer's default
    ``data/<corpus>-<tokenizer>`` (relative to the working directory, as for training)."""
    d = cfg.data
    if d.dir:
        return Path(d.dir)
    from attnlab.data import default_data_dir

    return Path(default_data_dir(d.corpus, d.tokenizer))
