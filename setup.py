"""Only what pyproject.toml cannot say: install ``attnlab-lm-eval.pth`` at the top of
site-packages, so that ``lm_eval --model attnlab`` finds attnlab's model (see
src/attnlab_lm_eval_hook.py). Editable installs skip it; use ``attnlab-lm-eval`` there."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "attnlab-lm-eval.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        self.copy_file(os.path.join(here, "src", PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
