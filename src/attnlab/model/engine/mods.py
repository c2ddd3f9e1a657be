"""Built-in score modifications, each with the exact fold it declares (``contracts.ScoreMod``).

- ``HeadScale``: s' = g_h s, a per-head temperature (fixed or learned). Fold: q_h * g_h, free.
- ``ALiBi`` (Press et al. 2022): s' = s - m_h |i - j|, slopes m_h = 2^(-8h/H). Causal: s + m_h
  (j - i), a rank-2 bias, folded as extra q/k columns ``[m_h, -m_h (i - c)] . [j - c, 1]``
  (c a centre per group; the second column is row-constant and dropped under softmax), padded
  with v to a multiple of 8 so SDPA keeps its fused kernel. Bidirectional: a float bias.
- ``T5Bias`` (Raffel et al. 2020): s' = s + table[bucket(j - i), h] (``model/positions.py``'s
  buckets, a learned table): a float bias over the gathered pairs; causal, it is one value per
  head beyond ``max_distance`` keys (``band``), so only that band needs it (``band.py``).
- ``SoftCap`` (Gemma 2): s' = c tanh(s / c): general, no fold (flex or the explicit path).

Each costs O(1) per logit where it runs per entry; the folds cost r extra columns of q k^T.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.model.engine.contracts import ScoreMod, Term
from attnlab.model.positions import T5RelativeBias, alibi_slopes


class HeadScale(nn.Module, ScoreMod):
    """s' = g_h s; ``learned``: g is a parameter [H] (initialised to ``init``)."""

    kind = "scale"

    def __init__(self, n_heads: int, init: float = 1.0, learned: bool = True) -> None:
        super().__init__()
        g = torch.full((n_heads,), float(init))
        if learned:
            self.gain = nn.Parameter(g)
        else:
            self.register_buffer("gain", g, persistent=False)

    def head_scale(self) -> Tensor:
        return self.gain

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score * self.gain.to(score.dtype)[h]


class ALiBi(ScoreMod):
    """s' = s - m_h |i - j| (``causal``: s + m_h (j - i), the same on every allowed pair)."""

    kind = "bias"

    def __init__(self, n_heads: int, causal: bool = True) -> None:
        self.n_heads, self.causal = n_heads, causal
        self.slopes = alibi_slopes(n_heads)  # float32, as model/positions.py's ALiBi

    def __repr__(self) -> str:
        return f"ALiBi(n_heads={self.n_heads}, causal={self.causal})"

    def score_mod(self, score, b, h, q_idx, kv_idx):
        m = self.slopes.to(device=score.device, dtype=score.dtype)[h]
        d = kv_idx - q_idx
        return score + m * (d if self.causal else -d.abs())

    def separable(self, h: Tensor, q_idx: Tensor, kv_idx: Tensor, centre: Tensor):
        """[n, H, 1, 1] . (j - c) and the row-constant -m_h (i - c) . 1 (causal only).

        Magnitude that matters: m (j - c) = m (j - i) + m (i - c); a key at distance D weighs
        at most exp(-m D) of the row, so its product's rounding, m D exp(-m D) < 1/e of a unit,
        sums to O(1) units over a row: the fold rounds like m_max max|i - c| + 1."""
        if not self.causal:
            return None
        m = self.slopes.to(h.device)[h].double()
        c = centre[:, None]
        i, j = (q_idx - c).double(), (kv_idx - c).double()
        near = float(m.abs().max() * i.abs().max())
        return [
            Term(m[None, :, None, None], j[..., None], magnitude=near + 1.0),
            Term(
                -m[None, :, None, None] * i[:, None, :, None],
                torch.ones_like(j)[..., None],
                row_constant=True,
                magnitude=near,
            ),
        ]


class T5Bias(nn.Module, ScoreMod):
    """s' = s + table[bucket(j - i), h] (learned; ``bidirectional`` splits the buckets)."""

    kind = "bias"

    def __init__(
        self,
        n_heads: int,
        buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = False,
        table: nn.Embedding | None = None,
    ) -> None:
        super().__init__()
        self.buckets, self.max_distance, self.bidirectional = buckets, max_distance, bidirectional
        self.table = table if table is not None else nn.Embedding(buckets, n_heads)

    bucket = T5RelativeBias.bucket

    def band(self) -> int | None:
        """Causal: every distance >= max_distance falls in the last bucket (one value per
        head), so only the band of ``max_distance`` keys needs the table."""
        if self.bidirectional or self.max_distance <= self.buckets // 2:
            return None
        return self.max_distance

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score + self.table.weight.to(score.dtype)[self.bucket(kv_idx - q_idx), h]

    def bias(self, b, h, q_idx, kv_idx):
        """The same values through a table per offset: the buckets of the O(T) offsets a call
        spans are computed once, then one gather per pair (not the bucket arithmetic)."""
        rel = kv_idx - q_idx
        lo, hi = int(rel.min()), int(rel.max())
        offsets = torch.arange(lo, hi + 1, device=rel.device)
        per_offset = self.table.weight[self.bucket(offsets)].t()  # [H, offsets]
        return per_offset[h, rel - lo]


class SoftCap(ScoreMod):
    """s' = c tanh(s / c): |s'| < c (no fold: it is not affine in s)."""

    def __init__(self, cap: float) -> None:
        self.cap = float(cap)

    def __repr__(self) -> str:
        return f"SoftCap(cap={self.cap})"

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return self.cap * torch.tanh(score / self.cap)


class TableBias(ScoreMod):
    """s' = s + table[h, i - q_offset, j]: a bias given as a dense [H, Tq, Tk] table (a position
    part that declares only ``bias(q_pos, k_pos)``, e.g. a KERPLE-like plugin). Exact on every
    path; O(H Tq Tk) memory for the table itself, as before the engine."""

    kind = "bias"

    def __init__(self, table: Tensor, q_offset: int = 0) -> None:
        self.table, self.q_offset = table, int(q_offset)

    def __repr__(self) -> str:
        return f"TableBias(shape={tuple(self.table.shape)})"

    def bias(self, b, h, q_idx, kv_idx):
        return self.table[h, q_idx - self.q_offset, kv_idx]

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score + self.table.to(score.dtype)[h, q_idx - self.q_offset, kv_idx]
