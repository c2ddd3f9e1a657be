"""The ``attnlab inspect`` page: one self-contained HTML file.

The captures become JSON inside a ``<script type="application/json">`` element, drawn by a short
script of the page's own (``page.js``: canvas heatmaps with hover values, no library) with its
stylesheet (``page.css``), both inlined: the file fetches nothing when it is opened. Attention
probabilities are stored as integers in thousandths (3 decimals), masks as strings of 0/1.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.inspection.capture import Capture


def _maps(maps: dict[str, np.ndarray]) -> dict[str, Any]:
    return {
        key: {
            "heads": int(m.shape[0]),
            "data": np.rint(np.clip(m, 0.0, 1.0) * 1000).astype(np.int64).ravel().tolist(),
        }
        for key, m in maps.items()
    }


def _round(a: np.ndarray, digits: int = 4) -> Any:
    return np.round(np.nan_to_num(a.astype(np.float64)), digits).tolist()


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
        "loss": [None if x is None else round(x, 4) for x in c.loss],
        "top": [[[w, round(p, 4)] for w, p in row] for row in c.top],
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
                "numbers": {k: round(v, 6) for k, v in p.numbers.items()},
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
    return {
        "title": "attnlab inspect: " + " vs ".join(c.name for c in captures),
        "captures": [capture_json(c) for c in captures],
        "same_tokens": same,
        "notes": notes,
    }


def _asset(name: str) -> str:
    return resources.files("attnlab.inspection").joinpath(name).read_text(encoding="utf-8")


def render(data: dict[str, Any]) -> str:
    """The HTML text of a page with ``data``."""
    # "</" cannot end the JSON's script element early once escaped
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(data['title'])}</title>"
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
