"""Evaluate a probed model with :func:`attnlab.eval.evaluate`, plus a quick validation loss.

Tasks are :mod:`attnlab.eval.registry` names. ``perplexity`` without an argument scores the
validation split of the probe's own data directory (token-weighted, sliding window); the extra
name ``cloze-heldout`` builds a LAMBADA-format cloze set from that held-out text once
(:func:`attnlab.eval.build_cloze_set`, seeded) and scores it, so a cloze number exists offline.
The context is ``eval.max_length`` tokens (default: the training ``seq_len``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.data import TokenData, batch_tokens, get_schedule
from attnlab.errors import UserError
from attnlab.probe.config import ProbeConfig

HELDOUT_CLOZE = "cloze-heldout"
VAL_SEED = 1_000_003  # the same validation sequences for every method and seed


def heldout_cloze_file(data: TokenData, n: int, seed: int = 0) -> Path:
    """``<data dir>/probe/cloze-heldout-n<n>-s<seed>.jsonl``, built from the validation split
    on first use (every method of an experiment reads the same file)."""
    from attnlab.data.atomic import atomic_write_bytes
    from attnlab.eval import build_cloze_set

    path = heldout_path(data.directory, n, seed)
    if not path.is_file():
        rows = build_cloze_set(data.directory, n=n, seed=seed)
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        atomic_write_bytes(path, text.encode("utf-8"))
    return path


def heldout_path(data_dir: str | Path, n: int, seed: int = 0) -> Path:
    return Path(data_dir) / "probe" / f"{HELDOUT_CLOZE}-n{n}-s{seed}.jsonl"


def result_key(task: str, limit: int | None) -> str:
    """The key :func:`attnlab.eval.evaluate` stores ``task``'s result under."""
    from attnlab.eval.registry import task_key

    if task.strip() == HELDOUT_CLOZE:
        return f"cloze:{heldout_path('.', limit or 500).stem}"
    return task_key(task)


def resolve_tasks(tasks: list[str], data: TokenData, limit: int | None) -> list[str]:
    """Task specs for :func:`attnlab.eval.evaluate` (``cloze-heldout`` made a ``cloze:FILE``)."""
    out = []
    for t in tasks:
        if t.strip() == HELDOUT_CLOZE:
            out.append(f"cloze:{heldout_cloze_file(data, limit or 500)}")
        else:
            out.append(t)
    return out


def evaluate_probe(
    model: nn.Module,
    tokenizer: Any,
    data: TokenData,
    cfg: ProbeConfig,
    run_dir: Path,
    tasks: list[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run ``tasks`` (default ``cfg.eval.tasks``) and merge them into ``run_dir/eval/results.json``."""
    from attnlab.eval import HFCausalLM, evaluate

    specs = resolve_tasks(list(cfg.eval.tasks if tasks is None else tasks), data, cfg.eval.limit)
    if not specs:
        return {}
    device = next(model.parameters()).device
    lm = HFCausalLM(
        model,
        tokenizer,
        name=f"probe:{run_dir}",
        device=device,
        max_length=cfg.eval.max_length or cfg.train.seq_len,
        results_dir=Path(run_dir),
    )
    lm.data_dir = Path(data.directory)
    return evaluate(
        lm, specs, cfg.eval.limit, batch_size=cfg.eval.batch_size, stride=cfg.eval.stride
    )


@torch.no_grad()
def validation_loss(
    model: nn.Module,
    data: TokenData,
    seq_len: int,
    n_sequences: int,
    batch_size: int,
    autocast: Any,
) -> float:
    """Mean next-token cross-entropy over ``n_sequences`` fixed validation windows (a quick
    in-training signal; the reported perplexity comes from :func:`evaluate_probe`)."""
    if len(data.val) <= seq_len + 1:
        raise UserError(
            f"the validation split of {data.directory} has {len(data.val)} tokens, too few for "
            f"windows of {seq_len}; lower train.seq_len or raise data.val_fraction"
        )
    sched = get_schedule(data.directory, "val", seq_len, n_sequences, 1, VAL_SEED)
    offsets = np.asarray(sched.offsets[0])
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for i in range(0, len(offsets), batch_size):
        x, y = batch_tokens(data.val, offsets[i : i + batch_size], seq_len)
        xt, yt = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        with autocast():
            logits = model(input_ids=xt).logits
        total += float(F.cross_entropy(logits.float().flatten(0, 1), yt.flatten(), reduction="sum"))
        count += yt.numel()
    model.train(was_training)
    return total / count if count else math.nan
