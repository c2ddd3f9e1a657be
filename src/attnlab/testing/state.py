"""State: a model loaded from another's state dict computes what that model computes (nothing a
part's forward reads lives outside its parameters and buffers), and the part's init is
reproducible and sets every tensor: by ``init_weights``, or by the constructor (attnlab builds
every model on a real device, so a raw ``nn.Parameter`` given its values in ``__init__`` is
initialised; one left as ``torch.empty`` made it is not)."""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator

import torch

from attnlab.testing.cases import Case, build, forward, ids, instances
from attnlab.testing.finite import difference, nonfinite
from attnlab.testing.result import Result, failed, passed

STATE, INIT = "state_dict", "init"
LIMIT = 1e-12
SENTINEL = 123.0


@torch.no_grad()
def check_state_dict(name: str, cfg, case: Case) -> Result:
    a, b = build(cfg, seed=1), build(cfg, seed=2)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    try:
        b.load_state_dict(torch.load(buf, weights_only=True), strict=True)
    except RuntimeError as e:
        return failed(
            STATE,
            f"a state dict does not load into a second model of the same config: {e}",
            "build the same parameters and buffers for the same (opts, dims)",
            where=case.name,
        )
    x = ids(2, seed=6)
    out = forward(a, case, x)
    bad = nonfinite(STATE, name, out, case.name)
    if bad is not None:
        return bad
    d = difference(forward(b, case, x), out)
    if not d <= LIMIT:
        return failed(
            STATE,
            f"a model loaded from another's state dict differs from it by {d:.3g}: {name} keeps "
            "state outside its parameters and buffers",
            "register what forward reads as a parameter or a persistent buffer, or compute it "
            "from them",
            d,
            LIMIT,
            case.name,
        )
    return passed(
        STATE,
        f"saved, loaded into a fresh model: outputs equal (max |difference| {d:.3g})",
        d,
        LIMIT,
    )


def _part_params(model, cls: type) -> dict[str, torch.Tensor]:
    out = {}
    for i, part in enumerate(instances(model, cls)):
        for n, p in part.named_parameters():
            out[f"{i}.{n}"] = p
    return out


@contextlib.contextmanager
def _uninitialised_is_nan() -> Iterator[None]:
    """``torch.empty`` fills with NaN inside the block (``fill_uninitialized_memory`` under
    deterministic algorithms, warnings only), so a tensor nothing initialises shows as NaN."""
    old = torch.are_deterministic_algorithms_enabled()
    old_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch.use_deterministic_algorithms(old, warn_only=old_warn)


def _seeded_reset(model, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    torch.manual_seed(11)
    model.reset_parameters()
    return {n: p.detach().clone() for n, p in tensors.items()}


@torch.no_grad()
def check_init(name: str, cls: type, cfg, case: Case) -> Result:
    """Models built after the same seed hold the same, finite part tensors, and a seeded
    ``reset_parameters`` is reproducible. A tensor ``init_weights`` leaves alone keeps what the
    constructor gave it (standard PyTorch: attnlab builds every model on a real device and
    initialises it right after, so the constructor's values are an init); one nothing
    initialises (``torch.empty``) is caught as NaN."""
    with _uninitialised_is_nan():
        a, b = build(cfg, seed=7, spread=0.0), build(cfg, seed=7, spread=0.0)
    pa, pb = _part_params(a, cls), _part_params(b, cls)
    unset = [n for n, p in pa.items() if p.is_floating_point() and not bool(p.isfinite().all())]
    if unset:
        return failed(
            INIT,
            f"{name}'s {', '.join(unset[:3])} is not initialised: a model just built holds NaN "
            "there (torch.empty's memory, filled with NaN by this check), and init_weights "
            "does not set it",
            "give it values in __init__ (torch.zeros, torch.randn, nn.init on it) or set it in "
            "init_weights(init)",
            where=case.name,
        )
    differ = [n for n in pa if not torch.equal(pa[n], pb[n])]
    if differ:
        return failed(
            INIT,
            f"two models built after the same torch.manual_seed differ in {name}'s "
            f"{', '.join(differ[:3])}",
            "draw every random number of __init__ and init_weights from torch's global "
            "generator (torch.nn.init, torch.randn), not from another generator or the clock",
            where=case.name,
        )
    draws = [_seeded_reset(a, pa) for _ in range(2)]
    differ = [n for n in draws[0] if not torch.equal(draws[0][n], draws[1][n])]
    if differ:
        return failed(
            INIT,
            f"two seeded reset_parameters give different {', '.join(differ[:3])} in {name}",
            "draw the init from torch's global generator so that torch.manual_seed fixes it",
            where=case.name,
        )
    for p in pa.values():
        p.fill_(SENTINEL)
    set_by_init = [n for n, p in _seeded_reset(a, pa).items() if not bool((p == SENTINEL).all())]
    kept = len(pa) - len(set_by_init)
    return passed(
        INIT,
        f"seeded init reproducible and finite in all {len(pa)} part tensors; init_weights sets "
        f"{len(set_by_init)}" + (f", {kept} keep the constructor's values" if kept else ""),
    )
