"""The attention path a command's model runs, one line per distinct (layer, path, reason).

The engine (``attnlab.model.engine.plan``) and the attention core log the path each call takes,
with why, on the ``attnlab.attention`` logger at INFO, as
``attention path PATH: REASON [mask ...; mods [...]; NORMALISER]``. A command shows each as

    attention: block_sparse (the mask is not SDPA's own at this shape; ...) [mask Sliding(...)]

on stderr, where the progress lines go (``--json`` keeps stdout clean; ``--quiet`` shows none),
once per distinct layer, path and reason: a reason that names a length (``at Tk=1500``) counts
once however many lengths a decoding loop reaches. Cost: one regex per logged line.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Iterator
from typing import TextIO

LOGGER = "attnlab.attention"
#: the layer is the " [mask ...]" that ends the line (a reason may hold brackets of its own)
_LINE = re.compile(r"^attention path (?P<path>\S+): (?P<reason>.*?)(?: \[(?P<layer>mask .*)\])?$")


class AttentionLines(logging.Handler):
    """Prints each distinct attention path line once (``stream``: stderr at the time of the
    line, so a progress bar that redirects stderr places it above itself)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(logging.INFO)
        self.stream = stream
        self.seen: set[tuple[str, ...]] = set()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        m = _LINE.match(message)
        if m is None:  # the engine's other notes (flushing denormals)
            key, line = (message,), message
        else:
            layer, path, reason = m["layer"] or "", m["path"], m["reason"]
            key = (layer, path, re.sub(r"\d+", "#", reason))
            line = f"attention: {path} ({reason})" + (f" [{layer}]" if layer else "")
        if key in self.seen:
            return
        self.seen.add(key)
        self.lines.append(line)
        print(line, file=self.stream or sys.stderr, flush=True)


@contextlib.contextmanager
def attention_lines(quiet: bool = False) -> Iterator[AttentionLines | None]:
    """Show the attention path lines while the block runs (nothing when ``quiet``)."""
    if quiet:
        yield None
        return
    log = logging.getLogger(LOGGER)
    handler, level = AttentionLines(), log.level
    log.addHandler(handler)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
