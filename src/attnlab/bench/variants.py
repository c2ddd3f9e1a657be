"""The block variants a benchmark compares, as named ``--set`` override sets: the one list.

Each variant is the base config plus a few ``model.*`` overrides, so the comparison is at equal
width, depth, heads, context and vocabulary. Besides the built-in list, every part a plugin
registers is a variant named by its kind (:func:`plugin_variants`), and ``--variant
NAME:KEY=VALUE,...`` adds one of any overrides (:func:`add_variant`). ``{n_layers}`` in an override is the base depth (the
MoE-values universal transformer loops one layer that many times, so its depth of computation
matches). A variant that cannot apply to a base config (say ``identity_head`` on a parallel-residual
Pythia block) is reported as skipped with the validator's reason, never silently changed. Whether a
variant forms the T x T matrix is read from its config (the parts declare it), not listed here.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from attnlab.base.errors import UserError
from attnlab.config import Config, ConfigError, apply_overrides, validate


@dataclass(frozen=True)
class Variant:
    """A named override set of ``model.*`` keys."""

    name: str
    summary: str
    overrides: tuple[str, ...] = ()

    def resolved_overrides(self, base: Config) -> list[str]:
        return [o.format(n_layers=base.model.n_layers) for o in self.overrides]


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant(
            "baseline",
            "linear W_Q; Q, K, V from one matmul over the concatenated [W_Q | W_K | W_V]",
        ),
        Variant(
            "baseline_unfused",
            "linear W_Q; Q, K, V as three matmuls (no weight concatenation)",
            ("attention.fuse_qkv=false",),
        ),
        Variant(
            "nonlinear_query",
            "q = (u + f(u))/2, W1 fused with W_K, W_V (SPEC 1.1)",
            ("query.kind=nonlinear", "attention.fuse_qkv=true"),
        ),
        Variant(
            "nonlinear_query_unfused",
            "q = (u + f(u))/2, W1, W_K, W_V as separate matmuls",
            ("query.kind=nonlinear", "attention.fuse_qkv=false"),
        ),
        Variant("identity_query", "q = Norm(x), no W_Q", ("query.kind=identity",)),
        Variant(
            "preproj_skip",
            "x~ = x^ + W_down silu(W_up x^); out = x + attn + W_skip x~ (SPEC 1.2)",
            ("feature_map.kind=pre_projection", "side_branch.kind=content_skip"),
        ),
        Variant(
            "identity_head",
            "identity head + head weights, no residual, no MLP, nonlinear mixer (SPEC 1.3)",
            ("readout.kind=identity_head", "residual=false", "mlp=false", "mixer.kind=nonlinear"),
        ),
        Variant(
            "moe_values",
            "one layer looped n_layers times, MoE values top-2 of 8, no MLP (SPEC 1.4)",
            (
                "n_layers=1",
                "mlp=false",
                "value.kind=moe",
                "loops={n_layers}",
            ),
        ),
        Variant(
            "virtual_heads",
            "causal 1-D conv (K=3) over the attention logits (SPEC 1.5)",
            ("score.kind=virtual_heads",),
        ),
        Variant(
            "virtual_heads_fused",
            "the same convolution per head (mixing none) on the fused SDPA path: convolved keys",
            ("score.kind=virtual_heads_fused", "score.mixing=none"),
        ),
        Variant(
            "virtual_heads_fused_full",
            "virtual_heads' function (all heads mix) on the fused path: head width H d_h",
            ("score.kind=virtual_heads_fused", "score.mixing=full"),
        ),
        Variant(
            "virtual_heads_fused_probs",
            "per-head conv over the probabilities (then mask, renormalise), fused path",
            ("score.kind=virtual_heads_fused", "score.mixing=none", "score.on=probs"),
        ),
        Variant(
            "explicit_attention",
            "baseline through the explicit (math) attention path",
            ("attention.backend=math",),
        ),
    )
}

DEFAULT_VARIANTS: tuple[str, ...] = tuple(VARIANTS)


def plugin_variants() -> list[Variant]:
    """One variant per part a plugin registered (loaded with ``--plugin``, a config's
    ``plugins`` or an installed package), named by its kind: the base config with
    ``SLOT.kind=KIND``, so a plugin's part is benched by name like a built-in variant. A kind
    that is already a variant's name, or that two slots share, is named ``SLOT.KIND``."""
    from attnlab.parts import registry

    specs = [s for s in registry.specs() if s.source != registry.BUILTIN]
    kinds = [s.kind for s in specs]
    out = []
    for spec in specs:
        name = spec.kind
        if name in VARIANTS or kinds.count(name) > 1:
            name = f"{spec.slot}.{spec.kind}"
        doc = (spec.cls.__doc__ or "").strip().splitlines()
        summary = f"{spec.slot} part {spec.kind!r} from {spec.source}" + (
            f": {doc[0]}" if doc else ""
        )
        out.append(Variant(name, summary, (f"{spec.slot}.kind={spec.kind}",)))
    return out


def find_variant(name: str) -> Variant | None:
    """The built-in, ``--variant`` or plugin variant called ``name``."""
    return VARIANTS.get(name) or next((v for v in plugin_variants() if v.name == name), None)


def variant_names() -> list[str]:
    """Every variant name: the built-in list and ``--variant`` ones, then the plugins' parts."""
    return [*VARIANTS, *(v.name for v in plugin_variants() if v.name not in VARIANTS)]


def add_variant(text: str) -> str:
    """Register a command-line variant ``NAME:KEY=VALUE[,KEY=VALUE]`` (``model.`` optional on
    the keys) for this process and return its name."""
    name, sep, body = text.partition(":")
    name = name.strip()
    items = [o.strip() for o in body.split(",") if o.strip()]
    if not sep or not name or not items or any("=" not in o for o in items):
        raise UserError(
            f"--variant {text!r} must look like NAME:KEY=VALUE[,KEY=VALUE], e.g. "
            "'gated:query.kind=gated'"
        )
    keys = tuple(o.removeprefix("model.") for o in items)
    if name in VARIANTS and VARIANTS[name].overrides != keys:
        raise UserError(f"--variant {name!r}: a variant of that name exists; choose another name")
    VARIANTS[name] = Variant(name, "--variant " + ", ".join(items), keys)
    return name


def parse_names(text: str, known: dict[str, object] | tuple[str, ...], what: str) -> list[str]:
    """Split a comma list, expand ``all``/``none``, and refuse unknown names with the nearest."""
    names = list(known)
    out: list[str] = []
    for raw in text.split(","):
        name = raw.strip()
        if not name:
            continue
        if name == "all":
            out.extend(n for n in names if n not in out)
            continue
        if name == "none":
            continue
        if name not in names:
            near = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
            hint = f" Did you mean {near[0]!r}?" if near else ""
            raise UserError(f"unknown {what} {name!r}.{hint} Choose from: {', '.join(names)}")
        if name not in out:
            out.append(name)
    return out


def variant_config(base: Config, name: str) -> Config:
    """The base config with the variant's overrides applied and validated.

    Raises ConfigError (a UserError) with the validator's message when the variant cannot apply.
    """
    variant = find_variant(name)
    if variant is None:
        raise KeyError(name)
    items = [f"model.{o}" for o in variant.resolved_overrides(base)]
    try:
        return validate(apply_overrides(base.to_dict(), items))
    except ConfigError as e:
        raise ConfigError(f"variant {name!r} does not apply to this config: {e}") from None
