"""``attnlab bench`` on a retrieval config: the model is timed reading neighbours of the right
shape (training, prefill, decoding without a cache), and the BM25 lookup per chunk is timed apart,
in its own column, from a synthetic database or a prepared ``--data`` folder."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("bm25s")

from attnlab.base.errors import UserError
from attnlab.bench import BenchSpec, run_bench
from attnlab.bench.report import inference_table, to_markdown
from attnlab.bench.retrieval import WithNeighbours
from attnlab.config import load_config
from attnlab.model import build_model
from tests.helpers.data import WORDS, prepare_bytes, word_corpus

RETRIEVAL = [
    "model.family=retrieval",
    "model.retrieval.chunk_size=4",
    "model.n_layers=2",
    "model.d_model=32",
    "model.attention.n_heads=2",
    "model.max_seq_len=32",
    "data.seq_len=16",
    "train.batch_size=2",
]


def _spec(**kw) -> BenchSpec:
    base = dict(
        config=load_config("tiny", RETRIEVAL),
        config_name="retrieval",
        variants=["baseline"],
        peers=[],
        steps=1,
        warmup=0,
        repeats=2,
        new_tokens=5,
        prompt_len=3,
        decode_repeats=1,
        threads=1,
        sections=("training", "inference"),
    )
    base.update(kw)
    return BenchSpec(**base)


def test_the_timed_model_reads_neighbours():
    torch.manual_seed(0)
    cfg = load_config("tiny", RETRIEVAL).model
    model = build_model(cfg).eval()
    wrapped = WithNeighbours(model)
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    nb = wrapped.neighbours(x)
    assert nb.shape == (2, 4, cfg.retrieval.neighbours, cfg.retrieval.neighbour_len)
    assert torch.equal(nb, wrapped.neighbours(x))  # fixed per batch shape
    with torch.no_grad():
        got = wrapped(x).logits
        assert torch.equal(got, model(x, neighbours=nb).logits)
        assert not torch.allclose(got, model(x).logits)  # the CCA layers took part


def test_bench_times_a_retrieval_model_and_its_lookups_apart(tmp_path):
    r = run_bench(_spec(), log=lambda _m: None)
    train = r.row("training", "baseline")
    assert train.ms_per_step > 0 and train.first_loss > 0 and not r.failures
    inf = r.row("inference", "baseline")
    assert inf.decode_cached_tokens_per_s is None and inf.decode_uncached_tokens_per_s > 0
    q = r.retrieval
    assert q is not None and q.lookup_ms_per_chunk > 0 and q.source.startswith("synthetic")
    assert q.ms_per_window == pytest.approx(q.lookup_ms_per_chunk * 16 / 4)
    t = inference_table(r)
    assert t.columns[-1] == "retrieval ms/chunk (BM25)"
    assert t.rows[0][-1] == f"{q.lookup_ms_per_chunk:.2f}"
    assert "BM25 lookup" in to_markdown(r)

    corpus = word_corpus(tmp_path / "corpus.jsonl", WORDS, n_docs=30, length=(40, 80), seed=2)
    data = prepare_bytes(corpus, tmp_path / "prepared", val_fraction=0.1)
    r2 = run_bench(_spec(data=str(data), sections=("inference",)), log=lambda _m: None)
    assert r2.retrieval.source == f"--data {data}"
    assert 0 < r2.retrieval.database_chunks < 200_000 // 4


def test_data_is_refused_where_it_means_nothing(tmp_path):
    with pytest.raises(UserError, match="retrieval config"):
        _spec(config=load_config("tiny"), data=str(tmp_path)).resolved()
    with pytest.raises(UserError, match="not a prepared data folder"):
        _spec(data=str(tmp_path)).resolved()
