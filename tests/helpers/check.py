"""Plugin files with one fault each, for the conformance-check tests: every part is otherwise
sound, so the one property that fails is the fault's own."""

from __future__ import annotations

from pathlib import Path

HEADER = """
import torch
from torch import nn

from attnlab.parts import QueryPart, ScorePart, SideBranchPart, register
"""

#: the user trial's side branch: a gated causal mean, claiming cache support it does not have
CACHE_CLAIM = '''
@register("side_branch", "gated_mean_{tag}")
class GatedMean(SideBranchPart):
    """out_t = sigmoid(x~_t W_g) * mean_(s <= t) x~_s W_m."""

    @classmethod
    def param_count(cls, opts, dims):
        return 2 * dims.d_model**2

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.w_g = nn.Linear(dims.d_model, dims.d_model, bias=False)
        self.w_m = nn.Linear(dims.d_model, dims.d_model, bias=False)

    def forward(self, x):
        n = torch.arange(1, x.shape[1] + 1, dtype=x.dtype, device=x.device)[:, None]
        return self.w_g(x).sigmoid() * self.w_m(x.cumsum(1) / n)
'''

#: a query whose declared parameter count is one more than it holds
PARAMS_OFF_BY_ONE = '''
@register("query", "off_by_one_{tag}")
class OffByOne(QueryPart):
    """q = u W_Q, declaring d*d_q + 1 parameters."""

    @classmethod
    def param_count(cls, opts, dims):
        return dims.d_model * dims.d_q + 1

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.w_q = nn.Linear(dims.d_model, dims.d_q, bias=False)

    def forward(self, u):
        return self.w_q(u)
'''

#: a score part that forgets the mask: every query reads every key
LEAKY_SCORE = '''
@register("score", "leaky_{tag}")
class Leaky(ScorePart):
    """softmax(q k^T / sqrt(d_h)) v over all keys, ignoring ctx's mask."""

    @classmethod
    def param_count(cls, opts, dims):
        return 0

    def forward(self, q, k, v, core, ctx):
        if q.shape[1] != k.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        p = torch.softmax((q * core.scale) @ k.transpose(-2, -1), dim=-1)
        return p @ v, None
'''

#: a side branch whose compiled forward computes something else than its eager one
COMPILE_DIFFERS = '''
@register("side_branch", "compile_differs_{tag}")
class CompileDiffers(SideBranchPart):
    """out = x~ W, times 1.5 when torch.compile traces it."""

    @classmethod
    def param_count(cls, opts, dims):
        return dims.d_model**2

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.w = nn.Linear(dims.d_model, dims.d_model, bias=False)

    def forward(self, x):
        y = self.w(x)
        return y * 1.5 if torch.compiler.is_compiling() else y
'''

#: a side branch that multiplies by a raw Parameter and declares no FLOPs for it
UNDECLARED_FLOPS = '''
@register("side_branch", "hidden_matmul_{tag}")
class HiddenMatmul(SideBranchPart):
    """out = x~ W (W a raw Parameter: 2 d^2 FLOPs per token that no Linear declares)."""

    @classmethod
    def param_count(cls, opts, dims):
        return dims.d_model**2

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.w = nn.Parameter(torch.empty(dims.d_model, dims.d_model))

    def init_weights(self, init):
        nn.init.normal_(self.w, 0.0, init.std)

    def forward(self, x):
        return x @ self.w
'''

FAULTS = {
    "cache": ("side_branch", "gated_mean", CACHE_CLAIM),
    "params": ("query", "off_by_one", PARAMS_OFF_BY_ONE),
    "causality": ("score", "leaky", LEAKY_SCORE),
    "compile": ("side_branch", "compile_differs", COMPILE_DIFFERS),
    "flops": ("side_branch", "hidden_matmul", UNDECLARED_FLOPS),
}


def write_fault(folder: Path, fault: str, tag: str) -> tuple[Path, str, str]:
    """``folder/<fault>_<tag>.py`` with the faulty part registered as ``<kind>_<tag>``;
    returns (file, slot, kind). ``tag`` keeps kind names unique within one process."""
    slot, kind, body = FAULTS[fault]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{fault}_{tag}.py"
    path.write_text(HEADER + body.replace("{tag}", tag))
    return path, slot, f"{kind}_{tag}"
