"""A planted-fact corpus: facts ``key=value;`` stated in training documents, queried in
validation documents, with every statement's token positions recorded (the positive control of
retrieval: a model that reads its neighbours can copy a value it has never seen in its context).

``attnlab data synth-facts --out DIR [--facts N] [--mentions M] [--tokenizer T] ...``:

1. ``facts`` random facts, a key of ``key_len`` and a value of ``value_len`` lower-case letters
   (keys unique). Each fact is stated in ``mentions`` training documents, ``facts_per_doc`` facts
   per document, between filler sentences of pseudo-words; each fact is stated again in one
   validation document (``facts_per_doc`` per document). A value's letters carry ln 26 = 3.26
   nats each unless the model has seen the fact: its answer tokens.
2. A document lands in the split it was written for: ``attnlab data prepare`` splits by a seeded
   hash of the text (:mod:`attnlab.data.split`), so the generator redraws a document's last
   filler word until its hash falls on the intended side for ``val_fraction`` and ``split_seed``.
3. The corpus is prepared into ``DIR`` (the usual data directory) with the given tokenizer, and
   ``DIR/facts/`` gets ``corpus.jsonl``, ``facts.json`` (the settings and the facts) and
   ``statements-{train,val}.npy``: int64 rows ``[fact, key_start, value_start, value_end]``,
   positions in that split's token stream (``train.bin``/``val.bin``): the key's tokens (with the
   space before it) are ``[key_start, value_start - 1)`` (then ``=``), the answer tokens ``[value_start, value_end)``.
   A statement whose tokens do not split at its ``=`` and ``;`` is not recorded (none with the
   built-in tokenizers: GPT-2's pre-tokeniser cuts letters from punctuation).

Cost: linear in the text; a prepare of the result.
"""

from __future__ import annotations

import json
import random
import shutil
import string
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from attnlab.base.errors import UserError
from attnlab.data.split import document_u

SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


class FactsSpec(BaseModel):
    """The generator's settings (recorded in ``facts/facts.json``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    facts: int = Field(200, ge=1)
    mentions: int = Field(3, ge=1)
    facts_per_doc: int = Field(2, ge=1)
    filler_sentences: int = Field(4, ge=0, description="filler sentences around each statement")
    key_len: int = Field(6, ge=3)
    value_len: int = Field(3, ge=1)
    val_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    split_seed: int = 0
    seed: int = 0


def _filler(rng: random.Random, words: list[str], n: int) -> str:
    out = []
    for _ in range(n):
        s = " ".join(rng.choice(words) for _ in range(rng.randint(5, 10)))
        out.append(s.capitalize() + ".")
    return " ".join(out)


def _document(rng: random.Random, words: list[str], facts: list[tuple[str, str]], spec) -> str:
    parts = [_filler(rng, words, rng.randint(1, max(1, spec.filler_sentences)))]
    for key, value in facts:
        parts.append(f"{key}={value};")
        parts.append(_filler(rng, words, rng.randint(1, max(1, spec.filler_sentences))))
    return " ".join(parts)


def _landing(rng: random.Random, words: list[str], text: str, val: bool, spec) -> str:
    """``text`` with a last filler word drawn until prepare's hash puts it in the wanted split."""
    while True:
        out = f"{text} {rng.choice(words).capitalize()}."
        if (document_u(out, spec.split_seed) < spec.val_fraction) == val:
            return out


def make_documents(spec: FactsSpec) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """The documents (``{"text", "split", "facts"}``, shuffled) and the facts (key, value)."""
    rng = random.Random(spec.seed)
    words = sorted(
        {"".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(600)}
    )
    keys: set[str] = set()
    while len(keys) < spec.facts:
        keys.add("".join(rng.choice(string.ascii_lowercase) for _ in range(spec.key_len)))
    facts = [
        (k, "".join(rng.choice(string.ascii_lowercase) for _ in range(spec.value_len)))
        for k in sorted(keys)
    ]
    docs = []
    for split, copies in (("train", spec.mentions), ("val", 1)):
        order = [f for f in range(len(facts)) for _ in range(copies)]
        rng.shuffle(order)
        for lo in range(0, len(order), spec.facts_per_doc):
            ids = order[lo : lo + spec.facts_per_doc]
            text = _document(rng, words, [facts[i] for i in ids], spec)
            text = _landing(rng, words, text, split == "val", spec)
            docs.append({"text": text, "split": split, "facts": ids})
    rng.shuffle(docs)
    return docs, facts


def _statements(tok: Any, text: str, facts: list[tuple[str, str]], ids: list[int], at: int):
    """Token rows [fact, key_start, value_start, value_end] of ``text``'s statements, offset by
    ``at``; a statement whose tokens do not split at its boundaries is left out."""
    full = tok.encode(text)
    rows = []
    for f in ids:
        key, value = facts[f]
        ks = text.index(f"{key}={value};")
        vs, ve = ks + len(key) + 1, ks + len(key) + 1 + len(value)
        ks -= text[ks - 1 : ks] == " "  # the space before a word is its token's (GPT-2 and BPEs)
        pieces = [tok.encode(text[a:b]) for a, b in ((0, ks), (ks, vs), (vs, ve), (ve, len(text)))]
        if [t for p in pieces for t in p] != full:
            continue
        a, b, c = (len(pieces[0]), len(pieces[0]) + len(pieces[1]), sum(map(len, pieces[:3])))
        rows.append([f, at + a, at + b, at + c])
    return rows, len(full) + 1  # + end-of-text


def generate(out: str | Path, spec: FactsSpec, tokenizer: str = "bytes") -> dict[str, Any]:
    """Write the corpus, prepare it into ``out`` and record the statements (module doc)."""
    from attnlab.data.preparation import prepare
    from attnlab.data.tokendata import TokenData

    out = Path(out)
    if out.exists():
        raise UserError(f"{out} exists; give a new directory to --out (or remove it)")
    docs, facts = make_documents(spec)
    staging = out.parent / f".{out.name}.facts"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    corpus = staging / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d["text"]}) + "\n" for d in docs))
    prepare(
        str(corpus),
        tokenizer,
        out,
        val_fraction=spec.val_fraction,
        split_seed=spec.split_seed,
        progress=False,
    )
    data = TokenData.open(out)
    at = {"train": 0, "val": 0}
    rows: dict[str, list] = {"train": [], "val": []}
    for d in docs:
        got, n = _statements(data.tokenizer, d["text"], facts, d["facts"], at[d["split"]])
        rows[d["split"]] += got
        at[d["split"]] += n
    for split in ("train", "val"):  # the generator's split is prepare's split, token for token
        if at[split] != len(data.split(split)):
            raise UserError(
                f"internal: the {split} split has {len(data.split(split))} tokens, "
                f"the generator counted {at[split]}"
            )
        arr = np.asarray(rows[split], dtype=np.int64).reshape(-1, 4)
        np.save(staging / f"statements-{split}.npy", arr)
    record = {
        "spec": spec.model_dump(),
        "tokenizer": tokenizer,
        "facts": [{"key": k, "value": v} for k, v in facts],
        "statements": {s: len(r) for s, r in rows.items()},
        "documents": {s: sum(d["split"] == s for d in docs) for s in ("train", "val")},
    }
    (staging / "facts.json").write_text(json.dumps(record, indent=1) + "\n")
    staging.replace(out / "facts")
    return record


def load_statements(data_dir: str | Path, split: str) -> np.ndarray:
    """``[fact, key_start, value_start, value_end]`` rows of a synth-facts data directory."""
    path = Path(data_dir) / "facts" / f"statements-{split}.npy"
    if not path.is_file():
        raise UserError(f"{path} is missing: {data_dir} was not made by `attnlab data synth-facts`")
    return np.load(path)
