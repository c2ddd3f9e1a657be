"""MoEValues (SPEC 1.4): routed expert MLPs as the value projection, dropless, with aux losses."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.base.errors import UserError
from attnlab.config import load_config
from attnlab.model.parts.moe_dispatch import combine, dispatch, sort_by_expert
from attnlab.model.parts.moe_values import MoEValues, load_balancing_loss, router_z_loss
from attnlab.parts import Dims

torch.set_num_threads(1)


def make(d=8, d_out=12, E=4, k=2, h=16, bias=True, activation="gelu", seed=0, **kw):
    torch.manual_seed(seed)
    opts = MoEValues.Options(
        kind="moe", n_experts=E, top_k=k, expert_hidden=h, activation=activation, **kw
    )
    return MoEValues(opts, moe_dims(d, d_out, bias))


def moe_dims(d: int, d_out: int, bias: bool) -> Dims:
    return Dims(d_model=d, n_heads=1, n_kv_heads=1, head_dim=d_out, bias=bias)


def naive(m: MoEValues, u: torch.Tensor) -> torch.Tensor:
    """Per-token reference: for each token, its top-k experts' MLPs weighted by renormalised probs
    (differentiable in u and every parameter, the router's through the gates)."""
    x = u.reshape(-1, m.d_model)
    rd = torch.promote_types(x.dtype, torch.float32)  # router precision: float32 or wider
    rows = []
    for n in range(x.shape[0]):
        p = torch.softmax(x[n].to(rd) @ m.router.weight.to(rd).T, dim=-1)
        top_p, top_e = p.topk(m.top_k)
        g = top_p / top_p.sum()
        row = 0.0
        for j, e in enumerate(top_e.tolist()):
            h = x[n] @ m.w_in[e] + (m.b_in[e] if m.b_in is not None else 0)
            y = m.act(h) @ m.w_out[e] + (m.b_out[e] if m.b_out is not None else 0)
            row = row + g[j].to(x.dtype) * y
        rows.append(row)
    return torch.stack(rows).reshape(*u.shape[:-1], m.d_out)


def scale_up(m: MoEValues) -> None:
    """O(1) weights so the comparison is not trivially small."""
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)


@pytest.mark.parametrize("impl", ["loop", "grouped"])
@pytest.mark.parametrize(
    "activation,bias,k", [("gelu", True, 2), ("relu2", False, 1), ("silu", True, 3)]
)
def test_matches_naive_per_token_reference(impl, activation, bias, k):
    m = make(activation=activation, bias=bias, k=k)
    m.impl = impl
    scale_up(m)
    u = torch.randn(3, 7, 8)
    with torch.no_grad():
        v, ref = m(u), naive(m, u)
    assert v.shape == (3, 7, 12)
    assert ref.abs().max() > 0.1
    # float32 through two summation orders (and other CPUs' or GPUs' kernels): ~10 ulp apart;
    # the exact check of the math is the float64 test below
    torch.testing.assert_close(v, ref, atol=1e-5, rtol=1e-5)


def test_matches_reference_in_float64_loop():
    m = make(k=2).double()
    m.impl = "loop"
    scale_up(m)
    u = torch.randn(2, 9, 8, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(m(u), naive(m, u), atol=1e-12, rtol=1e-12)


def test_grouped_and_loop_agree_in_values_and_gradients():
    m = make(E=6, k=2)
    scale_up(m)
    u = torch.randn(2, 11, 8)
    grads = {}
    for impl in ("loop", "grouped"):
        m.impl = impl
        m.zero_grad()
        m.train()
        v = m(u)
        (v.square().sum() + m.last_aux_loss).backward()
        grads[impl] = (v.detach(), [p.grad.clone() for p in m.parameters()])
    torch.testing.assert_close(grads["loop"][0], grads["grouped"][0])
    for a, b in zip(grads["loop"][1], grads["grouped"][1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _values_and_grads(m: MoEValues, u: torch.Tensor, fn) -> list[torch.Tensor]:
    """v = fn(u) and the gradients of a fixed loss on v w.r.t. u and every parameter."""
    m.zero_grad()
    u = u.detach().requires_grad_()
    v = fn(u)
    w = torch.linspace(-1, 1, v.numel(), dtype=v.dtype).view_as(v)
    (v * w).sum().backward()
    return [v.detach(), u.grad, *(p.grad for p in m.parameters())]


@pytest.mark.parametrize("bias", [True, False])
def test_every_impl_matches_the_per_token_reference_in_values_and_gradients(bias):
    """float64: loop (and auto, which runs the loop in float64) against the naive per-token
    formula through autograd; grouped_mm has no float64, so grouped runs the same float32
    weights against that float64 reference at float32 precision. Expert 3 gets no token."""
    m = make(E=5, k=2, bias=bias).double()
    scale_up(m)
    with torch.no_grad():
        m.router.weight[3] = -5.0 * m.router.weight[:3].abs().sum(0)  # never in the top 2
    u = torch.randn(3, 7, 8, dtype=torch.float64)
    u = u.abs()  # router row 3 is negative on positive inputs: expert 3 stays empty
    ref = _values_and_grads(m, u, lambda x: naive(m, x))
    for impl in ("loop", "auto"):
        m.impl = impl
        got = _values_and_grads(m, u, m)
        assert m.last_stats["counts"][3] == 0
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    m32 = m.float()
    m32.impl = "grouped"
    got = _values_and_grads(m32, u.float(), m32)
    assert m32.last_stats["counts"][3] == 0
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b, atol=2e-5, rtol=2e-5)


def test_dispatch_and_combine_gradients_are_exact():
    """The hand-written gather gradients of the sort-by-expert moves, by finite differences."""
    experts = torch.tensor([[2, 0], [1, 2], [0, 1], [2, 1]])
    order, inverse, expert_sorted = sort_by_expert(experts)
    assert expert_sorted.tolist() == [0, 0, 1, 1, 1, 2, 2, 2]
    assert torch.equal(order[inverse], torch.arange(8))
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    xs = dispatch(x, order, inverse, 2)
    assert torch.equal(xs, x[order // 2])
    assert torch.autograd.gradcheck(lambda t: dispatch(t, order, inverse, 2), (x,))
    y = torch.randn(8, 3, dtype=torch.float64, requires_grad=True)
    assert torch.equal(combine(y, order, inverse), y[inverse])
    assert torch.equal(
        combine(dispatch(x, order, inverse, 2), order, inverse).view(4, 2, 3)[:, 1], x
    )
    assert torch.autograd.gradcheck(lambda t: combine(t, order, inverse), (y,))


def test_dropless_every_token_gets_k_experts():
    E, k = 5, 2
    m = make(E=E, k=k)
    with torch.no_grad():
        m.router.weight.zero_()
        m.router.weight[1] = 1.0  # skew: expert 1 wins for tokens with positive sum
    u = torch.randn(4, 16, 8)
    N = u.shape[0] * u.shape[1]
    _, _, experts, gates = m.route(u.reshape(-1, 8))
    assert experts.shape == (N, k)
    assert all(len(set(row)) == k for row in experts.tolist())
    torch.testing.assert_close(gates.sum(-1), torch.ones(N))
    m(u)
    s = m.last_stats
    assert s["counts"].sum().item() == N * k
    assert s["dropped"] == 0
    torch.testing.assert_close(s["load"].sum(), torch.tensor(float(k)))
    expected_counts = torch.bincount(experts.reshape(-1), minlength=E)
    assert torch.equal(s["counts"], expected_counts)


def test_balance_loss_hand_computed():
    # 4 tokens, 2 experts, top-1: assignments 0,0,0,1 -> f = (3/4, 1/4)
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]])
    experts = probs.argmax(-1, keepdim=True)
    # P = (0.65, 0.35); balance = 2 * (0.75 * 0.65 + 0.25 * 0.35) = 1.15
    torch.testing.assert_close(load_balancing_loss(probs, experts, 2), torch.tensor(1.15))
    # top-2 of 3 experts: slots (0,1), (0,2) -> f = (2/4, 1/4, 1/4)
    probs3 = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.1, 0.3]])
    experts3 = torch.tensor([[0, 1], [0, 2]])
    # P = (0.55, 0.2, 0.25); balance = 3 * (0.5*0.55 + 0.25*0.2 + 0.25*0.25) = 1.1625
    torch.testing.assert_close(load_balancing_loss(probs3, experts3, 3), torch.tensor(1.1625))


def test_balance_is_one_for_uniform_router_and_gradient_only_through_probs():
    m = make(E=4, k=2)
    with torch.no_grad():
        m.router.weight.zero_()
    m.train()
    m(torch.randn(3, 5, 8))
    # P uniform -> E * sum_e f_e / E = sum_e f_e = 1, whatever the tie-breaking gave f
    torch.testing.assert_close(m.last_stats["balance_loss"], torch.tensor(1.0))
    torch.testing.assert_close(m.last_stats["entropy"], torch.tensor(math.log(4)))
    # z-loss with zero logits: logsumexp = log E
    torch.testing.assert_close(m.last_stats["z_loss"], torch.tensor(math.log(4) ** 2))
    probs = torch.full((3, 2), 0.5, requires_grad=True)
    load_balancing_loss(probs, torch.tensor([[0], [0], [1]]), 2).backward()
    # d/dp_{n,e} = E * f_e / N: f = (2/3, 1/3)
    torch.testing.assert_close(
        probs.grad, torch.tensor([[2 * (2 / 3) / 3, 2 * (1 / 3) / 3]]).expand(3, 2)
    )


def test_z_loss_hand_computed():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    # logsumexp: log 2, log 4 -> mean of squares
    expected = (math.log(2.0) ** 2 + math.log(4.0) ** 2) / 2
    torch.testing.assert_close(router_z_loss(logits), torch.tensor(expected))


def test_aux_loss_is_weighted_sum_in_training_and_none_in_eval():
    m = make(aux_loss_coef=0.3, z_loss_coef=0.07)
    u = torch.randn(2, 6, 8)
    m.train()
    m(u)
    x = u.reshape(-1, 8)
    logits, probs, experts, _ = m.route(x)
    expected = 0.3 * load_balancing_loss(probs, experts, 4) + 0.07 * router_z_loss(logits)
    torch.testing.assert_close(m.last_aux_loss, expected)
    m.eval()
    m(u)
    assert m.last_aux_loss is None
    assert "balance_loss" in m.last_stats


def test_router_runs_in_float32_under_bf16_autocast():
    m = make()
    u = torch.randn(2, 4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, probs, _, gates = m.route(u.reshape(-1, 8))
        v = m(u)
    assert logits.dtype == probs.dtype == gates.dtype == torch.float32
    assert v.shape == (2, 4, 12)
    with torch.no_grad():
        ref = m(u)
    torch.testing.assert_close(v.float(), ref, atol=3e-2, rtol=5e-2)


def test_gradients_reach_router_and_experts():
    m = make(E=4, k=2)
    m.train()
    u = torch.randn(4, 8, 8, requires_grad=True)
    v = m(u)
    (v.square().mean()).backward()  # task loss alone: router learns through the gates
    assert m.router.weight.grad is not None and m.router.weight.grad.abs().sum() > 0
    for p in (m.w_in, m.w_out, m.b_in, m.b_out):
        assert p.grad is not None and p.grad.abs().sum() > 0
    used = m.last_stats["counts"] > 0
    assert (m.w_in.grad.abs().sum((1, 2)) > 0).eq(used).all()  # exactly the routed experts
    assert u.grad is not None and u.grad.abs().sum() > 0
    m.zero_grad()
    m(u.detach())
    m.last_aux_loss.backward()  # aux loss alone: the router only
    assert m.router.weight.grad.abs().sum() > 0
    assert m.w_in.grad is None or m.w_in.grad.abs().sum() == 0


def _max_load(m: MoEValues, u: torch.Tensor) -> float:
    with torch.no_grad():
        m(u)
    return float(m.last_stats["load"].max())


def _train_skewed_router(k: int, aux_loss_coef: float, task: bool) -> tuple[float, float, float]:
    """Start with (nearly) every token routed to expert 0 (and 1 for k=2), train 200 Adam steps on
    the aux loss (plus, with ``task``, a regression loss on v through all parameters); return the
    max expert load (fraction of tokens, uniform = k / E) before and after, and the final balance."""
    d, E = 16, 4
    m = make(d=d, d_out=8, E=E, k=k, h=8, aux_loss_coef=aux_loss_coef, z_loss_coef=1e-3)
    g = torch.Generator().manual_seed(1)
    direction = torch.ones(d) / math.sqrt(d)
    u = torch.randn(512, d, generator=g) + 3.0 * direction
    target = torch.randn(512, 8, generator=g)
    with torch.no_grad():
        m.router.weight[0] += 3.0 * direction
        if k == 2:
            m.router.weight[1] += 2.0 * direction
    before = _max_load(m, u)
    opt = torch.optim.Adam(m.parameters() if task else m.router.parameters(), lr=0.01)
    m.train()
    for _ in range(200):
        opt.zero_grad()
        v = m(u)
        loss = m.last_aux_loss + (F.mse_loss(v, target) if task else 0.0)
        loss.backward()
        opt.step()
    return before, _max_load(m, u), float(m.last_stats["balance_loss"])


@pytest.mark.parametrize(
    "k,task,start,end", [(1, False, 0.9, 0.4), (2, False, 0.95, 0.6), (1, True, 0.9, 0.4)]
)
def test_routing_balances_under_aux_loss(k, task, start, end):
    before, after, balance = _train_skewed_router(k, aux_loss_coef=1.0, task=task)
    assert before > start
    assert after < end, (before, after)
    assert balance < 1.1


def test_routing_stays_skewed_without_balance_loss():
    """Control: with aux_loss_coef = 0 (z-loss alone) the same run does not balance."""
    before, after, _ = _train_skewed_router(1, aux_loss_coef=0.0, task=False)
    assert before > 0.9 and after > 0.9


def test_active_and_total_params_exact():
    d, d_out, E, k, h = 8, 12, 4, 2, 16
    m = make(d=d, d_out=d_out, E=E, k=k, h=h, bias=True)
    expert = d * h + h + h * d_out + d_out
    assert m.total_params() == d * E + E * expert == sum(p.numel() for p in m.parameters())
    assert m.active_params() == d * E + k * expert
    assert m.active_params() < m.total_params()
    nb = make(d=d, d_out=d_out, E=E, k=k, h=h, bias=False)
    assert nb.active_params() == d * E + k * (d * h + h * d_out)
    assert nb.total_params() == sum(p.numel() for p in nb.parameters())
    assert nb.flops_per_token() == 2 * d * E + k * (2 * d * h + 2 * h * d_out)
    full = make(d=d, d_out=d_out, E=E, k=E, h=h)
    assert full.active_params() == full.total_params()


def test_hidden_defaults_to_d_model_and_init():
    torch.manual_seed(0)
    m = MoEValues(MoEValues.Options(kind="moe", n_experts=8, top_k=2), moe_dims(64, 32, True))
    assert m.w_in.shape == (8, 64, 64) and m.w_out.shape == (8, 64, 32)
    assert abs(m.w_in.std().item() - 0.02) < 2e-3
    assert abs(m.router.weight.std().item() - 0.02) < 4e-3
    assert m.b_in.abs().sum() == 0 and m.b_out.abs().sum() == 0


def test_top_k_above_n_experts_is_user_error():
    opts = MoEValues.Options(kind="moe", n_experts=2, top_k=3)  # built directly: no config check
    with pytest.raises(UserError, match="top_k=3"):
        MoEValues(opts, moe_dims(8, 8, False))
    with pytest.raises(UserError, match="top_k=3 exceeds"):
        load_config("tiny-moe-values", ["model.value.top_k=3", "model.value.n_experts=2"])


def test_single_expert_is_a_plain_mlp():
    m = make(E=1, k=1, bias=True)
    scale_up(m)
    u = torch.randn(2, 3, 8)
    with torch.no_grad():
        expected = F.gelu(u @ m.w_in[0] + m.b_in[0]) @ m.w_out[0] + m.b_out[0]
        torch.testing.assert_close(m(u), expected)


def test_impl_choice_and_alignment_error():
    m = make(d=8, d_out=12, h=16)
    x = torch.randn(4, 8)
    assert m._impl_for(x, torch.float32) == "grouped"  # auto on CPU in fp32: grouped_mm
    assert m._impl_for(x, torch.bfloat16) == "loop"  # 12 bf16 = 24 bytes: not aligned
    assert m._impl_for(x.double(), torch.float64) == "loop"  # grouped_mm has no float64
    assert make(d=6, d_out=12, h=16)._impl_for(torch.randn(4, 6), torch.float32) == "loop"
    m.impl = "loop"
    assert m._impl_for(x, torch.float32) == "loop"
    m.impl = "grouped"
    assert m._impl_for(x, torch.float32) == "grouped"  # 12 fp32 = 48 bytes: aligned
    with pytest.raises(UserError, match="multiple of 16 bytes"):
        m._impl_for(x, torch.bfloat16)  # 12 bf16 = 24 bytes
    with pytest.raises(UserError, match=r"'model\.value\.impl' = 'dense' is not allowed"):
        load_config("tiny-moe-values", ["model.value.impl=dense"])


def test_grouped_path_compiles_as_one_graph_in_bf16():
    """No host sync in the grouped path: fullgraph=True would fail on a graph break."""
    torch._dynamo.reset()
    m = make(d=16, d_out=16, h=16, E=4, k=2)
    m.impl = "grouped"
    m.train()
    u = torch.randn(2, 8, 16)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        v = compiled(u)
        aux = m.last_aux_loss
        ref = m(u)
    assert v.dtype == torch.bfloat16
    torch.testing.assert_close(v, ref)
    torch.testing.assert_close(aux, m.last_aux_loss)
    (v.float().sum() + aux).backward()
    assert m.w_in.grad.abs().sum() > 0 and m.router.weight.grad.abs().sum() > 0
