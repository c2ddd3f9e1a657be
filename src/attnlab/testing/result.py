"""What the conformance check reports: one :class:`Result` per property, one :class:`PartReport`
per part."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["passed", "failed", "skipped"]

#: results that stand for the whole part when it cannot be checked at all: no small-model config
#: accepts it, or it cannot be built (it raises in __init__, or would need gigabytes)
WHOLE = ("configs", "build")
#: the properties the battery checks, in the order it reports them
PROPERTIES: tuple[str, ...] = (
    "effect",
    "causality",
    "kv_cache",
    "fused",
    "batch",
    "params",
    "flops",
    "state_dict",
    "init",
    "gradcheck",
    "coord_check",
    "compile",
    "bfloat16",
    "export",
    "quantize",
    "tp",
)


@dataclass
class Result:
    """One property of one part: its status, what was measured against which limit, where (the
    small model's config), and for a failure the fix."""

    name: str
    status: Status
    detail: str
    measured: float | None = None
    limit: float | None = None
    fix: str = ""
    where: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status != "failed"

    def message(self) -> str:
        """One sentence: the property, what was found (with the number), and the fix."""
        where = f" [{self.where}]" if self.where and self.status == "failed" else ""
        fix = f"; {self.fix}" if self.fix and self.status == "failed" else ""
        return f"{self.name}: {self.detail}{where}{fix}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Result:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k in d})


def passed(
    name: str,
    detail: str,
    measured: float | None = None,
    limit: float | None = None,
    where: str = "",
) -> Result:
    return Result(name, "passed", detail, measured, limit, where=where)


def failed(
    name: str,
    detail: str,
    fix: str,
    measured: float | None = None,
    limit: float | None = None,
    where: str = "",
) -> Result:
    return Result(name, "failed", detail, measured, limit, fix, where)


def skipped(name: str, why: str) -> Result:
    return Result(name, "skipped", why)


@dataclass
class PartReport:
    """Every property of one part (``slot.kind`` with ``options``), the small-model configs it
    was checked in, and those its options or the config validation refused (with the reason)."""

    slot: str
    kind: str
    source: str
    options: dict[str, Any] = field(default_factory=dict)
    results: list[Result] = field(default_factory=list)
    cases: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def name(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.slot}.{self.kind}" + (f"[{opts}]" if opts else "")

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def failures(self) -> list[Result]:
        return [r for r in self.results if not r.passed]

    def result(self, name: str) -> Result:
        return next(r for r in self.results if r.name == name)

    def summary(self) -> str:
        """Every property's message, one per line, failures first."""
        order = sorted(self.results, key=lambda r: r.status != "failed")
        return "\n".join([f"{self.name} ({self.source}):"] + [f"  {r.message()}" for r in order])

    def assert_passed(self) -> None:
        """Raise ``AssertionError`` naming every failed property (for a plugin's own pytest)."""
        bad = self.failures()
        if bad:
            lines = "\n".join(f"  {r.message()}" for r in bad)
            raise AssertionError(f"{self.name} fails the conformance check:\n{lines}")

    def __str__(self) -> str:
        return self.summary()

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "kind": self.kind,
            "source": self.source,
            "options": self.options,
            "results": [r.to_dict() for r in self.results],
            "cases": self.cases,
            "refused": [list(x) for x in self.refused],
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PartReport:
        return cls(
            slot=d["slot"],
            kind=d["kind"],
            source=d["source"],
            options=dict(d.get("options") or {}),
            results=[Result.from_dict(r) for r in d.get("results", [])],
            cases=list(d.get("cases", [])),
            refused=[(a, b) for a, b in d.get("refused", [])],
            seconds=float(d.get("seconds", 0.0)),
        )
