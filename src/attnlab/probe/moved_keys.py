"""The probe's ``[train]`` keys from before the shared training recipe (:mod:`attnlab.recipe`).

    train.steps = N                  ->  train.max_steps = N  (the same optimizer steps)
    train.batch_size = B             ->  train.batch_size = m          (the micro-batch)
    train.micro_batch_size = m           train.tokens_per_step = B x train.seq_len

Before, the probe's ``batch_size`` was the effective batch and ``micro_batch_size`` the micro-batch;
now ``batch_size`` means what it means for ``attnlab train`` (the micro-batch) and the effective
batch is ``tokens_per_step``. ``batch_size = B`` without ``micro_batch_size`` trains exactly as
before (one micro-batch of B sequences per step), so only the two keys above moved.

A config someone gives (a file, ``--set``) with them is refused when it loads, in one line naming
the new keys and their values (:func:`refuse_moved`); a config attnlab itself recorded in a probe
directory before the change (``probe.json``, ``probe.toml``, a checkpoint) is translated exactly
(:func:`upgrade_recorded`), so those directories still resume, evaluate and re-attach.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attnlab.config import ConfigError
from attnlab.probe.part_tables import in_todays_tables

#: the [train] keys that moved (a config naming one is refused with its new name)
MOVED = ("steps", "micro_batch_size")
#: the defaults of batch_size and seq_len when micro_batch_size existed
OLD_BATCH, OLD_SEQ_LEN = 16, 512


def _new_batch_keys(train: Mapping[str, Any]) -> dict[str, Any]:
    """The new ``batch_size`` / ``tokens_per_step`` of an old table with ``micro_batch_size``."""
    micro, batch = train.get("micro_batch_size"), train.get("batch_size", OLD_BATCH)
    if micro is None or micro == batch:
        return {"batch_size": batch}
    return {"batch_size": micro, "tokens_per_step": batch * train.get("seq_len", OLD_SEQ_LEN)}


def _assignments(keys: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} = {v!r}" for k, v in keys.items())


def moved_message(train: Any) -> str | None:
    """One line on the old keys in a ``[train]`` table (None when it has none)."""
    if not isinstance(train, Mapping):
        return None
    lines = []
    if "steps" in train:
        lines.append(
            "train.steps was renamed train.max_steps (the same number of optimizer steps); "
            f"write max_steps = {train['steps']!r} in [train] or --set train.max_steps="
            f"{train['steps']!r}"
        )
    if "micro_batch_size" in train:
        old = {k: train[k] for k in ("batch_size", "micro_batch_size", "seq_len") if k in train}
        lines.append(
            "train.micro_batch_size was removed: train.batch_size is now the micro-batch (as in "
            "attnlab train) and train.tokens_per_step the whole batch in tokens; for "
            f"{_assignments(old)} write {_assignments(_new_batch_keys(train))} (the same batches)"
        )
    return "; ".join(lines) or None


def refuse_moved(raw: Mapping[str, Any]) -> None:
    """:class:`ConfigError` (one line) when ``raw``'s ``[train]`` uses a key that moved."""
    message = moved_message(raw.get("train"))
    if message:
        raise ConfigError(message)


def upgrade_recorded(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A probe config recorded before the change, in today's keys (the same training); its
    ``[parts.NAME]`` tables, from before the slot tables, as ``[probe.<slot>]`` ones, quietly
    (the user did not write them)."""
    try:
        raw = in_todays_tables(raw, [])
    except ConfigError:
        raw = dict(raw)  # validation then names the problem
    train = raw.get("train")
    if not isinstance(train, Mapping) or moved_message(train) is None:
        return dict(raw)
    new = {k: v for k, v in train.items() if k not in (*MOVED, "batch_size")}
    if "steps" in train:
        new["max_steps"] = train["steps"]
    if "batch_size" in train or "micro_batch_size" in train:
        new.update(_new_batch_keys(train))
    return {**raw, "train": new}
