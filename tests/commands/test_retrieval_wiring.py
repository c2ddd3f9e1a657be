"""The retrieval database as train, eval and generate use it (issue 36): each checks it against
its recorded hashes and the data it was built from and refuses a changed one by name; generate
loads the stored index (no BM25 build) and its output depends on the stored database."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("bm25s")

from attnlab.base.errors import UserError
from attnlab.cli import main
from attnlab.data import TokenData
from attnlab.data.retrieval import Database, database_dir
from attnlab.data.retrieval_index import index_spec
from tests.helpers.data import WORDS, prepare_bytes, tiny_run_config, word_corpus

M, K = 8, 2


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> tuple[Path, Path]:
    """(data dir, a 4-step retrieval run on it): 60 word-salad documents as bytes."""
    from attnlab.train import train

    root = tmp_path_factory.mktemp("wiring")
    corpus = word_corpus(root / "corpus.jsonl", WORDS, n_docs=60, length=(40, 90), seed=1)
    data = prepare_bytes(corpus, root / "prepared", val_fraction=0.1)
    cfg = tiny_run_config(
        data, "model.family=retrieval", f"model.retrieval.chunk_size={M}", steps=4, eval_every=4
    )
    train(cfg, root / "run")
    return data, root / "run"


class _Damaged:
    """A file changed for one test (an array zeroed, a byte flipped, or ``keep``: as the test
    changes it), then put back."""

    def __init__(self, path: Path, how: str = "zeros") -> None:
        self.path, self.how = path, how

    def __enter__(self) -> Path:
        self.saved = self.path.read_bytes()
        if self.how == "keep":  # the test changes it
            return self.path
        if self.how == "zeros":  # a valid array of the same shape, every entry 0
            zeros = np.zeros_like(np.load(self.path))
            with self.path.open("wb") as f:
                np.save(f, zeros)
            return self.path
        raw = bytearray(self.saved)  # one token changed in the middle
        raw[len(raw) // 2] ^= 0x01
        self.path.write_bytes(bytes(raw))
        return self.path

    def __exit__(self, *exc) -> None:
        self.path.write_bytes(self.saved)


def _db(data: Path) -> Path:
    return database_dir(data, M, K, M)


def _generate(run: Path, *extra: str) -> list[str]:
    return ["generate", str(run), "--prompt", "the model learns", "--temperature", "0", *extra]


def _refusals(lab, capsys) -> dict[str, str]:
    """What train, eval and generate say (each must refuse: exit code 2, or the error)."""
    from attnlab.train import train

    data, run = lab
    said = {}
    assert main(_generate(run, "--max-new-tokens", "12")) == 2
    said["generate"] = capsys.readouterr().err
    assert main(["eval", str(run), "--tasks", "retrieval", "--limit", "1"]) == 2
    said["eval"] = capsys.readouterr().err
    cfg = tiny_run_config(data, "model.family=retrieval", f"model.retrieval.chunk_size={M}")
    with pytest.raises(UserError) as e:
        train(cfg, run.parent / "another")
    said["train"] = str(e.value)
    return said


@pytest.mark.parametrize("name", ["train.npy", "val.npy", "bigrams/data.npy"])
def test_each_command_refuses_a_zeroed_database_file_by_name(lab, capsys, name):
    data, _ = lab
    with _Damaged(_db(data) / name) as path:
        said = _refusals(lab, capsys)
    for command, text in said.items():
        assert str(path) in text, command
        assert "--restart" in text and "Traceback" not in text, command


def test_changed_token_data_is_refused(lab, capsys):
    data, _ = lab
    with _Damaged(data / "train.bin", how="flip"):
        said = _refusals(lab, capsys)
    for command, text in said.items():
        assert "train.bin" in text and "Traceback" not in text, command


def test_a_database_of_other_data_is_refused_with_the_rebuild_command(lab, capsys):
    """A database whose recorded content hash is not the data's (built from other data, or the
    data prepared again since) is refused by generate, naming both and the rebuild."""
    data, run = lab
    meta = _db(data) / "meta.json"
    saved = meta.read_text()
    raw = json.loads(saved)
    raw["content_hash"] = "0" * 64
    try:
        meta.write_text(json.dumps(raw))
        assert main(_generate(run, "--max-new-tokens", "12")) == 2
        err = capsys.readouterr().err
    finally:
        meta.write_text(saved)
    assert str(_db(data)) in err and "content hash 000000000000" in err and "--restart" in err


def test_generate_loads_the_stored_index_and_reads_it(lab, capsys, monkeypatch):
    """No BM25 build (the scorer that builds one raises); the neighbours the model is fed come
    from the stored index: its scores negated (hashes re-recorded, so the check passes), each
    chunk gets other neighbours."""
    import attnlab.data.retrieval as retrieval
    import attnlab.model.retrieval as decoding
    from attnlab.base.atomic import atomic_write_json, sha256_file

    data, run = lab
    db = Database.open(_db(data))
    assert db.stored_index and "bigrams/codes.npy" in db.meta["index_files"]

    def no_build(*a, **k):
        raise AssertionError("generate built a BM25 index")

    fed: list[np.ndarray] = []
    real = decoding.generate_with_retrieval

    def recording(model, prompt, n, retrieve, **kw):
        def spy(chunk):
            fed.append(retrieve(chunk))
            return fed[-1]

        return real(model, prompt, n, spy, **kw)

    monkeypatch.setattr(retrieval, "_score_matrix", no_build)
    monkeypatch.setattr(decoding, "generate_with_retrieval", recording)
    args = _generate(run, "--max-new-tokens", "40")
    assert main(args) == 0
    assert "index loaded in" in capsys.readouterr().err
    first, fed[:] = list(fed), []
    assert len(first) == 6  # 16 prompt bytes + 40 new: the last step reads 55 // 8 chunks
    scores, meta_path = _db(data) / "bigrams" / "data.npy", _db(data) / "meta.json"
    negated, meta = -np.load(scores), json.loads(meta_path.read_text())
    with _Damaged(scores, "keep"), _Damaged(meta_path, "keep"):
        np.save(scores, negated)
        meta["files"]["bigrams/data.npy"] = sha256_file(scores)
        atomic_write_json(meta_path, meta)
        assert main(args) == 0
    assert not np.array_equal(first[0], fed[0])  # the same first chunk, other neighbours


def test_export_verify_checks_the_neighbour_path_on_stored_neighbours(lab, capsys, tmp_path):
    """`export --verify` of a retrieval run says the decoder checks ran without neighbours and
    compares forward(neighbours=) with attnlab's on the database's stored neighbours; an export
    whose neighbour path reads other neighbours fails that comparison."""
    pytest.importorskip("transformers")
    from attnlab.hf.verify import check_exports, stored_neighbours
    from attnlab.runs.load import load_run_model

    data, run = lab
    out = tmp_path / "hf"
    assert main(["export", str(run), "--out", str(out), "--verify"]) == 0
    said = capsys.readouterr().out
    assert "generate() with its KV cache without neighbours" in said
    assert (
        "the neighbour path forward(neighbours=) on the stored neighbours of 2 validation" in said
    )
    assert str(_db(data)) in said and "NOT" not in said
    model, cfg, tok = load_run_model(run)
    nb = stored_neighbours(cfg)
    assert nb.neighbours.shape == (2, 32 // M, K, 2 * M)
    code = out / "modeling_attnlab.py"
    code.write_text(
        code.read_text().replace("neighbours=neighbours,", "neighbours=neighbours.flip(0),")
    )
    (check,) = check_exports([(out, model, tok)], pipeline=False, neighbours=[nb])
    assert check.neighbour_logits > check.TOLERANCE and not check.passed
    assert check.max_abs_logits < check.TOLERANCE  # the decoder alone still agrees


def test_cached_retrieval_decoding_equals_full_forwards_and_reads_each_chunk_once(lab):
    """Greedy decoding with the K/V cache gives the tokens and the last logits of full forwards;
    the neighbour encoder runs on each chunk's k neighbours once and each CCA layer projects
    their keys and values once (uncached decoding encodes them again every step)."""
    import torch

    from attnlab.data.retrieval import Database
    from attnlab.model.retrieval import generate_with_retrieval
    from attnlab.runs.load import load_run_model

    data, run = lab
    model, _, _ = load_run_model(run)
    live = Database.open(_db(data)).retriever(TokenData.open(data))
    prompt = torch.as_tensor(np.asarray(TokenData.open(data).val[:13], dtype=np.int64))[None]
    encoded, projected = [], []
    real_encode = model.encode
    model.encode = lambda ids, **kw: encoded.append(ids.shape[0]) or real_encode(ids, **kw)
    for cca in model.cca.values():
        real_kv = cca.cross_attention.memory_kv
        cca.cross_attention.memory_kv = lambda mem, f=real_kv: (
            projected.append(mem.shape[0]) or f(mem)
        )
    runs = {}
    for cached in (True, False):
        encoded.clear()
        projected.clear()
        ids, calls = generate_with_retrieval(
            model, prompt, 30, live, temperature=0, use_cache=cached
        )
        runs[cached] = (ids, calls, sum(encoded), sum(projected))
    (ids, calls, enc, proj), (ids_full, calls_full, enc_full, _) = runs[True], runs[False]
    assert torch.equal(ids, ids_full) and calls == calls_full == 42 // M
    chunks = 42 // M  # the last step reads the chunks of its 42 tokens
    assert enc == chunks * K and proj == chunks * len(model.cca)
    assert enc_full > 5 * enc
    nb = torch.as_tensor(np.stack([live(ids[0, j * M : (j + 1) * M].numpy()) for j in range(5)]))
    with torch.no_grad():
        want = model(ids[:, :42], neighbours=nb[None]).logits[0, -1]
        cache = model.new_cache(1, 42)
        model(ids[:, :30], cache=cache, neighbours=nb[None])
        for t in range(30, 42):
            got = model(ids[:, t : t + 1], cache=cache, neighbours=nb[None]).logits[0, -1]
    assert torch.allclose(got, want, atol=1e-5)


def test_a_run_names_its_index_and_every_command_uses_it(lab, capsys, tmp_path):
    """`model.retrieval.index = "hnsw:random"`: train builds that database (its directory and
    meta.json say so), generate queries its stored faiss graph, a changed graph is refused; a bad
    value is refused naming the key."""
    pytest.importorskip("faiss")
    from attnlab.train import train

    data, _ = lab
    over = ("model.family=retrieval", f"model.retrieval.chunk_size={M}")
    cfg = tiny_run_config(data, *over, "model.retrieval.index=hnsw:random", steps=2)
    res = train(cfg, tmp_path / "dense")
    status = json.loads((tmp_path / "dense" / "status.json").read_text())
    directory = database_dir(data, M, K, M, index_spec("hnsw", "random"))
    assert res.status == "finished" and status["retrieval_database"]["directory"] == str(directory)
    assert Database.open(directory).index.kind == "hnsw"
    assert main(_generate(tmp_path / "dense", "--max-new-tokens", "12")) == 0
    assert "index loaded in" in capsys.readouterr().err
    with _Damaged(directory / "index-00.faiss", how="flip"):
        assert main(_generate(tmp_path / "dense", "--max-new-tokens", "12")) == 2
    assert "index-00.faiss" in capsys.readouterr().err
    bad = tiny_run_config(data, *over, "model.retrieval.index=hnsw:bert", steps=2)
    with pytest.raises(UserError, match=r"model\.retrieval\.index='hnsw:bert'.*random"):
        train(bad, tmp_path / "bad")
