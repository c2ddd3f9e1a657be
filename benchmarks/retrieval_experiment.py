"""configs/experiments/retrieval.toml end to end: `attnlab compare` (the retrieval decoder and its
parameter-matched decoder, 2 seeds), then every run's validation loss with and without retrieval
on the same windows (``attnlab.eval.retrieval``), the overlap of validation chunks with their
neighbours, loss by overlap, the machine, and a figure, written to docs/results/retrieval/.

    python benchmarks/retrieval_experiment.py [--out runs/retrieval] [--windows 150] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BUCKETS = [(0.0, 0.0), (0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0)]


def machine() -> dict:
    import torch

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "load_average": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


def mean_std(xs: list[float]) -> str:
    a = np.asarray(xs, dtype=float)
    return f"{a.mean():.4f} ± {a.std(ddof=1) if len(a) > 1 else 0.0:.4f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/retrieval")
    ap.add_argument("--config", default=str(ROOT / "configs/experiments/retrieval.toml"))
    ap.add_argument("--report", default=str(ROOT / "docs/results/retrieval"))
    ap.add_argument("--windows", type=int, default=150, help="validation windows per run")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    out, report = Path(args.out), Path(args.report)
    t0 = time.time()
    cmd = ["attnlab", "compare", args.config, "--out", str(out), "--jobs", str(args.jobs)]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    compare_s = time.time() - t0

    import torch

    from attnlab.eval.retrieval import retrieval_losses
    from attnlab.experiments.reports.retrieval_controls import control_tests

    torch.set_num_threads(1)  # tiny forwards: one thread is fastest on a shared machine

    rows = []
    for run in sorted((out / "runs").glob("*/seed*")):
        t = time.time()
        res = retrieval_losses(run, max_windows=args.windows)
        res["variant"], res["seed"] = run.parent.name, int(run.name[4:])
        res["eval_s"] = time.time() - t
        rows.append(res)
        print(run, {k: v for k, v in res.items() if k != "chunks"}, flush=True)
    report.mkdir(parents=True, exist_ok=True)
    slim = [{k: v for k, v in r.items() if k not in ("chunks", "per_window")} for r in rows]
    mach = machine()
    (report / "results.json").write_text(
        json.dumps({"machine": mach, "compare_s": compare_s, "runs": slim}, indent=2) + "\n"
    )

    ret = [r for r in rows if "loss_with" in r]
    dec = [r for r in rows if "loss_with" not in r]
    lines = [
        "# Retrieval decoder vs parameter-matched decoder (configs/experiments/retrieval.toml)",
        "",
        f"Written by `python benchmarks/retrieval_experiment.py` ({time.strftime('%Y-%m-%d')}); "
        f"its compare step took {compare_s / 60:.1f} min (runs already trained are skipped; each "
        f"run's own wall time is in the compare report). Machine: {mach['cpu']}, {mach['cores']} cores "
        f"(shared; load average {mach['load_average']:.1f} at the end), Python {mach['python']}, "
        f"torch {mach['torch']}. The compare report (training curves, significance) is "
        f"[compare-report.md](compare-report.md).",
        "",
        f"Validation loss (nats/byte) on {rows[0]['windows'] if rows else 0} consecutive windows "
        "of 128 bytes from the start of the validation split (the same windows for every run; "
        f"{rows[0]['tokens'] if rows else 0:,} tokens).",
        "",
        "| variant | seed | loss, no neighbours | loss, real neighbours | loss, mismatched "
        "neighbours | gain (mismatched - real) | p (paired t over windows) | overlap |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        w = r.get("loss_with")
        t = control_tests(r).get("all") if w else None
        lines.append(
            f"| {r['variant']} | {r['seed']} | {r['loss_without']:.4f} | "
            + (
                f"{w:.4f} | {r['loss_mismatched']:.4f} | {t['gain']:+.4f} | "
                f"{t['p_ttest']:.3g} | {r['overlap']:.3f} |"
                if w
                else "– | – | – | – | – |"
            )
        )
    lines += ["", "Means over seeds (± sample std):", ""]
    if dec:
        lines.append(f"- decoder (matched): {mean_std([r['loss_without'] for r in dec])}")
    if ret:
        lines.append(f"- retrieval, with retrieval: {mean_std([r['loss_with'] for r in ret])}")
        lines.append(
            f"- retrieval, mismatched neighbours: {mean_std([r['loss_mismatched'] for r in ret])}"
        )
        lines.append(
            f"- retrieval, neighbours removed: {mean_std([r['loss_without'] for r in ret])}"
        )
        lines.append(
            f"- overlap of validation chunks with their neighbours: "
            f"{np.mean([r['overlap'] for r in ret]):.3f} (share of 8-byte n-grams)"
        )
        # loss by the overlap of what each chunk's tokens read
        lines += [
            "",
            "Loss by overlap (retrieval runs, both seeds pooled): chunks grouped by the share of "
            "their 8-byte n-grams found in the neighbours their tokens read (those of the "
            "previous chunk); first chunks of a window read none and are left out.",
            "",
            "| overlap | chunks | loss without | loss with | gain |",
            "|---|---|---|---|---|",
        ]
        ov = np.concatenate([np.asarray(r["chunks"]["read_overlap"]) for r in ret])
        lw = np.concatenate([np.asarray(r["chunks"]["with"]) for r in ret])
        lo = np.concatenate([np.asarray(r["chunks"]["without"]) for r in ret])
        ok = ~np.isnan(ov)
        stats = []
        for a, b in BUCKETS:
            sel = ok & ((ov == 0) if b == 0 else ((ov > a) & (ov <= b)))
            n = int(sel.sum())
            if n:
                stats.append((f"{a:.2f}–{b:.2f}" if b else "0", n, lo[sel].mean(), lw[sel].mean()))
                lines.append(
                    f"| {stats[-1][0]} | {n} | {lo[sel].mean():.4f} | {lw[sel].mean():.4f} | "
                    f"{lo[sel].mean() - lw[sel].mean():+.4f} |"
                )
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(1, 2, figsize=(10, 4))
            names = ["decoder\n(matched)", "retrieval\nwithout", "retrieval\nwith"]
            vals = [
                [r["loss_without"] for r in dec],
                [r["loss_without"] for r in ret],
                [r["loss_with"] for r in ret],
            ]
            ax[0].bar(names, [np.mean(v) if v else math.nan for v in vals], color="0.6")
            for i, v in enumerate(vals):
                ax[0].scatter([i] * len(v), v, color="k", zorder=3, s=12)
            ax[0].set_ylim(
                min(min(v) for v in vals if v) - 0.05, max(max(v) for v in vals if v) + 0.05
            )
            ax[0].set_ylabel("validation loss (nats/byte)")
            ax[0].set_title("per seed (dots) and mean (bars)")
            ax[1].bar([s[0] for s in stats], [s[2] - s[3] for s in stats], color="0.4")
            ax[1].set_xlabel("overlap of a chunk with the neighbours it reads")
            ax[1].set_ylabel("loss without - loss with")
            ax[1].set_title("gain by overlap (retrieval runs)")
            fig.tight_layout()
            fig.savefig(report / "retrieval.png", dpi=110)
            lines += ["", "![losses and gain by overlap](retrieval.png)"]
        except ImportError:
            pass
    compare_report = out / "report.md"
    if compare_report.exists():
        text = compare_report.read_text().replace("](plots/", "](plots/")
        (report / "compare-report.md").write_text(text)
        (report / "plots").mkdir(exist_ok=True)
        for png in (out / "plots").glob("*.png"):
            (report / "plots" / png.name).write_bytes(png.read_bytes())
    (report / "report.md").write_text("\n".join(lines) + "\n")
    print(report / "report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
