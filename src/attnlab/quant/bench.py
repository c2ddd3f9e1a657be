"""``attnlab bench QDIR``: a quantized directory's decoding against its full-precision source.

The quantized model and the float model it was made from (the run and step recorded in
``quantized.json``, when that run is still there) decode the same greedy continuation with the
KV cache in interleaved rounds (:func:`attnlab.quant.speed.decode_speeds`: tokens/s, median and
best, speedup against float32, bytes of weights); with ``memory``, each is loaded again in a
fresh process for its resident and peak decode memory (:func:`attnlab.quant.speed.measure_memory`).

Cost: (warmup + repeats) decodes of ``new_tokens`` per model, plus one process per model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from attnlab.quant.speed import SpeedRow, decode_speeds, measure_memory
from attnlab.quant.store import load, read_info


def _source_model(info: dict[str, Any]) -> tuple[nn.Module | None, str]:
    """The float model the directory was quantized from, or None with the reason."""
    from attnlab.quant.run import load_source

    source = info.get("source_arg") or info.get("source")
    if not source or not Path(source).exists():
        return None, f"its source {source} is gone: the quantized model alone is timed"
    return load_source(source)[0], ""


def bench_quantized(
    path: str | Path,
    *,
    prompt_len: int = 16,
    new_tokens: int = 32,
    repeats: int = 5,
    warmup: int = 1,
    memory: bool = True,
) -> tuple[list[SpeedRow], str]:
    """Rows for float32 (when its source run exists) and the scheme, and a note (or "")."""
    path = Path(path)
    info = read_info(path)
    models: dict[str, nn.Module] = {}
    full, note = _source_model(info)
    if full is not None:
        models["float32"] = full
    models[str(info["scheme"])] = load(path).model
    rows = decode_speeds(
        models, prompt_len=prompt_len, new_tokens=new_tokens, repeats=repeats, warmup=warmup
    )
    if memory:
        for row in rows:
            spec: dict[str, Any] = {"prompt_len": prompt_len, "new_tokens": new_tokens}
            if row.name == "float32":
                spec["run"] = str(info.get("source_arg") or info.get("source"))
            else:
                spec["quantized"] = str(path)
            mem = measure_memory(spec)
            row.rss_runtime_mib = mem["rss_runtime_mib"]
            row.rss_loaded_mib, row.peak_decode_mib = mem["rss_loaded_mib"], mem["peak_decode_mib"]
    return rows, note
