"""The pre-engine attention path as a score part, for benchmarks only: --plugin
benchmarks/dense_masks.py, [model.score] kind = "dense_sdpa".

Before issue 34 every layer ran one SDPA call with the mask as a dense [Tq, Tk] boolean and a
position bias (ALiBi, T5) as a dense [H, Tq, Tk] float tensor. This part does exactly that (its
``forward`` calls ``core.sdpa`` with the layer's dense ``ctx.allowed`` and ``ctx.bias``), so
``benchmarks/attention_engine_model.sh`` times the engine against the path it replaced in one
interleaved run. params 0; memory O(T^2) for the mask, O(H T^2) for a bias.
"""

from typing import ClassVar

from attnlab.parts import ScorePart, register


@register("score", "dense_sdpa")
class DenseSDPA(ScorePart):
    """SDPA with the dense mask and bias (the pre-engine path)."""

    cost = "params 0; memory O(T^2) mask, O(H T^2) bias"
    unchecked: ClassVar[dict[str, str]] = {
        "flops": "its attention is CPU SDPA, which FlopCounterMode does not count"
    }

    @classmethod
    def param_count(cls, opts, dims):
        return 0

    def forward(self, q, k, v, core, ctx):
        return core.sdpa(q, k, v, ctx), None
