"""Makes ``lm_eval --model attnlab`` work once attnlab is installed.

lm-evaluation-harness 0.4.x discovers no external models: its registry holds its own models
only. The ``attnlab-lm-eval.pth`` file installed beside this module imports it at interpreter
start; it only adds an import hook (standard library, microseconds) that waits for
``lm_eval.models`` to be imported and then registers the placeholder
``attnlab -> attnlab.eval.harness:AttnlabEvalLM``, which lm-eval loads lazily on first use.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys

TARGET = "lm_eval.models"
PLACEHOLDER = "attnlab.eval.harness:AttnlabEvalLM"


def _register() -> None:
    from lm_eval.api.registry import model_registry

    if "attnlab" not in model_registry:
        model_registry.register("attnlab", target=PLACEHOLDER)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        with contextlib.suppress(Exception):  # never break lm-eval itself
            _register()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
