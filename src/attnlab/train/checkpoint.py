"""Checkpoints that survive a kill at any moment, load without unpickling, and resume bit for bit.

Layout (``RUN_DIR/checkpoints``)::

    step_0000100/  model.safetensors   weights (tied tensors stored once, aliases in the metadata)
                   optim.safetensors   optimizer state flattened to ``state/<param>/<key>`` tensors,
                                       param_groups as JSON metadata
                   state.json          step, per-rank RNG states, counters, file sizes, versions
    latest         the name of the newest complete checkpoint directory

A checkpoint is written into ``step_XXXXXXX.tmp/``, every file fsynced, then renamed into place;
``latest`` is replaced atomically afterwards. A directory without ``.tmp`` is therefore complete
unless the disk later damaged it; loading checks sizes and parses every file, and falls back to the
previous checkpoint with a :class:`CheckpointWarning` when one is unreadable. Nothing is ever read
with pickle: tensors come from safetensors, everything else from JSON.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from attnlab.errors import UserError

CHECKPOINTS = "checkpoints"
LATEST = "latest"
KEEP_LAST = 2  # complete checkpoints kept on disk; older ones are deleted after each save
MODEL_FILE = "model.safetensors"
OPTIM_FILE = "optim.safetensors"
STATE_FILE = "state.json"


class CheckpointWarning(UserWarning):
    """A checkpoint could not be read and an older one is used instead."""


class CheckpointError(Exception):
    """One checkpoint directory is unreadable (truncated, missing a file, inconsistent)."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: full (unsharded) model and optimizer state dicts plus ``state.json``."""

    path: Path
    step: int
    model: dict[str, torch.Tensor]
    optim: dict[str, Any] | None
    state: dict[str, Any]


def step_name(step: int) -> str:
    return f"step_{step:07d}"


# ------------------------------------------------------------------------------ tensors on disk


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
    """An optimizer state dict (params keyed by name) as flat tensors + JSON metadata."""
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
    """Inverse of :func:`flatten_optimizer`."""
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


# ------------------------------------------------------------------------------------ RNG state


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def rng_state() -> dict[str, Any]:
    """This process's RNG states (torch CPU, every CUDA device, Python ``random``) as JSON."""
    py = random.getstate()
    out: dict[str, Any] = {
        "torch": _b64(torch.get_rng_state()),
        "python": [py[0], list(py[1]), py[2]],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return out


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    torch.set_rng_state(_unb64(state["torch"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        cuda = [_unb64(s) for s in state["cuda"]]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


# ------------------------------------------------------------------------------- write and find


def _write_latest(ckpt_root: Path, name: str) -> None:
    tmp = ckpt_root / f"{LATEST}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ckpt_root / LATEST)
    _fsync_dir(ckpt_root)


def write_checkpoint(
    run_dir: Path,
    step: int,
    model_state: Mapping[str, torch.Tensor],
    optim_state: Mapping[str, Any],
    state: Mapping[str, Any],
    keep: int = KEEP_LAST,
) -> Path:
    """Atomically write checkpoint ``step`` (model, optimizer, ``state``), point ``latest`` at
    it and delete all but the newest ``keep`` complete checkpoints. Call on rank 0 only."""
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_name(step)
    tmp = root / (step_name(step) + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_tensors(model_state, tmp / MODEL_FILE, {"step": str(step)})
    opt_tensors, opt_meta = flatten_optimizer(optim_state)
    save_tensors(opt_tensors, tmp / OPTIM_FILE, opt_meta)
    files = {n: (tmp / n).stat().st_size for n in (MODEL_FILE, OPTIM_FILE)}
    full_state = {**state, "step": step, "files": files}
    (tmp / STATE_FILE).write_text(json.dumps(full_state, indent=1), encoding="utf-8")
    for n in (MODEL_FILE, OPTIM_FILE, STATE_FILE):
        _fsync_file(tmp / n)
    _fsync_dir(tmp)
    if final.exists():  # re-saving a step after falling back past a damaged copy
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    _write_latest(root, final.name)
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
    """Load one checkpoint directory or raise :class:`CheckpointError` saying what is wrong."""
    path = Path(path)
    try:
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
        step = int(state["step"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path / STATE_FILE}: {e}") from None
    for name, size in state.get("files", {}).items():
        try:
            actual = (path / name).stat().st_size
        except OSError as e:
            raise CheckpointError(f"{path / name}: {e}") from None
        if actual != size:
            raise CheckpointError(f"{path / name} has {actual} bytes, expected {size} (truncated?)")
    try:
        model, _ = load_tensors(path / MODEL_FILE)
        optim = None
        if with_optim:
            tensors, meta = load_tensors(path / OPTIM_FILE)
            optim = unflatten_optimizer(tensors, meta)
    except Exception as e:  # safetensors raises its own error types for damaged files
        raise CheckpointError(f"{path}: unreadable safetensors ({e})") from None
    return Checkpoint(path=path, step=step, model=model, optim=optim, state=state)


def _candidates(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / CHECKPOINTS
    ordered = [p for _, p in complete_checkpoints(run_dir)]
    try:
        named = root / (root / LATEST).read_text(encoding="utf-8").strip()
    except OSError:
        return ordered
    if named in ordered:
        ordered.remove(named)
        ordered.insert(0, named)
    return ordered


def load_latest(run_dir: Path, *, with_optim: bool = True) -> Checkpoint | None:
    """The newest loadable checkpoint of ``run_dir`` (``latest`` first, then by step); None when
    there is none at all. Unreadable ones are skipped with a :class:`CheckpointWarning`; if every
    one is unreadable, a :class:`UserError` lists why."""
    problems = []
    for path in _candidates(run_dir):
        try:
            ckpt = read_checkpoint(path, with_optim=with_optim)
        except CheckpointError as e:
            problems.append(str(e))
            warnings.warn(
                f"skipping damaged checkpoint {path.name}: {e}", CheckpointWarning, stacklevel=2
            )
            continue
        return ckpt
    if problems:
        raise UserError(
            f"no checkpoint in {Path(run_dir) / CHECKPOINTS} is loadable:\n  "
            + "\n  ".join(problems)
            + "\nDelete the damaged directories to start over, or restore them from a backup"
        )
    return None


# ------------------------------------------------------------------------------- run -> model


def load_run_model(run_dir: str | Path, device: str | torch.device = "cpu"):
    """(model in eval mode on ``device``, Config, tokenizer) from a run directory's newest
    loadable checkpoint; used by ``generate``, ``eval`` and ``compare``."""
    from attnlab.config import load_config
    from attnlab.data import load_tokenizer
    from attnlab.model import build_model

    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.toml"
    if not cfg_path.is_file():
        raise UserError(
            f"{run_dir} is not a run directory (no config.toml); give the --out of `attnlab train`"
        )
    cfg = load_config(str(cfg_path))
    ckpt = load_latest(run_dir, with_optim=False)
    if ckpt is None:
        raise UserError(
            f"{run_dir} has no checkpoint yet; train longer (checkpoints every "
            f"train.checkpoint_every={cfg.train.checkpoint_every} steps) or pick another run"
        )
    model = build_model(cfg.model)
    try:
        model.load_state_dict(ckpt.model, strict=True)
    except RuntimeError as e:
        raise UserError(
            f"checkpoint {ckpt.path} does not fit the model described by {cfg_path} ({e}); was "
            "the model code or config.toml changed since training?"
        ) from None
    data_dir = Path(cfg.data.dir) if cfg.data.dir else None
    if data_dir is not None and (data_dir / "meta.json").is_file():
        tokenizer = load_tokenizer(cfg.data.tokenizer, data_dir=data_dir)
    else:  # the data directory moved: fixed tokenizers (bytes, gpt2, ...) load by name
        tokenizer = load_tokenizer(cfg.data.tokenizer)
    return model.to(device).eval(), cfg, tokenizer
