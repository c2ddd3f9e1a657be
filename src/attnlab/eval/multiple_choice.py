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
  target delimiter ``" "``); use it for your own multiple-choice files.
* HellaSwag (``hellaswag``): the official HellaSwag JSONL ``ctx_a``/``ctx_b`` (or ``ctx``), optional ``activity_label``, ``endings``,
  ``label``; the text is preprocessed as lm-eval's ``hellaswag`` task does (WikiHow ``[title]``
  markers become sentence breaks, other bracketed artefacts are removed, double spaces closed,
  ends stripped): right for HellaSwag, wrong for any other file (it changes the text scored).
* ARC: ``question``, ``choices: {text: [...], label: [...]}``, ``answerKey``; the prompt is
  ``"Question: {question}\\nAnswer:"`` (lm-eval's ``arc_easy``/``arc_challenge``).

Cost: one scored request per choice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError
from attnlab.eval.lm import LanguageModel
from attnlab.eval.scoring import encode_pair, mean_and_stderr, score_continuations
from attnlab.eval.sources import load_hub_rows, read_jsonl


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


def mc_item(row: Mapping[str, Any]) -> MCItem:
    """A generic item, taken as it is: ``query``, ``choices``, ``gold``."""
    choices = row["choices"]
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise UserError("'choices' must be a non-empty list of strings")
    if not isinstance(row["query"], str):
        raise UserError("'query' must be a string")
    return MCItem(row["query"], list(choices), _gold_index(row["gold"], len(choices)))


def hellaswag_item(row: Mapping[str, Any]) -> MCItem:
    if "ctx_a" in row:
        ctx = str(row["ctx_a"]) + " " + str(row.get("ctx_b", "")).capitalize()
    elif "ctx" in row:
        ctx = str(row["ctx"])
    else:
        raise UserError("a HellaSwag item needs 'ctx_a' and 'ctx_b', or 'ctx'")
    label = row.get("activity_label")
    query = hellaswag_preprocess(f"{label}: {ctx}" if label else ctx)
    choices = [hellaswag_preprocess(str(e)) for e in row["endings"]]
    return MCItem(query, choices, _gold_index(row["label"], len(choices)))


def hellaswag_process_docs(dataset: Any) -> Any:
    """``process_docs`` for lm-eval task YAMLs: adds ``query``, ``choices`` and ``gold`` with the
    same preprocessing attnlab's own HellaSwag evaluation uses."""

    def one(doc: Mapping[str, Any]) -> dict[str, Any]:
        item = hellaswag_item(doc)
        return {"query": item.context, "choices": item.choices, "gold": item.gold}

    return dataset.map(one)


def arc_item(row: Mapping[str, Any]) -> MCItem:
    choices = row["choices"]
    if not isinstance(choices, Mapping) or "text" not in choices or "label" not in choices:
        raise UserError("an ARC item needs choices: {text: [...], label: [...]}")
    labels = [str(x) for x in choices["label"]]
    key = str(row["answerKey"])
    if key not in labels:
        raise UserError(f"ARC answerKey {key!r} is not one of the choice labels {labels}")
    prompt = f"Question: {row['question']}\nAnswer:"
    return MCItem(prompt, [str(t) for t in choices["text"]], labels.index(key))


def _gold_index(label: Any, n: int) -> int:
    try:
        gold = int(label)
    except (TypeError, ValueError):
        raise UserError(f"label {label!r} is not a choice index") from None
    if not 0 <= gold < n:
        raise UserError(f"label {gold} is out of range for {n} choices")
    return gold


FORMATS = {
    "mc": (mc_item, ("query", "choices", "gold")),
    "hellaswag": (hellaswag_item, ("endings", "label")),
    "arc": (arc_item, ("question", "choices", "answerKey")),
}

HUB = {
    "hellaswag": ("Rowan/hellaswag", None, "validation", "hellaswag"),
    "arc_easy": ("allenai/ai2_arc", "ARC-Easy", "test", "arc"),
    "arc_challenge": ("allenai/ai2_arc", "ARC-Challenge", "test", "arc"),
}


def load_mc_file(fmt: str, path: str | Path, limit: int | None = None) -> list[MCItem]:
    """Items of a local JSONL file in format ``fmt`` (``mc``, ``hellaswag`` or ``arc``)."""
    make, required = FORMATS[fmt]
    rows = read_jsonl(path, required=required)[:limit]
    out = []
    for n, row in enumerate(rows, 1):
        try:
            out.append(make(row))
        except UserError as e:
            raise UserError(f"{path}: item {n - 1} (0-based): {e}") from None
    return out


def load_mc_hub(task: str, limit: int | None = None) -> list[MCItem]:
    """``hellaswag``, ``arc_easy`` or ``arc_challenge`` from the hub (online only)."""
    path, name, split, fmt = HUB[task]
    make, _ = FORMATS[fmt]
    items = []
    for row in load_hub_rows(path, name, split, task=task, local_form=f"{fmt}:FILE.jsonl"):
        items.append(make(row))
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
