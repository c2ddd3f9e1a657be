"""The attention layer's heads split over the ranks of a ``tp`` mesh (Megatron-LM's head split).

Rank r of P owns heads [r H/P, (r+1) H/P) and KV heads [r H_kv/P, (r+1) H_kv/P): its query,
key and value parts return those heads (``colwise`` W_Q, W_K, W_V), attention runs on them
alone, and the mixer's ``rowwise`` W_O sums the P partial outputs (one all-reduce per layer).
A part that cannot be split (``Part.tp_plan`` replicated) still runs, whole:

- a whole projection returns every head and the rank keeps its own (``local``: a slice forward,
  an all-gather of the gradient backward, so the whole part's weights get the full gradient);
- a whole score part is given every head (``gather``: an all-gather forward, a slice of the
  gradient backward) and its H' output heads are sliced again when P divides H';
- a whole readout or mixer is given every head or column.

A weight applied to the rank's heads alone (qk-norm's gains) goes through ``shared``: the
identity forward, a sum of the ranks' gradients backward, so it gets the gradient of all heads.
Each of these is one DTensor redistribution (all-gather or all-reduce: gloo on CPU, NCCL on
GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from attnlab.parts import ScoreContext


@dataclass
class HeadSplit:
    """How one attention layer runs on a ``tp`` mesh of ``size`` ranks; the ``*_whole`` flags
    name its replicated parts (decided by ``attnlab.model.tensor_parallel``)."""

    mesh: DeviceMesh
    size: int
    q_whole: bool = False
    k_whole: bool = False
    v_whole: bool = False
    score_whole: bool = False
    #: the score slot's output heads are the rank's own (False: all H', when P does not divide
    #: H' after a whole score part)
    heads_local: bool = True
    readout_whole: bool = False
    mixer_whole: bool = False

    # ---------------------------------------------------------------------------- collectives
    def local(self, t: Tensor, dim: int) -> Tensor:
        """The rank's 1/P slice of ``t`` (the same on every rank) along ``dim``."""
        d = DTensor.from_local(t, self.mesh, [Replicate()], run_check=False)
        return d.redistribute(self.mesh, [Shard(dim)]).to_local()

    def gather(self, t: Tensor, dim: int) -> Tensor:
        """Every rank's slice of ``t`` along ``dim``, concatenated in rank order."""
        return DTensor.from_local(t, self.mesh, [Shard(dim)], run_check=False).full_tensor()

    def shared(self, w: Tensor) -> Tensor:
        """``w`` (the same on every rank), its gradient summed over the ranks."""
        d = DTensor.from_local(w, self.mesh, [Replicate()], run_check=False)
        return d.to_local(grad_placements=[Partial()])

    # ------------------------------------------------------------------------ the layer's steps
    def query(self, q: Tensor) -> Tensor:
        """q [B, T, width], cut to the rank's heads when the query part is whole."""
        return self.local(q, 2) if self.q_whole else q

    def keys_values(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v [B, T, width], each cut to the rank's KV heads when its part is whole."""
        return (self.local(k, 2) if self.k_whole else k), (self.local(v, 2) if self.v_whole else v)

    def norm(self, norm: nn.Module, x: Tensor) -> Tensor:
        """qk-norm (an RMSNorm over d_h) on the rank's heads, its gains' gradient summed."""
        return F.rms_norm(x, norm.weight.shape, self.shared(norm.weight), norm.eps)

    def score(self, attn: nn.Module, q: Tensor, k: Tensor, v: Tensor, ctx: ScoreContext):
        """(heads, probs) of the score slot from the rank's q [B, H/P, ..], k, v [B, H_kv/P,
        ..]; probs (when asked for) cover every head."""
        score = attn.score
        if getattr(attn, "declared", False) and not attn.cross:  # the engine runs the layer
            if not ctx.mods:  # masks and normalisers read no head index: the rank's heads
                heads, probs = attn.core(q, k, v, ctx)
                return heads, None if probs is None else self.gather(probs, 1)
            # score mods index heads by their global number (ALiBi's slopes, T5's buckets):
            # every head on every rank, then the rank's own
            q, k, v = self.gather(q, 1), self.gather(k, 1), self.gather(v, 1)
            heads, probs = attn.core(q, k, v, ctx)
            return (self.local(heads, 1) if self.heads_local else heads), probs
        if score is None or not self.score_whole:
            if ctx.bias is not None:  # ALiBi, T5: [H, Tq, Tk] -> the rank's heads
                ctx = replace(ctx, bias=self.local(ctx.bias, ctx.bias.dim() - 3))
            heads, probs = score(q, k, v, attn.core, ctx) if score else attn.core(q, k, v, ctx)
            return heads, None if probs is None else self.gather(probs, 1)
        q, k, v = self.gather(q, 1), self.gather(k, 1), self.gather(v, 1)
        heads, probs = score(q, k, v, attn.core, ctx)
        return (self.local(heads, 1) if self.heads_local else heads), probs

    def mix(self, attn: nn.Module, u: Tensor, heads: Tensor) -> Tensor:
        """The readout and mixer: [B, H'(/P), T, d_h] -> [B, T, d] (whole on every rank)."""
        local = self.heads_local
        if self.readout_whole and local:
            heads, local = self.gather(heads, 1), False
        o = attn.readout(u, heads)
        if self.mixer_whole and local:
            o = self.gather(o, 2)
        return attn.mixer(o)
