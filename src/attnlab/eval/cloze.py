"""LAMBADA-style cloze: predict the last word of a passage from everything before it.

Format (LAMBADA / ``lambada_openai``): JSONL with a ``text`` field. As lm-evaluation-harness
does, ``context = text.rsplit(" ", 1)[0]`` and ``target = " " + last word``. Metrics:

* ``acc``: greedy multi-token exact match, i.e. every target token is the argmax at its position;
* ``logprob``: mean over items of ``log p(target | context)`` (nats);
* ``perplexity``: ``exp(-mean logprob)``, lm-eval's ``perplexity`` aggregation for LAMBADA
  (per item, not per token).

Cost: one scored request per item (``score_continuations``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.eval.items import ClozeRow, ItemError, read_items, validate_row
from attnlab.eval.lm import LanguageModel
from attnlab.eval.scoring import (
    ContinuationScore,
    encode_pair,
    mean_and_stderr,
    score_continuations,
)
from attnlab.eval.sources import load_hub_rows


@dataclass(frozen=True)
class ClozeItem:
    context: str
    target: str  # with its leading space, as it continues the context


def cloze_item(text: str) -> ClozeItem:
    """Split a passage at its last space (lm-eval's ``lambada_openai`` doc_to_text/target)."""
    context, sep, last = text.rpartition(" ")
    if not sep or not context or not last:
        raise ItemError(
            f"cloze passage {text[:60]!r} has no 'context last-word' split at a space; every "
            "item's text must end in ' <target word>'"
        )
    return ClozeItem(context, " " + last)


def cloze_row(row: Mapping[str, Any]) -> ClozeItem:
    """A validated row (``text`` a string) as an item."""
    return cloze_item(validate_row(ClozeRow, row).text)


def items_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[ClozeItem]:
    return [cloze_row(r) for r in rows]


def load_cloze_file(path: str | Path, limit: int | None = None) -> list[ClozeItem]:
    """Items of a LAMBADA-format JSONL file (a ``text`` string per line), every one validated."""
    return read_items(path, cloze_row, limit)


def load_lambada(limit: int | None = None) -> list[ClozeItem]:
    """LAMBADA (OpenAI's detokenized test set, 5153 items) from the hub: online only."""
    rows = []
    for row in load_hub_rows(
        "EleutherAI/lambada_openai",
        "default",
        "test",
        task="lambada",
        local_form="cloze:FILE.jsonl (build one with `attnlab eval --build-cloze DATA_DIR`)",
    ):
        rows.append(row)
        if limit is not None and len(rows) >= limit:
            break
    return items_from_rows(rows)


@dataclass(frozen=True)
class ClozeResult:
    scores: list[ContinuationScore]

    def metrics(self) -> dict[str, float | int]:
        acc, acc_se = mean_and_stderr([float(s.is_greedy) for s in self.scores])
        lp, _ = mean_and_stderr([s.logprob for s in self.scores])
        return {
            "acc": acc,
            "acc_stderr": acc_se,
            "logprob": lp,
            "perplexity": math.exp(-lp) if -lp < 709 else math.inf,  # exp overflows past e^709
            "target_tokens": sum(s.n_tokens for s in self.scores),
            "n": len(self.scores),
        }


def evaluate_cloze(
    lm: LanguageModel, items: list[ClozeItem], batch_size: int = 8, progress: bool = False
) -> ClozeResult:
    """Score every item's target given its context."""
    requests = [encode_pair(lm, it.context, it.target) for it in items]
    labels = [f"item {i} (0-based)" for i in range(len(items))]
    return ClozeResult(score_continuations(lm, requests, batch_size, progress, labels))
