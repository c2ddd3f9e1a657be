"""Quantization: for every scheme of ``attnlab quantize`` (torchao; int4 with groups of 32),
(1) the part's quantized forward stays within the scheme's declared tolerance of its full-precision
forward: ``||f_q(x) - f(x)|| / ||f(x)||`` on the inputs the part sees in the model (each instance
in the full-precision model, recorded by a hook, fed to its quantized copy); (2) cached decoding
of the quantized model equals its own full forward, to the scheme's ``verify_tolerance`` (the same
quantized tensors on two code paths; int8-dynamic quantizes each token's activations, so a
float32 ulp upstream may move one rounding).

The model is the decoder case in float32 (torchao's CPU kernels take float32, not float64) at
d_model 64 (heads of 16, so the key/value projections reach the 32 features that ``quantizable()``
quantizes by default), Q/K/V unfused as ``attnlab quantize`` builds it. Skipped when torchao (the
``quant`` extra) is not installed.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from attnlab.base.extras import available
from attnlab.parts import families
from attnlab.testing.cases import Case, build, config_for, instances
from attnlab.testing.kv_cache import measure
from attnlab.testing.result import Result, failed, passed, skipped

NAME = "quantize"
SETS = ("model.attention.fuse_qkv=false", "model.d_model=64")
INT4_GROUP = 32


def _model(case: Case, slot: str, kind: str, options: dict[str, Any]):
    from attnlab.config import ConfigError

    try:
        cfg = config_for(case, slot, kind, options, SETS)
    except ConfigError:  # the part's options need the base width: keep it
        cfg = config_for(case, slot, kind, options, SETS[:1])
    return build(cfg, dtype=torch.float32)


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


@torch.no_grad()
def part_error(model, quantized, cls: type, case: Case) -> float | None:
    """Worst relative RMS error of the part's quantized instances on the inputs their
    full-precision twins saw in one forward (None: no instance holds a quantized weight)."""
    from attnlab.quant.apply import is_quantized
    from attnlab.testing.cases import forward, ids

    pairs = [
        (a, b)
        for a, b in zip(instances(model, cls), instances(quantized, cls))
        if any(is_quantized(p) for p in b.parameters())
    ]
    if not pairs:
        return None
    seen: list[tuple] = []
    hooks = [
        a.register_forward_hook(
            lambda m, args, kw, out: seen.append((m, args, kw, out)), with_kwargs=True
        )
        for a, _ in pairs
    ]
    try:
        forward(model, case, ids(2, seed=5))
    finally:
        for h in hooks:
            h.remove()
    twin = {id(a): b for a, b in pairs}
    worst = 0.0
    for m, args, kw, out in seen:
        ref, got = _first_tensor(out), _first_tensor(twin[id(m)](*args, **kw))
        if ref is None or got is None:
            continue
        worst = max(worst, float((got - ref).norm() / ref.norm().clamp_min(1e-30)))
    return worst


def check(name: str, cls: type, slot: str, kind: str, options: dict, case: Case) -> Result:
    if not available("torchao"):
        return skipped(NAME, "torchao is not installed (pip install 'attnlab[quant]')")
    from attnlab.quant import SCHEMES, quantize_model

    family = families.get(case.family)
    if not (family.continues_text and family.decodes_with_cache):
        return skipped(NAME, f"{name}'s first case ({case.name}) is a model that does not decode")
    model = _model(case, slot, kind, options)
    # cached decoding is compared only where the full-precision model decodes right: a part
    # whose own cache is wrong fails kv_cache, not quantize a second time
    own = measure(model, case, name) if cls.supports_kv_cache else None
    decodes = isinstance(own, float) and own <= min(s.verify_tolerance for s in SCHEMES.values())
    found = []
    for scheme in SCHEMES.values():
        q = copy.deepcopy(model)
        quantize_model(q, scheme, INT4_GROUP if scheme.default_group_size else None)
        err = part_error(model, q, cls, case)
        if err is not None and not err <= scheme.tolerance:
            return failed(
                NAME,
                f"{scheme.name}: the quantized {name} differs from its full-precision self by "
                f"{err:.3g} (relative RMS; the scheme declares {scheme.tolerance})",
                "keep the Linears whose rounding the part's math amplifies out of quantizable() "
                "and say why in full_precision_notes()",
                err,
                scheme.tolerance,
                case.name,
            )
        cached = measure(q, case, name) if decodes else 0.0
        if isinstance(cached, Result):
            return cached
        if not cached <= scheme.verify_tolerance:
            return failed(
                NAME,
                f"{scheme.name}: cached decoding of the quantized model differs from its full "
                f"forward by {cached:.3g} (limit {scheme.verify_tolerance})",
                "a part must compute the same values for a token decoded alone as in a full "
                "forward, also with quantized weights (read weights through F.linear, not .weight)",
                cached,
                scheme.verify_tolerance,
                case.name,
            )
        found.append(f"{scheme.name} {'-' if err is None else f'{err:.2g}'}/{cached:.2g}")
    return passed(
        NAME,
        "part error vs full precision / cached vs full forward: " + ", ".join(found),
    )
