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

A model family (``model.family``: decoder, encoder, ...) is registered the same way, with
``@register_family(name)`` on a :class:`Family` (:mod:`attnlab.parts.family`; the built-in
ones are ``attnlab/model/families/``), and loaded from a plugin the same way.
"""

from pydantic import Field

from attnlab.base.schema import PartOptions
from attnlab.parts import families
from attnlab.parts.families import FamilyError
from attnlab.parts.families import register as register_family
from attnlab.parts.family import CheckCase, Family, Objective, StackPlan
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

__all__ = [
    "BUILTIN",
    "SLOTS",
    "CheckCase",
    "CrossAttentionPart",
    "Dims",
    "FFNPart",
    "Family",
    "FamilyError",
    "FeatureMapPart",
    "Field",
    "FusedRows",
    "Init",
    "KeyPart",
    "MixerPart",
    "NormOptions",
    "NormPart",
    "Objective",
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
    "StackPlan",
    "ValuePart",
    "default_init",
    "families",
    "load_plugin",
    "load_plugins",
    "register",
    "register_family",
]
