"""Weights & Biases through its official client. ``WANDB_MODE`` is wandb's own switch; when it is
unset and no API key is configured (``WANDB_API_KEY`` or a ``wandb login``), runs are written
offline (``RUN_DIR/wandb/offline-run-*``, upload later with ``wandb sync``). The project is
``WANDB_PROJECT`` (default ``attnlab``); an experiment's runs share the group (the experiment)
and the job type (the variant), so the wandb UI groups seeds of one variant."""

from __future__ import annotations

import netrc
import os
import secrets
from pathlib import Path
from typing import Any

from attnlab.runs.trackers.base import RunInfo, Tracker, missing_client


def _mode() -> str | None:
    if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return None  # wandb decides
    try:
        if netrc.netrc().authenticators("api.wandb.ai"):
            return None
    except (OSError, netrc.NetrcParseError):
        pass
    return "offline"


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, info: RunInfo, state: dict[str, Any]) -> None:
        super().__init__(info, state)
        try:
            import wandb
        except ImportError:
            raise missing_client("wandb", "wandb") from None
        if "id" not in state:
            state["id"] = secrets.token_hex(4)  # wandb run ids: lowercase letters and digits
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "attnlab"),
            dir=str(info.run_dir),
            id=state["id"],
            resume="allow",
            name=info.name,
            group=info.group or None,
            job_type=info.job_type,
            tags=info.tags or None,
            config=info.config,
            mode=_mode(),
            reinit="create_new",
            settings=wandb.Settings(silent=True, console="off"),
        )
        state["mode"] = self.run.settings.mode

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_text(self, key: str, text: str) -> None:
        self.run.summary[key] = text

    def log_images(self, step: int, images: dict[str, Path]) -> None:
        import wandb

        self.run.log({k: wandb.Image(str(p)) for k, p in images.items()}, step=step)

    def finish(self, status: dict[str, Any] | None) -> None:
        if status is not None:
            for key in ("status", "step", "final_val_loss", "best_val_loss", "tokens", "reason"):
                if status.get(key) is not None:
                    self.run.summary[key] = status[key]
        failed = status is not None and status.get("status") in ("failed", "diverged")
        self.run.finish(exit_code=1 if failed else 0)
