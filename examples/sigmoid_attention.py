"""A score part that replaces the softmax: sigmoid attention (Ramapuram et al. 2024);
--plugin examples/sigmoid_attention.py.

weights_ij = sigmoid(s_ij + b), no row normalisation, out_i = sum_j weights_ij v_j, with b = -log n
(n = ``model.max_seq_len``, the paper's choice) unless ``bias`` is set. It declares a normaliser
(the attention engine's contract, ``docs/CONTRACTS.md``): ``weights(scores, allowed)``, the
exact form the explicit path runs, and a fused form for FlexAttention (logsigmoid as a score
mod, then out * exp(lse)), which runs where flex does (CUDA; CPU inference with
``flex_cpu_inference``). CPU training has no flex backward: the engine runs it explicitly, per
stack of gathered key blocks, and says so once.

    [model.score]
    kind = "sigmoid_attention"

params 0; FLOPs 0 beyond attention; memory O(T^2 H) on the explicit path.
"""

import math

import torch
import torch.nn.functional as F

from attnlab.model.engine import FlexForm, Normaliser
from attnlab.parts import Field, ScorePart, register


class SigmoidWeights(Normaliser):
    """sigmoid(s + b) per entry, no row normalisation."""

    name = "sigmoid_attention"

    def __init__(self, bias: float) -> None:
        self.bias = float(bias)

    def weights(self, scores, allowed):
        return torch.sigmoid(scores + self.bias) * allowed

    def flex(self):
        b = self.bias
        return FlexForm(
            lambda s, bb, h, q_idx, kv_idx: F.logsigmoid(s + b),
            lambda out, lse: out * lse.exp()[..., None],
        )


@register("score", "sigmoid_attention")
class SigmoidAttention(ScorePart):
    """Attention weights sigmoid(s + b) instead of a softmax."""

    cost = "params 0; FLOPs 0 beyond attention"

    class Options(ScorePart.Options):
        bias: float | None = Field(None, description="b (None: -log model.max_seq_len)")

    @classmethod
    def param_count(cls, opts, dims):
        return 0

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        n = dims.model.max_seq_len if dims.model is not None else 1024
        self._norm = SigmoidWeights(-math.log(n) if opts.bias is None else opts.bias)

    def normaliser(self):
        return self._norm
