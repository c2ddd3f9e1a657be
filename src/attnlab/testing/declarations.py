"""Declarations: the parameter count a part declares (``param_count``) equals the real one in
every config, and the FLOPs per token it declares (``flops_per_token``: its Linears plus
``extra_flops``) match ``torch.utils.flop_counter.FlopCounterMode``'s count of its forward
within 2%.

FLOPs are matmul FLOPs (PaLM/nanoGPT convention; what FlopCounterMode counts: mm, bmm, conv,
SDPA). A score part's forward also runs the attention it replaces, so the model's 4 T d_h per
head and token (at full context T) is added to what it declares. The Q/K/V projections run
unfused here, so each projection part's own forward does its matmuls."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab.base.params import n_params
from attnlab.testing.cases import Case, T, forward, ids, instances
from attnlab.testing.result import Result, failed, passed, skipped

PARAMS, FLOPS = "params", "flops"
FLOP_TOLERANCE = 0.02


def check_params(name: str, cls: type, built: list[tuple[Case, torch.nn.Module]]) -> Result:
    n_checked, real_seen = 0, None
    for case, model in built:
        for part in instances(model, cls):
            real = n_params(part)
            declared = cls.param_count(part.opts, part.dims)
            if declared is None:
                return skipped(
                    PARAMS,
                    f"{name} declares no param_count(opts, dims) (it holds {real:,} parameters "
                    f"in {case.name}); declare the formula to have it checked",
                )
            if declared != real:
                return failed(
                    PARAMS,
                    f"{name} declares {declared:,} parameters ({cls.__name__}.param_count) but "
                    f"holds {real:,} (off by {declared - real:+,})",
                    "make param_count the formula of what __init__ builds (every Linear's "
                    "weight and bias, norms, raw Parameters)",
                    float(declared - real),
                    0.0,
                    case.name,
                )
            n_checked += 1
            real_seen = real
    if not n_checked:  # its parameters would be counted nowhere, and trained nowhere
        return failed(
            PARAMS,
            f"no config builds {name}: the models hold no {cls.__name__} module, so its "
            "parameters are neither counted nor trained",
            "declare how the part enters the model (see the effect property)",
        )
    return passed(
        PARAMS,
        f"declared = real ({real_seen:,} in the last config) in {n_checked} part instances",
        0.0,
        0.0,
    )


def _declared(part, slot: str, seq_len: int) -> int:
    n = part.flops_per_token(seq_len)
    if slot == "score":  # the attention it runs: q k^T and p v over H' heads
        n += 4 * seq_len * part.dims.head_dim * type(part).heads_out(part.opts, part.dims)
    return n


def measure_flops(model, case: Case, cls: type, slot: str) -> tuple[float, float]:
    """(measured, declared) forward FLOPs per token of one ``cls`` part (the mean over the
    model's layers), with autograd on: the forward that training runs (a few rows without
    autograd may take a decoding path)."""
    x = ids(2, seed=5)
    counter = FlopCounterMode(display=False)
    with counter, torch.enable_grad():
        forward(model, case, x)
    counts = counter.get_flop_counts()
    root = type(model).__name__
    measured = declared = n = 0
    tokens = x.numel()
    for path, module in model.named_modules():
        if type(module) is cls:
            measured += sum(counts.get(f"{root}.{path}", {}).values())
            declared += _declared(module, slot, T) * tokens
            n += 1
    return measured / tokens / max(n, 1), declared / tokens / max(n, 1)


def check_flops(name: str, cls: type, slot: str, case: Case, model) -> Result:
    measured, declared = measure_flops(model, case, cls, slot)
    scale = max(measured, declared)
    err = abs(measured - declared) / scale if scale else 0.0
    what = f"{measured:,.0f} FLOPs per token and layer measured by FlopCounterMode (T={T})"
    if err > FLOP_TOLERANCE:
        extra = " + the attention it runs (4 T d_h per head)" if slot == "score" else ""
        if measured > declared:
            fix = (
                "declare the matmul FLOPs beyond its Linears in extra_flops(seq_len) (per "
                "token, at context length seq_len)"
            )
        else:
            fix = "declare only what forward computes: correct flops_per_token/extra_flops"
        return failed(
            FLOPS,
            f"{what}, but {name} declares {declared:,.0f} (flops_per_token{extra}): off by "
            f"{100 * err:.1f}% (limit {100 * FLOP_TOLERANCE:g}%)",
            fix,
            err,
            FLOP_TOLERANCE,
            case.name,
        )
    return passed(
        FLOPS,
        f"{what}; declared {declared:,.0f} ({100 * err:.2f}% apart)",
        err,
        FLOP_TOLERANCE,
        case.name,
    )
