"""Assemble a probed model: load the base, freeze it, add LoRA (PEFT) and/or attnlab's parts.

Order: base -> every base parameter frozen -> LoRA via ``get_peft_model`` (which would freeze
anything already injected, so it comes first) -> ``inject`` -> only the injected and LoRA
parameters require gradients. With ``@TARGET`` the LoRA rank is solved so that this method's
trainable count (injected + LoRA) is nearest to ``TARGET``'s count on the same base.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from attnlab.base.errors import UserError
from attnlab.base.params import n_params
from attnlab.probe.arch import ArchSpec, Dims, arch_of, dims_of
from attnlab.probe.base import BaseSource, load_base, pick_dtype, resolve_base
from attnlab.probe.config import ProbeConfig
from attnlab.probe.inject import Injection, inject, injected_count, unwrap
from attnlab.probe.lora import (
    LoraPlan,
    apply_lora,
    lora_count,
    params_per_rank,
    plan_lora,
    target_modules,
)
from attnlab.probe.methods import Method

BaseProvider = tuple[nn.Module, Any] | Callable[[], tuple[nn.Module, Any]] | None


@dataclass
class ProbedModel:
    """A frozen base with its trainable additions, and the counts a report needs."""

    model: nn.Module
    tokenizer: Any
    source: BaseSource
    spec: ArchSpec
    dims: Dims
    method: Method
    injection: Injection | None
    lora: LoraPlan | None
    base_params: int
    fingerprint: dict[str, Any]

    @property
    def hf_model(self) -> nn.Module:
        """The transformers model (inside the PEFT wrapper when there is one)."""
        return unwrap(self.model)

    def trainable(self) -> list[tuple[str, nn.Parameter]]:
        """(name, parameter) of every trainable tensor, in a fixed order."""
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def counts(self) -> dict[str, Any]:
        trainable = n_params(p for _, p in self.trainable())
        injected = self.injection.num_parameters() if self.injection is not None else 0
        lora = lora_count(self.model) if self.lora is not None else 0
        out: dict[str, Any] = {
            "trainable": trainable,
            "injected": injected,
            "lora": lora,
            "base": self.base_params,
            "overhead": trainable / self.base_params if self.base_params else 0.0,
        }
        if self.lora is not None:
            out["lora_plan"] = self.lora.to_dict()
        return out


def base_fingerprint(model: nn.Module) -> dict[str, Any]:
    """Identifies a base: a hash of parameter names and shapes, and a checksum of the input
    embedding (to catch an adapter re-attached to different weights of the same shape)."""
    shapes = hashlib.sha256()
    for n, p in model.named_parameters():
        shapes.update(f"{n}:{tuple(p.shape)};".encode())
    emb = model.get_input_embeddings().weight.detach().double()
    return {
        "shapes_sha256": shapes.hexdigest(),
        "embedding_sum": float(emb.sum()),
        "embedding_abs_sum": float(emb.abs().sum()),
    }


def check_fingerprint(saved: dict[str, Any], now: dict[str, Any], where: str) -> None:
    """UserError unless ``now`` (:func:`base_fingerprint` of the loaded base) matches ``saved``."""
    if saved.get("shapes_sha256") not in (None, now["shapes_sha256"]):
        raise UserError(
            f"{where} was trained on a base with other parameter shapes; load it onto the base "
            "named in its probe.json"
        )
    ref = float(saved.get("embedding_abs_sum", now["embedding_abs_sum"]))
    if abs(ref - now["embedding_abs_sum"]) > 1e-4 * max(1.0, abs(ref)):
        raise UserError(
            f"{where} was trained on a base with other weights (embedding checksum "
            f"{ref:.6g} != {now['embedding_abs_sum']:.6g}); load it onto the same base"
        )


def freeze(model: nn.Module) -> None:
    for p in model.parameters():
        p.requires_grad_(False)


def method_budget(method: Method, dims: Dims, per_rank: int, cfg: ProbeConfig) -> int:
    """Trainable parameters ``method`` has on a base of shape ``dims`` (LoRA at ``cfg.lora.rank``)."""
    lora = per_rank * cfg.lora.rank if method.has("lora") else 0
    return injected_count(dims, method, cfg) + lora


def build_probed_model(
    cfg: ProbeConfig,
    device: torch.device | str = "cpu",
    base: BaseProvider = None,
) -> ProbedModel:
    """The base of ``cfg`` with ``cfg.method`` attached, on ``device``.

    ``base`` = a (model, tokenizer) already loaded from ``cfg.base`` (it is modified in place),
    or a callable returning one; the new parts are initialised from ``cfg.train.seed``.
    """
    device = torch.device(device)
    source = resolve_base(cfg.base.model, cfg.base.gguf_file, cfg.base.revision)
    if base is None:
        model, tokenizer = load_base(
            source,
            dtype=pick_dtype(cfg.base.dtype, device),
            attn_implementation=cfg.base.attn_implementation,
        )
    else:
        model, tokenizer = base() if callable(base) else base
    spec, dims = arch_of(model), dims_of(model)
    freeze(model)
    base_params = n_params(model)
    fingerprint = base_fingerprint(model)
    method = cfg.parsed_method
    torch.manual_seed(cfg.train.seed)
    plan = None
    if method.has("lora"):
        modules = target_modules(model, spec, cfg.lora.targets)
        budget = matched = None
        if method.lora_match is not None:
            per_rank = params_per_rank(modules)
            target = method_budget(method.lora_match, dims, per_rank, cfg)
            budget = target - injected_count(dims, method, cfg)
            matched = method.lora_match.name
            if budget <= 0:
                raise UserError(
                    f"method {method.name}: its own parts already have "
                    f"{injected_count(dims, method, cfg):,} parameters, at least the "
                    f"{target:,} of {matched}; nothing is left for LoRA"
                )
        plan = plan_lora(modules, cfg.lora, dims, budget, matched)
        model = apply_lora(model, plan, cfg.lora)
    injection = inject(model, method, cfg) if method.injects else None
    if injection is not None:
        for p in injection.parameters():
            p.requires_grad_(True)
    model.to(device)
    return ProbedModel(
        model=model,
        tokenizer=tokenizer,
        source=source,
        spec=spec,
        dims=dims,
        method=method,
        injection=injection,
        lora=plan,
        base_params=base_params,
        fingerprint=fingerprint,
    )
