"""Data preparation throughput: one core against every core, same corpus, interleaved rounds.

    python benchmarks/prepare_throughput.py [--corpus dict-gcide --corpus wiki-sample]
        [--tokenizer gpt2] [--rounds 3] [--workers N] [--copies N] [--wait-quiet 1.0]
        [--max-wait 1800] [--out STEM]

Each measurement is one ``attnlab data prepare`` in a fresh Python process (worker start-up
included) into a scratch directory; rounds alternate which mode goes first. MB/s is text bytes
(UTF-8, as in meta.json) per wall-clock second; the speedup is the ratio of the median times.
Every run must give the same ``content_hash`` (the output does not depend on the workers).
CPU seconds (the prepare process and its workers) are recorded beside the wall time: on a shared
machine they show whether a slow run waited for a core or did more work.

``--copies N`` measures each corpus at N times its size instead: its documents written N times
into a local JSONL file (the path a researcher's own corpus takes), so that the fixed start of a
prepare (imports, loading the tokenizer, the first chunk encoded in process) stops dominating.

Writes ``benchmarks/results/prepare-<cpu>-<date>.md`` and ``.json`` (or ``--out STEM``), with the load average before
and after each run. Target (issue 15): all cores >= 1.8x one core on the 2-core CPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

TARGET = 1.8
_CHILD = r"""
import json, resource, sys, time
from attnlab.data import prepare
corpus, tokenizer, out, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
t = time.perf_counter()
meta = prepare(corpus, tokenizer, out, workers=workers, progress=False)
wall = time.perf_counter() - t
ru = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
cpu = sum(r.ru_utime + r.ru_stime for r in ru)
print("RESULT " + json.dumps({"wall": wall, "cpu": cpu, "text_bytes": meta["text_bytes"],
      "tokens": sum(s["tokens"] for s in meta["splits"].values()),
      "content_hash": meta["content_hash"]}))
"""


def wait_for_quiet(threshold: float, max_wait: float) -> None:
    deadline = time.monotonic() + max_wait
    while (load := os.getloadavg()[0]) >= threshold:
        if time.monotonic() >= deadline:
            print(f"load average still {load:.2f} after {max_wait:.0f} s: running anyway")
            return
        print(f"load average {load:.2f} >= {threshold}; waiting 30 s", flush=True)
        time.sleep(30)
    print(f"load average {load:.2f} < {threshold}: starting", flush=True)


def measure(corpus: str, tokenizer: str, workers: int, scratch: Path) -> dict:
    out = scratch / f"w{workers}"
    shutil.rmtree(out, ignore_errors=True)
    load_before = os.getloadavg()
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, corpus, tokenizer, str(out), str(workers)],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"prepare failed ({corpus}, workers={workers}):\n{proc.stderr[-3000:]}")
    row = json.loads(lines[-1].removeprefix("RESULT "))
    row.update(workers=workers, load_before=load_before, load_after=os.getloadavg())
    row["mb_per_s"] = row["text_bytes"] / 1e6 / row["wall"]
    shutil.rmtree(out, ignore_errors=True)
    return row


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("attnlab", "torch", "tokenizers", "tiktoken", "numpy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "absent"
    return out


def cpu_name() -> str:
    from attnlab.bench.machine import cpu_model

    return cpu_model()


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def summarise(corpus: str, rows: list[dict]) -> dict:
    by = {w: [r for r in rows if r["workers"] == w] for w in sorted({r["workers"] for r in rows})}
    one, many = min(by), max(by)
    med = {w: statistics.median(r["wall"] for r in rs) for w, rs in by.items()}
    text_mb = rows[0]["text_bytes"] / 1e6
    return {
        "corpus": corpus,
        "text_mb": round(text_mb, 2),
        "tokens": rows[0]["tokens"],
        "workers": many,
        "median_s": {str(w): round(s, 2) for w, s in med.items()},
        "mb_per_s": {str(w): round(text_mb / s, 2) for w, s in med.items()},
        "speedup": round(med[one] / med[many], 3),
        "cpu_s": {
            str(w): round(statistics.median(r["cpu"] for r in rs), 2) for w, rs in by.items()
        },
        "identical_output": len({r["content_hash"] for r in rows}) == 1,
    }


def local_copies(corpus: str, copies: int, scratch: Path) -> Path:
    """``scratch/<corpus>-x<copies>.jsonl``: the corpus's documents, ``copies`` times over."""
    from attnlab.data.corpus_lookup import open_corpus

    path = scratch / f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', corpus)}-x{copies}.jsonl"
    docs = [json.dumps({"text": d}) + "\n" for d in open_corpus(corpus).documents()]
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(copies):
            f.writelines(docs)
    return path


def write_results(record: dict, stem: Path | None = None) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", cpu_name().lower()).strip("-")[:24]
    stem = stem or Path(__file__).parent / "results" / f"prepare-{slug}-{record['date']}"
    stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    lines = [
        f"# attnlab data prepare throughput, {record['date']} ({record['time_utc']} UTC)",
        "",
        f"Machine: {record['cpu']}, {record['cores']} cores. Versions: "
        + ", ".join(f"{k} {v}" for k, v in record["versions"].items())
        + f". Commit {record['commit']}. Tokenizer {record['tokenizer']}, "
        f"{record['rounds']} interleaved rounds, median wall time.",
        f"Load average (1 min) at start {record['load_start'][0]:.2f}, "
        f"at end {record['load_end'][0]:.2f}; niceness {record['niceness']} (a negative value: "
        "run at raised priority to get whole cores on a shared machine).",
        "",
        "| corpus | text MB | tokens | 1 core MB/s | all cores MB/s | speedup | CPU s (1 / all) "
        "| identical output |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in record["summary"]:
        w = str(s["workers"])
        lines.append(
            f"| {s['corpus']} | {s['text_mb']} | {s['tokens']:,} | {s['mb_per_s']['1']} | "
            f"{s['mb_per_s'][w]} ({w} workers) | {s['speedup']:.2f}x | "
            f"{s['cpu_s']['1']} / {s['cpu_s'][w]} | {'yes' if s['identical_output'] else 'NO'} |"
        )
    lines += ["", "Runs (wall s, load average before):", ""]
    for r in record["runs"]:
        lines.append(
            f"- {r['corpus']} workers={r['workers']}: {r['wall']:.2f} s, {r['mb_per_s']:.2f} MB/s,"
            f" CPU {r['cpu']:.2f} s, load {r['load_before'][0]:.2f}"
        )
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return stem


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", action="append", help="repeatable (default dict-gcide, wiki-sample)")
    p.add_argument("--tokenizer", default="gpt2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=None, help="the all-cores run (default: cores)")
    p.add_argument("--wait-quiet", type=float, metavar="LOAD", help="wait for load average < LOAD")
    p.add_argument("--max-wait", type=float, default=1800.0)
    p.add_argument("--copies", type=int, default=1, help="each corpus N times, as local JSONL")
    p.add_argument("--no-save", action="store_true", help="print only")
    p.add_argument("--out", type=Path, metavar="STEM", help="default results/prepare-<cpu>-<date>")
    args = p.parse_args(argv)
    corpora = args.corpus or ["dict-gcide", "wiki-sample"]
    workers = args.workers or len(os.sched_getaffinity(0))
    if args.wait_quiet is not None:
        wait_for_quiet(args.wait_quiet, args.max_wait)
    now = datetime.now(UTC)
    record: dict = {
        "date": now.strftime("%Y-%m-%d"),
        "time_utc": now.strftime("%H:%M"),
        "cpu": cpu_name(),
        "cores": len(os.sched_getaffinity(0)),
        "versions": versions(),
        "commit": commit(),
        "tokenizer": args.tokenizer,
        "rounds": args.rounds,
        "copies": args.copies,
        "load_start": os.getloadavg(),
        "niceness": os.nice(0),
        "runs": [],
        "summary": [],
    }
    with tempfile.TemporaryDirectory(prefix="attnlab-prepare-bench-") as tmp:
        for name in corpora:
            corpus = name
            if args.copies > 1:
                corpus = str(local_copies(name, args.copies, Path(tmp)))
                name = f"{name} x{args.copies} (local JSONL)"
            rows = []
            for r in range(args.rounds):
                for w in (1, workers) if r % 2 == 0 else (workers, 1):
                    row = measure(corpus, args.tokenizer, w, Path(tmp))
                    row["corpus"] = name
                    rows.append(row)
                    print(
                        f"{name:12s} workers={w}: {row['wall']:6.2f} s  "
                        f"{row['mb_per_s']:6.2f} MB/s  cpu {row['cpu']:6.2f} s  "
                        f"load {row['load_before'][0]:.2f}",
                        flush=True,
                    )
            summary = summarise(name, rows)
            record["runs"] += rows
            record["summary"].append(summary)
            print(
                f"{name}: 1 core {summary['mb_per_s']['1']} MB/s, {workers} workers "
                f"{summary['mb_per_s'][str(workers)]} MB/s, speedup {summary['speedup']:.2f}x "
                f"(target {TARGET}x), identical output: {summary['identical_output']}"
            )
    record["load_end"] = os.getloadavg()
    if not args.no_save:
        print(f"wrote {write_results(record, args.out)}.md/.json")
    ok = all(s["identical_output"] for s in record["summary"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
