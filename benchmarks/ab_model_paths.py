"""A/B timings of proposed speed changes to attnlab's model code, without editing it.

Each case patches one function of ``attnlab.model`` in this process only (current vs proposed),
checks that both give the same numbers, and times them interleaved (A B A B ..., warmup excluded,
median of per-round ratios). The proposals are written up as diffs in the benchmark report; this
script is the evidence and lets the change be re-measured after it lands. All three landed in
commit 2569f06, so on later code "current" already is the proposal and the ratios read ~1.0 (a
regression check: a ratio well below 1 means the slow form came back).

    python benchmarks/ab_model_paths.py [--threads 1] [--rounds 7] [--cases a,b,c]

Cases:
- ``preproj_gated``: ``PreProjection.forward`` computes ``act(W_up x)`` and then, when gated,
  overwrites it: one wasted d x e*d matmul and activation per layer (forward and backward).
- ``explicit_scale``: the explicit attention path multiplies the [B, H, T, T] logits by the
  softmax scale; scaling q ([B, H, T, d_h]) before the matmul saves a pass over the O(T^2 H)
  tensor in the forward and one in the backward (and ``~allowed`` is built once, not 3-4 times).
- ``decode_layout``: batch-1 decoding with nn.Linear's [out, in] weights vs W^T split by columns
  into one block per thread (``model/linear.py``, landed with this case; run with --threads 2).
- ``linear_cross_entropy``: a training step with the full logits + ``F.cross_entropy`` vs the
  chunked LM head + cross-entropy (``model/linear_cross_entropy.py``, landed with this case).
- ``last_logits``: decoding without the cache (and the prefill of cached decoding) computes the
  LM head for every position although only the last one is read: 2 d V FLOPs per prefix token
  per step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

TARGET = (
    "model.d_model=256",
    "model.n_layers=6",
    "model.attention.n_heads=8",
    "model.vocab_size=4096",
    "model.max_seq_len=512",
    "data.seq_len=256",
)


# ------------------------------------------------------------------------------- proposed code
def preproj_forward_proposed(self, x_hat: Tensor) -> Tensor:
    if self.w_gate is not None:
        h = self.act(self.w_gate(x_hat)) * self.w_up(x_hat)
    else:
        h = self.act(self.w_up(x_hat))
    return x_hat + self.w_down(h)


def explicit_proposed(self, q, k, v, allowed, is_causal, bias, drop):
    Tq, Tk = q.shape[2], k.shape[2]
    if allowed is None:
        allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device)
        if is_causal:
            allowed = allowed.tril(Tk - Tq)
    if q.shape[1] != k.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = (q * self.scale) @ k.transpose(-2, -1)  # scale the [.., T, d_h] side, not T x T
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    t = self.score_transform
    blocked = ~allowed
    neg = torch.finfo(scores.dtype).min
    if t is not None and t.on == "logits":
        scores = t(scores.masked_fill(blocked, 0.0), allowed)
    probs = torch.softmax(scores.masked_fill(blocked, neg), dim=-1)
    if t is not None and t.on == "probs":
        probs = t(probs, allowed).masked_fill(blocked, 0.0)
        probs = probs / probs.sum(-1, keepdim=True).clamp_min(1e-9)
    probs = probs.masked_fill(blocked, 0.0)  # kept: a row with no allowed key must give zeros
    if drop:
        probs = F.dropout(probs, drop)
    if probs.shape[1] != v.shape[1]:
        v = v.repeat_interleave(probs.shape[1] // v.shape[1], dim=1)
    return probs @ v, probs


class LastPositionHead(nn.Module):
    """The LM head applied to the last position only (what generate reads)."""

    def __init__(self, head: nn.Linear) -> None:
        super().__init__()
        self.head = head

    def forward(self, h: Tensor) -> Tensor:
        return self.head(h[:, -1:, :])


# ------------------------------------------------------------------------------------ harness
def ab(name: str, a: Callable[[], object], b: Callable[[], object], rounds: int) -> dict:
    for fn in (a, b, a, b):
        fn()
    ta, tb = [], []
    for _ in range(rounds):
        for fn, acc in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    ratio = statistics.median(y / x for x, y in zip(ta, tb))
    row = {
        "case": name,
        "current_ms": 1e3 * statistics.median(ta),
        "proposed_ms": 1e3 * statistics.median(tb),
        "proposed/current": ratio,
    }
    print(
        f"{name:<34} current {row['current_ms']:9.2f} ms  proposed {row['proposed_ms']:9.2f} ms"
        f"  ratio {ratio:.3f}",
        flush=True,
    )
    return row


def _train_step(model: nn.Module, x: Tensor) -> Callable[[], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x, x).total_loss.backward()
        opt.step()

    return step


def case_preproj_gated(rounds: int, batch: int) -> dict:
    from attnlab.config import load_config
    from attnlab.model import build_model
    from attnlab.model.pre_projection import PreProjection

    cfg = load_config("tiny", [*TARGET, "model.feature_map.kind=pre_projection",
                               "model.pre_projection.gated=true"])  # fmt: skip
    torch.manual_seed(0)
    model = build_model(cfg.model)
    x = torch.randint(0, cfg.model.vocab_size, (batch, cfg.data.seq_len))
    current = PreProjection.forward
    with torch.no_grad():
        ref = model(x).logits
        PreProjection.forward = preproj_forward_proposed
        new = model(x).logits
        PreProjection.forward = current
    torch.testing.assert_close(new, ref)
    step = _train_step(model, x)

    def a() -> None:
        PreProjection.forward = current
        step()

    def b() -> None:
        PreProjection.forward = preproj_forward_proposed
        step()

    try:
        return ab("preproj_gated (train step)", a, b, rounds)
    finally:
        PreProjection.forward = current


def case_explicit_scale(rounds: int, batch: int) -> list[dict]:
    from attnlab.config import load_config
    from attnlab.model import build_model
    from attnlab.model.attention import AttentionCore

    rows = []
    current = AttentionCore._explicit
    for label, extra in (
        ("explicit path", "model.attention.backend=math"),
        ("virtual heads", "model.score.kind=virtual_heads"),
    ):
        cfg = load_config("tiny", [*TARGET, extra])
        torch.manual_seed(0)
        model = build_model(cfg.model)
        x = torch.randint(0, cfg.model.vocab_size, (batch, cfg.data.seq_len))
        with torch.no_grad():
            ref = model(x).logits
            AttentionCore._explicit = explicit_proposed
            new = model(x).logits
            AttentionCore._explicit = current
        torch.testing.assert_close(new, ref, atol=1e-5, rtol=1e-5)
        step = _train_step(model, x)

        def a(step=step) -> None:
            AttentionCore._explicit = current
            step()

        def b(step=step) -> None:
            AttentionCore._explicit = explicit_proposed
            step()

        try:
            rows.append(ab(f"explicit_scale, {label} (train step)", a, b, rounds))
        finally:
            AttentionCore._explicit = current
    return rows


def case_last_logits(rounds: int, batch: int) -> list[dict]:
    from attnlab.config import load_config
    from attnlab.model import build_model, generate

    cfg = load_config("tiny", list(TARGET))
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    full, last = model.lm_head, LastPositionHead(model.lm_head)
    prompt = torch.randint(0, cfg.model.vocab_size, (1, 16))
    new = 128
    ref = generate(model, prompt, new, temperature=0.0, use_cache=False)
    model.lm_head = last
    got = generate(model, prompt, new, temperature=0.0, use_cache=False)
    model.lm_head = full
    assert torch.equal(ref, got)

    def run(head: nn.Module, cache: bool) -> Callable[[], None]:
        def fn() -> None:
            model.lm_head = head
            generate(model, prompt, new, temperature=0.0, use_cache=cache)
            model.lm_head = full

        return fn

    x = torch.randint(0, cfg.model.vocab_size, (batch, cfg.data.seq_len))

    def prefill(head: nn.Module) -> Callable[[], None]:
        def fn() -> None:
            model.lm_head = head
            with torch.no_grad():
                model(x)
            model.lm_head = full

        return fn

    return [
        ab(f"last_logits, decode {new} no cache", run(full, False), run(last, False), rounds),
        ab(f"last_logits, decode {new} KV cache", run(full, True), run(last, True), rounds),
        ab("last_logits, prefill B x 256", prefill(full), prefill(last), rounds),
    ]


def case_decode_layout(rounds: int, batch: int) -> list[dict]:
    """generate() with nn.Linear's [out, in] weights (rows_layout=False) vs the split-column
    layout of model/linear.py (the default on CPU). Recomputation has > 32 rows per matmul from
    its 17th step on, so it should read ~1.0: the layout speeds up the cached path only."""
    from attnlab.config import load_config
    from attnlab.model import build_model, generate

    cfg = load_config("tiny", list(TARGET))
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    prompt = torch.randint(0, cfg.model.vocab_size, (1, 16))
    new = 256

    def run(layout: bool, cache: bool) -> Callable[[], None]:
        return lambda: generate(
            model, prompt, new, temperature=0.0, use_cache=cache, rows_layout=layout
        )

    for cache in (True, False):
        assert torch.equal(run(False, cache)(), run(True, cache)())
    return [
        ab(f"decode_layout, decode {new} KV cache", run(False, True), run(True, True), rounds),
        ab(f"decode_layout, decode {new} no cache", run(False, False), run(True, False), rounds),
    ]


def case_linear_cross_entropy(rounds: int, batch: int) -> list[dict]:
    """One training step (forward, backward, AdamW) with the LM head + cross-entropy on the full
    [B, T, V] logits (``return_logits=True``, nanoGPT's way) vs chunked (``model/
    linear_cross_entropy.py``, what the trainer and ``attnlab bench`` use)."""
    from attnlab.config import load_config
    from attnlab.model import build_model

    cfg = load_config("tiny", list(TARGET))
    torch.manual_seed(0)
    model = build_model(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, cfg.model.vocab_size, (batch, cfg.data.seq_len + 1))
    inp, tgt = x[:, :-1], x[:, 1:]
    a_loss = model(inp, tgt).loss
    b_loss = model(inp, tgt, return_logits=False).loss
    torch.testing.assert_close(a_loss, b_loss, rtol=1e-5, atol=1e-5)

    def step(return_logits: bool) -> Callable[[], None]:
        def fn() -> None:
            model(inp, tgt, return_logits=return_logits).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return fn

    return [ab("linear_cross_entropy, train step", step(True), step(False), rounds)]


CASES = {
    "preproj_gated": case_preproj_gated,
    "explicit_scale": case_explicit_scale,
    "last_logits": case_last_logits,
    "decode_layout": case_decode_layout,
    "linear_cross_entropy": case_linear_cross_entropy,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--cases", default=",".join(CASES))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import os

    print(f"torch {torch.__version__}, {args.threads} threads, load {os.getloadavg()}")
    for name in args.cases.split(","):
        CASES[name](args.rounds, args.batch)
    print(f"load at end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
