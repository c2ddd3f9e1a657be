"""How a row of masked logits s_j (j allowed) becomes attention weights w_j; out = sum_j w_j v_j.

- ``Softmax``: w_j = exp(s_j) / sum_k exp(s_k). SDPA's and flex's own.
- ``SoftmaxPlusOne`` ("off by one", Miller 2023): w_j = exp(s_j) / (1 + sum_k exp(s_k)), a row
  may attend to nothing. SDPA: softmax with a zero key and zero value appended (the sink's
  logit is 0); flex: softmax times sigmoid(lse), since Z / (1 + Z) = sigmoid(log Z).
- ``Sigmoid(bias)`` (Ramapuram et al. 2024): w_j = sigmoid(s_j + b), no row normalisation;
  the paper's b = -log(T) (``Sigmoid.for_length(T)``). No SDPA form (the explicit path on CPU);
  flex: score log sigmoid(s + b), then out * exp(lse), since sum_j exp(log sigmoid(s_j + b))
  v_j / Z * Z.

A plugin normaliser implements ``weights(scores, allowed)`` (explicit, always exact) and may
declare ``sdpa = "softmax" | "sink"`` or a ``flex()`` form (``contracts.Normaliser``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.model.engine.contracts import FlexForm, Normaliser


def _masked(scores: Tensor, allowed: Tensor) -> Tensor:
    """Masked logits at the dtype's minimum (finite: a row with no allowed key stays finite)."""
    return scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)


class Softmax(Normaliser):
    """w_j = exp(s_j) / sum_k exp(s_k)."""

    name = "softmax"
    sdpa = "softmax"
    shift_invariant = True

    def weights(self, scores: Tensor, allowed: Tensor) -> Tensor:
        return torch.softmax(_masked(scores, allowed), dim=-1)

    def flex(self) -> FlexForm:
        return FlexForm(None, None)


class SoftmaxPlusOne(Normaliser):
    """w_j = exp(s_j) / (1 + sum_k exp(s_k))."""

    name = "softmax_plus_one"
    sdpa = "sink"

    def weights(self, scores: Tensor, allowed: Tensor) -> Tensor:
        s = _masked(scores, allowed)
        s = torch.cat([s, s.new_zeros(*s.shape[:-1], 1)], dim=-1)
        return torch.softmax(s, dim=-1)[..., :-1]

    def flex(self) -> FlexForm:
        return FlexForm(None, lambda out, lse: out * torch.sigmoid(lse)[..., None].to(out.dtype))


class Sigmoid(Normaliser):
    """w_j = sigmoid(s_j + b), no row normalisation."""

    name = "sigmoid"

    def __init__(self, bias: float) -> None:
        self.bias = float(bias)

    @classmethod
    def for_length(cls, seq_len: int) -> Sigmoid:
        """The paper's b = -log(T) for training length T."""
        return cls(-math.log(seq_len))

    def weights(self, scores: Tensor, allowed: Tensor) -> Tensor:
        return torch.sigmoid(scores + self.bias) * allowed

    def flex(self) -> FlexForm:
        b = self.bias

        def log_sigmoid(score, bb, h, q_idx, kv_idx):
            return F.logsigmoid(score + b)

        return FlexForm(log_sigmoid, lambda out, lse: out * torch.exp(lse)[..., None].to(out.dtype))
