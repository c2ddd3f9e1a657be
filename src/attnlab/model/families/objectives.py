"""The built-in families' training objectives: causal LM, masked LM (BERT), span corruption (T5).

Every objective turns a batch of ``n`` token windows ``x`` (and their next-token shift ``y``) into
model inputs and targets; ignored target positions are -100. The corruption of the masked and
span objectives is drawn from the generator it is given (the trainer seeds it by ``(seed, step,
index)``: ``attnlab.train.objectives.corruption_rng``).

Extra token ids live above the tokenizer's vocabulary ``V``: the mask id is ``V`` and the span
sentinels are ``V + 1, V + 2, ...``; ``model.vocab_size`` must leave room for them
(``Objective.extra_ids``). Cost: O(n T) per batch (span corruption loops over rows in Python).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.parts.family import Objective

MEAN_SPAN_LENGTH = 3.0  # T5's default mean noise-span length


def span_counts(seq_len: int, density: float) -> tuple[int, int]:
    """(noise tokens, noise spans) of T5 span corruption of a ``seq_len`` window."""
    n_noise = min(seq_len - 1, max(1, round(seq_len * density)))
    n_spans = max(1, round(n_noise / MEAN_SPAN_LENGTH))
    return n_noise, min(n_spans, n_noise, seq_len - n_noise)


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


class CausalLM(Objective):
    """Next-token prediction over every position: inputs ``x``, targets ``y``."""

    name = "causal_lm"

    def batch(self, x, y, rng, *, vocab, mask_prob, eos_id, model: Any = None):
        return {"input_ids": x, "targets": np.asarray(y, dtype=np.int64)}


class MaskedLM(Objective):
    """BERT's masked LM (:func:`masked_lm`): the mask id is ``vocab``."""

    name = "masked_lm"
    corrupts = True

    def extra_ids(self, seq_len: int, mask_prob: float) -> int:
        return 1

    def batch(self, x, y, rng, *, vocab, mask_prob, eos_id, model: Any = None):
        assert rng is not None
        inputs, targets = masked_lm(x, rng, vocab=vocab, mask_prob=mask_prob)
        return {"input_ids": inputs, "targets": targets}


class SpanCorruption(Objective):
    """T5's span corruption (:func:`span_corruption`): the encoder reads the corrupted window,
    the decoder writes the spans; a mask id and one sentinel per span above ``vocab``."""

    name = "span_corruption"
    corrupts = True

    def extra_ids(self, seq_len: int, mask_prob: float) -> int:
        return 1 + span_counts(seq_len, mask_prob)[1]

    def batch(self, x, y, rng, *, vocab, mask_prob, eos_id, model: Any = None):
        assert rng is not None
        enc, dec, tgt = span_corruption(x, rng, vocab=vocab, density=mask_prob, eos_id=eos_id)
        return {"input_ids": dec, "targets": tgt, "encoder_input_ids": enc}


CAUSAL_LM, MASKED_LM, SPAN_CORRUPTION = CausalLM(), MaskedLM(), SpanCorruption()
