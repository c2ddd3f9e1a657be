"""Quantized models: ``attnlab quantize RUN --scheme SCHEME --out DIR`` through torchao.

- :mod:`.schemes`: int8 weight-only, int4 weight-only (a group size), int8 dynamic activations
  + int8 weights; each with the torchao config it applies and the tolerances it declares;
- :mod:`.plan`: which weights are quantized (the parts' ``quantizable()`` declarations) and why
  every other one is kept in full precision;
- :mod:`.apply`: ``quantize_model(model, scheme)`` with ``torchao.quantize_``;
- :mod:`.decode_kernel`: int8 weight-only decoding on CPU that reads each int8 weight once;
- :mod:`.store`: the quantized directory (torchao's safetensors form, never a pickle) and its
  loading;
- :mod:`.target`: the directory as a target of ``eval``, ``inspect`` (and ``generate``,
  ``bench``, ``export``, which load it through :func:`.store.load`).

torchao (the ``quant`` extra) is imported only inside the functions that use it.
"""

import attnlab.quant.decode_kernel  # noqa: F401  (registers the int8 decode kernel)
from attnlab.quant.apply import quantizable_config, quantize_model
from attnlab.quant.plan import Plan, plan
from attnlab.quant.schemes import SCHEMES, Scheme, get_scheme

__all__ = [
    "SCHEMES",
    "Plan",
    "Scheme",
    "get_scheme",
    "plan",
    "quantizable_config",
    "quantize_model",
]
