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
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.base.errors import UserError
from attnlab.data import TokenData, batch_tokens, get_schedule
from attnlab.probe.config import ProbeConfig

HELDOUT_CLOZE = "cloze-heldout"
VAL_SEED = 1_000_003  # the same validation sequences for every method and seed


def heldout_cloze_file(data: TokenData, n: int, seed: int = 0) -> Path:
    """``<data dir>/probe/cloze-heldout-n<n>-s<seed>.jsonl``, built from the validation split
    on first use (every method of an experiment reads the same file)."""
    from attnlab.base.atomic import atomic_write_bytes
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


def heldout_documents(data: TokenData, max_tokens: int) -> list[Any]:
    """The validation split's documents in order, cut after ``max_tokens`` tokens in all, as
    :class:`attnlab.eval.Document` (ids are the base's: :func:`probe_data` checked that)."""
    from attnlab.eval import Document
    from attnlab.eval.corpus import split_documents
    from attnlab.eval.perplexity import count_words

    out, left, tok = [], max_tokens, data.tokenizer
    for doc in split_documents(np.asarray(data.val), data.eos_id):
        if left <= 0:
            break
        ids = doc[:left].astype(np.int64).tolist()
        text = tok.decode(ids)
        out.append(Document(ids, len(text.encode("utf-8")), count_words(text)))
        left -= len(ids)
    return out


def _heldout_perplexity(lm: Any, data: TokenData, cfg: ProbeConfig) -> dict[str, Any]:
    from attnlab.eval import perplexity

    assert cfg.eval.val_tokens is not None
    t0 = time.perf_counter()
    docs = heldout_documents(data, cfg.eval.val_tokens)
    res = perplexity(lm, docs, cfg.eval.stride, cfg.eval.batch_size)
    return {
        "metrics": res.metrics(),
        "task": "perplexity",
        "source": f"{data.directory} (val, first {cfg.eval.val_tokens} tokens)",
        "limit": None,
        "model": lm.name,
        "max_length": lm.max_length,
        "stride": cfg.eval.stride or max(1, lm.max_length // 2),
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - t0, 3),
    }


def evaluate_probe(
    model: nn.Module,
    tokenizer: Any,
    data: TokenData,
    cfg: ProbeConfig,
    run_dir: Path,
    tasks: list[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run ``tasks`` (default ``cfg.eval.tasks``) and merge them into ``run_dir/eval/results.json``.

    With ``eval.val_tokens``, ``perplexity`` scores that many validation tokens (a fixed budget
    whatever the document lengths) through :func:`attnlab.eval.perplexity`.
    """
    from attnlab.eval import HFCausalLM, evaluate
    from attnlab.eval.results import merge_results, results_path

    wanted = list(cfg.eval.tasks if tasks is None else tasks)
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
    out: dict[str, dict[str, Any]] = {}
    if cfg.eval.val_tokens is not None and "perplexity" in [t.strip() for t in wanted]:
        wanted = [t for t in wanted if t.strip() != "perplexity"]
        out["perplexity"] = _heldout_perplexity(lm, data, cfg)
        merge_results(results_path(run_dir), out)
    specs = resolve_tasks(wanted, data, cfg.eval.limit)
    if specs:
        out |= evaluate(
            lm, specs, cfg.eval.limit, batch_size=cfg.eval.batch_size, stride=cfg.eval.stride
        )
    return out


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
