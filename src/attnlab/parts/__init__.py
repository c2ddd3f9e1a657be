"""attnlab's part API: a new idea is one file.

A part is a small ``nn.Module`` registered in one of the block's named slots::

    from attnlab.model.linear import Linear
    from attnlab.parts import Dims, Field, SideBranchPart, register

    @register("side_branch", "low_rank_skip")
    class LowRankSkip(SideBranchPart):
        '''out += x~ A B, A: d x r, B: r x d.  params 2dr, FLOPs 4dr per token.'''

        class Options(SideBranchPart.Options):
            rank: int = Field(16, ge=1)

        def __init__(self, opts: Options, dims: Dims) -> None:
            super().__init__(opts, dims)
            self.a = Linear(dims.d_model, opts.rank, bias=False)
            self.b = Linear(opts.rank, dims.d_model, bias=False)

        def forward(self, x_tilde):
            return self.b(self.a(x_tilde))

and selected by config: ``[model.side_branch] kind = "low_rank_skip"`` with ``plugins =
["my_ideas.py"]`` (or ``--plugin my_ideas.py``). ``attnlab parts`` lists every registered part.
The built-in parts (``attnlab/model/parts/``) are registered through this same API.
"""

from pydantic import Field

from attnlab.base.schema import PartOptions
from attnlab.parts.part import Dims, Init, Part, default_init
from attnlab.parts.plugins import PluginError, PluginRecord, load_plugin, load_plugins
from attnlab.parts.registry import BUILTIN, PartError, PartSpec, register
from attnlab.parts.slots import (
    SLOTS,
    CrossAttentionPart,
    FeatureMapPart,
    FFNPart,
    FusedRows,
    KeyPart,
    MixerPart,
    NormOptions,
    NormPart,
    PositionPart,
    ProjectionPart,
    QueryPart,
    ReadoutPart,
    ScoreContext,
    ScorePart,
    SideBranchPart,
    ValuePart,
)
from attnlab.parts.width import WidthRole, WidthScaling

__all__ = [
    "BUILTIN",
    "SLOTS",
    "CrossAttentionPart",
    "Dims",
    "FFNPart",
    "FeatureMapPart",
    "Field",
    "FusedRows",
    "Init",
    "KeyPart",
    "MixerPart",
    "NormOptions",
    "NormPart",
    "Part",
    "PartError",
    "PartOptions",
    "PartSpec",
    "PluginError",
    "PluginRecord",
    "PositionPart",
    "ProjectionPart",
    "QueryPart",
    "ReadoutPart",
    "ScoreContext",
    "ScorePart",
    "SideBranchPart",
    "ValuePart",
    "WidthRole",
    "WidthScaling",
    "default_init",
    "load_plugin",
    "load_plugins",
    "register",
]
