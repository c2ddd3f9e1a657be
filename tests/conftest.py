"""Suite-wide hooks and the fixtures several test files share.

``gpu``-marked tests run wherever CUDA is present and are skipped, with the reason, where it is
not (``python -m pytest -m gpu`` selects only them). ``ATTNLAB_GPU_TESTS_ON_CPU=1`` runs them on
the CPU instead of skipping them: a smoke run of the test code itself
(``benchmarks/gpu_h100.sh --dry-run``), which says nothing about any GPU. Tests that need CUDA
itself (its kernels, its memory counters, NCCL) still skip, with their reason.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

SMOKE_ENV = "ATTNLAB_GPU_TESTS_ON_CPU"


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n auto``, the default in pyproject) each worker takes its share of
    the cores for torch's intra-op threads, so that N workers do not run N x cores threads."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available() or os.environ.get(SMOKE_ENV) == "1":
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: torch.cuda.is_available() is False")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


#: the items xdist schedules one group per part instead of one group per module: the battery's
#: ``test_part[SLOT.KIND-PROPERTY]`` (tests/testing/test_battery.py), grouped by SLOT.KIND
PER_PART = "testing/test_battery.py::test_part["


def xdist_scope(nodeid: str) -> str | None:
    """The scope of a battery item (its nodeid up to the part), or None for loadscope's own
    (the module, or the class)."""
    if PER_PART not in nodeid:
        return None
    return nodeid.rsplit("-", 1)[0]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadscope`` (pyproject's default) with the battery's parts as scopes of their
    own: its items spread over the workers part by part, and each part's properties run on one
    worker that checks the part once. Other ``--dist`` modes are xdist's own."""
    if config.getoption("dist", None) != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class PartScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid) or super()._split_scope(nodeid)

    return PartScopes(config, log)


@pytest.fixture(scope="module", autouse=True)
def part_registry_per_module():
    """Parts and families a test module registers in-process (plugins, bad parts for the check) leave with
    it: the part and family registries, the plugin loader's records and the plugins' modules are restored
    after each module (``tests.helpers.registry.restored``), so a later module in the same
    process (an xdist worker runs several) never sees them, e.g. as default ``bench`` variants,
    and can load the same plugin file again."""
    from tests.helpers.registry import restored

    with restored():
        yield


@pytest.fixture(scope="session")
def hostile_lab(tmp_path_factory):
    """A trained run, a NaN run, a diverged run, a linked run and damaged files
    (``tests/helpers/hostile_lab.py``); read-only for its users."""
    from tests.helpers.hostile_lab import build_lab

    return build_lab(tmp_path_factory.mktemp("hostile_lab"))


@pytest.fixture
def float64():
    """Exact arithmetic for a test: float64 default dtype, one thread, seed 0 (restored after).
    Model test modules take it for every test with
    ``pytestmark = pytest.mark.usefixtures("float64")``."""
    old, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(old)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """120 word-salad sentences prepared as bytes (``tests.helpers.data.sentence_data``), one copy per
    test module; the raw corpus is ``data_dir.parent / "corpus.jsonl"``."""
    from tests.helpers.data import sentence_data

    return sentence_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session", autouse=True)
def check_cache(tmp_path_factory):
    """The conformance check's result cache (``attnlab.testing.cache``) in a session folder, not
    the user's ~/.cache; command subprocesses inherit it. Each plugin source is checked once per
    test session."""
    path = tmp_path_factory.mktemp("check-cache")
    old = os.environ.get("ATTNLAB_CHECK_CACHE")
    os.environ["ATTNLAB_CHECK_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("ATTNLAB_CHECK_CACHE", None)
    else:
        os.environ["ATTNLAB_CHECK_CACHE"] = old


@pytest.fixture
def loaded_modules():
    """``loaded(code) -> set[str]``: the modules a fresh Python holds after running ``code``
    (what a lookup imports, without this process's imports in the way)."""

    def loaded(code: str) -> set[str]:
        script = f"{code}\nimport sys\nprint('--modules--', *sorted(sys.modules))"
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True
        )
        return set(out.stdout.rpartition("--modules--")[2].split())

    return loaded
