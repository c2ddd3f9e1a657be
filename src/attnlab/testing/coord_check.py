"""The coordinate check (Yang et al. 2022, "Tensor Programs V", §F): under µP, the size of a
network's activations, and of their change in training, does not grow with width.

For each width ``w`` a model is built (``make_config(w)``, its Q, K, V parts run unfused so each
is observed), made µP relative to the smallest width (:func:`attnlab.model.mup.apply_mup`), and
trained ``steps`` Adam steps on one fixed batch of random tokens (the same at every width; one
batch repeated makes the updates correlate with the activations, the effect that makes a
mis-scaled learning rate grow). A forward hook on every module that holds parameters and on
every part records its output on that batch before the first step (``h_0``) and after the last
(``h_t``). Two coordinate sizes per module, averaged over ``seeds``: ``mean |h_t|`` (catches a
wrong init or a width-dependent factor in a forward) and ``mean |h_t - h_0|`` (catches a wrong
learning rate, which the init would otherwise hide for the first steps). Each one's growth
exponent is the least-squares slope of ``log size`` against ``log width``; the check fails for a
module with either exponent above ``threshold``. A µP model's stay within about +-0.05; a standard
one's (fixed init std, one learning rate) grow like width^1 to width^2.5, and a hidden weight
given the input-like (unscaled) learning rate like width^0.45 at the default learning rate.
The failure names the first such module in forward order and its weights: the growth starts
there, and everything after it inherits it.

Defaults: widths 32, 64, 128, 3 steps at lr 3e-3 (attnlab's ``tiny`` preset's), 2 seeds. A
larger learning rate makes training chaotic at these sizes and the exponents noisy (+-0.3 with
one seed at 1e-2). Cost: ``len(widths) x seeds x (steps + 2)`` passes of small models, a few
seconds of CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.model.mup import apply_mup, mup_param_groups, set_lr
from attnlab.parts import Part

#: the default growth exponent above which an activation is said to grow with width
THRESHOLD = 0.25


@dataclass
class CoordCheck:
    """Per module, at each width: the size of its output after the steps (``scales``) and of
    its change over them (``updates``), their growth exponents, and the module's weights."""

    widths: list[int]
    steps: int
    scales: dict[str, list[float]]
    updates: dict[str, list[float]]
    slopes: dict[str, float]
    update_slopes: dict[str, float]
    weights: dict[str, list[str]]
    threshold: float = THRESHOLD
    mup: bool = True
    order: list[str] = field(default_factory=list)

    def growth(self, name: str) -> float:
        """The larger of the module's two growth exponents (0 where none could be fitted)."""
        return max(self.slopes.get(name, 0.0), self.update_slopes.get(name, 0.0))

    @property
    def failures(self) -> list[str]:
        """Modules whose activations grow with width, in forward order."""
        return [n for n in self.order if self.growth(n) > self.threshold]

    @property
    def passed(self) -> bool:
        return not self.failures

    def message(self) -> str:
        """What grew first, by how much, and its weights; or that nothing did."""
        what = "µP" if self.mup else "the standard parametrisation"
        ws = f"widths {self.widths[0]}..{self.widths[-1]}, {self.steps} Adam steps"
        if self.passed:
            worst = max((self.growth(n) for n in self.order), default=0.0)
            return (
                f"coordinate check passed ({what}, {ws}): no activation or its change grows "
                f"faster than width^{self.threshold:g} (largest exponent {worst:+.2f})"
            )
        first = self.failures[0]
        by_update = self.update_slopes.get(first, 0.0) > self.slopes.get(first, 0.0)
        s = (self.updates if by_update else self.scales)[first]
        what_grew = "change over the steps" if by_update else "size"
        others = len(self.failures) - 1
        return (
            f"coordinate check failed ({what}, {ws}): the output of {first} grows with width "
            f"(its {what_grew} as width^{self.growth(first):.2f}, mean |x| {s[0]:.3g} -> "
            f"{s[-1]:.3g}); its weights: {', '.join(self.weights[first]) or 'none of its own'}"
            + (f"; {others} module(s) after it grow too" if others else "")
            + ". Declare how they scale with width (Part.width_scaling: input, hidden, output) "
            "or remove the width-dependent factor from the part's forward"
        )

    def assert_passed(self) -> None:
        assert self.passed, self.message()


def _watched(model: nn.Module) -> dict[str, list[str]]:
    """Module name -> its weights' names, for every module with parameters of its own and every
    part (whose weights are all of its parameters)."""
    out = {}
    for name, m in model.named_modules():
        own = [f"{name}.{p}" if name else p for p, _ in m.named_parameters(recurse=False)]
        if isinstance(m, Part):
            own = [f"{name}.{p}" for p, _ in m.named_parameters()]
        if own and name:
            out[name] = own
    return out


def _record(model: nn.Module, names: dict[str, list[str]], ids: torch.Tensor) -> dict[str, Tensor]:
    """The output of each watched module in one forward of ``ids``, in call order."""
    seen: dict[str, Tensor] = {}
    hooks = []
    for name, m in model.named_modules():
        if name not in names:
            continue

        def hook(module, args, out, name=name):
            t = out[0] if isinstance(out, tuple) else out
            if isinstance(t, Tensor) and t.is_floating_point() and name not in seen:
                seen[name] = t.detach().clone()

        hooks.append(m.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(ids[:, :-1])
    finally:
        for h in hooks:
            h.remove()
    return seen


def _train_and_measure(
    cfg: ModelConfig, base: ModelConfig, *, mup: bool, seed: int, steps: int, lr: float,
    batch: int, seq_len: int,
) -> tuple[dict[str, tuple[float, float]], dict[str, list[str]]]:  # fmt: skip
    """Per watched module: (mean |h_t|, mean |h_t - h_0|) after ``steps`` steps, and its weights."""
    from attnlab.model.transformer import build_model

    torch.manual_seed(seed)
    model = build_model(cfg)
    gen = torch.Generator().manual_seed(1234 + seed)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), generator=gen)
    if mup:
        plan = apply_mup(model, cfg, base)
        opt = torch.optim.AdamW(mup_param_groups(model, plan, 0.0), lr=lr)
        set_lr(opt, lr)
    else:
        opt = torch.optim.AdamW(model.param_groups(0.0), lr=lr)
    names = _watched(model)
    model.train()
    before = _record(model, names, ids)
    for _ in range(steps):
        loss = model(ids[:, :-1], ids[:, 1:]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    after = _record(model, names, ids)
    sizes = {
        n: (float(h.abs().mean()), float((h - before[n]).abs().mean()))
        for n, h in after.items()
        if n in before and before[n].shape == h.shape
    }
    return sizes, names


def _unfused(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with the Q, K, V parts run one by one (the same values), so each is observed."""
    return cfg.model_copy(
        update={"attention": cfg.attention.model_copy(update={"fuse_qkv": False})}
    )


def _exponents(widths: Sequence[int], table: dict[str, np.ndarray]) -> dict[str, float]:
    """Least-squares slope of log value against log width (rows with a zero left out)."""
    lw = np.log(np.asarray(widths, dtype=np.float64))
    return {n: float(np.polyfit(lw, np.log(v), 1)[0]) for n, v in table.items() if np.all(v > 0)}


def coordinate_check(
    make_config: Callable[[int], ModelConfig],
    widths: Sequence[int] = (32, 64, 128),
    *,
    mup: bool = True,
    steps: int = 3,
    lr: float = 3e-3,
    seeds: int = 2,
    batch: int = 4,
    seq_len: int = 16,
    threshold: float = THRESHOLD,
) -> CoordCheck:
    """Train ``steps`` Adam steps at each width (µP relative to the smallest, or the standard
    parametrisation with ``mup=False``) and measure how every activation grows with width."""
    widths = sorted(widths)
    if len(widths) < 3:
        raise ValueError("a coordinate check needs at least 3 widths to fit a growth exponent")
    base = _unfused(make_config(widths[0]))
    size: dict[str, np.ndarray] = {}
    update: dict[str, np.ndarray] = {}
    order: list[str] = []
    weights: dict[str, list[str]] = {}
    for i, w in enumerate(widths):
        for seed in range(seeds):
            measured, names = _train_and_measure(
                _unfused(make_config(w)), base, mup=mup, seed=seed, steps=steps, lr=lr,
                batch=batch, seq_len=seq_len,
            )  # fmt: skip
            for name, (h, dh) in measured.items():
                size.setdefault(name, np.zeros(len(widths)))[i] += h / seeds
                update.setdefault(name, np.zeros(len(widths)))[i] += dh / seeds
            if i == 0 and seed == 0:
                order, weights = list(measured), names
    return CoordCheck(
        widths=list(widths),
        steps=steps,
        scales={n: v.tolist() for n, v in size.items()},
        updates={n: v.tolist() for n, v in update.items()},
        slopes=_exponents(widths, size),
        update_slopes=_exponents(widths, update),
        weights=weights,
        threshold=threshold,
        mup=mup,
        order=order,
    )
