"""Multiple choice by log-likelihood: a generic format (``mc``), HellaSwag and ARC.

For an item with context ``c`` and choices ``a_1..a_m`` each continuation is ``" " + a_j`` and
``ll_j = log p(" " + a_j | c)``. As lm-evaluation-harness:

* ``acc``: ``argmax_j ll_j`` is the gold choice;
* ``acc_norm``: ``argmax_j ll_j / len(a_j)``, the length in characters of the choice text
  (equal to its UTF-8 byte length for ASCII text) — lm-eval's length normalisation.

Formats (one JSON object per line):

* ``mc`` (generic): ``query`` (the context), ``choices`` (a list of strings), ``gold`` (the index
  of the right choice). No preprocessing at all: lm-eval's ``multiple_choice`` output type with
  its defaults (``doc_to_text: query``, ``doc_to_choice: choices``, ``doc_to_target: gold``,
  target delimiter ``" "``); use it for your own multiple-choice files. It also reads
  ``{ctx, endings, label}`` (HellaSwag's fields, text as is) and ``{question, choices, answer}``
  (or ``answerKey``), with ``choices`` a list or ARC's ``{text, label}`` and the answer an index,
  a letter or a label; other names are mapped in the task: ``mc:FILE?query=Q&choices=C&gold=G``.
* HellaSwag (``hellaswag``): the official HellaSwag JSONL ``ctx_a``/``ctx_b`` (or ``ctx``),
  optional ``activity_label``, ``endings``, ``label``; the text is preprocessed as lm-eval's ``hellaswag`` task does (WikiHow ``[title]``
  markers become sentence breaks, other bracketed artefacts are removed, double spaces closed,
  ends stripped): right for HellaSwag, wrong for any other file (it changes the text scored).
* ARC: ``question``, ``choices: {text: [...], label: [...]}``, ``answerKey``; the prompt is
  ``"Question: {question}\\nAnswer:"`` (lm-eval's ``arc_easy``/``arc_challenge``).

Every item is validated with strict types before anything is scored (:mod:`attnlab.eval.items`).
Cost: one scored request per choice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError
from attnlab.eval.items import (
    ArcChoices,
    ArcRow,
    HellaswagRow,
    ItemError,
    McRow,
    choice_index,
    read_items,
    validate_row,
)
from attnlab.eval.lm import LanguageModel
from attnlab.eval.scoring import encode_pair, mean_and_stderr, score_continuations
from attnlab.eval.sources import load_hub_rows


@dataclass(frozen=True)
class MCItem:
    context: str
    choices: list[str]
    gold: int


def hellaswag_preprocess(text: str) -> str:
    """lm-eval's HellaSwag text cleaning."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


#: the field names ``mc`` recognises, in this order (the first whose three fields the file's first
#: item has is used): ours, HellaSwag's, and question/choices/answer (ARC-like data sets)
MC_SHAPES: tuple[dict[str, str], ...] = (
    {"query": "query", "choices": "choices", "gold": "gold"},
    {"query": "ctx", "choices": "endings", "gold": "label"},
    {"query": "question", "choices": "choices", "gold": "answer"},
    {"query": "question", "choices": "choices", "gold": "answerKey"},
)


def mc_item(row: Mapping[str, Any], fields: Mapping[str, str] | None = None) -> MCItem:
    """A generic item, its text taken as it is. ``fields`` maps ``query``, ``choices``, ``gold``
    to the file's names (default: those names). ``choices`` is a list of strings or ARC's
    ``{text, label}``; ``gold`` an index (integer or digits), a letter, or a label."""
    names = {**MC_SHAPES[0], **(fields or {})}
    picked = {ours: row[theirs] for ours, theirs in names.items() if theirs in row}
    item = validate_row(McRow, picked, names)
    labels = None
    if isinstance(item.choices, ArcChoices):
        texts, labels = item.choices.text, item.choices.label
        _same_length(texts, labels, names["choices"])
    else:
        texts = item.choices
    return MCItem(item.query, list(texts), choice_index(item.gold, texts, names["gold"], labels))


def detect_mc_fields(row: Mapping[str, Any], path: str | Path) -> dict[str, str]:
    """The first of :data:`MC_SHAPES` the row has, else a :class:`ItemError` naming them."""
    for shape in MC_SHAPES:
        if all(name in row for name in shape.values()):
            return dict(shape)
    known = "; ".join("{" + ", ".join(s.values()) + "}" for s in MC_SHAPES)
    raise ItemError(
        f"{path}: the first item has none of the field sets mc reads ({known}); it has "
        f"{', '.join(map(repr, list(row)[:12])) or 'no fields'}. Name yours: "
        f"mc:{path}?query=FIELD&choices=FIELD&gold=FIELD"
    )


def hellaswag_item(row: Mapping[str, Any]) -> MCItem:
    """The official HellaSwag format, cleaned as lm-eval's ``hellaswag`` task does."""
    r = validate_row(HellaswagRow, row)
    if r.ctx_a is not None:
        ctx = r.ctx_a + " " + r.ctx_b.capitalize()
    elif r.ctx is not None:
        ctx = r.ctx
    else:
        raise ItemError("a HellaSwag item needs 'ctx_a' and 'ctx_b', or 'ctx'")
    query = hellaswag_preprocess(f"{r.activity_label}: {ctx}" if r.activity_label else ctx)
    choices = [hellaswag_preprocess(e) for e in r.endings]
    return MCItem(query, choices, choice_index(r.label, choices, "label", letters=False))


def hellaswag_process_docs(dataset: Any) -> Any:
    """``process_docs`` for lm-eval task YAMLs: adds ``query``, ``choices`` and ``gold`` with the
    same preprocessing attnlab's own HellaSwag evaluation uses."""

    def one(doc: Mapping[str, Any]) -> dict[str, Any]:
        item = hellaswag_item(doc)
        return {"query": item.context, "choices": item.choices, "gold": item.gold}

    return dataset.map(one)


def arc_item(row: Mapping[str, Any]) -> MCItem:
    """ARC: ``Question: {question}\\nAnswer:`` and the choice ``answerKey`` labels."""
    r = validate_row(ArcRow, row)
    texts, labels = r.choices.text, r.choices.label
    _same_length(texts, labels, "choices")
    gold = choice_index(r.answerKey, texts, "answerKey", labels)
    return MCItem(f"Question: {r.question}\nAnswer:", list(texts), gold)


def _same_length(texts: list[str], labels: list[str], field: str) -> None:
    if len(texts) != len(labels):
        raise ItemError(
            f"field {field!r} has {len(texts)} texts and {len(labels)} labels; give one label "
            "per text"
        )


FORMATS = {"mc": mc_item, "hellaswag": hellaswag_item, "arc": arc_item}

HUB = {
    "hellaswag": ("Rowan/hellaswag", None, "validation", "hellaswag"),
    "arc_easy": ("allenai/ai2_arc", "ARC-Easy", "test", "arc"),
    "arc_challenge": ("allenai/ai2_arc", "ARC-Challenge", "test", "arc"),
}


def split_fields(arg: str) -> tuple[str, dict[str, str] | None]:
    """``FILE?query=ctx&choices=endings&gold=label`` -> (FILE, {query: ctx, ...}); a file that
    exists under the whole name, or no ``?``: (arg, None)."""
    path, sep, query = arg.rpartition("?")
    if not sep or Path(arg).exists():
        return arg, None
    fields: dict[str, str] = {}
    for pair in query.split("&"):
        key, eq, value = pair.partition("=")
        if key not in MC_SHAPES[0] or not eq or not value:
            raise UserError(
                f"mc:{arg}: {pair!r} is not a field mapping; after '?' write "
                "query=FIELD&choices=FIELD&gold=FIELD (any of the three)"
            )
        fields[key] = value
    return path, fields


def load_mc_file(
    fmt: str, path: str | Path, limit: int | None = None, fields: Mapping[str, str] | None = None
) -> list[MCItem]:
    """Items of a local JSONL file in format ``fmt`` (``mc``, ``hellaswag`` or ``arc``); every
    item is validated. For ``mc``, ``fields`` names the file's query/choices/gold fields (None:
    recognised from the first item, :data:`MC_SHAPES`)."""
    make = FORMATS[fmt]
    if fmt == "mc":
        names = dict(fields) if fields else None

        def make(row: Mapping[str, Any]) -> MCItem:
            nonlocal names
            names = names or detect_mc_fields(row, path)
            return mc_item(row, names)

    return read_items(path, make, limit)


def load_mc_hub(task: str, limit: int | None = None) -> list[MCItem]:
    """``hellaswag``, ``arc_easy`` or ``arc_challenge`` from the hub (online only)."""
    path, name, split, fmt = HUB[task]
    make = FORMATS[fmt]
    items = []
    for i, row in enumerate(
        load_hub_rows(path, name, split, task=task, local_form=f"{fmt}:FILE.jsonl")
    ):
        try:
            items.append(make(row))
        except ItemError as e:
            raise ItemError(f"hub dataset {path}, item {i} (0-based): {e}") from None
        if limit is not None and len(items) >= limit:
            break
    return items


@dataclass(frozen=True)
class MCResult:
    items: list[MCItem]
    logprobs: list[list[float]]

    def predictions(self) -> list[tuple[int, int]]:
        """Per item: (argmax of ll, argmax of ll / len(choice)); ties go to the first choice."""
        out = []
        for item, lls in zip(self.items, self.logprobs):
            norm = [ll / max(len(c), 1) for ll, c in zip(lls, item.choices)]
            out.append((_argmax(lls), _argmax(norm)))
        return out

    def per_item(self) -> list[dict[str, float]]:
        return [
            {"acc": float(p == it.gold), "acc_norm": float(pn == it.gold)}
            for it, (p, pn) in zip(self.items, self.predictions())
        ]

    def metrics(self) -> dict[str, float | int]:
        rows = self.per_item()
        acc, acc_se = mean_and_stderr([r["acc"] for r in rows])
        norm, norm_se = mean_and_stderr([r["acc_norm"] for r in rows])
        return {
            "acc": acc,
            "acc_stderr": acc_se,
            "acc_norm": norm,
            "acc_norm_stderr": norm_se,
            "n": len(rows),
        }


def _argmax(values: Iterable[float]) -> int:
    vals = list(values)
    return max(range(len(vals)), key=lambda i: (vals[i], -i))


def evaluate_multiple_choice(
    lm: LanguageModel, items: list[MCItem], batch_size: int = 8, progress: bool = False
) -> MCResult:
    """Log-likelihood of every choice of every item."""
    requests, owner, labels = [], [], []
    for i, item in enumerate(items):
        for j, choice in enumerate(item.choices):
            requests.append(encode_pair(lm, item.context, " " + choice))
            owner.append(i)
            labels.append(f"item {i} (0-based), choice {j}")
    scores = score_continuations(lm, requests, batch_size, progress, labels)
    lls: list[list[float]] = [[] for _ in items]
    for i, s in zip(owner, scores):
        lls[i].append(s.logprob)
    return MCResult(items, lls)
