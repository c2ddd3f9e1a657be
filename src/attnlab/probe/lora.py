"""LoRA baselines through PEFT, with the rank solved against the *actual* parameter count.

LoRA on a projection ``W: in -> out`` adds ``A: r x in`` and ``B: out x r`` (``r (in + out)``
params, B = 0 at init so the base is unchanged). Over the targeted modules the count is
``r * sum(in + out)``; ``solve_rank`` picks the integer ``r`` whose count is nearest to a budget,
and the count after ``get_peft_model`` is what gets reported.

Why "actual": seed 000 chose r = 480 for Pythia-160M, which fits N / (4 d L) with N = 17.7M, the
pre-projection count, i.e. as if LoRA sat on two d x d matrices per layer (4 d r). GPT-NeoX's
targets are query_key_value (d -> 3d) and dense (d -> d), 6 d r per layer, so that LoRA had 26.5M
parameters, 1.5x its target. :func:`naive_rank` reproduces that formula for the report.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any

from torch import nn

from attnlab.base.errors import UserError
from attnlab.base.params import n_params
from attnlab.probe.arch import ArchSpec, Dims
from attnlab.probe.config import LoraOptions


def _shape(module: nn.Module) -> tuple[int, int]:
    """(in, out) of an nn.Linear or a transformers Conv1D (whose weight is stored in x out)."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and weight is not None and weight.ndim == 2:
        return int(weight.shape[0]), int(weight.shape[1])
    raise UserError(
        f"LoRA target {type(module).__name__} is neither a Linear nor a Conv1D; choose other "
        "lora.targets"
    )


def target_modules(model: nn.Module, spec: ArchSpec, targets: list[str]) -> dict[str, nn.Module]:
    """Full names -> modules of the LoRA targets (``targets`` or the architecture's q/k/v/o)
    inside every attention block of ``model`` (a plain transformers model)."""
    wanted = tuple(targets) or spec.lora_targets
    prefix = spec.layers
    out: dict[str, nn.Module] = {}
    for i, block in enumerate(spec.layer_list(model)):
        attn = spec.attention_of(block)
        for t in wanted:
            try:
                m = attn.get_submodule(t)
            except AttributeError:
                have = sorted(n for n, c in attn.named_modules() if n and not list(c.children()))
                raise UserError(
                    f"lora.targets: the attention block has no module {t!r}; it has "
                    f"{', '.join(have)}"
                ) from None
            _shape(m)
            out[f"{prefix}.{i}.{spec.attention}.{t}"] = m
    return out


def params_per_rank(modules: dict[str, nn.Module]) -> int:
    """sum(in + out) over the targets: LoRA parameters per unit of rank."""
    return sum(sum(_shape(m)) for m in modules.values())


def solve_rank(budget: int, per_rank: int) -> int:
    """The rank whose count ``r * per_rank`` is nearest ``budget`` (at least 1)."""
    if per_rank <= 0:
        raise UserError("no LoRA targets found")
    r = max(1, round(budget / per_rank))
    if budget < per_rank / 2:
        raise UserError(
            f"a LoRA budget of {budget:,} parameters is below half of rank 1 ({per_rank:,}); "
            "match a larger method or drop the '@' target"
        )
    return r


def naive_rank(budget: int, dims: Dims) -> int:
    """The rank of the formula r = N / (4 d L) (two d x d targets per layer): see module doc."""
    return max(1, round(budget / (4 * dims.d_model * dims.n_layers)))


@dataclass(frozen=True)
class LoraPlan:
    """The rank chosen and why; ``actual`` is filled in after ``get_peft_model``."""

    rank: int
    alpha: float
    targets: list[str]
    per_rank: int
    budget: int | None = None
    matched_to: str | None = None
    naive_rank: int | None = None
    naive_params: int | None = None

    @property
    def expected(self) -> int:
        return self.rank * self.per_rank

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"expected": self.expected}


def plan_lora(
    modules: dict[str, nn.Module],
    opts: LoraOptions,
    dims: Dims,
    budget: int | None = None,
    matched_to: str | None = None,
) -> LoraPlan:
    """The rank: ``opts.rank``, or solved so the LoRA count is nearest ``budget``."""
    per_rank = params_per_rank(modules)
    rank = opts.rank if budget is None else solve_rank(budget, per_rank)
    naive = naive_rank(budget, dims) if budget is not None else None
    return LoraPlan(
        rank=rank,
        alpha=float(opts.alpha if opts.alpha is not None else rank),
        targets=sorted(modules),
        per_rank=per_rank,
        budget=budget,
        matched_to=matched_to,
        naive_rank=naive,
        naive_params=naive * per_rank if naive is not None else None,
    )


def apply_lora(model: nn.Module, plan: LoraPlan, opts: LoraOptions) -> Any:
    """``peft.get_peft_model`` with ``plan``'s rank on its exact target modules."""
    from attnlab.base.extras import require

    require("probe", "peft", what="a LoRA probe")
    from peft import LoraConfig, get_peft_model

    conv1d = any(
        type(m).__name__ == "Conv1D" for n, m in model.named_modules() if n in set(plan.targets)
    )
    config = LoraConfig(
        r=plan.rank,
        lora_alpha=plan.alpha,
        lora_dropout=opts.dropout,
        target_modules=list(plan.targets),
        fan_in_fan_out=conv1d,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():  # peft asks transformers a deprecated question, not our call
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        return get_peft_model(model, config)


def lora_count(model: nn.Module) -> int:
    """Parameters of the LoRA adapter layers actually present (``lora_A``/``lora_B``)."""
    return n_params(p for n, p in model.named_parameters() if ".lora_" in n)
