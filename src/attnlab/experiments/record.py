"""``OUT/experiment.json``: the resolved experiment, written before anything trains, so that
``attnlab report OUT`` (and every later reader) needs no experiment file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnlab.base.atomic import dumps_json
from attnlab.base.errors import UserError
from attnlab.experiments.resolve import Experiment

EXPERIMENT_FILE = "experiment.json"
EXPERIMENT_KIND = "experiment"  # the kind in an experiment directory's marker


def claim_experiment(out_dir: str | Path) -> None:
    """Mark ``out_dir`` as attnlab's experiment directory, or refuse one that holds files
    attnlab did not write (a user's ``report.md``), naming them; an unmarked directory an earlier
    attnlab wrote (it has ``experiment.json``) is accepted."""
    from attnlab.base.owned import claim

    claim(
        out_dir,
        EXPERIMENT_KIND,
        what="experiment directory",
        legacy=lambda d: (d / EXPERIMENT_FILE).is_file(),
    )


def write_record(exp: Experiment, out_dir: Path) -> None:
    """Store the resolved experiment in ``OUT/experiment.json`` (atomically)."""
    from attnlab.base.owned import write_owned
    from attnlab.parts.plugins import manifest

    out_dir.mkdir(parents=True, exist_ok=True)
    specs = sorted({p for v in exp.variants.values() for p in v.config.plugins})
    record = exp.to_record() | {"plugins": manifest(specs)}  # the parts' sources, hashed
    text = dumps_json(record, indent=2) + "\n"
    write_owned(out_dir, EXPERIMENT_FILE, text.encode("utf-8"))  # an edited one: kept aside


def read_out_json(out_dir: str | Path, name: str, command: str) -> Any:
    """``OUT_DIR/NAME`` parsed, or a UserError naming the fix: the ``--out`` directory of
    ``attnlab COMMAND`` when the file is missing, a rerun when it is not JSON."""
    path = Path(out_dir) / name
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(
            f"{out_dir} has no {name}; give the --out directory of `attnlab {command}`"
        ) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); rerun `attnlab {command}`") from None


def read_record(out_dir: str | Path) -> dict[str, Any]:
    path = Path(out_dir) / EXPERIMENT_FILE
    record = read_out_json(out_dir, EXPERIMENT_FILE, "compare")
    ok = (
        isinstance(record, dict)
        and isinstance(record.get("baseline"), str)
        and isinstance(record.get("variants"), list)
        and all(isinstance(v, dict) and "name" in v and "config" in v for v in record["variants"])
    )
    if not ok:
        raise UserError(
            f"{path} is valid JSON but not an experiment record (it needs 'baseline' and a "
            "'variants' list with each variant's 'name' and 'config'); rerun `attnlab compare` "
            "with the experiment file to rewrite it"
        )
    from attnlab.parts.plugins import remember

    plugins = record.get("plugins")
    remember(plugins if isinstance(plugins, list) else [])  # a moved plugin's recorded sha256
    return record
