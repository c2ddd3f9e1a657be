"""The check before a run: ``train``, ``compare``, ``probe`` and ``bench`` check every plugin part
their configs use (once per plugin source: the result is cached, :mod:`attnlab.testing.cache`)
and refuse to start on a failure, with the check's message. ``--skip-check`` skips it; the run
records that it was skipped (``check.json`` in its directory)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError
from attnlab.parts import registry
from attnlab.testing import cache
from attnlab.testing.battery import PartRequest, check_parts

#: which properties ran (part of the cache key, with the compile backend): ``attnlab check`` runs
#: all; the gate leaves out the transformers export (``attnlab export --verify`` checks it)
ALL, NO_EXPORT = "all", "no-export"
BACKEND = "aot_eager"


def what(properties: str, backend: str) -> str:
    return f"{properties}/{backend}"


RECORD = "check.json"
FLAG = "--skip-check"


class CheckFailedError(UserError):
    """A plugin part failed the conformance check: the message is the check's."""


def model_parts(model_cfgs: Iterable[Any]) -> list[tuple[str, Any]]:
    """(slot, options) of every slot of ``model_cfgs`` (ModelConfigs)."""
    return [pair for m in model_cfgs for pair in m.slots().items()]


def plugin_parts(parts: Iterable[tuple[str, Any]]) -> list[PartRequest]:
    """The (slot, options) pairs whose part comes from a plugin, once each."""
    seen: dict[str, PartRequest] = {}
    for slot, opts in parts:
        spec = registry.get(slot, opts.kind)
        if spec.kind == "none" or spec.source == registry.BUILTIN:
            continue
        options = opts.model_dump(mode="json", exclude={"kind"}, exclude_defaults=True)
        req = PartRequest(slot, opts.kind, options)
        seen.setdefault(repr(req), req)
    return list(seen.values())


def require_checked(parts: Iterable[tuple[str, Any]], *, skip: bool = False) -> dict[str, Any]:
    """Check the plugin parts among ``parts`` ((slot, PartOptions) pairs; cached per plugin
    source; every property but the export) and return the record a run keeps; raise
    :class:`CheckFailedError` naming each failed property."""
    todo = plugin_parts(parts)
    if not todo:
        return {}
    parts = [{"slot": r.slot, "kind": r.kind, "options": r.options} for r in todo]
    if skip:
        return {"skipped": True, "by": FLAG, "parts": parts}
    mine = what(NO_EXPORT, BACKEND)
    enough = [what(p, b) for p in (ALL, NO_EXPORT) for b in ("aot_eager", "inductor")]
    records, run = [], []
    for req in todo:
        cls = registry.get(req.slot, req.kind).cls
        hits = [cache.read(cache.key(cls, req.slot, req.kind, req.options, w)) for w in enough]
        k = cache.key(cls, req.slot, req.kind, req.options, mine)
        rec = {"slot": req.slot, "kind": req.kind, "options": req.options, "key": k}
        records.append(rec)
        if any(h is not None and h.passed for h in hits):
            rec["result"] = "passed (cached)"
        else:
            run.append((req, k, rec))
    if run:
        reports = check_parts([r for r, _, _ in run], export=False, compile_backend=BACKEND)
        bad = []
        for (_req, k, rec), report in zip(run, reports):
            rec["result"] = "passed" if report.passed else "failed"
            if report.passed:
                cache.write(k, report)
            else:
                bad.append(report)
        if bad:
            lines = "\n".join(f"  {r.name}: {x.message()}" for r in bad for x in r.failures())
            raise CheckFailedError(
                f"the conformance check fails on {', '.join(r.name for r in bad)} "
                f"(`attnlab check` shows every property; {FLAG} runs anyway, recorded):\n{lines}"
            )
    return {"skipped": False, "parts": records}


def record(directory: str | Path, rec: dict[str, Any]) -> None:
    """Write ``rec`` to ``DIR/check.json`` (nothing for a run without plugin parts)."""
    if not rec:
        return
    from attnlab.base.atomic import atomic_write_json

    Path(directory).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(directory) / RECORD, rec)
