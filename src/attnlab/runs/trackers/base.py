"""What every experiment tracker implements, and what a run tells it about itself."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError

INSTALL = "pip install 'attnlab[trackers]'"


class TrackerError(UserError):
    """A tracker that cannot start (a missing client names the install command)."""


def missing_client(logger: str, module: str) -> TrackerError:
    return missing_clients([(logger, module)])


def missing_clients(missing: list[tuple[str, str]]) -> TrackerError:
    """One error naming every ``(logger, package)`` that is missing."""
    loggers = ", ".join(repr(n) for n, _ in missing)
    modules = ", ".join(m for _, m in missing)
    return TrackerError(
        f"train.loggers {loggers} need(s) {modules} (missing: {modules}), from attnlab's "
        f"[trackers] extra: {INSTALL} (or remove {loggers} from train.loggers)"
    )


@dataclass
class RunInfo:
    """Labels of one run for the trackers. ``group`` is the experiment (wandb group),
    ``job_type`` the variant or protocol (wandb job_type); TensorBoard writes one folder per run
    (``RUN_DIR/tensorboard``)."""

    run_dir: Path
    name: str
    group: str = ""
    job_type: str = "train"
    config: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)


class Tracker(ABC):
    """One tracker of one run. ``state`` is what it needs to find the same run again (stored in
    ``RUN_DIR/trackers.json``, e.g. wandb's run id), so a resumed run, and results logged later
    (``attnlab eval``), continue it."""

    name: str

    def __init__(self, info: RunInfo, state: dict[str, Any]) -> None:
        self.info, self.state = info, state

    @abstractmethod
    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Scalars at ``step`` (names like ``train/loss``, ``val/loss``, ``eval/TASK/METRIC``)."""

    @abstractmethod
    def log_text(self, key: str, text: str) -> None:
        """A text record (the config as TOML, the final status as JSON)."""

    @abstractmethod
    def log_images(self, step: int, images: dict[str, Path]) -> None:
        """PNG files under their names (the compare report's plots)."""

    @abstractmethod
    def finish(self, status: dict[str, Any] | None) -> None:
        """Flush and close; ``status`` (``status.json``'s content) is the run's outcome."""
