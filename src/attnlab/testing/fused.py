"""Fused: the part's model on the attention engine's fused paths equals the same model on the
explicit path, to 1e-10 in float64, logits and the gradient of every parameter, in every config
the part is accepted in.

``model.attention.backend = "auto"`` runs each layer's mask, score mods and normaliser on the
fastest exact path (SDPA with a per-head scale folded into q and a separable bias as extra q/k
columns, block-sparse SDPA over the key blocks the mask gathers, flex where it runs);
``"math"`` materialises the scores and applies every mod by its own ``score_mod``, the mask by
its ``mask_mod``, the normaliser by its ``weights``. A score mod's declared folds (``kind =
"scale"`` with ``head_scale()``, ``kind = "bias"`` with ``bias`` / ``separable``) and a mask's
structure hints are promises; this property is where a plugin's are proven, not trusted.
"""

from __future__ import annotations

import torch

from attnlab.config import ConfigError
from attnlab.testing.cases import Case, config_for, forward, ids
from attnlab.testing.finite import difference
from attnlab.testing.result import Result, failed, passed, skipped

NAME = "fused"
LIMIT = 1e-10
EXPLICIT = ("model.attention.backend=math",)


def _logits_and_grads(model, case: Case, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        logits = forward(model, case, x)
        logits.square().mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


def measure(fused, explicit, case: Case) -> float:
    """max |fused - explicit| over the logits and every parameter's gradient."""
    explicit.load_state_dict(fused.state_dict())
    x = ids(2, seed=5)
    a, ga = _logits_and_grads(fused, case, x)
    b, gb = _logits_and_grads(explicit, case, x)
    worst = difference(a, b)
    for n in ga.keys() | gb.keys():
        if n not in ga or n not in gb:
            return float("inf")
        worst = max(worst, difference(ga[n], gb[n]))
    return worst


def check(name: str, req, built: list[tuple[Case, torch.nn.Module]], build) -> Result:
    """``req``: the part's request (slot, kind, options); ``build``: the battery's model
    builder, for the explicit twin of each accepted config."""
    worst, n = 0.0, 0
    for case, model in built:
        try:
            cfg = config_for(case, req.slot, req.kind, req.options, EXPLICIT)
        except ConfigError:
            continue  # a config whose part refuses the explicit path (none built in)
        d = measure(model, build(cfg), case)
        if not d <= LIMIT:
            return failed(
                NAME,
                f"the fused attention path differs from the explicit one by {d:.3g} (limit "
                f"{LIMIT:g}, logits and gradients, float64)",
                "a score mod's declared fold must equal its score_mod (kind='scale': "
                "score_mod(s) == s * head_scale()[h]; kind='bias': s + bias(...)), and a mask's "
                "hints (causal, window, block_map) may over-cover but never under-cover",
                d,
                LIMIT,
                case.name,
            )
        worst, n = max(worst, d), n + 1
    if not n:
        return skipped(NAME, "no config accepts the part on the explicit path")
    return passed(
        NAME,
        f"the fused path equals the explicit one (max |difference| {worst:.3g}, logits and "
        f"gradients) in {n} configs",
        worst,
        LIMIT,
    )
