"""One fused-attention call whose query/key and value widths differ.

torch's fused CPU kernel (and FlashAttention on CUDA) takes q, k and v of one head width; given
different widths, ``scaled_dot_product_attention`` silently falls back to its unfused math path,
which forms the [B, H, Tq, Tk] matrix. So the narrower side is zero-padded to the wider width:
zero q/k columns add nothing to the scores, zero value columns give zero outputs, which are cut
off. Cost: the padded columns' FLOPs (e.g. P V at the QK^T width for full mixing), O(T) memory.

On CPU with ``attention.backend = "auto"``, when padding would more than double the narrower
side (mixed heads: width G * d_h against d_h), the call runs in query chunks on the math path
instead (``chunked``): no padded FLOPs, memory bounded per chunk.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from attnlab.model.virtual_fused.chunked import chunked_attention
from attnlab.parts import ScoreContext


def attend(
    core, q: Tensor, k: Tensor, v: Tensor, ctx: ScoreContext, scale: float | None = None
) -> Tensor:
    """``core.sdpa(q, k, v, ctx, scale)`` for any widths: [B, H, Tq, d_v]."""
    dqk, dv = q.shape[-1], v.shape[-1]
    if dqk == dv:
        return core.sdpa(q, k, v, ctx, scale)
    if q.device.type == "cpu" and core.backend == "auto" and max(dqk, dv) > 2 * min(dqk, dv):
        drop = core.dropout if core.training else 0.0
        return chunked_attention(q, k, v, ctx, core.scale if scale is None else scale, drop)
    if dqk < dv:
        pad = (0, dv - dqk)
        return core.sdpa(F.pad(q, pad), F.pad(k, pad), v, ctx, scale)
    return core.sdpa(q, k, F.pad(v, (0, dqk - dv)), ctx, scale)[..., :dv]


def width(dqk: int, dv: int) -> int:
    """The head width the kernel runs at."""
    return max(dqk, dv)
