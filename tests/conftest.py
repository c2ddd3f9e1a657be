"""Suite-wide hooks. ``gpu``-marked tests run wherever CUDA is present and are skipped, with the
reason, where it is not (``python -m pytest -m gpu`` selects only them)."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: torch.cuda.is_available() is False")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
