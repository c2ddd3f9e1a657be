"""TensorBoard through ``torch.utils.tensorboard`` (needs the ``tensorboard`` package): one
event folder per run, ``RUN_DIR/tensorboard``; ``tensorboard --logdir EXPERIMENT/runs`` shows an
experiment's runs side by side, named by variant and seed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnlab.runs.trackers.base import RunInfo, Tracker, missing_client

FOLDER = "tensorboard"


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, info: RunInfo, state: dict[str, Any]) -> None:
        super().__init__(info, state)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise missing_client("tensorboard", "tensorboard") from None
        self.writer = SummaryWriter(log_dir=str(Path(info.run_dir) / FOLDER))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)

    def log_text(self, key: str, text: str) -> None:
        self.writer.add_text(key, f"```\n{text}\n```")

    def log_images(self, step: int, images: dict[str, Path]) -> None:
        from matplotlib.image import imread

        for key, path in images.items():
            pixels = imread(path)[..., :3]  # RGB floats in [0, 1]
            self.writer.add_image(key, pixels, global_step=step, dataformats="HWC")

    def finish(self, status: dict[str, Any] | None) -> None:
        if status is not None:
            self.log_text("status", json.dumps(status, indent=1, default=str))
        self.writer.close()
