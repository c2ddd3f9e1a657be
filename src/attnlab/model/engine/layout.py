"""Which keys each query block gathers: a mask's block structure as stacks of equal-sized groups.

The queries of a call are cut into blocks of ``block`` rows, the keys into blocks of ``block``
columns. A [query block, key block] map (the mask's ``block_map`` hint, or ``mask_mod``
evaluated one block row at a time) says which key blocks a query block may see; a query block
gathers those key blocks (plus the mask's ``global_keys`` one by one), and query blocks that
gather as many keys are stacked into one :class:`Stack`, so that one kernel call (SDPA, or the
explicit path) runs them all, each with its own small mask. Counts within 3/4 of a stack's
largest share it, the missing slots padded and marked unreal. Rows of ``global_queries`` are
computed last over every key and overwrite what their block computed. A stack holds at most
``MAX_PAIRS`` query-key pairs (larger ones are cut into consecutive pieces).

Work: sum over stacks of n * rows * keys pairs, O(T (w + G)) for a window w and G global keys,
against T^2 (or T^2 / 2 causal) for the dense matrix; memory of a stack's mask or bias the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.model.engine.contracts import Mask

#: a query block shares a stack with larger ones down to this fraction of their keys
SHARE = 0.75
#: the most query-key pairs one stack holds (its mask, bias or weights live for one call)
MAX_PAIRS = 1 << 22


@dataclass
class Stack:
    """n groups of equal shape: ``q_idx`` [n, Q] query rows of the call, ``kv_idx`` [n, K] key
    columns, ``kv_real`` [n, K] False at a padding slot (a repeated block, a key past the end,
    a global key the group already holds)."""

    q_idx: Tensor
    kv_idx: Tensor
    kv_real: Tensor

    @property
    def pairs(self) -> int:
        return self.q_idx.numel() * self.kv_idx.shape[1]


@dataclass
class Layout:
    """The stacks of one call (later stacks overwrite the rows of earlier ones)."""

    stacks: list[Stack]
    block: int

    @property
    def pairs(self) -> int:
        return sum(s.pairs for s in self.stacks)


def dense_layout(q_len: int, kv_len: int, device) -> Layout:
    """One group: every query over every key."""
    q = torch.arange(q_len, device=device)[None]
    kv = torch.arange(kv_len, device=device)[None]
    return Layout([Stack(q, kv, torch.ones_like(kv, dtype=torch.bool))], max(q_len, kv_len))


def build_layout(
    mask: Mask, q_len: int, kv_len: int, q_offset: int, block: int, batch: int, heads: int, device
) -> Layout:
    """The stacks covering every allowed pair of ``mask`` (already fitted) at this shape."""
    q_start = torch.arange(0, q_len, block, device=device)
    kv_start = torch.arange(0, kv_len, block, device=device)
    q_lo = q_offset + q_start
    q_hi = q_offset + (q_start + block).clamp_max(q_len) - 1
    kv_lo, kv_hi = kv_start, (kv_start + block).clamp_max(kv_len) - 1
    bmap = mask.block_map(q_lo, q_hi, kv_lo, kv_hi)
    if bmap is None:
        bmap = evaluate_block_map(mask, q_lo, q_hi, kv_len, block, batch, heads)
    gk = mask.global_keys(kv_len, device)
    stacks = []
    has_gk = gk is not None and gk.numel() > 0
    for rows, width in _buckets(bmap, q_start, q_len, block, keep_empty=has_gk):
        st = _stack(bmap, rows, width, q_start, q_len, kv_len, block, gk)
        stacks.extend(_pieces(st))
    gq = mask.global_queries(q_offset, q_len, device)
    if gq is not None and gq.numel():
        kv = torch.arange(kv_len, device=device)[None]
        stacks.append(Stack((gq - q_offset)[None], kv, torch.ones_like(kv, dtype=torch.bool)))
    return Layout(stacks, block)


def _pieces(st: Stack) -> list[Stack]:
    """``st`` cut into consecutive groups of at most ``MAX_PAIRS`` pairs each (at least one
    group per piece), so no stack's float mask or weights grow with the whole sequence."""
    per = max(1, MAX_PAIRS // max(1, st.q_idx.shape[1] * st.kv_idx.shape[1]))
    n = st.q_idx.shape[0]
    if n <= per:
        return [st]
    return [
        Stack(st.q_idx[a : a + per], st.kv_idx[a : a + per], st.kv_real[a : a + per])
        for a in range(0, n, per)
    ]


def evaluate_block_map(
    mask: Mask, q_lo: Tensor, q_hi: Tensor, kv_len: int, block: int, batch: int, heads: int
) -> Tensor:
    """[nQ, nK] bool from ``mask_mod`` itself, one query block (all rows and heads) at a time."""
    device = q_lo.device
    n_kv = -(-kv_len // block)
    kv = torch.arange(n_kv * block, device=device)
    b = torch.arange(batch, device=device).view(batch, 1, 1, 1)
    h = torch.arange(heads, device=device).view(1, heads, 1, 1)
    rows = []
    for lo, hi in zip(q_lo.tolist(), q_hi.tolist()):
        q = torch.arange(lo, hi + 1, device=device).view(1, 1, -1, 1)
        ok = mask.mask_mod(b, h, q, kv.clamp_max(kv_len - 1).view(1, 1, 1, -1))
        ok = ok & (kv < kv_len).view(1, 1, 1, -1)
        rows.append(ok.reshape(-1, n_kv, block).any(-1).any(0))
    return torch.stack(rows)


def _buckets(bmap: Tensor, q_start: Tensor, q_len: int, block: int, keep_empty: bool):
    """(query block numbers, key blocks per group) for each stack: groups with the same number
    of rows, the largest count first, smaller counts down to ``SHARE`` of it joining. A query
    block with no key block is left out (its rows see nothing: 0) unless there are global keys
    (``keep_empty``)."""
    counts = bmap.sum(1)
    rows_of = (q_start + block).clamp_max(q_len) - q_start
    for rows in torch.unique(rows_of).tolist():
        same = (rows_of == rows).nonzero().flatten()
        left = same if keep_empty else same[counts[same] > 0]
        while left.numel():
            width = int(counts[left].max())
            take = counts[left] >= int(SHARE * width + 0.999)
            yield left[take], width
            left = left[~take]


def _stack(
    bmap: Tensor,
    qblocks: Tensor,
    width: int,
    q_start: Tensor,
    q_len: int,
    kv_len: int,
    block: int,
    gk: Tensor | None,
) -> Stack:
    """The gather indices of one stack: each group's key blocks, padded to ``width`` blocks by
    repeating its last (unreal), then the global keys its blocks do not hold."""
    device = bmap.device
    sel = bmap[qblocks]  # [n, nK]
    n, n_kv = sel.shape
    ids = torch.where(sel, torch.arange(n_kv, device=device), n_kv).sort(dim=1).values
    ids = ids[:, :width]  # each group's blocks in order, then the sentinel n_kv
    real_block = ids < n_kv
    last = ids.gather(1, (sel.sum(1, keepdim=True) - 1).clamp_min(0)) if width else ids
    blocks = torch.where(real_block, ids, last)
    offs = torch.arange(block, device=device)
    kv = (blocks[:, :, None] * block + offs).reshape(n, -1)
    real = (real_block[:, :, None] & (kv.view(n, width, block) < kv_len)).reshape(n, -1)
    kv = kv.clamp_max(kv_len - 1)
    if gk is not None and gk.numel():
        held = sel[:, gk // block]  # the global key's block is already gathered
        kv = torch.cat([kv, gk[None].expand(n, -1)], 1)
        real = torch.cat([real, ~held], 1)
    rows = int((q_start[qblocks[0]] + block).clamp_max(q_len) - q_start[qblocks[0]])
    q = q_start[qblocks][:, None] + torch.arange(rows, device=device)
    return Stack(q, kv, real)
