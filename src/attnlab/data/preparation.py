"""``prepare``: corpus -> document split -> tokenizer -> ``train.bin``/``val.bin`` + ``meta.json``.

1. Read documents once (empty ones skipped, at most ``max_documents``) into a spool file.
2. Split by document with a seeded content hash (:mod:`attnlab.data.split`).
3. Train the tokenizer on the train split if it is corpus-trained (``bpe-N``).
4. Encode each split in batches; every document is followed by end-of-text.
5. Save the tokenizer, hash the token files, write ``meta.json``.

``meta["content_hash"] = sha256(sha256(train.bin) || sha256(val.bin))`` (raw digests): it names
the exact token data, so schedules and results can refer to it.

Everything is built in a temporary sibling directory that is renamed into place only when
complete, so an interrupted run never leaves a half-written data directory behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import re
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.data.corpus import Corpus, open_corpus
from attnlab.data.shards import SPLITS, ShardWriter, shard_path, token_dtype
from attnlab.data.split import assign_splits, document_u
from attnlab.data.tokendata import FORMAT, FORMAT_VERSION, TokenData, read_meta
from attnlab.data.tokenizer import Tokenizer, bpe_vocab_size, load_tokenizer
from attnlab.errors import UserError
from attnlab.runs.atomic import atomic_directory, atomic_write_json

ENCODE_BATCH_CHARS = 1 << 20  # about 1 MB of text per encode call


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


class _Spool:
    """Documents as UTF-8 in one temporary file, addressed by (start, end) byte offsets."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bounds: list[tuple[int, int]] = []
        self.u: list[float] = []
        self.text_bytes = 0

    def fill(self, docs: Iterator[bytes], split_seed: int) -> None:
        with open(self.path, "wb") as f:
            for data in docs:
                f.write(data)
                self.bounds.append((self.text_bytes, self.text_bytes + len(data)))
                self.u.append(document_u(data, split_seed))
                self.text_bytes += len(data)

    @contextlib.contextmanager
    def reader(self) -> Iterator[Any]:
        if self.text_bytes == 0:
            yield b""
            return
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            yield m

    def texts(self, buf: Any, indices: np.ndarray) -> Iterator[str]:
        for i in indices:
            start, end = self.bounds[i]
            yield bytes(buf[start:end]).decode("utf-8")


def _document_bytes(
    corpus: Corpus, replace_invalid_utf8: bool, limit: int | None
) -> Iterator[bytes]:
    n = 0
    for i, doc in enumerate(corpus.documents()):
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
                    f"({doc[e.start]!r}) that is not valid UTF-8; pass --replace-invalid-utf8"
                ) from None
            data = doc.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode()
        n += 1
        yield data


def _batches(indices: np.ndarray, bounds: list[tuple[int, int]]) -> Iterator[np.ndarray]:
    start, size = 0, 0
    for k, i in enumerate(indices):
        size += bounds[i][1] - bounds[i][0]
        if size >= ENCODE_BATCH_CHARS:
            yield indices[start : k + 1]
            start, size = k + 1, 0
    if start < len(indices):
        yield indices[start:]


def _progress(enabled: bool) -> Any:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )


def _check_out_dir(out: Path, overwrite: bool) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"--out {out} is a file; choose a directory path")
    if (out / "meta.json").exists():
        if not overwrite:
            raise UserError(
                f"{out} is already a prepared data directory; use it as is, or pass --force "
                "to replace it (its schedules are deleted with it)"
            )
    elif any(out.iterdir()):
        raise UserError(
            f"--out {out} exists and is not a prepared data directory; choose a new or empty path"
        )


def prepare(
    corpus: str,
    tokenizer: str,
    out_dir: str | Path,
    *,
    val_fraction: float = 0.05,
    replace_invalid_utf8: bool = False,
    max_documents: int | None = None,
    text_field: str = "text",
    split_seed: int = 0,
    overwrite: bool = False,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Tokenize ``corpus`` into ``out_dir`` (see module docstring); returns the meta dict."""
    started = time.perf_counter()
    out = Path(out_dir)
    if max_documents is not None and max_documents < 1:
        raise UserError(f"max_documents={max_documents} must be >= 1")
    if not 0.0 <= val_fraction < 1.0:
        raise UserError(f"val_fraction={val_fraction} must be in [0, 1)")
    _check_out_dir(out, overwrite)
    bpe_size = bpe_vocab_size(tokenizer)
    tok: Tokenizer | None = None
    if bpe_size is None:
        tok = load_tokenizer(tokenizer)
        token_dtype(tok.vocab_size)  # fail before reading the corpus
    source = open_corpus(corpus, text_field=text_field, replace_invalid_utf8=replace_invalid_utf8)
    show = sys.stderr.isatty() if progress is None else progress

    with atomic_directory(out, replace=True) as tmp, _progress(show) as bar:
        spool = _Spool(tmp / ".documents.spool")
        reading = bar.add_task(f"reading {source.name}", total=max_documents)

        def counted(docs: Iterator[bytes]) -> Iterator[bytes]:
            for d in docs:
                bar.advance(reading)
                yield d

        spool.fill(
            counted(_document_bytes(source, replace_invalid_utf8, max_documents)), split_seed
        )
        n_docs = len(spool.bounds)
        bar.update(reading, total=n_docs, completed=n_docs)
        if n_docs == 0:
            raise UserError(
                f"corpus {corpus!r} has no non-empty documents; check the path, the "
                "--text-field, or the file contents"
            )
        if val_fraction > 0 and n_docs < 2:
            raise UserError(
                f"corpus {corpus!r} has a single document, so no document-level validation "
                "split is possible (and training needs one); add documents: one per line of a "
                ".jsonl, or a .txt over 1 MiB, which is split at blank lines. Only `attnlab data "
                "prepare --val-fraction 0` prepares it without a validation split"
            )
        is_val = assign_splits(spool.u, val_fraction)
        order = {"train": np.flatnonzero(~is_val), "val": np.flatnonzero(is_val)}

        with spool.reader() as buf:
            if tok is None:
                assert bpe_size is not None
                training = bar.add_task(f"training {tokenizer}", total=None)
                from attnlab.data.bpe import train_bpe

                tok = train_bpe(
                    spool.texts(buf, order["train"]),
                    bpe_size,
                    name=tokenizer,
                    length=len(order["train"]),
                )
                bar.update(training, total=1, completed=1)
            dtype = token_dtype(tok.vocab_size)
            encoding = bar.add_task(f"encoding with {tok.name}", total=n_docs)
            combined = hashlib.sha256()
            splits: dict[str, dict[str, Any]] = {}
            for split in SPLITS:
                with ShardWriter(shard_path(tmp, split), dtype, tok.vocab_size) as w:
                    for batch in _batches(order[split], spool.bounds):
                        ids = tok.encode_documents(list(spool.texts(buf, batch)))
                        w.write(ids, documents=len(batch))
                        bar.advance(encoding, len(batch))
                combined.update(w.sha256.digest())
                splits[split] = {
                    "file": shard_path(tmp, split).name,
                    "tokens": w.tokens,
                    "documents": w.documents,
                    "sha256": w.sha256.hexdigest(),
                }
        spool.path.unlink()
        total_tokens = sum(s["tokens"] for s in splits.values())
        if total_tokens == 0:
            raise UserError(f"corpus {corpus!r} produced zero tokens with {tok.name}")

        tok_spec = tok.save(tmp)
        meta: dict[str, Any] = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "corpus": source.name,
            "corpus_spec": corpus,
            "attribution": source.attribution(),
            "tokenizer": {**tok_spec, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id},
            "vocab_size": tok.vocab_size,
            "eos_id": tok.eos_id,
            "dtype": dtype.name,
            "splits": splits,
            "content_hash": combined.hexdigest(),
            "documents": n_docs,
            "text_bytes": spool.text_bytes,
            "bytes_per_token": round(spool.text_bytes / total_tokens, 4),
            "val_fraction": val_fraction,
            "split_seed": split_seed,
            "max_documents": max_documents,
            "text_field": text_field,
            "replace_invalid_utf8": replace_invalid_utf8,
            "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "prepare_seconds": round(time.perf_counter() - started, 2),
        }
        from attnlab import __version__

        meta["attnlab_version"] = __version__
        atomic_write_json(tmp / "meta.json", meta)
    return meta


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
    )
    return TokenData.open(directory)
