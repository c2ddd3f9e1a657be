"""``prepare``: corpus -> document split -> tokenizer -> ``train.bin``/``val.bin`` + ``meta.json``.

1. Stream documents from the corpus (empty ones skipped, at most ``max_documents``). A corpus-trained
   tokenizer (``bpe-N``) first spools them to a file and trains on the train split.
2. Encode chunks of about 1 MB of text on every core (:mod:`attnlab.data.encoding`); each document
   is followed by end-of-text and goes to train or validation by a seeded hash of its text
   (:mod:`attnlab.data.split`). Chunks are written in corpus order, so the bytes do not depend on
   the number of workers. ``max_tokens`` stops after the document that reaches the budget.
3. Save the tokenizer, hash the token files, write ``meta.json``.

``meta["content_hash"] = sha256(sha256(train.bin) || sha256(val.bin))`` (raw digests): it names
the exact token data, so schedules and results can refer to it.

Everything is built in ``.NAME.partial/`` beside the output and renamed into place when complete
(:mod:`attnlab.data.staging`). A killed prepare resumes there when run again with the same
arguments: the documents already encoded are skipped (read, not encoded again) and the shard
files continue from the last progress record. Memory stays bounded by a few chunks: nothing
holds a whole split, so corpora and shards larger than RAM work.
"""

from __future__ import annotations

import itertools
import mmap
import re
import sys
import time
from array import array
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.base.atomic import atomic_write_json
from attnlab.base.errors import UserError
from attnlab.base.pathkind import kind
from attnlab.data.corpus import Corpus
from attnlab.data.corpus_lookup import open_corpus
from attnlab.data.encoding import CHUNK_BYTES, chunk_documents, default_workers, encode_chunks
from attnlab.data.integrity import record_files
from attnlab.data.shards import token_dtype
from attnlab.data.split import assign_splits, document_u
from attnlab.data.split_writer import SplitWriter
from attnlab.data.staging import Stage, output_lock, remove_stale
from attnlab.data.tokendata import FORMAT, FORMAT_VERSION, TokenData, read_meta
from attnlab.data.tokenizer import Tokenizer, bpe_vocab_size
from attnlab.data.tokenizer_lookup import load_tokenizer, tokenizer_from_spec

COMMIT_BYTES = 32 << 20  # a progress record after about every 32 MB of text
COMMIT_SECONDS = 30.0  # ... or every 30 s, whichever comes first
PARALLEL_AFTER_BYTES = 1 << 20  # the first MB is encoded in process: tiny corpora start no workers
_SPOOL = ".documents.spool"
_SPOOL_BOUNDS = ".documents.bounds.npy"


def default_data_dir(corpus: str, tokenizer: str, root: str | Path = "data") -> Path:
    """``data/<corpus>-<tokenizer>`` with both parts made file-name safe."""

    def slug(text: str) -> str:
        text = text.rstrip("/")
        if text.startswith("hf:"):
            text = "hf-" + text[3:]
        elif "/" in text or "\\" in text or re.search(r"\.(txt|jsonl|parquet|json|gz)$", text):
            text = Path(text.split("*")[0] or "glob").name or text
            text = re.sub(r"(\.(txt|jsonl|parquet|json|gz))+$", "", text)
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "x"

    return Path(root) / f"{slug(corpus)}-{slug(tokenizer)}"


def _document_bytes(
    corpus: Corpus, replace_invalid_utf8: bool, limit: int | None, start: int = 0, seen: int = 0
) -> Iterator[tuple[int, bytes]]:
    """``(position after it, UTF-8 bytes)`` of each non-empty document, skipping the first
    ``start`` documents of the source (of which ``seen`` were non-empty), at most ``limit``."""
    n = seen
    for i, doc in enumerate(itertools.islice(corpus.documents(), start, None), start=start):
        if limit is not None and n >= limit:
            return
        if not doc or doc.isspace():
            continue
        try:
            data = doc.encode("utf-8")
        except UnicodeEncodeError as e:  # lone surrogates, e.g. from JSON "\ud800"
            if not replace_invalid_utf8:
                raise UserError(
                    f"document {i} of {corpus.name} contains an unpaired surrogate "
                    f"({doc[e.start]!r}) that is not valid UTF-8; pass --replace-invalid-utf8 "
                    "(data.replace_invalid_utf8 = true in a run config)"
                ) from None
            data = doc.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode()
        n += 1
        yield i + 1, data


def _spooled(directory: Path, start: int) -> Iterator[tuple[int, bytes]]:
    """The spooled documents from index ``start`` on, as ``_document_bytes`` yields them."""
    bounds = np.load(directory / _SPOOL_BOUNDS)
    if len(bounds) == 0 or start >= len(bounds):
        return
    with (
        open(directory / _SPOOL, "rb") as f,
        mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m,
    ):
        for i in range(start, len(bounds)):
            a, b = bounds[i]
            yield i + 1, bytes(m[a:b])


def _spool_and_train(
    source: Corpus, tokenizer: str, vocab: int, directory: Path, opts: dict[str, Any], bar: Any
) -> tuple[Tokenizer, dict[str, Any]]:
    """``bpe-N``: spool the documents, train on the train split; returns (tokenizer, spec)."""
    from attnlab.data.bpe import train_bpe

    reading = bar.add_task(f"reading {source.name}", total=source.size_hint(), tokens="")
    ends, u = array("q"), array("d")  # 16 bytes per document, not Python objects
    with open(directory / _SPOOL, "wb") as f:
        for _, data in _document_bytes(source, opts["replace_invalid_utf8"], opts["max_documents"]):
            f.write(data)
            ends.append((ends[-1] if ends else 0) + len(data))
            u.append(document_u(data, opts["split_seed"]))
            bar.advance(reading, len(data))
    stop = np.frombuffer(ends, dtype=np.int64)
    bounds = np.stack([np.concatenate([[0], stop])[:-1].astype(np.int64), stop], axis=1)
    np.save(directory / _SPOOL_BOUNDS, bounds)
    _check_documents(len(bounds), opts)
    is_val = assign_splits(u, opts["val_fraction"])
    training = bar.add_task(f"training {tokenizer}", total=None, tokens="")
    texts = (d.decode("utf-8") for i, d in _spooled(directory, 0) if not is_val[i - 1])
    tok = train_bpe(texts, vocab, name=tokenizer, length=int((~is_val).sum()))
    bar.update(training, total=1, completed=1)
    return tok, tok.save(directory)


def _check_documents(n_docs: int, opts: dict[str, Any]) -> None:
    corpus = opts["corpus"]
    if n_docs == 0:
        raise UserError(
            f"corpus {corpus!r} has no non-empty documents; check the path, the "
            "--text-field (data.text_field), or the file contents"
        )
    if opts["val_fraction"] > 0 and n_docs < 2:
        raise UserError(
            f"corpus {corpus!r} has a single document, so no document-level validation "
            "split is possible (and training needs one); add documents: one per line of a "
            ".jsonl, or a .txt over 1 MiB, which is split at blank lines. Only `attnlab data "
            "prepare --val-fraction 0` prepares it without a validation split"
        )


def _progress(enabled: bool) -> Any:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False),  # names and paths as text
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[tokens]}", markup=False),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )


def _check_out_dir(out: Path, overwrite: bool, out_flag: str) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"{out_flag} {out} is {kind(out) or 'a file'}; choose a directory path")
    if (out / "meta.json").exists():
        if not overwrite:
            raise UserError(
                f"{out} is already a prepared data directory; use it as is, or pass --force "
                "to replace it (its schedules are deleted with it)"
            )
    elif any(out.iterdir()):
        raise UserError(
            f"{out_flag} {out} exists and is not a prepared data directory; choose a new or "
            "empty path"
        )


def prepare(
    corpus: str,
    tokenizer: str,
    out_dir: str | Path,
    *,
    val_fraction: float = 0.05,
    replace_invalid_utf8: bool = False,
    max_documents: int | None = None,
    max_tokens: int | None = None,
    text_field: str = "text",
    split_seed: int = 0,
    overwrite: bool = False,
    progress: bool | None = None,
    workers: int | None = None,
    restart: bool = False,
    chunk_bytes: int = CHUNK_BYTES,
    commit_bytes: int = COMMIT_BYTES,
    parallel_after: int = PARALLEL_AFTER_BYTES,
    wait: bool = False,
    out_flag: str = "--out",
) -> dict[str, Any]:
    """Tokenize ``corpus`` into ``out_dir`` (see module docstring); returns the meta dict.

    ``workers`` encoding processes (default: every core; the output does not depend on it);
    ``max_tokens`` stops after the document that brings both splits together to that many
    tokens; ``restart`` discards the progress of an interrupted run instead of resuming it.
    A second prepare of the same ``out_dir`` fails at once, or with ``wait`` waits for the first
    and then uses what it prepared. ``out_flag`` is how the user named ``out_dir``, for the
    messages: ``--out`` of ``attnlab data prepare``, ``data.dir`` when a run prepares its data.
    """
    started = time.perf_counter()
    out = Path(out_dir)
    if max_documents is not None and max_documents < 1:
        raise UserError(f"max_documents={max_documents} must be >= 1")
    if max_tokens is not None and max_tokens < 1:
        raise UserError(f"max_tokens={max_tokens} must be >= 1")
    if not 0.0 <= val_fraction < 1.0:
        raise UserError(f"val_fraction={val_fraction} must be in [0, 1)")
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise UserError(f"workers={workers} must be >= 1")
    if not (wait and (out / "meta.json").exists()):
        _check_out_dir(out, overwrite, out_flag)
    bpe_size = bpe_vocab_size(tokenizer)
    tok: Tokenizer | None = None
    if bpe_size is None:
        tok = load_tokenizer(tokenizer)
        token_dtype(tok.vocab_size)  # fail before reading the corpus
    source = open_corpus(corpus, text_field=text_field, replace_invalid_utf8=replace_invalid_utf8)
    show = sys.stderr.isatty() if progress is None else progress
    opts = {
        "corpus": corpus,
        "tokenizer": tokenizer if tok is None else tok.describe(),
        "fingerprint": source.fingerprint(),
        "val_fraction": val_fraction,
        "replace_invalid_utf8": replace_invalid_utf8,
        "max_documents": max_documents,
        "max_tokens": max_tokens,
        "text_field": text_field,
        "split_seed": split_seed,
        "version": FORMAT_VERSION,
    }
    lock = output_lock(out, wait=wait, fix=f"choose a writable {out_flag}")
    with lock, _progress(show) as bar:
        if wait and not overwrite and (out / "meta.json").exists():
            return read_meta(out)  # prepared by the process we waited for
        remove_stale(out)
        stage = Stage(out, opts)
        try:
            meta = _prepare_in(
                stage,
                source,
                tok,
                tokenizer,
                bpe_size,
                opts,
                bar,
                restart,
                {
                    "workers": workers,
                    "chunk_bytes": chunk_bytes,
                    "commit_bytes": commit_bytes,
                    "parallel_after": parallel_after,
                },
            )
        except UserError:
            stage.discard()  # bad input: its fix changes what the progress describes
            raise
        meta["prepare_seconds"] = round(time.perf_counter() - started, 2)
        meta = record_files(stage.dir, meta)  # the tokenizer files' sha256, meta.json's seal
        atomic_write_json(stage.dir / "meta.json", meta)
        stage.publish(replace=overwrite)
    return meta


def _prepare_in(
    stage: Stage,
    source: Corpus,
    tok: Tokenizer | None,
    tokenizer: str,
    bpe_size: int | None,
    opts: dict[str, Any],
    bar: Any,
    restart: bool,
    run: dict[str, int],
) -> dict[str, Any]:
    state = stage.open(restart) or {}
    if tok is None:
        assert bpe_size is not None
        if "tokenizer_spec" in state:
            tok = tokenizer_from_spec(state["tokenizer_spec"], stage.dir)
        else:
            tok, spec = _spool_and_train(source, tokenizer, bpe_size, stage.dir, opts, bar)
            state = {"tokenizer_spec": spec}
            stage.commit(state, [])
    dtype = token_dtype(tok.vocab_size)
    writer = SplitWriter(stage.dir, dtype, tok.vocab_size, opts["val_fraction"], state)
    if not state.get("done"):
        state = _encode(stage, source, tok, writer, dtype, opts, bar, state, run)
    splits = writer.finish()
    _check_documents(writer.documents, opts)
    for f in (_SPOOL, _SPOOL_BOUNDS):
        (stage.dir / f).unlink(missing_ok=True)
    import hashlib

    combined = hashlib.sha256()
    for info in splits.values():
        combined.update(bytes.fromhex(info["sha256"]))
    total_tokens = sum(s["tokens"] for s in splits.values())
    tok_spec = tok.save(stage.dir)
    meta: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "corpus": source.name,
        "corpus_spec": opts["corpus"],
        "attribution": state["attribution"],
        "tokenizer": {**tok_spec, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id},
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "dtype": dtype.name,
        "splits": splits,
        "content_hash": combined.hexdigest(),
        "documents": writer.documents,
        "text_bytes": writer.text_bytes,
        "bytes_per_token": round(writer.text_bytes / total_tokens, 4),
        "val_fraction": opts["val_fraction"],
        "split_seed": opts["split_seed"],
        "max_documents": opts["max_documents"],
        **({"max_tokens": opts["max_tokens"]} if opts["max_tokens"] is not None else {}),
        "text_field": opts["text_field"],
        "replace_invalid_utf8": opts["replace_invalid_utf8"],
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "prepare_seconds": 0.0,
    }
    from attnlab import __version__

    meta["attnlab_version"] = __version__
    return meta


def _encode(
    stage: Stage,
    source: Corpus,
    tok: Tokenizer,
    writer: SplitWriter,
    dtype: np.dtype,
    opts: dict[str, Any],
    bar: Any,
    state: dict[str, Any],
    run: dict[str, int],
) -> dict[str, Any]:
    """Encode from where ``state`` stopped to the end of the source (or the token budget)."""
    position = int(state.get("position", 0))
    spooled = "tokenizer_spec" in state
    docs: Iterator[tuple[int, bytes]] = (
        _spooled(stage.dir, position)
        if spooled
        else _document_bytes(
            source, opts["replace_invalid_utf8"], opts["max_documents"], position, writer.documents
        )
    )
    budget = opts["max_tokens"]
    total = source.size_hint() if not spooled else (stage.dir / _SPOOL).stat().st_size
    task = bar.add_task(f"encoding with {tok.name}", total=total, tokens="")
    if writer.documents:
        bar.update(task, completed=writer.text_bytes)
        bar.console.print(
            f"resuming {stage.out}: {writer.documents:,} documents "
            f"({writer.text_bytes / 1e6:,.1f} MB, {writer.tokens:,} tokens) already encoded",
            markup=False,
        )
    last_commit, last_time = writer.text_bytes, time.monotonic()
    reached = False
    chunks = chunk_documents(docs, run["chunk_bytes"])
    encoded = encode_chunks(
        chunks,
        tok,
        split_seed=opts["split_seed"],
        dtype=dtype,
        workers=run["workers"],
        parallel_after=max(0, run["parallel_after"] - writer.text_bytes),
    )
    try:
        for end, chunk, enc in encoded:
            take = len(chunk)
            if budget is not None:
                reach = np.cumsum(enc.lengths) + writer.tokens >= budget
                if reach.any():
                    take, reached = int(np.argmax(reach)) + 1, True
            writer.write(enc, chunk, take)
            state = {**state, **writer.state(), "position": end}
            if total is None and (total := source.size_hint()):  # a stream's size, once open
                bar.update(task, total=total)
            bar.update(task, completed=writer.text_bytes, tokens=f"{writer.tokens:,} tokens")
            if budget is not None and writer.tokens:
                estimate = budget * writer.text_bytes / writer.tokens
                bar.update(task, total=min(total or estimate, estimate))
            if reached:
                break
            due = writer.text_bytes - last_commit >= run["commit_bytes"]
            if due or time.monotonic() - last_time >= COMMIT_SECONDS:
                stage.commit(state, writer.files())
                last_commit, last_time = writer.text_bytes, time.monotonic()
    finally:
        encoded.close()
    bar.update(task, total=writer.text_bytes, completed=writer.text_bytes)
    state = {**state, **writer.state(), "done": True, "attribution": source.attribution()}
    stage.commit(state, writer.files())
    return state


def ensure_prepared(data_cfg: Any, root: str | Path = "data") -> TokenData:
    """Open the data directory a ``DataConfig`` names, preparing it first if it does not exist.

    An existing directory must have been prepared from the same corpus and tokenizer.
    """
    directory = (
        Path(data_cfg.dir)
        if data_cfg.dir
        else default_data_dir(data_cfg.corpus, data_cfg.tokenizer, root)
    )
    if (directory / "meta.json").exists():
        meta = read_meta(directory)
        got = (meta["corpus_spec"], meta["tokenizer"]["name"])
        want = (data_cfg.corpus, data_cfg.tokenizer)
        if got != want:
            raise UserError(
                f"{directory} holds corpus {got[0]!r} with tokenizer {got[1]!r}, but the config "
                f"asks for {want[0]!r} with {want[1]!r}; set data.dir to another directory"
            )
        return TokenData.open(directory)
    prepare(
        data_cfg.corpus,
        data_cfg.tokenizer,
        directory,
        val_fraction=data_cfg.val_fraction,
        replace_invalid_utf8=data_cfg.replace_invalid_utf8,
        max_documents=data_cfg.max_documents,
        text_field=data_cfg.text_field,
        split_seed=data_cfg.split_seed,
        wait=True,
        out_flag="data.dir",
    )
    return ensure_prepared(data_cfg, root)  # checks what a concurrent prepare may have made
