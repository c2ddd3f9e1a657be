"""Which config a run has. The newest intact checkpoint carries the config it was trained
with (:mod:`attnlab.runs.checkpoint`); that copy, not the config file, decides whether a rerun may
resume. A config file that is missing, empty, torn or edited is rewritten from it with a warning;
a given config that trains something else is refused with the differing keys."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from attnlab.base.advice import restart
from attnlab.base.errors import UserError
from attnlab.base.owned import write_owned
from attnlab.config import ConfigError, dump_toml, flatten, validate
from attnlab.parts.plugins import current_spec
from attnlab.runs.checkpoint import newest_state
from attnlab.runs.records import ConfigRecord, RunFileError
from attnlab.runs.rundir.files import CONFIG_FILE, UNCHECKED_SECTIONS, warn_run_file


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
            warn_run_file(
                f"{path} was {why}; rewriting it from the config recorded in checkpoint "
                f"{trained_at}, which trained this run's weights"
            )
            write_config(run_dir, trained.text, file)
    elif problem not in ("", "missing"):
        warn_run_file(
            f"{path} was {problem} and no checkpoint records a config; writing the given one"
        )
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
    run_dir = Path(run_dir)
    write_owned(run_dir, file, text.encode("utf-8"), known_configs(run_dir))
