"""A quantized model directory as an evaluation target (``attnlab eval QDIR``, ``quantized:DIR``).

Registered with :func:`attnlab.eval.targets.register_target_kind` when this module is imported
(the commands that take targets import it) and through the ``attnlab.targets`` entry point, so
``eval``, ``inspect`` and lm-eval's ``attnlab`` model load a quantized directory like a run:
perplexity and task results are written to ``QDIR/eval/results.json``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnlab.eval.lm import LanguageModel
from attnlab.eval.native import AttnlabLM
from attnlab.eval.targets import TargetKind, register_target_kind
from attnlab.quant.store import MARKERS


def load_quantized_target(path: Path, device: torch.device) -> LanguageModel:
    """The quantized model of ``path`` on ``device``; results go to ``path``."""
    from attnlab.quant.store import load

    q = load(path, device="cpu")
    cfg = q.config
    data_dir = Path(cfg.data.dir) if cfg.data.dir else None
    lm = AttnlabLM(
        q.model,
        q.tokenizer,
        cfg.model.max_seq_len,
        name=f"quantized:{path}",
        device=device,
        results_dir=Path(path),
        data_dir=data_dir,
    )
    lm.config = cfg
    lm.trained_length = cfg.data.seq_len
    return lm


QUANTIZED_TARGET = TargetKind(
    "quantized",
    MARKERS,
    load_quantized_target,
    describe="a quantized model directory (attnlab quantize) has quantized.json",
)
register_target_kind(QUANTIZED_TARGET)
