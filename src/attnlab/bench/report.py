"""Tables of a benchmark result: printed with rich, written as Markdown and JSON.

Result files are named after the machine and date (``cpu-<cpu-model>-<date>``,
``cuda-<gpu>-<date>``) so results from different machines sit side by side in
``benchmarks/results/`` and are never compared by accident.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.bench.peers import PEERS
from attnlab.bench.runner import BenchResult


@dataclass
class TextTable:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _num(x: float | None, fmt: str = ",.0f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, fmt)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _x(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.3f}x"


def _params(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 100_000 else f"{n:,}"


def _failed_rows(r: BenchResult, section: str, have: list) -> dict[str, str]:
    """Subjects ``section`` has no row for because it (or their build) failed, if it ran."""
    if section not in r.spec.get("sections", (section,)):
        return {}
    done = {row.name for row in have}
    return {name: why for name, why in r.failed(section).items() if name not in done}


def training_table(r: BenchResult) -> TextTable | None:
    failed = _failed_rows(r, "training", r.training)
    if not r.training and not failed:
        return None
    m = r.machine
    sheet = m.peak_flops_datasheet is not None
    cols = [
        "subject",
        "params",
        "fwd MFLOP/tok",
        "FLOP ratio",
        "ms/step",
        "min-max",
        "tokens/s",
        "time vs baseline",
        "(best rounds)",
        "MFU (measured peak)",
        "first step s",
        "compile s",
    ]
    if sheet:
        cols.append("MFU (datasheet)")
    cols.append("attention")
    t = TextTable(
        f"Training: fwd+bwd+AdamW, B={r.spec['batch_size']}, T={r.spec['seq_len']}, "
        f"{r.spec['dtype']}{', compiled' if r.spec['compile'] else ''}",
        cols,
    )
    for row in r.training:
        cells = [
            row.name + (" (peer)" if row.kind == "peer" else ""),
            _params(row.params),
            _num(row.flops_per_token / 1e6, ",.2f"),
            _x(row.flop_ratio),
            _num(row.ms_per_step, ",.2f"),
            f"{row.ms_low:,.2f}-{row.ms_high:,.2f}",
            _num(row.tokens_per_s),
            _x(row.time_ratio),
            _x(row.time_ratio_best),
            _pct(row.mfu_measured),
            _num(row.first_step_s, ",.2f"),
            _num(row.compile_s, ",.2f"),
        ]
        if sheet:
            cells.append(_pct(row.mfu_datasheet))
        cells.append(row.attention)
        t.rows.append(cells)
    for name, why in failed.items():
        t.rows.append([name, f"FAILED: {why}", *[""] * (len(cols) - 2)])
    t.notes.append(
        f"ms/step: median over {r.spec['repeats']} interleaved rounds of {r.spec['steps']} steps "
        f"({r.spec['warmup']} warmup round(s) excluded); time vs baseline: median of per-round "
        "ratios (< 1 is faster); (best rounds): fastest round / baseline's fastest round. FLOPs: 2 x matmul weights + 4 T d_h per head per layer; training "
        "= 3 x forward. first step s: the untimed first step (optimizer state; compiling, with "
        "--compile or flex kernels), apart from ms/step; compile s: of it, torch.compile "
        "(dynamo, inductor) and the attention engine's kernels (runs/compile_stats.py). "
        "attention: the path the layers took on the first step; not recorded: compiled (the "
        "core records nothing inside a graph) or a part's own attention call."
    )
    t.notes.append(
        f"MFU peak: {m.peak_flops_measured / 1e9:,.1f} GFLOP/s measured in this run (best square "
        f"matmul, {m.dtype}, {m.threads} threads; the higher of "
        f"{', '.join(f'{p / 1e9:,.1f}' for p in m.peak_flops_samples)} before and after training)"
        + (f"; datasheet: {m.datasheet_sku}" if sheet else "")
    )
    return t


def inference_table(r: BenchResult) -> TextTable | None:
    failed = _failed_rows(r, "inference", r.inference)
    failed = {n: why for n, why in failed.items() if n not in PEERS}  # peers are not decoded
    if not r.inference and not failed:
        return None
    sp = r.spec
    t = TextTable(
        f"Inference: prefill B={sp['batch_size']} x T={sp['seq_len']}; greedy decode of "
        f"{sp['new_tokens']} tokens after a {sp['prompt_len']}-token prompt, batch "
        f"{sp['decode_batch']}",
        [
            "variant",
            "prefill tok/s",
            "prefill vs baseline",
            "decode tok/s (KV cache)",
            "decode tok/s (recompute)",
            "cache speedup",
            "cache bytes/token",
            "greedy identical",
            *(["retrieval ms/chunk (BM25)"] if r.retrieval else []),
        ],
    )
    ret = [f"{r.retrieval.lookup_ms_per_chunk:.2f}"] if r.retrieval else []
    no_cache = False
    for row in r.inference:
        cached = row.decode_cached_tokens_per_s is not None
        no_cache |= not cached
        t.rows.append(
            [
                row.name,
                _num(row.prefill_tokens_per_s),
                _x(row.prefill_ratio),
                _num(row.decode_cached_tokens_per_s, ",.1f") if cached else "no KV cache",
                _num(row.decode_uncached_tokens_per_s, ",.1f"),
                _x(row.cache_speedup),
                f"{row.cache_bytes_per_token:,} ({row.cache_dtype})" if cached else "-",
                "-" if row.greedy_identical is None else "yes" if row.greedy_identical else "NO",
                *ret,
            ]
        )
    for name, why in failed.items():
        t.rows.append([name, f"FAILED: {why}", *[""] * (len(t.columns) - 2)])
    t.notes.append(
        f"medians over {r.spec['decode_repeats']} interleaved rounds; prefill vs baseline > 1 is "
        "faster; cache speedup = recompute time / cached time for the same tokens."
    )
    if no_cache:
        t.notes.append(
            "no KV cache: a part of that variant declares supports_kv_cache = False, so it "
            "decodes by recomputing the prefix."
        )
    if r.retrieval:
        q = r.retrieval
        t.notes.append(
            f"retrieval: the model's times above read synthetic neighbours (model time only); "
            f"one BM25 lookup of a {q.chunk_size}-token chunk for {q.neighbours} neighbours "
            f"takes {q.lookup_ms_per_chunk:.2f} ms (median of {q.lookups}) against "
            f"{q.database_chunks:,} chunks of {q.source} (index built in "
            f"{q.index_build_s:.2f} s); a {sp['seq_len']}-token window needs "
            f"{sp['seq_len'] // q.chunk_size} lookups ({q.ms_per_window:.1f} ms), live decoding "
            f"one per {q.chunk_size} tokens."
        )
    return t


def memory_table(r: BenchResult) -> TextTable | None:
    failed = _failed_rows(r, "memory", [m for m in r.memory if not m.error])
    if not r.memory and not failed:
        return None
    cuda = any(m.cuda_max_allocated_mib is not None for m in r.memory)
    cols = ["subject", "peak RSS MiB", "RSS growth MiB"]
    if cuda:
        cols.append("CUDA max allocated MiB")
    cols.append("attention memory")
    t = TextTable(
        f"Peak memory of {r.spec['memory_steps']} training steps, one fresh process per subject",
        cols,
    )
    attn = {row.name: row.attention for row in r.training}
    for m in r.memory:
        if m.error:
            continue

        cells = [m.name, _num(m.peak_rss_mib, ",.1f"), _num(m.growth_mib, ",.1f")]
        if cuda:
            cells.append(_num(m.cuda_max_allocated_mib, ",.1f"))
        cells.append(attn.get(m.name, ""))
        t.rows.append(cells)
    for name, why in failed.items():
        t.rows.append([name, f"FAILED: {why}", *[""] * (len(cols) - 2)])
    t.notes.append(
        "peak RSS = the child process's high-water mark (VmHWM); growth = peak - RSS after imports (model, gradients, "
        "AdamW state, activations). O(T^2 H) rows hold the [B, H, T, T] probabilities per layer."
    )
    return t


def targets_table(r: BenchResult) -> TextTable | None:
    if not r.targets:
        return None
    t = TextTable("Targets", ["target", "measured", "required", "met"])
    for tg in r.targets:
        t.rows.append([tg["target"], tg["measured"], tg["required"], "yes" if tg["met"] else "NO"])
    return t


def tables(r: BenchResult) -> list[TextTable]:
    out = [targets_table(r), training_table(r), inference_table(r), memory_table(r)]
    return [t for t in out if t is not None]


def header_lines(r: BenchResult) -> list[str]:
    m = r.machine
    la0 = ", ".join(f"{x:.2f}" for x in m.load_average_start) if m.load_average_start else "-"
    la1 = ", ".join(f"{x:.2f}" for x in r.load_average_end) if r.load_average_end else "-"
    return [
        f"config: {r.spec['config_name']}  (model overrides vs defaults: {r.spec['model']})",
        f"device: {m.device} ({m.device_name}), host {m.hostname}, {m.threads} threads of "
        f"{m.cpu_count} CPUs, torch {m.torch_version}, python {m.python_version}",
        f"date: {m.date}, git {m.git_commit or '-'}, load average (1/5/15 min) at start {la0}, "
        f"at end {la1}, elapsed {r.elapsed_s:.0f} s",
    ]


def print_report(r: BenchResult, console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    if console is None:
        import sys

        # rich wraps at 80 columns when not writing to a terminal; tables need more
        console = Console(width=None if sys.stdout.isatty() else 200)
    con = console
    for line in header_lines(r):  # names and paths as text, never markup
        con.print(line, markup=False, highlight=False)
    for tt in tables(r):
        rt = Table(title=escape(tt.title), title_justify="left")
        for i, c in enumerate(tt.columns):
            rt.add_column(escape(c), justify="left" if i == 0 else "right")
        for row in tt.rows:
            rt.add_row(*(escape(str(cell)) for cell in row))
        con.print(rt)
        for n in tt.notes:
            con.print(f"  {n}", markup=False, highlight=False)
    for name, why in r.skipped.items():
        con.print(f"skipped {name}: {why}", markup=False, highlight=False)
    for n in r.notes:
        con.print(f"note: {n}", markup=False, highlight=False)


def failure_lines(r: BenchResult) -> list[str]:
    """One sentence per subject a section could not measure, naming both."""
    out = []
    for f in r.failures:
        what = "could not be built" if f["section"] == "build" else f"failed in {f['section']}"
        out.append(f"{f['name']} {what}: {f['reason']}")
    return out


def to_markdown(r: BenchResult, title: str = "attnlab bench") -> str:
    out = [f"# {title}", ""]
    out += [f"- {line}" for line in header_lines(r)]
    out.append("")
    for tt in tables(r):
        out += [f"## {tt.title}", ""]
        out.append("| " + " | ".join(tt.columns) + " |")
        out.append("|" + "|".join("---" for _ in tt.columns) + "|")
        out += ["| " + " | ".join(row) + " |" for row in tt.rows]
        out.append("")
        out += [f"{n}" for n in tt.notes]
        out.append("")
    if r.skipped:
        out += ["## Skipped", ""] + [f"- {k}: {v}" for k, v in r.skipped.items()] + [""]
    if r.failures:
        out += ["## Failed", ""] + [f"- {line}" for line in failure_lines(r)] + [""]
    if r.notes:
        out += ["## Notes", ""] + [f"- {n}" for n in r.notes] + [""]
    return "\n".join(out)


def result_files(stem: str | Path) -> tuple[Path, Path]:
    """``stem.md`` and ``stem.json`` (a ``.md``/``.json`` suffix on ``stem`` is dropped)."""
    stem = Path(stem)
    if stem.suffix in (".md", ".json"):
        stem = stem.with_suffix("")
    return stem.with_suffix(".md"), stem.with_suffix(".json")


def claim_results(stem: str | Path, *, force: bool = False, flag: str = "--out") -> None:
    """Check that :func:`write_results` may write both files of ``stem``: new files, or (with
    ``force``) attnlab's own earlier result, unedited (:func:`attnlab.base.outfile.claim_out_file`:
    never a user's file, a link, a device, a file inside a run)."""
    from attnlab.base.outfile import claim_out_file

    for path in result_files(stem):
        claim_out_file(path, force=force, flag=flag, what="benchmark result")


def write_results(
    r: BenchResult,
    stem: str | Path,
    title: str = "attnlab bench",
    *,
    force: bool = False,
    flag: str = "--out",
) -> list[Path]:
    """Write ``stem.md`` and ``stem.json``, each stamped as attnlab's, once both are claimed
    (:func:`claim_results`; nothing is written when either is refused)."""
    from attnlab.base.outfile import markdown_stamp, stamped_json, write_out_text

    md, js = result_files(stem)
    claim_results(stem, force=force, flag=flag)
    claim = {"force": force, "flag": flag, "what": "benchmark result"}
    write_out_text(md, to_markdown(r, title) + "\n" + markdown_stamp("attnlab bench"), **claim)
    write_out_text(js, stamped_json(r.to_dict(), default=str), **claim)
    return [md, js]


def results_dir() -> Path:
    """``benchmarks/results`` of this checkout ($ATTNLAB_RESULTS_DIR overrides; else in cwd)."""
    import os

    env = os.environ.get("ATTNLAB_RESULTS_DIR")
    if env:
        return Path(env)
    for p in Path(__file__).resolve().parents:
        if (p / "benchmarks" / "results").is_dir():
            return p / "benchmarks" / "results"
    return Path.cwd() / "benchmarks" / "results"
