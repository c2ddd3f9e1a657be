"""``attnlab data prepare|info|sources``: build and inspect token data directories."""

from __future__ import annotations

import argparse
import json

from attnlab.base import exitcodes

NAME = "data"
HELP = "prepare token shards from a corpus, and inspect prepared data directories"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)

    p = sub.add_parser(
        "prepare",
        help="tokenize a corpus into train.bin/val.bin + meta.json",
        description="Tokenize a corpus into DIR/train.bin, DIR/val.bin (memmaps) and meta.json, "
        "encoding on every core. An interrupted prepare resumes when run again with the same "
        "arguments (documents already encoded are not encoded again).",
    )
    p.add_argument(
        "--corpus",
        default="wiki-sample",
        help="wiki-sample (default), dict-gcide, wordnet, bible-kjv, python-doc, hf:NAME[:CONFIG], "
        "or a local .txt/.jsonl/.parquet file, directory or glob",
    )
    p.add_argument(
        "--tokenizer",
        default="bytes",
        help="bytes (default), bpe-4096, bpe-8192, gpt2, pythia, a tokenizer.json path, "
        "a local tokenizer directory, or hf:ORG/NAME",
    )
    p.add_argument(
        "--out", default=None, help="output directory (default data/<corpus>-<tokenizer>)"
    )
    p.add_argument("--val-fraction", type=float, default=0.05, help="share of documents for val")
    p.add_argument(
        "--replace-invalid-utf8",
        action="store_true",
        help="replace invalid UTF-8 bytes with U+FFFD instead of stopping",
    )
    p.add_argument("--max-documents", type=int, default=None, help="read at most N documents")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="stop once train + val hold N tokens (the document that reaches N is kept whole)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="encoding processes (default: every core); the output does not depend on it",
    )
    p.add_argument("--text-field", default="text", help="JSONL field / Parquet column with text")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the document split hash")
    p.add_argument("--force", action="store_true", help="replace an existing data directory")
    p.add_argument(
        "--restart",
        action="store_true",
        help="discard the progress of an interrupted prepare instead of resuming it",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    i = sub.add_parser("info", help="print the summary of a prepared data directory")
    i.add_argument("dir", metavar="DIR")
    i.add_argument("--json", action="store_true", help="print meta.json as is")
    i.add_argument(
        "--verify",
        action="store_true",
        help="re-hash every file (token shards, tokenizer, meta.json) and check the vocabulary",
    )

    sub.add_parser("sources", help="list the named corpora and tokenizers")

    r = sub.add_parser(
        "retrieval",
        help="build the retrieval database (BM25 neighbours of every chunk) of a prepared "
        "data directory, for model.family='retrieval'",
    )
    r.add_argument("--data", required=True, metavar="DIR", help="a prepared data directory")
    r.add_argument("--chunk-size", type=int, default=16, help="m: tokens per chunk (16)")
    r.add_argument("--neighbours", type=int, default=2, help="k: neighbours per chunk (2)")
    r.add_argument(
        "--continuation", type=int, default=None, help="tokens after a neighbour chunk (m)"
    )
    r.add_argument("--workers", type=int, default=None, help="scoring processes (every core)")
    r.add_argument("--restart", action="store_true", help="rebuild from scratch")


def _fmt(n: int) -> str:
    return f"{n:,}"


def _print_summary(meta: dict, directory: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    tok = meta["tokenizer"]
    console.print(f"[bold]{escape(directory)}[/bold]", soft_wrap=True)  # as text, one line
    console.print(
        f"corpus {meta['corpus_spec']!r} ({meta['corpus']}), tokenizer {tok['name']!r} "
        f"(vocab {_fmt(meta['vocab_size'])}, eos {meta['eos_id']}), dtype {meta['dtype']}",
        markup=False,
        soft_wrap=True,
    )
    table = Table("split", "documents", "tokens", "sha256")
    for split, info in meta["splits"].items():
        table.add_row(
            escape(split), _fmt(info["documents"]), _fmt(info["tokens"]), info["sha256"][:16]
        )
    console.print(table)
    console.print(
        f"text {_fmt(meta['text_bytes'])} bytes, {meta['bytes_per_token']} bytes/token; "
        f"content hash {meta['content_hash'][:16]}; prepared in {meta['prepare_seconds']} s"
    )
    if meta.get("max_tokens"):
        console.print(f"stopped at the token budget --max-tokens {_fmt(meta['max_tokens'])}")
    attribution = meta.get("attribution") or {}
    credit = [f"{k}: {attribution[k]}" for k in ("source", "license") if attribution.get(k)]
    if "n_articles" in attribution:
        credit.append(f"{attribution['n_articles']} articles")
    if credit:
        console.print("attribution: " + "; ".join(credit), markup=False)


def _prepare(args: argparse.Namespace) -> int:
    from attnlab.base.safepath import check_out_dir
    from attnlab.data import default_data_dir, prepare

    out = args.out or default_data_dir(args.corpus, args.tokenizer)
    check_out_dir(out, tree=False)  # prepare replaces the whole directory, links and all
    meta = prepare(
        args.corpus,
        args.tokenizer,
        out,
        val_fraction=args.val_fraction,
        replace_invalid_utf8=args.replace_invalid_utf8,
        max_documents=args.max_documents,
        max_tokens=args.max_tokens,
        text_field=args.text_field,
        split_seed=args.split_seed,
        overwrite=args.force,
        progress=None if not args.no_progress else False,
        workers=args.workers,
        restart=args.restart,
    )
    _print_summary(meta, str(out))
    return exitcodes.OK


def _info(args: argparse.Namespace) -> int:
    from attnlab.data import TokenData

    data = TokenData.open(args.dir)
    checked = data.verify(full=True) if args.verify else []
    if args.json:
        print(json.dumps(data.meta, indent=2, ensure_ascii=False))
    else:
        _print_summary(data.meta, args.dir)
        if args.verify:
            print(
                f"every file matches meta.json ({', '.join(checked)}); vocab_size matches the tokenizer"
            )
            if "meta.json" not in checked:
                print(
                    "(this directory was prepared by an older attnlab: its tokenizer files and "
                    "meta.json carry no sha256; prepare it again to have them checked)"
                )
    return exitcodes.OK


def _sources(args: argparse.Namespace) -> int:
    from attnlab.data.corpus_lookup import registered_corpora
    from attnlab.data.tokenizer_lookup import BUILTIN_NAMES

    print("corpora:")
    for name, description in registered_corpora().items():
        print(f"  {name:14s} {description}")
    print(
        "  hf:NAME[:CONFIG]  a Hugging Face dataset (online), e.g. hf:wikitext-103, hf:fineweb-edu"
    )
    print("  PATH / GLOB    local .txt, .jsonl, .parquet files (.txt.gz, .jsonl.gz too)")
    print("tokenizers:")
    print(
        "  " + ", ".join(BUILTIN_NAMES) + ", bpe-N, a tokenizer.json, a tokenizer dir, hf:ORG/NAME"
    )
    return exitcodes.OK


def _retrieval(args: argparse.Namespace) -> int:
    import time

    from attnlab.data.retrieval import build_database

    t0 = time.perf_counter()
    db = build_database(
        args.data,
        chunk_size=args.chunk_size,
        neighbours=args.neighbours,
        continuation=args.continuation,
        workers=args.workers,
        restart=args.restart,
    )
    m = db.meta
    print(f"retrieval database: {db.directory}")
    print(f"  embedder        {m['embedder']}")
    print(
        f"  database        {m['database_chunks']:,} chunks of {m['chunk_size']} tokens "
        f"({m['database_tokens']:,} tokens), neighbours of {db.neighbour_len} tokens"
    )
    q = m["query_chunks"]
    short = [f"{db.short(s):,} {s}" for s in ("train", "val") if db.short(s)]
    lacking = f"; fewer for {' and '.join(short)} chunks (see the warning)" if short else ""
    print(
        f"  neighbours      k={m['neighbours']} for {q['train']:,} train, {q['val']:,} val chunks"
        + lacking
    )
    print(f"  took            {time.perf_counter() - t0:.1f} s")
    return exitcodes.OK


def run(args: argparse.Namespace) -> int:
    commands = {"prepare": _prepare, "info": _info, "sources": _sources, "retrieval": _retrieval}
    return commands[args.data_command](args)
