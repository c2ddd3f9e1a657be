"""Every registered part, and the parts of the README's example plugins, pass the conformance
battery (``attnlab.testing``): one pytest item per part and property, collected from the part
registry, so that ``pytest -k "rope and kv_cache"`` runs one property of one part and xdist
spreads the parts over its workers (tests/conftest.py schedules the items of one part together).

``test_part[SLOT.KIND-PROPERTY]`` runs the in-process properties (torch.compile with the
``aot_eager`` backend included); a part's selected properties run once per worker, on its first
item. ``test_export[SLOT.KIND]`` loads the transformers export of every selected part in one
child process, as ``attnlab check`` does. A property the battery skips for a reason the part
declares (no autograd.Function of its own for ``gradcheck``, ``supports_kv_cache = False``) is
skipped here with that reason; ``compile`` must pass for every part, and ``export`` for every
part that some decoder config accepts (only decoders export).
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from attnlab.parts import registry
from attnlab.parts.plugins import load_plugin
from attnlab.testing import PROPERTIES, PartReport, check_part, check_parts
from attnlab.testing.battery import PartRequest
from attnlab.testing.result import WHOLE, Result
from tests.helpers.paths import EXAMPLES
from tests.helpers.registry import restored

#: the README's example plugins: their parts are checked like the built-in ones
PLUGINS = [EXAMPLES / f for f in ("my_ideas.py", "softcap.py", "causal_mean.py")]
#: the properties each ``test_part`` item checks (the export and tp have their own items: each
#: runs every selected part in one child process, or one pair of gloo processes)
IN_PROCESS = [p for p in PROPERTIES if p not in ("export", "tp")]


def _registered() -> list[str]:
    """``slot.kind`` of every registered part and of the example plugins' parts. The plugins
    are loaded for the listing and forgotten again (the registry as it was): the tests load them
    in ``plugins`` below, inside this module's own registry scope."""
    with restored():
        for path in PLUGINS:
            load_plugin(str(path))
        return [f"{s.slot}.{s.kind}" for s in registry.specs()]


PARTS = _registered()


class Battery:
    """The reports of this worker's parts, each computed on first use with just the properties
    that the session's selected items ask of it (``-k`` narrows the work, not only the output)."""

    def __init__(self, items: list[pytest.Item]) -> None:
        self.asked: dict[str, set[str]] = defaultdict(set)
        for item in items:
            callspec = getattr(item, "callspec", None)
            if callspec is not None and item.module.__name__ == __name__:
                prop = callspec.params.get("prop", item.originalname.removeprefix("test_"))
                self.asked[callspec.params["part"]].add(prop)
        self.reports: dict[str, PartReport] = {}
        self.exports: dict[str, PartReport] | None = None
        self.splits: dict[str, PartReport] | None = None

    def report(self, part: str) -> PartReport:
        if part not in self.reports:
            slot, kind = part.split(".")
            wanted = self.asked[part] - {"export", "tp"}
            self.reports[part] = check_part(slot, kind, export=False, properties=wanted)
        return self.reports[part]

    def export(self, part: str) -> PartReport:
        """Every selected part's export, loaded by one child process on the first call."""
        if self.exports is None:
            todo = [p for p in PARTS if "export" in self.asked[p]]
            requests = [PartRequest(*p.split("."), {}) for p in todo]
            reports = check_parts(requests, compile=False, properties=["export"])
            self.exports = dict(zip(todo, reports))
        return self.exports[part]

    def split(self, part: str) -> PartReport:
        """Every selected part split by tensor parallelism, in one pair of gloo processes."""
        if self.splits is None:
            todo = [p for p in PARTS if "tp" in self.asked[p]]
            requests = [PartRequest(*p.split("."), {}) for p in todo]
            reports = check_parts(requests, compile=False, export=False, tp=True, properties=["tp"])
            self.splits = dict(zip(todo, reports))
        return self.splits[part]


@pytest.fixture(scope="module")
def plugins() -> None:
    for path in PLUGINS:
        load_plugin(str(path))


@pytest.fixture(scope="module")
def battery(request: pytest.FixtureRequest, plugins) -> Battery:
    return Battery(request.session.items)


def _outcome(report: PartReport, prop: str) -> Result:
    """The property's result; a part that could not be checked at all fails every item with
    its reason (no config accepts it, or it cannot be built)."""
    whole = [r for r in report.results if r.name in WHOLE]
    assert not whole, f"{report.name} {whole[0].message()}"
    result = report.result(prop)
    assert result.status != "failed", f"{report.name} {result.message()}"
    return result


@pytest.mark.parametrize(
    ("part", "prop"),
    [pytest.param(part, prop, id=f"{part}-{prop}") for part in PARTS for prop in IN_PROCESS],
)
def test_part(part: str, prop: str, battery: Battery) -> None:
    result = _outcome(battery.report(part), prop)
    if prop == "compile":  # every part must compile: a skip would hide a graph break
        assert result.status == "passed", f"{part} {result.message()}"
    elif result.status == "skipped":
        assert result.detail, f"{part} {prop}: skipped without a reason"
        pytest.skip(f"{part} {result.message()}")


@pytest.mark.parametrize("part", PARTS)
def test_export(part: str, battery: Battery) -> None:
    report = battery.export(part)
    result = _outcome(report, "export")
    if result.status == "skipped":
        assert not any(c.startswith("decoder/") for c in report.cases), (
            f"{part} has decoder configs ({', '.join(report.cases)}) but its export was "
            f"skipped: {result.detail}"
        )
        pytest.skip(f"{part} {result.message()}")


@pytest.mark.distributed
@pytest.mark.parametrize("part", PARTS)
def test_tp(part: str, battery: Battery) -> None:
    result = _outcome(battery.split(part), "tp")
    if result.status == "skipped":
        pytest.skip(f"{part} {result.message()}")


def test_the_battery_covers_every_registered_part_and_the_examples():
    """The items come from the registry: a new built-in part is checked without editing this
    file, and the example plugins' parts are among them."""
    builtins = {f"{s.slot}.{s.kind}" for s in registry.specs() if s.source == registry.BUILTIN}
    assert builtins and builtins <= set(PARTS)
    assert {"query.gated", "score.softcap", "side_branch.causal_mean"} <= set(PARTS)
    assert len(PARTS) == len(set(PARTS))


@pytest.mark.fast
def test_only_the_asked_properties_run():
    report = check_part("query", "linear", properties=["kv_cache"])
    statuses = {r.name: r.status for r in report.results}
    assert list(statuses) == list(PROPERTIES)
    assert statuses["kv_cache"] == "passed"
    assert all(statuses[p] == "skipped" for p in PROPERTIES if p != "kv_cache")
    assert report.result("export").detail == "not asked for (properties=...)"


def test_an_unknown_property_is_refused_with_the_battery_s_names():
    from attnlab.base.errors import UserError

    with pytest.raises(UserError, match=r"unknown battery propert\(ies\) 'kv_cash'; choose from"):
        check_part("query", "linear", properties=["kv_cash"])


def test_xdist_schedules_the_items_of_one_part_together(request: pytest.FixtureRequest):
    """tests/conftest.py's scheduler: one xdist scope per part (its properties share one
    report), loadscope's module scope for every other test."""
    from tests.conftest import PER_PART, xdist_scope

    assert request.node.nodeid.startswith(f"tests/{PER_PART.split('::')[0]}")  # this file

    item = "tests/testing/test_battery.py::test_part[position.rope-{}]"
    assert xdist_scope(item.format("kv_cache")) == xdist_scope(item.format("compile"))
    assert xdist_scope(item.format("kv_cache")) != xdist_scope(
        "tests/testing/test_battery.py::test_part[position.alibi-kv_cache]"
    )
    assert xdist_scope("tests/testing/test_battery.py::test_export[position.rope]") is None
    assert xdist_scope("tests/model/test_parts.py::test_rope[a-b]") is None
