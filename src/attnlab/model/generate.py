"""Autoregressive sampling with the KV cache.

With the cache each new token costs one forward over a single position (O(T) attention against the
cached keys) instead of a forward over the whole prefix (O(T^2)); greedy decoding gives the same
tokens either way (a test checks it for every decoder variant).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.base.errors import InvalidRequestError, NonFiniteError
from attnlab.model.linear import decode_layout


def _pick(
    logits: Tensor, temperature: float, top_k: int | None, gen: torch.Generator | None
) -> Tensor:
    if temperature <= 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=gen)


def generate(
    model: nn.Module,
    input_ids: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    use_cache: bool = True,
    eos_id: int | None = None,
    encoder_input_ids: Tensor | None = None,
    generator: torch.Generator | None = None,
    rows_layout: bool | None = None,
) -> Tensor:
    """Continue ``input_ids`` [B, T] by up to ``max_new_tokens``; temperature 0 is greedy.

    Returns [B, T + n] (an ordinary tensor: the work runs under ``torch.inference_mode``).
    Stops early when every row has produced ``eos_id``. ``rows_layout`` multiplies few-row inputs
    by weight copies split by columns, one block per thread (``model/linear.py``; default: on
    CPU, where a one-row product otherwise runs on one thread); it holds one extra copy of the
    weights for the duration of the call.
    """
    p = next(model.parameters())
    if rows_layout is None:
        rows_layout = p.device.type == "cpu"
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), decode_layout(model, rows_layout):
            ids = _generate(
                model,
                input_ids,
                max_new_tokens,
                temperature=temperature,
                top_k=top_k,
                use_cache=use_cache,
                eos_id=eos_id,
                encoder_input_ids=encoder_input_ids,
                generator=generator,
            )
    finally:
        model.train(was_training)
    return ids.clone()  # outside inference mode: usable as an ordinary tensor


def _generate(
    model: nn.Module,
    input_ids: Tensor,
    max_new_tokens: int,
    *,
    temperature: float,
    top_k: int | None,
    use_cache: bool,
    eos_id: int | None,
    encoder_input_ids: Tensor | None,
    generator: torch.Generator | None,
) -> Tensor:
    cfg = model.cfg
    ids = input_ids
    memory = model.encode(encoder_input_ids) if encoder_input_ids is not None else None
    a = cfg.attention
    if a.mask == "prefix" and ids.shape[1] < a.prefix_len:
        raise InvalidRequestError(
            f"prefix-LM: the prompt ({ids.shape[1]} tokens) must cover "
            f"model.attention.prefix_len={a.prefix_len}; generated tokens are never in the prefix"
        )
    limit = model.position_limit  # read when the model was built
    if limit is not None and ids.shape[1] + max_new_tokens > limit:
        raise InvalidRequestError(
            f"prompt ({ids.shape[1]}) + max_new_tokens ({max_new_tokens}) exceeds "
            f"model.max_seq_len={limit} of {cfg.position_limit_noun} "
            f"(model.position.kind={cfg.position.kind!r})"
        )
    cache = None
    if use_cache and model.supports_cache:
        p = next(model.parameters())
        cache = model.new_cache(ids.shape[0], ids.shape[1] + max_new_tokens, p.device, p.dtype)
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    finite = torch.ones((), dtype=torch.bool, device=ids.device)  # read once, after the loop
    step_in = ids
    for _ in range(max_new_tokens):
        if cache is not None:
            out = model(step_in, cache=cache, memory=memory, last_logits_only=True)
        else:
            out = model(ids, memory=memory, last_logits_only=True)
        logits = out.logits[:, -1, :]
        finite &= torch.isfinite(logits).all()
        nxt = _pick(logits, temperature, top_k, generator)
        if eos_id is not None:
            nxt = torch.where(done[:, None], torch.full_like(nxt, eos_id), nxt)
            done |= nxt[:, 0] == eos_id
        ids = torch.cat([ids, nxt], dim=1)
        step_in = nxt
        if eos_id is not None and bool(done.all()):
            break
    if not bool(finite):
        raise NonFiniteError(
            "the model's next-token scores held NaN or inf, so the tokens are meaningless; its "
            "weights or activations overflow. Use an earlier checkpoint, or retrain with a lower "
            "train.lr"
        )
    return ids
