"""Log lines that other libraries print while they are imported, dropped at their logger.

torchao (the ``quant`` extra) is imported by transformers whenever a model class is (its
``quantizers`` package), so ``export``, ``probe``, ``eval hf:...`` and ``attnlab quantize`` all
import it. On a CPU-only torch build its ``__init__`` logs, on the ``torchao`` logger::

    Failed to load .../torchao/_C_mxfp8...so: Could not load this library: ...
    Failed to load .../torchao/_C_cutlass_90a.abi3.so: ...

(CUDA kernel libraries, which a CPU torch cannot load and never calls), and registering its
enums logs a deprecation note on ``torch.utils._pytree`` ("... is an Enum subclass and is now
natively supported by torch.compile ..."). Neither tells a user anything they can act on, and
both break a command's one-line stderr. :func:`drop_import_noise` adds one
:class:`logging.Filter` to each of those two loggers that drops exactly these records; every
other record of theirs still prints. On a CUDA build of torch the "Failed to load" line is kept:
there it may be a real fault.

Cost: one filter call per record on those two loggers; nothing is imported.
"""

from __future__ import annotations

import logging
import re
import sys

#: torchao's own logger (``logging.getLogger(__name__)`` in ``torchao/__init__.py``)
TORCHAO_LOGGER = "torchao"
#: the logger of torch's pytree registrations
PYTREE_LOGGER = "torch.utils._pytree"

_FAILED_SO = re.compile(r"^Failed to load \S*torchao[/\\]_C\w*[.\w-]*\.so\b")
_ENUM_NOTE = "is an Enum subclass and is now natively supported by torch.compile"


def _cpu_only_torch() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and getattr(torch.version, "cuda", None) is None


class _ImportNoise(logging.Filter):
    """Drops torchao's "Failed to load _C*.so" on a CPU-only torch and pytree's enum notes."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.name == TORCHAO_LOGGER and _FAILED_SO.match(message):
            return not _cpu_only_torch()
        return not (record.name == PYTREE_LOGGER and _ENUM_NOTE in message)


def drop_import_noise() -> None:
    """Install the filter on both loggers (idempotent): call it before torchao can be imported."""
    for name in (TORCHAO_LOGGER, PYTREE_LOGGER):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _ImportNoise) for f in logger.filters):
            logger.addFilter(_ImportNoise())
