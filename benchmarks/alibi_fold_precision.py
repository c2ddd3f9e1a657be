"""How exact is causal ALiBi folded into two extra q/k columns, in float32, as T grows?

    python benchmarks/alibi_fold_precision.py [--lengths 1024,8192] [--rows 256]

The fold writes m_h (j - i) as [m_h, -m_h (i - c)] . [j - c, 1] (the second, row-constant
column dropped under softmax), so a logit carries the product m_h (j - c): up to m_max * T / 2
with one centre for the whole call, which float32 rounds at about 2^-24 of it. Against a float64
reference (the dense definition, rows in chunks) this prints the largest output error of:

- ``dense bias``: today's path, SDPA with the float32 [H, T, T] bias (rows in chunks here);
- ``fold, c = 0`` and ``fold, c = T/2``: one SDPA call with the columns (engine path a);
- ``fold per block``: the engine's block-sparse path, each query block centred on its first row.

B = 1, H = 8 (slopes 2^-1 .. 2^-8), d_h = 32, q and k standard normal; the error is measured on
the last ``rows`` query rows (where i - c is largest) and the first ``rows``.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F


def reference_rows(q, k, v, slopes, rows, scale):
    """float64 output of ``rows`` (the causal ALiBi definition, dense per row chunk)."""
    q, k, v = q.double(), k.double(), v.double()
    out = []
    for chunk in rows.split(128):
        s = (q[:, :, chunk] @ k.transpose(-1, -2)) * scale
        j = torch.arange(k.shape[2])
        s = s + slopes.double()[:, None, None] * (j[None, None, :] - chunk[None, :, None])
        s = s.masked_fill(j[None, None, :] > chunk[None, :, None], float("-inf"))
        out.append(torch.softmax(s, -1) @ v)
    return torch.cat(out, 2)


def dense_bias_rows(q, k, v, slopes, rows, scale):
    """Today's path: SDPA with a float32 bias -m |i - j| (and -inf above the diagonal)."""
    out = []
    for chunk in rows.split(128):
        j = torch.arange(k.shape[2])
        dist = (chunk[:, None] - j[None, :]).abs().float()
        bias = -slopes[:, None, None] * dist[None]
        bias = bias.masked_fill(j[None, None, :] > chunk[None, :, None], float("-inf"))
        out.append(
            F.scaled_dot_product_attention(q[:, :, chunk], k, v, attn_mask=bias[None], scale=scale)
        )
    return torch.cat(out, 2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="1024,8192")
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from attnlab.model.engine import ALiBi, AttentionEngine, AttentionSpec, Causal, EngineOptions
    from attnlab.model.engine.engine import dense_sdpa
    from attnlab.model.engine.folds import fold
    from attnlab.model.engine.grouped import Call
    from attnlab.model.engine.normalisers import Softmax

    H, d = 8, 32
    scale = 1 / math.sqrt(d)
    print(
        f"{'T':>6} {'rows':>10} {'dense bias':>11} {'fold c=0':>11} {'fold c=T/2':>11} {'per block':>11}"
    )
    for T in [int(t) for t in args.lengths.split(",")]:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, H, T, d, generator=g) for _ in range(3))
        mod = ALiBi(H)
        rows = {"last": torch.arange(T - args.rows, T), "first": torch.arange(args.rows)}
        call = Call(Causal(), (mod,), fold((mod,)), Softmax(), scale, 0, 0.0, math.inf)
        outs = {"c0": dense_sdpa(q, k, v, "causal", call, 0)}
        outs["mid"] = dense_sdpa(q, k, v, "causal", call, T // 2)
        sparse = AttentionEngine(
            AttentionSpec(Causal(), (mod,)), EngineOptions(path="block_sparse")
        )
        outs["block"], _ = sparse(q, k, v, scale=scale)
        for name, r in rows.items():
            ref = reference_rows(q, k, v, mod.slopes, r, scale)
            errs = [(dense_bias_rows(q, k, v, mod.slopes, r, scale).double() - ref).abs().max()]
            errs += [
                (outs[key][:, :, r].double() - ref).abs().max() for key in ("c0", "mid", "block")
            ]
            print(f"{T:6d} {name:>10} " + " ".join(f"{float(e):11.2e}" for e in errs), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
