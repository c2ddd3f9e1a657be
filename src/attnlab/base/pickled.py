"""Weights stored with pickle are refused by name: attnlab reads tensors from safetensors only.

A Hugging Face folder may hold ``pytorch_model.bin`` (or ``*.pt``, ``*.pth``, ``*.ckpt``)
instead of ``model.safetensors``. Those files are Python pickles: loading one can run code its
author put there. torch's ``weights_only`` loader blocks the known payloads, but a refusal
with its reason is clearer than its ``UnpicklingError``, and nothing is unpickled at all.
"""

from __future__ import annotations

import os
from pathlib import Path

from attnlab.base.errors import UserError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def pickled_weights(directory: str | os.PathLike) -> list[str]:
    """The weight files of a folder that are pickles, when it has no safetensors weights."""
    d = Path(directory)
    if not d.is_dir() or any(d.glob("*.safetensors")):
        return []
    return sorted(p.name for p in d.iterdir() if p.is_file() and p.suffix in PICKLE_SUFFIXES)


def refuse_pickled_weights(directory: str | os.PathLike, what: str) -> None:
    """A :class:`UserError` naming the pickled weights of ``directory`` (see the module doc)."""
    found = pickled_weights(directory)
    if found:
        raise UserError(
            f"{what}: {Path(directory) / found[0]} is a pickle (PyTorch's .bin format) and "
            "attnlab never unpickles weights, since loading a pickle can run code. Convert the "
            "folder to safetensors where you trust it, e.g. `AutoModelForCausalLM."
            "from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)`, then rerun"
        )
