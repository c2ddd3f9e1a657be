"""An attnlab export (``model_type = "attnlab"``) back as attnlab parts: exact by construction.

The folder's ``config.json`` carries the run's whole ``[model]`` table (``attnlab_model``) and its
weights are attnlab's own, named ``model.<attnlab name>`` (:mod:`.modeling`), so the table is taken
as it is and the weights lose their ``model.`` prefix: the same parts, the same tensors, the same
logits. Plugin parts need their source: give ``--plugin`` with the folder's ``plugins/`` copy.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

MODEL_TYPES = ("attnlab",)
PREFIX = "model."


def table(c: Any, differ: list[str]) -> dict[str, Any]:
    """The export's own ``[model]`` table; an export without one goes to ``differ``."""
    model = dict(getattr(c, "attnlab_model", None) or {})
    if not model:
        differ.append("config.json has no attnlab_model table (not an attnlab export?)")
    return model


def plugin_specs(c: Any) -> list[str]:
    """The plugin modules the export's parts come from (as recorded at export)."""
    return [str(p.get("spec")) for p in getattr(c, "attnlab_plugins", None) or []]


def weights(c: Any, sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """The state dict of :class:`~attnlab.hf.modeling.AttnlabForCausalLM` without its prefix."""
    return {k.removeprefix(PREFIX): v for k, v in sd.items() if k.startswith(PREFIX)}
