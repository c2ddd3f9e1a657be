"""Peak memory of ``attnlab eval --lengths``'s forward at long lengths, one fresh process per
(model, length): does any path build a [T, T] matrix?

    python benchmarks/eval_lengths_memory.py [--lengths 2048,8192,16384] [--arms alibi,sliding]

Each arm is a one-layer model (d = 32, 2 heads, byte vocabulary, 64 trained positions: the
extrapolation experiment's shape, smaller) scored by :func:`attnlab.eval.lengths.length_loss` on
one window of T random tokens, as ``attnlab eval --lengths T --limit 1`` scores it. Printed per
arm and T: the process's peak RSS (``ru_maxrss``, MiB; about 300 of it is torch and attnlab
imported) and the seconds of the forward. A dense float32 [H, T, T] bias is 2 GiB at H = 2,
T = 16,384; a bool [T, T] mask 256 MiB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

ARMS = {
    "alibi": ["model.position.kind=alibi"],
    "rope_yarn": [
        "model.position.kind=rope",
        "model.position.scaling=yarn",
        "model.position.factor=128",
    ],
    "sliding": ["model.position.kind=rope", "model.mask.kind=sliding", "model.mask.window=64"],
    "t5": ["model.position.kind=t5"],
}
BASE = [
    "model.d_model=32",
    "model.n_layers=1",
    "model.attention.n_heads=2",
    "model.vocab_size=288",
    "model.max_seq_len=64",
    "data.seq_len=64",
]

CHILD = """
import json, resource, sys, time, torch
from attnlab.config import load_config
from attnlab.data.byte_tokenizer import ByteTokenizer
from attnlab.eval.lengths import length_loss
from attnlab.eval.native import AttnlabLM
from attnlab.model import build_model
torch.set_num_threads(1)
sets, T = json.loads(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
model = build_model(load_config(None, sets).model).eval()
lm = AttnlabLM(model, ByteTokenizer(), 64, device="cpu")
stream = torch.randint(1, 250, (T + 1,), generator=torch.Generator().manual_seed(0))
t0 = time.perf_counter()
res = length_loss(lm, stream, T, batch_size=1)
dt = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"loss": res.loss, "seconds": dt, "peak_rss_mib": rss}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="2048,8192,16384")
    ap.add_argument("--arms", default=",".join(ARMS))
    args = ap.parse_args()
    print("| arm | T | peak RSS MiB | forward s | loss |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for arm in args.arms.split(","):
        for T in map(int, args.lengths.split(",")):
            cmd = [sys.executable, "-c", CHILD, json.dumps(BASE + ARMS[arm]), str(T)]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode:
                last = (out.stderr.strip().splitlines() or ["?"])[-1]
                print(f"| {arm} | {T:,} | failed: {last} | | |", flush=True)
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"| {arm} | {T:,} | {r['peak_rss_mib']:,.0f} | {r['seconds']:.2f} | "
                f"{r['loss']:.4f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
