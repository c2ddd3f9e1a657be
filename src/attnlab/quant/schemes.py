"""The quantization schemes of ``attnlab quantize``, each a torchao config with its promises.

=================  ==========================================================  =================
scheme             weights -> what a Linear computes                           CPU kernel
=================  ==========================================================  =================
``int8-weight``    W ~ s_o * q_oi, q int8, one scale per output row;           ``aten.mm`` on
                   y = x (q s)^T in the activation dtype                       q cast to x's dtype
                                                                               (decoding: a fused
                                                                               compiled reduction)
``int4-weight``    W ~ s_og * (q_oi - z_og), q in 0..15, scale and zero per    ``aten._weight_
                   group of ``group_size`` inputs (32, 64 or 128)               int4pack_mm_for_cpu``
``int8-dynamic``   weights as int8-weight; each token's activations quantized  ``aten._int_mm``
                   to int8 per row at run time; y = s_x s_o (q_x q_w^T)         (int8 x int8)
=================  ==========================================================  =================

Bytes per weight: 1 (int8), 0.5 (int4) plus a scale (and zero) per row or group, against 4 in
float32; the matmul FLOPs are unchanged. Every scheme declares ``tolerance``: the largest relative
RMS error ``||f_q(x) - f(x)|| / ||f(x)||`` of a part's output that its rounding may cause
(``attnlab check``'s ``quantize`` property holds each part to it), and ``verify_tolerance``: the
largest |logit difference| accepted between two code paths over the same quantized tensors
(``attnlab export --verify``: the export loaded by transformers against the quantized attnlab
model; the check battery: cached decoding against the full forward). Weight-only schemes compute
in float there, so 1e-4 is float32 noise with room; int8-dynamic rounds every token's activations
to 255 levels at run time, so a float32 ulp of difference upstream can move one activation by a
whole step: measured on the battery's models up to 0.07 in the logits, hence 0.1.

Why these tolerances: rounding to a step of ``max|w_row| / 127`` leaves a uniform error of RMS
step/sqrt(12), about 0.9% of a Gaussian row's RMS; activations quantized the same way add as
much again; int4 with a 16-level asymmetric grid per group leaves about 12%. Each tolerance is
about twice that, and the tests measure the real errors against them.

torchao (the ``quant`` extra) is imported only when a config is built.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from attnlab.base.errors import UserError

#: the group sizes torchao's CPU int4 kernel accepts
INT4_GROUP_SIZES = (32, 64, 128)
#: torchao's CPU int4 packing needs the output features to be a multiple of this
INT4_OUT_MULTIPLE = 16


@contextmanager
def quiet_torchao(what: str = "quantization") -> Iterator[None]:
    """Within: torchao can be imported (the ``quant`` extra, named when missing) without the
    lines its import logs on a CPU-only torch (:mod:`attnlab.base.import_noise`: its CUDA kernel
    libraries fail to load there, which costs nothing on the CPU, and torch's pytree notes a
    deprecated registration of its enums). Other log records and warnings are untouched."""
    from attnlab.base.extras import require
    from attnlab.base.import_noise import drop_import_noise

    require("quant", "torchao", what=what)
    drop_import_noise()
    yield


@dataclass(frozen=True)
class Scheme:
    """One quantization scheme: its name, what it stores, and what it promises."""

    name: str
    summary: str
    #: bits per stored weight
    bits: int
    #: relative RMS error of a part's output that the scheme's rounding may cause
    tolerance: float
    #: max |logits difference| of an export loaded by transformers vs the quantized attnlab model
    verify_tolerance: float
    #: the torchao config's class name, and the CPU kernel it runs (for reports)
    torchao_config: str
    kernel: str
    #: group size used when none is given (None: the scheme has no groups)
    default_group_size: int | None = None
    #: why ``attnlab export`` cannot write this scheme for transformers (None: it can)
    not_exportable: str | None = None

    def group_size(self, given: int | None) -> int | None:
        """The group size to use; a size the scheme does not take is a ``UserError``."""
        if self.default_group_size is None:
            if given is not None:
                raise UserError(
                    f"--group-size applies to int4-weight only; {self.name} quantizes each "
                    "output row with one scale (drop --group-size)"
                )
            return None
        size = self.default_group_size if given is None else given
        if size not in INT4_GROUP_SIZES:
            raise UserError(
                f"--group-size {size}: torchao's CPU int4 kernel takes groups of "
                f"{', '.join(map(str, INT4_GROUP_SIZES))} inputs; give one of them"
            )
        return size

    def shape_problem(
        self, in_features: int, out_features: int, group_size: int | None
    ) -> str | None:
        """Why this scheme's kernel cannot take a Linear of this shape (None: it can)."""
        if self.default_group_size is None:
            return None
        if group_size and in_features % group_size:
            return f"its {in_features} inputs are not a multiple of the group size {group_size}"
        if out_features % INT4_OUT_MULTIPLE:
            return (
                f"its {out_features} outputs are not a multiple of {INT4_OUT_MULTIPLE}, which "
                "torchao's CPU int4 packing (aten._convert_weight_to_int4pack_for_cpu) needs"
            )
        return None

    def config(self, group_size: int | None = None) -> Any:
        """The torchao ``AOBaseConfig`` of this scheme (``set_inductor_config=False``: quantizing
        must not change torch.compile's global settings for the rest of the process)."""
        with quiet_torchao(f"quantization ({self.name})"):
            return _CONFIGS[self.name](self.group_size(group_size))


def _int8_weight(_: int | None) -> Any:
    from torchao.quantization import Int8WeightOnlyConfig

    return Int8WeightOnlyConfig(set_inductor_config=False)


def _int4_weight(group_size: int | None) -> Any:
    # torchao 0.18's Int4WeightOnlyConfig runs on CUDA kernels only (mslk / tinygemm); its CPU
    # int4 path is the prototype config below (Int4OpaqueTensor, aten._weight_int4pack_mm_for_cpu)
    from torchao.prototype.quantization.int4.inference_workflow import (
        PrototypeInt4WeightOnlyConfig,
    )

    return PrototypeInt4WeightOnlyConfig(group_size=group_size, set_inductor_config=False)


def _int8_dynamic(_: int | None) -> Any:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig

    return Int8DynamicActivationInt8WeightConfig(set_inductor_config=False)


_CONFIGS = {"int8-weight": _int8_weight, "int4-weight": _int4_weight, "int8-dynamic": _int8_dynamic}

SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in (
        Scheme(
            "int8-weight",
            "int8 weights, one scale per output row; activations stay float",
            bits=8,
            tolerance=2e-2,
            verify_tolerance=1e-4,
            torchao_config="Int8WeightOnlyConfig",
            kernel=(
                "decoding on CPU: attnlab's compiled int8 x float reduction (quant/decode_kernel"
                ".py); otherwise aten.mm on the int8 weight cast to float (torchao Int8Tensor)"
            ),
        ),
        Scheme(
            "int4-weight",
            "int4 weights, a scale and zero point per group of inputs; activations stay float",
            bits=4,
            tolerance=0.25,
            verify_tolerance=1e-4,
            torchao_config="PrototypeInt4WeightOnlyConfig",
            kernel="aten._weight_int4pack_mm_for_cpu (torchao Int4OpaqueTensor)",
            default_group_size=128,
            not_exportable=(
                "torchao 0.18 stores its CPU int4 tensor (Int4OpaqueTensor) in no safetensors "
                "form, and transformers' TorchAoConfig cannot read its prototype config back"
            ),
        ),
        Scheme(
            "int8-dynamic",
            "int8 weights per row and int8 activations per token, quantized at run time",
            bits=8,
            tolerance=0.04,
            verify_tolerance=0.1,
            torchao_config="Int8DynamicActivationInt8WeightConfig",
            kernel="aten._int_mm (int8 x int8 -> int32) then the two scales (torchao Int8Tensor)",
        ),
    )
}


def get_scheme(name: str) -> Scheme:
    """The scheme called ``name``; an unknown name is a ``UserError`` naming the known ones."""
    try:
        return SCHEMES[name]
    except KeyError:
        import difflib

        near = difflib.get_close_matches(name, SCHEMES, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise UserError(
            f"unknown quantization scheme {name!r}{hint}; choose one of {', '.join(SCHEMES)}"
        ) from None
