"""Target checks and the pieces of measurement they rest on (no wall-clock assertions)."""

from __future__ import annotations

import pytest
import torch

from attnlab.bench.inference import InferenceRow
from attnlab.bench.machine import datasheet_peak, machine_info
from attnlab.bench.runner import BenchResult
from attnlab.bench.targets import TARGET_OVERRIDES, evaluate_targets, target_spec
from attnlab.bench.timing import Samples, interleaved, paired_ratio
from attnlab.bench.training import TrainingRow


def _train(name, ratio, flop_ratio=1.0):
    return TrainingRow(name, "variant", 1, 1, flop_ratio, 1.0, 1.0, 1.0, 1.0, ratio, ratio, 0.1,
                       None, "SDPA, O(T)", "", 1.0)  # fmt: skip


def _result(nano, nonlinear, preproj, preproj_flops, speedup, identical=True):
    r = BenchResult(machine=machine_info("cpu", torch.float32, False), spec={})
    r.training = [
        _train("baseline", 1.0),
        _train("nonlinear_query", nonlinear),
        _train("preproj_skip", preproj, preproj_flops),
        _train("nanogpt", nano),
    ]
    r.inference = [
        InferenceRow("baseline", 1, 1, 10, 1, speedup, 1, "float32", identical, 16, 256, 1)
    ]
    return r


@pytest.mark.fast
def test_targets_met_and_missed():
    met = evaluate_targets(_result(1.02, 1.04, 1.20, 1.18, 7.0))
    assert [t["met"] for t in met] == [True, True, True, True]
    missed = evaluate_targets(_result(0.97, 1.06, 1.25, 1.18, 4.0))
    assert [t["met"] for t in missed] == [False, False, False, False]
    assert not evaluate_targets(_result(1.0, 1.0, 1.0, 1.0, 9.0, identical=False))[3]["met"]


def test_target_config_is_the_one_the_issue_names():
    spec = target_spec().resolved()
    m = spec.config.model
    assert (m.d_model, m.n_layers, m.attention.n_heads, m.vocab_size) == (256, 6, 8, 4096)
    assert (spec.seq_len, spec.batch_size, spec.threads, spec.dtype) == (256, 8, 2, "float32")
    assert spec.new_tokens == 256 and "nanogpt" in spec.peers
    assert "data.seq_len=256" in TARGET_OVERRIDES


def test_datasheet_peak_by_device_name():
    sku, flops = datasheet_peak("NVIDIA H100 80GB HBM3", torch.bfloat16)
    assert "H100 SXM" in sku and flops == 989e12
    assert datasheet_peak("NVIDIA H100 PCIe", torch.bfloat16)[1] == 756e12
    assert datasheet_peak("NVIDIA A100-SXM4-80GB", torch.bfloat16)[1] == 312e12
    assert datasheet_peak("NVIDIA H100 80GB HBM3", torch.float32) is None
    assert datasheet_peak("AMD EPYC 7B13", torch.bfloat16) is None


def test_rounds_interleave_subjects_and_ratios_are_paired():
    order = []
    fns = {n: (lambda n=n: order.append(n) or 1.0) for n in "ABC"}
    interleaved(fns, rounds=2, warmup=1)
    assert "".join(order) == "ABCABCABC"
    a, ref = Samples([2.0, 3.0, 30.0]), Samples([1.0, 3.0, 10.0])
    assert paired_ratio(a, ref) == 2.0  # per-round ratios 2, 1, 3 -> median 2
