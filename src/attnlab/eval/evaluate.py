"""``evaluate(target, tasks)``: the Python API behind ``attnlab eval`` (and compare/probe reports)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from attnlab.base.errors import UserError
from attnlab.base.safepath import inside
from attnlab.eval.lengths import check_lengths, length_loss, token_stream
from attnlab.eval.lm import LanguageModel
from attnlab.eval.registry import (
    TaskRun,
    parse_task,
    perplexity_documents,
    run_task,
    split_tasks,
    task_key,
)
from attnlab.eval.results import claim_out, merge_out, merge_results, results_path
from attnlab.eval.targets import load_language_model


class TasksFailedError(UserError):
    """Some tasks failed (each with its ``UserError``), the others were scored: ``results`` holds
    them (already saved), ``failures`` maps each failed task's key to its message."""

    def __init__(self, results: dict[str, dict[str, Any]], failures: dict[str, str]) -> None:
        self.results = results
        self.failures = failures
        scored = ", ".join(results) or "none"
        super().__init__(
            f"{len(failures)} task(s) failed: "
            + "; ".join(failures.values())
            + f" (scored: {scored})"
        )


def evaluate(
    target: str | Path | LanguageModel,
    tasks: str | Sequence[str],
    limit: int | None = None,
    *,
    batch_size: int = 8,
    stride: int | None = None,
    device: str | torch.device | None = "auto",
    dtype: str | None = None,
    max_length: int | None = None,
    lengths: Sequence[int] | None = None,
    save: bool = True,
    out: str | Path | None = None,
    progress: bool = False,
) -> dict[str, dict[str, Any]]:
    """Evaluate ``target`` (a run/checkpoint/probe dir, ``hf:ID``, a ``.gguf`` file, or a loaded
    :class:`LanguageModel`) on ``tasks`` (names from :mod:`attnlab.eval.registry`).

    Returns ``{task_key: {"metrics": {...}, "source", "limit", "model", "timestamp", ...}}``.
    A task that fails on bad input (e.g. an item whose continuation does not fit the context)
    does not stop the others: they are scored and saved, then :class:`TasksFailedError` is raised with
    both. With ``lengths`` each perplexity task runs at every length instead
    (:mod:`attnlab.eval.lengths`: non-overlapping windows, ``limit`` windows at most), under the
    keys ``TASK@LENGTH`` with the loss by token position in ``loss_by_position``; lengths past a
    model's position limit are refused before anything runs.
    With ``save`` the entries are merged into ``<results_dir>/eval/results.json`` of the target
    (a run or probe directory; a Hugging Face id has none), and into ``out`` when given.
    """
    specs = split_tasks(list(tasks) if not isinstance(tasks, str) else tasks)
    keys = [task_key(s) for s in specs]  # validate every name before loading anything
    if out is not None:
        claim_out(out)  # a file of the user's is refused before the model loads
    lm = load_language_model(target, device=device, dtype=dtype, max_length=max_length)
    keys = [k + lm.tag for k in keys]
    if lengths:
        check_lengths(lm, lengths)
    if save and lm.results_dir is not None:  # a received run may hold links out of it
        inside(lm.results_dir, results_path(lm.results_dir))
    settings = {
        "lm": lm,
        "limit": limit,
        "batch_size": batch_size,
        "stride": stride,
        "progress": progress,
    }
    results: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    for spec, key in zip(specs, keys):
        if lengths and parse_task(spec)[0] == "perplexity":
            results |= _at_lengths(lm, spec, key.removesuffix(lm.tag), lengths, limit, batch_size)
            continue
        t0 = time.perf_counter()
        try:
            outcome = run_task(spec, settings)
        except UserError as e:
            if e.exit_code != UserError.exit_code:  # e.g. non-finite outputs (3): stop as before
                raise
            failures[key] = str(e)
            continue
        results[key] = {
            "metrics": outcome.metrics,
            "task": spec,
            "source": outcome.source,
            "limit": limit,
            "model": lm.name,
            "max_length": lm.max_length,
            "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
            "seconds": round(time.perf_counter() - t0, 3),
            **outcome.extra,
        }
    if save and lm.results_dir is not None and results:
        merge_results(inside(lm.results_dir, results_path(lm.results_dir)), results)
    if out is not None and results:
        merge_out(out, results)
    if failures:
        raise TasksFailedError(results, failures)
    return results


def _at_lengths(
    lm: LanguageModel,
    spec: str,
    key: str,
    lengths: Sequence[int],
    limit: int | None,
    batch_size: int,
) -> dict[str, dict[str, Any]]:
    """One perplexity task at every length: ``{KEY@LENGTH: entry}``."""
    docs, source, retokenized = perplexity_documents(TaskRun(lm, parse_task(spec)[1]))
    stream = token_stream(docs, lm.prefix_id)
    out = {}
    for n in lengths:
        t0 = time.perf_counter()
        result = length_loss(lm, stream, n, limit, batch_size)
        out[f"{key}@{n}{lm.tag}"] = {
            "metrics": result.metrics(),
            "task": spec,
            "source": source,
            "limit": limit,
            "model": lm.name,
            "max_length": n,
            "length": n,
            "trained_length": lm.trained_length,
            "retokenized": retokenized,
            "overrides": lm.tag.removeprefix("+").split("+") if lm.tag else [],
            "loss_by_position": result.loss_by_position,
            "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
            "seconds": round(time.perf_counter() - t0, 3),
        }
    return out
