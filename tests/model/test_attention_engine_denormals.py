"""The engine flushes float32 denormals on every intra-op thread, not only the calling one
(``model/engine/denormals.py``): with 2 threads, exp over a large tensor of -100 (a denormal,
3.7e-44) must come out all zero. Run in a fresh process: the flag is per thread and lasts."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = """
import torch
torch.set_num_threads(2)
x = torch.full((4_000_000,), -100.0)
assert (torch.exp(x) > 0).all()  # denormal, not flushed yet
from attnlab.model.engine.denormals import flush_denormals
flush_denormals()
print(float((torch.exp(x) > 0).float().mean()))
"""


@pytest.mark.fast
def test_denormals_are_flushed_on_every_intra_op_thread():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    assert float(out.stdout.strip().splitlines()[-1]) == 0.0


RESET = """
import torch
torch.set_num_threads(2)
from attnlab.config import load_config
from attnlab.model import build_model
from attnlab.model.engine.denormals import flush_denormals
x = torch.full((4_000_000,), -100.0)
flush_denormals()
assert not (torch.exp(x) > 0).any()
build_model(load_config("tiny").model)  # the next run's model: torch's default mode again
print(float((torch.exp(x) > 0).float().mean()))
"""


def test_building_a_model_restores_denormals_on_every_thread():
    """compare trains its runs in one process: a baseline built after an ALiBi run computes with
    denormals, as in a fresh process."""
    out = subprocess.run([sys.executable, "-c", RESET], capture_output=True, text=True, check=True)
    assert float(out.stdout.strip().splitlines()[-1]) == 1.0
