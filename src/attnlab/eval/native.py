"""An attnlab model (a run directory or one of its checkpoints) as a :class:`LanguageModel`."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from attnlab.errors import UserError
from attnlab.eval.lm import LanguageModel, pick_device


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
    ``model.max_seq_len``) are never fed.
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
        self._device = pick_device(device) if device is not None else _module_device(model)
        self.model.to(self._device)
        self.name = name
        self.results_dir = results_dir
        self.data_dir = data_dir

    @classmethod
    def from_run(
        cls,
        path: str | Path,
        device: str | torch.device | None = "auto",
        checkpoint: str | None = None,
    ) -> AttnlabLM:
        """Load a run directory (``config.toml`` + ``checkpoints/``) through
        ``attnlab.train.checkpoint.load_run_model``; ``checkpoint`` picks one checkpoint dir
        name instead of the latest."""
        run_dir = Path(path)
        try:
            from attnlab.train.checkpoint import load_run_model
        except ImportError as e:
            raise UserError(
                f"cannot load the attnlab run {run_dir}: attnlab.train.checkpoint.load_run_model "
                f"is not available ({e}); update attnlab"
            ) from None
        dev = pick_device(device)
        kwargs: dict[str, Any] = {"device": str(dev)}
        if checkpoint is not None:
            params = inspect.signature(load_run_model).parameters
            if "checkpoint" not in params:
                raise UserError(
                    f"this attnlab version loads only the latest checkpoint of a run; evaluate "
                    f"the run directory {run_dir} instead of {checkpoint}"
                )
            kwargs["checkpoint"] = checkpoint
        model, cfg, tokenizer = load_run_model(run_dir, **kwargs)
        if cfg.model.family != "decoder":
            raise UserError(
                f"{run_dir} is a model.family='{cfg.model.family}' model; perplexity, cloze and "
                "multiple choice score a causal LM, so only model.family='decoder' runs can be "
                "evaluated"
            )
        name = str(run_dir) if checkpoint is None else f"{run_dir}@{checkpoint}"
        return cls(
            model,
            tokenizer,
            cfg.model.max_seq_len,
            name=name,
            device=dev,
            results_dir=run_dir,
            data_dir=_data_dir_of(cfg, run_dir),
        )

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
    def logits(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        out = self.model(input_ids)
        logits = out if isinstance(out, Tensor) else out.logits
        return logits.float()

    def info(self) -> dict[str, object]:
        n_params = sum(p.numel() for p in self.model.parameters())
        return super().info() | {"backend": "attnlab", "parameters": n_params}


def _module_device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _data_dir_of(cfg: Any, run_dir: Path) -> Path | None:
    """The prepared corpus of a run's config: ``data.dir`` or the data layer's default."""
    try:
        from attnlab.data import resolve_data_dir  # type: ignore[attr-defined]

        return Path(resolve_data_dir(cfg.data))
    except ImportError:
        pass
    d = cfg.data
    return Path(d.dir) if d.dir else Path("data") / f"{d.corpus}-{d.tokenizer}"
