"""``attnlab train --tp 2`` under torchrun on the CPU (gloo): the same losses, gradient norms and
validation losses as one process; checkpoints written split resume whole and the other way
round; a 2 x 2 mesh (FSDP2 over 2 copies x TP over 2 ranks, 4 processes) in the slow tier."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from attnlab.base.errors import UserError
from attnlab.config import load_config
from attnlab.runs.distributed import check_tp_world
from attnlab.runs.rundir import read_status
from attnlab.train import train
from tests.helpers.distributed import assert_same_steps, tiny_training, torchrun_train

STEPS = 5


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path]:
    """A prepared byte-level data dir and a config training 5 steps of 256 tokens (``tiny``:
    4 heads, tied embeddings), a checkpoint every 2 steps."""
    root = tmp_path_factory.mktemp("tp")
    return root, tiny_training(root, STEPS, threads=1)


def _torchrun(cfg: Path, out: Path, nproc: int, *extra: str) -> None:
    torchrun_train(cfg, out, nproc, "--skip-check", *extra)


def _single(setup) -> Path:
    root, cfg = setup
    out = root / "single"
    if not (out / "status.json").exists():
        assert train(load_config(str(cfg)), out).status == "finished"
    return out


def _compare(single: Path, other: Path, rel: float = 1e-5) -> None:
    assert_same_steps(single, other, STEPS, rel)


def _keys(run: Path, step: int) -> set[str]:
    with safe_open(run / "checkpoints" / f"step_{step:07d}" / "model.safetensors", "pt") as f:
        return set(f.keys())


@pytest.mark.distributed
def test_tp2_trains_to_the_losses_of_one_process(setup):
    root, cfg = setup
    out = root / "tp2"
    _torchrun(cfg, out, 2, "--tp", "2")
    single = _single(setup)
    _compare(single, out)
    st = read_status(out)
    assert st["parallel"] == "tp" and st["tensor_parallel"] == 2 and st["grad_accum"] == 2
    assert _keys(out, STEPS) == _keys(single, STEPS)  # today's format: whole, tied once


def _stop_under_tp(rank: int, port: int, cfg: str, out: str, stop: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train(load_config(cfg), out, tp=2, _stop_after=stop)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.distributed
def test_a_checkpoint_written_under_tp_resumes_in_one_process_and_back(setup):
    import torch.multiprocessing as mp

    root, cfg = setup
    single = _single(setup)
    # TP=2 for 2 steps (killed after its checkpoint), then one process to the end
    split_first = root / "tp_then_one"
    mp.start_processes(
        _stop_under_tp,
        args=(_free_port(), str(cfg), str(split_first), 2),
        nprocs=2,
        start_method="spawn",
    )
    assert read_status(split_first)["step"] == 2
    assert train(load_config(str(cfg)), split_first).status == "finished"
    _compare(single, split_first, rel=1e-4)
    # one process for 2 steps, then torchrun --tp 2 to the end
    whole_first = root / "one_then_tp"
    train(load_config(str(cfg)), whole_first, _stop_after=2)
    _torchrun(cfg, whole_first, 2, "--tp", "2")
    _compare(single, whole_first, rel=1e-4)
    assert read_status(whole_first)["parallel"] == "tp"


@pytest.mark.slow
@pytest.mark.distributed
def test_a_2x2_mesh_fsdp_by_tp_trains_to_the_losses_of_one_process(setup):
    root, cfg = setup
    out = root / "mesh2x2"
    shutil.rmtree(out, ignore_errors=True)
    _torchrun(cfg, out, 4, "--tp", "2")
    _compare(_single(setup), out, rel=1e-4)
    st = read_status(out)
    assert st["parallel"] == "fsdp+tp" and st["world_size"] == 4 and st["grad_accum"] == 1


@pytest.mark.fast
def test_tp_without_torchrun_or_not_dividing_the_processes_is_refused():
    with pytest.raises(UserError, match="one process; start it under torchrun"):
        check_tp_world(2, 1)
    with pytest.raises(UserError, match="--tp 2 does not divide the 3 processes"):
        check_tp_world(2, 3)
    check_tp_world(2, 4)


def test_train_tp_in_one_process_exits_with_a_user_error(setup, capsys):
    from attnlab.cli import main

    root, cfg = setup
    code = main(["train", str(cfg), "--out", str(root / "refused"), "--tp", "2"])
    assert code == 2
    assert "start it under torchrun" in capsys.readouterr().err
    assert not (root / "refused").exists()


def _generate(*args: str) -> list[str]:
    return ["-m", "attnlab", "generate", *args, "--max-new-tokens", "12", "--seed", "3"]


@pytest.mark.distributed
def test_generate_tp2_decodes_what_one_process_decodes(setup):
    single = _single(setup)
    args = _generate(str(single), "--prompt", "one two", "--temperature", "0.8")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    whole = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    split = subprocess.run([*cmd, *args, "--tp", "2"], env=env, capture_output=True, text=True)
    assert whole.returncode == split.returncode == 0, split.stderr[-3000:]
    assert split.stdout == whole.stdout  # rank 0 prints, the same sampled tokens
    assert whole.stdout.startswith("one two") and len(whole.stdout) > len("one two\n")


def test_generate_tp_in_one_process_exits_with_a_user_error(setup, capsys):
    from attnlab.cli import main

    code = main(["generate", str(_single(setup)), "--prompt", "one", "--tp", "2"])
    assert code == 2
    assert "start it under torchrun" in capsys.readouterr().err
