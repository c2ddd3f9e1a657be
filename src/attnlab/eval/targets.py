"""Turn a target string into a :class:`LanguageModel`.

Accepted targets (an explicit ``run:``, ``probe:`` or ``hf:`` prefix skips the guessing):

* ``RUN_DIR`` (has ``config.toml`` and ``checkpoints/``): the run's latest checkpoint;
* ``RUN_DIR/checkpoints/step_XXXXXXX``: that checkpoint;
* ``PROBE_DIR`` (has ``probe.json``, ``adapter.safetensors`` or ``adapter_config.json``): a frozen
  Hugging Face base with its trained adapter, via ``attnlab.probe.load_probed_model``;
* ``hf:MODEL_ID_OR_DIR``: ``transformers.AutoModelForCausalLM`` (a hub id needs the internet);
* ``FILE.gguf`` (or ``hf:FILE.gguf``): a GGUF checkpoint, de-quantized by transformers;
* a directory with ``config.json``: a local Hugging Face checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnlab.errors import UserError
from attnlab.eval.hf import HFCausalLM
from attnlab.eval.lm import LanguageModel, pick_device
from attnlab.eval.native import AttnlabLM

PROBE_MARKERS = ("probe.json", "adapter.safetensors", "adapter_config.json")


def load_language_model(
    target: str | Path | LanguageModel,
    *,
    device: str | torch.device | None = "auto",
    dtype: str | None = None,
    max_length: int | None = None,
) -> LanguageModel:
    """Resolve ``target`` (see the module docstring) and load it on ``device``."""
    if isinstance(target, LanguageModel):
        return target
    text = str(target)
    kind, _, rest = text.partition(":")
    if kind in ("hf", "run", "probe") and rest:
        if kind == "hf":
            return _load_hf(rest, device, dtype, max_length)
        if kind == "run":
            return _load_run(Path(rest), device).limit_context(max_length)
        return from_probe_dir(rest, device=device).limit_context(max_length)
    path = Path(text)
    if path.suffix == ".gguf":
        return _load_hf(text, device, dtype, max_length)
    if not path.exists():
        raise UserError(
            f"evaluation target {text!r} does not exist. Give a run directory, a checkpoint "
            "directory, a probe directory, a .gguf file, or hf:MODEL_ID_OR_DIR"
        )
    if path.is_dir() and any((path / m).exists() for m in PROBE_MARKERS):
        return from_probe_dir(path, device=device).limit_context(max_length)
    if path.is_dir() and ((path / "config.toml").is_file() or _is_checkpoint_dir(path)):
        return _load_run(path, device).limit_context(max_length)
    if path.is_dir() and (path / "config.json").is_file():
        return _load_hf(text, device, dtype, max_length)
    raise UserError(
        f"{text!r} is not an evaluation target: a run directory has config.toml, a checkpoint "
        "has model.safetensors, a probe directory has probe.json or adapter weights, a Hugging "
        "Face directory has config.json; a GGUF file ends in .gguf"
    )


def from_probe_dir(path: str | Path, device: str | torch.device | None = "auto") -> LanguageModel:
    """A probed base model with its adapter, loaded by ``attnlab.probe.load_probed_model(path,
    device=...)``, which returns ``(model, tokenizer)`` (a transformers causal LM and its
    tokenizer). Results are stored in the probe directory."""
    try:
        from attnlab.probe import load_probed_model  # type: ignore[attr-defined]
    except ImportError as e:
        raise UserError(
            f"cannot evaluate the probe directory {path}: attnlab.probe.load_probed_model is not "
            f"available in this attnlab ({e}). Evaluate the base model with hf:MODEL instead, or "
            "update attnlab"
        ) from None
    dev = pick_device(device)
    loaded = load_probed_model(Path(path), device=str(dev))
    model, tokenizer = loaded[0], loaded[1]
    return HFCausalLM(model, tokenizer, name=f"probe:{path}", device=dev, results_dir=Path(path))


def _load_hf(
    text: str, device: str | torch.device | None, dtype: str | None, max_length: int | None
) -> HFCausalLM:
    path = Path(text)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UserError(f"GGUF file {text!r} does not exist")
        return HFCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, device=device, dtype=dtype, max_length=max_length
        )
    return HFCausalLM.from_pretrained(text, device=device, dtype=dtype, max_length=max_length)


def _is_checkpoint_dir(path: Path) -> bool:
    return (path / "model.safetensors").is_file() and path.parent.name == "checkpoints"


def _load_run(path: Path, device: str | torch.device | None) -> AttnlabLM:
    if _is_checkpoint_dir(path):
        return AttnlabLM.from_run(path.parent.parent, device=device, checkpoint=path.name)
    if not (path / "config.toml").is_file():
        raise UserError(f"{path} is not a run directory (no config.toml)")
    from attnlab.runstate import require_weights

    require_weights(path)
    return AttnlabLM.from_run(path, device=device)
