"""Before ``gpu_h100.sh`` measures anything: is everything it needs installed on this machine?

The GPU machine has no internet, so nothing can be fetched there. This checks, without importing
attnlab's heavy modules: the Python version, a CUDA build of torch with a visible GPU (unless
``--dry-run``), a C compiler and Python's headers (torch.compile builds with them), and every
distribution that attnlab and its ``test`` extra require (read from ``pyproject.toml``), plus the
optional ``kernels`` extra. When something is missing it prints
exactly what to install and how (a wheelhouse built on a machine with internet), and exits 3.

    python benchmarks/gpu_preflight.py [--dry-run]
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("test",)  # needed: the gpu test set and the bench's nanoGPT peer
OPTIONAL = ("kernels",)  # used when present: the loss-kernel A/B


def requirements(extra: str | None = None) -> list[str]:
    """Requirement strings of attnlab (or of one of its extras), as pyproject.toml lists them."""
    import tomllib  # 3.11+: imported after the version check

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    if extra is None:
        return list(project["dependencies"])
    out = []
    for req in project["optional-dependencies"].get(extra, []):
        m = re.fullmatch(r"attnlab\[(.+)\]", req)
        out += [r for e in m.group(1).split(",") for r in requirements(e)] if m else [req]
    return out


def missing(reqs: list[str]) -> list[str]:
    """The requirements whose distribution is not installed (versions are pip's business)."""
    out = []
    for req in reqs:
        name = re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0]
        try:
            md.version(name)
        except md.PackageNotFoundError:
            out.append(req)
    return out


def torch_state() -> tuple[str | None, str | None, str | None]:
    """(torch version, its CUDA version, the first GPU's name) or Nones for what is absent."""
    try:
        import torch
    except ImportError:
        return None, None, None
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return torch.__version__, torch.version.cuda, gpu


def compiler_problems() -> list[str]:
    """torch.compile's GPU backend (Triton) builds a small C extension at run time: it needs a C
    compiler and Python's headers on the machine itself."""
    import shutil
    import sysconfig

    out = []
    if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        out.append("no C compiler (cc/gcc): torch.compile's Triton backend needs one (apt: gcc)")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        out.append("no Python.h: Triton builds against Python's headers (apt: python3-dev)")
    return out


def install_help(need: list[str]) -> str:
    quoted = " ".join(f"'{r}'" for r in need)
    return f"""
What to install (this machine has no internet: bring a wheelhouse).

On a machine with internet, the same Python ({sys.version_info.major}.{sys.version_info.minor}) \
and the same platform, in a checkout of this repository:
  python -m pip download -d wheelhouse torch==2.13.0   # the CUDA build, from PyTorch's wheel index
  python -m pip download -d wheelhouse -c constraints.txt '.[test,kernels]'
Copy wheelhouse/ here, then:
  python -m pip install --no-index --find-links wheelhouse torch==2.13.0
  python -m pip install --no-index --find-links wheelhouse -c constraints.txt -e '.[test,kernels]'

Missing now: {quoted or "(nothing from pip)"}
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="CPU smoke run: no GPU needed")
    args = p.parse_args(argv)
    problems: list[str] = []
    if sys.version_info < (3, 11):  # noqa: UP036 (the machine's Python is what is checked)
        print(f"Python {sys.version.split()[0]}: attnlab needs 3.11 or newer", file=sys.stderr)
        print(install_help([]), file=sys.stderr)
        return 3
    version, cuda, gpu = torch_state()
    if version is None:
        problems.append("torch is not installed")
    elif not args.dry_run and cuda is None:
        problems.append(f"torch {version} is a CPU-only build: install the CUDA build of 2.13.0")
    elif not args.dry_run and gpu is None:
        problems.append(f"torch {version} (CUDA {cuda}) sees no GPU: check the driver/nvidia-smi")
    problems += compiler_problems()
    need = missing(requirements() + [r for e in EXTRAS for r in requirements(e)])
    problems += [f"not installed: {r}" for r in need]
    optional = missing([r for e in OPTIONAL for r in requirements(e)])
    print(f"python {sys.version.split()[0]}; torch {version} (CUDA {cuda}); GPU: {gpu}")
    for r in optional:
        print(f"optional, not installed: {r} (the loss-kernel A/B runs without it)")
    if problems:
        print("\n".join(f"MISSING: {m}" for m in problems), file=sys.stderr)
        print(install_help(need), file=sys.stderr)
        return 3
    print("preflight: everything needed is installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
