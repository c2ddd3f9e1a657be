"""The attention engine (issue 34): every mask, score modification and normaliser at fused-kernel
speed where the device allows, exact everywhere, and saying which path it took.

- ``contracts``: what a ``Mask`` (``mask_mod`` + structure hints), a ``ScoreMod`` (``score_mod``
  + folds) and a ``Normaliser`` declare; FlexAttention's conventions;
- ``masks``, ``masks_sparse``: causal, full, prefix, sliding, document, padding; local+global,
  BigBird;
- ``mods``: per-head scale, ALiBi, T5 buckets, soft-capping; ``normalisers``: softmax,
  softmax-plus-one, sigmoid;
- ``plan``: which path a call takes (sdpa, block_sparse, flex, explicit) and why;
- ``folds``, ``layout``, ``grouped``, ``band``, ``centred``, ``flex``: the paths; ``denormals``; ``engine``: the entry point.

See ``docs/attention-engine.md``.
"""

from attnlab.model.engine.contracts import FlexForm, Mask, Normaliser, ScoreMod, Term
from attnlab.model.engine.engine import AttentionEngine, AttentionSpec, EngineOptions
from attnlab.model.engine.masks import Causal, Document, Full, Padded, Prefix, Sliding
from attnlab.model.engine.masks_sparse import BigBird, LocalGlobal
from attnlab.model.engine.mods import ALiBi, HeadScale, SoftCap, T5Bias, TableBias
from attnlab.model.engine.normalisers import Sigmoid, Softmax, SoftmaxPlusOne
from attnlab.model.engine.plan import Plan

__all__ = [
    "ALiBi",
    "AttentionEngine",
    "AttentionSpec",
    "BigBird",
    "Causal",
    "Document",
    "EngineOptions",
    "FlexForm",
    "Full",
    "HeadScale",
    "LocalGlobal",
    "Mask",
    "Normaliser",
    "Padded",
    "Plan",
    "Prefix",
    "ScoreMod",
    "Sigmoid",
    "Sliding",
    "SoftCap",
    "Softmax",
    "SoftmaxPlusOne",
    "T5Bias",
    "TableBias",
    "Term",
]
