"""Turn a target string into a :class:`LanguageModel`.

Accepted targets (an explicit ``KIND:`` prefix such as ``run:``, ``hf:`` or ``probe:`` skips the
guessing):

* ``RUN_DIR`` (has ``config.toml`` or ``checkpoints/``): the run's newest intact checkpoint;
* ``RUN_DIR/checkpoints/step_XXXXXXX``: that checkpoint;
* ``hf:MODEL_ID_OR_DIR``: ``transformers.AutoModelForCausalLM`` (a hub id needs the internet);
* ``FILE.gguf`` (or ``hf:FILE.gguf``): a GGUF checkpoint, de-quantized by transformers;
* a directory with ``config.json``: a local Hugging Face checkpoint;
* any directory kind registered with :func:`register_target_kind`, e.g. a probe directory (a
  frozen Hugging Face base with its trained adapter), which :mod:`attnlab.probe` registers.

Evaluation knows no protocol that produces models: other packages register their directory kinds
here, when they are imported or through the ``attnlab.targets`` entry-point group (each entry
point names a :class:`TargetKind`), which is read the first time a target is not recognised. So
``attnlab.eval`` never imports ``attnlab.probe``, while probe directories are still evaluated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch

from attnlab.base.errors import UserError
from attnlab.eval.hf import HFCausalLM
from attnlab.eval.lm import LanguageModel
from attnlab.eval.native import AttnlabLM
from attnlab.runs.device import resolve_device

ENTRY_POINT_GROUP = "attnlab.targets"


@dataclass(frozen=True)
class TargetKind:
    """A kind of directory holding a model: recognised by ``markers`` (file names inside it),
    loaded by ``load(path, device)``; ``name`` is also its explicit prefix (``name:DIR``)."""

    name: str
    markers: tuple[str, ...]
    load: Callable[[Path, torch.device], LanguageModel]
    describe: str = ""

    def matches(self, path: Path) -> bool:
        return path.is_dir() and any((path / m).exists() for m in self.markers)


_KINDS: dict[str, TargetKind] = {}
_discovered = False


def register_target_kind(kind: TargetKind) -> None:
    """Make ``kind`` loadable by :func:`load_language_model` (registering it again is harmless)."""
    if kind.name in ("hf", "run"):
        raise ValueError(f"target kind name {kind.name!r} is built in")
    _KINDS[kind.name] = kind


def target_kinds() -> dict[str, TargetKind]:
    """Every registered kind, after reading the ``attnlab.targets`` entry points once."""
    global _discovered
    if not _discovered:
        _discovered = True
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                kind = ep.load()
            except Exception as e:  # a broken third-party package must not break evaluation
                raise UserError(
                    f"the {ENTRY_POINT_GROUP} entry point {ep.name!r} ({ep.value}) failed to load "
                    f"({type(e).__name__}: {e}); reinstall or remove the package providing it"
                ) from None
            if isinstance(kind, TargetKind):
                register_target_kind(kind)
    return dict(_KINDS)


def _kind_for(path: Path) -> TargetKind | None:
    for kind in _KINDS.values():  # registered by imports so far
        if kind.matches(path):
            return kind
    for kind in target_kinds().values():
        if kind.matches(path):
            return kind
    return None


def load_language_model(
    target: str | Path | LanguageModel,
    *,
    device: str | torch.device | None = "auto",
    dtype: str | None = None,
    max_length: int | None = None,
    trust_remote_code: bool = False,
) -> LanguageModel:
    """Resolve ``target`` (see the module docstring) and load it on ``device``.

    ``trust_remote_code`` is the user's consent to run code that a model folder carries (a
    Hugging Face folder's ``auto_map`` modules, an attnlab export's plugin files, also as a
    probe's base): :mod:`attnlab.base.consent`. Without it such code is refused, never run."""
    from attnlab.base.consent import guarding, trusting_remote_code

    if isinstance(target, LanguageModel):
        return target
    text = str(target)
    folder = text.partition(":")[2] if text.partition(":")[0] in ("hf", "run", *_KINDS) else text
    with trusting_remote_code(trust_remote_code), guarding(folder or text):
        return _load(text, device, dtype, max_length, trust_remote_code)


def _load(
    text: str,
    device: str | torch.device | None,
    dtype: str | None,
    max_length: int | None,
    trust: bool,
) -> LanguageModel:
    prefix, _, rest = text.partition(":")
    if prefix == "hf" and rest:
        return _load_hf(rest, device, dtype, max_length, trust)
    if prefix == "run" and rest:
        return _load_run(Path(rest), device).limit_context(max_length)
    if rest and prefix in target_kinds():
        kind = _KINDS[prefix]
        return kind.load(Path(rest), resolve_device(device)).limit_context(max_length)
    path = Path(text)
    if path.suffix == ".gguf":
        return _load_hf(text, device, dtype, max_length, trust)
    if not path.exists():
        raise UserError(
            f"evaluation target {text!r} does not exist. Give a run directory, a checkpoint "
            "directory, a probe directory, a .gguf file, or hf:MODEL_ID_OR_DIR"
        )
    kind = _kind_for(path)
    if kind is not None:
        return kind.load(path, resolve_device(device)).limit_context(max_length)
    from attnlab.runs.load import is_run_dir

    if path.is_dir() and (is_run_dir(path) or _is_checkpoint_dir(path)):
        return _load_run(path, device).limit_context(max_length)
    if path.is_dir() and (path / "config.json").is_file():
        return _load_hf(text, device, dtype, max_length, trust)
    others = "".join(f"; {k.describe}" for k in _KINDS.values() if k.describe)
    if "probe" not in _KINDS:
        others += " (probe directories are recognised once attnlab.probe is imported)"
    raise UserError(
        f"{text!r} is not an evaluation target: a run directory has config.toml or checkpoints/, "
        "a checkpoint has model.safetensors, a Hugging Face directory has config.json, a GGUF "
        f"file ends in .gguf{others}"
    )


def _load_hf(
    text: str,
    device: str | torch.device | None,
    dtype: str | None,
    max_length: int | None,
    trust: bool = False,
) -> HFCausalLM:
    path = Path(text)
    settings = {"device": device, "dtype": dtype, "max_length": max_length}
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UserError(f"GGUF file {text!r} does not exist")
        return HFCausalLM.from_pretrained(path.parent, gguf_file=path.name, **settings)
    return HFCausalLM.from_pretrained(text, trust_remote_code=trust, **settings)


def _is_checkpoint_dir(path: Path) -> bool:
    return (path / "model.safetensors").is_file() and path.parent.name == "checkpoints"


def _load_run(path: Path, device: str | torch.device | None) -> AttnlabLM:
    if _is_checkpoint_dir(path):
        return AttnlabLM.from_run(path.parent.parent, device=device, checkpoint=path.name)
    from attnlab.runs.runstate import require_weights

    require_weights(path)
    return AttnlabLM.from_run(path, device=device)
