"""``attnlab ladder`` from start to end: load the experiment file's ``[ladder]``, plan every rung,
refuse a largest rung that will not fit, print the plan, its FLOPs and estimated time (and with
``plan`` only print), then tune the learning rate where the ladder says, train every rung as a
compare directory and write the ladder's report.

Everything is resumable as ``compare`` is: a rerun skips the runs that are over and resumes an
interrupted one from its last checkpoint (each rung and tuning sweep goes through
:func:`~attnlab.experiments.running.runner.run_all`, with its launchers: ``--jobs``, submitit).
The learning rates chosen are recomputed from the tuning runs on every rerun (the same runs, the
same choice) and stored in ``OUT/ladder.json``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError
from attnlab.base.safepath import check_out_dir
from attnlab.experiments.compare import make_launcher
from attnlab.experiments.ladder.cost import check_memory, ladder_cost, print_plan
from attnlab.experiments.ladder.plan import LadderPlan, plan_ladder
from attnlab.experiments.ladder.tuning import TunedRung, choose
from attnlab.experiments.load import load_spec
from attnlab.experiments.reports.build import build_report
from attnlab.experiments.reports.ladder_report import LADDER_FILE, build_ladder_report
from attnlab.experiments.resolve import Experiment
from attnlab.experiments.running.execute import RunOutcome
from attnlab.experiments.running.progress import ExperimentProgress
from attnlab.experiments.running.runner import run_all
from attnlab.runs import lock
from attnlab.testing.gate import model_parts, record, require_checked

Say = Callable[[str], None]
LADDER_KIND = "ladder"  # the kind in a ladder directory's marker


@dataclass
class LadderRequest:
    """What ``attnlab ladder`` was asked: the file, ``--set``, ``--plugin`` and how to run."""

    experiment: str | Path
    out: str | Path
    overrides: list[str] = field(default_factory=list)
    plugins: list[str] = field(default_factory=list)
    plan: bool = False
    jobs: int = 1
    launcher: str = "local"
    launcher_args: list[str] = field(default_factory=list)
    quiet: bool = False
    skip_check: bool = False


@dataclass
class LadderResult:
    """Each rung's outcomes (by its label; none for ``plan``), the wall time and the report."""

    outcomes: dict[str, list[RunOutcome]]
    wall: float = 0.0
    report: Path | None = None

    @property
    def failed(self) -> list[RunOutcome]:
        return [o for runs in self.outcomes.values() for o in runs if o.status == "failed"]


def load_ladder(req: LadderRequest) -> LadderPlan:
    """The experiment file (with ``--set`` and ``--plugin``) planned as a ladder."""
    spec, base_over = load_spec(req.experiment, req.overrides, req.plugins)
    if spec.ladder is None:
        raise UserError(
            f"{req.experiment} has no [ladder] table; add one (rungs = 5, tokens_per_param = "
            "20, ...; docs/commands.md, attnlab ladder) or run it with `attnlab compare`"
        )
    folder = Path(req.experiment).parent
    return plan_ladder(spec, folder=folder, base_overrides=base_over, source=str(req.experiment))


def ladder(req: LadderRequest, say: Say) -> LadderResult:
    """Plan ``req``'s ladder (printing it, its FLOPs and time through ``say``) and, unless
    ``req.plan``, run it and write its report."""
    check_out_dir(req.out)
    plan = load_ladder(req)
    check_memory(plan, req.jobs)
    print_plan(plan, say)
    out = Path(req.out)
    done = set(_read_tuned(out))
    say(ladder_cost(plan, out, req.jobs, req.launcher == "local", done).describe())
    if req.plan:
        return LadderResult({})
    configs = [v.config for r in plan.rungs for v in r.experiment.variants.values()]
    checked = require_checked(model_parts(c.model for c in configs), skip=req.skip_check)
    _claim(out)
    t0 = time.perf_counter()
    with lock.locked(out, "ladder directory"):
        record(out, checked)
        rec = plan.record()
        _write(out, rec)
        tuned = {i: _tune(plan, i, req, say) for i in plan.tuned_rungs()}
        rec["tuning"] = {str(i): t.to_dict() for i, t in tuned.items()}
        rec["lr"] = {}
        outcomes = {}
        for r in plan.rungs:
            i = r.shape.index
            src = plan.lr_source(i)
            lrs = (
                tuned[src].lrs if src is not None else {v: plan.ladder.lr[0] for v in plan.variants}
            )
            rec["lr"][plan.label(i)] = lrs
            _write(out, rec)
            rung = plan.with_lrs(i, lrs)
            say(f"rung {plan.label(i)}: lr {', '.join(f'{v} {x:g}' for v, x in lrs.items())}")
            outcomes[plan.label(i)] = _train(rung.experiment, plan.rung_dir(out, i), req, say)
        report = build_ladder_report(out)
    return LadderResult(outcomes, time.perf_counter() - t0, report)


def _tune(plan: LadderPlan, index: int, req: LadderRequest, say: Say) -> TunedRung:
    exp = plan.tuning(index)
    where = plan.tune_dir(Path(req.out), index)
    say(f"tuning train.lr at rung {plan.label(index)} into {where}")
    outcomes = _train(exp, where, req, say)
    tuned = choose(exp, outcomes, index, where)
    for name in tuned.at_edge:
        say(
            f"  note: {name}'s best lr {tuned.lrs[name]:g} is at the edge of ladder.lr; the "
            "optimum may lie beyond it"
        )
    return tuned


def _train(exp: Experiment, where: Path, req: LadderRequest, say: Say) -> list[RunOutcome]:
    """``exp``'s runs into the compare directory ``where`` (resumed), and its own report."""
    progress = None
    if not req.quiet:
        flops = {v.name: float(v.params.flops_per_token) for v in exp.variants.values()}
        progress = ExperimentProgress(
            len(exp.variants) * len(exp.seeds),
            flops,
            jobs=req.jobs,
            log_every=max(1, exp.steps // 5),
        )
    launcher = make_launcher(req.launcher, where, req.launcher_args, req.jobs, say)
    outcomes = run_all(exp, where, progress=progress, jobs=req.jobs, launcher=launcher)
    build_report(where)
    return outcomes


def _claim(out: Path) -> None:
    from attnlab.base.owned import claim

    claim(out, LADDER_KIND, what="ladder directory", legacy=lambda d: (d / LADDER_FILE).is_file())


def _write(out: Path, rec: dict[str, Any]) -> None:
    from attnlab.base.atomic import dumps_json
    from attnlab.base.owned import write_owned

    out.mkdir(parents=True, exist_ok=True)
    write_owned(out, LADDER_FILE, (dumps_json(rec, indent=2) + "\n").encode("utf-8"))


def _read_tuned(out: Path) -> dict[str, Any]:
    import json

    try:
        rec = json.loads((out / LADDER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    tuning = rec.get("tuning") if isinstance(rec, dict) else None
    return {int(k): v for k, v in tuning.items()} if isinstance(tuning, dict) else {}
