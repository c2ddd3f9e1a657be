"""The memory bound before the check builds a part's small models: a part that would need
gigabytes in a model of d_model 32 and 10 tokens (a table sized by a typo, a buffer of 2^40
elements) fails the check with the numbers, before anything is allocated, instead of ending the
process or taking the machine's memory.

Counted for every config the part is accepted in, as the battery holds them all at once:
its parameters and buffers (the model built on the meta device, where nothing is allocated:
what ``__init__`` would really build, declared or not) at 8 bytes (float64), and once the
training activation estimate of the preflight (:func:`attnlab.runs.preflight.training_estimate`,
with the parts' ``activation_elements``) of the config holding the most, at float64. The bound is :data:`LIMIT` or the host's free memory, whichever is smaller. A model that
cannot be built on the meta device (a part that reads its tensors' values in ``__init__``) is not
counted here; building it for real is then guarded (:func:`attnlab.testing.battery`).
"""

from __future__ import annotations

from itertools import chain

import torch

from attnlab.runs.preflight import fmt_bytes, host_free, training_estimate
from attnlab.testing.cases import T
from attnlab.testing.result import Result, failed

NAME = "build"
#: the most a part's small models may hold together (they need about a megabyte)
LIMIT = 2 * 1024**3
BYTES = 8  # float64
#: rows of the largest batch a property runs (batching's three lengths)
BATCH = 3


def _tensor_bytes(cfg) -> int | None:
    """Bytes of the model's parameters and buffers at float64, built on the meta device (None:
    it cannot be built there)."""
    from attnlab.model import build_model

    try:
        with torch.device("meta"):
            model = build_model(cfg.model)
    except KeyboardInterrupt:
        raise
    except BaseException:  # a part that needs real values, or raises: found when it is built
        return None
    seen = {id(t): t for t in chain(model.parameters(), model.buffers())}
    return sum(t.numel() for t in seen.values()) * BYTES


def _activation_bytes(cfg) -> int:
    try:
        est = training_estimate(cfg, batch_size=BATCH, seq_len=T, device="cpu")
    except KeyboardInterrupt:
        raise
    except BaseException:  # a PreflightError, or a part that raises: found when it is built
        return 0
    return int(est.items["activations"][0] * BYTES / 4)  # the estimate counts 4-byte values


def check(name: str, ok: list) -> Result | None:
    """A failure when the models of the accepted configs ``ok`` ((case, config) pairs) would
    need more than the bound; None when they fit (or cannot be counted)."""
    tensors = [(case, _tensor_bytes(cfg)) for case, cfg in ok]
    counted = [(case, n) for case, n in tensors if n is not None]
    weights = sum(n for _, n in counted)
    # the preflight's estimate (a parameter count on the meta device of its own) once, on the
    # config holding the most: what a part declares per token hardly differs between families
    biggest = max(
        ((n, cfg) for (_, cfg), (_, n) in zip(ok, tensors) if n), key=lambda x: x[0], default=None
    )
    acts = _activation_bytes(biggest[1]) if biggest is not None else 0
    need = weights + acts
    free, bound_by = host_free()
    limit, why = LIMIT, f"the check's own limit, {fmt_bytes(LIMIT)}"
    if 0 < free < limit:
        limit, why = free, f"the {bound_by}, {fmt_bytes(free)} free"
    if need <= limit:
        return None
    case, largest = max(counted, key=lambda c: c[1]) if counted else (ok[0][0], 0)
    return failed(
        NAME,
        f"{name}'s small models would need {fmt_bytes(need)} ({fmt_bytes(largest)} of parameters "
        f"and buffers in {case.name} alone, d_model 32, {T} tokens; activations "
        f"{fmt_bytes(acts)}), more than {why}: nothing was built",
        "size the part's tensors from dims and its options (a model this small needs kilobytes), "
        "and declare activation_elements(opts, dims, seq_len) for what its forward holds",
        float(need),
        float(limit),
        case.name,
    )
