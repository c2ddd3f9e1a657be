"""The names of a run directory's small files, and the warning a damaged or edited one gets."""

from __future__ import annotations

import warnings

from attnlab.runs.records import RunFileWarning

RUN_KIND = "run"  # the kind in a run directory's marker (attnlab.base.owned)
CONFIG_FILE = "config.toml"
STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
FINAL_STATES = ("finished", "diverged")
# Config sections that do not change what is trained: a rerun may differ in them.
#: top-level sections, or dotted keys, that may change between sessions of one run
UNCHECKED_SECTIONS = ("eval", "experiment", "train.loggers")


def warn_run_file(message: str) -> None:
    """A :class:`~attnlab.runs.records.RunFileWarning` (a run file damaged, edited or
    rewritten), attributed to the caller's caller."""
    warnings.warn(message, RunFileWarning, stacklevel=3)
