"""Rotary positions (RoPE, Su et al. 2021) with the long-context rescalings.

q and k of each head are rotated on their first ``rot = fraction * d_h`` dims (GPT-NeoX/Pythia
rotate 25%; rotate-half layout as in GPT-NeoX and Llama):
x' = x cos(t w) + rotate_half(x) sin(t w), w_i = base^(-2i/rot), so <R_s q, R_t k> depends on
t - s only. No params; O(T rot) elementwise work per head, no matmul FLOPs; the cache stores the
rotated keys (same shape as unrotated ones). No table: any position can be rotated, but angles
beyond the trained ones are out of distribution, which the rescalings address (each can be set at
evaluation time on a run trained without it, ``--set model.position.scaling=yarn`` with
``factor`` = target length / ``original_length``):

- ``linear``, position interpolation (Chen et al. 2023): t -> t / factor, every angle stays in
  the trained range;
- ``ntk``, NTK-aware base scaling (bloc97 2023): base -> base * factor^(rot / (rot - 2)), which
  stretches low frequencies and keeps the highest ones;
- ``yarn`` (Peng et al. 2023, "NTK-by-parts" + attention temperature): interpolate (w / factor)
  the dims that turn fewer than ``beta_slow`` times in the original context, keep (w) those that
  turn more than ``beta_fast`` times, with a linear ramp over the dim indices between (the bounds
  rounded outwards, floor/ceil); and scale the logits by (0.1 ln(factor) + 1)^2 (cos and sin each
  by the factor). This is the YaRN reference code's and transformers' ``_compute_yarn_parameters``
  (``truncate=True``) formula, equal to it to float32 rounding (tested).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from attnlab.model.positions import Rotary
from attnlab.parts import Dims, PartOptions, PositionPart, register


@register("position", "rope")
class RotaryPosition(PositionPart):
    """Rotate q and k by angles proportional to their absolute positions."""

    rotary = True
    cost = "params 0; FLOPs 0 (elementwise rotation of q, k); cache 0 (keys cached rotated)"

    class Options(PartOptions):
        fraction: float = Field(1.0, gt=0, le=1, description="share of each head's dims rotated")
        base: float = Field(10000.0, gt=1, description="wavelength base")
        scaling: Literal["none", "linear", "ntk", "yarn"] = Field(
            "none", description="long-context rescaling: position interpolation, NTK, YaRN"
        )
        factor: float = Field(1.0, ge=1, description="scaling: target length / original_length")
        original_length: int | None = Field(
            None, ge=2, description="yarn: the trained context (None = model.max_seq_len)"
        )
        beta_fast: float = Field(32.0, gt=0, description="yarn: rotations above which w is kept")
        beta_slow: float = Field(1.0, gt=0, description="yarn: rotations below which w / factor")

        def check(self, model) -> list[str]:
            rot = int(model.head_dim * self.fraction)
            if rot < 2 or rot % 2:
                return [
                    f"model.position.fraction={self.fraction} gives {rot} rotary dims of "
                    f"head_dim={model.head_dim}; it must be an even number >= 2"
                ]
            if self.scaling == "yarn" and self.beta_slow >= self.beta_fast:
                return ["model.position.beta_slow must be below model.position.beta_fast"]
            return []

    @classmethod
    def param_count(cls, opts: Options, dims: Dims) -> int:
        return 0

    def __init__(self, opts: Options, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.rot, self.base = int(dims.head_dim * opts.fraction), opts.base
        model = dims.model
        self.original = opts.original_length or (model.max_seq_len if model is not None else 0)

    def inv_freq(self, device: torch.device) -> tuple[Tensor, float]:
        """(w [rot/2] in float32, the cos/sin multiplier) after the configured rescaling."""
        o, s = self.opts, self.opts.factor
        idx = torch.arange(0, self.rot, 2, dtype=torch.float32, device=device)
        base = self.base
        if o.scaling == "ntk":
            base = base * s ** (self.rot / (self.rot - 2))
        inv = base ** (-idx / self.rot)
        if o.scaling == "linear":
            return inv / s, 1.0
        if o.scaling != "yarn" or s == 1.0:
            return inv, 1.0

        # the dim (pair index, fractional) that turns r times over the original context L:
        # d(r) = rot ln(L / (2 pi r)) / (2 ln base); the ramp runs linearly over pair indices from
        # floor(d(beta_fast)) (kept) to ceil(d(beta_slow)) (w / factor), as in transformers'
        # _compute_yarn_parameters with truncate=True (the YaRN reference code)
        def dim_at(turns: float) -> float:
            return self.rot * math.log(self.original / (turns * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(dim_at(o.beta_fast)), 0)
        high = min(math.ceil(dim_at(o.beta_slow)), self.rot - 1)
        if low == high:
            high += 0.001  # a one-index ramp: avoid dividing by zero, as the reference does
        interp = ((idx / 2 - low) / (high - low)).clamp(0, 1)
        keep = 1 - interp
        return inv / s * (1 - keep) + inv * keep, 0.1 * math.log(s) + 1.0

    def rotation(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos/sin tables [T, rot] in ``dtype``, computed in float32 (never from rounded
        buffers)."""
        inv, mscale = self.inv_freq(positions.device)
        ang = positions.float()[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], dim=-1)
        cos, sin = ang.cos(), ang.sin()
        if mscale != 1.0:
            cos, sin = cos * mscale, sin * mscale
        return cos.to(dtype), sin.to(dtype)

    def rotate(self, x: Tensor, tables: tuple[Tensor, Tensor]) -> Tensor:
        """x [B, h, T, d_h] rotated on its first ``rot`` dims."""
        return Rotary.apply(self, x, *tables)
