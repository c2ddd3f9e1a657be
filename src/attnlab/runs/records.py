"""Typed models of the small JSON files of a run directory, and how a damaged one is reported.

``status.json`` (:class:`Status`), each line of ``metrics.jsonl`` (:class:`MetricsRow`) and each
checkpoint's ``state.json`` (:class:`CheckpointState`) are validated when read, so valid JSON of
the wrong shape (a line ``[1, 2, 3]``, ``{"step": "abc"}``, a status that is a string, appended
binary) is named with its file and line instead of surfacing later as a ``KeyError`` or
``TypeError``. Unknown extra keys are kept: writers may add fields without breaking readers.
Non-finite numbers are ``null`` on disk (see :mod:`attnlab.base.atomic`); older files that wrote
them as strings (``"nan"``) still validate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from attnlab.base.errors import UserError

M = TypeVar("M", bound=BaseModel)

#: "pruned": a sweep stopped the run early (compare --prune); training it again resumes it
RunState = Literal["running", "finished", "diverged", "failed", "pruned"]
Step = Annotated[int, Strict(), Field(ge=0)]  # JSON integers only: no "3", no true


class RunFileError(UserError):
    """A run-directory file exists but does not hold what attnlab wrote there."""


class RunFileWarning(UserWarning):
    """A damaged run-directory file was skipped or repaired (the message says which and how)."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")


class Status(_Record):
    """``status.json``: where the run stands. Written atomically at every checkpoint and at the
    end; ``step`` counts finished optimizer steps."""

    status: RunState
    step: Step = 0
    max_steps: int | None = Field(None, ge=0)
    reason: str | None = None
    last_loss: float | None = None
    final_val_loss: float | None = None
    best_val_loss: float | None = None
    tokens: int = Field(0, ge=0)
    elapsed: float = 0.0
    tokens_per_s: float | None = None
    schedule_hash: str | None = None
    resumed_from: int | None = None


class MetricsRow(_Record):
    """One line of ``metrics.jsonl``: a logged optimizer step (1-based ``step``)."""

    step: Step
    loss: float | None = None
    val_loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    tokens: int | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    elapsed: float | None = None
    diverged: str | None = None


class FileRecord(_Record):
    """Size and content hash of one checkpoint file."""

    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class ConfigRecord(_Record):
    """The config a checkpoint was trained with: the run's config file, verbatim."""

    file: str
    text: str


class RngRecord(_Record):
    """One process's RNG states (:mod:`attnlab.runs.rng`)."""

    torch: str
    python: list[Any]
    cuda: list[str] | None = None


class CheckpointState(_Record):
    """A checkpoint's ``state.json``. Format 2 records a sha256 per file, the training config and
    a hash of this record itself (``sha256``, over every other key); format 1 had sizes only."""

    format: int = 1
    step: Step
    files: dict[str, FileRecord | int] = Field(default_factory=dict)
    config: ConfigRecord | None = None
    rng: list[RngRecord] | RngRecord | None = None
    monitor: dict[str, Any] | None = None
    tokens: int = Field(0, ge=0)
    elapsed: float = 0.0
    train_time: float = 0.0
    best_val_loss: float | None = None
    last_val_loss: float | None = None
    last_loss: float | None = None
    schedule_hash: str | None = None
    sha256: str | None = None


def _problem(err: ValidationError) -> str:
    parts = []
    for e in err.errors()[:3]:
        where = ".".join(str(p) for p in e["loc"]) or "the value"
        parts.append(f"{where}: {e['msg']}")
    return "; ".join(parts)


def parse_record(model: type[M], raw: Any, where: str) -> M:
    """``raw`` (parsed JSON) as ``model``, or :class:`RunFileError` naming ``where`` and the field."""
    if not isinstance(raw, dict):
        raise RunFileError(f"{where} holds {type(raw).__name__} {_excerpt(raw)}, not an object")
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise RunFileError(f"{where} does not look like attnlab wrote it ({_problem(e)})") from None


def parse_json_text(model: type[M], text: str, where: str) -> M:
    """JSON text as ``model``; a syntax error is a :class:`RunFileError` too."""
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise RunFileError(f"{where} is not valid JSON ({e})") from None
    return parse_record(model, raw, where)


def read_json_file(model: type[M], path: Path) -> M:
    """The file at ``path`` as ``model`` (:class:`RunFileError` when unreadable or malformed)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RunFileError(f"{path} is not UTF-8 text (binary garbage?)") from None
    except OSError as e:
        raise RunFileError(f"cannot read {path} ({e.strerror or e})") from None
    return parse_json_text(model, text, str(path))


def _excerpt(raw: Any) -> str:
    text = json.dumps(raw) if not isinstance(raw, str) else repr(raw)
    return text if len(text) <= 40 else text[:37] + "..."
