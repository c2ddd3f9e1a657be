"""Suite-wide hooks and the fixtures several test files share.

``gpu``-marked tests run wherever CUDA is present and are skipped, with the reason, where it is
not (``python -m pytest -m gpu`` selects only them). ``ATTNLAB_GPU_TESTS_ON_CPU=1`` runs them on
the CPU instead of skipping them: a smoke run of the test code itself
(``benchmarks/gpu_h100.sh --dry-run``), which says nothing about any GPU. Tests that need CUDA
itself (its kernels, its memory counters, NCCL) still skip, with their reason.
"""

from __future__ import annotations

import os

import pytest
import torch

SMOKE_ENV = "ATTNLAB_GPU_TESTS_ON_CPU"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available() or os.environ.get(SMOKE_ENV) == "1":
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: torch.cuda.is_available() is False")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def hostile_lab(tmp_path_factory):
    """A trained run, a NaN run, a diverged run, a linked run and damaged files
    (``tests/hostile_lab.py``); read-only for its users."""
    from hostile_lab import build_lab

    return build_lab(tmp_path_factory.mktemp("hostile_lab"))
