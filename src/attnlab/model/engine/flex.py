"""The FlexAttention path: the mask as a block mask (built once per shape and cached), the mods
and the normaliser's score rewrite composed into one ``score_mod``, one fused kernel.

Compiled (``torch.compile(flex_attention)``, compiled once per process and shape; inductor
caches the kernels on disk across runs) it runs forward and backward fused on CUDA, and forward
on CPU (a C++ template; the first compile takes minutes on a loaded CPU). Eager (``compile =
False``) it is torch's unfused reference: the whole score matrix, forward only on CPU, which is
what the tests compare against. Positions are shifted by ``q_offset`` here, so a mask or mod
always sees absolute positions.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

from attnlab.model.engine.compile_cost import timed_first_call, use_inductor_cache
from attnlab.model.engine.contracts import Mask, ScoreMod
from attnlab.model.engine.grouped import Call

#: flex's block (its default); also the unit of the cached block masks
FLEX_BLOCK = 128
_compiled: dict[str, object] = {}


def flex_kernel(compiled: bool):
    """``flex_attention``, compiled once per process when asked."""
    if not compiled:
        return flex_attention
    if "fn" not in _compiled:
        use_inductor_cache()  # kernels built once survive the process
        _compiled["fn"] = torch.compile(flex_attention, dynamic=False)
    return _compiled["fn"]


class BlockMaskCache:
    """The last few block masks, keyed by (mask token, batch, shape, offset, device)."""

    def __init__(self, size: int = 8) -> None:
        self.size, self.entries = size, OrderedDict()

    def get(self, mask: Mask, B: int, H: int, q_len: int, kv_len: int, q_offset: int, device):
        key = (mask.token(), B if mask.uses_batch else None, q_len, kv_len, q_offset, str(device))
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key]

        def shifted(b, h, q_idx, kv_idx):
            return mask.mask_mod(b, h, q_idx + q_offset, kv_idx)

        batch = B if mask.uses_batch else None
        bm = create_block_mask(shifted, batch, None, q_len, kv_len, device=device)
        self.entries[key] = bm
        if len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return bm


def composed_mod(mods: tuple[ScoreMod, ...], extra, q_offset: int):
    """One flex ``score_mod``: each mod in order, then the normaliser's rewrite (None: none)."""
    fns = [m.score_mod for m in mods] + ([extra] if extra is not None else [])
    if not fns:
        return None

    def score_mod(score, b, h, q_idx, kv_idx):
        q = q_idx + q_offset
        for fn in fns:
            score = fn(score, b, h, q, kv_idx)
        return score

    return score_mod


def flex_attend(
    q: Tensor, k: Tensor, v: Tensor, call: Call, compiled: bool, cache: BlockMaskCache
) -> Tensor:
    """out [B, H, Tq, d_v] through flex_attention (the normaliser must have a flex form)."""
    form = call.normaliser.flex()
    if not torch.is_grad_enabled():  # flex refuses CPU inputs that merely require grad
        q, k, v = q.detach(), k.detach(), v.detach()
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    mask = call.mask
    dense = mask.dense(Tq, Tk, call.q_offset) == "full" and not mask.uses_batch
    block = None if dense else cache.get(mask, B, H, Tq, Tk, call.q_offset, q.device)
    kw = dict(
        score_mod=composed_mod(call.mods, form.score_mod, call.q_offset),
        block_mask=block,
        scale=call.scale,
        enable_gqa=k.shape[1] != H,
    )
    fn = flex_kernel(compiled)
    shape = (
        compiled,
        tuple(q.shape),
        tuple(k.shape),
        q.dtype,
        str(q.device),
        torch.is_grad_enabled(),
    )
    if form.finish is None:
        return timed_first_call(shape, lambda: fn(q, k, v, **kw))
    out, aux = timed_first_call(shape, lambda: fn(q, k, v, return_aux=AuxRequest(lse=True), **kw))
    return form.finish(out, aux.lse)
