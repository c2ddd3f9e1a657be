"""Build a LAMBADA-format cloze set from held-out text (a prepared corpus's validation split).

LAMBADA kept passages whose last word human readers could guess from the whole passage but not
from the last sentence alone. Without human raters this builder keeps the same spirit with
mechanical filters, in this order:

1. Whitespace is collapsed (a passage is one line) and the text is split into sentences at
   ``.``, ``!`` or ``?`` followed by whitespace and a capital letter, quote or bracket.
2. The target sentence has at least ``min_sentence_words`` words and ends in a plain word
   directly followed by ``.``, ``!`` or ``?``; that word is the target. It must be alphabetic,
   at least 3 letters long and not a stop word (a content word, so it carries meaning).
3. The target word (case-insensitive, as a whole word) also occurs in the context *before* the
   target sentence: the broad context is what makes it guessable (``require_in_context``).
4. The context is the run of whole sentences right before the target sentence, grown backwards
   until the passage (without the target) has at least ``min_context_words`` words; a passage
   that would reach the start of its document first is dropped. Passages with markup residue
   (``{ } | < > =`` or URLs) are dropped.
5. Passages never overlap within a document; ``n`` of all candidates are drawn with ``seed``.

Each item is ``{"text": context + " " + target}`` with the final punctuation removed, which is
the format ``cloze:FILE.jsonl`` and lm-eval's ``lambada_openai`` read.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError

_STOP_WORDS_TEXT = """a about above after again against all also am an and any are as at be because been
    before being below between both but by can could did do does doing down during each either
    else ever every few for from further had has have having he her here hers herself him
    himself his how however i if in into is it its itself just least less like many may me
    might more most much must my myself neither never no nor not now of off often on once one
    only or other others our ours ourselves out over own per perhaps rather same several shall
    she should since so some still such than that the their theirs them themselves then there
    these they this those though through thus to too toward towards under until up upon us
    very was we well were what whatever when where whether which while who whom whose why will
    with within without would yet you your yours yourself yourselves"""
STOP_WORDS = frozenset(_STOP_WORDS_TEXT.split())

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(\[])")
_LAST_WORD = re.compile(r"([A-Za-z]+)[.!?]")
_MARKUP = re.compile(r"[{}|<>=]|https?:|www\.")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` after collapsing whitespace (rule 1)."""
    flat = " ".join(text.split())
    return [s for s in _SENTENCE_END.split(flat) if s]


def target_of(sentence: str, min_sentence_words: int = 4) -> str | None:
    """The sentence's last word if it qualifies as a cloze target (rule 2), else None."""
    words = sentence.split(" ")
    if len(words) < min_sentence_words:
        return None
    m = _LAST_WORD.fullmatch(words[-1])
    if not m:
        return None
    word = m.group(1)
    if len(word) < 3 or word.lower() in STOP_WORDS:
        return None
    return word


def passages_of(
    text: str,
    min_context_words: int = 50,
    min_sentence_words: int = 4,
    require_in_context: bool = True,
) -> list[str]:
    """All non-overlapping cloze passages of one document (rules 1-5 but the draw)."""
    sentences = split_sentences(text)
    out, first_free = [], 0
    for i in range(1, len(sentences)):
        target = target_of(sentences[i], min_sentence_words)
        if target is None:
            continue
        last = sentences[i][:-1]  # drop the final punctuation; the target ends the passage
        n_words = len(last.split(" ")) - 1
        j = i
        while n_words < min_context_words and j > first_free:
            j -= 1
            n_words += len(sentences[j].split(" "))
        if n_words < min_context_words:
            continue
        before = " ".join(sentences[j:i])
        if require_in_context and not re.search(
            rf"\b{re.escape(target)}\b", before, flags=re.IGNORECASE
        ):
            continue
        passage = f"{before} {last}"
        if _MARKUP.search(passage):
            continue
        out.append(passage)
        first_free = i + 1
    return out


def build_cloze_set(
    source: Iterable[str] | str | Path,
    n: int = 500,
    min_context_words: int = 50,
    seed: int = 0,
    out: str | Path | None = None,
    *,
    min_sentence_words: int = 4,
    require_in_context: bool = True,
) -> list[dict[str, Any]]:
    """Draw ``n`` cloze items from ``source`` (texts, or a prepared corpus directory whose
    validation split is used) and write them to ``out`` as JSONL when given.

    Returns fewer than ``n`` items when the text has fewer candidates; raises
    :class:`UserError` when it has none.
    """
    if n < 1:
        raise UserError(f"n must be >= 1, got {n}")
    if isinstance(source, str | Path):
        from attnlab.eval.corpus import corpus_texts

        texts: Iterable[str] = corpus_texts(source, "val")
    else:
        texts = source
    pool = [
        p
        for text in texts
        for p in passages_of(text, min_context_words, min_sentence_words, require_in_context)
    ]
    if not pool:
        raise UserError(
            "no passage passed the cloze filters; give more text or lower min_context_words"
        )
    picked = sorted(random.Random(seed).sample(range(len(pool)), min(n, len(pool))))
    rows = [{"text": pool[i]} for i in picked]
    if out is not None:  # a new file only: a JSON-lines set has no room for attnlab's stamp
        from attnlab.base.outfile import write_new_text

        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        write_new_text(out, text, what="cloze set", force_flag=None)
    return rows
