"""Evaluation tasks by name: ``NAME`` or ``NAME:ARGUMENT``.

=========================  ==============================================================
``perplexity[:DATA_DIR]``  validation split of a prepared corpus (default: the run's own)
``perplexity:FILE``        a ``.jsonl`` file (one document per ``text`` field) or a ``.txt``
                           file (one document)
``wikitext``               WikiText-2 raw test documents from the hub (online only)
``cloze:FILE.jsonl``       LAMBADA-format cloze (``text`` per line)
``lambada``                LAMBADA (OpenAI) test set from the hub (online only)
``mc:FILE.jsonl``          generic multiple choice (``query``, ``choices``, ``gold``; or
                           ``ctx``/``endings``/``label``, ``question``/``choices``/``answer``),
                           the text as it is: lm-eval's ``multiple_choice`` with its defaults;
                           ``mc:FILE?query=Q&choices=C&gold=G`` names other fields
``hellaswag[:FILE.jsonl]`` HellaSwag: a local file in the official format (lm-eval's
                           ``hellaswag`` preprocessing), else the hub validation split
``arc:FILE.jsonl``         ARC format; ``arc_easy`` / ``arc_challenge`` read the hub
``retrieval``              an attnlab run's validation loss with real, mismatched and no
                           neighbours per token class (:mod:`attnlab.eval.retrieval`)
=========================  ==============================================================

``limit`` caps the number of items (documents for perplexity) of every task. The perplexity
tasks score windows of ``lm.perplexity_length`` tokens: the chosen ``max_length``, else an
attnlab run's training length (``data.seq_len``), else the model's context; the result records
it as ``max_length``. A new task is a function ``fn(run: TaskRun) -> TaskOutcome`` added with
:func:`register_task`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError
from attnlab.eval.cloze import evaluate_cloze, load_cloze_file, load_lambada
from attnlab.eval.items import TextRow, read_items, validate_row
from attnlab.eval.lm import LanguageModel
from attnlab.eval.multiple_choice import (
    evaluate_multiple_choice,
    load_mc_file,
    load_mc_hub,
    split_fields,
)
from attnlab.eval.perplexity import Document, count_words, default_stride, perplexity
from attnlab.eval.sources import load_hub_rows


@dataclass(frozen=True)
class TaskRun:
    """How to run one task: model, its argument, and the shared settings."""

    lm: LanguageModel
    arg: str | None
    limit: int | None = None
    batch_size: int = 8
    stride: int | None = None
    progress: bool = False


@dataclass
class TaskOutcome:
    metrics: dict[str, Any]
    source: str
    extra: dict[str, Any] = field(default_factory=dict)


def perplexity_documents(run: TaskRun) -> tuple[list[Document], str, bool]:
    """The documents a ``perplexity[:ARG]`` task scores: (documents, source, re-tokenized)."""
    from attnlab.eval.corpus import corpus_documents

    arg = run.arg
    if arg is None:
        if run.lm.data_dir is None:
            raise UserError(
                f"{run.lm.name} has no training corpus to take the validation split from; "
                "give perplexity:DATA_DIR (a prepared corpus) or perplexity:FILE.jsonl"
            )
        arg = str(run.lm.data_dir)
    path = Path(arg)
    if path.is_file():
        docs, retokenized = _text_documents(run.lm, path, run.limit), True
    else:
        docs, retokenized = corpus_documents(run.lm, path, run.limit)
    return docs, str(path), retokenized


def _perplexity(run: TaskRun) -> TaskOutcome:
    docs, path, retokenized = perplexity_documents(run)
    length = run.lm.perplexity_length
    result = perplexity(run.lm, docs, run.stride, run.batch_size, run.progress, length)
    extra = {
        "max_length": length,
        "stride": run.stride or default_stride(length),
        "retokenized": retokenized,
    }
    return TaskOutcome(result.metrics(), str(path), extra)


def _text_documents(lm: LanguageModel, path: Path, limit: int | None) -> list[Document]:
    if path.suffix == ".jsonl":
        texts = read_items(path, lambda row: validate_row(TextRow, row).text)
    elif path.suffix in (".txt", ".md", ".text"):
        texts = [path.read_text(encoding="utf-8")]
    else:
        raise UserError(
            f"perplexity:{path} must be a prepared corpus directory, a .jsonl file with a "
            "'text' field per line, or a .txt file"
        )
    return [Document.from_text(lm, t) for t in texts[:limit] if t]


def _wikitext(run: TaskRun) -> TaskOutcome:
    from attnlab.base.extras import require

    require("eval", "lm_eval", what="the wikitext task (lm-eval's detokenizer)")
    from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer

    docs = []
    for row in load_hub_rows(
        "EleutherAI/wikitext_document_level",
        "wikitext-2-raw-v1",
        "test",
        task="wikitext",
        local_form="perplexity:FILE.jsonl or perplexity:DATA_DIR",
    ):
        page = row["page"]  # sizes of the raw page, tokens of the detokenized text (as lm-eval)
        tokens = run.lm.encode(wikitext_detokenizer({"page": page}))
        docs.append(Document(tokens, len(page.encode("utf-8")), count_words(page)))
        if run.limit is not None and len(docs) >= run.limit:
            break
    length = run.lm.perplexity_length
    result = perplexity(run.lm, docs, run.stride, run.batch_size, run.progress, length)
    extra = {"max_length": length, "stride": run.stride or default_stride(length)}
    source = "EleutherAI/wikitext_document_level:wikitext-2-raw-v1"
    return TaskOutcome(result.metrics(), source, extra)


def _cloze(run: TaskRun) -> TaskOutcome:
    if run.arg is None:
        raise UserError("task 'cloze' needs a file: cloze:FILE.jsonl (LAMBADA format)")
    items = load_cloze_file(run.arg, run.limit)
    return TaskOutcome(
        evaluate_cloze(run.lm, items, run.batch_size, run.progress).metrics(), run.arg
    )


def _lambada(run: TaskRun) -> TaskOutcome:
    if run.arg is not None:
        return _cloze(run)
    items = load_lambada(run.limit)
    res = evaluate_cloze(run.lm, items, run.batch_size, run.progress)
    return TaskOutcome(res.metrics(), "EleutherAI/lambada_openai")


def _mc(fmt: str, hub: str | None) -> Callable[[TaskRun], TaskOutcome]:
    def run_mc(run: TaskRun) -> TaskOutcome:
        if run.arg is not None:
            path, fields = split_fields(run.arg) if fmt == "mc" else (run.arg, None)
            items, source = load_mc_file(fmt, path, run.limit, fields), path
        elif hub is not None:
            items, source = load_mc_hub(hub, run.limit), hub
        else:
            raise UserError(f"task '{fmt}' needs a file: {fmt}:FILE.jsonl")
        res = evaluate_multiple_choice(run.lm, items, run.batch_size, run.progress)
        return TaskOutcome(res.metrics(), source)

    return run_mc


def _retrieval(run: TaskRun) -> TaskOutcome:
    from attnlab.eval.retrieval import retrieval_metrics

    if run.lm.results_dir is None:
        raise UserError(f"the retrieval task needs an attnlab run directory; {run.lm.name} is not")
    metrics, controls = retrieval_metrics(
        run.lm.results_dir, max_windows=run.limit, device=str(run.lm.device)
    )
    return TaskOutcome(metrics, str(run.lm.data_dir), {"controls": controls})


TaskFn = Callable[[TaskRun], TaskOutcome]

TASKS: dict[str, TaskFn] = {
    "perplexity": _perplexity,
    "wikitext": _wikitext,
    "cloze": _cloze,
    "lambada": _lambada,
    "mc": _mc("mc", None),
    "hellaswag": _mc("hellaswag", "hellaswag"),
    "arc": _mc("arc", None),
    "arc_easy": _mc("arc", "arc_easy"),
    "arc_challenge": _mc("arc", "arc_challenge"),
    "retrieval": _retrieval,
}


def register_task(name: str) -> Callable[[TaskFn], TaskFn]:
    """Decorator adding a task: ``fn(run: TaskRun) -> TaskOutcome`` under ``name``."""
    if not name.isidentifier():
        raise ValueError(f"task name {name!r} must be an identifier (no ':' or ',')")

    def add(fn: TaskFn) -> TaskFn:
        TASKS[name] = fn
        return fn

    return add


def parse_task(spec: str) -> tuple[str, str | None]:
    """``"cloze:x.jsonl"`` -> ``("cloze", "x.jsonl")``; unknown names suggest the nearest."""
    name, sep, arg = spec.strip().partition(":")
    if name not in TASKS:
        near = difflib.get_close_matches(name, TASKS, n=2, cutoff=0.5)
        hint = f" Did you mean {' or '.join(near)}?" if near else ""
        raise UserError(f"unknown task {name!r}.{hint} Tasks: {', '.join(TASKS)}")
    if sep and not arg:
        raise UserError(f"task {spec!r} has an empty argument after ':'")
    return name, (arg or None)


def task_key(spec: str) -> str:
    """The name results are stored under: ``NAME`` or ``NAME:STEM`` of its file/dir argument."""
    name, arg = parse_task(spec)
    if arg is not None and name == "mc":
        arg = split_fields(arg)[0]  # a field mapping is no part of the name
    return name if arg is None else f"{name}:{Path(arg.rstrip('/')).stem}"


def split_tasks(tasks: str | list[str]) -> list[str]:
    """Accept ``"a,b"`` or ``["a", "b,c"]``."""
    items = [tasks] if isinstance(tasks, str) else list(tasks)
    out = [t.strip() for item in items for t in item.split(",") if t.strip()]
    if not out:
        raise UserError("no task given; e.g. --tasks perplexity,cloze:FILE.jsonl")
    return out


def run_task(spec: str, run_args: dict[str, Any]) -> TaskOutcome:
    """Run one task; its ``UserError`` names the task (``task 'cloze:x.jsonl': ...``)."""
    name, arg = parse_task(spec)
    try:
        return TASKS[name](TaskRun(arg=arg, **run_args))
    except UserError as e:
        if str(e).startswith("task "):
            raise
        message = f"task {spec!r}: {e}"
        try:  # keep the kind (e.g. NonFiniteError, exit 3) where it takes a message
            named = type(e)(message)
        except TypeError:
            named = UserError(message)
            named.exit_code = e.exit_code
        raise named from None
