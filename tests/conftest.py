"""Fixtures shared by several test files."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def hostile_lab(tmp_path_factory):
    """A trained run, a NaN run, a diverged run, a linked run and damaged files
    (``tests/hostile_lab.py``); read-only for its users."""
    from hostile_lab import build_lab

    return build_lab(tmp_path_factory.mktemp("hostile_lab"))
