"""Validation loss of a retrieval model with its real neighbours, with *mismatched* ones
(another window's) and with none (RETRO §4 with a content control), per token class, and the
overlap between each validation chunk and its neighbours beside it.

The validation split is read in consecutive windows of ``data.seq_len`` tokens starting at
multiples of it (so on the chunk grid); every loss is token-weighted. Three conditions on the
same windows and tokens:

    real        the window's own neighbours from the database
    mismatched  the neighbours of window source[i] != i (:mod:`attnlab.eval.mismatch`, seeded)
    none        no neighbours (the CCA layers add nothing: the decoder "without retrieval")

A model that reads what its neighbours say has real < mismatched; a cross-attention path that
only learnt that *some* neighbour is there (a bias, a separator cue) scores real = mismatched
< none. So the retrieval gain is ``mismatched - real``, tested per window by the caller
(:mod:`attnlab.experiments.reports.retrieval_controls`). Token classes
(:mod:`attnlab.eval.token_classes`, e.g. the planted facts' answer tokens) get each condition's
loss apart, and every class its per-window means for the paired test. A decoder run is scored
on the same windows (only ``none``), so a retrieval run and its baseline share their tokens.

Overlap: for each validation chunk, the share of its 8-token n-grams found in its k neighbours
(``attnlab.data.retrieval.overlap``); ``read_overlap`` per chunk is the overlap of chunk c with
the neighbours its tokens read (chunk c - 1's), for the loss-by-overlap table.
Cost: three forwards per window (one for a decoder), in batches of ``batch_size`` windows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

CONDITIONS = ("real", "mismatched", "none")


@torch.no_grad()
def retrieval_losses(
    run_dir: str | Path,
    *,
    max_windows: int | None = None,
    device: str = "cpu",
    control_seed: int = 0,
    batch_size: int = 16,
) -> dict[str, Any]:
    """{'loss_with' (real), 'loss_mismatched', 'loss_without' (none), 'ppl_*', 'classes':
    {class: {'tokens', 'real', 'mismatched', 'none'}}, 'per_window': {class: {condition:
    [mean loss per window, NaN without tokens of the class]}}, 'overlap', 'windows', 'tokens',
    'control_seed', 'chunks': per validation chunk its mean loss per condition and overlap}.
    A decoder run has only the 'none' condition."""
    from attnlab.data import TokenData
    from attnlab.eval.token_classes import token_classes
    from attnlab.runs.device import resolve_device
    from attnlab.runs.load import load_run_model

    device = str(resolve_device(device, setting="--device"))
    model, cfg, _ = load_run_model(run_dir, device=device)
    model.eval()
    data = TokenData.open(cfg.data.dir)
    T = cfg.data.seq_len
    offsets = np.arange(0, len(data.val) - T - 1, T, dtype=np.int64)
    if max_windows is not None:
        offsets = offsets[:max_windows]
    db = _database(run_dir, cfg)
    feeds = _control_neighbours(db, data, offsets, T, control_seed) if db is not None else {}
    losses = _token_losses(model, cfg, data, offsets, feeds, device, batch_size)
    targets = offsets[:, None] + 1 + np.arange(T)  # the val position each loss predicts
    classes = {"all": np.ones(len(data.val), dtype=bool)}
    classes.update(token_classes(cfg.data.dir, "val", len(data.val)))
    res: dict[str, Any] = {"windows": len(offsets), "tokens": len(offsets) * T}
    res["classes"], res["per_window"] = {}, {}
    for name, member in classes.items():
        inside = member[targets]
        res["classes"][name] = {"tokens": int(inside.sum())}
        res["per_window"][name] = {}
        for cond, lw in losses.items():
            res["classes"][name][cond] = float(lw[inside].sum() / max(1, inside.sum()))
            with np.errstate(invalid="ignore"):
                per = (lw * inside).sum(1) / inside.sum(1)
            res["per_window"][name][cond] = per.tolist()
    for key, cond in (("without", "none"), ("with", "real"), ("mismatched", "mismatched")):
        if cond in losses:
            res[f"loss_{key}"] = res["classes"]["all"][cond]
            res[f"ppl_{key}"] = math.exp(res[f"loss_{key}"])
    if db is not None:
        res["control_seed"] = control_seed
        res.update(_overlaps(db, data, offsets, T, losses))
    return res


def retrieval_metrics(run_dir: str | Path, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ``eval/results.json`` keeps of :func:`retrieval_losses`: (metrics, controls).
    ``metrics`` are flat numbers (a results table's rows: the losses, ``CLASS/CONDITION`` per
    token class, the overlap); ``controls`` holds ``classes`` and the per-window means the
    paired test reads (``per_window``), stored beside the metrics."""
    res = retrieval_losses(run_dir, **kwargs)
    return split_metrics(res)


def split_metrics(res: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(flat metrics, controls) of a :func:`retrieval_losses` result (its chunks left out)."""
    controls = {k: res[k] for k in ("classes", "per_window")}
    metrics = {k: v for k, v in res.items() if k not in ("classes", "per_window", "chunks")}
    for name, row in res["classes"].items():
        metrics.update({f"{name}/{c}": row[c] for c in CONDITIONS if c in row})
    return metrics, controls


def _database(run_dir, cfg):
    """The run's retrieval database, or None for a family that reads no neighbours."""
    from attnlab.base.errors import UserError
    from attnlab.data.retrieval_index.integrity import open_run_database
    from attnlab.parts import families
    from attnlab.parts.family import NEIGHBOURS, RETRIEVAL_ROUTE

    family = families.of(cfg.model)
    if not family.evaluates(RETRIEVAL_ROUTE):
        raise UserError(
            f"{run_dir} is a model.family={cfg.model.family!r} run; the loss with and without "
            f"retrieval is for {families.where(lambda f: f.evaluates(RETRIEVAL_ROUTE))} runs"
        )
    if not family.needs(NEIGHBOURS):
        return None
    return open_run_database(cfg.model.retrieval, cfg.data.dir)


def _control_neighbours(db, data, offsets: np.ndarray, T: int, seed: int) -> dict[str, Any]:
    """{'real': [W, C, k, r], 'mismatched': the same rows in the order of
    :func:`~attnlab.eval.mismatch.mismatched_windows`, 'none': None}: what each window is fed."""
    from attnlab.data.retrieval import sequence_neighbours
    from attnlab.eval.mismatch import mismatched_windows

    _, real = sequence_neighbours(db, data, "val", offsets, T)
    return {"real": real, "mismatched": real[mismatched_windows(len(offsets), seed)], "none": None}


def _token_losses(model, cfg, data, offsets, feeds, device, batch_size) -> dict[str, np.ndarray]:
    """{condition: [W, T] float64 token losses}; a decoder (no feeds) gets 'none' only."""
    import torch.nn.functional as F

    from attnlab.parts import families

    family = families.of(cfg.model)
    T = cfg.data.seq_len
    val = np.asarray(data.val)
    out = {c: np.empty((len(offsets), T)) for c in (feeds or {"none": None})}
    for lo in range(0, len(offsets), batch_size):
        rows = offsets[lo : lo + batch_size, None] + np.arange(T + 1)
        seq = torch.as_tensor(val[rows].astype(np.int64), device=device)
        x, y = seq[:, :-1], seq[:, 1:]
        for cond in out:
            nbr = feeds.get(cond)
            if nbr is None:
                logits = family.score_logits(model, x)
            else:
                n = torch.as_tensor(nbr[lo : lo + batch_size], device=device)
                logits = model(x, neighbours=n).logits
            loss = F.cross_entropy(logits.double().flatten(0, 1), y.flatten(), reduction="none")
            out[cond][lo : lo + len(x)] = loss.view(len(x), T).cpu().numpy()
    return out


def _overlaps(db, data, offsets: np.ndarray, T: int, losses: dict) -> dict[str, Any]:
    """'overlap' (mean over chunks) and 'chunks': per chunk its mean loss per condition, its
    overlap with its own neighbours and with the ones its tokens read (chunk c - 1's)."""
    from attnlab.data.retrieval import neighbour_tokens, overlap

    m = db.chunk_size
    chunks = [c for o in offsets for c in range(o // m, (o + T) // m)]
    nbr = neighbour_tokens(data.train, np.asarray(db.val)[chunks], m, db.neighbour_len, data.eos_id)
    val = np.asarray(data.val)
    ov = [overlap(val[c * m : (c + 1) * m], nbr[i]) for i, c in enumerate(chunks)]
    # the first chunk of a window reads none (NaN)
    per = T // m
    read = [
        float("nan") if i % per == 0 else overlap(val[c * m : (c + 1) * m], nbr[i - 1])
        for i, c in enumerate(chunks)
    ]
    per_chunk = {
        {"real": "with", "none": "without"}.get(c, c): lw.reshape(-1, m).mean(1).tolist()
        for c, lw in losses.items()
    }
    return {
        "overlap": float(np.mean(ov)),
        "chunks": {**per_chunk, "overlap": ov, "read_overlap": read},
    }
