"""One fused-attention call whose query/key and value widths differ.

torch's fused CPU kernel (and FlashAttention on CUDA) takes q, k and v of one head width; given
different widths, ``scaled_dot_product_attention`` silently falls back to its unfused math path,
which forms the [B, H, Tq, Tk] matrix. So the narrower side is zero-padded to the wider width:
zero q/k columns add nothing to the scores, zero value columns give zero outputs, which are cut
off. Cost: the padded columns' FLOPs (e.g. P V at the QK^T width for full mixing), O(T) memory.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from attnlab.parts import ScoreContext


def attend(core, q: Tensor, k: Tensor, v: Tensor, ctx: ScoreContext) -> Tensor:
    """``core.sdpa(q, k, v, ctx)`` for any widths: [B, H, Tq, d_v]."""
    dqk, dv = q.shape[-1], v.shape[-1]
    if dqk == dv:
        return core.sdpa(q, k, v, ctx)
    if dqk < dv:
        pad = (0, dv - dqk)
        return core.sdpa(F.pad(q, pad), F.pad(k, pad), v, ctx)
    return core.sdpa(q, k, F.pad(v, (0, dqk - dv)), ctx)[..., :dv]


def width(dqk: int, dv: int) -> int:
    """The head width the kernel runs at."""
    return max(dqk, dv)
