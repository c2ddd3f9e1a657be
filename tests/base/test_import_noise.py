"""torchao's import-time log lines (its CUDA libraries on a CPU torch, pytree's enum notes) never
reach a command's stderr; its other log records still do (attnlab.base.import_noise)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytest.importorskip("torchao")
pytest.importorskip("transformers")

# transformers imports torchao with its model classes (transformers.quantizers), as export does
_IMPORT = "import transformers.modeling_utils"


def _stderr(code: str) -> str:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stderr


@pytest.mark.skipif(torch.version.cuda is not None, reason="the lines come from a CPU torch")
def test_transformers_importing_torchao_prints_nothing_after_drop_import_noise():
    quiet = _stderr(
        "from attnlab.base.import_noise import drop_import_noise\n"
        f"drop_import_noise()\n{_IMPORT}\n"
        "import logging\n"
        "logging.getLogger('torchao').warning('a real torchao warning')\n"
        "logging.getLogger('torchao').warning('Failed to load something else')\n"
    )
    assert quiet.splitlines() == ["a real torchao warning", "Failed to load something else"]


def test_a_command_that_imports_transformers_prints_one_error_line(tmp_path):
    # export imports transformers' model classes (and so torchao) before it checks its source
    run = tmp_path / "no-such-run"
    code = (
        "import sys\nfrom attnlab.cli import main\n"
        f"sys.exit(main(['export', {str(run)!r}, '--out', {str(tmp_path / 'hf')!r}]))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2
    assert p.stderr.splitlines() == [
        f"attnlab export: error: {str(run)!r} does not exist; give a run directory or a checkpoint"
    ]
