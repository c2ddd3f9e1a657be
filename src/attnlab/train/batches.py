"""The trainer's view of the data layer: where the tokens are, and which rows each micro-batch reads.

Global batch of step ``s``: ``G = B * A * W`` sequences (micro-batch ``B``, accumulation ``A``,
world size ``W``) at ``schedule.offsets[s]``. Rank ``r`` at micro-step ``m`` reads slice
``k = r * A + m``, i.e. rows ``[k B, (k + 1) B)``: one process with ``A = 2`` and two ranks with
``A = 1`` see the same ``G`` sequences per step and average the same gradients.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from attnlab.config import Config
from attnlab.errors import UserError

EVAL_SEED = 1_000_003  # validation sequences are the same for every run and seed


def _slug(text: str) -> str:
    base = Path(text.rstrip("/")).name if ("/" in text or "\\" in text) else text
    base = base.removesuffix(".json").removesuffix(".txt")
    return re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-").lower() or "data"


def default_data_dir(corpus: str, tokenizer: str) -> Path:
    """``data/<corpus-slug>-<tokenizer-slug>`` under the current directory."""
    from attnlab import data

    own = getattr(data, "default_data_dir", None)
    if callable(own):
        return Path(own(corpus, tokenizer))
    return Path("data") / f"{_slug(corpus)}-{_slug(tokenizer)}"


def resolve_data_dir(cfg: Config) -> Path:
    """The prepared data directory of ``cfg`` as an absolute path."""
    d = cfg.data
    path = Path(d.dir) if d.dir else default_data_dir(d.corpus, d.tokenizer)
    return path.expanduser().resolve()


def is_prepared(data_dir: Path) -> bool:
    from attnlab.data import TokenData

    try:
        TokenData.open(data_dir)
    except (UserError, OSError):
        return False
    return True


def prepare_if_missing(cfg: Config, data_dir: Path) -> bool:
    """Tokenise ``cfg.data`` into ``data_dir`` unless it is there already; True if it prepared.

    Only the default directory is created automatically; an explicit ``data.dir`` must exist, so a
    typo in it is reported instead of silently tokenising a corpus into a new place.
    """
    if is_prepared(data_dir):
        return False
    d = cfg.data
    if d.dir:
        raise UserError(
            f"data.dir={d.dir!r} is not a prepared data directory; run `attnlab data prepare "
            f"--corpus {d.corpus} --tokenizer {d.tokenizer} --out {d.dir}` or unset data.dir to "
            "use the default location"
        )
    from attnlab.data import prepare

    prepare(
        d.corpus,
        d.tokenizer,
        data_dir,
        val_fraction=d.val_fraction,
        replace_invalid_utf8=d.replace_invalid_utf8,
        max_documents=d.max_documents,
    )
    return True


def micro_offsets(offsets: np.ndarray, step: int, slice_index: int, batch_size: int) -> np.ndarray:
    """Row offsets of micro-batch ``slice_index`` (``k = rank * accum + micro``) of ``step``."""
    return offsets[step, slice_index * batch_size : (slice_index + 1) * batch_size]


def grad_accum_steps(tokens_per_step: int | None, batch_size: int, seq_len: int, world: int) -> int:
    """``A = tokens_per_step / (B * T * W)``, which must be a positive integer."""
    per_micro = batch_size * seq_len * world
    if tokens_per_step is None:
        return 1
    if tokens_per_step % per_micro == 0:
        return tokens_per_step // per_micro
    lo = max(1, tokens_per_step // per_micro)
    options = sorted({lo * per_micro, (lo + 1) * per_micro})
    raise UserError(
        f"train.tokens_per_step={tokens_per_step} is not a multiple of batch_size * seq_len * "
        f"world_size = {batch_size} * {seq_len} * {world} = {per_micro}; use "
        + " or ".join(str(o) for o in options)
        + " (or change train.batch_size)"
    )
