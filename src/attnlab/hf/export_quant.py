"""``attnlab export QUANTIZED_DIR --out DIR``: a quantized model as a folder transformers loads
quantized, the way transformers itself saves a torchao model.

The folder is an ordinary attnlab export (:mod:`attnlab.hf.export`) whose ``config.json`` also
holds ``quantization_config``: a ``transformers.TorchAoConfig`` with the scheme's torchao config
and ``modules_to_not_convert`` (every Linear the quantized model kept in full precision, so
transformers converts exactly the modules attnlab quantized), and whose ``model.safetensors``
holds each quantized weight in torchao's safetensors form (``flatten_tensor_state_dict``, written
by transformers' ``save_pretrained`` through its torchao quantizer). ``from_pretrained`` (and so
``lm_eval --model hf``) reads it back as pre-quantized torchao tensors: no float weights are
stored and nothing is quantized again.

A scheme whose torchao tensor has no safetensors form (int4-weight on CPU) is refused with the
reason its scheme declares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from attnlab.base.errors import UserError


def quantization_config(model: nn.Module, info: dict[str, Any]) -> Any:
    """The ``TorchAoConfig`` of a quantized attnlab model with record ``info``."""
    from transformers import TorchAoConfig

    from attnlab.quant.apply import is_quantized
    from attnlab.quant.schemes import get_scheme

    scheme = get_scheme(str(info.get("scheme")))
    keep = [
        f"model.{name}"
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and not is_quantized(m.weight)
    ]
    return TorchAoConfig(scheme.config(info.get("group_size")), modules_to_not_convert=keep)


def attach(hf: nn.Module, model: nn.Module, qconfig: Any) -> None:
    """Put the quantized attnlab ``model`` inside ``hf`` (an ``AttnlabForCausalLM`` built from
    the same config) with transformers' torchao quantizer, so ``save_pretrained`` writes its
    tensors flattened and config.json gets ``quantization_config``."""
    from transformers.quantizers import AutoHfQuantizer

    hf.model = model
    hf.config.quantization_config = qconfig
    hf.hf_quantizer = AutoHfQuantizer.from_config(qconfig, pre_quantized=True)


def prepare(source: str | Path) -> tuple[Any, Any, Any, int | None, Path | None, Any]:
    """(quantized model, its config as built, tokenizer, step, source run or None,
    TorchAoConfig) of quantized directory ``source``, for ``export_model`` (see the module
    doc); a scheme that cannot be exported is a ``UserError`` with its reason."""
    from attnlab.quant.apply import quantizable_config
    from attnlab.quant.schemes import get_scheme
    from attnlab.quant.store import load, read_info

    info = read_info(source)
    scheme = get_scheme(str(info.get("scheme")))
    if scheme.not_exportable:
        raise UserError(
            f"{source} is quantized with {scheme.name}, which attnlab export cannot write for "
            f"transformers: {scheme.not_exportable}. Export an int8-weight or int8-dynamic "
            "quantization of the run, or evaluate this directory with attnlab itself"
        )
    if info.get("tied_head"):  # transformers re-ties lm_head to the float embedding at load
        raise UserError(
            f"{source} quantizes its tied LM head as its own copy (attnlab quantize --tied-head), "
            "which transformers would tie back to the embedding; quantize the run again without "
            "--tied-head to export it"
        )
    q = load(source)
    run_dir = Path(info["source"]) if info.get("source") else None
    if run_dir is not None and not run_dir.is_dir():
        run_dir = None
    qconfig = quantization_config(q.model, info)
    cfg = quantizable_config(q.config)
    return q.model, cfg, q.tokenizer, info.get("step"), run_dir, qconfig
