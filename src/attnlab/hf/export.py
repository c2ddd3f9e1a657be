"""``attnlab export RUN_OR_CHECKPOINT --out DIR``: a standard Hugging Face model folder.

The folder::

    config.json               model_type "attnlab", auto_map (remote code), the attnlab config
    model.safetensors         the weights (tied embeddings stored once, re-tied on load)
    generation_config.json    end-of-text / BOS / padding ids; use_cache as the parts allow
    tokenizer.json, tokenizer_config.json, ...   for AutoTokenizer (:mod:`.tokenizer_files`)
    configuration_attnlab.py, modeling_attnlab.py, attnlab_*.py   the code (:mod:`.vendor`)
    plugins/                  the original source of the run's plugin parts, if any, and under
                              plugins/helpers/ the local modules they import (by module path)
    README.md                 the model card (:mod:`.card`): license, datasets, model-index
    data_attribution.json     the corpus's attribution in full (when its meta.json has one)

The weights are written by transformers' own ``save_pretrained`` from an
:class:`~attnlab.hf.modeling.AttnlabForCausalLM` holding the run's model, and the folder is
written whole next to ``DIR`` and swapped into place atomically, so a failed or killed export
leaves the old folder or the new one at ``DIR``, never half of one (:mod:`.export_out`: where an
export may go, the recorded SHA-256 of every file, and what a killed export left).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

import attnlab
from attnlab.base.errors import UserError
from attnlab.config import Config
from attnlab.hf.export_out import check_out, put_in_place, recover_out
from attnlab.hf.vendor import PluginModule, Vendored, check_tracked, flatten
from attnlab.parts import families, registry
from attnlab.parts.plugins import loaded, source_hash
from attnlab.runs.load import load_source

AUTO_MAP = {
    "AutoConfig": "configuration_attnlab.AttnlabConfig",
    "AutoModelForCausalLM": "modeling_attnlab.AttnlabForCausalLM",
}


@dataclass
class ExportResult:
    """What ``export`` wrote."""

    out: Path
    source: str
    step: int | None
    files: list[str] = field(default_factory=list)
    plugins: list[dict[str, Any]] = field(default_factory=list)


def plugin_modules(cfg: Config) -> tuple[list[PluginModule], list[dict[str, Any]]]:
    """The plugin modules that define the model's non-built-in parts (and its family, recorded
    as ``("family", name, class)``), and their config records."""
    by_module: dict[str, list[tuple[str, str, str]]] = {}
    for slot, opts in cfg.model.slots().items():
        spec = registry.get(slot, opts.kind)
        if spec.kind == "none" or spec.source == registry.BUILTIN:
            continue
        by_module.setdefault(spec.cls.__module__, []).append((slot, spec.kind, spec.cls.__name__))
    fam = families.spec(cfg.model.family)
    if fam.source != registry.BUILTIN:
        entry = (families.SLOT, fam.name, fam.cls.__name__)
        by_module.setdefault(fam.cls.__module__, []).append(entry)
    records = loaded()
    modules, entries = [], []
    for module, parts in by_module.items():
        rec = next(
            (r for r in records if r.module == module or module.startswith(f"{r.module}.")), None
        )
        spec = rec.spec if rec is not None else module
        helpers = tuple(h.module for h in rec.helpers) if rec is not None else ()
        modules.append(PluginModule(module=module, spec=spec, parts=tuple(parts), helpers=helpers))
        entries.append({"spec": spec, "module": module, "parts": [list(p) for p in parts]})
    return modules, entries


def _copy_plugin_sources(folder: Path, entries: list[dict[str, Any]], vendored: Vendored) -> None:
    """Each plugin's original file under ``plugins/`` (what attnlab loads when installed) and its
    helper modules under ``plugins/helpers/``, and the SHA-256 of every copy (checked before any
    is imported)."""
    import sys

    from attnlab.parts.plugins import record_of

    for entry in entries:
        module = sys.modules.get(entry["module"])
        path = Path(getattr(module, "__file__", "") or "")
        entry["flat_module"] = vendored.names[entry["module"]]
        entry["flat_sha256"] = vendored.plugin_sha256[entry["flat_module"]]
        if not path.is_file() or path.name == "__init__.py" or "." in entry["module"]:
            entry["file"], entry["sha256"] = None, None  # a package: loaded by name when installed
            continue
        (folder / "plugins").mkdir(exist_ok=True)
        shutil.copyfile(path, folder / "plugins" / path.name)
        entry["file"] = f"plugins/{path.name}"
        entry["sha256"] = source_hash([folder / "plugins" / path.name])
        record = record_of(entry["spec"])
        entry["helpers"] = [
            _copy_helper(folder, helper, vendored) for helper in (record.helpers if record else ())
        ]


def _copy_helper(folder: Path, helper: Any, vendored: Vendored) -> dict[str, Any]:
    """Copy one helper module (:class:`attnlab.parts.identity.Helper`) to its place under
    ``plugins/helpers/``, refusing one that changed since the plugin imported it."""
    import hashlib

    from attnlab.hf.export_plugins import helper_file

    data = Path(helper.file).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != helper.sha256:
        raise UserError(
            f"the plugin helper {helper.file} (module {helper.module}) changed while the run was "
            "being exported; export again"
        )
    relative = helper_file(helper.module, Path(helper.file).name == "__init__.py")
    (folder / relative).parent.mkdir(parents=True, exist_ok=True)
    (folder / relative).write_bytes(data)
    flat = vendored.names.get(helper.module)
    return {
        "module": helper.module,
        "file": relative,
        "sha256": digest,
        "flat_module": flat,
        "flat_sha256": vendored.plugin_sha256.get(flat) if flat else None,
    }


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No progress bars from transformers while it writes (the CLI prints its own summary)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def export(source: str | Path, out: str | Path, *, force: bool = False) -> ExportResult:
    """Write the Hugging Face folder of a run, a checkpoint or a quantized directory (see the
    module doc)."""
    from attnlab.quant.store import is_quantized_dir

    out = Path(out)
    recover_out(out)  # what a killed export to the same --out left behind
    check_out(source, out, force=force)
    if is_quantized_dir(source):
        from attnlab.hf.export_quant import prepare
        from attnlab.quant.schemes import quiet_torchao

        with quiet_torchao():  # transformers imports torchao's safetensors support as it saves
            model, cfg, tokenizer, step, run_dir, qconfig = prepare(source)
            return export_model(
                model,
                cfg,
                tokenizer,
                out,
                source=str(source),
                step=step,
                run_dir=run_dir,
                quantization=qconfig,
            )
    model, cfg, tokenizer, run_dir, step = load_source(source)
    return export_model(model, cfg, tokenizer, out, source=str(source), step=step, run_dir=run_dir)


def _fill(hf: nn.Module, model: nn.Module, quantization: Any) -> None:
    """``hf`` holds ``model``'s weights: copied in, or (quantized) the model itself."""
    if quantization is None:
        hf.model.load_state_dict(model.state_dict(), strict=True)
        return
    from attnlab.hf.export_quant import attach

    attach(hf, model, quantization)


def _refuse_unexportable(m: Any, source: str) -> None:
    """A family that does not export as a causal LM, or a µP model, is refused by name."""
    if not families.of(m).exports:
        raise UserError(
            f"{source or 'the model'} is a model.family={m.family!r} model; only "
            f"{families.where(lambda f: f.exports)} models export as a transformers causal LM "
            "(AutoModelForCausalLM)"
        )
    if m.parametrisation == "mup":
        raise UserError(
            f"{source or 'the model'} was trained with model.parametrisation='mup', whose readout "
            "multiplier and attention scale the exported transformers model does not apply; "
            "evaluate it with `attnlab eval` instead (exporting µP models is not supported yet)"
        )


def export_model(
    model: nn.Module,
    cfg: Config,
    tokenizer: Any,
    out: str | Path,
    *,
    source: str = "",
    step: int | None = None,
    run_dir: Path | None = None,
    quantization: Any = None,
) -> ExportResult:
    """Write the Hugging Face folder of ``model`` (built from ``cfg``, with ``tokenizer``) to
    ``out``, replacing it; ``run_dir`` adds the run's status and results to the card. Used by
    :func:`export` and by ``attnlab check``, which exports small models that have no run.
    ``quantization``: a ``transformers.TorchAoConfig`` when ``model`` is quantized by torchao
    (:mod:`attnlab.hf.export_quant`): its weights are written in torchao's safetensors form and
    config.json carries the config, so transformers loads the folder quantized."""
    from transformers import GenerationConfig

    from attnlab.base.owned import MARKER
    from attnlab.base.swap import staging_dir
    from attnlab.hf import AttnlabConfig, AttnlabForCausalLM
    from attnlab.hf.card import ATTRIBUTION_FILE, attribution_file, model_card, read_json
    from attnlab.hf.tokenizer_files import write_tokenizer
    from attnlab.model.params import count

    out = Path(os.path.abspath(out))  # `--out .` has no name to put a temporary folder beside
    m = cfg.model
    _refuse_unexportable(m, source)
    modules, plugins = plugin_modules(cfg)
    vendored = flatten(modules)
    recover_out(out)
    tmp = staging_dir(out)  # written whole there, then swapped in (export_out.put_in_place)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _copy_plugin_sources(tmp, plugins, vendored)
        eos = tokenizer.eos_id
        config = AttnlabConfig(
            attnlab_model=m.model_dump(mode="json"),
            attnlab_plugins=plugins,
            attnlab_version=attnlab.__version__,
            vocab_size=m.vocab_size,
            hidden_size=m.d_model,
            num_hidden_layers=m.n_layers * m.loops,
            num_attention_heads=m.attention.n_heads,
            num_key_value_heads=m.n_kv_heads,
            head_dim=m.head_dim,
            max_position_embeddings=m.max_seq_len,
            tie_word_embeddings=m.tie_embeddings,
            use_cache=model.supports_cache,
            bos_token_id=eos,
            eos_token_id=eos,
            pad_token_id=eos,
        )
        config.auto_map = dict(AUTO_MAP)
        hf = AttnlabForCausalLM(config)
        _fill(hf, model, quantization)
        hf.generation_config = GenerationConfig(
            bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, use_cache=model.supports_cache
        )
        with _quiet_transformers():
            hf.save_pretrained(os.fspath(tmp), safe_serialization=True)
        vendored.write(tmp)
        tok_info = write_tokenizer(tokenizer, tmp, m.max_seq_len)
        check_tracked(tmp, vendored)
        data_dir = Path(cfg.data.dir) if cfg.data.dir else None
        data_meta = read_json(data_dir / "meta.json") if data_dir else None
        attribution = attribution_file(data_meta)
        if attribution is not None:
            (tmp / ATTRIBUTION_FILE).write_text(attribution, encoding="utf-8")
        card = model_card(
            cfg=cfg,
            source=str(source),
            step=step,
            status=read_json(run_dir / "status.json") if run_dir else None,
            data_meta=data_meta,
            results=read_json(run_dir / "eval" / "results.json") if run_dir else None,
            params=count(m).to_dict(),
            tokenizer=tok_info,
            plugins=plugins,
            name=out.name,
        )
        (tmp / "README.md").write_text(card, encoding="utf-8")
        put_in_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files = sorted(
        str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != MARKER
    )
    return ExportResult(out=out, source=str(source), step=step, files=files, plugins=plugins)
