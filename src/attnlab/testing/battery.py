"""The battery: every property of one part, in every small-model config it is accepted in.

:func:`check_parts` checks several parts and loads all their exports in one child process;
:func:`check_part` is the one-part form for a plugin author's pytest.
"""

from __future__ import annotations

import functools
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from attnlab.base.errors import UserError
from attnlab.parts import registry
from attnlab.parts.exits import exit_message, is_exit
from attnlab.testing import (
    batching,
    causality,
    compiled,
    declarations,
    effect,
    exporting,
    fused,
    gradients,
    kv_cache,
    memory,
    quantize,
    state,
    width_transfer,
)
from attnlab.testing import tensor_parallel as tp_check
from attnlab.testing.cases import Case, accepted, build, config_for, float64
from attnlab.testing.result import PROPERTIES, PartReport, Result, failed, skipped


@dataclass(frozen=True)
class PartRequest:
    """A part to check: slot, kind and options (the defaults where not given)."""

    slot: str
    kind: str
    options: dict[str, Any] = field(default_factory=dict)


def _validated_spec(req: PartRequest):
    spec = registry.get(req.slot, req.kind)  # PartError (a UserError) for an unknown kind
    if spec.kind == "none":
        raise UserError(f"{req.slot}:none is the empty slot; there is no part to check")
    try:
        spec.options.model_validate({**req.options, "kind": req.kind})
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or 'options'}: {err['msg']}" for err in e.errors()
        )
        fields = ", ".join(n for n in spec.options.model_fields if n != "kind") or "none"
        raise UserError(
            f"{req.slot}:{req.kind}: bad option ({problems}); its options: {fields}"
        ) from None
    return spec


#: what a ``steps`` callback of :func:`check_parts` is given: (the part's name, its number and
#: the number of parts, the property, and its result, or None when it starts)
Step = Callable[[str, int, int, str, "Result | None"], None]


def _is_out_of_memory(e: BaseException) -> bool:
    text = str(e).lower()
    return isinstance(e, MemoryError) or (
        isinstance(e, RuntimeError)
        and (
            "can't allocate memory" in text
            or "out of memory" in text
            or "not enough memory" in text
        )
    )


def raised(part: str, e: BaseException, during: str) -> tuple[str, str]:
    """(what happened, the fix) for an exception or an exit ``part``'s code raised while
    ``during`` (a ``KeyboardInterrupt`` is never passed here)."""
    first = " ".join(str(e).split())[:300]
    if is_exit(e):
        return (
            f"{part}: {exit_message(e, during)}",
            "raise an exception (ValueError, NotImplementedError) where the part cannot go on",
        )
    if _is_out_of_memory(e):
        return (
            f"{part} ran out of memory while {during} ({type(e).__name__}: {first}); the check's "
            "models are small (d_model 32, 10 tokens): a part should need kilobytes there",
            "size the part's tensors from dims and its options, and declare "
            "activation_elements(opts, dims, seq_len) for what its forward holds",
        )
    return (
        f"{part} raised {type(e).__name__} while {during}: {first}",
        "run attnlab.testing.check_part in pytest to see the traceback",
    )


def _guard(name: str, part: str, fn: Callable[[], Result]) -> Result:
    t0 = time.perf_counter()
    try:
        result = fn()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # a part that raises or exits is a failed property, not a crash
        result = failed(name, *raised(part, e, "this was checked"))
    result.seconds = time.perf_counter() - t0
    return result


def _build(name: str, ok: list) -> list[tuple[Case, torch.nn.Module]] | Result:
    """The models of the accepted configs, or a ``build`` failure: the memory bound refuses
    them before anything is allocated, and a part that raises (or exits) in ``__init__`` fails
    here, naming the config."""
    bound = memory.check(name, ok)
    if bound is not None:
        return bound
    built = []
    for case, cfg in ok:
        try:
            built.append((case, build(cfg)))
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            what, fix = raised(name, e, "its small model was built")
            if not is_exit(e) and not _is_out_of_memory(e):
                fix = (
                    "refuse the settings the part cannot take in Options.check(model_cfg) (a "
                    "clear config error), and keep __init__ from raising otherwise; "
                    "attnlab.testing.check_part in pytest shows the traceback"
                )
            return failed(memory.NAME, what, fix, where=case.name)
    return built


def _checks(
    req: PartRequest, spec, ok: list, built: list, *, compile: bool, backend: str, export, tp
) -> dict[str, Callable[[], Result]]:
    """Each property of the battery, as a function of the part's models."""
    cls, name = spec.cls, f"{req.slot}.{req.kind}"
    base_case, base_cfg = ok[0]  # the first accepted case: the default family's first it takes
    # the Q/K/V projections unfused: each projection part runs its own forward
    # (a cross_attention part's attention on the explicit path: FlopCounterMode does not see
    # CPU SDPA, and the part declares the scores it computes)
    sets = ("model.attention.fuse_qkv=false",)
    declared = req.slot == "score" and cls.declares()  # its attention runs in the layer's core
    if req.slot == "cross_attention" or declared:
        sets = (*sets, "model.attention.backend=math")
    unfused = functools.cache(
        lambda: build(config_for(base_case, req.slot, req.kind, req.options, sets))
    )
    checks: dict[str, Callable[[], Result]] = {
        "effect": lambda: effect.check(name, cls, req.slot, built),
        "causality": lambda: causality.check(name, built),
        "kv_cache": lambda: kv_cache.check(name, cls, built),
        "fused": lambda: fused.check(name, req, built, build),
        "batch": lambda: batching.check(name, built),
        "params": lambda: declarations.check_params(name, cls, built),
        "flops": lambda: declarations.check_flops(name, cls, req.slot, base_case, unfused()),
        "state_dict": lambda: state.check_state_dict(name, base_cfg, base_case),
        "init": lambda: state.check_init(name, cls, base_cfg, base_case),
        "gradcheck": lambda: gradients.check(
            name,
            cls,
            config_for(base_case, req.slot, req.kind, req.options, gradients.CONFIG),
            base_case,
        ),
        "coord_check": lambda: width_transfer.check(
            name, req.slot, req.kind, req.options, base_case
        ),
        "compile": (
            (lambda: compiled.check_compile(name, cls, unfused(), base_case, backend))
            if compile
            else (lambda: skipped("compile", "not asked for (--no-compile)"))
        ),
        "bfloat16": lambda: compiled.check_bfloat16(name, base_cfg, base_case),
        "export": lambda: export(base_case),
        "quantize": lambda: quantize.check(name, cls, req.slot, req.kind, req.options, base_case),
        "tp": lambda: tp(base_case),
    }
    assert list(checks) == list(PROPERTIES)
    return checks


def _check_one(
    req: PartRequest,
    *,
    compile: bool,
    backend: str,
    export_dir: Path | None,
    step: Callable[[str, Result | None], None],
    wanted: Collection[str] = PROPERTIES,
    with_tp: bool = False,
) -> tuple[PartReport, tuple[exporting.Job | None, tp_check.Job | None]]:
    spec = _validated_spec(req)
    cls, name = spec.cls, f"{req.slot}.{req.kind}"
    report = PartReport(req.slot, req.kind, spec.source, dict(req.options))
    ok, report.refused = accepted(req.slot, req.kind, req.options)
    report.cases = [c.name for c, _ in ok]
    if not ok:
        why = "; ".join(f"{c}: {r}" for c, r in report.refused[:3])
        report.results.append(
            failed(
                "configs",
                f"no small-model config accepts {name} with these options ({why})",
                "accept d_model 32 with 4 heads of 8 and 2 K/V heads in at least one family, or "
                "declare the settings the part needs in check_config",
            )
        )
        return report, (None, None)
    step(memory.NAME, None)
    built = _build(name, ok)
    if isinstance(built, Result):
        step(memory.NAME, built)
        report.results.append(built)
        return report, (None, None)
    job: exporting.Job | None = None
    split: tp_check.Job | None = None

    def tp(case: Case) -> Result:
        nonlocal split
        if not with_tp:
            return skipped(tp_check.NAME, "not asked for (attnlab check --with-tp)")
        split = tp_check.job_for(req.slot, req.kind, case, req.options)
        return skipped(tp_check.NAME, "pending")  # replaced once the 2 processes have run

    def export(case: Case) -> Result:
        nonlocal job
        if export_dir is None:
            return skipped("export", "not asked for (--no-export)")
        cfg = config_for(case, req.slot, req.kind, req.options, exporting.CONFIG)
        got = exporting.prepare(name, cfg, case, export_dir)
        if isinstance(got, Result):
            return got
        job = got
        return skipped("export", "pending")  # replaced once the child process has run

    checks = _checks(req, spec, ok, built, compile=compile, backend=backend, export=export, tp=tp)
    for prop, fn in checks.items():
        if prop not in wanted:
            report.results.append(skipped(prop, "not asked for (properties=...)"))
            continue
        why = cls.unchecked.get(prop)
        step(prop, None)
        result = skipped(prop, f"{name} declares: {why}") if why else _guard(prop, name, fn)
        report.results.append(result)
        step(prop, result)
    return report, (job, split)


def _wanted(properties: Collection[str] | None) -> tuple[str, ...]:
    """The properties to run, in battery order (every one for ``None``); an unknown name is a
    UserError listing the battery's."""
    if properties is None:
        return PROPERTIES
    if isinstance(properties, str):
        properties = [properties]
    unknown = sorted(set(properties) - set(PROPERTIES))
    if unknown:
        raise UserError(
            f"unknown battery propert(ies) {', '.join(map(repr, unknown))}; "
            f"choose from {', '.join(PROPERTIES)}"
        )
    return tuple(p for p in PROPERTIES if p in properties)


def check_parts(
    requests: list[PartRequest],
    *,
    compile: bool = True,
    export: bool = True,
    tp: bool = False,
    compile_backend: str = "aot_eager",
    progress: Callable[[PartReport], None] | None = None,
    steps: Step | None = None,
    properties: Collection[str] | None = None,
) -> list[PartReport]:
    """Check every part of ``requests`` (float64, CPU); exports are loaded by one child process
    at the end, and with ``tp`` every part's model is split over one pair of gloo processes
    (the ``tp`` property, :mod:`attnlab.testing.tensor_parallel`; skipped without it). ``compile_backend``: ``aot_eager`` (dynamo's tracing, eager kernels; about a
    second a part) or ``inductor`` (C++ kernels as ``train.compile``; slow on a cold cache).
    ``progress`` is called with each report as its in-process checks finish; ``steps`` before
    and after each property of each part (:data:`Step`), e.g. to show which one is running.
    ``properties``: only these (names of :data:`PROPERTIES`; the others come back skipped as
    not asked for), e.g. one pytest item per part and property; default every one."""
    if compile_backend not in compiled.BACKENDS:
        raise UserError(
            f"compile backend {compile_backend!r}; choose one of {', '.join(compiled.BACKENDS)}"
        )
    wanted = _wanted(properties)
    for req in requests:  # bad input is refused before anything runs
        _validated_spec(req)
    reports: list[PartReport] = []
    jobs: list[tuple[PartReport, exporting.Job]] = []
    splits: list[tuple[PartReport, tp_check.Job]] = []
    n = len(requests)
    with tempfile.TemporaryDirectory(prefix="attnlab-check-") as tmp:
        for i, req in enumerate(requests):
            t0 = time.perf_counter()
            label = PartReport(req.slot, req.kind, "", dict(req.options)).name

            def step(prop: str, result: Result | None, _label=label, _i=i) -> None:
                if steps is not None:
                    steps(_label, _i + 1, n, prop, result)

            with torch.random.fork_rng(devices=[]), float64():
                # built-in parts' exports share one folder name, so the child imports their
                # identical remote code once; a plugin's code differs and gets its own name
                builtin = registry.get(req.slot, req.kind).source == registry.BUILTIN
                name = "attnlab_check" if builtin else f"attnlab_check_{i}"
                folder = Path(tmp) / str(i) / name if export else None
                report, (job, split) = _check_one(
                    req,
                    compile=compile,
                    backend=compile_backend,
                    export_dir=folder,
                    step=step,
                    wanted=wanted,
                    with_tp=tp,
                )
            report.seconds = time.perf_counter() - t0
            reports.append(report)
            if split is not None:
                splits.append((report, split))
            if job is not None:
                jobs.append((report, job))
            elif progress is not None and split is None:
                progress(report)
        if splits:
            exported = {id(r) for r, _ in jobs}
            _run_splits(splits, progress, steps, reports, exported)
        if jobs:
            _run_exports(jobs, progress, steps, reports)
    return reports


def _run_splits(
    splits: list[tuple[PartReport, tp_check.Job]],
    progress: Callable[[PartReport], None] | None,
    steps: Step | None,
    reports: list[PartReport],
    exported: set[int],
) -> None:
    """Run every pending ``tp`` job in one pair of gloo processes; put each result in its
    report (``progress`` now for a report with no export still pending)."""
    if steps is not None:
        steps(f"{len(splits)} part(s)", len(reports), len(reports), tp_check.NAME, None)
    t0 = time.perf_counter()
    got = tp_check.run([j for _, j in splits])
    share = (time.perf_counter() - t0) / len(splits)
    for (report, job), measured in zip(splits, got):
        result = tp_check.result(report.name, job, measured)
        result.seconds = share
        report.results = [result if r.name == tp_check.NAME else r for r in report.results]
        report.seconds += share
        if steps is not None:
            steps(report.name, reports.index(report) + 1, len(reports), tp_check.NAME, result)
        if progress is not None and id(report) not in exported:
            progress(report)


def _run_exports(
    jobs: list[tuple[PartReport, exporting.Job]],
    progress: Callable[[PartReport], None] | None,
    steps: Step | None,
    reports: list[PartReport],
) -> None:
    """Load every pending export in one child process and put its result in each report."""
    if steps is not None:
        steps(f"{len(jobs)} part(s)", len(reports), len(reports), "export", None)
    t0 = time.perf_counter()
    results = exporting.run([j for _, j in jobs])
    share = (time.perf_counter() - t0) / len(jobs)
    for (report, _), result in zip(jobs, results):
        report.results = [result if r.name == "export" else r for r in report.results]
        report.seconds += share
        if steps is not None:
            steps(report.name, reports.index(report) + 1, len(reports), "export", result)
        if progress is not None:
            progress(report)


def check_part(
    slot: str,
    kind: str,
    *,
    compile: bool = True,
    export: bool = True,
    tp: bool = False,
    compile_backend: str = "aot_eager",
    properties: Collection[str] | None = None,
    **options: Any,
) -> PartReport:
    """Check one registered part (a plugin's: load it first, e.g. by importing its module) with
    ``options``; ``report.passed``, ``report.failures()``, ``report.assert_passed()``.
    ``properties``: only these (default every one), e.g. ``properties=["kv_cache"]``. ``tp``:
    also split it over 2 gloo processes (its class must come from a file they can load)."""
    req = PartRequest(slot, kind, options)
    return check_parts(
        [req],
        compile=compile,
        export=export,
        tp=tp,
        compile_backend=compile_backend,
        properties=properties,
    )[0]
