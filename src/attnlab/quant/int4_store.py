"""int4 weights on disk packed two per byte, rebuilt at load into torchao's CPU int4 tensor.

torchao 0.18 has no safetensors form for ``Int4OpaqueTensor`` (int4-weight on CPU), and its
``qdata`` is in the layout of the machine's kernel (``aten._convert_weight_to_int4pack_for_cpu``
tiles it by the CPU's vector width), so it is no file format. What is stored instead is the
portable form the tensor is made from, as gguf's and torchao's own uint4 layouts store it:

    q_oi in 0..15              two per byte, row-major, even input in the low nibble:
                               byte = q[o, 2j] | q[o, 2j+1] << 4      [out, in / 2] uint8
    scale_and_zero             torchao's [in / g, out, 2] float32 (each group's scale s_og and
                               zero z_og as tinygemm uses them: w ~ (q - 8) * s + z)

so a weight costs in/2 + 8 in/g bytes per output row: 0.1875x of float32 at g = 32, 0.141x at
g = 128. At load the nibbles are unpacked to int32 and packed for this machine's kernel by the
same ``aten._convert_weight_to_int4pack_for_cpu`` call that ``Int4OpaqueTensor.from_hp`` makes,
so the rebuilt tensor is the one ``attnlab quantize`` made. ``int4_payload`` checks that when it
writes (else the caller keeps the float-and-re-quantize fallback), and each payload carries a
sha256 that ``int4_weight`` checks when it reads: a damaged file is refused, never decoded.

Cost: save: one re-computation of the weight's rounding (torchao's tinygemm primitives) and a
pack; load: one unpack and one kernel pack per weight, and a sha256 over its bytes.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import Tensor

from attnlab.base.errors import UserError

#: the safetensors names of a weight's two stored tensors
NIBBLES, SCALE_AND_ZERO = "int4_nibbles", "int4_scale_and_zero"
#: the safetensors metadata key holding {weight name: its int4 record}
META_KEY = "attnlab_int4"


def pack_nibbles(q: Tensor) -> Tensor:
    """[out, in] integers in 0..15 (in even) -> [out, in / 2] uint8, even input in the low nibble."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_nibbles(packed: Tensor) -> Tensor:
    """The inverse of :func:`pack_nibbles`, as int32 [out, in] (what torch's int4 packing takes)."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack((low, high), dim=-1).reshape(packed.shape[0], -1).to(torch.int32)


def _digest(*tensors: Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _rounding(w: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """(q int32 [out, in], scale_and_zero) by torchao's tinygemm rounding, as ``from_hp``."""
    from torchao.quantization.quant_primitives import (
        MappingType,
        _choose_qparams_affine_tinygemm,
        _quantize_affine_tinygemm,
    )
    from torchao.quantization.utils import pack_tinygemm_scales_and_zeros

    block = [1, group_size]
    args = (MappingType.ASYMMETRIC, block, torch.int32, 0, 15, 1e-6, None, w.dtype)
    scale, zero = _choose_qparams_affine_tinygemm(w, *args)
    q = _quantize_affine_tinygemm(w, block, scale, zero, torch.int32, 0, 15)
    rows = q.shape[0]
    sz = pack_tinygemm_scales_and_zeros(
        scale.reshape(rows, -1), zero.reshape(rows, -1), scale.dtype
    )
    return q, sz


def _opaque(q: Tensor, scale_and_zero: Tensor, group_size: int) -> Any:
    from torchao.prototype.quantization.int4 import Int4OpaqueTensor

    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    return Int4OpaqueTensor(packed, scale_and_zero, [1, group_size], q.shape)


def int4_payload(weight: Any, full: Tensor) -> tuple[dict[str, Tensor], dict[str, Any]] | None:
    """The stored form of ``weight`` (an ``Int4OpaqueTensor`` quantized from ``full``): tensors
    and a record; None when it is not a weight-only int4 tensor or the rebuild would differ."""
    if type(weight).__name__ != "Int4OpaqueTensor" or weight.act_mapping_type is not None:
        return None
    if weight.act_pre_scale is not None or weight.block_size[0] != 1:
        return None
    group = int(weight.block_size[1])
    q, sz = _rounding(full.detach().float(), group)
    again = _opaque(q, sz, group)
    if not (torch.equal(again.qdata, weight.qdata) and torch.equal(sz, weight.scale_and_zero)):
        return None
    nibbles = pack_nibbles(q)
    record = {
        "group_size": group,
        "shape": list(weight.shape),
        "sha256": _digest(nibbles, sz),
    }
    return {NIBBLES: nibbles, SCALE_AND_ZERO: sz.contiguous()}, record


def int4_weight(name: str, tensors: dict[str, Tensor], record: Any, where: str) -> Any:
    """The ``Int4OpaqueTensor`` of weight ``name`` from its stored tensors and record; anything
    that does not fit (shapes, group size, checksum) is a ``UserError`` naming ``where``."""
    nibbles, sz = tensors.get(NIBBLES), tensors.get(SCALE_AND_ZERO)
    try:
        group, (rows, cols) = int(record["group_size"]), (int(n) for n in record["shape"])
        digest = str(record["sha256"])
    except (KeyError, TypeError, ValueError):
        group, rows, cols, digest = 0, 0, 0, ""
    fits = (
        nibbles is not None
        and sz is not None
        and group in (32, 64, 128)
        and cols % group == 0
        and nibbles.dtype == torch.uint8
        and tuple(nibbles.shape) == (rows, cols // 2)
        and sz.dtype == torch.float32
        and tuple(sz.shape) == (cols // max(group, 1), rows, 2)
    )
    if not fits or _digest(nibbles, sz) != digest:
        raise UserError(
            f"{where}: the int4 weight {name} is damaged (its stored nibbles, scales or record do "
            "not match); quantize the run again with `attnlab quantize RUN --scheme int4-weight`"
        )
    return _opaque(unpack_nibbles(nibbles), sz, group)
