"""Fixtures the quantization tests share."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchao")

from attnlab.config import load_config
from attnlab.model import build_model
from attnlab.quant import quantizable_config


@pytest.fixture(scope="module")
def tiny():
    """(config, model): the ``tiny`` preset built for quantization, random weights (seed 0)."""
    cfg = quantizable_config(load_config("tiny"))
    torch.manual_seed(0)
    return cfg, build_model(cfg.model).eval()
