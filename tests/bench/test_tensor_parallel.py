"""``attnlab bench --tp 2`` under torchrun: each variant decoded whole and split over 2 gloo
processes, the same greedy tokens, and each rank holding part of the weights and half the KV
cache; refused outside torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from attnlab.bench.tensor_parallel import TPDecodeRow, table


@pytest.mark.distributed
def test_bench_tp2_decodes_the_same_tokens_with_half_the_cache_per_rank():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "attnlab", "bench", "tiny", "--variants", "baseline,virtual_heads", "--tp", "2"]
    cmd += ["--new-tokens", "4", "--decode-repeats", "1", "--threads", "1", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    rows = {r["name"]: r for r in got["rows"]}
    assert set(rows) == {"baseline", "virtual_heads"}
    for r in rows.values():
        assert r["greedy_identical"] and r["tp"] == 2
        assert all(w < 0.6 * r["whole_weight_bytes"] for w in r["weight_bytes"])
        assert len(set(r["cache_bytes"])) == 1 and r["split_tokens_per_s"] > 0
    assert "2 processes on cpu" in got["machine"]


@pytest.mark.fast
def test_bench_tp_in_one_process_exits_with_a_user_error(capsys):
    from attnlab.cli import main

    assert main(["bench", "tiny", "--tp", "2"]) == 2
    assert "start it under torchrun" in capsys.readouterr().err


@pytest.mark.fast
def test_the_table_gives_megabytes_per_rank():
    row = TPDecodeRow(
        "baseline", 2, 100.0, 50.0, True, [2_000_000, 2_100_000], 4_000_000, [1_000_000, 1_000_000]
    )
    line = table([row], "m")[-1]
    assert line == "| baseline | 2 | 100.0 | 50.0 | yes | 2.00 / 2.10 (4.00) | 1.00 / 1.00 | - |"
