"""``train.deterministic`` on this machine, as a user would run it: separate ``attnlab train``
processes on the same data and config (bf16 autocast and torch.compile on CUDA).

- ``a``, ``b``: deterministic; their metrics must be equal, bit for bit;
- ``c``: deterministic, SIGKILLed once half the steps are logged, then run again (it resumes from
  its last checkpoint); its metrics must equal ``a``'s;
- ``d``: the same run without deterministic mode: its first step that differs from ``a`` (the
  run-to-run noise it allows), and its median tokens/s against ``a``'s (the speed cost).

Writes ``OUT/determinism.json`` and prints a summary; exits 1 if a, b, c disagree.

    python benchmarks/gpu_determinism.py --out DIR [--preset gpt2-124m] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: metrics fields that measure time, not the run's numbers
TIMING = {"tokens_per_s", "mfu", "elapsed", "step_time", "train_time"}


def metrics(run: Path) -> list[dict]:
    rows = []
    path = run / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a torn last line after a kill
    return rows


def numbers(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in metrics(run)]


def first_difference(a: list[dict], b: list[dict]) -> int | None:
    """The first step whose numbers differ (None: equal)."""
    for ra, rb in zip(a, b):
        if ra != rb:
            return int(ra.get("step", -1))
    return None if len(a) == len(b) else min(len(a), len(b)) + 1


def median_tokens_per_s(run: Path, skip: int) -> float | None:
    xs = [
        r["tokens_per_s"] for r in metrics(run) if r.get("step", 0) > skip and "tokens_per_s" in r
    ]
    return statistics.median(xs) if xs else None


def make_corpus(path: Path, docs: int = 400, words: int = 300) -> Path:
    vocab = ["the", "a", "model", "attention", "head", "query", "key", "value", "layer", "token"]
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(docs):
            f.write(json.dumps({"text": " ".join(rng.choice(vocab) for _ in range(words))}) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--preset", default="gpt2-124m")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--dry-run", action="store_true", help="CPU smoke run: tiny, no compile")
    args = p.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    cuda = not args.dry_run
    steps = args.steps

    from attnlab.data import prepare

    corpus = make_corpus(out / "corpus.jsonl")
    data = out / "data"
    if not (data / "meta.json").exists():
        prepare(str(corpus), "bytes", data, val_fraction=0.05, progress=False)
    sets = [
        f"data.corpus={corpus}",
        "data.tokenizer=bytes",
        f"data.dir={data}",
        f"data.seq_len={args.seq_len}",
        f"train.batch_size={args.batch_size}",
        f"train.max_steps={steps}",
        "train.warmup_steps=5",
        "train.log_every=1",
        f"train.eval_every={max(steps // 2, 1)}",
        "train.eval_batches=2",
        "train.checkpoint_every=5",
        "train.threads=4",
        f"train.device={'cuda' if cuda else 'cpu'}",
        f"train.dtype={'bfloat16' if cuda else 'float32'}",
        f"train.compile={'true' if cuda else 'false'}",
    ]

    def cmd(run: str, deterministic: bool) -> list[str]:
        c = [sys.executable, "-m", "attnlab", "train", args.preset, "--out", str(out / run)]
        c += ["--quiet"] + (["--restart"] if run != "c" else [])  # c resumes when run again
        for s in [*sets, f"train.deterministic={'true' if deterministic else 'false'}"]:
            c += ["--set", s]
        return c

    env = {**os.environ, "OMP_NUM_THREADS": "4"}
    log: dict[str, float] = {}

    def run(name: str, deterministic: bool) -> None:
        t0 = time.perf_counter()
        done = subprocess.run(cmd(name, deterministic), env=env, capture_output=True, text=True)
        log[name] = log.get(name, 0.0) + time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"run {name} failed:\n{done.stdout}\n{done.stderr}")
        print(f"run {name}: {log[name]:.0f} s", flush=True)

    run("a", True)
    run("b", True)
    # c: killed once half the steps are logged, then resumed by the same command
    c_dir = out / "c"
    if c_dir.exists():
        subprocess.run(["rm", "-rf", str(c_dir)], check=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd("c", True), env=env, stdout=subprocess.DEVNULL)
    while proc.poll() is None:
        rows = metrics(c_dir)
        if rows and rows[-1].get("step", 0) >= steps // 2:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    log["c"] = time.perf_counter() - t0
    killed_at = metrics(c_dir)[-1]["step"] if metrics(c_dir) else 0
    run("c", True)
    run("d", False)

    a, b, c, d = (numbers(out / n) for n in "abcd")
    warm = min(5, steps - 1)
    tps_a, tps_d = median_tokens_per_s(out / "a", warm), median_tokens_per_s(out / "d", warm)
    result = {
        "preset": args.preset,
        "device": "cuda" if cuda else "cpu (dry run: not a GPU result)",
        "settings": sets,
        "steps": steps,
        "identical_runs_equal": a == b and len(a) == steps,
        "identical_runs_first_difference": first_difference(a, b),
        "killed_at_step": killed_at,
        "killed_was_cut_short": 0 < killed_at < steps,
        "killed_and_resumed_equal": c == a,
        "killed_first_difference": first_difference(c, a),
        "ordinary_run_first_difference": first_difference(d, a),
        "tokens_per_s_deterministic": tps_a,
        "tokens_per_s_ordinary": tps_d,
        "deterministic_slowdown": (tps_d / tps_a) if tps_a and tps_d else None,
        "wall_s": log,
    }
    (out / "determinism.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    ok = result["identical_runs_equal"] and result["killed_and_resumed_equal"]
    ok = ok and result["killed_was_cut_short"]
    print(json.dumps(result, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
