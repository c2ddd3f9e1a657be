"""The impossible combinations of a model config, refused when it loads with one sentence each
(the keys, the reason, the fix). Each check sits next to what it checks: the head shapes and the
residual stream here, every part's own ``check`` in its part file, the masks' in
:mod:`~attnlab.config.mask_checks`, each family's own ``check`` in its family file
(:mod:`attnlab.model.families`, a plugin's in its file)."""

from __future__ import annotations

from typing import Any

from attnlab.config.mask_checks import mask_problems


def head_problems(m: Any) -> list[str]:
    """Head shapes that do not divide (the parts' own checks assume consistent ones)."""
    a, problems = m.attention, []
    if a.head_dim is None and m.d_model % a.n_heads:
        problems.append(
            f"model.d_model={m.d_model} is not divisible by model.attention.n_heads="
            f"{a.n_heads}; change one or set model.attention.head_dim"
        )
    if m.n_kv_heads > a.n_heads or a.n_heads % m.n_kv_heads:
        problems.append(
            f"model.attention.n_kv_heads={m.n_kv_heads} must divide "
            f"model.attention.n_heads={a.n_heads} (GQA groups query heads over shared K/V)"
        )
    return problems


def kernel_problems(m: Any) -> list[str]:
    """Parts a fused kernel cannot run: one that reads the T x T probabilities, a position part
    that biases the logits under the flash kernel."""
    a, problems = m.attention, []
    classes = m.part_classes()
    if m.needs_attention_matrix and a.backend in ("flash", "sdpa"):
        names = [k for k, c in classes.items() if c and c.needs_attention_matrix]
        problems.append(
            f"model.{names[0]}.kind={getattr(m, names[0]).kind!r} reads the full attention "
            f"matrix, which a fused kernel never forms; set model.attention.backend='auto' "
            "or 'math'"
        )
    position = classes["position"]
    if a.backend == "flash" and position is not None and position.logit_bias:
        problems.append(
            f"model.position.kind='{m.position.kind}' adds a bias to the logits, which the "
            "flash kernel does not take; set model.attention.backend='auto'"
        )
    return problems


def residual_problems(m: Any) -> list[str]:
    """The parallel residual (x + attention + FFN) needs a pre-norm block with both branches."""
    if m.residual_kind != "parallel":
        return []
    problems = []
    if m.norm_position == "post":
        problems.append("model.residual_kind='parallel' is defined for pre-norm blocks only")
    if not m.mlp:
        problems.append("model.residual_kind='parallel' needs model.mlp=true")
    if not m.residual:
        problems.append(
            "model.residual_kind='parallel' sums x + attention + FFN; it needs model.residual=true"
        )
    return problems


def family_problems(m: Any) -> list[str]:
    """The family's own checks (``Family.check``), and a cross_attention part in a family that
    does not read one."""
    from attnlab.parts import families

    fam = families.of(m)
    problems = fam.check(m)
    if not fam.reads_cross_attention and m.cross_attention.kind != "none":
        problems.append(
            f"model.cross_attention.kind={m.cross_attention.kind!r} is read only by "
            f"{families.where(lambda f: f.reads_cross_attention)} (this model is "
            f"{m.family!r}); remove the table"
        )
    return problems


def model_problems(m: Any) -> list[str]:
    """Every impossible combination of model config ``m`` (a
    :class:`~attnlab.config.ModelConfig`); the head shapes first, and alone when they fail."""
    problems = head_problems(m)
    if problems:
        return problems
    for opts in m.slots().values():
        problems.extend(opts.check(m))
    problems += kernel_problems(m)
    problems += mask_problems(m.attention)
    problems += residual_problems(m)
    problems += family_problems(m)
    return problems
