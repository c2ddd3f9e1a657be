"""Gradients: ``torch.autograd.gradcheck`` on every ``torch.autograd.Function`` a part runs in
its forward (a hand-written backward is the one place a gradient can be wrong while every
output is right). The Functions are found by running a forward with ``Function.apply`` watched
while the part's own forward is on the stack, and checked on the inputs they were given there."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.autograd import Function

from attnlab.testing.cases import Case, build, forward, ids, instances
from attnlab.testing.result import Result, failed, passed, skipped

NAME = "gradcheck"
#: the forward that finds the Functions runs a longer sequence than the other checks: a part may
#: apply its Function only past some length (virtual_heads_fused: in query chunks of 16 rows)
LENGTH = 40
#: settings of the model it runs in (learned positions up to LENGTH)
CONFIG = ("model.max_seq_len=64",)


@contextlib.contextmanager
def _watch(parts: list[torch.nn.Module]) -> Iterator[dict[type, tuple[tuple, dict]]]:
    """Record the first call of each autograd Function applied inside one of ``parts``."""
    seen: dict[type, tuple[tuple, dict]] = {}
    depth = [0]
    hooks = []
    for p in parts:
        hooks.append(p.register_forward_pre_hook(lambda *_: depth.__setitem__(0, depth[0] + 1)))
        hooks.append(p.register_forward_hook(lambda *_: depth.__setitem__(0, depth[0] - 1)))
    original = Function.__dict__["apply"]

    def apply(cls, *args: Any, **kwargs: Any):
        if depth[0] > 0 and cls not in seen:
            seen[cls] = (
                tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args),
                kwargs,
            )
        return original.__func__(cls, *args, **kwargs)

    Function.apply = classmethod(apply)  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        Function.apply = original  # type: ignore[method-assign]
        for h in hooks:
            h.remove()


def functions(model, case: Case, cls: type) -> dict[type, tuple[tuple, dict]]:
    """The autograd Functions the ``cls`` parts of ``model`` apply, with their first inputs."""
    model.train()
    try:
        with _watch(instances(model, cls)) as seen:
            forward(model, case, ids(1, LENGTH, seed=8)).sum().backward()
    finally:
        model.eval()
        model.zero_grad(set_to_none=True)
    return seen


def check(name: str, cls: type, cfg, case: Case) -> Result:
    """``cfg``: the part's config with :data:`CONFIG` applied."""
    found = functions(build(cfg), case, cls)
    if not found:
        return skipped(NAME, f"{name} applies no torch.autograd.Function of its own")
    names = []
    for fn, (args, kwargs) in found.items():
        inputs = [
            a.requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in args
        ]
        idx = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor) and a.requires_grad]

        def call(*tensors, _inputs=inputs, _idx=idx, _fn=fn, _kw=kwargs):
            full = list(_inputs)
            for i, t in zip(_idx, tensors):
                full[i] = t
            return _fn.apply(*full, **_kw)

        try:
            torch.autograd.gradcheck(
                call, tuple(inputs[i] for i in idx), eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=True
            )
        except Exception as e:  # GradcheckError, or a backward that fails outright
            first = " ".join(str(e).split())[:300]
            return failed(
                NAME,
                f"torch.autograd.gradcheck fails on {fn.__qualname__}.backward: {first}",
                f"make {fn.__qualname__}.backward return the gradient of its forward (compare "
                "it with autograd on the same forward written with torch ops)",
                where=case.name,
            )
        names.append(fn.__qualname__)
    return passed(NAME, f"gradcheck passes on {', '.join(sorted(names))}", where=case.name)
