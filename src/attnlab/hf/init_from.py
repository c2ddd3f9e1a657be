"""``attnlab train --init-from hf:NAME|DIR``: start a run from a pretrained checkpoint's weights,
mapped into attnlab's parts, where the mapping is exact.

GPT-2, GPT-NeoX/Pythia and Llama map (:mod:`.arch_gpt2`, :mod:`.arch_neox`, :mod:`.arch_llama`),
and so does an attnlab export (:mod:`.arch_attnlab`: its own ``[model]`` table and weights, so a
model that left attnlab comes back for more training):
their config becomes the run's ``[model]`` table and their weights its parameters, so the attnlab
model computes the checkpoint's logits before the first step (a test checks it on tiny random
models of each family). Anything else is refused with what differs; nothing is approximated. Parts
added on top with ``--set model.*`` (say a zero-initialised content skip) keep attnlab's own init
and are listed when the weights are loaded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from attnlab.base.errors import UserError
from attnlab.base.pickled import refuse_pickled_weights


class ArchitectureError(UserError):
    """A checkpoint whose architecture attnlab's parts do not reproduce exactly."""


def _arches() -> list[ModuleType]:
    from attnlab.hf import arch_attnlab, arch_gpt2, arch_llama, arch_neox

    return [arch_gpt2, arch_neox, arch_llama, arch_attnlab]


def _source(spec: str) -> tuple[str, bool]:
    """(path or hub id, local) of ``hf:NAME``, ``hf:DIR`` or ``DIR``."""
    text = spec.removeprefix("hf:")
    if Path(text).is_dir():
        return text, True
    if spec.startswith("hf:"):
        from attnlab.data.hub import require_hub

        require_hub(f"checkpoint {text!r}", hint="give a local Hugging Face folder instead")
        return text, False
    raise UserError(
        f"--init-from {spec!r}: not a directory; give a local Hugging Face folder or hf:NAME"
    )


def _load_config(spec: str):
    from transformers import AutoConfig

    source, local = _source(spec)
    try:
        return AutoConfig.from_pretrained(source, local_files_only=local)
    except (OSError, ValueError) as e:
        raise UserError(f"--init-from {spec!r}: cannot read its config.json ({e})") from None


def _arch(config: Any) -> ModuleType:
    for arch in _arches():
        if config.model_type in arch.MODEL_TYPES:
            return arch
    known = ", ".join(t for a in _arches() for t in a.MODEL_TYPES)
    raise ArchitectureError(
        f"model_type {config.model_type!r} has no exact attnlab mapping; supported: {known}"
    )


def model_table(spec: str) -> dict[str, Any]:
    """The ``[model]`` table that reproduces the checkpoint ``spec`` names (or an
    :class:`ArchitectureError` listing every difference)."""
    config = _load_config(spec)
    differ: list[str] = []
    table = _arch(config).table(config, differ)
    if differ:
        raise ArchitectureError(
            f"{spec} ({config.model_type}) does not map exactly onto attnlab's parts:\n  - "
            + "\n  - ".join(differ)
        )
    return table


@dataclass
class InitReport:
    """What :func:`load_pretrained` did: the checkpoint's tensors copied, the attnlab parameters
    left at their own init (parts added on top of the mapped architecture)."""

    spec: str
    model_type: str
    loaded: list[str]
    fresh: list[str]


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' loading report and progress bar off for a block (restored after)."""
    from transformers.utils import logging as hf_logging

    level, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


def _load_failure(spec: str, source: str, local: bool, error: RuntimeError) -> UserError:
    """The error for weights transformers would not load: each tensor whose shape in the
    weights is not the one the folder's config.json gives it, with both shapes (transformers
    names them only in a logged report). Loads once more, keeping mismatched tensors aside."""
    from transformers import AutoModelForCausalLM

    try:
        with _quiet_transformers():
            _, info = AutoModelForCausalLM.from_pretrained(
                source,
                local_files_only=local,
                dtype=torch.float32,
                use_safetensors=True,
                ignore_mismatched_sizes=True,
                output_loading_info=True,
            )
        bad = sorted((str(k), tuple(a), tuple(b)) for k, a, b in info.get("mismatched_keys", ()))
    except Exception:  # the first error is the one to report then
        bad = []
    if not bad:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return UserError(f"--init-from {spec}: transformers cannot load its weights ({first})")
    shown = "\n  ".join(
        f"{k}: the weights hold {list(a)}, config.json makes it {list(b)}" for k, a, b in bad[:6]
    )
    more = f"\n  ... and {len(bad) - 6} more" if len(bad) > 6 else ""
    return ArchitectureError(
        f"--init-from {spec}: {len(bad)} tensor(s) of its weights do not have the shape its "
        f"config.json gives them:\n  {shown}{more}\nThe folder's config.json and weights do not "
        "belong together (edited, or copied from another model): restore the config.json saved "
        "with these weights, or give a folder whose config.json and weights agree"
    )


def load_pretrained(spec: str, model: nn.Module) -> InitReport:
    """Copy the checkpoint's weights into ``model`` (built from :func:`model_table`'s table)."""
    from transformers import AutoModelForCausalLM

    config = _load_config(spec)
    arch = _arch(config)
    source, local = _source(spec)
    if local:
        refuse_pickled_weights(source, f"--init-from {spec!r}")
    try:
        with _quiet_transformers():  # its load report: this function says what matters
            hf = AutoModelForCausalLM.from_pretrained(
                source, local_files_only=local, dtype=torch.float32, use_safetensors=True
            )
    except (OSError, ValueError) as e:
        raise UserError(f"--init-from {spec!r}: cannot load its weights ({e})") from None
    except RuntimeError as e:  # transformers: weights of other shapes than config.json's
        raise _load_failure(spec, source, local, e) from None
    mapped = arch.weights(config, hf.state_dict())
    own = model.state_dict()
    wrong = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
        for k, v in mapped.items()
        if k in own and own[k].shape != v.shape
    ]
    missing = [k for k in mapped if k not in own]
    if wrong or missing:
        raise ArchitectureError(
            f"--init-from {spec}: the run's [model] does not match the checkpoint (was "
            f"model.* changed with --set?): {', '.join([*wrong, *missing][:6])}"
        )
    with torch.no_grad():
        for k, v in mapped.items():
            own[k].copy_(v.to(own[k].dtype))
    tied = {k for k in own if k == "lm_head.weight" and "embed.weight" in mapped}
    fresh = [k for k in own if k not in mapped and k not in tied]
    return InitReport(spec, config.model_type, sorted(mapped), fresh)


def _folder_plugins(spec: str, config: Any, needed: list[str]) -> list[str]:
    """With ``--trust-remote-code``: the export's own plugin copies, checked against their
    recorded SHA-256 and imported (:mod:`.export_plugins`), as the run's plugins; without it,
    a refusal naming both ways."""
    from attnlab.base.consent import FLAG, remote_code_trusted
    from attnlab.hf.export_plugins import load_export_plugins

    if not remote_code_trusted():
        raise UserError(
            f"--init-from {spec}: the export's parts come from plugin file(s) "
            f"{', '.join(needed)}; give them with --plugin FILE, or pass {FLAG} to run the "
            f"copies the export keeps in {Path(config.name_or_path) / 'plugins'} (checked "
            "against the SHA-256 it recorded; read them first)"
        )
    load_export_plugins(config)
    root = Path(config.name_or_path)
    return [str(root / p["file"]) for p in config.attnlab_plugins if p.get("file")]


def config_with_init(
    name_or_path: str | None, spec: str, overrides: list[str] = (), plugins: list[str] = ()
):
    """The run config of ``attnlab train CONFIG --init-from SPEC``: CONFIG (data, recipe) with its
    ``[model]`` replaced by the checkpoint's, ``train.init_from = SPEC``, then ``--set``."""
    from attnlab.config import apply_overrides, source_dict, validate, with_plugins
    from attnlab.hf import arch_attnlab

    source, local = _source(spec)
    if local:  # before the run directory is touched
        refuse_pickled_weights(source, f"--init-from {spec!r}")
    config = _load_config(spec)
    needed = arch_attnlab.plugin_specs(config) if config.model_type == "attnlab" else []
    if needed and not plugins:
        plugins = _folder_plugins(spec, config, needed)
    raw = source_dict(name_or_path) if name_or_path is not None else {}
    raw = {**raw, "model": model_table(spec)}
    raw["train"] = {**raw.get("train", {}), "init_from": spec}
    return validate(apply_overrides(with_plugins(raw, plugins), overrides))
