"""``device = "auto"`` and the precision mean the same for train, probe, eval and bench."""

from __future__ import annotations

import pytest
import torch

from attnlab.base import devices
from attnlab.base.errors import UserError
from attnlab.runs import device as dev


@pytest.mark.fast
def test_auto_prefers_cuda_then_mps_for_one_process_then_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert dev.resolve_device("auto") == torch.device("cuda", 0)
    assert dev.resolve_device("auto", local_rank=3) == torch.device("cuda", 3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "mps_usable", lambda: True)
    assert dev.resolve_device("auto") == torch.device("mps")
    assert dev.resolve_device(None) == torch.device("mps")
    assert dev.resolve_device("auto", local_rank=0) == torch.device("cpu")  # torchrun: no MPS
    monkeypatch.setattr(devices, "mps_usable", lambda: False)
    assert dev.resolve_device("auto") == torch.device("cpu")


def test_explicit_devices_are_checked_and_named_in_the_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices, "mps_usable", lambda: False)
    assert dev.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(UserError, match=r"train.device 'cuda': no CUDA device is visible"):
        dev.resolve_device("cuda", setting="train.device")
    with pytest.raises(UserError, match=r"--device 'gpu0' is not a device name"):
        dev.resolve_device("gpu0", setting="--device")
    with pytest.raises(UserError, match="MPS is not usable"):
        dev.resolve_device("mps")
    with pytest.raises(UserError, match=r"runs on cpu, cuda\[:N\] or mps"):
        dev.resolve_device("meta")


def test_precision_auto_float32_bfloat16_and_float16_with_a_scaler(monkeypatch):
    cpu = torch.device("cpu")
    auto = dev.resolve_precision("auto", cpu)
    assert auto.dtype is None and auto.scaler is None and auto.name == "float32"
    bf16 = dev.resolve_precision("bfloat16", cpu)
    with bf16.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    assert bf16.compute_dtype == torch.bfloat16 and bf16.scaler is None
    with pytest.raises(UserError, match=r"train.dtype='float16' needs a CUDA device"):
        dev.resolve_precision("float16", cpu)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert dev.resolve_precision("auto", torch.device("cuda", 0)).dtype == torch.bfloat16
