"""`lm_eval --model attnlab` finds attnlab's model: the import hook registers a lazy placeholder
as soon as lm-eval's model registry fills, and it resolves to the harness class."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_hook_registers_attnlab_when_lm_eval_loads_its_models() -> None:
    out = _run(
        """
        import attnlab_lm_eval_hook  # what attnlab-lm-eval.pth does at interpreter start
        from lm_eval.api.registry import get_model, model_registry
        cls = get_model("attnlab")  # empty registry -> lm_eval.models is imported -> hook fires
        print(cls.__module__, cls.__name__, "hf" in model_registry)
        """
    )
    assert out.split() == ["attnlab.eval.harness", "AttnlabEvalLM", "True"]


def test_hook_is_cheap_and_imports_nothing_heavy() -> None:
    out = _run(
        """
        import sys
        import attnlab_lm_eval_hook
        print(any(m.split(".")[0] in ("torch", "lm_eval", "attnlab") for m in sys.modules))
        """
    )
    assert out.strip() == "False"
