"""benchmarks/prepare_throughput.py end to end on wiki-sample: interleaved runs of 1 and 2
workers, the same content hash, and ``--copies`` measuring a local JSONL N times the corpus."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.paths import BENCHMARKS

SCRIPT = BENCHMARKS / "prepare_throughput.py"


@pytest.mark.parametrize("copies", [1, 2])
def test_the_script_measures_both_modes_with_identical_output(tmp_path, copies):
    stem = tmp_path / "result"
    args = ["--corpus", "wiki-sample", "--tokenizer", "bytes", "--rounds", "1", "--workers", "2"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--copies", str(copies), "--out", str(stem)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(stem.with_suffix(".json").read_text())
    (summary,) = record["summary"]
    assert summary["identical_output"] is True
    assert sorted(r["workers"] for r in record["runs"]) == [1, 2]
    # the copies are the corpus again: text bytes scale with them (wiki-sample is 2.81 MB)
    assert abs(summary["text_mb"] - 2.81 * copies) < 0.01 * copies
    assert summary["speedup"] > 0
    assert ("x2 (local JSONL)" in summary["corpus"]) == (copies == 2)
    assert "| identical output |" in stem.with_suffix(".md").read_text()
