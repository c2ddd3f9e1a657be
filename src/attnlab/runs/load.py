"""A trained model back from its run directory: ``load_run_model(run_dir) -> (model, cfg, tok)``.

Used by ``eval``, ``generate`` and the compare report. The weights come from the newest intact
checkpoint (a damaged one is skipped with a warning naming it, :mod:`attnlab.runs.checkpoint`) and
the model is built from the config *that checkpoint was trained with*, so a missing, torn or
edited ``config.toml`` cannot pair weights with the wrong architecture. Checkpoints written before
they carried their config fall back to ``config.toml``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import torch

from attnlab.base.errors import UserError
from attnlab.runs import checkpoint, rundir


def _config_of(run_dir: Path, ckpt: checkpoint.Checkpoint):
    """The config ``ckpt`` was trained with; a plugin file inside the run directory is imported
    only with the user's consent (:func:`attnlab.base.consent.guarding`: code that came with a
    received directory)."""
    from attnlab.base.consent import guarding

    with guarding(run_dir):
        return _read_config_of(run_dir, ckpt)


def _read_config_of(run_dir: Path, ckpt: checkpoint.Checkpoint):
    from attnlab.config import ConfigError, load_config, validate

    record = ckpt.state.config
    rundir.recorded_plugins(run_dir)  # a moved plugin is then reported with its recorded sha256
    if record is not None:
        try:
            return validate(tomllib.loads(record.text))
        except (tomllib.TOMLDecodeError, ConfigError) as e:
            raise UserError(
                f"the config recorded in {ckpt.path} cannot be read by this attnlab ({e})"
            ) from None
    cfg_path = run_dir / rundir.CONFIG_FILE
    if not cfg_path.is_file():
        raise UserError(
            f"{run_dir} has no {rundir.CONFIG_FILE} and its checkpoint {ckpt.path.name} predates "
            "checkpoints that record their config; restore config.toml from where the run started"
        )
    return load_config(str(cfg_path))


def run_config(run_dir: str | Path):
    """The run's Config: its ``config.toml`` when that is intact, else the config recorded in its
    newest intact checkpoint (the file may be missing or torn), else None. A plugin file inside
    the run directory is imported only with consent, as in :func:`load_run_model`."""
    from attnlab.base.consent import guarding

    with guarding(run_dir):
        return _read_run_config(Path(run_dir))


def _read_run_config(run_dir: Path):
    from attnlab.config import ConfigError, load_config, validate

    cfg_path = run_dir / rundir.CONFIG_FILE
    rundir.recorded_plugins(run_dir)
    if cfg_path.is_file() and rundir.parse_config_text(_text(cfg_path)) is not None:
        try:
            return load_config(str(cfg_path))
        except ConfigError:
            pass
    newest = checkpoint.newest_state(run_dir)
    if newest is None or newest[1].config is None:
        return None
    try:
        return validate(tomllib.loads(newest[1].config.text))
    except (tomllib.TOMLDecodeError, ConfigError):
        return None


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def is_run_dir(path: str | Path) -> bool:
    """A training run directory: it has ``config.toml`` or a ``checkpoints/`` directory."""
    path = Path(path)
    return (path / rundir.CONFIG_FILE).is_file() or (path / checkpoint.CHECKPOINTS).is_dir()


def refuse_linked_checkpoints(run_dir: Path) -> None:
    """A ``checkpoints`` that is a link is named as the cause: checkpoints are read (and
    written) only inside the run directory."""
    import os

    root = run_dir / checkpoint.CHECKPOINTS
    if root.is_symlink():
        raise UserError(
            f"{root} is a link to {os.path.realpath(root)}, not the run's own checkpoints "
            "directory; attnlab reads checkpoints only from inside the run. Replace the link by "
            "the real checkpoints directory (copy it in) and rerun"
        )


def load_run_model(run_dir: str | Path, device: str | torch.device = "cpu"):
    """(model in eval mode on ``device``, Config, tokenizer) of a run's newest intact checkpoint."""
    from attnlab.data import load_tokenizer
    from attnlab.model import build_model

    run_dir = Path(run_dir)
    if not is_run_dir(run_dir):
        raise UserError(
            f"{run_dir} is not a run directory (no config.toml, no checkpoints/); give the --out "
            "of `attnlab train`"
        )
    refuse_linked_checkpoints(run_dir)
    ckpt = checkpoint.load_latest(run_dir, with_optim=False)
    if ckpt is None:
        every = ""
        cfg_path = run_dir / rundir.CONFIG_FILE
        if cfg_path.is_file():
            from attnlab.config import load_config

            with_cfg = load_config(str(cfg_path))
            every = f" (checkpoints every train.checkpoint_every={with_cfg.train.checkpoint_every})"
        raise UserError(
            f"{run_dir} has no checkpoint yet{every}; let `attnlab train` run until its first "
            "checkpoint, or pick another run"
        )
    cfg = _config_of(run_dir, ckpt)  # loads the plugins the config names
    rundir.check_plugins(run_dir)
    model = build_model(cfg.model)
    try:
        model.load_state_dict(ckpt.model, strict=True)
    except RuntimeError as e:
        raise UserError(
            f"checkpoint {ckpt.path} does not fit the model its config describes ({e}); was the "
            "model code changed since training?"
        ) from None
    data_dir = Path(cfg.data.dir) if cfg.data.dir else None
    if data_dir is not None and (data_dir / "meta.json").is_file():
        tokenizer = load_tokenizer(cfg.data.tokenizer, data_dir=data_dir)
    else:  # the data directory moved: fixed tokenizers (bytes, gpt2, ...) load by name
        tokenizer = load_tokenizer(cfg.data.tokenizer)
    return model.to(device).eval(), cfg, tokenizer


def load_source(source: str | Path):
    """(model, Config, tokenizer, run_dir, step) of a run directory (its newest intact checkpoint)
    or of one checkpoint directory ``RUN/checkpoints/step_N``."""
    from attnlab.runs.checkpoint import CheckpointError, newest_state, read_checkpoint

    path = Path(source)
    if not path.exists():
        raise UserError(f"{str(source)!r} does not exist; give a run directory or a checkpoint")
    ckpt_dir = None
    if (path / "model.safetensors").is_file() and path.parent.name == "checkpoints":
        ckpt_dir, path = path, path.parent.parent
    if not is_run_dir(path):
        raise UserError(
            f"{str(source)!r} is not a run directory (config.toml, checkpoints/) or a checkpoint "
            "(RUN/checkpoints/step_N); give the --out of `attnlab train`"
        )
    model, cfg, tokenizer = load_run_model(path, device="cpu")
    newest = newest_state(path)
    step = newest[1].step if newest is not None else None
    if ckpt_dir is not None:
        try:
            ckpt = read_checkpoint(ckpt_dir, with_optim=False)
        except CheckpointError as e:
            raise UserError(f"cannot read checkpoint {ckpt_dir}: {e}") from None
        model.load_state_dict(ckpt.model, strict=True)
        step = ckpt.step
    return model, cfg, tokenizer, path, step
