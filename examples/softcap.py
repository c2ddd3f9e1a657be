"""A score part: a tanh soft cap on the attention logits (Gemma 2); --plugin examples/softcap.py."""

from attnlab.parts import Field, ScorePart, register


@register("score", "softcap")
class SoftCap(ScorePart):
    """s' = c tanh(s / c) on the logits before the mask and softmax: |s'| < c.

    params 0; FLOPs: the attention's own q k^T and p v (a tanh per score is elementwise work,
    which attnlab's FLOP count, like FlopCounterMode's, leaves out); memory O(T^2 H): it forms
    the score matrix.
    """

    cost = "params 0; FLOPs 0 beyond attention; memory O(T^2 H)"
    needs_attention_matrix = True
    on = "logits"  # AttentionCore.explicit calls transform() on the logits

    class Options(ScorePart.Options):
        cap: float = Field(30.0, gt=0, description="c, the largest |logit|")

    @classmethod
    def param_count(cls, opts, dims):
        return 0

    def transform(self, s, allowed):
        return self.opts.cap * (s / self.opts.cap).tanh()

    def forward(self, q, k, v, core, ctx):
        return core.explicit(q, k, v, ctx, transform=self)
