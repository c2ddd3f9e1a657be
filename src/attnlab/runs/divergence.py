"""Divergence is an outcome of a run, not a crash: NaN/inf loss or gradient, or a loss spike.

The spike rule: with ``s_t`` the bias-corrected exponential moving average of the loss,
``s_t = m_t / (1 - beta^t)``, ``m_t = beta m_{t-1} + (1 - beta) loss_t``, the run has diverged at
step ``t`` when ``loss_t > spike_factor * min_{u<t} s_u`` (off when ``spike_factor`` is 0). The
smoothed minimum, not the raw one, keeps one lucky batch from setting the bar.
"""

from __future__ import annotations

import math
from typing import Any


class DivergenceMonitor:
    """Feed it each step's loss (and gradient norm); it answers with a reason once diverged."""

    def __init__(self, spike_factor: float = 0.0, beta: float = 0.9) -> None:
        self.spike_factor = spike_factor
        self.beta = beta
        self.ema = 0.0
        self.n = 0
        self.best_smoothed = math.inf

    def check(self, loss: float, grad_norm: float | None = None) -> str | None:
        """None while healthy, else a one-line reason; updates the smoothed loss."""
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if grad_norm is not None and not math.isfinite(grad_norm):
            return f"gradient norm is {grad_norm}"
        if self.spike_factor > 0 and loss > self.spike_factor * self.best_smoothed:
            return (
                f"loss {loss:.4f} exceeds train.spike_factor={self.spike_factor} x best smoothed "
                f"loss {self.best_smoothed:.4f}"
            )
        self.n += 1
        self.ema = self.beta * self.ema + (1 - self.beta) * loss
        self.best_smoothed = min(self.best_smoothed, self.ema / (1 - self.beta**self.n))
        return None

    def state_dict(self) -> dict[str, Any]:
        best = self.best_smoothed if math.isfinite(self.best_smoothed) else None
        return {"ema": self.ema, "n": self.n, "best_smoothed": best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema = float(state["ema"])
        self.n = int(state["n"])
        best = state.get("best_smoothed")
        self.best_smoothed = math.inf if best is None else float(best)
