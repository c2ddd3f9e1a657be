"""The retrieval family (RETRO): chunked cross-attention's causality, the database's leakage rule,
its resumable and worker-independent build, a training run that resumes bit for bit, evaluation
with and without retrieval, and decoding with live retrieval. Byte data, tiny models."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("bm25s")

from attnlab.config import load_config
from attnlab.data import TokenData
from attnlab.data.retrieval import (
    Database,
    build_database,
    database_dir,
    neighbour_tokens,
)
from attnlab.model import build_model
from tests.helpers.data import WORDS, prepare_bytes, tiny_run_config, word_corpus

PLANT = "Zyxwv quartz jumbo plover."


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    """80 word-salad documents; document 5 alone carries PLANT, twice (so its own later chunk
    would be the perfect neighbour of its earlier one, were that allowed)."""
    root = tmp_path_factory.mktemp("ret")
    corpus = word_corpus(root / "corpus.jsonl", WORDS, n_docs=80, length=(40, 90), seed=0)
    lines = corpus.read_text().splitlines()
    doc = json.loads(lines[5])
    doc["text"] = f"{PLANT} {doc['text']} {PLANT}"
    lines[5] = json.dumps(doc)
    corpus.write_text("\n".join(lines) + "\n")
    return prepare_bytes(corpus, root / "prepared", val_fraction=0.1)


def _cfg(*extra: str):
    return load_config(
        "tiny",
        ["model.family=retrieval", "model.retrieval.chunk_size=8", "model.n_layers=2", *extra],
    ).model


def test_cca_causality_and_no_neighbours():
    """Changing chunk i's neighbours (retrieved with chunk i's tokens) changes no output before
    the last token of chunk i; it does change that token's. No neighbours = the CCA adds 0."""
    torch.manual_seed(0)
    cfg = _cfg("model.retrieval.cca_layers=[0, 1]")
    model = build_model(cfg).double().eval()
    m, T = 8, 40
    ids = torch.randint(0, 256, (2, T))
    nb = torch.randint(0, 256, (2, T // m, 2, 16))
    base = model(ids, neighbours=nb).logits
    for i in range(T // m):
        nb2 = nb.clone()
        nb2[:, i] = torch.randint(0, 256, (2, 2, 16))
        out = model(ids, neighbours=nb2).logits
        first = (i + 1) * m - 1
        assert torch.equal(out[:, :first], base[:, :first]), i
        if first < T:
            assert (out[:, first] - base[:, first]).abs().max() > 1e-6, i
    # changing chunk i's own tokens changes no output before them (the decoder is causal)
    ids2 = ids.clone()
    ids2[:, 16:24] = (ids2[:, 16:24] + 1) % 256
    assert torch.equal(model(ids2, neighbours=nb).logits[:, :16], base[:, :16])
    # without neighbours the model is its decoder: identical to zeroing every CCA's output
    plain = model(ids).logits
    for c in model.cca.values():
        torch.nn.init.zeros_(c.cross_attention.mixer.w_o.weight)
    assert torch.allclose(model(ids, neighbours=nb).logits, plain, atol=1e-12)


def test_leakage_planted_sentence(planted):
    """A chunk never retrieves from its own document: PLANT appears only in document 5, so no
    chunk of document 5 gets a neighbour containing it, while other documents' chunks may."""
    db = build_database(planted, chunk_size=16, neighbours=2, workers=1)
    data = TokenData.open(planted)
    train = np.asarray(data.train)
    from attnlab.data.retrieval import document_ids

    docs = document_ids(train, data.eos_id)
    m, r = 16, db.neighbour_len
    plant = np.frombuffer(PLANT.encode(), dtype=np.uint8).astype(np.int64)
    text = train.astype(np.int64)
    where = [i for i in range(len(text) - len(plant)) if np.array_equal(text[i : i + 8], plant[:8])]
    assert where, "the planted sentence is in the training split"
    plant_doc = int(docs[where[0]])
    assert {int(docs[w]) for w in where} == {plant_doc}
    n = len(db.train)
    own = [c for c in range(n) if docs[c * m] == plant_doc]
    nbr = neighbour_tokens(train, np.asarray(db.train)[own], m, r, data.eos_id)
    for row in nbr.reshape(-1, r):
        assert plant[:8].tobytes() not in row.astype(np.uint8).tobytes()
    # and nothing of any chunk's neighbours comes from its own document(s)
    idx = np.asarray(db.train)
    for c in range(n):
        lo, hi = docs[c * m], docs[c * m + m - 1]
        for j in idx[c]:
            nb_docs = docs[j * m : min(j * m + r, len(train))]
            assert nb_docs.max() < lo or nb_docs.min() > hi


def test_build_identical_for_workers_and_resumable_after_sigkill(planted, tmp_path):
    one = build_database(planted, chunk_size=8, neighbours=2, workers=1, restart=True)
    files = {f: (one.directory / f).read_bytes() for f in ("train.npy", "val.npy", "meta.json")}
    two = build_database(planted, chunk_size=8, neighbours=2, workers=2, restart=True)
    assert {f: (two.directory / f).read_bytes() for f in files} == files
    # SIGKILL a build part-way (after some blocks are written), then resume it
    out = database_dir(planted, 8, 2, 8)
    import shutil

    shutil.rmtree(out)
    partial = out.parent / f".{out.name}.partial"
    code = (
        "import attnlab.data.retrieval as r, sys, os, signal\n"
        "orig = r._score_block\n"
        "def slow(job):\n"
        "    res = orig(job)\n"
        "    if job[1] >= 2: os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return res\n"
        "r._score_block = slow\n"
        f"r.build_database({str(planted)!r}, chunk_size=8, neighbours=2, workers=1)\n"
    )
    # another string hash seed than this process's (bm25s orders its vocabulary by a set's order)
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env)
    assert p.returncode == -signal.SIGKILL
    done = sorted(x.name for x in partial.glob("train-*.npy"))
    assert done and not out.exists()
    before = {x: (partial / x).stat().st_mtime_ns for x in done}
    again = build_database(planted, chunk_size=8, neighbours=2, workers=2)
    assert {f: (again.directory / f).read_bytes() for f in files} == files
    assert not partial.exists() and before  # the kept blocks were reused, then cleaned up
    # a whole build in processes with other hash seeds writes the same bytes
    for seed in ("0", "777"):
        shutil.rmtree(out)
        code = f"import attnlab.data.retrieval as r; r.build_database({str(planted)!r}, "
        code += "chunk_size=8, neighbours=2, workers=2)"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, env=env)
        assert {f: (out / f).read_bytes() for f in files} == files, seed


@pytest.fixture(scope="module")
def runs(planted, tmp_path_factory):
    """One retrieval run straight to 6 steps, one stopped after 4 and resumed."""
    from attnlab.train import train

    root = tmp_path_factory.mktemp("runs")
    cfg = tiny_run_config(
        planted, "model.family=retrieval", "model.retrieval.chunk_size=8", steps=6, eval_every=3
    )
    full = train(cfg, root / "full")
    train(cfg, root / "resumed", _stop_after=4)
    resumed = train(cfg, root / "resumed")
    return cfg, root, full, resumed


def test_train_resume_bit_for_bit(runs):
    from attnlab.runs.checkpoint import load_latest

    _, root, full, resumed = runs
    assert full.status == resumed.status == "finished"
    assert resumed.resumed_from == 4
    a = load_latest(root / "full", with_optim=False).model
    b = load_latest(root / "resumed", with_optim=False).model
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.final_val_loss == full.final_val_loss
    status = json.loads((root / "full" / "status.json").read_text())
    assert status["retrieval_database"]["chunks"] > 0  # the database is recorded with the run


def test_eval_with_and_without_retrieval(runs):
    from attnlab.eval.retrieval import retrieval_losses

    _, root, _, _ = runs
    res = retrieval_losses(root / "full", max_windows=4)
    assert res["windows"] == 4 and res["tokens"] == 4 * 32
    assert np.isfinite(res["loss_with"]) and np.isfinite(res["loss_without"])
    assert res["loss_with"] != res["loss_without"]  # the neighbours are read
    assert 0.0 <= res["overlap"] <= 1.0


def test_generate_with_live_retrieval(runs, planted):
    from attnlab.model.retrieval import generate_with_retrieval
    from attnlab.runs.load import load_run_model

    _, root, _, _ = runs
    model, _, _ = load_run_model(root / "full")
    data = TokenData.open(planted)
    db = Database.open(database_dir(planted, 8, 2, 8))
    calls: list[np.ndarray] = []
    live = db.retriever(data)

    def retrieve(chunk):
        calls.append(chunk)
        return live(chunk)

    prompt = torch.as_tensor(np.asarray(data.val[:12], dtype=np.int64))[None]
    ids, n = generate_with_retrieval(model, prompt, 13, retrieve, temperature=0)
    assert ids.shape == (1, 25) and n == len(calls) == 3  # chunks 0..2 completed by T = 24
    # the chunks sent to the index are the sequence's own completed chunks, in order
    for j, c in enumerate(calls):
        assert np.array_equal(c, ids[0, j * 8 : (j + 1) * 8].numpy())
    # the live retriever agrees with the precomputed database on a validation chunk
    ref = neighbour_tokens(data.train, np.asarray(db.val)[0], 8, 16, data.eos_id)
    assert np.array_equal(live(np.asarray(data.val[:8])), ref)
    # greedy decoding with live retrieval equals a full forward with the same neighbours
    nb = torch.as_tensor(np.stack([live(ids[0, j * 8 : (j + 1) * 8].numpy()) for j in range(3)]))
    with torch.no_grad():
        logits = model(ids[:, :24].clone(), neighbours=nb[None]).logits
    assert torch.equal(logits[0, 11:23].argmax(-1), ids[0, 12:24])


def test_cli_data_retrieval_and_generate(runs, planted, capsys):
    """`attnlab data retrieval` reuses the built database; `attnlab generate` decodes a retrieval
    run with live retrieval (and without, on request), reporting retrieval time apart."""
    from attnlab.cli import main

    assert main(["data", "retrieval", "--data", str(planted), "--chunk-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "m8-k2-c8" in out and "neighbours      k=2" in out
    _, root, _, _ = runs
    run = str(root / "full")
    args = ["generate", run, "--prompt", "the model learns", "--max-new-tokens", "9"]
    assert main([*args, "--temperature", "0"]) == 0
    cap = capsys.readouterr()
    assert cap.out.startswith("the model learns")
    assert "retrievals took" in cap.err and "the model" in cap.err
    assert main([*args, "--temperature", "0", "--no-retrieval"]) == 0
    assert "retrievals" not in capsys.readouterr().err
    assert main(["eval", run, "--tasks", "retrieval", "--limit", "2", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert (
        "loss, real neighbours" in out
        and "loss, mismatched neighbours" in out
        and "overlap with neighbours" in out
    )
    saved = json.loads((root / "full" / "eval" / "results.json").read_text())
    assert saved["tasks"]["retrieval"]["metrics"]["windows"] == 2
    # a bad setting is one line naming the fix, not a traceback
    assert main(["data", "retrieval", "--data", str(planted), "--chunk-size", "1"]) == 2


def test_declared_flops_match_the_counted_matmuls():
    """``flops_per_token`` (CCA, and the encoder at k r / m tokens per decoder token) equals
    FlopCounterMode's count of a forward with neighbours."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = _cfg("model.attention.backend=math", "model.retrieval.cca_layers=[0, 1]")
    model = build_model(cfg).eval()
    T = 32
    ids, nb = torch.randint(0, 256, (1, T)), torch.randint(0, 256, (1, T // 8, 2, 16))
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        model(ids, neighbours=nb)
    assert fc.get_total_flops() / T == model.flops_per_token(T)


def test_export_runs_without_attnlab_and_reads_neighbours(runs, tmp_path):
    """The folder loads where attnlab cannot be imported (as the decoder without retrieval: same
    logits and greedy tokens); loaded here, ``forward(neighbours=)`` equals attnlab's model with
    the same neighbours; the card says what the model expects."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from attnlab.hf.export import export
    from attnlab.hf.verify import check_exports
    from attnlab.runs.load import load_run_model

    _, root, _, _ = runs
    res = export(root / "full", tmp_path / "hf")
    card = (res.out / "README.md").read_text()
    assert "## Retrieval (not in this folder)" in card and "neighbours=" in card
    model, _, tok = load_run_model(root / "full")
    (check,) = check_exports([(res.out, model, tok)], pipeline=False)
    assert check.max_abs_logits < 1e-4 and check.greedy_equal and check.tokens_equal
    hf = AutoModelForCausalLM.from_pretrained(res.out, trust_remote_code=True).eval()
    ids, nb = torch.randint(0, 256, (1, 32)), torch.randint(0, 256, (1, 4, 2, 16))
    with torch.no_grad():
        want = model.eval()(ids, neighbours=nb).logits
        got = hf(input_ids=ids, neighbours=nb, use_cache=False).logits
    assert torch.allclose(got, want, atol=1e-5)


def test_config_refuses_impossible_retrieval_settings(planted):
    from attnlab.base.errors import UserError
    from attnlab.config import ConfigError
    from attnlab.train import train

    with pytest.raises(ConfigError, match="cca_layers"):
        load_config("tiny", ["model.family=retrieval", "model.retrieval.cca_layers=[5]"])
    with pytest.raises(ConfigError, match="causal LM"):
        load_config("tiny", ["model.family=retrieval", "model.mask.kind=full"])
    cfg = tiny_run_config(planted, "model.family=retrieval", "model.retrieval.chunk_size=5")
    with pytest.raises(UserError, match=r"not a multiple of model\.retrieval\.chunk_size=5"):
        train(cfg, planted.parent / "bad-run")
