"""The one reader of JSON-lines files: corpora (``data.local``) and task files (``eval.sources``).

Each line is one JSON value; blank lines are skipped. A line that is not valid JSON, or is nested
too deeply to read, is a :class:`UserError` naming the file and the line; each caller decodes the
bytes its own way (strict, or with U+FFFD for a corpus) and checks the values it needs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError

#: (the line's bytes, its line number, its byte offset in the file) -> its text
Decode = Callable[[bytes, int, int], str]


def json_lines(
    raw_lines: Iterable[bytes], path: str | Path, decode: Decode
) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of every non-blank line of ``raw_lines`` (a binary file)."""
    offset = 0
    for n, raw in enumerate(raw_lines, start=1):
        line = decode(raw, n, offset)
        offset += len(raw)
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{n}: not valid JSON ({e.msg}); one object per line") from None
        except RecursionError:
            raise UserError(
                f"{path}:{n}: JSON nested too deeply to read; one flat object per line"
            ) from None
