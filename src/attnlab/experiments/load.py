"""``load_experiment``: an experiment file plus ``--set`` and ``--plugin`` as a resolved
:class:`~attnlab.experiments.resolve.Experiment`; a ``[sweep]`` is expanded over its grid
(:mod:`~attnlab.experiments.sweeps.grid`), any other experiment resolved once
(:mod:`~attnlab.experiments.resolve`)."""

from __future__ import annotations

from pathlib import Path

from attnlab.config import parse_override
from attnlab.experiments.resolve import Experiment, overridden, resolve
from attnlab.experiments.spec import ExperimentSpec, parse_experiment, read_experiment
from attnlab.experiments.sweeps.grid import expand

#: top-level keys of the experiment file that ``--set`` may change (the rest go to the base)
EXPERIMENT_KEYS = ("budget", "seeds", "baseline", "name", "description", "sweep", "ladder")


def _split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """CLI ``--set`` items: experiment keys (budget.steps, seeds, ...) vs base config keys."""
    exp, base = [], []
    for item in overrides:
        path, _ = parse_override(item)
        (exp if path[0] in EXPERIMENT_KEYS else base).append(item)
    return exp, base


def load_experiment(
    path: str | Path,
    overrides: list[str] = (),  # type: ignore[assignment]
    plugins: list[str] = (),  # type: ignore[assignment]
) -> Experiment:
    """Read, validate and resolve an experiment file; ``overrides`` are ``--set`` items,
    ``plugins`` the ``--plugin`` specs (added to the file's own ``plugins``)."""
    spec, base_over = load_spec(path, overrides, plugins)
    if spec.sweep is not None:
        return expand(spec, folder=Path(path).parent, base_overrides=base_over, source=str(path))
    return resolve(spec, folder=Path(path).parent, base_overrides=base_over, source=str(path))


def load_spec(
    path: str | Path,
    overrides: list[str] = (),  # type: ignore[assignment]
    plugins: list[str] = (),  # type: ignore[assignment]
) -> tuple[ExperimentSpec, list[str]]:
    """The experiment file with ``--set``'s experiment keys and ``--plugin`` applied, and the
    ``--set`` items left for the base config (what ``attnlab ladder`` resolves per rung)."""
    exp_over, base_over = _split_overrides(list(overrides))
    spec, raw = read_experiment(path)
    if exp_over:
        raw = overridden(raw, exp_over)
        name = spec.name
        spec = parse_experiment(raw, str(path))
        spec.name = spec.name or name
    if plugins:
        spec.plugins = [*spec.plugins, *(p for p in plugins if p not in spec.plugins)]
    return spec, base_over
