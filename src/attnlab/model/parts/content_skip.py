"""Content skip (seed 000): out = x + attn_out + W_skip x~.

W_skip: d x d, no bias, N(0, 1e-4) so the block starts as the baseline; its magnitude is the only
gate (no separate alpha). Params d^2 per layer (7.08M on Pythia-160M); FLOPs 2d^2 per token; no
K/V-cache cost. Its per-layer Frobenius norm ||W_skip||_F is what the paper plots (Figure 2): it is
declared as a layer statistic, so reports show it for any run that has the part.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor, nn

from attnlab.model.linear import Linear
from attnlab.parts import Dims, Init, PartOptions, SideBranchPart, register
from attnlab.parts.tp import TPPlan


@register("side_branch", "content_skip")
class ContentSkip(SideBranchPart):
    """x~ -> W_skip x~, added to the block output beside the attention branch."""

    param_label = "content_skip"
    cost = "params d^2; FLOPs 2*d^2 per token; cache 0"
    probe_name = "skip"

    class Options(PartOptions):
        init_std: float = Field(1e-4, ge=0, description="N(0, std) for W_skip")

    @classmethod
    def param_count(cls, opts: Options, dims: Dims) -> int:
        return dims.d_model**2

    def __init__(self, opts: Options, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.w_skip = Linear(dims.d_model, dims.d_model, bias=False)

    def init_weights(self, init: Init) -> None:
        nn.init.normal_(self.w_skip.weight, 0.0, self.opts.init_std)

    def tp_plan(self) -> TPPlan:
        # rank r multiplies its d/P columns of x~ by its columns of W_skip; one all-reduce
        return TPPlan(linears={"w_skip": "rowwise_full_in"})

    def forward(self, x_tilde: Tensor) -> Tensor:
        out = self.w_skip(x_tilde)
        if self.recording:  # ||W_skip x~_t|| of the first sequence, for attnlab inspect
            self._token_norms = out[0].detach().float().norm(dim=-1, keepdim=True)
        return out

    def norm(self) -> float:
        """||W_skip||_F."""
        return float(self.w_skip.weight.detach().float().norm())

    def layer_stats(self) -> dict[str, float]:
        return {"content_skip_norm": self.norm()}

    def train_stats(self) -> dict[str, float | Tensor]:
        with torch.no_grad():
            return {"content_skip_norm": self.w_skip.weight.detach().float().norm()}

    @classmethod
    def train_stats_doc(cls) -> dict[str, str]:
        return {"content_skip_norm": "||W_skip||_F of each layer over training (seed 000, Fig. 2)"}

    def token_stats(self) -> dict[str, Tensor]:
        norms = self.__dict__.get("_token_norms")
        return {} if norms is None else {"content_skip_out": norms}

    @classmethod
    def token_stats_doc(cls) -> dict[str, tuple[str, list[str] | None]]:
        return {
            "content_skip_out": (
                "Norm of the skip's contribution W_skip x~ at each token",
                ["||W_skip x~||"],
            )
        }

    @classmethod
    def layer_stats_doc(cls, opts: Options, d_model: int) -> dict[str, str]:
        return {
            "content_skip_norm": (
                "Per-layer Frobenius norm ||W_skip||_F (seed 000's Figure 2). W_skip (d x d) "
                f"starts at N(0, σ²), a norm of about σ·d = {opts.init_std * d_model:.2g}; a layer "
                "whose norm grew far beyond that uses the skip path."
            )
        }
