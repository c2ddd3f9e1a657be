"""The run directory's small files: the config, ``status.json`` and ``metrics.jsonl``.

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
"""

from __future__ import annotations

import contextlib
import json
import tomllib
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from attnlab.base.advice import restart
from attnlab.base.atomic import atomic_write_json, atomic_write_text, dumps_json
from attnlab.base.errors import UserError
from attnlab.config import flatten
from attnlab.runs.records import (
    ConfigRecord,
    MetricsRow,
    RunFileError,
    RunFileWarning,
    Status,
    parse_json_text,
    read_json_file,
)

RUN_KIND = "run"  # the kind in a run directory's marker (attnlab.base.owned)
CONFIG_FILE = "config.toml"
STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
FINAL_STATES = ("finished", "diverged")
# Config sections that do not change what is trained: a rerun may differ in them.
#: top-level sections, or dotted keys, that may change between sessions of one run
UNCHECKED_SECTIONS = ("eval", "experiment", "train.loggers")


def _warn(message: str) -> None:
    warnings.warn(message, RunFileWarning, stacklevel=3)


# ------------------------------------------------------------------------------------ status


def read_status(run_dir: str | Path, *, strict: bool = False) -> dict[str, Any] | None:
    """The run's ``status.json`` as a dict, or None when there is none.

    A damaged file (not JSON, wrong shape) raises :class:`RunFileError` with ``strict``; otherwise
    it is reported as a :class:`RunFileWarning` and read as None (the caller then treats the run
    as unstarted, and ``attnlab train`` rewrites the file from the checkpoints).
    """
    path = Path(run_dir) / STATUS_FILE
    if not path.is_file():
        return None
    try:
        return read_json_file(Status, path).model_dump(exclude_unset=True)
    except RunFileError as e:
        if strict:
            raise
        _warn(f"{e}; ignoring it (rerunning the same command rewrites it)")
        return None


def write_status(run_dir: str | Path, status: Mapping[str, Any]) -> None:
    """Validate and atomically replace ``status.json``."""
    Status.model_validate(dict(status))
    atomic_write_json(Path(run_dir) / STATUS_FILE, dict(status), indent=1)


# ----------------------------------------------------------------------------------- metrics


def _metric_lines(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], list[tuple[int, str]]]:
    """(line number, row) of every valid line and (line number, problem) of every damaged one.

    A last line without a newline is a write cut short by a kill: dropped without complaint.
    """
    rows: list[tuple[int, dict[str, Any]]] = []
    bad: list[tuple[int, str]] = []
    data = path.read_bytes()
    lines = data.split(b"\n")
    torn = lines.pop() if lines else b""  # after the final newline: empty, or a torn write
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
            rows.append((number, _row(text)))
        except UnicodeDecodeError:
            bad.append((number, "not UTF-8 text (binary garbage?)"))
        except RunFileError as e:
            bad.append((number, str(e).strip()))
    if torn.strip():
        try:
            text = torn.decode("utf-8")
        except UnicodeDecodeError:
            bad.append((len(lines) + 1, "not UTF-8 text (binary garbage?)"))
        else:
            with contextlib.suppress(RunFileError):
                rows.append((len(lines) + 1, _row(text)))
    return rows, bad


def _row(text: str) -> dict[str, Any]:
    """A validated row with the keys it was written with (so ``"val_loss" in row`` works)."""
    return parse_json_text(MetricsRow, text, "the line").model_dump(exclude_unset=True)


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every valid row of ``metrics.jsonl``. Damaged lines are skipped with a
    :class:`RunFileWarning` naming the file and line."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    rows, bad = _metric_lines(path)
    for number, problem in bad:
        _warn(
            f"{path} line {number} is not a metrics row ({problem}); skipped. Rerunning "
            "`attnlab train` on the run drops it, or delete the line"
        )
    return [r for _, r in rows]


class MetricsLog:
    """Append-only ``metrics.jsonl``; opening it keeps the rows through ``keep_through_step``
    (rewritten atomically) and drops damaged lines with a warning."""

    def __init__(self, run_dir: str | Path, keep_through_step: int) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        kept: list[dict[str, Any]] = []
        if self.path.is_file():
            rows, bad = _metric_lines(self.path)
            kept = [r for _, r in rows if r["step"] <= keep_through_step]
            last_kept = max((n for n, r in rows if r["step"] <= keep_through_step), default=0)
            for number, problem in bad:
                where = "after" if number > last_kept else "before"
                _warn(
                    f"{self.path} line {number} is not a metrics row ({problem}); dropped "
                    f"({where} the checkpoint at step {keep_through_step}"
                    + (", so training recomputes it)" if where == "after" else ")")
                )
        atomic_write_text(self.path, "".join(dumps_json(r) + "\n" for r in kept))
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def append(self, row: Mapping[str, Any]) -> None:
        MetricsRow.model_validate(dict(row))
        self._f.write(dumps_json(dict(row)) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


# ------------------------------------------------------------------------------------ config


def parse_config_text(text: str) -> dict[str, Any] | None:
    """A config file's TOML as a dict; None when it is empty or not TOML (torn)."""
    if not text.strip():
        return None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None


def config_diff(
    saved: Mapping[str, Any],
    given: Mapping[str, Any],
    unchecked: Iterable[str] = UNCHECKED_SECTIONS,
) -> list[str]:
    """``key: saved -> given`` for every dotted key that differs, outside ``unchecked`` (top-level
    sections or dotted keys that do not change what is trained)."""
    skip = set(unchecked)
    a, b = flatten(saved), flatten(given)
    return [
        f"{key}: {a.get(key)!r} -> {b.get(key)!r}"
        for key in sorted(set(a) | set(b))
        if key.split(".", 1)[0] not in skip and key not in skip and a.get(key) != b.get(key)
    ]


def _config_state(path: Path) -> tuple[str, dict[str, Any] | None]:
    """(what is wrong with the config file, or "", its parsed content)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return "missing", None
    except (OSError, UnicodeDecodeError) as e:
        return f"unreadable ({e})", None
    if not text.strip():
        return "empty", None
    parsed = parse_config_text(text)
    return ("torn (not valid TOML)", None) if parsed is None else ("", parsed)


def _trained_config(run_dir: Path) -> tuple[ConfigRecord | None, str]:
    """The config recorded in the newest checkpoint whose ``state.json`` is intact, and its name."""
    from attnlab.runs.checkpoint import newest_state

    newest = newest_state(run_dir)
    if newest is None or newest[1].config is None:
        return None, ""
    return newest[1].config, newest[0].name


#: a protocol's translation of a config recorded by an earlier attnlab into today's keys
Upgrade = Callable[[dict[str, Any]], dict[str, Any]]


def _same(d: dict[str, Any], upgrade: Upgrade | None) -> dict[str, Any]:
    return upgrade(d) if upgrade is not None else d


def in_todays_keys(raw: dict[str, Any]) -> dict[str, Any]:
    """A recorded training config as today's code writes the same config: validated (old keys
    renamed or dropped, options added since at their defaults) and dumped again, so a run
    recorded by an earlier attnlab compares equal to its config loaded today. A record that no
    longer validates is returned as it is (its differences are then reported key by key)."""
    from attnlab.config import ConfigError, dump_toml, validate

    try:
        cfg = validate(_plugins_now(raw))
    except (ConfigError, UserError):
        return dict(raw)
    return parse_config_text(dump_toml(cfg)) or dict(raw)


def config_conflicts(
    run_dir: str | Path,
    given_text: str,
    *,
    file: str = CONFIG_FILE,
    unchecked: Iterable[str] = UNCHECKED_SECTIONS,
    upgrade: Upgrade | None = None,
) -> list[str]:
    """``key: trained -> given`` lines for every trained-relevant difference between ``given_text``
    and the config ``run_dir`` was trained with (its newest checkpoint's record, else its readable
    config file); empty when resuming is safe. ``upgrade`` translates a recorded config written
    with keys that have since moved. Reads only."""
    run_dir = Path(run_dir)
    given = parse_config_text(given_text)
    if given is None:
        raise UserError(f"the config to train is empty or not TOML:\n{given_text[:200]}")
    trained, _ = _trained_config(run_dir)
    if trained is not None:
        reference = parse_config_text(trained.text)
        if reference is None:
            raise RunFileError(f"the config recorded in the checkpoints of {run_dir} is not TOML")
        return config_diff(_plugins_now(_same(reference, upgrade)), given, unchecked)
    _, on_disk = _config_state(run_dir / file)
    if on_disk is None:
        return []
    return config_diff(_plugins_now(_same(on_disk, upgrade)), given, unchecked)


def _plugins_now(saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` with each recorded plugin file that moved replaced by the file loaded in its
    place (``--plugin NEWPATH``): the same plugin, so not a difference that refuses a resume."""
    from attnlab.parts.plugins import current_spec

    specs = saved.get("plugins")
    if not isinstance(specs, list):
        return saved
    now = [current_spec(p) if isinstance(p, str) else p for p in specs]
    return {**saved, "plugins": list(dict.fromkeys(now))}


def reconcile_config(
    run_dir: str | Path,
    given_text: str,
    *,
    file: str = CONFIG_FILE,
    unchecked: Iterable[str] = UNCHECKED_SECTIONS,
    upgrade: Upgrade | None = None,
) -> None:
    """Refuse to resume ``run_dir`` with a config that trains something else; repair its file.

    The reference is the config recorded in the newest intact checkpoint: a config file that is
    missing, empty, torn or different from it is rewritten from it (a :class:`RunFileWarning`
    says so). Without one (no checkpoint yet, or checkpoints from before they carried their
    config) the config file is the reference when it is readable. ``upgrade`` translates recorded
    configs whose keys have since moved (both are compared in today's keys). Call with the run
    locked.
    """
    run_dir = Path(run_dir)
    path = run_dir / file
    diff = config_conflicts(run_dir, given_text, file=file, unchecked=unchecked, upgrade=upgrade)
    trained, trained_at = _trained_config(run_dir)
    if diff:
        what = (
            f"was trained with a different config (recorded in its checkpoint {trained_at})"
            if trained
            else f"was started with a different config (its {file})"
        )
        raise UserError(
            f"{run_dir} {what}; resuming would mix two runs. Differences (saved -> given):\n  "
            + "\n  ".join(diff)
            + f"\nUse another --out, or {restart()} (its progress is deleted)"
        )
    problem, on_disk = _config_state(path)
    if trained is not None:
        reference = _same(parse_config_text(trained.text) or {}, upgrade)
        if problem or config_diff(reference, _same(on_disk or {}, upgrade), unchecked):
            why = problem or "edited (it does not match the checkpoint)"
            _warn(
                f"{path} was {why}; rewriting it from the config recorded in checkpoint "
                f"{trained_at}, which trained this run's weights"
            )
            write_config(run_dir, trained.text, file)
    elif problem not in ("", "missing"):
        _warn(f"{path} was {problem} and no checkpoint records a config; writing the given one")
        write_config(run_dir, given_text, file)


def known_configs(run_dir: Path) -> list[bytes]:
    """The config texts attnlab recorded for ``run_dir`` (its newest checkpoint's): a config
    file with these bytes is attnlab's even where the marker records no hash (an earlier
    attnlab's run)."""
    trained, _ = _trained_config(run_dir)
    return [trained.text.encode("utf-8")] if trained is not None else []


def write_config(run_dir: str | Path, text: str, file: str = CONFIG_FILE) -> None:
    """Atomically replace the run's config file. One the user edited since attnlab wrote it is
    kept aside first, with a warning (:func:`attnlab.base.owned.write_owned`), and the new
    file's SHA-256 is recorded in the run's marker."""
    from attnlab.base.owned import write_owned

    run_dir = Path(run_dir)
    write_owned(run_dir, file, text.encode("utf-8"), known_configs(run_dir))


PLUGINS_FILE = "plugins.json"


def write_plugins(
    run_dir: str | Path, specs: list[str], *, replaced_at: int | None = None, how: str = ""
) -> None:
    """Record the run's plugins (spec, module, file, sha256 of the source, distribution) in
    ``plugins.json``; nothing is written for a run without plugins. When the recorded sources
    differ from these (a resume with ``--allow-plugin-change``), the earlier records move to
    ``history`` with the step they trained up to (``replaced_at``) and ``how`` it was allowed."""
    from attnlab.parts.plugins import manifest

    records = manifest(list(specs))
    path = Path(run_dir) / PLUGINS_FILE
    old: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        loaded = json.loads(path.read_text(encoding="utf-8"))
        old = loaded if isinstance(loaded, dict) else {}
    history = [h for h in old.get("history", []) if isinstance(h, dict)]
    before = old.get("plugins")
    hashes = lambda rs: sorted(str(r.get("sha256")) for r in rs if isinstance(r, dict))  # noqa: E731
    if isinstance(before, list) and before and hashes(before) != hashes(records):
        history.append({"plugins": before, "until_step": replaced_at, "allowed_by": how or None})
    if records or history:
        body: dict[str, Any] = {"plugins": records}
        if history:
            body["history"] = history
        atomic_write_json(path, body)


def plugin_conflicts(run_dir: str | Path) -> list[str]:
    """``SPEC: sha256 RECORDED (trained) -> NOW (loaded)`` for every plugin whose source changed
    since ``run_dir`` recorded it in ``plugins.json`` (with the helper modules that changed);
    empty when the sources are the same."""
    from attnlab.parts.plugins import source_changes

    return [
        f"{spec}: sha256 {then} (trained) -> {now} (now)" + (f"; {what}" if what else "")
        for spec, then, now, what in source_changes(recorded_plugins(run_dir))
    ]


def recorded_plugins(run_dir: str | Path) -> list[dict[str, Any]]:
    """The plugins ``plugins.json`` records (``[]`` without the file; a damaged file is a
    :class:`RunFileWarning`, once per process), made known to the plugin loader first
    (:func:`attnlab.parts.plugins.remember`), so a plugin file that moved is reported with the
    SHA-256 the run recorded. Call it before validating the run's config."""
    from attnlab.parts.plugins import remember

    path = Path(run_dir) / PLUGINS_FILE
    try:
        stat = path.stat()
    except OSError:
        return []
    if not path.is_file():  # a directory or a FIFO someone put there: not a record
        return []
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _plugin_records:
        try:
            records = json.loads(path.read_text(encoding="utf-8")).get("plugins", [])
            if not isinstance(records, list):
                raise ValueError("'plugins' is not a list")
        except (OSError, ValueError, AttributeError):
            _warn(f"{path} is damaged; the plugins' sources cannot be checked against the run")
            records = []
        _plugin_records[key] = [r for r in records if isinstance(r, dict)]
    records = _plugin_records[key]
    remember(records)
    return records


_plugin_records: dict[tuple[str, int, int], list[dict[str, Any]]] = {}


def check_plugins(run_dir: str | Path) -> None:
    """Warn when a plugin's source differs from the one the run recorded."""
    from attnlab.parts.plugins import changed

    for sentence in changed(recorded_plugins(run_dir)):
        _warn(f"{run_dir}: {sentence}")


# --------------------------------------------------------------------------------- ownership


def _trained_here(run_dir: Path) -> bool:
    """An unmarked directory an earlier attnlab trained: it has an intact checkpoint."""
    from attnlab.runs.checkpoint import newest_state

    return newest_state(run_dir) is not None


def claim_run(run_dir: str | Path, what: str = "run directory") -> None:
    """Mark ``run_dir`` as attnlab's run directory, or refuse a directory that holds anything
    attnlab did not write there (naming it; see :func:`attnlab.base.owned.claim`)."""
    from attnlab.base.owned import claim

    claim(run_dir, RUN_KIND, what=what, legacy=_trained_here)


def checkpoint_strangers(run_dir: str | Path) -> list[str]:
    """Paths under ``RUN/checkpoints`` that no checkpoint writer made (a user's file)."""
    import re

    from attnlab.runs import checkpoint as ck

    root = Path(run_dir) / ck.CHECKPOINTS
    if root.is_symlink():
        return [str(root)]
    if not root.is_dir():
        return [] if not root.exists() else [str(root)]
    files = {ck.MODEL_FILE, ck.OPTIM_FILE, ck.STATE_FILE}
    out: list[str] = []
    for p in sorted(root.iterdir()):
        if p.name in (ck.LATEST, f"{ck.LATEST}.tmp") and p.is_file() and not p.is_symlink():
            continue
        if re.fullmatch(r"step_\d+(\.tmp)?", p.name) and p.is_dir() and not p.is_symlink():
            out += [str(q) for q in sorted(p.iterdir()) if q.name not in files or not q.is_file()]
            continue
        out.append(str(p))
    return out


def check_clearable(run_dir: str | Path) -> None:
    """Refuse ``--restart`` when ``checkpoints/`` holds anything a checkpoint writer did not
    make (it would be deleted with them), naming it."""
    from attnlab.base.owned import shown
    from attnlab.runs import checkpoint as ck

    strangers = checkpoint_strangers(run_dir)
    if strangers:
        raise UserError(
            f"--restart would delete {Path(run_dir) / ck.CHECKPOINTS}, which holds files attnlab "
            f"did not write: {shown(strangers)}. Move them out of the run directory and rerun"
        )


def clear_run(run_dir: str | Path, files: Iterable[str] = ()) -> None:
    """Delete what training wrote into ``run_dir`` (``--restart``): its checkpoints, metrics,
    status, config and ``files``. Refuses, deleting nothing, when ``checkpoints/`` holds anything
    a checkpoint writer did not make; a config file that is not the one attnlab wrote (edited)
    is kept aside (``config.user-edited-TIME.toml``) with a warning."""
    import shutil

    from attnlab.base.owned import keep_if_edited
    from attnlab.runs import checkpoint as ck

    run_dir = Path(run_dir)
    check_clearable(run_dir)
    keep_if_edited(run_dir, CONFIG_FILE, known_configs(run_dir))  # a user's edits: kept
    shutil.rmtree(run_dir / ck.CHECKPOINTS, ignore_errors=True)
    for name in (METRICS_FILE, STATUS_FILE, CONFIG_FILE, *files):
        (run_dir / name).unlink(missing_ok=True)
