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

    _add_retrieval(sub)
    _add_synth_facts(sub)


def _add_retrieval(sub) -> None:
    """``attnlab data retrieval``: build a database, or --show a chunk's neighbours."""
    r = sub.add_parser(
        "retrieval",
        help="build the retrieval database (the neighbours of every chunk) of a prepared "
        "data directory, for model.family='retrieval'; or --show a chunk's neighbours",
    )
    r.add_argument("--data", metavar="DIR", help="a prepared data directory (to build)")
    r.add_argument("--chunk-size", type=int, default=16, help="m: tokens per chunk (16)")
    r.add_argument("--neighbours", type=int, default=2, help="k: neighbours per chunk (2)")
    r.add_argument(
        "--continuation", type=int, default=None, help="tokens after a neighbour chunk (m)"
    )
    r.add_argument(
        "--kind",
        default=None,
        help="the index: bm25-bigrams (default; what a retrieval run builds), bm25, hnsw",
    )
    r.add_argument(
        "--encoder",
        default=None,
        help="bm25: words (default) or unigrams; hnsw: random (default), smollm2-table, smollm2",
    )
    r.add_argument("--workers", type=int, default=None, help="scoring processes (every core)")
    r.add_argument("--restart", action="store_true", help="rebuild from scratch")
    r.add_argument(
        "--show",
        metavar="RUN_OR_DATA",
        help="print chunk --index N and its neighbours as text (a retrieval run, a database "
        "directory, or a data directory with one database)",
    )
    r.add_argument("--index", type=int, default=None, metavar="N", help="the chunk to --show")
    r.add_argument("--split", default="val", help="the split of the chunk to --show (val)")


def _add_synth_facts(sub) -> None:
    """``attnlab data synth-facts``: the planted-fact corpus."""
    f = sub.add_parser(
        "synth-facts",
        help="write and prepare a planted-fact corpus (key=value; facts stated in training "
        "documents, queried in validation ones; token positions recorded)",
    )
    f.add_argument("--out", required=True, metavar="DIR", help="the data directory to create")
    f.add_argument("--tokenizer", default="bytes", help="tokenizer name (bytes)")
    for name, default, what in (
        ("facts", 200, "number of facts"),
        ("mentions", 3, "training documents stating each fact"),
        ("facts-per-doc", 2, "facts per document"),
        ("key-len", 6, "letters per key"),
        ("value-len", 3, "letters per value (the answer)"),
        ("filler-sentences", 4, "most filler sentences around each statement"),
        ("seed", 0, "generator seed"),
    ):
        f.add_argument(f"--{name}", type=int, default=default, help=f"{what} ({default})")
    f.add_argument("--val-fraction", type=float, default=0.2, help="prepare's split (0.2)")


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

    from attnlab.base.errors import UserError
    from attnlab.data.retrieval import build_database
    from attnlab.data.retrieval_index import index_spec

    if args.show is not None:
        return _show(args)
    if args.data is None:
        raise UserError("give --data DIR (to build a database) or --show RUN_OR_DATA --index N")
    t0 = time.perf_counter()
    db = build_database(
        args.data,
        chunk_size=args.chunk_size,
        neighbours=args.neighbours,
        continuation=args.continuation,
        workers=args.workers,
        restart=args.restart,
        index=index_spec(args.kind, args.encoder),
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
    print(f"  leakage rule    {db.leakage}")
    stages = ", ".join(
        f"{k} {v:.1f} s" for k, v in db.timings.items() if k not in ("encoder_tokens_per_s", "cpu")
    )
    if "cpu" in db.timings:
        stages += f"; {db.timings['cpu']:.1f} CPU s"
    if "encoder_tokens_per_s" in db.timings:
        stages += f"; encoder {db.timings['encoder_tokens_per_s']:,.0f} tokens/s"
    print(
        f"  took            {time.perf_counter() - t0:.1f} s" + (f" ({stages})" if stages else "")
    )
    return exitcodes.OK


def _show(args: argparse.Namespace) -> int:
    from attnlab.base.errors import UserError
    from attnlab.data import TokenData
    from attnlab.data.retrieval import Database
    from attnlab.data.retrieval_index.show import resolve_database, show_chunk

    if args.index is None:
        raise UserError("--show needs --index N: the chunk whose neighbours to print")
    db = Database.open(resolve_database(args.show))
    data = TokenData.open(db.directory.parent.parent)
    print("\n".join(show_chunk(db, data, args.split, args.index)))
    return exitcodes.OK


def _synth_facts(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from attnlab.base.errors import UserError
    from attnlab.data.synth_facts import FactsSpec, generate

    try:
        spec = FactsSpec(
            facts=args.facts,
            mentions=args.mentions,
            facts_per_doc=args.facts_per_doc,
            key_len=args.key_len,
            value_len=args.value_len,
            filler_sentences=args.filler_sentences,
            seed=args.seed,
            val_fraction=args.val_fraction,
        )
    except ValidationError as e:
        bad = "; ".join(
            f"--{'-'.join(map(str, x['loc'])).replace('_', '-')}: {x['msg']}" for x in e.errors()
        )
        raise UserError(f"{bad}") from None
    rec = generate(args.out, spec, tokenizer=args.tokenizer)
    docs, st = rec["documents"], rec["statements"]
    print(f"planted-fact data: {args.out} ({args.tokenizer})")
    print(f"  facts           {len(rec['facts']):,}, each in {spec.mentions} training documents")
    print(f"  documents       {docs['train']:,} train, {docs['val']:,} val")
    print(f"  statements      {st['train']:,} train, {st['val']:,} val (token positions in")
    print(f"                  {args.out}/facts/statements-{{train,val}}.npy)")
    return exitcodes.OK


def run(args: argparse.Namespace) -> int:
    commands = {
        "prepare": _prepare,
        "info": _info,
        "sources": _sources,
        "retrieval": _retrieval,
        "synth-facts": _synth_facts,
    }
    return commands[args.data_command](args)
