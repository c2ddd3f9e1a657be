"""Which weights of a model are quantized, and why every other one is kept in full precision.

The parts decide: each :class:`~attnlab.parts.Part` declares ``quantizable()`` (its Linears
that may be stored in low precision; by default those with at least ``QUANT_MIN_FEATURES``
inputs and outputs) and ``full_precision_notes()`` (why it keeps the rest). Outside the parts,
the model's own weights follow one rule each: the token and position embeddings are lookups,
not matmuls (kept); the LM head is quantized when it has its own weight and kept when it is
tied to the token embedding (``model.tie_embeddings``: quantizing it would quantize the
lookups too), unless ``tied_head=True``: then the head is quantized as its own copy of the
embedding (:func:`attnlab.quant.apply.quantize_model` unties it) and the lookups stay float.
Biases stay float beside a quantized weight and are not listed.

Cost: one walk over the model's modules and parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from attnlab.parts.part import QUANT_MIN_FEATURES, Part, own_linears


@dataclass
class Plan:
    """``quantized``: the module names (``decoder.blocks.0.ffn.w_in``) whose weight is quantized;
    ``kept``: every other weight tensor -> why it stays in full precision."""

    quantized: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)

    def kept_rows(self) -> list[dict[str, str]]:
        return [{"name": k, "reason": v} for k, v in self.kept.items()]


def _parts(model: nn.Module) -> list[tuple[str, Part]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, Part)]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix and name else prefix or name


def _linear_reason(m: nn.Linear, kind: str) -> str:
    if min(m.in_features, m.out_features) < QUANT_MIN_FEATURES:
        return (
            f"a {m.out_features}x{m.in_features} Linear, below the {QUANT_MIN_FEATURES} inputs "
            "and outputs quantized by default (gates and routers stay exact)"
        )
    return f"the {kind} part keeps it in full precision (its quantizable() leaves it out)"


def _part_reasons(prefix: str, part: Part, chosen: set[str]) -> dict[str, str]:
    """Why each weight of ``part`` (not of parts nested in it) that is not quantized is kept."""
    notes = part.full_precision_notes()
    kind = f"{part.slot}.{part.kind}" if part.slot else type(part).__name__
    out = {}
    linears = own_linears(part)
    nested = [n for n, m in part.named_modules() if n and isinstance(m, Part)]
    for name, p in part.named_parameters():
        if any(name.startswith(f"{n}.") for n in nested):
            continue
        owner, _, leaf = name.rpartition(".")
        full = _join(prefix, name)
        if owner in linears and leaf == "bias":
            continue
        if owner in linears and _join(prefix, owner) in chosen:
            continue
        note = notes.get(name) or notes.get(owner)
        if note is None and owner in linears:
            note = _linear_reason(linears[owner], kind)
        elif note is None and isinstance(part.get_submodule(owner), nn.Embedding):
            note = "an embedding: a table lookup, not a matmul"
        elif note is None and callable(getattr(part, "reset_norm", None)):
            note = "a norm's gain or bias: elementwise, a few numbers per layer"
        elif note is None:
            note = f"the {kind} part's own tensor {tuple(p.shape)} (not a Linear: a gate, scale or mixing matrix)"
        out[full] = note
    return out


#: why a tied LM head stays float when ``tied_head`` is off
TIED_HEAD_KEPT = (
    "the LM head, tied to the token embedding (model.tie_embeddings): quantizing it would "
    "quantize the embedding lookups too (tied_head=True quantizes a copy of it instead)"
)


def plan(model: nn.Module, tied_head: bool = False) -> Plan:
    """The quantization plan of an attnlab model (see the module docstring). ``tied_head``:
    quantize an LM head tied to the token embedding as its own copy (the biggest matmul of
    decoding: d x vocab), keeping the embedding's lookups in float."""
    result = Plan()
    parts = _parts(model)
    for prefix, part in parts:
        for name, lin in part.quantizable().items():
            if not isinstance(lin, nn.Linear):
                raise TypeError(
                    f"{type(part).__name__}.quantizable() returned {name!r}, not a Linear"
                )
            result.quantized.append(_join(prefix, name))
    chosen = set(result.quantized)
    for prefix, part in parts:
        result.kept.update(_part_reasons(prefix, part, chosen))
    in_parts = {_join(prefix, n) for prefix, part in parts for n, _ in part.named_parameters()}
    embed = getattr(model, "embed", None)
    for name, p in model.named_parameters(remove_duplicate=False):
        if name in in_parts or name in result.kept:
            continue
        owner = name.rpartition(".")[0]
        module = model.get_submodule(owner) if owner else model
        if name.endswith(".bias") and owner in chosen:
            continue
        if isinstance(module, nn.Embedding):
            result.kept[name] = "an embedding: a table lookup, not a matmul"
        elif isinstance(module, nn.Linear) and embed is not None and p is embed.weight:
            if not tied_head:
                result.kept[name] = TIED_HEAD_KEPT
            elif min(module.in_features, module.out_features) >= QUANT_MIN_FEATURES:
                result.quantized.append(owner)
            else:
                result.kept[name] = _linear_reason(module, "model")
        elif isinstance(module, nn.Linear) and name.endswith(".weight"):
            if min(module.in_features, module.out_features) >= QUANT_MIN_FEATURES:
                result.quantized.append(owner)
            else:
                result.kept[name] = _linear_reason(module, "model")
        elif not name.endswith(".bias"):
            result.kept[name] = f"a {type(module).__name__} tensor outside the parts"
    return result
