"""The streaming, resumable build of a ``bm25`` or ``hnsw`` retrieval database.

Stages, each kept in ``.NAME.partial/`` as it finishes (a rerun after a kill, SIGKILL included,
starts at the first unfinished one; ``key.json`` holds the settings, so other settings start over):

1. **index**: ``bm25``: the database chunks' terms (:mod:`.terms`), one pass, then bm25s' index,
   saved to ``bm25/`` (its postings pruned per term when loaded, :mod:`.impact`). ``hnsw``: the
   database chunks' embeddings, ``BLOCK`` chunks at a time to ``emb-NNNNNN.npy`` (the ``random``
   encoder's idf to ``idf.npy`` first), then the shards' HNSW graphs over them, each saved to
   ``index-SS.faiss`` as it finishes, ``workers`` at a time (:mod:`.dense`).
2. **search**: every training and validation chunk, ``BLOCK`` queries at a time, to
   ``{train,val}-NNNNNN.npy``: the index's top k + overfetch, the leakage rule applied
   (:mod:`.leakage`, :mod:`.bm25`, :mod:`.dense`). ``bm25`` blocks run on ``workers`` processes,
   ``hnsw`` blocks on ``workers`` faiss threads; a query's neighbours do not depend on the other
   queries, so the bytes do not depend on ``workers``.
3. **files**: ``train.npy``, ``val.npy`` assembled, the index files moved beside them, every
   file's sha256 in ``meta.json``, the directory renamed into place.

Memory: the index (bm25: its postings, float32 + int32 per (term, chunk), and the pruned copy;
hnsw: d floats and about 2 M links per chunk) plus one block of queries; never a [queries,
chunks] matrix.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.base.atomic import atomic_write_json, sha256_file
from attnlab.base.errors import UserError
from attnlab.data.retrieval_index import bm25, dense, encoders, terms
from attnlab.data.retrieval_index.leakage import training_exclusions
from attnlab.data.retrieval_index.spec import IndexSpec
from attnlab.data.tokendata import TokenData

BLOCK = 4096  # queries (and embedded chunks) per resumable file
_STATE: dict[str, Any] = {}


def _save_npy(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(f".{path.stem}.tmp.npy")
    np.save(tmp, arr)
    tmp.replace(path)


def _blocks(n: int) -> range:
    return range(-(-n // BLOCK))


def _decoder(data: TokenData, spec: IndexSpec) -> Callable | None:
    return data.tokenizer.decode if spec.encoder in ("words", "smollm2", "smollm2-table") else None


def encoder_for(spec: IndexSpec, data: TokenData, idf: np.ndarray | None) -> Any:
    """The chunk encoder of an ``hnsw`` spec."""
    if spec.encoder == "random":
        assert idf is not None
        return encoders.RandomProjection(idf, spec.dim)
    return encoders.SmolLM2(data.tokenizer.decode, pooled=spec.encoder == "smollm2")


# ------------------------------------------------------------------------------------ bm25
def _bm25_index(data: TokenData, spec: IndexSpec, partial: Path, m: int) -> tuple[Any, dict]:
    train = np.asarray(data.train)
    decode = _decoder(data, spec)
    where = partial / "bm25"
    if where.is_dir():
        bm = bm25.load(where)
        vocab = bm.vocab_dict
        extra = {"queries": terms.query_ids(train, m, decode, vocab), "decode": decode}
        return bm25.pruned(bm, spec), {**extra, "vocab": vocab, "spec": spec}
    ids, vocab = terms.term_ids(train, m, decode)
    if not vocab:
        raise UserError(
            f"every term of the training split is in more than {terms.stop_limit(len(ids)):,} "
            "chunks (a stop term), so BM25 has nothing to index; use --encoder unigrams, "
            "--kind hnsw, or data with a richer vocabulary"
        )
    bm = bm25.build(ids, vocab)
    tmp = partial / ".bm25.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    bm25.save(bm, tmp)
    tmp.replace(where)
    pruned = bm25.pruned(bm25.load(where), spec)
    return pruned, {"queries": ids, "decode": decode, "vocab": vocab, "spec": spec}


def _bm25_block(job: tuple[str, int]) -> tuple[str, int, np.ndarray, float]:
    split, b = job
    cpu = time.process_time()
    st = _STATE
    m, k = st["m"], st["k"]
    lo = b * BLOCK
    if split == "train":
        hi = min(lo + BLOCK, len(st["queries"]))
        queries = st["queries"][lo:hi]
        first, last = st["first"][lo:hi], st["last"][lo:hi]
    else:
        toks = st["val"][lo * m : (lo + BLOCK) * m]
        queries = terms.query_ids(toks, m, st["decode"], st["vocab"])
        first = last = np.zeros(len(queries), dtype=np.int64)
    found = bm25.search(st["index"], queries, k, first, last, st["spec"])
    return split, b, found, time.process_time() - cpu


# ------------------------------------------------------------------------------------ hnsw
def _hnsw_index(
    data: TokenData, spec: IndexSpec, partial: Path, m: int, workers: int
) -> tuple[Any, dict]:
    t0 = time.perf_counter()
    train = np.asarray(data.train)
    n = len(train) // m
    idf = None
    if spec.encoder == "random":
        if not (partial / "idf.npy").exists():
            _save_npy(partial / "idf.npy", encoders.idf_weights(train, m, data.vocab_size))
        idf = np.load(partial / "idf.npy")
    enc = None
    for b in _blocks(n):
        f = partial / f"emb-{b:06d}.npy"
        if not f.exists():
            enc = enc or encoder_for(spec, data, idf)
            rows = train[b * BLOCK * m : min((b + 1) * BLOCK, n) * m].reshape(-1, m)
            _save_npy(f, enc(rows))
    emb = [np.load(partial / f"emb-{b:06d}.npy", mmap_mode="r") for b in _blocks(n)]
    _STATE["embed_s"] = time.perf_counter() - t0
    t = time.perf_counter()
    dense.build_missing(emb, emb[0].shape[1] if emb else spec.dim, spec, partial, workers)
    _STATE["graph_s"] = time.perf_counter() - t
    return dense.load(partial, spec), {"emb": emb, "idf": idf, "encoder": enc}


def _hnsw_block(job: tuple[str, int], data: TokenData, spec: IndexSpec, workers: int) -> Any:
    split, b = job
    st = _STATE
    m, k = st["m"], st["k"]
    if split == "train":
        q = np.asarray(st["emb"][b])
        lo = b * BLOCK
        first, last = st["first"][lo : lo + len(q)], st["last"][lo : lo + len(q)]
    else:
        st["encoder"] = st["encoder"] or encoder_for(spec, data, st["idf"])
        n_q = len(st["val"]) // m
        rows = np.asarray(st["val"][b * BLOCK * m : min((b + 1) * BLOCK, n_q) * m]).reshape(-1, m)
        q = st["encoder"](rows)
        first = last = np.zeros(len(q), dtype=np.int64)
    return split, b, dense.search(st["index"], q, k, first, last, spec, threads=workers)


# ----------------------------------------------------------------------------------- build
def build_indexed(
    data: TokenData, partial: Path, spec: IndexSpec, m: int, k: int, cont: int, workers: int
) -> tuple[dict[str, str], list[str], dict[str, float]]:
    """Run the stages in ``partial`` (see the module doc); leaves ``partial/out/`` with the
    files. Returns the files' sha256, the index files' names and each stage's seconds."""
    times: dict[str, float] = {}
    t, cpu = time.perf_counter(), time.process_time()
    worker_cpu = [0.0]
    train, val = np.asarray(data.train), np.asarray(data.val)
    _STATE.clear()
    _STATE.update(m=m, k=k, val=val)
    if spec.kind == "bm25":
        index, extra = _bm25_index(data, spec, partial, m)
    else:
        index, extra = _hnsw_index(data, spec, partial, m, workers)
    _STATE.update(index=index, **extra)
    _STATE["first"], _STATE["last"] = training_exclusions(train, data.eos_id, m, m + cont)
    times["index"] = time.perf_counter() - t
    t = time.perf_counter()
    jobs = [
        (split, b)
        for split, toks in (("train", train), ("val", val))
        for b in _blocks(len(toks) // m)
        if not (partial / f"{split}-{b:06d}.npy").exists()
    ]

    def save(res: tuple) -> None:
        _save_npy(partial / f"{res[0]}-{res[1]:06d}.npy", res[2])
        worker_cpu[0] += res[3] if len(res) > 3 else 0.0

    if spec.kind == "hnsw":
        for j in jobs:
            save(_hnsw_block(j, data, spec, workers))
    elif workers == 1 or len(jobs) <= 1:
        for j in jobs:
            save(_bm25_block(j)[:3])
    else:
        with mp.get_context("fork").Pool(workers) as pool:
            for res in pool.imap_unordered(_bm25_block, jobs):
                save(res)
    times["search"] = time.perf_counter() - t
    # CPU seconds of this process (faiss' threads included) and of the worker processes' jobs
    times["cpu"] = time.process_time() - cpu + worker_cpu[0]
    enc = _STATE.get("encoder")
    if enc is not None and hasattr(enc, "tokens_per_s"):
        times["encoder_tokens_per_s"] = enc.tokens_per_s
    for stage in ("embed", "graph"):
        if f"{stage}_s" in _STATE:
            times[stage] = _STATE[f"{stage}_s"]
    files, index_files = _assemble(partial, spec, k, {"train": train, "val": val}, m)
    _STATE.clear()
    return files, index_files, times


def _assemble(
    partial: Path, spec: IndexSpec, k: int, splits: dict[str, np.ndarray], m: int
) -> tuple[dict[str, str], list[str]]:
    out = partial / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    files = {}
    for split, toks in splits.items():
        parts = [np.load(partial / f"{split}-{b:06d}.npy") for b in _blocks(len(toks) // m)]
        arr = np.concatenate(parts) if parts else np.zeros((0, k), dtype=np.int64)
        np.save(out / f"{split}.npy", arr)
    if spec.kind == "bm25":
        shutil.copytree(partial / "bm25", out / "bm25")
        index_files = sorted(f"bm25/{p.name}" for p in (out / "bm25").iterdir())
    else:
        index_files = [dense.shard_file(s) for s in range(spec.shards)]
        for name in index_files:
            shutil.copy2(partial / name, out / name)
        if spec.encoder == "random":
            shutil.copy2(partial / "idf.npy", out / "idf.npy")
            index_files.append("idf.npy")
    for name in ["train.npy", "val.npy", *index_files]:
        files[name] = sha256_file(out / name)
    return files, index_files


def read_key(path: Path) -> Any:
    """An interrupted build's settings; None when the file is damaged (the build starts over)."""
    try:
        return json.loads(path.read_bytes())
    except (ValueError, OSError):
        return None


def start_partial(partial: Path, key: dict[str, Any], restart: bool) -> None:
    """``partial`` ready for a build of ``key``: kept when it was started with the same key."""
    if partial.exists() and (restart or read_key(partial / "key.json") != key):
        shutil.rmtree(partial)
    partial.mkdir(parents=True, exist_ok=True)
    atomic_write_json(partial / "key.json", key)
