"""Routed mixture-of-experts value projection (seed 004, "One MoE V"; SPEC 1.4).

v = MoE(u) replaces v = u W_V inside the looped (universal) attention layer, so each loop can call
on different experts. With N tokens u_n in R^d, E experts, top-k routing:

    router     z_n = u_n W_r                      W_r: d x E, no bias, in float32 (or wider)
               p_n = softmax(z_n)
    top-k      S_n = the k experts with the largest p_n,e (dropless: every token gets all k)
    gates      g_n,e = p_n,e / sum_{e' in S_n} p_n,e'           (renormalised to sum to 1)
    expert e   y_e(u) = act(u W1_e + b1_e) W2_e + b2_e          W1_e: d x h, W2_e: h x d_out
    output     v_n = sum_{e in S_n} g_n,e y_e(u_n)

Auxiliary losses (``last_aux_loss = aux_loss_coef * balance + z_loss_coef * z`` in training):

    balance = E * sum_e f_e P_e      (Switch Transformer / GShard form)
              f_e = #{(n, j): S_n[j] = e} / (N k)   fraction of token-slots sent to e (no gradient)
              P_e = (1/N) sum_n p_n,e               mean router probability of e (carries gradient)
              = 1 for uniform routing (indeed whenever P is uniform); the gradient lowers P_e in
              proportion to f_e, so over-loaded experts lose tokens.
    z       = (1/N) sum_n logsumexp(z_n)^2           (ST-MoE router z-loss: keeps logits small)

Cost per token (forward matmul FLOPs): router 2dE, experts k (2dh + 2h d_out).
Params: router dE; each expert dh + h d_out (+ h + d_out with biases); active per token
dE + k (dh + h d_out [+ h + d_out]) of dE + E (...) in total.

Dispatch (``moe_dispatch.py``): the N k (token, expert) slots are sorted by expert (stable), the
token rows gathered into one [N k, d] matrix whose row blocks belong to consecutive experts, each
block multiplied by its expert's weights, and the results gathered back and gate-weighted; the
gradients of both moves are gathers too (no scatter-add). ``impl`` picks how the blocks run:

- ``grouped``: ``torch.nn.functional.grouped_mm`` with int32 offsets, one call per matrix forward
  and per gradient, no host sync. Eager on CPU (float32) and CUDA; under ``torch.compile`` bf16
  only (traces with ``fullgraph=True``). Needs rows of a multiple of 16 bytes (d, h, d_out
  divisible by 4 in fp32, 8 in bf16).
- ``loop``: a Python loop over E, one matmul pair per expert. Reads the block sizes on the host
  (a device sync, a graph break under ``torch.compile``); any width, any dtype (float64 too).
- ``auto`` (default): ``grouped`` where it runs (CUDA bf16; CPU float32 eager) with aligned
  widths, else ``loop``. At the CPU bench shape (d = h = 256, E = 8, k = 2, 2048 tokens, 2
  threads) grouped and the loop cost about the same per token; a [E, C, d] batch padded to the
  largest block (``torch.bmm``) cost 1.37x the loop's step (benchmarks/results/, 2026-11-23).

Init: router and expert weights N(0, the model's init std), biases 0.

Tensor parallelism (``tp_plan``): the experts split by expert, rank r of P holding experts
[r E/P, (r+1) E/P) and running only the sorted slots routed to them (a contiguous block); the
router stays whole on every rank. v is the sum over ranks of each rank's experts' share (one
all-reduce of [N, d_out]); backward, the gradients of the input and the router are summed over
the ranks, and the auxiliary losses (computed whole on every rank) count 1/P on each, so the
sum is theirs once. E must be a multiple of P, else the part stays whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from attnlab.base.errors import UserError
from attnlab.base.schema import Activation
from attnlab.model.activations import make_activation
from attnlab.model.linear import Linear
from attnlab.model.parts.moe_dispatch import (
    combine,
    dispatch,
    experts_grouped,
    experts_loop,
    sort_by_expert,
)
from attnlab.parts import Dims, Init, PartOptions, ValuePart, WidthScaling, families, register
from attnlab.parts.tp import TPPlan, is_split, local, shard_range, summed, summed_grad

Impl = Literal["auto", "loop", "grouped"]
IMPLS: tuple[str, ...] = get_args(Impl)


def load_balancing_loss(probs: Tensor, experts: Tensor, n_experts: int) -> Tensor:
    """Switch/GShard balance loss E * sum_e f_e P_e.

    probs [N, E] router probabilities; experts [N, k] chosen expert ids. f (token-slot fractions)
    carries no gradient, P (mean probabilities) does. Equals 1 when P is uniform, whatever f is.
    """
    slots = experts.numel()
    counts = torch.zeros(n_experts, dtype=probs.dtype, device=probs.device)
    counts.scatter_add_(
        0, experts.reshape(-1), torch.ones_like(experts.reshape(-1), dtype=probs.dtype)
    )
    f = counts / slots
    P = probs.mean(0)
    return n_experts * (f * P).sum()


def router_z_loss(logits: Tensor) -> Tensor:
    """ST-MoE z-loss: mean over tokens of logsumexp(z_n)^2; logits [N, E]."""
    return torch.logsumexp(logits, dim=-1).square().mean()


def _share(loss: Tensor, like: Tensor) -> Tensor:
    """``loss`` itself, its gradient 1/P on each of the P ranks of ``like``'s mesh: an
    auxiliary loss computed whole on every rank, whose gradients the ranks then sum (the
    router's and the input's, :func:`summed_grad`)."""
    if not is_split(like):
        return loss
    p = like.device_mesh.size()
    return loss / p + (loss - loss / p).detach()


def _compute_dtype(x: Tensor) -> torch.dtype:
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return x.dtype


@register("value", "moe")
class MoEValues(ValuePart):
    """u [..., d_model] -> v [..., d_out] through top-k of E expert MLPs (dropless).

    After each forward: ``last_aux_loss`` (training only, else None) and ``last_stats`` (detached
    tensors: ``counts`` [E] token-slots per expert, ``load`` [E] fraction of tokens sent to each
    expert (sums to k), ``entropy`` mean router entropy in nats, ``balance_loss``, ``z_loss``, and
    ``dropped`` = 0). A module called several times per model step (the universal loop) collects
    every call's auxiliary loss until ``pop_aux_losses``.
    """

    param_label = "moe_values"
    width_option = "expert_hidden"
    cost = (
        "params d*E + E*(d*h + h*d_kv); active d*E + k*(d*h + h*d_kv); FLOPs 2dE + 2k(dh + h d_kv)"
    )

    class Options(PartOptions):
        n_experts: int = Field(8, ge=1)
        top_k: int = Field(2, ge=1)
        expert_hidden: int | None = Field(None, ge=1, description="None = d_model")
        activation: Activation = "gelu"
        aux_loss_coef: float = Field(0.01, ge=0)
        z_loss_coef: float = Field(1e-3, ge=0)
        impl: Impl = Field("auto", description="expert blocks: auto, grouped or loop")

        def check(self, model) -> list[str]:
            out = []
            if self.top_k > self.n_experts:
                out.append(
                    f"model.value.top_k={self.top_k} exceeds model.value.n_experts="
                    f"{self.n_experts}; lower top_k or add experts"
                )
            plans = families.of(model).stacks(model)
            if [(p.causal, p.cross) for p in plans] != [(True, False)]:
                out.append(
                    "model.value.kind='moe' is implemented for model.family='decoder' only, or a "
                    "family of one causal stack without cross-attention like it; model.family="
                    f"{model.family!r} has {', '.join(p.describe() for p in plans)}"
                )
            return out

    last_aux_loss: Tensor | None
    last_stats: dict

    @classmethod
    def param_count(cls, opts: Options, dims: Dims) -> int:
        d, E, d_out = dims.d_model, opts.n_experts, dims.d_kv
        h = opts.expert_hidden or d
        return d * E + E * (d * h + h * d_out + (h + d_out if dims.bias else 0))

    def __init__(self, opts: Options, dims: Dims) -> None:
        super().__init__(opts, dims)
        if opts.top_k > opts.n_experts:
            raise UserError(
                f"model.value.top_k={opts.top_k} exceeds model.value.n_experts="
                f"{opts.n_experts}; lower top_k or add experts"
            )
        if opts.impl not in IMPLS:
            raise UserError(f"MoEValues impl={opts.impl!r}; choose one of {', '.join(IMPLS)}")
        self.d_model, self.d_out = dims.d_model, dims.d_kv
        self.n_experts, self.top_k = opts.n_experts, opts.top_k
        self.hidden = opts.expert_hidden or dims.d_model
        self.aux_loss_coef, self.z_loss_coef = opts.aux_loss_coef, opts.z_loss_coef
        self.impl: Impl = opts.impl
        E, h = self.n_experts, self.hidden

        self.router = Linear(self.d_model, E, bias=False)
        self.w_in = nn.Parameter(torch.empty(E, self.d_model, h))
        self.w_out = nn.Parameter(torch.empty(E, h, self.d_out))
        self.b_in = nn.Parameter(torch.empty(E, h)) if dims.bias else None
        self.b_out = nn.Parameter(torch.empty(E, self.d_out)) if dims.bias else None
        self.act = make_activation(opts.activation)
        self.last_aux_loss = None
        self._aux: list[Tensor] = []
        self.last_stats = {}
        self.init_weights(Init())

    @torch.no_grad()
    def init_weights(self, init: Init) -> None:
        nn.init.normal_(self.router.weight, std=init.std)
        nn.init.normal_(self.w_in, std=init.std)
        nn.init.normal_(self.w_out, std=init.std)
        for b in (self.b_in, self.b_out):
            if b is not None:
                nn.init.zeros_(b)

    def width_scaling(self) -> dict[str, WidthScaling]:
        """µP: the stacked experts are [E, in, out] (fan-in is dimension 1 of each expert, not
        of the stack) and the stacked biases are vectors per expert."""
        return {
            "w_in": WidthScaling("hidden", fan_in_dim=1),
            "w_out": WidthScaling("hidden", fan_in_dim=1),
            "b_in": WidthScaling("input"),
            "b_out": WidthScaling("input"),
        }

    def tp_plan(self) -> TPPlan:
        """Experts split by expert (rank r holds experts [r E/P, (r+1) E/P) and runs the token
        slots routed to them); the router whole on every rank, its gradient summed; v summed
        over the ranks (one all-reduce), then each rank keeps its KV heads."""
        stacked = ("w_in", "w_out", "b_in", "b_out")
        experts = {n: 0 for n in stacked if getattr(self, n) is not None}
        return TPPlan(tensors=experts, summed=("router.weight",), whole_output=True)

    def no_decay_parameters(self) -> Iterable[nn.Parameter]:
        """The stacked per-expert biases: 2-D only because the experts are stacked."""
        return [b for b in (self.b_in, self.b_out) if b is not None]

    def pop_aux_losses(self) -> list[Tensor]:
        out, self._aux = self._aux, []
        return out

    def notes(self) -> list[str]:
        return [f"moe_values: {self.top_k} of {self.n_experts} experts active per token"]

    # ------------------------------------------------------------------------------ accounting

    def _expert_params(self) -> int:
        per = self.d_model * self.hidden + self.hidden * self.d_out
        return per + (self.hidden + self.d_out if self.b_in is not None else 0)

    def total_params(self) -> int:
        """Router dE + E experts."""
        return self.d_model * self.n_experts + self.n_experts * self._expert_params()

    def active_params(self) -> int:
        """Params touched per token: router dE + top_k experts."""
        return self.d_model * self.n_experts + self.top_k * self._expert_params()

    def flops_per_token(self, seq_len: int = 0) -> int:
        """Forward matmul FLOPs per token: 2dE + k (2dh + 2h d_out)."""
        d, h, E, k = self.d_model, self.hidden, self.n_experts, self.top_k
        return 2 * d * E + k * (2 * d * h + 2 * h * self.d_out)

    # --------------------------------------------------------------------------------- routing

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """x [N, d] -> (logits, probs [N, E], experts [N, k], gates [N, k]); float32 or wider."""
        rdtype = torch.promote_types(x.dtype, torch.float32)
        weight = summed_grad(self.router.weight, self.w_in)  # split experts: partial gradients
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(x.to(rdtype), weight.to(rdtype))
        probs = torch.softmax(logits, dim=-1)
        top_p, experts = probs.topk(self.top_k, dim=-1)
        gates = top_p / top_p.sum(-1, keepdim=True)
        return logits, probs, experts, gates

    def _aligned(self, dtype: torch.dtype) -> bool:
        size = torch.empty((), dtype=dtype).element_size()
        return all(w * size % 16 == 0 for w in (self.d_model, self.hidden, self.d_out))

    def _grouped_runs(self, x: Tensor, dtype: torch.dtype) -> str | None:
        """Why ``grouped_mm`` cannot run this call (None: it can)."""
        if not hasattr(F, "grouped_mm"):
            return "this torch lacks torch.nn.functional.grouped_mm"
        if dtype not in (torch.bfloat16, torch.float32) or not self._aligned(dtype):
            return (
                f"it needs bf16/fp32 rows of a multiple of 16 bytes; d_model={self.d_model}, "
                f"hidden={self.hidden}, d_out={self.d_out} in {dtype} are not"
            )
        if dtype != torch.bfloat16 and torch.compiler.is_compiling():
            return f"under torch.compile it takes bf16 only, not {dtype}"
        return None

    def _impl_for(self, x: Tensor, dtype: torch.dtype) -> Impl:
        """The expert-block implementation this call runs (``impl``, with ``auto`` resolved)."""
        why = self._grouped_runs(x, dtype)
        if self.impl == "grouped" and why is not None:
            raise UserError(
                f"MoEValues impl='grouped' cannot run: {why}. Use impl='loop' (or 'auto')"
            )
        if self.impl != "auto":
            return self.impl
        fast = (x.device.type == "cuda" and dtype == torch.bfloat16) or (
            x.device.type == "cpu" and dtype == torch.float32
        )
        return "grouped" if fast and why is None else "loop"

    # --------------------------------------------------------------------------------- forward

    def forward(self, u: Tensor) -> Tensor:
        """u [..., d_model] -> v [..., d_out]."""
        if u.shape[-1] != self.d_model:
            raise ValueError(f"MoEValues expects width {self.d_model}, got {u.shape[-1]}")
        lead = u.shape[:-1]
        x = summed_grad(u.reshape(-1, self.d_model), self.w_in)  # each rank: its experts' share
        N, k, E = x.shape[0], self.top_k, self.n_experts

        logits, probs, experts, gates = self.route(x)
        order, inverse, expert_sorted = sort_by_expert(experts)
        counts = torch.zeros(E, dtype=torch.long, device=x.device)
        counts.scatter_add_(0, expert_sorted, torch.ones_like(expert_sorted))
        x_sorted = dispatch(x, order, inverse, k)

        y_sorted = self._experts(x, x_sorted, counts, expert_sorted)
        y = combine(y_sorted, order, inverse).view(N, k, self.d_out)
        v = summed((y * gates.unsqueeze(-1).to(y.dtype)).sum(1), self.w_in)

        balance = load_balancing_loss(probs, experts, E)
        z = router_z_loss(logits)
        self.last_aux_loss = (
            _share(self.aux_loss_coef * balance + self.z_loss_coef * z, self.w_in)
            if self.training
            else None
        )
        if self.last_aux_loss is not None:
            self._aux.append(self.last_aux_loss)
        with torch.no_grad():
            entropy = -(probs * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
        if self.recording:  # the first sequence's router probabilities, for attnlab inspect
            self._token_probs = probs.detach().float().reshape(*lead, E).reshape(-1, E)
            if len(lead) > 1:
                self._token_probs = self._token_probs[: lead[-1]]
        self.last_stats = {
            "counts": counts.detach(),
            "load": counts.detach().float() / max(N, 1),
            "entropy": entropy,
            "balance_loss": balance.detach(),
            "z_loss": z.detach(),
            "dropped": 0,
        }
        return v.reshape(*lead, self.d_out)

    def _experts(self, x: Tensor, x_sorted: Tensor, counts: Tensor, expert_sorted: Tensor):
        """y_sorted [N k, d_out]: every slot's expert output; with the experts split over ranks,
        this rank's experts' slots (a contiguous block of the sorted slots) and zeros elsewhere."""
        lo, hi = shard_range(self.w_in)
        slots, start, end = x_sorted.shape[0], None, 0
        if is_split(self.w_in):
            ends = counts.cumsum(0).tolist()
            start, end = (ends[lo - 1] if lo else 0), ends[hi - 1]
            x_sorted, counts = x_sorted[start:end], counts[lo:hi]
            expert_sorted = expert_sorted[start:end] - lo
        weights = (local(self.w_in), local(self.b_in) if self.b_in is not None else None)
        weights += (local(self.w_out), local(self.b_out) if self.b_out is not None else None)
        dtype = _compute_dtype(x)
        if self._impl_for(x, dtype) == "grouped":
            y = experts_grouped(x_sorted, counts, expert_sorted, *weights, self.act, dtype)
        else:
            y = experts_loop(x_sorted, counts, *weights, self.act)
        if start is None:
            return y
        return F.pad(y, (0, 0, start, slots - end))

    def train_stats(self) -> dict[str, float | Tensor]:
        """Of the last training forward: each expert's share of the token-slots (``load/eI``,
        1/E each when balanced), ``load_imbalance`` = max_e load_e / mean_e load_e (1 when
        balanced, E/k when all tokens go to the same k experts) and the router entropy."""
        stats = self.last_stats
        if not stats or "load" not in stats:
            return {}
        share = stats["load"] / max(self.top_k, 1)
        out: dict[str, float | Tensor] = {f"moe_load/e{e}": share[e] for e in range(len(share))}
        out["moe_load_imbalance"] = share.max() / share.mean().clamp_min(1e-12)
        out["moe_router_entropy"] = stats["entropy"]
        return out

    @classmethod
    def train_stats_doc(cls) -> dict[str, str]:
        return {
            "moe_load_imbalance": "max over experts of the token-slot share / the mean share "
            "(1 = balanced)",
            "moe_router_entropy": "mean router entropy in nats (log E for a uniform router)",
        }

    def forward_stats(self) -> dict[str, Tensor]:
        probs = self.__dict__.get("_token_probs")
        stats = self.last_stats
        if probs is None or "load" not in stats:
            return {}
        return {"expert_load": (stats["load"] / max(self.top_k, 1)).float()}

    @classmethod
    def forward_stats_doc(cls) -> dict[str, tuple[str, list[str] | None]]:
        return {"expert_load": ("Share of the token-slots each expert received", None)}

    def token_stats(self) -> dict[str, Tensor]:
        probs = self.__dict__.get("_token_probs")
        return {} if probs is None else {"router_probs": probs}

    @classmethod
    def token_stats_doc(cls) -> dict[str, tuple[str, list[str] | None]]:
        return {"router_probs": ("Router probabilities per token over the experts", None)}

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, d_out={self.d_out}, n_experts={self.n_experts}, "
            f"top_k={self.top_k}, hidden={self.hidden}, impl={self.impl}"
        )
