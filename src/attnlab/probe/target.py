"""A probe directory as an evaluation target (``attnlab eval PROBE_DIR``, ``probe:DIR``).

Registered with :func:`attnlab.eval.targets.register_target_kind` when :mod:`attnlab.probe` is
imported (and through the ``attnlab.targets`` entry point), so evaluation loads probe directories
without importing the probe package itself.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnlab.eval.hf import HFCausalLM
from attnlab.eval.lm import LanguageModel
from attnlab.eval.targets import TargetKind, register_target_kind

MARKERS = ("probe.json", "adapter.safetensors", "adapter_config.json")


def load_probe_target(path: Path, device: torch.device) -> LanguageModel:
    """The frozen base of ``path`` with its trained adapter attached; results go to ``path``."""
    from attnlab.probe.artifacts import load_probed_model

    model, tokenizer = load_probed_model(Path(path), device=str(device))
    return HFCausalLM(model, tokenizer, name=f"probe:{path}", device=device, results_dir=Path(path))


PROBE_TARGET = TargetKind(
    "probe",
    MARKERS,
    load_probe_target,
    describe="a probe directory has probe.json or adapter weights",
)
register_target_kind(PROBE_TARGET)
