"""A score part: a tanh soft cap on the attention logits (Gemma 2); --plugin examples/softcap.py."""

from attnlab.model.engine import SoftCap as SoftCapMod
from attnlab.parts import Field, ScorePart, register


@register("score", "softcap")
class SoftCap(ScorePart):
    """s' = c tanh(s / c) on the logits before the mask and softmax: |s'| < c.

    It declares an attention-engine score mod with no fold (tanh is not affine in s): the
    engine runs it in flex where flex runs (CUDA; CPU inference when asked), else on the
    explicit path per stack of gathered key blocks, and logs which. params 0; FLOPs 0 beyond
    attention (a tanh per score is elementwise work, which attnlab's FLOP count, like
    FlopCounterMode's, leaves out).
    """

    cost = "params 0; FLOPs 0 beyond attention; memory O(T^2 H) where flex cannot run"

    class Options(ScorePart.Options):
        cap: float = Field(30.0, gt=0, description="c, the largest |logit|")

    @classmethod
    def param_count(cls, opts, dims):
        return 0

    def score_mods(self):
        return (SoftCapMod(self.opts.cap),)
