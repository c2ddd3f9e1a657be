"""A quantized model on disk: the directory ``attnlab quantize RUN --out DIR`` writes.

::

    .attnlab.json          marker, kind "quantized" (attnlab replaces only its own directories)
    quantized.json         scheme, group size, torchao version, source run and step, the
                           quantized modules and the kept list (each weight kept in full
                           precision and why), size on disk
    source-config.toml     the source run's config, as it trained (not ``config.toml``: the
                           directory is not a run, and nothing may take it for one)
    model.safetensors      the state: torchao's safetensors form of each quantized weight
                           (its int8 data and scales, flattened by
                           ``torchao.prototype.safetensors.flatten_tensor_state_dict``, the
                           format transformers' TorchAoConfig saves) and every other tensor
                           in float; an int4 weight (torchao has no safetensors form for its
                           CPU tensor) as its nibbles packed two per byte and its groups'
                           scales and zeros (:mod:`attnlab.quant.int4_store`, checksummed),
                           rebuilt at load into the same tensor; any other weight without a
                           stored form in float, quantized again at load

Loading never unpickles. A quantized weight comes back through torchao's
``unflatten_tensor_state_dict``, which rebuilds only the tensor classes and attribute types on
its allow-list from JSON; a weight stored in float for re-quantization is quantized at load by
the same deterministic rounding that ``attnlab quantize`` applied (``torch.load`` with
``weights_only=True`` and safe globals would also be safe, but would tie the files to torch's
pickle format and to the tensor classes' import paths, which move between torchao releases).
"""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.base.errors import UserError
from attnlab.quant.apply import is_quantized, quantizable_config, quantize_model
from attnlab.quant.int4_store import META_KEY as INT4_META
from attnlab.quant.int4_store import int4_payload, int4_weight
from attnlab.quant.schemes import get_scheme, quiet_torchao

KIND = "quantized"
INFO_FILE = "quantized.json"
CONFIG_FILE = "source-config.toml"
WEIGHTS_FILE = "model.safetensors"
MARKERS = (INFO_FILE,)


@dataclass
class Quantized:
    """A loaded quantized model: the model (eval mode), its config, tokenizer and record."""

    model: nn.Module
    config: Any
    tokenizer: Any
    info: dict[str, Any] = field(default_factory=dict)


def is_quantized_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / INFO_FILE).is_file()


def _state(
    model: nn.Module, full_precision: nn.Module
) -> tuple[dict[str, torch.Tensor], dict[str, str], list[str]]:
    """(flattened tensors, their metadata, the modules whose weight is stored in float to be
    quantized again at load: the exact float weight of ``full_precision``, not a dequantized
    one, so that the rounding is redone exactly)."""
    from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict
    from torchao.prototype.safetensors.safetensors_utils import ALLOWED_TENSORS_SUBCLASSES

    state: dict[str, torch.Tensor] = {}
    int4: dict[str, torch.Tensor] = {}
    int4_records: dict[str, Any] = {}
    seen: set[int] = set()
    requant = []
    fp = full_precision.state_dict()
    for name, t in model.state_dict().items():
        if not is_quantized(t):
            if t.data_ptr() in seen:  # a tied weight (the LM head): stored once, re-tied at load
                continue
            seen.add(t.data_ptr())
            state[name] = t.contiguous()
        elif type(t).__name__ in ALLOWED_TENSORS_SUBCLASSES:
            state[name] = t
        elif (packed := int4_payload(t, fp[name])) is not None:
            int4.update({f"{name}.{k}": v for k, v in packed[0].items()})
            int4_records[name] = packed[1]
        else:
            requant.append(name.rpartition(".")[0])
            state[name] = fp[name].contiguous()
    tensors, meta = flatten_tensor_state_dict(state)
    if int4_records:
        tensors.update(int4)
        meta[INT4_META] = json.dumps(int4_records)
    return tensors, meta, requant


def save(
    out: str | os.PathLike,
    model: nn.Module,
    cfg: Any,
    info: dict[str, Any],
    *,
    full_precision: nn.Module,
) -> dict[str, Any]:
    """Write the quantized directory of ``model`` to ``out`` (whole, swapped in atomically).
    ``full_precision``: the same model before quantization, whose float weights are stored for
    a weight torchao cannot serialise (re-quantized at load)."""
    from safetensors.torch import save_file

    from attnlab.base.owned import MARKER, file_hashes, mark
    from attnlab.base.swap import replace_dir, staging_dir
    from attnlab.config import dump_toml

    with quiet_torchao():
        import torchao

        tensors, meta, requant = _state(model, full_precision)
    out = Path(os.path.abspath(out))
    tmp = staging_dir(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_file(tensors, tmp / WEIGHTS_FILE, metadata=meta)
        (tmp / CONFIG_FILE).write_text(dump_toml(cfg), encoding="utf-8")
        record = {
            "kind": "attnlab-quantized",
            **info,
            "torchao": torchao.__version__,
            "stored_in_float_requantized_at_load": requant,
            "int4_packed": sorted(json.loads(meta.get(INT4_META, "{}"))),
            "size_on_disk_bytes": (tmp / WEIGHTS_FILE).stat().st_size,
        }
        (tmp / INFO_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        files = [f for f in os.listdir(tmp) if f != MARKER]
        mark(tmp, KIND, files=file_hashes(tmp, files), at=out)
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record


def read_info(path: str | os.PathLike) -> dict[str, Any]:
    """The ``quantized.json`` of a quantized directory (a damaged one is a ``UserError``)."""
    path = Path(path)
    try:
        info = json.loads((path / INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(
            f"{path / INFO_FILE} cannot be read ({e}); quantize the run again with "
            "`attnlab quantize RUN --scheme SCHEME --out DIR`"
        ) from None
    if not isinstance(info, dict) or info.get("kind") != "attnlab-quantized":
        raise UserError(f"{path / INFO_FILE} is not an attnlab quantized model's record")
    return info


def _config(path: Path) -> Any:
    from attnlab.base.consent import guarding
    from attnlab.config import ConfigError, validate

    try:
        raw = tomllib.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
        with guarding(path):
            return validate(raw)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ConfigError) as e:
        raise UserError(f"{path / CONFIG_FILE} cannot be read as an attnlab config ({e})") from None


def _tokenizer(cfg: Any) -> Any:
    from attnlab.data import load_tokenizer

    data_dir = Path(cfg.data.dir) if cfg.data.dir else None
    if data_dir is not None and (data_dir / "meta.json").is_file():
        return load_tokenizer(cfg.data.tokenizer, data_dir=data_dir)
    return load_tokenizer(cfg.data.tokenizer)


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file
    from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict

    try:
        with safe_open(path / WEIGHTS_FILE, framework="pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(path / WEIGHTS_FILE)
        int4_records = json.loads(meta.pop(INT4_META, "{}"))
        if not isinstance(int4_records, dict):
            raise ValueError(f"{INT4_META} is not a mapping")
        int4 = {
            name: {
                k[len(name) + 1 :]: tensors.pop(k)
                for k in list(tensors)
                if k.startswith(f"{name}.")
            }
            for name in int4_records
        }
        state, leftover = unflatten_tensor_state_dict(tensors, meta)
    except (OSError, ValueError, KeyError, SafetensorError) as e:  # a damaged or truncated file
        raise UserError(
            f"{path / WEIGHTS_FILE} cannot be read as a torchao state ({e}); quantize the run again"
        ) from None
    for name, record in int4_records.items():
        state[name] = int4_weight(name, int4[name], record, str(path / WEIGHTS_FILE))
    if leftover:
        raise UserError(f"{path / WEIGHTS_FILE} holds tensors of no weight: {sorted(leftover)[:4]}")
    return state


def load(path: str | os.PathLike, device: str | torch.device = "cpu") -> Quantized:
    """The quantized model of directory ``path`` (see the module docstring), in eval mode."""
    from attnlab.model import build_model

    path = Path(path)
    info = read_info(path)
    scheme = get_scheme(str(info.get("scheme")))
    cfg = _config(path)
    model = build_model(quantizable_config(cfg).model).eval()
    with quiet_torchao("loading a quantized model"):
        state = _read_state(path)
    requant = set(info.get("stored_in_float_requantized_at_load") or [])
    _put_state(model, state, path)
    if requant:
        quantize_model(
            model,
            scheme,
            info.get("group_size"),
            only=requant,
            tied_head=bool(info.get("tied_head")),
        )
    return Quantized(model.to(device), cfg, _tokenizer(cfg), info)


def _put_state(model: nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """Quantized weights replace their float parameters; every other tensor is copied in."""
    plain = {}
    for name, t in state.items():
        if is_quantized(t):
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner), leaf, nn.Parameter(t, requires_grad=False))
        else:
            plain[name] = t
    own = dict(model.state_dict())
    tied = {n for n in own if n not in state and n.endswith("lm_head.weight")}
    missing = sorted(set(own) - set(state) - tied)
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise UserError(
            f"{path / WEIGHTS_FILE} does not fit the model its config describes (missing "
            f"{missing[:4]}, unexpected {unexpected[:4]}); was the model code changed since?"
        )
    model.load_state_dict(plain, strict=False)
