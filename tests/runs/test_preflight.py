"""The preflight memory estimate: its arithmetic, its depth extrapolation, and refusals that come
before anything is allocated, with the numbers and the knob to turn."""

from __future__ import annotations

import pytest

from attnlab.cli import main
from attnlab.config import load_config
from attnlab.model.params import count
from attnlab.runs import preflight
from attnlab.runs.preflight import PreflightError, check, fmt_bytes, param_count, training_estimate


@pytest.mark.parametrize(
    "preset, extra",
    [
        ("tiny", []),
        ("tiny-moe-values", []),
        ("tiny-identity-head", []),
        ("tiny", ["model.feature_map.kind=pre_projection", "model.side_branch.kind=content_skip"]),
        (
            "tiny",
            [
                "model.family='encoder_decoder'",
                "model.n_decoder_layers=67",
                "model.mask.kind='full'",
            ],
        ),
    ],
)
def test_deep_stacks_are_counted_exactly_by_extrapolation(preset, extra):
    layers = preflight.DIRECT_COUNT_LAYERS + 2
    cfg = load_config(preset, [f"model.n_layers={layers}", *extra]).model
    assert param_count(cfg) == count(cfg)


def test_a_huge_depth_is_counted_without_building_it():
    cfg = load_config("tiny", ["model.n_layers=100000000"]).model
    one, two = (count(load_config("tiny", [f"model.n_layers={n}"]).model) for n in (1, 2))
    rep = param_count(cfg)
    assert rep.total == one.total + (10**8 - 1) * (two.total - one.total)
    assert rep.by_part["ffn"] == 10**8 * (two.by_part["ffn"] - one.by_part["ffn"])


def test_widths_no_tensor_can_hold_are_refused():
    cfg = load_config("tiny", ["model.d_model=1000000000000000000"]).model
    with pytest.raises(PreflightError, match=r"too large to exist.*model\.d_model"):
        param_count(cfg)


def test_training_estimate_by_hand():
    cfg = load_config("tiny")  # d 64, 2 layers, 4 heads x 16, FFN 256, batch 16 x 64, float32
    n = count(cfg.model).total
    est = training_estimate(cfg, device="cpu")
    assert est.items["parameters"][0] == 4 * n
    assert est.items["gradients"][0] == 4 * n
    assert est.items["AdamW moments"][0] == 8 * n
    # the outputs of the layer's matrices: its active parameters / d (q, k, v, o: 4 x 64, the
    # MLP's 2 x 256, and 2 of the norms' gains), plus the block's inputs and outputs 6 d
    widths = count(cfg.model).active_non_embedding // 2 // 64
    assert widths == 4 * 64 + 2 * 256 + 2
    per_token_layer = 6 * 64 + widths  # no T x T scores: the fused kernel
    assert est.items["activations"][0] == 16 * 64 * (2 * per_token_layer + 4 * 64) * 4
    assert est.items["token batch"][0] == 16 * 64 * 8 * 2
    scores = training_estimate(load_config("tiny-virtual-heads"), device="cpu")
    m = load_config("tiny-virtual-heads").model
    per_vh = 6 * 64 + count(m).active_non_embedding // 2 // 64 + 2 * 4 * 64  # + scores, probs
    # + what the part declares: the padded rows H (T + K - 1), twice, and H' T outputs
    K, H_out = m.score.kernel_size, m.score.n_virtual or 4
    per_vh += 2 * 4 * (64 + K - 1) + H_out * 64
    assert scores.items["activations"][0] == 16 * 64 * (2 * per_vh + 4 * 64) * 4


def test_check_refuses_with_numbers_and_the_dominant_knob():
    est = training_estimate(load_config("tiny", ["train.batch_size=100000"]), device="cpu")
    free = int(est.total // 3)
    with pytest.raises(PreflightError) as e:
        check(est, free=free, command="attnlab train")
    text = str(e.value)
    assert fmt_bytes(est.total) in text and fmt_bytes(free) in text
    assert "activations" in text and "To fit: lower train.batch_size" in text
    assert check(est, free=int(est.total) + 1) is est


def test_concurrent_runs_add_up(monkeypatch):
    cfg = load_config("tiny")
    one = training_estimate(cfg, device="cpu").total
    monkeypatch.setattr(preflight, "free_memory", lambda device: int(2 * one))
    preflight.check_concurrent([cfg], 2, "attnlab compare", device="cpu")
    with pytest.raises(PreflightError, match=r"(?s)x3 runs at once.*or lower --jobs"):
        preflight.check_concurrent([cfg], 3, "attnlab compare", device="cpu")


def test_fmt_bytes():
    assert fmt_bytes(999) == "999 B"
    assert fmt_bytes(1_290_000_000_000) == "1.29 TB"
    assert fmt_bytes(512e6) == "512 MB"


def test_free_memory_of_the_host_is_known():
    from pathlib import Path

    free = preflight.free_memory("cpu")
    total_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    assert free is not None and 0 < free <= total_kb * 1024


def test_train_refuses_before_building_anything(hostile_lab, tmp_path, monkeypatch, capsys):
    import attnlab.model

    def boom(*a, **k):
        raise AssertionError("the model was built before the preflight refused")

    monkeypatch.setattr(attnlab.model, "build_model", boom)
    out = tmp_path / "run"
    huge = ["--set", "model.vocab_size=1000000000"]
    code = main(["train", str(hostile_lab.cfg), "--out", str(out), "--quiet", *huge])
    assert code == 2
    err = capsys.readouterr().err
    est = training_estimate(
        load_config(hostile_lab.cfg, ["model.vocab_size=1000000000"]), device="cpu"
    )
    assert fmt_bytes(est.total) in err and "model.vocab_size=1000000000" in err
    assert not out.exists()


def test_a_config_that_fits_passes(hostile_lab):
    est = preflight.check_training(load_config(hostile_lab.cfg))
    assert 0 < est.total < 100e6


def test_eval_and_generate_refuse_a_batch_that_cannot_fit(hostile_lab, capsys):
    code = main(
        ["eval", str(hostile_lab.run), "--tasks", "perplexity", "--batch-size", "1000000000"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "logits" in err and "--batch-size" in err
