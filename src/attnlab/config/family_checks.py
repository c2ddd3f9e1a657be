"""What each model family needs of the rest of ``[model]``, checked when the config loads: one
function per family, looked up by name (:data:`FAMILY_CHECKS`). Kept apart from the other
checks: each function moves into its family's file when families become registered assemblies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _decoder(m: Any) -> list[str]:
    if m.attention.mask == "bidirectional":
        return [
            "model.family='decoder' is a causal LM; model.attention.mask='bidirectional' would "
            "let it see the tokens it predicts. Use family='encoder' for a bidirectional model"
        ]
    return []


def _encoder(m: Any) -> list[str]:
    if m.attention.mask in ("causal", "prefix"):
        return [
            f"model.family='encoder' is bidirectional; model.attention.mask='{m.attention.mask}' "
            "would hide the right context. Use 'bidirectional', 'sliding' or 'local_global'"
        ]
    return []


def _encoder_decoder(m: Any) -> list[str]:
    problems = []
    if m.n_decoder_layers is None:
        problems.append("model.family='encoder_decoder' needs model.n_decoder_layers")
    if m.residual_kind == "parallel":
        problems.append(
            "model.residual_kind='parallel' has no place for cross-attention; use "
            "residual_kind='sequential' with model.family='encoder_decoder'"
        )
    if m.attention.mask == "prefix":
        problems.append(
            "model.attention.mask='prefix' is for decoder-only prefix LMs; an encoder-decoder "
            "already reads its input bidirectionally"
        )
    return problems


def _retrieval(m: Any) -> list[str]:
    """CCA layers that exist, a causal mask, a plain residual stack, a cross_attention part."""
    problems = []
    bad = [i for i in m.retrieval.layers(m.n_layers) if not 0 <= i < m.n_layers]
    if bad:
        problems.append(
            f"model.retrieval.cca_layers={bad} are not layers of a {m.n_layers}-layer "
            f"decoder; use indices 0..{m.n_layers - 1}"
        )
    if m.attention.mask == "bidirectional":
        problems.append(
            "model.family='retrieval' is a causal LM; use model.attention.mask='causal'"
        )
    if m.loops != 1 or m.residual_kind == "parallel" or not m.residual:
        problems.append(
            "model.family='retrieval' is built for loops=1, residual=true and "
            "residual_kind='sequential'"
        )
    if m.cross_attention.kind == "none":
        problems.append(
            "model.family='retrieval' reads its neighbours through a cross_attention part; "
            "set model.cross_attention.kind='cca' (or a plugin's kind)"
        )
    return problems


#: family name -> the problems a model config of that family has
FAMILY_CHECKS: dict[str, Callable[[Any], list[str]]] = {
    "decoder": _decoder,
    "encoder": _encoder,
    "encoder_decoder": _encoder_decoder,
    "retrieval": _retrieval,
}


def family_problems(m: Any) -> list[str]:
    """The problems of model config ``m`` with its family: the family's own checks, and a
    cross_attention part in a family that does not read one."""
    problems = FAMILY_CHECKS[m.family](m)
    if m.family != "retrieval" and m.cross_attention.kind != "none":
        problems.append(
            f"model.cross_attention.kind={m.cross_attention.kind!r} is read only by "
            f"model.family='retrieval' (this model is {m.family!r}); remove the table"
        )
    return problems
