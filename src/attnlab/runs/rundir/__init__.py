"""The run directory's small files: the config, ``status.json``, ``metrics.jsonl``, ``plugins.json``.

Every protocol (pretraining, probe) writes the same three: its config file (``config.toml``, or
``probe.toml`` for a probe), ``status.json`` (replaced atomically, so a reader never sees half of
it) and ``metrics.jsonl`` (append-only while training; on resume it is cut back to the
checkpoint's step, so the rows of an interrupted-and-resumed run are the rows of an uninterrupted
one). Readers validate what they read (:mod:`attnlab.runs.records`): a damaged status or metrics
line is reported with its file and line and skipped, never a traceback.

**Which config a run has.** The newest intact checkpoint carries the config it was trained with
(:mod:`attnlab.runs.checkpoint`); that copy, not the config file, decides whether a rerun may
resume. A config file that is missing, empty, torn or edited is rewritten from it with a warning;
a given config that trains something else is refused with the differing keys.

The package, one file each: :mod:`~attnlab.runs.rundir.files` (their names),
:mod:`~attnlab.runs.rundir.status`, :mod:`~attnlab.runs.rundir.metrics`,
:mod:`~attnlab.runs.rundir.configs`, :mod:`~attnlab.runs.rundir.plugins` and
:mod:`~attnlab.runs.rundir.ownership` (claiming a directory, ``--restart``). Import the names from
here.
"""

from attnlab.runs.rundir.configs import (
    Upgrade,
    config_conflicts,
    config_diff,
    in_todays_keys,
    known_configs,
    parse_config_text,
    reconcile_config,
    write_config,
)
from attnlab.runs.rundir.files import (
    CONFIG_FILE,
    FINAL_STATES,
    METRICS_FILE,
    RUN_KIND,
    STATUS_FILE,
    UNCHECKED_SECTIONS,
)
from attnlab.runs.rundir.metrics import MetricsLog, read_metrics
from attnlab.runs.rundir.ownership import (
    check_clearable,
    checkpoint_strangers,
    claim_run,
    clear_run,
)
from attnlab.runs.rundir.plugins import (
    PLUGINS_FILE,
    check_plugins,
    plugin_conflicts,
    recorded_plugins,
    write_plugins,
)
from attnlab.runs.rundir.status import read_status, write_status

__all__ = [
    "CONFIG_FILE",
    "FINAL_STATES",
    "METRICS_FILE",
    "PLUGINS_FILE",
    "RUN_KIND",
    "STATUS_FILE",
    "UNCHECKED_SECTIONS",
    "MetricsLog",
    "Upgrade",
    "check_clearable",
    "check_plugins",
    "checkpoint_strangers",
    "claim_run",
    "clear_run",
    "config_conflicts",
    "config_diff",
    "in_todays_keys",
    "known_configs",
    "parse_config_text",
    "plugin_conflicts",
    "read_metrics",
    "read_status",
    "reconcile_config",
    "recorded_plugins",
    "write_config",
    "write_plugins",
    "write_status",
]
