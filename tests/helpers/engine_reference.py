"""The float64 naive attention the engine's paths are proven against, and random cases.

The reference is written from the definitions alone, on the dense [B, H, Tq, Tk] grid: logits
scale q . k, the mods applied in order, the mask (and key padding), then the normaliser's formula
written out here (not the engine's ``weights``), then weights @ v; a query with no allowed key
gets 0. Nothing in it is shared with the engine's paths but the mods' and masks' own functions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.model.engine import (
    ALiBi,
    AttentionSpec,
    BigBird,
    Causal,
    Document,
    Full,
    HeadScale,
    LocalGlobal,
    Prefix,
    Sigmoid,
    Sliding,
    SoftCap,
    Softmax,
    SoftmaxPlusOne,
    T5Bias,
)


def reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    spec: AttentionSpec,
    scale: float,
    q_offset: int = 0,
    kv_valid: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(out [B, H, Tq, d_v], weights [B, H, Tq, Tk]) by the definition."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    G = H // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    b = torch.arange(B)[:, None, None, None]
    h = torch.arange(H)[None, :, None, None]
    i = (q_offset + torch.arange(Tq))[None, None, :, None]
    j = torch.arange(Tk)[None, None, None, :]
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    for mod in spec.mods:
        s = mod.score_mod(s, b, h, i, j)
    mask = spec.mask.fit(q_offset + Tq, Tk, q.device)
    allowed = mask.mask_mod(b, h, i, j).expand(B, H, Tq, Tk)
    if kv_valid is not None:
        allowed = allowed & kv_valid[b, j]
    w = _weights(spec.normaliser, s, allowed)
    return w @ v, w


def _weights(normaliser, s: Tensor, allowed: Tensor) -> Tensor:
    s = torch.where(allowed, s, 0.0)  # masked logits never reach exp (no inf * 0 in gradients)
    if isinstance(normaliser, Softmax):
        top = torch.where(allowed, s, -1e300).amax(-1, keepdim=True).clamp_min(-1e300)
        top = torch.where(allowed.any(-1, keepdim=True), top, 0.0).detach()
        e = torch.where(allowed, torch.exp(s - top), 0.0)
        return e / e.sum(-1, keepdim=True).clamp_min(1e-300)
    if isinstance(normaliser, SoftmaxPlusOne):
        e = torch.where(allowed, torch.exp(s), 0.0)
        return e / (1.0 + e.sum(-1, keepdim=True))
    if isinstance(normaliser, Sigmoid):
        return torch.where(allowed, 1.0 / (1.0 + torch.exp(-(s + normaliser.bias))), 0.0)
    return torch.where(allowed, normaliser.weights(s, allowed), 0.0)  # a plugin's own


def masks(T: int, B: int, causal: bool, gen: random.Random):
    """One of each mask over positions below T (random parameters)."""
    docs = torch.tensor(sorted(gen.randrange(4) for _ in range(T)))
    docs = torch.stack([docs, torch.tensor(sorted(gen.randrange(3) for _ in range(T)))])
    w = gen.randint(1, max(1, T // 3))
    out = [
        Causal() if causal else Full(),
        Prefix(gen.randint(1, T)),
        Sliding(w, causal),
        LocalGlobal(w, gen.randint(0, 3), gen.choice([0, 5, 7]) or 4, causal),
        BigBird(
            w,
            gen.randint(0, 2),
            gen.choice([0, 9]),
            gen.choice([2, 4]),
            2,
            gen.randrange(99),
            causal,
        ),
        Document(docs[:B], causal),
    ]
    return out if causal else [m for m in out if not isinstance(m, Prefix)]


def mod_sets(H: int, causal: bool):
    """The mods alone and composed (learned gains initialised away from 1)."""
    t5 = T5Bias(H, buckets=8, max_distance=16, bidirectional=not causal).double()
    torch.nn.init.normal_(t5.table.weight)
    gain = HeadScale(H, 1.0).double()
    with torch.no_grad():
        gain.gain.uniform_(0.5, 1.5)
    return [
        (),
        (gain,),
        (ALiBi(H, causal),),
        (t5,),
        (SoftCap(2.0),),
        (ALiBi(H, causal), gain, t5),
    ]


NORMALISERS = [Softmax(), SoftmaxPlusOne(), Sigmoid(-1.5)]


@dataclass
class Case:
    """One random attention call."""

    B: int
    H: int
    Hkv: int
    Tq: int
    Tk: int
    d: int
    q_offset: int
    causal: bool
    padded: bool
    block: int

    def tensors(self, seed: int, grad: bool = True):
        g = torch.Generator().manual_seed(seed)

        def t(*shape):
            return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(grad)

        q = t(self.B, self.H, self.Tq, self.d)
        k, v = t(self.B, self.Hkv, self.Tk, self.d), t(self.B, self.Hkv, self.Tk, self.d)
        valid = None
        if self.padded:
            lens = torch.randint(max(1, self.Tk // 2), self.Tk + 1, (self.B,), generator=g)
            valid = torch.arange(self.Tk)[None] < lens[:, None]
        return q, k, v, valid


def random_case(seed: int) -> Case:
    """Random shapes: GQA or not, self or cross lengths, an offset (cached decoding), padding."""
    gen = random.Random(seed)
    Hkv = gen.choice([1, 2])
    H = Hkv * gen.choice([1, 2])
    Tk = gen.randint(3, 40)
    kind = gen.choice(["self", "decode", "chunk", "cross"])
    Tq = {"self": Tk, "decode": 1, "chunk": gen.randint(1, Tk), "cross": gen.randint(1, 40)}[kind]
    q_offset = {"self": 0, "decode": Tk - 1, "chunk": Tk - Tq, "cross": 0}[kind]
    causal = kind != "cross" and gen.random() < 0.8
    return Case(
        B=gen.choice([1, 2]),
        H=H,
        Hkv=Hkv,
        Tq=Tq,
        Tk=Tk,
        d=gen.choice([4, 8]),
        q_offset=q_offset,
        causal=causal,
        padded=gen.random() < 0.3,
        block=gen.choice([2, 4, 8, 16]),
    )
