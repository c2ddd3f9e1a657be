"""A side branch that mixes over time; --plugin examples/causal_mean.py.

Its output at t reads every token up to t, which the KV cache (keys and values per layer) does
not hold: a decoding step sees only the new token. So it declares ``supports_kv_cache = False``
and ``generate`` (and the export) decode by full forwards. Declaring True here is the bug
``attnlab check`` reports: token-by-token logits then differ from a full forward.
"""

import torch
from torch import nn

from attnlab.parts import SideBranchPart, register


@register("side_branch", "causal_mean")
class CausalMean(SideBranchPart):
    """out_t = sigmoid(x~_t W_g) * (mean_{s <= t} x~_s) W_m: a gated running mean of the past.

    params 2 d^2; FLOPs 4 d^2 per token (the running mean is a cumulative sum, elementwise).
    """

    cost = "params 2*d^2; FLOPs 4*d^2 per token; no KV cache"
    supports_kv_cache = False

    @classmethod
    def param_count(cls, opts, dims):
        return 2 * dims.d_model**2

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.w_g = nn.Linear(dims.d_model, dims.d_model, bias=False)
        self.w_m = nn.Linear(dims.d_model, dims.d_model, bias=False)

    def forward(self, x_tilde):
        steps = torch.arange(1, x_tilde.shape[1] + 1, device=x_tilde.device, dtype=x_tilde.dtype)
        mean = x_tilde.cumsum(1) / steps[:, None]
        return self.w_g(x_tilde).sigmoid() * self.w_m(mean)
