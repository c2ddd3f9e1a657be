"""The trainer's view of the data layer: where the tokens are, and which rows each micro-batch reads.

Global batch of step ``s``: ``G = B * A * W`` sequences (micro-batch ``B``, accumulation ``A``,
world size ``W``: the recipe's :meth:`~attnlab.recipe.TrainRecipe.batch_plan`) at
``schedule.offsets[s]``. Rank ``r`` at micro-step ``m`` reads slice
``k = r * A + m``, i.e. rows ``[k B, (k + 1) B)``: one process with ``A = 2`` and two ranks with
``A = 1`` see the same ``G`` sequences per step and average the same gradients.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from attnlab.base.errors import UserError
from attnlab.config import Config

EVAL_SEED = 1_000_003  # validation sequences are the same for every run and seed


def resolve_data_dir(cfg: Config) -> Path:
    """``data.dir``, or ``data/<corpus>-<tokenizer>`` under the current directory; absolute."""
    from attnlab.data import default_data_dir

    d = cfg.data
    path = Path(d.dir) if d.dir else default_data_dir(d.corpus, d.tokenizer)
    return path.expanduser().resolve()


def prepare_if_missing(cfg: Config, data_dir: Path) -> None:
    """Make sure ``data_dir`` holds ``cfg.data`` tokenised, preparing it if needed.

    Only the default directory is created automatically; an explicit ``data.dir`` must exist, so a
    typo in it is reported instead of silently tokenising a corpus into a new place. An existing
    directory prepared from another corpus or tokenizer is refused by the data layer.
    """
    from attnlab.data import ensure_prepared

    d = cfg.data
    if d.dir and not (data_dir / "meta.json").is_file():
        raise UserError(
            f"data.dir={d.dir!r} is not a prepared data directory; run `attnlab data prepare "
            f"--corpus {d.corpus} --tokenizer {d.tokenizer} --out {d.dir}` or unset data.dir to "
            "use the default location"
        )
    ensure_prepared(d.model_copy(update={"dir": str(data_dir)}))


def micro_offsets(offsets: np.ndarray, step: int, slice_index: int, batch_size: int) -> np.ndarray:
    """Row offsets of micro-batch ``slice_index`` (``k = rank * accum + micro``) of ``step``."""
    return offsets[step, slice_index * batch_size : (slice_index + 1) * batch_size]


def open_database(cfg: Config, data_dir: Path, dist: Any):
    """``model.family = "retrieval"``: the retrieval database of ``data_dir`` for the model's
    chunk size, neighbours and continuation, built (rank 0) when missing, and checked against
    its recorded hashes and the data it was built from (a changed database is refused)."""
    from attnlab.data.retrieval import build_database
    from attnlab.data.retrieval_index.integrity import open_run_database, run_index

    r = cfg.model.retrieval
    m, cont = r.chunk_size, r.neighbour_len - r.chunk_size
    if cfg.data.seq_len % m:
        raise UserError(
            f"data.seq_len={cfg.data.seq_len} is not a multiple of model.retrieval.chunk_size={m}"
        )
    spec = run_index(r)
    if dist.is_main:
        build_database(
            data_dir, chunk_size=m, neighbours=r.neighbours, continuation=cont, index=spec
        )
    dist.barrier()
    return open_run_database(r, data_dir)  # its hashes and its data's


def chunk_neighbours(
    db: Any, data: Any, split: str, offsets: np.ndarray, cfg: Config
) -> tuple[np.ndarray, np.ndarray]:
    """Offsets moved down to the chunk grid and the neighbours of each sequence's chunks."""
    from attnlab.data.retrieval import sequence_neighbours

    return sequence_neighbours(db, data, split, offsets, cfg.data.seq_len)
