"""Validation loss of a retrieval model with and without its neighbours (RETRO §4), and the
overlap between each validation chunk and its neighbours beside it.

The validation split is read in consecutive windows of ``data.seq_len`` tokens starting at
multiples of it (so on the chunk grid); every window's loss is token-weighted. "Without
retrieval" runs the same model with no neighbours (its CCA layers add nothing). A decoder run is
scored on the same windows (it has only the "without" number), so a retrieval run and its
baseline are compared on identical tokens.

Overlap: for each validation chunk, the share of its 8-token n-grams found in its k neighbours
(``attnlab.data.retrieval.overlap``); RETRO reports that its gains come largely from neighbours
that overlap the evaluation text, so the gain is only readable beside this number. Per chunk,
``read_overlap`` is the overlap of chunk c with the neighbours its tokens read (chunk c - 1's),
for the loss-by-overlap table.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch


@torch.no_grad()
def retrieval_losses(
    run_dir: str | Path, *, max_windows: int | None = None, device: str = "cpu"
) -> dict[str, Any]:
    """{'loss_without', 'loss_with' (retrieval runs), 'ppl_*', 'overlap', 'windows', 'tokens',
    'chunks': {'without', 'with', 'overlap'}: per validation chunk, its mean token loss and its
    overlap (retrieval runs), for the loss-by-overlap analysis}."""
    import torch.nn.functional as F

    from attnlab.base.errors import UserError
    from attnlab.data import TokenData
    from attnlab.data.retrieval import neighbour_tokens, overlap, sequence_neighbours
    from attnlab.data.retrieval_index.integrity import open_run_database
    from attnlab.parts import families
    from attnlab.parts.family import NEIGHBOURS, RETRIEVAL_ROUTE
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
    family = families.of(cfg.model)
    if not family.evaluates(RETRIEVAL_ROUTE):
        raise UserError(
            f"{run_dir} is a model.family={cfg.model.family!r} run; the loss with and without "
            f"retrieval is for {families.where(lambda f: f.evaluates(RETRIEVAL_ROUTE))} runs"
        )
    db = None
    if family.needs(NEIGHBOURS):
        r = cfg.model.retrieval
        db = open_run_database(r, cfg.data.dir)
    sums = {"without": 0.0, "with": 0.0}
    per_chunk: dict[str, list[float]] = {"without": [], "with": []}
    n_tok = 0

    def token_losses(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits[0].double(), y[0], reduction="none")

    for o in offsets:
        x = torch.as_tensor(np.asarray(data.val[o : o + T], dtype=np.int64))[None].to(device)
        y = torch.as_tensor(np.asarray(data.val[o + 1 : o + T + 1], dtype=np.int64))[None]
        y = y.to(device)
        lw = token_losses(family.score_logits(model, x), y)
        sums["without"] += float(lw.sum())
        if db is not None:
            _, nbr = sequence_neighbours(db, data, "val", np.array([o]), T)
            lr = token_losses(model(x, neighbours=torch.as_tensor(nbr, device=device)).logits, y)
            sums["with"] += float(lr.sum())
            m = db.chunk_size
            per_chunk["without"].extend(lw.view(-1, m).mean(1).tolist())
            per_chunk["with"].extend(lr.view(-1, m).mean(1).tolist())
        n_tok += T
    res: dict[str, Any] = {"windows": len(offsets), "tokens": n_tok}
    res["loss_without"] = sums["without"] / n_tok
    res["ppl_without"] = math.exp(res["loss_without"])
    if db is not None:
        res["loss_with"] = sums["with"] / n_tok
        res["ppl_with"] = math.exp(res["loss_with"])
        m = db.chunk_size
        chunks = [c for o in offsets for c in range(o // m, (o + T) // m)]
        idx = np.asarray(db.val)[chunks]
        nbr = neighbour_tokens(data.train, idx, m, db.neighbour_len, data.eos_id)
        ov = [
            overlap(np.asarray(data.val[c * m : (c + 1) * m]), nbr[i]) for i, c in enumerate(chunks)
        ]
        res["overlap"] = float(np.mean(ov))
        # what chunk c's tokens read: the neighbours of chunk c - 1 (their continuations may
        # hold chunk c's text); the first chunk of a window reads none (NaN)
        per = T // m
        read = [
            float("nan")
            if i % per == 0
            else overlap(np.asarray(data.val[c * m : (c + 1) * m]), nbr[i - 1])
            for i, c in enumerate(chunks)
        ]
        res["chunks"] = {**per_chunk, "overlap": ov, "read_overlap": read}
    return res
