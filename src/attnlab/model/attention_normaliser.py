"""``model.attention.normaliser``: how a row of masked logits becomes attention weights.

- ``softmax`` (default): exp(s_j) / sum_k exp(s_k);
- ``softmax_plus_one`` ("off by one"): exp(s_j) / (1 + sum_k exp(s_k)), a row may give weight to
  nothing (run fused as SDPA with one zero key and value appended);
- ``sigmoid`` (Ramapuram et al. 2024): sigmoid(s_j + b), no row normalisation, with b =
  ``model.attention.sigmoid_bias`` or, when unset, -log(``model.max_seq_len``) as the paper
  sets it (no SDPA form: flex where it runs, else the explicit path).

A plugin's own normaliser is a score part declaring ``normaliser()`` (the engine's
``Normaliser`` contract, ``docs/CONTRACTS.md``; ``examples/sigmoid_attention.py``).
"""

from __future__ import annotations

from typing import Any

from attnlab.model.engine import Normaliser, Sigmoid, Softmax, SoftmaxPlusOne


def normaliser_for(attention: Any, max_seq_len: int) -> Normaliser:
    """The engine normaliser ``attention`` (an ``AttentionConfig``) names."""
    makers = {
        "softmax": Softmax,
        "softmax_plus_one": SoftmaxPlusOne,
        "sigmoid": lambda: (
            Sigmoid.for_length(max_seq_len)
            if attention.sigmoid_bias is None
            else Sigmoid(attention.sigmoid_bias)
        ),
    }
    return makers[attention.normaliser]()
