"""The ``attnlab inspect`` page: one self-contained HTML file.

The captures become JSON inside a ``<script type="application/json">`` element, drawn by a short
script of the page's own (``page.js``: canvas heatmaps with hover values, no library) with its
stylesheet (``page.css``), both inlined: the file fetches nothing when it is opened. Attention
probabilities are stored as integers in thousandths (3 decimals), masks as strings of 0/1.

Escaped for each context it lands in: the title is HTML text (``html.escape``); the JSON sits in
a script element, where the HTML parser looks for ``</script``, ``<!--`` and ``<script`` (a run
named ``<!--<script>`` kept the page's own script from running), so every ``<``, ``>`` and
``&`` in it is written ``\u003c``, ``\u003e``, ``\u0026`` (and U+2028/2029 escaped too), which
JSON reads back unchanged; the page script puts strings in the DOM only as text nodes and
attribute values, never as markup. JSON has no NaN or infinity: a non-finite number (a NaN
weight's attention, loss, statistics) is the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``,
which the page turns back into the number, shows as such and draws in magenta, and a note says
how many there are.
"""

from __future__ import annotations

import html
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.inspection.capture import Capture


def _json_number(x: float) -> float | str:
    """``x``, or ``"NaN"`` / ``"Infinity"`` / ``"-Infinity"`` (JSON holds no such number)."""
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _maps(maps: dict[str, np.ndarray]) -> dict[str, Any]:
    out = {}
    for key, m in maps.items():
        m = np.asarray(m, dtype=np.float64)
        flat = m.ravel()
        finite = np.isfinite(flat)
        data = np.rint(np.clip(np.where(finite, flat, 0.0), 0.0, 1.0) * 1000).astype(np.int64)
        values: list[Any] = data.tolist()
        for i in np.flatnonzero(~finite):  # rare: a NaN model's maps
            values[i] = _json_number(float(flat[i]))
        out[key] = {"heads": int(m.shape[0]), "data": values}
    return out


def _round(a: np.ndarray | float, digits: int = 4) -> Any:
    """``a`` rounded to ``digits``, as nested lists, non-finite values as strings."""
    arr = np.round(np.asarray(a, dtype=np.float64), digits)
    if arr.ndim == 0:
        return _json_number(float(arr))
    return (
        [_round(x, digits) for x in arr]
        if arr.ndim > 1
        else [_json_number(x) for x in arr.tolist()]
    )


def non_finite(c: Capture) -> int:
    """How many of the numbers ``c`` shows are NaN or infinite."""
    arrays = [np.asarray([x for x in c.loss if x is not None], dtype=np.float64)]
    arrays += [np.asarray([p for row in c.top for _, p in row], dtype=np.float64)]
    for lv in c.layers:
        arrays += [np.asarray(m, dtype=np.float64) for m in lv.maps.values()]
        arrays += [np.asarray(v, dtype=np.float64) for v in lv.earlier.values()]
    for p in c.parts:
        arrays += [
            np.asarray(v, dtype=np.float64) for v in (*p.tokens.values(), *p.summary.values())
        ]
        arrays += [np.asarray(list(p.numbers.values()), dtype=np.float64)]
    return int(sum((~np.isfinite(a)).sum() for a in arrays))


def capture_json(c: Capture) -> dict[str, Any]:
    """The page's JSON for one capture."""
    return {
        "name": c.name,
        "target": c.target,
        "kind": c.kind,
        "family": c.family,
        "tokens": c.tokens,
        "start": c.start,
        "n_tokens": c.n_tokens,
        "loss": [None if x is None else _round(x) for x in c.loss],
        "top": [[[w, _round(p)] for w, p in row] for row in c.top],
        "predicts": c.predicts,
        "mask": None
        if c.mask is None
        else ["".join("1" if b else "0" for b in row) for row in c.mask],
        "mask_name": c.mask_name,
        "layers": [
            {
                "name": lv.name,
                "maps": _maps(lv.maps),
                "earlier": {k: _round(v.mean(-1)) for k, v in lv.earlier.items()},
            }
            for lv in c.layers
        ],
        "parts": [
            {
                "name": p.name,
                "kind": p.kind,
                "tokens": {k: {"data": _round(v)} for k, v in p.tokens.items()},
                "summary": {k: _round(v) for k, v in p.summary.items()},
                "numbers": {k: _round(v, 6) for k, v in p.numbers.items()},
                "docs": {k: [s, labels] for k, (s, labels) in p.docs.items()},
            }
            for p in c.parts
        ],
        "notes": c.notes,
    }


def page_data(captures: list[Capture], notes: list[str] | None = None) -> dict[str, Any]:
    same = len(captures) == 2 and captures[0].ids == captures[1].ids
    notes = list(notes or [])
    if len(captures) == 2 and not same:
        notes.append(
            "the two models tokenise the prompt differently: shown side by side, no difference"
        )
    for c in captures:
        bad = non_finite(c)
        if bad:
            notes.append(
                f"{c.name}: {bad:,} of the values shown are NaN or infinite (its weights or "
                "activations are not finite): drawn in magenta, written NaN or Infinity"
            )
    return {
        "title": "attnlab inspect: " + " vs ".join(c.name for c in captures),
        "captures": [capture_json(c) for c in captures],
        "same_tokens": same,
        "notes": notes,
    }


def _asset(name: str) -> str:
    return resources.files("attnlab.inspection").joinpath(name).read_text(encoding="utf-8")


#: what the HTML parser reads inside a script element, as JSON string escapes
_SCRIPT_ESCAPES = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def _writable(text: str) -> str:
    """``text`` with the undecodable bytes of a path (lone surrogates) as U+FFFD: UTF-8 (the
    page's encoding) and a browser's DOM hold no lone surrogate."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def script_json(data: Any) -> str:
    """``data`` as JSON that a ``<script type="application/json">`` element holds verbatim:
    no ``<``, ``>`` or ``&`` (they occur only inside JSON strings, where the escapes mean the
    same characters), no line separators."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return _writable(text).translate(_SCRIPT_ESCAPES)


def render(data: dict[str, Any]) -> str:
    """The HTML text of a page with ``data``."""
    payload = script_json(data)
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(_writable(data['title']))}</title>"
        f"<style>{_asset('page.css')}</style></head>\n<body>"
        "<div id='tip'></div><div id='root'></div>\n"
        f"<script id='data' type='application/json'>{payload}</script>\n"
        f"<script>{_asset('page.js')}</script>\n</body></html>\n"
    )


def write_page(path: str | Path, captures: list[Capture], notes: list[str] | None = None) -> Path:
    """Write the page atomically; returns its path."""
    from attnlab.base.atomic import atomic_write_text

    path = Path(path)
    atomic_write_text(path, render(page_data(captures, notes)))
    return path
