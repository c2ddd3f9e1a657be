"""A probe directory's outputs, and ``load_probed_model`` which re-attaches them to the base.

::

    PROBE_DIR/probe.json          base (as configured), method, architecture, counts, LoRA plan,
                                  base fingerprint, the resolved config, trained steps, the
                                  injected parts' layer statistics (and their sentences)
    PROBE_DIR/probe.toml          the resolved config (what a rerun must match to resume)
    PROBE_DIR/adapter.safetensors only the injected attnlab tensors (pre-projection, skip, f)
    PROBE_DIR/lora/               PEFT's own save_pretrained (adapter_config.json +
                                  adapter_model.safetensors)

The base weights are never written: the adapter re-attaches to the same base, which is checked
(parameter shapes and an embedding checksum) before loading. ``probe.json`` records the sha256 of
every adapter file; a file whose content changed is not loaded: the trainable tensors come from the
newest intact checkpoint instead, with a warning naming the damaged file.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from attnlab.base.atomic import atomic_write_json, sha256_file, temp_sibling
from attnlab.base.errors import UserError
from attnlab.base.swap import atomic_directory, recover
from attnlab.probe.build import BaseProvider, ProbedModel, build_probed_model, check_fingerprint
from attnlab.probe.config import ConfigError, validate_probe
from attnlab.probe.moved_keys import upgrade_recorded
from attnlab.runs import checkpoint, rundir

FORMAT = "attnlab-probe"
VERSION = 1
PROBE_JSON = "probe.json"
PROBE_TOML = "probe.toml"
ADAPTER = "adapter.safetensors"
LORA_DIR = "lora"
LORA_FILES = ("adapter_config.json", "adapter_model.safetensors")


class AdapterWarning(UserWarning):
    """A damaged adapter file was replaced by the tensors of a checkpoint."""


def probe_record(probed: ProbedModel, cfg: Any, trained_steps: int) -> dict[str, Any]:
    """The content of ``probe.json``."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "base": {
            "model": cfg.base.model,
            "gguf_file": cfg.base.gguf_file,
            "resolved": probed.source.label,
            "kind": probed.source.kind,
            "model_type": probed.hf_model.config.model_type,
        },
        "dims": {
            "d_model": probed.dims.d_model,
            "n_layers": probed.dims.n_layers,
            "n_heads": probed.dims.n_heads,
            "head_dim": probed.dims.head_dim,
        },
        "method": probed.method.name,
        "components": sorted(probed.method.components),
        "params": probed.counts(),
        # the injected parts' declared statistics after `trained_steps` (Part.layer_stats)
        "layer_stats": probed.injection.layer_stats() if probed.injection is not None else {},
        "layer_stats_doc": (
            probed.injection.layer_stats_doc() if probed.injection is not None else {}
        ),
        "fingerprint": probed.fingerprint,
        "trained_steps": trained_steps,
        "files": {
            "adapter": ADAPTER if probed.injection is not None else None,
            "lora": LORA_DIR if probed.lora is not None else None,
        },
        "config": cfg.to_dict(),
    }


def save_probe(run_dir: Path, probed: ProbedModel, cfg: Any, trained_steps: int) -> None:
    """Write the adapter weights and ``probe.json`` (each file replaced atomically)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if probed.injection is not None:
        state = {k: v.detach().cpu().contiguous() for k, v in probed.injection.state_dict().items()}
        tmp = temp_sibling(run_dir / ADAPTER)
        save_file(state, str(tmp), metadata={"format": FORMAT, "method": probed.method.name})
        tmp.replace(run_dir / ADAPTER)
    if probed.lora is not None:  # swapped in whole (base.swap: an atomic exchange where it can)
        with atomic_directory(
            run_dir / LORA_DIR, replace=True, complete=_lora_complete, warning=AdapterWarning
        ) as tmp_dir:
            probed.model.save_pretrained(str(tmp_dir), save_embedding_layers=False)
    record = probe_record(probed, cfg, trained_steps)
    record["sha256"] = {name: sha256_file(run_dir / name) for name in _adapter_files(record)}
    atomic_write_json(run_dir / PROBE_JSON, record)


def _lora_complete(path: Path) -> bool:
    """Whether ``path`` holds a whole PEFT adapter (what a killed swap may put back)."""
    return all((path / name).is_file() for name in LORA_FILES)


def recover_lora(lora_dir: Path) -> None:
    """Put back the LoRA directory a probe killed while swapping a new one in left aside
    (:func:`attnlab.base.swap.recover`), each step said in an :class:`AdapterWarning`."""
    for sentence in recover(Path(lora_dir).absolute(), _lora_complete):
        warnings.warn(sentence, AdapterWarning, stacklevel=3)


def _adapter_files(record: dict[str, Any]) -> list[str]:
    files = record.get("files", {})
    out = [files["adapter"]] if files.get("adapter") else []
    if files.get("lora"):
        out += [f"{files['lora']}/{name}" for name in LORA_FILES]
    return out


def _damaged(path: Path, record: dict[str, Any]) -> list[str]:
    """Adapter files whose content no longer matches ``probe.json`` (none for old records)."""
    hashes = record.get("sha256")
    if not isinstance(hashes, dict):
        return []
    bad = []
    for name, digest in hashes.items():
        file = path / name
        if not file.is_file() or sha256_file(file) != digest:
            bad.append(name)
    return bad


def _from_checkpoint(path: Path, probed: ProbedModel, damaged: list[str]) -> None:
    """Load the trainable tensors of the newest intact checkpoint in place of damaged files."""
    ckpt = checkpoint.load_latest(path, with_optim=False)
    if ckpt is None:
        raise UserError(
            f"{', '.join(str(path / n) for n in damaged)} changed since it was written (sha256 "
            "mismatch) and the probe has no checkpoint to rebuild it from; rerun the probe with "
            "--restart"
        )
    params = dict(probed.trainable())
    if set(params) != set(ckpt.model):
        raise UserError(f"{ckpt.path} does not hold this method's tensors; rerun with --restart")
    warnings.warn(
        f"{', '.join(damaged)} in {path} changed since it was written (sha256 mismatch); using "
        f"the trained tensors of checkpoint {ckpt.path.name} instead",
        AdapterWarning,
        stacklevel=3,
    )
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(ckpt.model[name].to(p.device))


def read_probe_json(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    file = path / PROBE_JSON
    if not file.is_file():
        raise UserError(
            f"{path} is not a probe directory (no {PROBE_JSON}); give the --out of `attnlab probe`"
        )
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as e:
        raise UserError(f"{file} is not valid JSON ({e}); re-run the probe") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise UserError(f"{file} is not an attnlab probe record")
    return record


def load_probed(
    path: str | Path, device: str | torch.device = "cpu", base: BaseProvider = None
) -> ProbedModel:
    """The base of ``path``'s probe with its trained adapter attached, in eval mode."""
    path = Path(path)
    record = read_probe_json(path)
    rundir.recorded_plugins(path)  # a moved plugin is then reported with its recorded sha256
    try:
        cfg = validate_probe(upgrade_recorded(record["config"]))
    except ConfigError as e:
        raise UserError(
            f"{path / PROBE_JSON} holds a config this attnlab cannot read: {e}"
        ) from None
    rundir.check_plugins(path)
    probed = build_probed_model(cfg, torch.device(device), base)
    check_fingerprint(record.get("fingerprint", {}), probed.fingerprint, str(path))
    files = record.get("files", {})
    if files.get("lora") and not (path / LORA_DIR).exists():
        recover_lora(path / LORA_DIR)  # a probe killed while swapping its adapter in
    damaged = _damaged(path, record)
    if damaged:
        _from_checkpoint(path, probed, damaged)
        probed.model.eval()
        return probed
    if probed.injection is not None:
        adapter = path / (files.get("adapter") or ADAPTER)
        if not adapter.is_file():
            raise UserError(f"{adapter} is missing; the probe has not saved its adapter yet")
        probed.injection.load_state_dict(load_file(str(adapter), device=str(device)))
    if probed.lora is not None:
        _load_lora(probed, path / (files.get("lora") or LORA_DIR), device)
    probed.model.eval()
    return probed


def _load_lora(probed: ProbedModel, lora_dir: Path, device: str | torch.device) -> None:
    from peft import set_peft_model_state_dict

    config_file, weights = lora_dir / "adapter_config.json", lora_dir / "adapter_model.safetensors"
    if not weights.is_file() or not config_file.is_file():
        raise UserError(f"{lora_dir} has no PEFT adapter (adapter_config.json + safetensors)")
    saved_rank = json.loads(config_file.read_text(encoding="utf-8")).get("r")
    if probed.lora is not None and saved_rank != probed.lora.rank:
        raise UserError(
            f"{lora_dir} holds LoRA rank {saved_rank} but the config solves rank "
            f"{probed.lora.rank} on this base; it was trained on another base"
        )
    result = set_peft_model_state_dict(probed.model, load_file(str(weights), device=str(device)))
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise UserError(f"{weights} has tensors this model lacks: {unexpected[:5]}")


def load_probed_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[Any, Any]:
    """(model, tokenizer): the frozen base with the probe's adapter re-attached, in eval mode.

    ``model`` is a transformers causal LM (a PEFT model when the method has LoRA) whose forward
    includes the injected parts. Used by ``attnlab eval PROBE_DIR``.
    """
    probed = load_probed(path, device)
    return probed.model, probed.tokenizer
