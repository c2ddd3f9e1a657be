"""Issue 36, the planted-fact corpus: each fact stated in ``mentions`` training documents and
queried in a validation one, every document in the split it was written for, and the recorded
token positions of every statement decoding to its ``key=value`` (bytes and gpt2)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from attnlab.cli import main
from attnlab.data import TokenData
from attnlab.data.synth_facts import FactsSpec, generate, load_statements


@pytest.mark.parametrize("tokenizer", ["bytes", "gpt2"])
def test_statements_decode_to_their_facts_in_the_split_they_were_written_for(tmp_path, tokenizer):
    spec = FactsSpec(facts=40, mentions=3)
    rec = generate(tmp_path / "d", spec, tokenizer=tokenizer)
    data = TokenData.open(tmp_path / "d")
    facts = rec["facts"]
    for split, copies in (("train", 3), ("val", 1)):
        st = load_statements(tmp_path / "d", split)
        assert len(st) == 40 * copies  # none lost to tokenisation
        assert Counter(st[:, 0].tolist()) == dict.fromkeys(range(40), copies)
        toks = data.split(split)
        for f, ks, vs, ve in st:
            key = data.tokenizer.decode([int(t) for t in toks[ks:vs]])
            value = data.tokenizer.decode([int(t) for t in toks[vs:ve]])
            assert key.strip() == f"{facts[f]['key']}=" and value == facts[f]["value"]
    assert rec["documents"] == {"train": 60, "val": 20}
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    assert meta["splits"]["val"]["documents"] == 20  # prepare's hash split is the generator's


def test_the_same_seed_gives_the_same_data(tmp_path):
    a = generate(tmp_path / "a", FactsSpec(facts=10, seed=3))
    b = generate(tmp_path / "b", FactsSpec(facts=10, seed=3))
    assert a == b
    for split in ("train", "val"):
        ta, tb = TokenData.open(tmp_path / "a"), TokenData.open(tmp_path / "b")
        assert np.array_equal(ta.split(split), tb.split(split))


def test_cli(tmp_path, capsys):
    out = tmp_path / "f"
    assert main(["data", "synth-facts", "--out", str(out), "--facts", "12"]) == 0
    text = capsys.readouterr().out
    assert "facts           12, each in 3 training documents" in text
    assert (out / "facts" / "statements-val.npy").is_file()
    assert main(["data", "synth-facts", "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["data", "synth-facts", "--out", str(tmp_path / "g"), "--facts", "0"]) == 2
    assert "--facts" in capsys.readouterr().err
