"""Part statistics over training (``Part.train_stats``): the run loop writes them every
``train.log_every`` steps to ``metrics.jsonl`` as ``part/KEY/LAYER`` and ``part/KEY`` columns and
to every tracker; read back here from the metrics rows and from TensorBoard's event files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab.config import load_config
from attnlab.parts.stats import train_stats
from attnlab.runs.rundir import read_metrics
from attnlab.train import train
from tests.helpers.data import run_config, sentence_data
from tests.helpers.trackers import tensorboard_scalars

IDENTITY_HEAD = [
    "model.readout.kind=identity_head",
    "model.residual=false",
    "model.mlp=false",
    "model.mixer.kind=nonlinear",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return sentence_data(tmp_path_factory.mktemp("partstats"))


def _train(tmp_path: Path, data: Path, *sets: str, loggers: str = '["jsonl"]') -> Path:
    path = run_config(
        tmp_path / "run.toml",
        data.parent / "corpus.jsonl",
        data,
        max_steps=6,
        batch_size=4,
        warmup_steps=1,
        eval_every=6,
        checkpoint_every=6,
        eval_batches=1,
        log_every=2,
        threads=1,
        lr=3e-2,
    )
    cfg = load_config(str(path), [*sets, f"train.loggers={loggers}"])
    run = tmp_path / "run"
    assert train(cfg, run).status == "finished"
    return run


def test_identity_weight_trajectory_reaches_metrics_and_tensorboard(tmp_path, data):
    run = _train(tmp_path, data, *IDENTITY_HEAD, loggers='["tensorboard"]')
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 4, 6]
    traj = [r["part/identity_weight"] for r in rows]
    # the identity head starts with all weight on the identity (w = e_(H+1) at init) and moves
    assert traj[0] == pytest.approx(1.0, abs=0.05)
    assert traj[-1] != pytest.approx(1.0, abs=1e-4)
    for r in rows:  # one column per layer (tiny: 2), their mean in part/identity_weight
        per_layer = [r["part/identity_weight/0"], r["part/identity_weight/1"]]
        assert r["part/identity_weight"] == pytest.approx(sum(per_layer) / 2)
    tb = tensorboard_scalars(run / "tensorboard")
    got = tb["part/identity_weight"]
    assert [s for s, _ in got] == [1, 2, 4, 6]
    assert [v for _, v in got] == pytest.approx(traj, rel=1e-6)
    assert "part/identity_weight/1" in tb


def test_a_baseline_run_has_no_part_columns(tmp_path, data):
    rows = read_metrics(_train(tmp_path, data))
    assert not [k for r in rows for k in r if k.startswith("part/")]


def test_content_skip_norms_and_moe_load_are_logged(tmp_path, data):
    from attnlab.model.transformer import build_model
    from tests.helpers.model import tiny

    cfg = tiny("model.side_branch.kind=content_skip", "model.feature_map.kind=pre_projection")
    model = build_model(cfg)
    stats = train_stats(model)
    norms = [stats[f"part/content_skip_norm/{i}"] for i in range(cfg.n_layers)]
    want = [float(b.side_branch.w_skip.weight.detach().norm()) for b in model.decoder.blocks]
    assert norms == pytest.approx(want, rel=1e-6)

    moe = build_model(tiny("model.value.kind=moe", "model.value.n_experts=4", "model.mlp=false"))
    moe.train()
    moe(torch.randint(0, 64, (2, 16)))
    stats = train_stats(moe)
    shares = [stats[f"part/moe_load/e{e}/0"] for e in range(4)]
    assert sum(shares) == pytest.approx(1.0, abs=1e-6)
    assert stats["part/moe_load_imbalance/0"] == pytest.approx(max(shares) / 0.25, rel=1e-5)
