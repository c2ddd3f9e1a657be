"""Fixed batch schedules: every training (and evaluation) index drawn once from a seed and stored.

A schedule is an int64 array ``offsets[n_steps, seqs_per_step]`` of sequence start positions in one
split; step ``s`` trains on the sequences ``split[o : o + T + 1]`` for ``o`` in ``offsets[s]``
(inputs the first T ids, targets the last T). Offsets are uniform on ``[0, n_tokens - T - 1]``,
drawn from ``numpy.random.default_rng(seed)`` in blocks of ``STEPS_PER_DRAW`` steps. A block
depends only on the blocks before it, so the schedule for N steps is exactly the first N rows of
the schedule for any M > N steps with the same split, T, B and seed: a longer run sees the same
batches first, and every variant trained on a data directory sees identical batches per step.

Stored as ``DIR/schedules/<split>-T<T>-B<B>-N<N>-S<seed>.npy`` (written atomically) with a JSON
record of the array's sha256 and the data's content hash; each load re-hashes the array, so a
changed or corrupted file is a ``UserError`` instead of silently different batches. Drawing,
writing, hashing and reading all go one block of rows at a time (a loaded schedule is a read-only
memory map), so memory does not grow with the number of steps; a schedule the disk cannot hold is
refused before any of it is drawn.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.base.atomic import atomic_write_json, temp_sibling
from attnlab.base.errors import UserError
from attnlab.data.shards import SPLITS
from attnlab.data.tokendata import read_meta

STEPS_PER_DRAW = 1024


@dataclass(frozen=True)
class Schedule:
    """``offsets[step, seq]`` start positions in ``split``; ``hash`` is the sha256 of the offsets.

    ``offsets`` is a read-only memory map of the stored file (or a slice of one), so a long
    schedule costs page cache, not process memory.
    """

    offsets: np.ndarray
    hash: str
    split: str
    seq_len: int
    seqs_per_step: int
    seed: int
    path: Path | None = None

    @property
    def n_steps(self) -> int:
        return int(self.offsets.shape[0])

    def step(self, i: int) -> np.ndarray:
        return self.offsets[i]


def _row_chunks(offsets: np.ndarray, rows: int = STEPS_PER_DRAW) -> Iterator[np.ndarray]:
    for start in range(0, offsets.shape[0], rows):
        yield np.ascontiguousarray(offsets[start : start + rows], dtype="<i8")


def offsets_hash(offsets: np.ndarray) -> str:
    """sha256 of the offsets as little-endian int64 in row-major order (read in row chunks)."""
    h = hashlib.sha256()
    for chunk in _row_chunks(offsets):
        h.update(chunk.tobytes())
    return h.hexdigest()


def offset_blocks(
    n_tokens: int, seq_len: int, seqs_per_step: int, n_steps: int, seed: int
) -> Iterator[np.ndarray]:
    """The schedule's rows in blocks of at most ``STEPS_PER_DRAW`` (module doc): uniform starts in
    ``[0, n_tokens - seq_len - 1]``, one ``default_rng(seed)`` draw per block, the last block cut
    to ``n_steps``. Memory is one block whatever ``n_steps`` is."""
    high = n_tokens - seq_len - 1  # inclusive: the last start whose target window fits
    rng = np.random.default_rng(seed)
    for drawn in range(0, n_steps, STEPS_PER_DRAW):
        block = rng.integers(
            0, high, size=(STEPS_PER_DRAW, seqs_per_step), dtype=np.int64, endpoint=True
        )
        yield block[: n_steps - drawn]


def draw_offsets(
    n_tokens: int, seq_len: int, seqs_per_step: int, n_steps: int, seed: int
) -> np.ndarray:
    """All of :func:`offset_blocks` in one array; prefix-stable in ``n_steps``."""
    blocks = list(offset_blocks(n_tokens, seq_len, seqs_per_step, n_steps, seed))
    if not blocks:
        return np.zeros((0, seqs_per_step), dtype=np.int64)
    return np.concatenate(blocks)


def schedule_name(split: str, seq_len: int, seqs_per_step: int, n_steps: int, seed: int) -> str:
    return f"{split}-T{seq_len}-B{seqs_per_step}-N{n_steps}-S{seed}"


def schedule_bytes(seqs_per_step: int, n_steps: int) -> int:
    """Size of a stored schedule file (int64 offsets plus the .npy header)."""
    return 8 * seqs_per_step * n_steps + 128


def _check_args(split: str, seq_len: int, seqs_per_step: int, n_steps: int, n_tokens: int) -> None:
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    if seq_len < 1 or seqs_per_step < 1 or n_steps < 1:
        raise UserError(
            f"schedule needs seq_len, seqs_per_step, n_steps >= 1 "
            f"(got {seq_len}, {seqs_per_step}, {n_steps})"
        )
    if n_tokens <= seq_len + 1:
        raise UserError(
            f"the {split} split has {n_tokens} tokens, too few for sequences of {seq_len} "
            f"(needs more than seq_len + 1 = {seq_len + 1}); use a shorter data.seq_len or a "
            "larger corpus, or prepare the data again with a larger data.val_fraction "
            "(--val-fraction of `attnlab data prepare`, with --force)"
        )


def _check_disk(directory: Path, split: str, seqs_per_step: int, n_steps: int) -> None:
    """Refuse a schedule that cannot be stored, before drawing any of it."""
    need = schedule_bytes(seqs_per_step, n_steps)
    probe = directory if directory.exists() else directory.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return
    if need > free:
        raise UserError(
            f"the {split} batch schedule of {n_steps:,} steps x {seqs_per_step} sequences needs "
            f"{fmt_size(need)} in {directory}, but the disk has {fmt_size(free)} free; lower "
            "train.max_steps (or the sequences per step), or free disk space"
        )


def fmt_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"  # pragma: no cover


def _open_stored(npy: Path) -> np.ndarray:
    return np.load(npy, mmap_mode="r", allow_pickle=False)


def _load(npy: Path, record: Path, content_hash: str) -> tuple[np.ndarray, str]:
    """The stored schedule (memory-mapped) and its sha256, checked against its record."""
    fix = f"delete {npy} and {record.name} to draw it again"
    try:
        info = json.loads(record.read_text())
        offsets = _open_stored(npy)
        digest = offsets_hash(offsets)
    except (OSError, ValueError) as e:
        raise UserError(f"schedule {npy} is unreadable ({e}); {fix}") from None
    if not isinstance(info, dict) or digest != info.get("sha256"):
        raise UserError(f"schedule {npy} does not match its recorded sha256 (modified?); {fix}")
    if info.get("content_hash") != content_hash:
        raise UserError(f"schedule {npy} was drawn for different token data; {fix}")
    return offsets, digest


def _write_npy(npy: Path, seqs: int, n_steps: int, blocks: Iterable[np.ndarray]) -> str:
    """Stream ``blocks`` into ``npy`` (an ordinary .npy file, written atomically); their sha256."""
    npy.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(npy)
    h = hashlib.sha256()
    try:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype="<i8", shape=(n_steps, seqs))
        row = 0
        for block in blocks:
            out[row : row + len(block)] = block
            h.update(np.ascontiguousarray(block, dtype="<i8").tobytes())
            row += len(block)
        out.flush()
        del out
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, npy)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return h.hexdigest()


def _longer_sibling(
    directory: Path, split: str, seq_len: int, seqs: int, n_steps: int, seed: int
) -> tuple[Path, int] | None:
    """A stored schedule with the same split/T/B/seed and more steps, if any (smallest such)."""
    pat = re.compile(rf"^{split}-T{seq_len}-B{seqs}-N(\d+)-S{seed}\.npy$")
    found = [
        (p, int(m.group(1)))
        for p in directory.glob(f"{split}-T{seq_len}-B{seqs}-N*-S{seed}.npy")
        if (m := pat.match(p.name)) and int(m.group(1)) > n_steps
    ]
    return min(found, key=lambda x: x[1]) if found else None


def _shorter_siblings(
    directory: Path, split: str, seq_len: int, seqs: int, n_steps: int, seed: int
) -> list[tuple[Path, int]]:
    pat = re.compile(rf"^{split}-T{seq_len}-B{seqs}-N(\d+)-S{seed}\.npy$")
    return [
        (p, int(m.group(1)))
        for p in directory.glob(f"{split}-T{seq_len}-B{seqs}-N*-S{seed}.npy")
        if (m := pat.match(p.name)) and int(m.group(1)) < n_steps
    ]


def get_schedule(
    data_dir: str | Path,
    split: str,
    seq_len: int,
    seqs_per_step: int,
    n_steps: int,
    seed: int,
) -> Schedule:
    """The stored schedule for these parameters, drawn and stored on first use (module doc).

    A missing schedule is taken as a prefix of a stored longer one when there is one (after
    verifying it); a newly drawn one is checked against any stored shorter one, so a change in
    NumPy's generator cannot silently give a longer run different early batches. Drawing,
    storing and hashing go block by block, so memory does not grow with ``n_steps``; a schedule
    the disk cannot hold is refused before anything is drawn.
    """
    data_dir = Path(data_dir)
    meta = read_meta(data_dir)
    n_tokens = int(meta["splits"][split]["tokens"]) if split in meta["splits"] else 0
    _check_args(split, seq_len, seqs_per_step, n_steps, n_tokens)
    if seed < 0:
        raise UserError(f"schedule seed {seed} is negative; seeds are integers >= 0")
    content_hash = meta["content_hash"]
    directory = data_dir / "schedules"
    name = schedule_name(split, seq_len, seqs_per_step, n_steps, seed)
    npy, record = directory / f"{name}.npy", directory / f"{name}.json"

    if record.exists():  # the record is written last: without it the schedule is incomplete
        offsets, digest = _load(npy, record, content_hash)
    else:
        _check_disk(directory, split, seqs_per_step, n_steps)
        longer = _longer_sibling(directory, split, seq_len, seqs_per_step, n_steps, seed)
        if longer is not None:
            path, _ = longer
            prefix = _load(path, path.with_suffix(".json"), content_hash)[0][:n_steps]
            blocks: Iterable[np.ndarray] = _row_chunks(prefix)
        else:
            blocks = offset_blocks(n_tokens, seq_len, seqs_per_step, n_steps, seed)
        digest = _write_npy(npy, seqs_per_step, n_steps, blocks)
        offsets = _open_stored(npy)
        for path, n in _shorter_siblings(directory, split, seq_len, seqs_per_step, n_steps, seed):
            stored = _load(path, path.with_suffix(".json"), content_hash)[0]
            if any(
                not np.array_equal(a, b)
                for a, b in zip(_row_chunks(stored), _row_chunks(offsets[:n]))
            ):
                npy.unlink(missing_ok=True)
                raise UserError(
                    f"the newly drawn schedule {name} does not extend the stored {path.name} "
                    "(NumPy's generator changed?); delete the stored schedules to start over"
                )
        atomic_write_json(
            record,
            {
                "split": split,
                "seq_len": seq_len,
                "seqs_per_step": seqs_per_step,
                "n_steps": n_steps,
                "seed": seed,
                "n_tokens": n_tokens,
                "high": n_tokens - seq_len - 1,
                "sha256": digest,
                "content_hash": content_hash,
                "numpy": np.__version__,
            },
        )
    return Schedule(
        offsets=offsets,
        hash=digest,
        split=split,
        seq_len=seq_len,
        seqs_per_step=seqs_per_step,
        seed=seed,
        path=npy,
    )


def batch_tokens(
    data: np.ndarray, offsets: np.ndarray, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """Inputs ``x[i] = data[o_i : o_i + T]`` and targets ``y[i] = data[o_i + 1 : o_i + T + 1]``.

    Returns two int64 arrays ``[n, seq_len]`` (``offsets`` is flattened). Cost: one gather of
    ``n * (T + 1)`` ids from the memmap.
    """
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1)
    if offsets.size and (offsets.min() < 0 or offsets.max() + seq_len + 1 > len(data)):
        raise UserError(
            f"batch offsets reach past the split ({len(data)} tokens, seq_len {seq_len}); "
            "the schedule was drawn for other data: delete it and draw again"
        )
    window = offsets[:, None] + np.arange(seq_len + 1, dtype=np.int64)
    tokens = np.asarray(data[window], dtype=np.int64)
    return tokens[:, :-1], tokens[:, 1:]
