"""The check battery's ``quantize`` property (issue 35): built-in parts pass it for every scheme,
and a plugin part whose forward reads a Linear's weight directly fails it with the fix, then
passes once it overrides ``quantizable()``."""

from __future__ import annotations

import pytest

pytest.importorskip("torchao")

from attnlab.parts.plugins import load_plugin
from attnlab.testing import check_part
from attnlab.testing import quantize as quantize_property
from attnlab.testing.cases import accepted

PLUGIN = """
import torch
from torch import nn
from attnlab.parts import SideBranchPart, register


@register("side_branch", "{kind}")
class Direct(SideBranchPart):
    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.w = nn.Linear(dims.d_model, dims.d_model, bias=False)

    @classmethod
    def param_count(cls, opts, dims):
        return dims.d_model**2

    def forward(self, x):
        return torch.einsum("btd,ed->bte", x, self.w.weight)  # the weight read directly
{extra}
"""
KEEP = """
    def quantizable(self):
        return {}

    def full_precision_notes(self):
        return {"w": "forward() reads its weight with einsum"}
"""


def _quantize(slot: str, kind: str):
    ok, _ = accepted(slot, kind, {})
    case = next(c for c, _ in ok if c.family == "decoder")
    from attnlab.parts import registry

    return quantize_property.check(
        f"{slot}.{kind}", registry.get(slot, kind).cls, slot, kind, {}, case
    )


@pytest.mark.parametrize(
    "slot,kind",
    [("ffn", "swiglu"), ("query", "nonlinear"), ("readout", "identity_head"), ("value", "moe")],
)
def test_built_in_parts_pass_for_every_scheme(slot, kind):
    result = _quantize(slot, kind)
    assert result.status == "passed", result.message()
    for scheme in ("int8-weight", "int4-weight", "int8-dynamic"):
        assert scheme in result.detail


def test_a_plugin_reading_its_weight_fails_and_its_override_passes(tmp_path):
    bad = tmp_path / "direct_bad.py"
    bad.write_text(PLUGIN.format(kind="direct_bad", extra=""))
    load_plugin(str(bad))
    report = check_part("side_branch", "direct_bad", compile=False, export=False)
    result = report.result("quantize")
    assert result.status == "failed", report.summary()
    good = tmp_path / "direct_good.py"
    good.write_text(PLUGIN.format(kind="direct_good", extra=KEEP))
    load_plugin(str(good))
    report = check_part("side_branch", "direct_good", compile=False, export=False)
    assert report.result("quantize").status == "passed", report.summary()
