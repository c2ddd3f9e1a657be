"""What ``attnlab inspect`` reads from one model on one prompt, through the parts' declarations.

One forward pass of the prompt (no [B, H, T, T] map is formed by it: fused parts stay fused),
with every part recording (``Part.record``) and a hook on every self-attention layer's score part
(or, without one, its attention core) that keeps that call's q, k, v and mask. Afterwards, layer
by layer, the maps of the shown query rows are computed in row blocks through the model's own
code: ``AttentionCore.explicit`` for the raw maps and the score part's
``attention_rows`` for its maps (e.g. the virtual heads' convolved ones). So memory is
O(T * d) for the kept q, k, v plus O(rows * T * H) per block, never O(T^2 * H).

A prompt longer than ``max_tokens`` shows its last ``max_tokens`` query rows over the same
key positions; each shown row's attention on earlier keys is summed into one "earlier" number,
and the page says how many cells it summarised. A pretrained Hugging Face model (a probe's base,
an ``hf:`` target) has no attnlab attention layers: its maps come from transformers'
``output_attentions`` (which form the full maps; the page says so), and the injected parts still
show their own statistics.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.parts import families

#: cells of one row block (rows x keys x heads) computed at a time
BLOCK_CELLS = 1 << 20
TOP_K = 5


@dataclass
class LayerView:
    """One self-attention call: ``maps`` name -> [H, R, K] probabilities of the shown rows over
    the shown keys, ``earlier`` name -> [H, R] mass on keys before the shown ones."""

    name: str
    maps: dict[str, np.ndarray] = field(default_factory=dict)
    earlier: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class PartView:
    """One part's own quantities: ``tokens`` key -> [R, n] per shown token, ``summary`` key ->
    [n] (forward statistics), ``numbers`` (layer statistics)."""

    name: str  # module path, e.g. "decoder.blocks.0.attn.readout"
    kind: str  # slot/kind, e.g. "readout/identity_head"
    tokens: dict[str, np.ndarray] = field(default_factory=dict)
    summary: dict[str, np.ndarray] = field(default_factory=dict)
    numbers: dict[str, float] = field(default_factory=dict)
    docs: dict[str, tuple[str, list[str] | None]] = field(default_factory=dict)


@dataclass
class Capture:
    """Everything the page shows of one model on one prompt."""

    name: str
    target: str
    kind: str  # "attnlab" or "hugging face"
    ids: list[int]
    tokens: list[str]  # label of every shown position
    start: int  # first shown position
    n_tokens: int  # the whole prompt's length (after any cut to the model's context)
    loss: list[float | None]  # per shown position: -log p(the token it predicts) (NaN for a NaN
    # model), None if it predicts none
    top: list[list[tuple[str, float]]]  # per shown position: top predictions (token, prob)
    predicts: str  # what a position's loss/top refer to ("next token" or "this token")
    mask: np.ndarray | None  # [R, K] bool, the mask of the first self-attention call
    mask_name: str
    layers: list[LayerView]
    parts: list[PartView]
    notes: list[str] = field(default_factory=list)
    family: str = families.DEFAULT


def _is_attention(m: nn.Module) -> bool:
    """An attnlab attention layer (also the copy inside an exported folder): duck-typed."""
    return hasattr(m, "core") and hasattr(m, "score") and hasattr(m, "readout")


def _is_part(m: nn.Module) -> bool:
    return bool(getattr(type(m), "slot", "")) and callable(getattr(m, "token_stats", None))


@dataclass
class _Call:
    name: str
    q: Tensor
    k: Tensor
    v: Tensor
    ctx: Any
    core: nn.Module
    part: nn.Module | None


class _Recorder:
    """Forward hooks keeping each self-attention call's q, k, v and ScoreContext."""

    def __init__(self, model: nn.Module) -> None:
        self.calls: list[_Call] = []
        self.handles = []
        for name, m in model.named_modules():
            if not _is_attention(m) or getattr(m, "cross", False):
                continue
            target = m.score if m.score is not None else m.core
            self.handles.append(target.register_forward_hook(self._hook(name, m)))

    def _hook(self, name: str, attn: nn.Module):
        def hook(module, args, output):
            if attn.score is not None:
                q, k, v, core, ctx = args[:5]
                part = attn.score
            else:
                q, k, v, ctx = args[:4]
                core, part = attn.core, None
            n = sum(c.name.startswith(name) for c in self.calls)
            label = name if n == 0 else f"{name} (loop {n + 1})"
            if n == 1:  # a looped layer: name its first call too
                first = next(c for c in self.calls if c.name == name)
                first.name = f"{name} (loop 1)"
            self.calls.append(_Call(label, q.detach(), k.detach(), v.detach(), ctx, core, part))

        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _allowed_rows(ctx: Any, rows: Tensor, n_keys: int, n_queries: int) -> Tensor:
    """[R, Tk] bool: the call's own mask for ``rows`` (the model's mask function built it)."""
    if ctx.allowed is not None:
        return ctx.allowed[rows]
    keys = torch.arange(n_keys, device=rows.device)
    if ctx.is_causal:
        return keys[None, :] <= rows[:, None] + (n_keys - n_queries)
    return torch.ones(len(rows), n_keys, dtype=torch.bool, device=rows.device)


@torch.no_grad()
def _layer_maps(call: _Call, start: int) -> tuple[dict[str, np.ndarray], dict, np.ndarray]:
    """Maps of rows ``start..T-1`` over keys ``start..T-1``, in blocks of rows."""
    q, k, v, ctx = call.q[:1], call.k[:1], call.v[:1], call.ctx
    Tq, Tk = q.shape[2], k.shape[2]
    heads = max(q.shape[1], 1)
    step = max(1, BLOCK_CELLS // max(Tk * heads * 2, 1))
    out: dict[str, list[np.ndarray]] = {}
    earlier: dict[str, list[np.ndarray]] = {}
    masks = []
    for r0 in range(start, Tq, step):
        rows = torch.arange(r0, min(Tq, r0 + step), device=q.device)
        allowed = _allowed_rows(ctx, rows, Tk, Tq)
        bias = None if ctx.bias is None else ctx.bias[..., rows, :]
        sub = dataclasses.replace(
            ctx, allowed=allowed, is_causal=False, bias=bias, need_weights=True, padding=None
        )
        qr = q[:, :, rows]
        _, raw = call.core.explicit(qr, k, v, sub)
        got = {"attention": raw}
        if call.part is not None:
            got[f"after {call.part.kind}"] = call.part.attention_rows(qr, k, v, call.core, sub)
        for key, p in got.items():
            p = p[0].float()
            out.setdefault(key, []).append(p[:, :, start:].cpu().numpy())
            earlier.setdefault(key, []).append(p[:, :, :start].sum(-1).cpu().numpy())
        masks.append(allowed[:, start:].cpu().numpy())
    maps = {key: np.concatenate(v, axis=1) for key, v in out.items()}
    before = {key: np.concatenate(v, axis=1) for key, v in earlier.items()}
    return maps, before, np.concatenate(masks, axis=0)


def _token_label(decode, i: int) -> str:
    try:
        text = decode([i])
    except Exception:
        return f"<{i}>"
    return text.replace(" ", "\u2423").replace("\n", "\u23ce").replace("\t", "\u21e5")


def _parts(model: nn.Module, start: int, n: int) -> list[PartView]:
    views = []
    for name, m in model.named_modules():
        if not _is_part(m):
            continue
        cls = type(m)
        view = PartView(name=name, kind=f"{cls.slot}/{cls.kind}")
        docs: dict[str, tuple[str, list[str] | None]] = {}
        for key, value in m.token_stats().items():
            arr = value.detach().float().reshape(value.shape[0], -1).cpu().numpy()
            if arr.shape[0] == n:
                view.tokens[key] = arr[start:]
        docs.update(cls.token_stats_doc())
        for key, value in m.forward_stats().items():
            view.summary[key] = value.detach().float().reshape(-1).cpu().numpy()
        for key, (sentence, labels) in cls.forward_stats_doc().items():
            docs.setdefault(key, (sentence, labels))
        for key, value in m.layer_stats().items():
            view.numbers[key] = float(value)
        for key, sentence in cls.layer_stats_doc(m.opts, m.dims.d_model).items():
            docs.setdefault(key, (sentence, None))
        view.docs = docs
        if view.tokens or view.summary or view.numbers:
            views.append(view)
    return views


def _set_recording(model: nn.Module, on: bool) -> None:
    for m in model.modules():
        if _is_part(m):
            m.record(on)


@torch.no_grad()
def capture(
    model: nn.Module,
    ids: list[int],
    decode,
    *,
    name: str,
    target: str,
    family: str = families.DEFAULT,
    max_tokens: int = 128,
    mask_name: str = "",
) -> Capture:
    """Run ``model`` (an attnlab Transformer, an exported or a Hugging Face causal LM) on
    ``ids`` and read the maps of the last ``max_tokens`` positions and every part's views."""
    model.eval()
    T = len(ids)
    start = max(0, T - max_tokens)
    x = torch.tensor([ids], dtype=torch.long, device=_device(model))
    attnlab_layers = any(_is_attention(m) for m in model.modules())
    notes: list[str] = []
    recorder = _Recorder(model) if attnlab_layers else None
    _set_recording(model, True)
    try:
        if attnlab_layers:
            out = model(x, **families.get(family).alone_inputs(x))
        else:
            out = _hf_forward(model, x)
        parts = _parts(model, start, T)
    finally:
        _set_recording(model, False)
        if recorder is not None:
            recorder.close()
    logits = out.logits if hasattr(out, "logits") else out
    layers: list[LayerView] = []
    mask = None
    if recorder is not None:
        for call in recorder.calls:
            maps, earlier, allowed = _layer_maps(call, start)
            layers.append(LayerView(call.name, maps, earlier))
            mask = allowed if mask is None else mask
            call.q = call.k = call.v = None  # type: ignore[assignment]
    else:
        for i, a in enumerate(getattr(out, "attentions", None) or ()):
            p = a[0].float()
            layers.append(
                LayerView(
                    f"layer {i}",
                    {"attention": p[:, start:, start:].cpu().numpy()},
                    {"attention": p[:, start:, :start].sum(-1).cpu().numpy()},
                )
            )
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        mask = causal[start:, start:].numpy()
        mask_name = mask_name or "causal"
        notes.append(
            "maps of a Hugging Face model come from transformers' output_attentions, which forms "
            "the full [H, T, T] maps"
        )
    causal = families.get(family).causal_lm
    predicts = "next token" if causal else "this token"
    loss, top = _predictions(logits[0], ids, start, decode, next_token=causal)
    if start:
        notes.append(
            f"the prompt has {T} tokens; shown: the last {T - start} positions (queries "
            f"{start}..{T - 1} over keys {start}..{T - 1}). Each shown row's attention on the "
            f"{start} earlier keys is summed into its 'earlier' value: "
            f"{_summarised(layers, T - start, start):,} cells summarised, not drawn"
        )
    return Capture(
        name=name,
        target=target,
        kind="attnlab" if attnlab_layers else "hugging face",
        ids=list(ids),
        tokens=[_token_label(decode, i) for i in ids[start:]],
        start=start,
        n_tokens=T,
        loss=loss,
        top=top,
        predicts=predicts,
        mask=mask,
        mask_name=mask_name,
        layers=layers,
        parts=parts,
        notes=notes,
        family=family,
    )


def _hf_forward(model: nn.Module, x: Tensor):
    """A transformers model with ``output_attentions``: its fused attention (sdpa, flash) returns
    no maps, so it runs with the eager implementation for this one call."""
    before = getattr(getattr(model, "config", None), "_attn_implementation", None)
    switch = callable(getattr(model, "set_attn_implementation", None)) and before != "eager"
    if switch:
        model.set_attn_implementation("eager")
    try:
        return model(input_ids=x, output_attentions=True)
    finally:
        if switch and before:
            model.set_attn_implementation(before)


def _summarised(layers: list[LayerView], rows: int, start: int) -> int:
    return sum(m.shape[0] * rows * start for lv in layers for m in lv.maps.values())


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _predictions(
    logits: Tensor, ids: list[int], start: int, decode, *, next_token: bool
) -> tuple[list[float | None], list[list[tuple[str, float]]]]:
    """Per shown position: the loss of the token it predicts, and its top predictions."""
    loss: list[float | None] = []
    top: list[list[tuple[str, float]]] = []
    T = len(ids)
    for t in range(start, T):
        logp = torch.log_softmax(logits[t].float(), dim=-1)
        want = ids[t + 1] if next_token and t + 1 < T else (ids[t] if not next_token else None)
        value = None if want is None else float(-logp[want])
        loss.append(value)  # NaN or inf too: the page shows them (None: nothing predicted)
        p, i = logp.exp().topk(min(TOP_K, logp.shape[-1]))
        top.append([(_token_label(decode, int(j)), float(x)) for x, j in zip(p, i, strict=True)])
    return loss, top
