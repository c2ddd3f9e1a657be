"""``attnlab eval``: evaluate a model on perplexity, cloze and multiple-choice tasks, or build a
cloze set from held-out text."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnlab.base import exitcodes
from attnlab.base.devices import check_device
from attnlab.base.errors import UserError
from attnlab.base.outfile import claim_out_file
from attnlab.commands._common import add_set_argument, add_trust_argument

NAME = "eval"
HELP = "evaluate a run, checkpoint, probe or Hugging Face/GGUF model (perplexity, cloze, choice)"

EPILOG = """\
targets:
  RUN_DIR                         an attnlab run (its latest checkpoint)
  RUN_DIR/checkpoints/step_N      one checkpoint of a run
  PROBE_DIR                       a frozen Hugging Face base + its trained adapter
  hf:MODEL_ID_OR_DIR              a transformers causal LM (a hub id needs the internet)
  FILE.gguf                       a GGUF checkpoint (de-quantized by transformers)

tasks (comma-separated; --limit caps the items, or documents, of each):
  perplexity[:DATA_DIR]           validation split of a prepared corpus (default: the run's);
                                  other tokenizers re-tokenize the text, compare bits_per_byte;
                                  windows of the run's data.seq_len unless --max-length
  perplexity:FILE.jsonl|FILE.txt  documents of a local file ("text" per line / whole file)
  perplexity --lengths 64,256,1024  at each length (train short, test long): keys perplexity@L,
                                  each with loss_by_position; --limit = windows per length
  wikitext                        WikiText-2 test documents (hub, online only)
  cloze:FILE.jsonl                LAMBADA-format cloze: greedy exact match of the last word
  lambada                         LAMBADA OpenAI test set (hub, online only)
  mc:FILE.jsonl                   your own multiple choice (query, choices, gold), text as is
  hellaswag[:FILE.jsonl]          official HellaSwag format with its WikiHow cleaning (no file: hub)
  arc:FILE.jsonl                  ARC format; arc_easy / arc_challenge read the hub
  retrieval                       a retrieval run's loss with real, mismatched (another
                                  window's, --control-seed) and no neighbours, per token class;
                                  the gain is real-vs-mismatched with a paired test over windows

results are merged per task into RUN_DIR/eval/results.json (runs and probes) and --out FILE.

build a cloze set from held-out text (the validation split of a prepared corpus):
  attnlab eval --build-cloze DATA_DIR --out cloze.jsonl [--n 500] [--min-context-words 50]

lm-evaluation-harness with attnlab models (local task YAMLs in attnlab/eval/tasks):
  python -m attnlab.eval.lm_eval_cli --model attnlab --model_args path=RUN_DIR \\
      --tasks attnlab_cloze_local --include_path src/attnlab/eval/tasks --device cpu
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument(
        "target", nargs="?", metavar="TARGET", help="what to evaluate (see targets below)"
    )
    parser.add_argument(
        "--tasks",
        action="append",
        default=None,
        metavar="LIST",
        help="comma-separated tasks (repeatable); default: the run config's eval.tasks",
    )
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="items per task")
    parser.add_argument("--batch-size", type=int, default=None, metavar="B")
    parser.add_argument(
        "--stride",
        type=int,
        default=None,
        metavar="S",
        help="perplexity window stride in tokens (default max_length/2)",
    )
    parser.add_argument(
        "--max-length",
        type=int,
        default=None,
        metavar="L",
        help="feed at most L tokens (default: the model's context; perplexity of an attnlab "
        "run: its training length, data.seq_len)",
    )
    parser.add_argument(
        "--lengths",
        default=None,
        metavar="L1,L2,...",
        help="perplexity at each length (non-overlapping windows, --limit windows at most), "
        "past the training length where the run's position part allows it; the result holds "
        "the loss by token position (default: the run config's eval.lengths)",
    )
    add_set_argument(
        parser,
        "a model setting of an attnlab run that keeps its weights (result keys get "
        "+position.scaling=yarn...), e.g. RoPE scaling at evaluation time",
        "model.position.scaling=yarn --set model.position.factor=16",
    )
    parser.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:1, mps")
    parser.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="weights dtype for Hugging Face / GGUF models (default float32)",
    )
    parser.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="also merge the results into FILE: a new file, or one an earlier eval --out wrote "
        "and nobody edited since (never another file)",
    )
    add_trust_argument(parser)
    parser.add_argument(
        "--no-save", action="store_true", help="do not write RUN_DIR/eval/results.json"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--control-seed",
        type=int,
        default=0,
        metavar="S",
        help="--tasks retrieval: seed of the draw of the mismatched neighbours (default 0)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    cloze = parser.add_argument_group("cloze-set builder (instead of evaluating)")
    cloze.add_argument(
        "--build-cloze",
        metavar="DATA_DIR",
        default=None,
        help="write a LAMBADA-format cloze set from the validation split of DATA_DIR to --out",
    )
    cloze.add_argument("--n", type=int, default=500, help="items to draw (default 500)")
    cloze.add_argument("--min-context-words", type=int, default=50, help="default 50")
    cloze.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")


def _run_defaults(target: str) -> dict:
    """``eval`` settings of a run's own config, and the config itself under ``"config"``
    (empty for other targets)."""
    from attnlab.runs.load import is_run_dir, run_config

    path = Path(target.removeprefix("run:"))
    if path.parent.name == "checkpoints":
        path = path.parent.parent
    if not path.is_dir() or not is_run_dir(path):
        return {}
    cfg = run_config(path)
    if cfg is None:
        return {}
    ev = cfg.eval
    return {
        "tasks": ev.tasks,
        "limit": ev.limit,
        "stride": ev.stride,
        "batch_size": ev.batch_size,
        "lengths": ev.lengths,
        "config": cfg,
    }


def _check_flags(args: argparse.Namespace) -> None:
    """Counts must be positive: a zero or negative one is refused before anything loads."""
    for flag, value, hint in (
        ("--limit", args.limit, "leave it out to use every item"),
        ("--batch-size", args.batch_size, "e.g. 8"),
        ("--stride", args.stride, "leave it out for max_length/2"),
        ("--max-length", args.max_length, "leave it out for the default length"),
    ):
        if value is not None and value < 1:
            raise UserError(f"{flag} {value} must be at least 1 ({hint})")


def _preflight(cfg, args: argparse.Namespace, batch_size: int) -> None:
    """Weights plus one batch of logits of a run's model against the device's free memory."""
    from attnlab.runs.device import device_name
    from attnlab.runs.preflight import check, inference_estimate, run_weight_bytes

    m = cfg.model
    run_dir = Path(args.target.removeprefix("run:"))
    if run_dir.parent.name == "checkpoints":
        run_dir = run_dir.parent.parent
    weights = run_weight_bytes(run_dir)
    if weights is None:
        return  # nothing to load: the loader says why
    est = inference_estimate(
        m,
        batch_size=batch_size,
        seq_len=max(min(args.max_length or m.max_seq_len, m.max_seq_len), *(args.lengths or [0])),
        device=device_name(args.device, setting="--device"),
        weights_bytes=weights,
    )
    check(est, command="attnlab eval")


def _build_cloze(args: argparse.Namespace) -> int:
    from attnlab.eval.cloze_build import build_cloze_set

    if args.n < 1:
        raise UserError(f"--n {args.n} must be at least 1 (the number of cloze items)")
    if args.min_context_words < 0:
        raise UserError(f"--min-context-words {args.min_context_words} must be >= 0")
    if args.seed < 0:
        raise UserError(f"--seed {args.seed} must be >= 0")
    if args.target:
        raise UserError("--build-cloze takes no TARGET; run the evaluation as a second command")
    if not args.out:
        raise UserError("--build-cloze needs --out FILE.jsonl")
    claim_out_file(args.out, stamped=False, what="cloze set", force_flag=None)  # a new file
    rows = build_cloze_set(args.build_cloze, args.n, args.min_context_words, args.seed, args.out)
    short = f" (only {len(rows)} passages passed the filters)" if len(rows) < args.n else ""
    print(f"wrote {len(rows)} cloze items to {args.out}{short}")
    print(f"evaluate with: attnlab eval TARGET --tasks cloze:{args.out}")
    return exitcodes.OK


def _retrieval(args: argparse.Namespace) -> int:
    """``--tasks retrieval``: a run's validation loss with its real neighbours, mismatched ones
    (another window's, ``--control-seed``) and none, per token class, and the retrieval gain as
    real-vs-mismatched with a paired test over windows (``attnlab.eval.retrieval``; a decoder
    run has the "none" row on the same windows)."""
    from pathlib import Path

    from attnlab.eval.results import merge_out, merge_results, results_path
    from attnlab.eval.retrieval import retrieval_losses, split_metrics
    from attnlab.experiments.reports.retrieval_controls import control_lines, control_tests
    from attnlab.runs.load import is_run_dir

    if not is_run_dir(args.target):
        raise UserError(f"--tasks retrieval needs an attnlab run directory; {args.target} is not")
    if args.control_seed < 0:
        raise UserError(f"--control-seed {args.control_seed} must be >= 0 (a numpy seed)")
    res = retrieval_losses(
        args.target, max_windows=args.limit, device=args.device, control_seed=args.control_seed
    )
    metrics, controls = split_metrics(res)
    controls["tests"] = tests = control_tests(res)
    entry = {"retrieval": {"metrics": metrics, "controls": controls}}
    if not args.no_save:
        merge_results(results_path(Path(args.target)), entry)
    if args.out:
        merge_out(args.out, entry)
    if args.json:
        print(json.dumps({**metrics, "classes": res["classes"], "tests": tests}, indent=2))
        return exitcodes.OK
    mismatch = ""
    if "control_seed" in res:
        mismatch = f"; mismatched neighbours: another window's (seed {res['control_seed']})"
    print(
        f"attnlab eval: {args.target}: {res['windows']} validation windows, "
        f"{res['tokens']:,} tokens{mismatch}"
    )
    print("\n".join(control_lines(res, tests)))
    if "overlap" in res:
        print(f"  overlap with neighbours {res['overlap']:.3f}  (share of 8-token n-grams)")
    return exitcodes.OK


def run(args: argparse.Namespace) -> int:
    from attnlab.base.consent import trusting_remote_code

    with trusting_remote_code(args.trust_remote_code):  # the run's own config is read first
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.build_cloze:
        return _build_cloze(args)
    if not args.target:
        raise UserError("give a TARGET to evaluate (or --build-cloze DATA_DIR); see --help")
    _check_flags(args)
    check_device(args.device)
    if args.out:
        from attnlab.eval.results import claim_out

        claim_out(args.out)  # a new file, or attnlab's own earlier results file, unedited
    from attnlab.eval.lengths import parse_lengths

    defaults = _run_defaults(args.target)
    args.lengths = parse_lengths(args.lengths) or defaults.get("lengths")
    tasks = args.tasks or defaults.get("tasks")
    if not tasks:
        raise UserError("give --tasks, e.g. --tasks perplexity:DATA_DIR,cloze:FILE.jsonl")
    if [t.strip() for t in ",".join(tasks).split(",")] == ["retrieval"]:
        return _retrieval(args)
    import torch

    import attnlab.probe
    import attnlab.quant.target  # noqa: F401 (registers quantized directories as targets)
    from attnlab.base.finite import check_metrics, check_weights
    from attnlab.eval.evaluate import TasksFailedError, evaluate
    from attnlab.eval.registry import split_tasks, task_key
    from attnlab.eval.results import print_table, results_path
    from attnlab.eval.targets import load_language_model

    tasks = split_tasks(tasks)
    for spec in tasks:  # fail on a misspelt task before loading a model
        task_key(spec)
    batch_size = args.batch_size or defaults.get("batch_size") or 8
    limit = args.limit if args.limit is not None else defaults.get("limit")
    if defaults.get("config") is not None:  # a batch never holds more than --limit items
        _preflight(defaults["config"], args, min(batch_size, limit or batch_size))
    lm = load_language_model(
        args.target,
        device=args.device,
        dtype=args.dtype,
        max_length=args.max_length,
        trust_remote_code=args.trust_remote_code,
    )
    if args.overrides:
        if not hasattr(lm, "reconfigure"):
            raise UserError(f"--set changes an attnlab run's model; {lm.name} is not one")
        lm.reconfigure(args.overrides)
    if isinstance(getattr(lm, "model", None), torch.nn.Module):
        check_weights(lm.model, lm.name)
    failures: dict[str, str] = {}
    try:
        results = evaluate(
            lm,
            tasks,
            limit,
            batch_size=batch_size,
            stride=args.stride if args.stride is not None else defaults.get("stride"),
            lengths=args.lengths,
            save=not args.no_save,
            out=args.out,
            progress=not args.no_progress,
        )
    except TasksFailedError as e:
        results, failures = e.results, e.failures
    check_metrics(results, lm.name)
    if args.json:
        print(json.dumps({**results, **{k: {"error": v} for k, v in failures.items()}}, indent=2))
    elif results:
        print_table(results, title=f"attnlab eval: {lm.name}")
        saved = [str(args.out)] if args.out else []
        if not args.no_save and lm.results_dir is not None:
            saved.insert(0, str(results_path(lm.results_dir)))
        if saved:
            print(f"results merged into {', '.join(saved)}")
    if failures:
        for message in failures.values():
            print(f"attnlab eval: error: {message}", file=sys.stderr)
        return exitcodes.USER_ERROR
    return exitcodes.OK
