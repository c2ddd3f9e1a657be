"""Checkpoints that survive a kill at any moment, prove their own integrity, and resume bit for bit.

Layout (``RUN_DIR/checkpoints``)::

    step_0000100/  model.safetensors   weights (tied tensors stored once, aliases in the metadata)
                   optim.safetensors   optimizer state flattened to ``state/<param>/<key>`` tensors,
                                       param_groups as JSON metadata
                   state.json          step, counters, per-rank RNG states, the training config,
                                       and the size and sha256 of each file above
    latest         the name of the newest complete checkpoint directory

A checkpoint is written into ``step_XXXXXXX.tmp/``, every file fsynced, then renamed into place;
``latest`` is replaced atomically afterwards. ``state.json`` records the sha256 of every tensor file
and a sha256 of its own content (every key but ``sha256``, canonical JSON), so a flipped byte
anywhere is found when the checkpoint is loaded. A damaged checkpoint is skipped with a
:class:`CheckpointWarning` naming it, and the newest intact one is used instead; this holds for
resuming, ``eval``, ``generate`` and probe adapters alike. Nothing is ever read with pickle:
tensors come from safetensors, everything else from JSON.

Cost of the integrity check: one extra sequential read of each file on save and on load (sha256
runs at about 1 GB/s per core), small next to the write itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from attnlab.base.advice import restart
from attnlab.base.atomic import dumps_json, fsync_dir, json_safe, sha256_file
from attnlab.base.errors import UserError
from attnlab.runs.records import (
    CheckpointState,
    ConfigRecord,
    FileRecord,
    RunFileError,
    parse_record,
)

CHECKPOINTS = "checkpoints"
LATEST = "latest"
KEEP_LAST = 2  # complete checkpoints kept on disk; older ones are deleted after each save
MODEL_FILE = "model.safetensors"
OPTIM_FILE = "optim.safetensors"
STATE_FILE = "state.json"
FORMAT = 2


class CheckpointWarning(UserWarning):
    """A checkpoint could not be read and an older one is used instead."""


class CheckpointError(Exception):
    """One checkpoint directory is unreadable (truncated, missing a file, content changed)."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: full (unsharded) model and optimizer state dicts plus ``state.json``."""

    path: Path
    step: int
    model: dict[str, torch.Tensor]
    optim: dict[str, Any] | None
    state: CheckpointState


def step_name(step: int) -> str:
    return f"step_{step:07d}"


# ------------------------------------------------------------------------------ tensors on disk


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def save_tensors(
    tensors: Mapping[str, torch.Tensor], path: Path, metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``tensors`` to safetensors; tensors sharing storage (tied weights) are written once."""
    by_storage: dict[tuple[int, int, tuple[int, ...], torch.dtype], str] = {}
    out: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    for name, t in tensors.items():
        t = t.detach()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if t.numel() and key in by_storage:
            aliases[name] = by_storage[key]
            continue
        by_storage[key] = name
        out[name] = t.to("cpu").contiguous()
    meta = dict(metadata or {})
    if aliases:
        meta["aliases"] = json.dumps(aliases)
    save_file(out, str(path), metadata=meta)


def load_tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read a safetensors file (no pickle); aliases written by :func:`save_tensors` reappear."""
    tensors: dict[str, torch.Tensor] = {}
    with safe_open(str(path), framework="pt", device="cpu") as f:
        meta = dict(f.metadata() or {})
        for name in f.keys():  # noqa: SIM118 (safe_open is not a Mapping)
            tensors[name] = f.get_tensor(name)
    for alias, target in json.loads(meta.pop("aliases", "{}")).items():
        tensors[alias] = tensors[target]
    return tensors, meta


def flatten_optimizer(osd: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """An optimizer state dict (params keyed by name or index) as flat tensors + JSON metadata."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for param, entry in osd["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state/{param}/{key}"] = value
            else:
                scalars.setdefault(str(param), {})[key] = value
    groups = [dict(g) for g in osd["param_groups"]]
    return tensors, {"param_groups": json.dumps(groups), "scalars": json.dumps(scalars)}


def unflatten_optimizer(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, str]) -> dict:
    """Inverse of :func:`flatten_optimizer` (parameter keys come back as strings)."""
    state: dict[str, dict[str, Any]] = {}
    for name, t in tensors.items():
        _, rest = name.split("/", 1)
        param, key = rest.rsplit("/", 1)
        state.setdefault(param, {})[key] = t
    for param, entry in json.loads(meta.get("scalars", "{}")).items():
        state.setdefault(param, {}).update(entry)
    groups = json.loads(meta["param_groups"])
    for g in groups:
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
    return {"state": state, "param_groups": groups}


# --------------------------------------------------------------------------------- state.json


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _seal(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` under the JSON policy with ``sha256`` = the hash of everything else."""
    body = json_safe({k: v for k, v in state.items() if k != "sha256"})
    return {**body, "sha256": hashlib.sha256(_canonical(body)).hexdigest()}


def read_state(path: Path) -> CheckpointState:
    """``path/state.json``, validated and (format 2) checked against its own hash."""
    file = Path(path) / STATE_FILE
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError covers bad UTF-8 and bad JSON
        raise CheckpointError(f"{file}: unreadable ({e})") from None
    try:
        state = parse_record(CheckpointState, raw, str(file))
    except RunFileError as e:
        raise CheckpointError(str(e)) from None
    if state.sha256 is not None:
        body = {k: v for k, v in raw.items() if k != "sha256"}
        if hashlib.sha256(_canonical(body)).hexdigest() != state.sha256:
            raise CheckpointError(f"{file}: content does not match its recorded sha256")
    return state


def _verify_file(path: Path, name: str, record: FileRecord | int) -> None:
    file = path / name
    try:
        actual = file.stat().st_size
    except OSError as e:
        raise CheckpointError(f"{file}: {e.strerror or e}") from None
    size = record if isinstance(record, int) else record.bytes
    if actual != size:
        raise CheckpointError(f"{file} has {actual} bytes, expected {size} (truncated?)")
    if isinstance(record, FileRecord) and sha256_file(file) != record.sha256:
        raise CheckpointError(f"{file}: content does not match its recorded sha256 (damaged)")


# ------------------------------------------------------------------------------- write and find


def _write_latest(ckpt_root: Path, name: str) -> None:
    tmp = ckpt_root / f"{LATEST}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ckpt_root / LATEST)
    fsync_dir(ckpt_root)


def write_checkpoint(
    run_dir: Path,
    step: int,
    model_state: Mapping[str, torch.Tensor],
    optim_state: Mapping[str, Any],
    state: Mapping[str, Any],
    *,
    config: ConfigRecord | None = None,
    keep: int = KEEP_LAST,
) -> Path:
    """Atomically write checkpoint ``step`` (model, optimizer, ``state`` plus the training
    ``config``), point ``latest`` at it and delete all but the newest ``keep`` complete
    checkpoints. Call on rank 0 only. A failed write (full disk, file-size limit) leaves the
    earlier checkpoints as they were and raises a :class:`UserError` saying so."""
    root = Path(run_dir) / CHECKPOINTS
    final = root / step_name(step)
    tmp = root / (step_name(step) + ".tmp")
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        save_tensors(model_state, tmp / MODEL_FILE, {"step": str(step)})
        opt_tensors, opt_meta = flatten_optimizer(optim_state)
        save_tensors(opt_tensors, tmp / OPTIM_FILE, opt_meta)
        files = {
            n: {"bytes": (tmp / n).stat().st_size, "sha256": sha256_file(tmp / n)}
            for n in (MODEL_FILE, OPTIM_FILE)
        }
        full = {**state, "format": FORMAT, "step": step, "files": files}
        if config is not None:
            full["config"] = config.model_dump()
        (tmp / STATE_FILE).write_text(dumps_json(_seal(full), indent=1), encoding="utf-8")
        for n in (MODEL_FILE, OPTIM_FILE, STATE_FILE):
            _fsync_file(tmp / n)
        fsync_dir(tmp)
        if final.exists():  # re-saving a step after falling back past a damaged copy
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_dir(root)
        _write_latest(root, final.name)
    except OSError as e:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(
            f"could not write checkpoint {final} ({e.strerror or e}); the earlier checkpoints in "
            f"{root} are intact. Free disk space (or raise the file-size limit) and run the same "
            "command again to resume"
        ) from None
    prune(run_dir, keep)
    return final


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every finished checkpoint directory, newest first."""
    root = Path(run_dir) / CHECKPOINTS
    found = []
    if root.is_dir():
        for p in root.iterdir():
            name = p.name
            if p.is_dir() and name.startswith("step_") and not name.endswith(".tmp"):
                try:
                    found.append((int(name[5:]), p))
                except ValueError:
                    continue
    return sorted(found, reverse=True)


def prune(run_dir: Path, keep: int = KEEP_LAST) -> None:
    """Delete interrupted ``.tmp`` directories and all but the newest ``keep`` checkpoints."""
    root = Path(run_dir) / CHECKPOINTS
    for p in root.glob("step_*.tmp"):
        shutil.rmtree(p, ignore_errors=True)
    for _, p in complete_checkpoints(run_dir)[keep:]:
        shutil.rmtree(p, ignore_errors=True)


def read_checkpoint(path: Path, *, with_optim: bool = True) -> Checkpoint:
    """Load and verify one checkpoint directory, or raise :class:`CheckpointError` saying what is
    wrong. Only the files loaded are hashed (``with_optim=False`` skips the optimizer's)."""
    path = Path(path)
    state = read_state(path)
    needed = [MODEL_FILE, OPTIM_FILE] if with_optim else [MODEL_FILE]
    for name in needed:
        record = state.files.get(name)
        if record is None:
            if state.files:  # format 1 and 2 list both tensor files
                raise CheckpointError(f"{path / STATE_FILE} does not list {name}")
            continue
        _verify_file(path, name, record)
    try:
        model, _ = load_tensors(path / MODEL_FILE)
        optim = None
        if with_optim:
            tensors, meta = load_tensors(path / OPTIM_FILE)
            optim = unflatten_optimizer(tensors, meta)
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise CheckpointError(f"{path}: unreadable safetensors ({e})") from None
    return Checkpoint(path=path, step=state.step, model=model, optim=optim, state=state)


def _candidates(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / CHECKPOINTS
    ordered = [p for _, p in complete_checkpoints(run_dir)]
    try:
        named = root / (root / LATEST).read_text(encoding="utf-8").strip()
    except (OSError, ValueError):
        return ordered
    if named in ordered:
        ordered.remove(named)
        ordered.insert(0, named)
    return ordered


def _skip_warning(path: Path, error: CheckpointError, rest: list[Path]) -> None:
    then = f"falling back to {rest[0].name}" if rest else "no older checkpoint is left"
    warnings.warn(
        f"skipping damaged checkpoint {path.name}: {error}; {then}", CheckpointWarning, stacklevel=3
    )


def load_latest(run_dir: Path, *, with_optim: bool = True) -> Checkpoint | None:
    """The newest intact checkpoint of ``run_dir`` (``latest`` first, then by step); None when
    there is none at all. Damaged ones are skipped with a :class:`CheckpointWarning` naming them;
    if every one is damaged, a :class:`UserError` lists why."""
    problems = []
    candidates = _candidates(run_dir)
    for i, path in enumerate(candidates):
        try:
            return read_checkpoint(path, with_optim=with_optim)
        except CheckpointError as e:
            problems.append(str(e))
            _skip_warning(path, e, candidates[i + 1 :])
    if problems:
        raise UserError(
            f"no checkpoint in {Path(run_dir) / CHECKPOINTS} is intact:\n  "
            + "\n  ".join(problems)
            + f"\nRestore them from a backup, or {restart()}"
        )
    return None


def newest_state(run_dir: Path) -> tuple[Path, CheckpointState] | None:
    """(path, ``state.json``) of the newest checkpoint whose ``state.json`` is intact (its tensor
    files are not read): enough to learn the config a run was trained with."""
    for path in _candidates(run_dir):
        try:
            return path, read_state(path)
        except CheckpointError:
            continue
    return None
