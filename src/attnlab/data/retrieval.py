"""The retrieval database of a prepared data directory (RETRO, Borgeaud et al. 2022, §2.3).

``attnlab data retrieval --data DIR --chunk-size m --neighbours k``:

1. The training split is cut into chunks of m tokens (chunk c = tokens [c m, (c+1) m)); these are
   the database. A neighbour of chunk c is its m tokens plus the ``continuation`` tokens after it
   (r = m + continuation tokens; past the end of the split: eos).
2. The frozen embedder is BM25 (Robertson & Zaragoza 2009) through the maintained ``bm25s``
   library (``pip install 'attnlab[retrieval]'``): the terms of a chunk are its token bigrams and
   trigrams (``"a_b"``, ``"a_b_c"`` of token ids, so it works for any tokenizer, byte-level
   included, with nothing to download); bm25s' defaults k1 = 1.5, b = 0.75 ("lucene"). BM25 is the
   lexical retriever RETRO's own ablations compare against; it needs no model, so the database is
   the same on every machine. bm25s precomputes each (term, chunk) score in a sparse matrix S
   [terms, chunks]; a block of queries is scored exactly by one sparse product Q S (Q: the
   queries' term counts, which is what ``BM25.get_scores`` sums one query at a time).
3. Every training and validation chunk retrieves its k best database chunks (ties: the lower
   chunk index first). **No leakage**, per reading token (:mod:`attnlab.data.retrieval_index.
   leakage`): a training chunk never retrieves a chunk whose tokens (with its continuation) share
   a document with it or with any token that reads its neighbours (the next chunk, under the
   chunked cross-attention's shift), itself included; validation chunks retrieve from the
   training database only (their documents are not in it). Databases of format version 1 were
   built with the query chunk's documents only; they still load (a warning says so).

``index=`` picks another index (:mod:`attnlab.data.retrieval_index`: BM25 over words through
bm25s' top-k retrieval, or faiss HNSW over frozen embeddings), built by a streaming, resumable
build that grows as n log n (HNSW); its directory is ``m{m}-k{k}-c{c}-{kind}-{encoder}`` and it
holds its index files, so decoding queries the stored index.

Output ``DIR/retrieval/m{m}-k{k}-c{continuation}/``: ``train.npy``, ``val.npy`` (int64 [chunks,
k]: database chunk indices, -1 where fewer than k chunks qualify) and ``meta.json`` (the settings,
the index, the data's content hash, each file's sha256). The bm25-bigrams queries are scored in blocks on
``workers`` processes (default: every core); each block is written atomically to
``.NAME.partial/`` and a rerun after a kill (SIGKILL included) reuses the finished blocks. The
bytes do not depend on the number of workers (each query row is scored and ranked alone).
Cost: building S is one pass over the tokens; scoring is O(query terms x postings) per query, a
dense [block, chunks] float32 buffer per worker.
"""

from __future__ import annotations

import hashlib
import itertools
import multiprocessing as mp
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.base.atomic import atomic_write_json, sha256_file
from attnlab.base.errors import UserError
from attnlab.base.extras import require
from attnlab.data.encoding import default_workers
from attnlab.data.retrieval_files import (
    damaged,
    database_name,
    load_index,
    read_meta,
    rebuild_command,
    shortfall,
)
from attnlab.data.retrieval_index import bigrams
from attnlab.data.retrieval_index import build as indexed
from attnlab.data.retrieval_index.leakage import document_ids, reading_documents
from attnlab.data.retrieval_index.spec import IndexSpec, index_spec
from attnlab.data.retrieval_index.topk import top_k as _top_k
from attnlab.data.staging import output_lock
from attnlab.data.tokendata import TokenData

FORMAT = "attnlab-retrieval"
FORMAT_VERSION = 2  # 2: the leakage rule per reading token, the index and the data's hashes
LEAKAGE = "reading-tokens"
BLOCK = 256  # queries per work unit (and per resumable file) of the bm25-bigrams scorer


class RetrievalWarning(UserWarning):
    """A database that was built but lacks neighbours (too few documents for the leakage rule)."""


EMBEDDER = IndexSpec(kind="bm25-bigrams").describe()


def database_dir(
    data_dir: str | Path,
    chunk_size: int,
    neighbours: int,
    continuation: int,
    index: IndexSpec | None = None,
) -> Path:
    """Where ``build_database`` writes the database of these settings."""
    name = database_name(chunk_size, neighbours, continuation, (index or index_spec()).slug)
    return Path(data_dir) / "retrieval" / name


def chunk_terms(chunk: np.ndarray) -> list[str]:
    """The BM25 terms of one chunk: its token bigrams and trigrams."""
    t = [str(int(x)) for x in chunk]
    return [f"{a}_{b}" for a, b in itertools.pairwise(t)] + [
        f"{a}_{b}_{c}" for a, b, c in zip(t, t[1:], t[2:], strict=False)
    ]


def neighbour_tokens(
    train: np.ndarray, index: np.ndarray, chunk_size: int, length: int, pad: int
) -> np.ndarray:
    """Token ids [..., k, r] of the database chunks ``index`` [..., k] (-1: all ``pad``)."""
    idx = np.asarray(index, dtype=np.int64)
    pos = idx[..., None] * chunk_size + np.arange(length)
    ok = (idx[..., None] >= 0) & (pos < len(train))
    out = np.full(pos.shape, pad, dtype=np.int64)
    out[ok] = np.asarray(train[pos[ok]], dtype=np.int64)
    return out


# ---------------------------------------------------------------------------------- the scorer
_STATE: dict[str, Any] = {}


def _score_matrix(train: np.ndarray, m: int) -> tuple[Any, dict[str, int]]:
    """bm25s's precomputed scores of the database chunks as a CSR matrix [terms, chunks]."""
    import bm25s
    import scipy.sparse as sp

    n = len(train) // m
    corpus = [chunk_terms(train[c * m : (c + 1) * m]) for c in range(n)]
    # term ids in sorted order, not bm25s's own (a set's order, which follows the process's
    # string hash seed): the float32 sums of the scores then add in one order in every process,
    # so a resumed or multi-process build writes the same bytes
    vocab = {t: i for i, t in enumerate(sorted({t for terms in corpus for t in terms}))}
    ids = [[vocab[t] for t in terms] for terms in corpus]
    bm = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
    bm.index((ids, vocab), show_progress=False)
    s = bm.scores
    mat = sp.csr_matrix(
        (s["data"], s["indices"], s["indptr"]), shape=(len(s["indptr"]) - 1, s["num_docs"])
    )
    return mat, bm.vocab_dict


def _query_matrix(chunks: list[np.ndarray], vocab: dict[str, int], n_terms: int) -> Any:
    import scipy.sparse as sp

    rows, cols = [], []
    for i, ch in enumerate(chunks):
        for term in chunk_terms(ch):
            j = vocab.get(term)
            if j is not None and j < n_terms:
                rows.append(i)
                cols.append(j)
    data = np.ones(len(rows), dtype=np.float32)
    return sp.csr_matrix((data, (rows, cols)), shape=(len(chunks), n_terms), dtype=np.float32)


def _score_block(job: tuple[str, int]) -> tuple[str, int, np.ndarray]:
    split, b = job
    st = _STATE
    m, k = st["m"], st["k"]
    tokens = st["tokens"][split]
    n_q = len(tokens) // m
    lo, hi = b * BLOCK, min((b + 1) * BLOCK, n_q)
    chunks = [tokens[c * m : (c + 1) * m] for c in range(lo, hi)]
    q = _query_matrix(chunks, st["vocab"], st["S"].shape[0])
    scores = np.asarray((q @ st["S"]).todense(), dtype=np.float32)
    out = np.empty((hi - lo, k), dtype=np.int64)
    for i, c in enumerate(range(lo, hi)):
        row = scores[i]
        if split == "train":  # nothing from the documents of the chunk or of its readers
            d_lo, d_hi = st["q_lo"][c], st["q_hi"][c]
            clash = (st["db_lo"] <= d_hi) & (st["db_hi"] >= d_lo)
            row = np.where(clash, -np.inf, row)
        out[i] = _top_k(row, k)
    return split, b, out


@dataclass(frozen=True)
class Database:
    """A built retrieval database, opened for reading."""

    directory: Path
    meta: dict[str, Any]
    train: np.ndarray  # [train chunks, k] database indices
    val: np.ndarray  # [val chunks, k]
    #: seconds per build stage (and the encoder's tokens/s) when this process built it
    timings: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def chunk_size(self) -> int:
        return int(self.meta["chunk_size"])

    @property
    def neighbour_len(self) -> int:
        return int(self.meta["chunk_size"] + self.meta["continuation"])

    @property
    def index(self) -> IndexSpec:
        """The index it was built with (version 1: BM25 over token bigrams and trigrams)."""
        spec = self.meta.get("index")
        return IndexSpec(**spec) if isinstance(spec, dict) else IndexSpec(kind="bm25-bigrams")

    @property
    def leakage(self) -> str:
        """``reading-tokens`` (version 2) or ``query-chunk`` (version 1: the query chunk's own
        documents only, so a chunk's readers could see their documents' later text)."""
        return str(self.meta.get("leakage", "query-chunk"))

    def split(self, name: str) -> np.ndarray:
        return self.train if name == "train" else self.val

    def short(self, name: str) -> int:
        """How many query chunks of split ``name`` have fewer than k neighbours (-1 entries)."""
        return int((np.asarray(self.split(name)) < 0).any(axis=1).sum())

    @classmethod
    def open(cls, directory: str | Path, *, verify: bool = False) -> Database:
        """The database in ``directory``; a damaged file is a ``UserError`` naming it and the
        command that rebuilds it. ``verify`` also checks each file's sha256."""
        directory = Path(directory)
        path = directory / "meta.json"
        if not path.exists():
            raise UserError(
                f"{directory} holds no retrieval database; build it with "
                f"`{rebuild_command(directory)}`"
            )
        meta = read_meta(path, FORMAT, FORMAT_VERSION)
        arrays = {}
        for split in ("train", "val"):
            f = directory / f"{split}.npy"
            if verify and sha256_file(f) != meta["files"].get(f"{split}.npy"):
                raise damaged(f, "does not match meta.json")
            arrays[split] = load_index(f, meta, split)
        return cls(directory, meta, arrays["train"], arrays["val"])

    @property
    def stored_index(self) -> bool:
        """Whether the index is stored beside the neighbours (decoding loads it); a
        ``bm25-bigrams`` database built before attnlab stored it has none."""
        return bool(self.meta.get("index_files"))

    def retriever(self, data: TokenData):
        """A callable chunk [m] -> neighbours [k, r] for decoding: the stored index loaded and
        queried, or (a ``bm25-bigrams`` database without one, :attr:`stored_index`) BM25 over
        the training database built now."""
        k, m, r = int(self.meta["neighbours"]), self.chunk_size, self.neighbour_len
        if self.index.kind == "bm25-bigrams" and not self.stored_index:
            return live_retriever(data.train, m, k, r, data.eos_id)
        from attnlab.data.retrieval_index.live import stored_search

        search = stored_search(self.directory, self.meta, self.index, data)
        return lambda chunk: neighbour_tokens(data.train, search(chunk), m, r, data.eos_id)


def live_retriever(train: np.ndarray, m: int, k: int, r: int, eos_id: int):
    """A callable chunk [m] -> neighbours [k, r]: BM25 over the chunks of ``train`` (the index
    is built here, once), the chunk's k best with their continuations (``neighbour_tokens``)."""
    require(
        "retrieval",
        "bm25s",
        "scipy",
        what="live retrieval (`attnlab generate` of a retrieval run; --no-retrieval decodes "
        "without it)",
    )
    S, vocab = _score_matrix(np.asarray(train), m)

    def retrieve(chunk: np.ndarray) -> np.ndarray:
        q = _query_matrix([np.asarray(chunk)], vocab, S.shape[0])
        row = np.asarray((q @ S).todense(), dtype=np.float32)[0]
        return neighbour_tokens(train, _top_k(row, k), m, r, eos_id)

    return retrieve


def _key(data: TokenData, m: int, k: int, cont: int, spec: IndexSpec) -> dict[str, Any]:
    key = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "content_hash": data.content_hash,
        "chunk_size": m,
        "neighbours": k,
        "continuation": cont,
        "embedder": spec.describe(),
        "block": BLOCK if spec.kind == "bm25-bigrams" else indexed.BLOCK,
        "leakage": LEAKAGE,
        "index": spec.model_dump(),
    }
    return key


def build_database(
    data_dir: str | Path,
    *,
    chunk_size: int,
    neighbours: int,
    continuation: int | None = None,
    workers: int | None = None,
    restart: bool = False,
    index: IndexSpec | None = None,
) -> Database:
    """Build (or reuse, or resume) the database of ``data_dir`` for these settings."""
    spec = index or index_spec()
    need = {"bm25-bigrams": ("bm25s", "scipy"), "bm25": ("bm25s",), "hnsw": ("faiss", "scipy")}
    require("retrieval", *need[spec.kind], what=f"attnlab data retrieval --kind {spec.kind}")
    m, k = int(chunk_size), int(neighbours)
    cont = m if continuation is None else int(continuation)
    if m < 2 or k < 1 or cont < 0:
        raise UserError("--chunk-size must be >= 2, --neighbours >= 1, --continuation >= 0")
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise UserError(f"workers={workers} must be >= 1")
    data = TokenData.open(data_dir)
    out = database_dir(data_dir, m, k, cont, spec)
    writable = f"the database is written inside the data directory: make {data_dir} writable"
    with output_lock(out, wait=True, fix=writable):  # an experiment's runs build it once
        db = _build(data, out, m, k, cont, workers, restart, spec)
    short = shortfall(db, np.asarray(data.train), data.eos_id)
    if short is not None:
        warnings.warn(RetrievalWarning(f"{out}: {short}"), stacklevel=2)
    return db


def _reuse(out: Path, key: dict[str, Any]) -> Database:
    """The finished database in ``out`` when it was built with ``key``'s settings (one of format
    version 1 with a warning: its leakage rule was the query chunk's documents only)."""
    db = Database.open(out)
    if {x: db.meta.get(x) for x in key} == key:
        return db
    old = ("version", "leakage", "index", "block")
    if db.meta.get("version") == 1 and all(db.meta.get(x) == key[x] for x in key if x not in old):
        warnings.warn(
            RetrievalWarning(
                f"{out} was built by an earlier attnlab (format 1), whose leakage rule excluded "
                "only the query chunk's documents: a chunk at a document's end could take a "
                "neighbour from the next document, which its reading tokens belong to. Rebuild "
                f"it with `{rebuild_command(out)}` for the rule per reading token"
            ),
            stacklevel=4,
        )
        return db
    raise UserError(
        f"{out} was built from other data or settings; rebuild it with `{rebuild_command(out)}`"
    )


def _build(
    data: TokenData,
    out: Path,
    m: int,
    k: int,
    cont: int,
    workers: int,
    restart: bool,
    spec: IndexSpec,
) -> Database:
    key = _key(data, m, k, cont, spec)
    if out.exists() and not restart:
        return _reuse(out, key)
    if out.exists():
        shutil.rmtree(out)
    n_db = len(data.train) // m
    if n_db <= k:
        raise UserError(
            f"the training split has {n_db} chunks of {m} tokens, too few for {k} neighbours; "
            "use a smaller --chunk-size (model.retrieval.chunk_size in a run) or more data"
        )
    partial = out.parent / f".{out.name}.partial"
    indexed.start_partial(partial, key, restart)
    timings: dict[str, float] = {}
    if spec.kind == "bm25-bigrams":
        files, index_files = _score_all(data, partial, m, k, cont, workers)
    else:
        files, index_files, timings = indexed.build_indexed(
            data, partial, spec, m, k, cont, workers
        )
    train, val = np.asarray(data.train), np.asarray(data.val)
    meta = {
        **key,
        "database_chunks": n_db,
        "database_tokens": n_db * m,
        "query_chunks": {"train": len(train) // m, "val": len(val) // m},
        "index_files": index_files,
        "files": files,
    }
    atomic_write_json(partial / "out" / "meta.json", meta)
    (partial / "out").replace(out)
    shutil.rmtree(partial)
    db = Database.open(out)
    return Database(db.directory, db.meta, db.train, db.val, timings)


def _score_all(
    data: TokenData, partial: Path, m: int, k: int, cont: int, workers: int
) -> tuple[dict[str, str], list[str]]:
    """The bm25-bigrams scorer over every query block (resumable), assembled into ``out/``."""
    train, val = np.asarray(data.train), np.asarray(data.val)
    n_db = len(train) // m
    docs = document_ids(train, data.eos_id)
    starts = np.arange(n_db) * m
    db_end = np.minimum(starts + m + cont, len(train)) - 1
    q_lo, q_hi = reading_documents(docs, m)  # the chunk and the tokens that read its neighbours
    S, vocab = _score_matrix(train, m)
    _STATE.clear()
    _STATE.update(
        m=m,
        k=k,
        S=S,
        vocab=vocab,
        tokens={"train": train, "val": val},
        q_lo=q_lo,
        q_hi=q_hi,
        db_lo=docs[starts],
        db_hi=docs[db_end],
    )
    jobs = []
    for split, toks in (("train", train), ("val", val)):
        n_q = len(toks) // m
        for b in range(-(-n_q // BLOCK)):
            if not (partial / f"{split}-{b:06d}.npy").exists():
                jobs.append((split, b))

    def save(result: tuple[str, int, np.ndarray]) -> None:
        split, b, arr = result
        tmp = partial / f".{split}-{b:06d}.tmp.npy"
        np.save(tmp, arr)
        tmp.replace(partial / f"{split}-{b:06d}.npy")

    if workers == 1 or len(jobs) <= 1:
        for j in jobs:
            save(_score_block(j))
    else:
        with mp.get_context("fork").Pool(workers) as pool:
            for res in pool.imap_unordered(_score_block, jobs):
                save(res)
    files = {}
    out_tmp = partial / "out"
    if out_tmp.exists():
        shutil.rmtree(out_tmp)
    out_tmp.mkdir()
    for split, toks in (("train", train), ("val", val)):
        n_q = len(toks) // m
        parts = [np.load(partial / f"{split}-{b:06d}.npy") for b in range(-(-n_q // BLOCK))]
        arr = np.concatenate(parts) if parts else np.zeros((0, k), dtype=np.int64)
        np.save(out_tmp / f"{split}.npy", arr)
        files[f"{split}.npy"] = sha256_file(out_tmp / f"{split}.npy")
    index_files = bigrams.save(out_tmp, S, vocab)  # decoding loads it (no rebuild)
    for name in index_files:
        files[name] = sha256_file(out_tmp / name)
    _STATE.clear()
    return files, index_files


def sequence_neighbours(
    db: Database, data: TokenData, split: str, offsets: np.ndarray, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """Offsets moved down to the chunk grid (a multiple of m: RETRO's chunks are fixed in the
    token stream) and the neighbours [n, C, k, r] of the C = ceil(seq_len / m) chunks of each
    sequence of ``split`` starting there."""
    m = db.chunk_size
    off = np.asarray(offsets, dtype=np.int64)
    off = off - off % m
    C = -(-seq_len // m)
    idx = np.asarray(db.split(split))
    rows = np.minimum(off[:, None] // m + np.arange(C), len(idx) - 1)
    nbr = neighbour_tokens(data.train, idx[rows], m, db.neighbour_len, data.eos_id)
    return off, nbr


def overlap(query: np.ndarray, neighbours: np.ndarray, n: int = 8) -> float:
    """Fraction of the query chunk's token n-grams that occur in any of its neighbours (RETRO's
    "eval/train overlap" measured per chunk, with n-grams instead of its 8-token spans)."""
    q = {tuple(query[i : i + n]) for i in range(len(query) - n + 1)}
    if not q:
        return 0.0
    seen = {tuple(nb[i : i + n]) for nb in neighbours for i in range(len(nb) - n + 1)}
    return len(q & seen) / len(q)


def digest(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()
