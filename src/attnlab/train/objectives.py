"""Training objectives per model family: causal LM, masked LM (BERT), span corruption (T5).

Every objective turns a batch of ``n`` token windows ``x`` (and their next-token shift ``y``) into
model inputs and targets; ignored target positions are -100. The corruption of the masked and span
objectives is drawn from a NumPy generator seeded by ``(seed, step, index)``, so a resumed run, and a
run split over ranks or micro-batches, corrupts every sequence exactly as an uninterrupted run does.

Extra token ids live above the tokenizer's vocabulary ``V``: the mask id is ``V`` and the span
sentinels are ``V + 1, V + 2, ...``; ``model.vocab_size`` must leave room for them
(:func:`extra_ids`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from attnlab.base.errors import UserError
from attnlab.config import ModelConfig, TrainConfig

Objective = Literal["causal_lm", "masked_lm", "span_corruption"]

FAMILY_OBJECTIVE: dict[str, Objective] = {
    "decoder": "causal_lm",
    "encoder": "masked_lm",
    "encoder_decoder": "span_corruption",
    "retrieval": "causal_lm",
}
MEAN_SPAN_LENGTH = 3.0  # T5's default mean noise-span length


def resolve_objective(model: ModelConfig, train: TrainConfig) -> Objective:
    """The objective for ``model.family``; ``train.objective='auto'`` picks the family's own."""
    natural = FAMILY_OBJECTIVE[model.family]
    if train.objective in ("auto", natural):
        return natural
    raise UserError(
        f"train.objective={train.objective!r} does not fit model.family={model.family!r}, which "
        f"trains with {natural!r}; set train.objective='auto' (or {natural!r})"
    )


def span_counts(seq_len: int, density: float) -> tuple[int, int]:
    """(noise tokens, noise spans) of T5 span corruption of a ``seq_len`` window."""
    n_noise = min(seq_len - 1, max(1, round(seq_len * density)))
    n_spans = max(1, round(n_noise / MEAN_SPAN_LENGTH))
    return n_noise, min(n_spans, n_noise, seq_len - n_noise)


def extra_ids(objective: Objective, seq_len: int, mask_prob: float) -> int:
    """How many ids above the tokenizer vocabulary the objective uses (mask id, sentinels)."""
    if objective == "masked_lm":
        return 1
    if objective == "span_corruption":
        return 1 + span_counts(seq_len, mask_prob)[1]
    return 0


def corruption_rng(seed: int, step: int, index: int) -> np.random.Generator:
    """The generator for micro-batch ``index`` of ``step``; independent of process and history."""
    return np.random.default_rng([seed & 0xFFFFFFFF, step, index, 0x5EED])


@dataclass
class Batch:
    """Model inputs: ``model(input_ids, targets, encoder_input_ids=...)``."""

    input_ids: torch.Tensor
    targets: torch.Tensor
    encoder_input_ids: torch.Tensor | None = None
    #: model.family = "retrieval": the neighbours [B, C, k, r] of each chunk (model/retrieval/)
    neighbours: torch.Tensor | None = None

    @property
    def n_targets(self) -> int:
        return int((self.targets != -100).sum())

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        enc, nbr = self.encoder_input_ids, self.neighbours
        return Batch(
            self.input_ids.to(device, non_blocking=nb),
            self.targets.to(device, non_blocking=nb),
            None if enc is None else enc.to(device, non_blocking=nb),
            None if nbr is None else nbr.to(device, non_blocking=nb),
        )


def masked_lm(
    x: np.ndarray, rng: np.random.Generator, *, vocab: int, mask_prob: float
) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking: ``k = round(p T)`` positions per row (at least 1) become targets; of those
    80% are replaced by the mask id ``vocab``, 10% by a random token, 10% left as they are."""
    n, T = x.shape
    k = max(1, round(mask_prob * T))
    pos = np.argsort(rng.random((n, T)), axis=1)[:, :k]
    rows = np.arange(n)[:, None]
    targets = np.full_like(x, -100)
    targets[rows, pos] = x[rows, pos]
    inputs = x.copy()
    u = rng.random((n, k))
    random_tokens = rng.integers(0, vocab, size=(n, k))
    chosen = np.where(u < 0.8, vocab, np.where(u < 0.9, random_tokens, x[rows, pos]))
    inputs[rows, pos] = chosen
    return inputs, targets


def _random_partition(total: int, parts: int, rng: np.random.Generator) -> np.ndarray:
    """``parts`` positive integers summing to ``total``, uniformly over compositions."""
    cuts = np.sort(rng.choice(np.arange(1, total), size=parts - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [total]]))


def span_corruption(
    x: np.ndarray,
    rng: np.random.Generator,
    *,
    vocab: int,
    density: float,
    eos_id: int | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """T5 span corruption: returns (encoder input, decoder input, decoder targets).

    Each row keeps its non-noise spans, each noise span replaced by one sentinel ``vocab + 1 + i``;
    the targets are ``s_0 span_0 s_1 span_1 ... [eos]`` and the decoder input is the targets shifted
    right behind a start token (eos, else the mask id). Lengths are the same for every row.
    """
    n, T = x.shape
    n_noise, n_spans = span_counts(T, density)
    start = eos_id if eos_id is not None else vocab
    enc, tgt = [], []
    for row in x:
        noise = _random_partition(n_noise, n_spans, rng)
        keep = _random_partition(T - n_noise, n_spans, rng)
        e, t, i = [], [], 0
        for s in range(n_spans):
            e.extend(row[i : i + keep[s]])
            i += keep[s]
            sentinel = vocab + 1 + s
            e.append(sentinel)
            t.append(sentinel)
            t.extend(row[i : i + noise[s]])
            i += noise[s]
        if eos_id is not None:
            t.append(eos_id)
        enc.append(e)
        tgt.append(t)
    enc_a, tgt_a = np.asarray(enc, dtype=np.int64), np.asarray(tgt, dtype=np.int64)
    dec_in = np.concatenate([np.full((n, 1), start, dtype=np.int64), tgt_a[:, :-1]], axis=1)
    return enc_a, dec_in, tgt_a


def make_batch(
    objective: Objective,
    x: np.ndarray,
    y: np.ndarray,
    rng: np.random.Generator | None,
    *,
    vocab: int,
    mask_prob: float,
    eos_id: int | None,
) -> Batch:
    """Build the model inputs of one micro-batch for ``objective`` (``rng`` unused by causal LM)."""
    x = np.asarray(x, dtype=np.int64)
    if objective == "causal_lm":
        return Batch(torch.from_numpy(x), torch.from_numpy(np.asarray(y, dtype=np.int64)))
    assert rng is not None
    if objective == "masked_lm":
        inp, tgt = masked_lm(x, rng, vocab=vocab, mask_prob=mask_prob)
        return Batch(torch.from_numpy(inp), torch.from_numpy(tgt))
    enc, dec, tgt = span_corruption(x, rng, vocab=vocab, density=mask_prob, eos_id=eos_id)
    return Batch(torch.from_numpy(dec), torch.from_numpy(tgt), torch.from_numpy(enc))
