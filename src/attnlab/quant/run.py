"""``quantize_run(SOURCE, scheme, out)``: the quantized directory of a run or a checkpoint.

Loads the source's weights (a run's newest intact checkpoint, or ``RUN/checkpoints/step_N``),
builds its model with ``QUANT_OVERRIDES``, quantizes it with the scheme, measures how far its
logits moved (relative RMS error on a fixed batch of random tokens, against the same model in
full precision) and writes the directory (:mod:`attnlab.quant.store`).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch

from attnlab.base.errors import UserError
from attnlab.parts import families
from attnlab.quant.apply import QUANT_OVERRIDES, quantizable_config, quantize_model
from attnlab.quant.schemes import get_scheme
from attnlab.quant.store import KIND, save


def _serves(family) -> bool:
    """A family whose models quantize: they continue text and decode with a KV cache."""
    return family.continues_text and family.decodes_with_cache


def load_source(source: str | os.PathLike) -> tuple[torch.nn.Module, Any, Path, int | None]:
    """(full-precision model built for quantization, Config, run dir, step) of ``source``."""
    from attnlab.model import build_model
    from attnlab.runs.load import load_source as load_run_or_checkpoint

    trained, cfg, _, path, step = load_run_or_checkpoint(source)
    if not _serves(families.of(cfg.model)):
        raise UserError(
            f"{source} is a model.family={cfg.model.family!r} model; attnlab quantize serves "
            f"models that decode with a KV cache ({families.where(_serves)})"
        )
    model = build_model(quantizable_config(cfg).model)
    model.load_state_dict(trained.state_dict(), strict=True)
    return model.eval(), cfg, path, step


def check_out(out: Path, source_run: Path, force: bool) -> None:
    """Refuse an ``--out`` that is or holds the source run, or that holds anything but an
    earlier quantized directory of attnlab's (and that only with ``force``)."""
    from attnlab.base.owned import MARKER, kind_of, overlaps, shown
    from attnlab.base.safepath import check_out_dir

    how = overlaps(out, source_run)
    if how is not None:
        raise UserError(f"--out {out} {how} the source run {source_run}; give another --out")
    check_out_dir(out)
    entries = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not entries:
        return
    if kind_of(out) != KIND:
        raise UserError(
            f"--out {out} is not empty and is not a quantized model of attnlab's: it holds "
            f"{shown(entries)}; give a new or empty directory"
        )
    if not force:
        raise UserError(f"--out {out} holds an earlier quantized model; pass --force to replace it")
    if MARKER not in entries:
        raise UserError(f"--out {out} has no {MARKER}; give a new or empty directory")


@torch.no_grad()
def logits_error(reference: torch.nn.Module, model: torch.nn.Module, vocab: int) -> float:
    """||logits_q - logits|| / ||logits|| on 2 x 32 random tokens (seed 0)."""
    gen = torch.Generator().manual_seed(0)
    seq = min(32, reference.cfg.max_seq_len)
    ids = torch.randint(0, vocab, (2, seq), generator=gen)
    ref = reference(ids).logits.float()
    got = model(ids).logits.float()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def quantize_run(
    source: str | os.PathLike,
    scheme_name: str,
    out: str | os.PathLike,
    *,
    group_size: int | None = None,
    force: bool = False,
    tied_head: bool = False,
) -> dict[str, Any]:
    """Write the quantized directory of ``source`` to ``out``; returns its record.
    ``tied_head``: quantize an LM head tied to the token embedding as its own copy
    (:func:`attnlab.quant.plan.plan`)."""
    scheme = get_scheme(scheme_name)
    size = scheme.group_size(group_size)
    scheme.config(size)  # the quant extra is there, before anything is loaded
    out = Path(os.path.abspath(out))
    full, cfg, run_dir, step = load_source(source)
    check_out(out, run_dir, force)
    model = copy.deepcopy(full)
    plan = quantize_model(model, scheme, size, tied_head=tied_head)
    info = {
        "scheme": scheme.name,
        "group_size": size,
        "tied_head": tied_head,
        "summary": scheme.summary,
        "tolerance": scheme.tolerance,
        "source": str(Path(os.path.abspath(run_dir))),
        "source_arg": str(source),
        "step": step,
        "overrides": list(QUANT_OVERRIDES),
        "quantized": plan.quantized,
        "kept": plan.kept_rows(),
        "logits_rel_rms_error": logits_error(full, model, cfg.model.vocab_size),
        "full_precision_bytes": sum(
            t.numel() * t.element_size() for t in _unique(full.state_dict().values())
        ),
    }
    return save(out, model, cfg, info, full_precision=full)


def _unique(tensors) -> list[torch.Tensor]:
    seen, out = set(), []
    for t in tensors:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            out.append(t)
    return out
