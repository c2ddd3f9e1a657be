"""Score mods as SDPA inputs: per-head gains on q, exact bias columns on q and k, float biases.

Mods that declare ``kind = "scale"`` or ``"bias"`` compose into an affine form of the plain
logit s = scale q . k::

    s' = g_h s + sum_t c_{t,h} bias_t(b, h, i, j)

where g is the product of every gain and c_{t,h} the product of the gains after bias t. So
``g`` multiplies q per head (free), a separable bias becomes r extra columns of q and k (q's
side times c / scale: SDPA's own dot product then adds it; cost r more columns of q k^T, the
head dim padded with v's to a multiple of 8 so the CPU and CUDA kernels stay fused) and any
other bias a float mask over the gathered pairs. A ``"general"`` mod stops the fold: the
caller runs flex or the explicit path.

Precision: the columns carry positions, so their products grow with the distance from the
group's centre c; in float32 a logit carries about |product| * 2^-24 of rounding. A term is
folded only when that estimate is within ``tol`` (and never in bfloat16/float16, whose 8 or
11 bits would round positions above 256 or 2048); otherwise it is added as a float bias,
which is exact up to the bias's own rounding. ``docs/attention-engine.md`` has the measured
errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnlab.model.engine.contracts import ScoreMod

#: where columns are folded
COLUMN_DTYPES = (torch.float32, torch.float64)


@dataclass
class Folded:
    """The mods as gain, column mods and bias mods (each with its head multiplier or None)."""

    gain: Tensor | None = None
    columns: list[tuple[ScoreMod, Tensor | None]] = field(default_factory=list)
    biases: list[tuple[ScoreMod, Tensor | None]] = field(default_factory=list)
    general: list[ScoreMod] = field(default_factory=list)

    @property
    def trivial(self) -> bool:
        return self.gain is None and not self.columns and not self.biases and not self.general


def fold(mods: tuple[ScoreMod, ...]) -> Folded:
    """Compose ``mods`` in order into one affine form (``general`` lists the mods with none)."""
    out = Folded()
    for mod in mods:
        kind = getattr(mod, "kind", "general")
        if kind == "scale":
            g = mod.head_scale()
            out.gain = g if out.gain is None else out.gain * g
            out.columns = [(m, g if c is None else c * g) for m, c in out.columns]
            out.biases = [(m, g if c is None else c * g) for m, c in out.biases]
        elif kind == "bias" and _separable(mod):
            out.columns.append((mod, None))
        elif kind == "bias":
            out.biases.append((mod, None))
        else:
            out.general.append(mod)
    return out


def _separable(mod: ScoreMod) -> bool:
    """Whether ``mod.separable`` gives columns (asked once on a one-position group)."""
    one = torch.zeros(1, 1, dtype=torch.long)
    return mod.separable(torch.zeros(1, dtype=torch.long), one, one, one[0]) is not None


@dataclass
class Columns:
    """Extra q columns [n, H, Q, R] (already divided by the scale) and k columns [n, K, R]."""

    q: Tensor
    k: Tensor


def columns(
    folded: Folded,
    heads: int,
    q_pos: Tensor,
    kv_pos: Tensor,
    centre: Tensor,
    scale: float,
    drop_row_constant: bool,
    dtype: torch.dtype,
    tol: float,
) -> tuple[Columns | None, list[tuple[ScoreMod, Tensor | None]]]:
    """The columns of ``folded.columns`` over n groups (``q_pos`` [n, Q], ``kv_pos`` [n, K]
    absolute positions, ``centre`` [n]), and the column mods refused for precision (to be
    added as float biases)."""
    if not folded.columns:
        return None, []
    h = torch.arange(heads, device=q_pos.device)
    qs, ks, refused = [], [], []
    for mod, mult in folded.columns:
        terms = [
            t
            for t in mod.separable(h, q_pos, kv_pos, centre)
            if not (t.row_constant and drop_row_constant)
        ]
        size = sum(
            float(t.q_cols.abs().amax() * t.k_cols.abs().amax())
            if t.magnitude is None
            else t.magnitude
            for t in terms
        )
        if mult is not None:
            size *= float(mult.detach().abs().amax())
        if dtype not in COLUMN_DTYPES or size * torch.finfo(dtype).eps / 2 > tol:
            refused.append((mod, mult))
            continue
        for t in terms:
            qc = t.q_cols.to(dtype) / scale
            if mult is not None:
                qc = qc * mult.to(dtype)[None, :, None, None]
            qs.append(qc.expand(q_pos.shape[0], heads, q_pos.shape[1], qc.shape[-1]))
            ks.append(t.k_cols.to(dtype).expand(kv_pos.shape[0], kv_pos.shape[1], -1))
    if not qs:
        return None, refused
    return Columns(torch.cat(qs, -1), torch.cat(ks, -1)), refused


def pad_to(width: int, multiple: int = 8) -> int:
    """The smallest multiple of ``multiple`` >= ``width`` (SDPA's fused kernels want equal,
    8-aligned head dims for q, k and v)."""
    return -(-width // multiple) * multiple
