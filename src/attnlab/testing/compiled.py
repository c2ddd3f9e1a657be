"""``torch.compile`` equals eager, and a bfloat16 forward is finite.

The part alone is compiled on the inputs it gets inside the float64 model and compared with its
eager output. The default backend, ``aot_eager``, runs what goes wrong in a part under
``torch.compile`` (TorchDynamo's tracing of its Python: branches on
``torch.compiler.is_compiling()``, state read at trace time, graph breaks; AOTAutograd's
functionalization) and then torch's eager kernels: about a second a part. ``inductor`` (what
``train.compile`` uses) also generates and compiles C++ kernels: 0.3-35 s a part on a cold cache
on 2 cores (25 parts: 155 s). A platform where the backend cannot run (inductor without a C++
compiler) is reported as a skip with the reason."""

from __future__ import annotations

import functools
from typing import Any

import torch

from attnlab.testing.cases import Case, build, forward, ids, inputs, instances
from attnlab.testing.finite import difference
from attnlab.testing.result import Result, failed, passed, skipped

COMPILE, BF16 = "compile", "bfloat16"
LIMIT = 1e-9
BACKENDS = ("aot_eager", "inductor")


@functools.cache
def platform_cannot_compile(backend: str) -> str | None:
    """Why this machine cannot run torch.compile with ``backend`` (None: it can)."""
    import torch._inductor.config as inductor_config

    try:
        with inductor_config.patch(compile_threads=1):
            torch.compile(lambda x: x.sin() + 1, backend=backend)(torch.ones(3))
    except Exception as e:  # a missing compiler, an unsupported platform
        return (
            f"torch.compile(backend={backend!r}) does not run on this machine "
            f"({type(e).__name__}: {str(e)[:160]})"
        )
    finally:
        torch._dynamo.reset()
    return None


def _inputs(model, case: Case, part: torch.nn.Module) -> tuple[tuple, dict]:
    got: list[tuple[tuple, dict]] = []

    def hook(_m, args, kwargs):
        if not got:
            got.append((args, kwargs))

    h = part.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            forward(model, case, ids(2, seed=9))
    finally:
        h.remove()
    return got[0] if got else None


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, tuple | list):
        return [t for o in out for t in _tensors(o)]
    return []


def check_compile(name: str, cls: type, model, case: Case, backend: str = "aot_eager") -> Result:
    why = platform_cannot_compile(backend)
    if why:
        return skipped(COMPILE, why)
    part = instances(model, cls)[0]
    got = _inputs(model, case, part)
    if got is None:
        # a part the model calls through its declared methods, not ``forward`` (a position
        # part's embed/bias/rotation): compiled as part of the whole model's forward
        x = ids(2, seed=9)
        part, args, kwargs = _Logits(model), (x,), inputs(case, x, cfg=model.cfg)
    else:
        args, kwargs = got
    torch._dynamo.reset()  # parts sharing a forward must not share a cache (or its size limit)
    import torch._inductor.config as inductor_config

    try:
        # one compile thread: a worker pool costs more to start than these small graphs take
        with torch.no_grad(), inductor_config.patch(compile_threads=1):
            eager = _tensors(part(*args, **kwargs))
            compiled = _tensors(torch.compile(part, backend=backend)(*args, **kwargs))
    except Exception as e:
        first = " ".join(str(e).split())[:300]
        return failed(
            COMPILE,
            f"torch.compile(backend={backend!r}) fails on {name}: {type(e).__name__}: {first}",
            "keep forward traceable by torch.compile (tensor ops; no data-dependent Python "
            "control flow torch cannot trace)",
            where=case.name,
        )
    finally:
        torch._dynamo.reset()
    if len(eager) != len(compiled) or any(a.shape != b.shape for a, b in zip(eager, compiled)):
        return failed(
            COMPILE,
            f"the compiled {name} returns other shapes than eager",
            "compute the same thing whether or not torch.compiler.is_compiling()",
            where=case.name,
        )
    d = max((difference(b, a) for a, b in zip(eager, compiled)), default=0.0)
    if not d <= LIMIT:
        return failed(
            COMPILE,
            f"the compiled {name} differs from eager by {d:.3g} (limit {LIMIT:g}, float64, "
            f"backend {backend})",
            "compute the same thing whether or not torch.compiler.is_compiling(); no state "
            "that the compiled graph freezes (Python numbers read from tensors, globals)",
            d,
            LIMIT,
            case.name,
        )
    return passed(
        COMPILE, f"compiled ({backend}) = eager (max |difference| {d:.3g})", d, LIMIT, case.name
    )


class _Logits(torch.nn.Module):
    """The model's logits, as one module to compile."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, **kw: Any) -> torch.Tensor:
        return self.model(x, **kw).logits


@torch.no_grad()
def check_bfloat16(name: str, cfg, case: Case) -> Result:
    model = build(cfg, seed=3, dtype=torch.bfloat16)
    try:
        logits = forward(model, case, ids(2, seed=10))
    except Exception as e:
        return failed(
            BF16,
            f"a bfloat16 forward raises {type(e).__name__}: {' '.join(str(e).split())[:200]}",
            "use ops that take bfloat16 (or compute that step in float32 and cast back)",
            where=case.name,
        )
    bad = int((~torch.isfinite(logits)).sum())
    if bad:
        return failed(
            BF16,
            f"a bfloat16 forward gives {bad} non-finite logits of {logits.numel()}",
            "keep bfloat16 intermediates in range: compute overflowing steps (exp, large sums, "
            "divisions by small numbers) in float32",
            float(bad),
            0.0,
            case.name,
        )
    return passed(BF16, f"bfloat16 forward finite ({logits.numel()} logits)", 0.0, 0.0, case.name)
