"""The local lm-eval task YAMLs shipped in ``attnlab/eval/tasks`` and copies of them that point
at your own files.

The shipped YAMLs read the repository's fixture files through paths relative to the working
directory (lm-eval and ``datasets`` resolve ``data_files`` that way). ``write_task_yamls`` writes
copies with absolute paths, usable from anywhere with ``--include_path OUT_DIR``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from attnlab.base.errors import UserError
from attnlab.base.pathkind import not_a_file

TASKS_DIR = Path(__file__).parent / "tasks"
#: the module the YAMLs' ``!function`` names, copied beside every copy of them
TASK_FUNCTIONS = "attnlab_task_functions.py"

#: task name -> (shipped YAML file, the data_files split it reads)
LOCAL_TASKS = {
    "cloze": ("attnlab_cloze_local.yaml", "test"),
    "mc": ("attnlab_mc_local.yaml", "test"),
    "hellaswag": ("attnlab_hellaswag_local.yaml", "validation"),
    "arc": ("attnlab_arc_local.yaml", "test"),
    "text": ("attnlab_text_local.yaml", "test"),
}


def write_task_yamls(out_dir: str | Path, **files: str | Path) -> Path:
    """Write the local tasks named by ``files`` (``cloze=``, ``mc=``, ``hellaswag=``, ``arc=``,
    ``text=`` -> a JSONL path) into ``out_dir`` with absolute ``data_files``; returns
    ``out_dir`` for ``--include_path`` / ``TaskManager(include_path=...)``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for kind, path in files.items():
        if kind not in LOCAL_TASKS:
            raise UserError(f"unknown local task {kind!r}; choose from {', '.join(LOCAL_TASKS)}")
        data = Path(path).resolve()
        if not data.is_file():
            raise UserError(f"{kind} file {str(path)!r} {not_a_file(path)}")
        name, split = LOCAL_TASKS[kind]
        text = (TASKS_DIR / name).read_text(encoding="utf-8")
        line = json.dumps(str(data)).replace("\\", "\\\\")
        text, n = re.subn(rf"^([ \t]+{split}:).*$", rf"\1 {line}", text, count=1, flags=re.M)
        assert n == 1, f"{name} has no data_files.{split} line"
        (out / name).write_text(text, encoding="utf-8")
        if "!function" in text:  # lm-eval < 0.4.12 reads the module as a file beside the YAML
            shutil.copyfile(TASKS_DIR / TASK_FUNCTIONS, out / TASK_FUNCTIONS)
    return out
