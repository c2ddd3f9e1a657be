"""The data files of attnlab's local lm-eval tasks, checked before lm-eval reads them.

lm-eval reads a task YAML's ``data_files`` with the ``datasets`` json loader, which stops with a
traceback on an empty file or a line that is not JSON, and its ``multiple_choice`` scoring counts
an item whose gold index is past its choices as wrong, without a word. ``attnlab-lm-eval`` runs
:func:`check_task_files` first: every task it is asked for that is one of attnlab's local tasks
(``attnlab_cloze_local``, ``attnlab_mc_local``, ... and copies written by
:func:`~attnlab.eval.lm_eval_tasks.write_task_yamls`) has its files validated item by item as
``attnlab eval`` validates its own (:mod:`attnlab.eval.items`), and a bad one is refused naming
the task, the file, the line and the field. Other tasks are left to lm-eval.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError
from attnlab.eval.items import ItemError, McRow, TextRow, choice_index, read_items, validate_row
from attnlab.eval.lm_eval_tasks import LOCAL_TASKS


def _mc_for_lm_eval(row: Mapping[str, Any]) -> None:
    """The YAML reads ``query``, ``choices`` and ``gold`` as they are: a list and an index."""
    item = validate_row(McRow, row)
    if not isinstance(item.choices, list) or not isinstance(item.gold, int):
        raise ItemError(
            "attnlab_mc_local reads 'choices' as a list of strings and 'gold' as an integer "
            "index; use attnlab eval --tasks mc:FILE for other shapes"
        )
    choice_index(item.gold, item.choices, "gold")


def _checks() -> dict[str, Callable[[Mapping[str, Any]], Any]]:
    from attnlab.eval.cloze import cloze_row
    from attnlab.eval.multiple_choice import arc_item, hellaswag_item

    return {
        "cloze": cloze_row,
        "mc": _mc_for_lm_eval,
        "hellaswag": hellaswag_item,
        "arc": arc_item,
        "text": lambda row: validate_row(TextRow, row),
    }


def requested(argv: Sequence[str]) -> tuple[list[str], str | None]:
    """The ``--tasks`` (space- or comma-separated) and ``--include_path`` of an lm-eval command
    line; everything else is lm-eval's."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--tasks", "-t", nargs="+", default=[])
    p.add_argument("--include_path", default=None)
    known, _ = p.parse_known_args(list(argv))
    tasks = [t.strip() for item in known.tasks for t in item.split(",") if t.strip()]
    return tasks, known.include_path


def _yaml(path: Path) -> Any:
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)  # a SafeLoader
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        return None  # not ours to judge: lm-eval reports its own YAML errors


def _data_files(config: Mapping[str, Any]) -> list[str]:
    files = (config.get("dataset_kwargs") or {}).get("data_files")
    values = files.values() if isinstance(files, Mapping) else [files]
    out: list[str] = []
    for v in values:
        out += [str(x) for x in v] if isinstance(v, list) else [str(v)] if v else []
    return out


def check_task_files(argv: Sequence[str]) -> None:
    """Validate the data files of every attnlab local task ``argv`` asks lm-eval for (the
    shipped YAMLs and those under ``--include_path``); :class:`UserError` names the first bad
    item."""
    tasks, include = requested(argv)
    kinds = {f"attnlab_{kind}_local": kind for kind in LOCAL_TASKS}
    wanted = {t for t in tasks if t in kinds}
    if not wanted:
        return
    checks = _checks()
    roots = [Path(include)] if include else []
    for root in roots:
        for yaml_path in sorted(root.rglob("*.yaml")) if root.is_dir() else []:
            config = _yaml(yaml_path)
            if not isinstance(config, Mapping) or config.get("task") not in wanted:
                continue
            name = str(config["task"])
            for file in _data_files(config):
                if not Path(file).is_file():
                    raise UserError(
                        f"task {name!r} ({yaml_path}) reads {file!r}, which is not a file (a "
                        "relative path is read from the working directory); write a copy of "
                        "the task that reads your file with "
                        "attnlab.eval.lm_eval_tasks.write_task_yamls"
                    )
                try:
                    read_items(file, checks[kinds[name]])
                except UserError as e:
                    raise UserError(f"task {name!r}: {e}") from None
