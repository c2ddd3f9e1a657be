"""Reading tracker output back: TensorBoard through its own ``EventAccumulator``, and a wandb
offline run through its transaction log.

wandb 0.31 writes an offline run as ``run-ID.wandb``: a LevelDB-format log (a 7-byte header
``:W&B`` + magic + version, then 32 KiB blocks of records, each with a 7-byte header of CRC,
length and type FULL/FIRST/MIDDLE/LAST) whose payloads are ``wandb_internal_pb2.Record``
messages. The SDK no longer ships a Python reader for it (``wandb.sdk.internal.datastore`` is
gone), so this small one follows the format.
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list[Any]:
    """Every Record of a ``.wandb`` file."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb transaction log"
    pos, pending, out = HEADER, b"", []
    while pos + HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < HEADER:  # a block's tail too short for a header is padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        pos += HEADER
        chunk = data[pos : pos + length]
        pos += length
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            out.append(pending + chunk)
        elif kind == 0:  # zero padding up to the block's end
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
    return [wandb_internal_pb2.Record.FromString(b) for b in out]


@dataclass
class WandbRun:
    """What one offline run folder holds."""

    run_id: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None


def _key(item: Any) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


def read_wandb_run(folder: Path, wait: float = 30.0) -> WandbRun:
    """Parse ``folder/run-*.wandb`` (one offline run directory). wandb's service process may
    still be writing it when ``run.finish()`` has returned: wait for its exit record."""
    deadline = time.monotonic() + wait
    while True:
        logs = list(folder.glob("run-*.wandb"))
        records = wandb_records(logs[0]) if len(logs) == 1 else []
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"{folder} has no complete wandb run log after {wait} s")
        time.sleep(0.2)
    run = WandbRun()
    for rec in records:
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            run.run_id, run.name, run.group, run.job_type = (
                r.run_id,
                r.display_name,
                r.run_group,
                r.job_type,
            )
            for item in r.config.update:
                run.config[_key(item)] = json.loads(item.value_json)
        elif kind == "config":
            for item in rec.config.update:
                run.config[_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            run.history.append({_key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            for item in rec.summary.update:
                run.summary[_key(item)] = json.loads(item.value_json)
        elif kind == "exit":
            run.exit_code = rec.exit.exit_code
    return run


def wandb_runs(run_dir: Path) -> list[WandbRun]:
    """Every offline run folder under ``run_dir/wandb`` (one per session), oldest first."""
    return [read_wandb_run(f) for f in sorted((run_dir / "wandb").glob("offline-run-*"))]


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from every event file in ``folder``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(folder.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0, "images": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


def tensorboard_tags(folder: Path) -> dict[str, list[str]]:
    """Tag lists by kind (scalars, images, tensors, ...) over every event file in ``folder``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[str]] = {}
    for events in sorted(folder.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"images": 0, "tensors": 0})
        acc.Reload()
        for kind, tags in acc.Tags().items():
            if isinstance(tags, list):
                out.setdefault(kind, []).extend(tags)
    return out


def tensorboard_text(folder: Path, tag: str) -> str:
    """The text logged under ``tag`` (``add_text`` stores it as a string tensor)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for events in sorted(folder.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"tensors": 0})
        acc.Reload()
        if f"{tag}/text_summary" in acc.Tags()["tensors"]:
            (event,) = acc.Tensors(f"{tag}/text_summary")
            return event.tensor_proto.string_val[0].decode()
    raise KeyError(tag)
