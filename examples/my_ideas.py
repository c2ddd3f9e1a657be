"""Two attention-block ideas as attnlab parts; use them with --plugin examples/my_ideas.py."""

from torch import nn

from attnlab.parts import Field, QueryPart, SideBranchPart, register


@register("query", "gated")
class GatedQuery(QueryPart):
    """q = (u W_Q) * sigmoid(u W_g): every query feature is opened or closed per token."""

    param_label = "gated_query"
    cost = "params 2*d*d_q; FLOPs 4*d*d_q per token; cache 0"

    @classmethod
    def param_count(cls, opts, dims):
        return 2 * dims.d_model * dims.d_q

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.w_q = nn.Linear(dims.d_model, dims.d_q, bias=False)
        self.w_g = nn.Linear(dims.d_model, dims.d_q, bias=False)

    def forward(self, u):
        return self.w_q(u) * self.w_g(u).sigmoid()


@register("side_branch", "low_rank_skip")
class LowRankSkip(SideBranchPart):
    """out = x + attn + x~ A B: a rank-r content skip beside attention."""

    cost = "params 2*d*r; FLOPs 4*d*r per token; cache 0"

    class Options(SideBranchPart.Options):
        rank: int = Field(8, ge=1, description="r, the rank of A B")

    @classmethod
    def param_count(cls, opts, dims):
        return 2 * dims.d_model * opts.rank

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.a = nn.Linear(dims.d_model, opts.rank, bias=False)
        self.b = nn.Linear(opts.rank, dims.d_model, bias=False)

    def forward(self, x_tilde):
        return self.b(self.a(x_tilde))
