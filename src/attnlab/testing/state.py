"""State: a model loaded from another's state dict computes what that model computes (nothing a
part's forward reads lives outside its parameters and buffers), and a seeded ``reset_parameters``
sets every parameter of the part, the same way each time."""

from __future__ import annotations

import io

import torch

from attnlab.testing.cases import Case, build, forward, ids, instances
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
    d = float((forward(a, case, x) - forward(b, case, x)).abs().max())
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


@torch.no_grad()
def check_init(name: str, cls: type, cfg, case: Case) -> Result:
    a, b = build(cfg, seed=7, spread=0.0), build(cfg, seed=7, spread=0.0)
    pa, pb = _part_params(a, cls), _part_params(b, cls)
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
    draws = []
    for _ in range(2):
        for p in pa.values():
            p.fill_(SENTINEL)
        torch.manual_seed(11)
        a.reset_parameters()
        draws.append({n: p.detach().clone() for n, p in pa.items()})
    kept = [n for n, p in draws[0].items() if p.numel() and bool((p == SENTINEL).all())]
    if kept:
        return failed(
            INIT,
            f"reset_parameters leaves {name}'s {', '.join(kept[:3])} as it was (its "
            "init_weights does not set it)",
            "set every parameter in init_weights(init) (the default initialises Linears and "
            "norms; a raw nn.Parameter needs its own line)",
            where=case.name,
        )
    differ = [n for n in draws[0] if not torch.equal(draws[0][n], draws[1][n])]
    if differ:
        return failed(
            INIT,
            f"two seeded reset_parameters give different {', '.join(differ[:3])} in {name}",
            "draw the init from torch's global generator so that torch.manual_seed fixes it",
            where=case.name,
        )
    return passed(INIT, f"seeded init reproducible; init_weights sets all {len(pa)} part tensors")
