"""The probe reads declarations, never part names: which parts it can inject comes from the slots
(``Slot.probe``) and the parts (``Part.probe_ready``), and every injected part's declared layer
statistics (``Part.layer_stats``, ``layer_stats_doc``) reach its files and report. Shown with a
plugin's parts, in fresh processes (the registry is global)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from attnlab.probe.layer_stats import collect, to_csv, to_markdown
from tests.helpers.paths import ROOT
from tests.helpers.probe_doubles import save_tiny_model, write_corpus

#: a side branch with its own layer statistic, two query parts (one with pretrained_delta) and a
#: key part (a slot the probe does not inject)
PLUGIN = '''
import torch
from torch import nn

from attnlab.parts import KeyPart, QueryPart, SideBranchPart, register


@register("side_branch", "scaled_skip")
class ScaledSkip(SideBranchPart):
    """S(x~) = g (x~ W): a content skip with a learned gain g per layer."""

    probe_name = "scaled"

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.w = nn.Linear(dims.d_model, dims.d_model, bias=False)
        self.gain = nn.Parameter(torch.ones(()))

    def init_weights(self, init):
        nn.init.normal_(self.w.weight, 0.0, init.std)
        nn.init.ones_(self.gain)

    def forward(self, x_tilde):
        return self.gain * self.w(x_tilde)

    def layer_stats(self):
        return {"scaled_skip_gain": float(self.gain.detach().abs())}

    @classmethod
    def layer_stats_doc(cls, opts, d_model):
        return {"scaled_skip_gain": f"|g|, the learned gain of the skip (1 at init, d = {d_model})."}


@register("query", "plain_q")
class PlainQuery(QueryPart):
    """A query part without pretrained_delta: it cannot be probed."""

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.w = nn.Linear(dims.d_model, dims.d_q, bias=False)

    def forward(self, u):
        return self.w(u)


@register("query", "delta_q")
class DeltaQuery(PlainQuery):
    """A query part with pretrained_delta: it can be probed."""

    def pretrained_delta(self, u, q_base):
        return self.w(u)


@register("key", "odd_key")
class OddKey(KeyPart):
    """A key part: the probe injects no key slot."""

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.w = nn.Linear(dims.d_model, dims.d_kv, bias=False)

    def forward(self, u):
        return self.w(u)
'''


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr + p.stdout
    assert "Traceback" not in p.stderr, p.stderr
    return p


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plugin") / "probe_ideas.py"
    path.write_text(PLUGIN)
    return path


def test_injectable_parts_follow_the_slot_and_part_declarations(plugin, tmp_path):
    code = (
        "import json, sys\n"
        "from attnlab.parts import load_plugin\n"
        "from attnlab.parts.slots import probe_slots\n"
        "from attnlab.probe.methods import components\n"
        "load_plugin(sys.argv[1])\n"
        "print(json.dumps({'slots': [s.name for s in probe_slots()],\n"
        "    'components': [[c.name, c.slot, c.kind] for c in components()]}))\n"
    )
    got = json.loads(_run([sys.executable, "-c", code, str(plugin)], tmp_path).stdout)
    assert got["slots"] == ["feature_map", "side_branch", "query"]
    assert got["components"] == [
        ["preproj", "feature_map", "pre_projection"],
        ["skip", "side_branch", "content_skip"],
        ["scaled", "side_branch", "scaled_skip"],
        ["anchored-query", "query", "anchored"],
        ["delta_q", "query", "delta_q"],
    ]
    rows = json.loads(
        _run(
            [sys.executable, "-m", "attnlab", "parts", "--plugin", str(plugin), "--json"], tmp_path
        ).stdout
    )
    probed = {
        (r["slot"], r["kind"]): f for r in rows for f in r["declares"] if f.startswith("probe: ")
    }
    assert probed == {
        ("feature_map", "pre_projection"): "probe: preproj",
        ("side_branch", "content_skip"): "probe: skip",
        ("side_branch", "scaled_skip"): "probe: scaled",
        ("query", "anchored"): "probe: anchored-query",
        ("query", "delta_q"): "probe: delta_q",
    }
    assert {r["config"] for r in rows if r["slot"] == "key"} == {"model.key"}


def test_the_probe_writes_every_declared_layer_stat(plugin, tmp_path):
    """An experiment of a plugin part with its own statistic and the content skip: each method's
    statistics in its probe.json and files, one column per method that has them, and a report
    section per statistic with the part's sentence."""
    base = save_tiny_model("llama", tmp_path / "llama")
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    exp = tmp_path / "exp.toml"
    exp.write_text(
        'name = "stats"\nmethods = ["scaled", "preproj+skip", "frozen"]\n'
        f'[base]\nmodel = "{base}"\n[data]\ncorpus = "{corpus}"\nval_fraction = 0.2\n'
        '[train]\nmax_steps = 3\nbatch_size = 2\nseq_len = 16\nlr = 3e-2\ndevice = "cpu"\n'
        '[eval]\nval_tokens = 32\nbatch_size = 4\ntasks = ["perplexity"]\n'
    )
    cmd = [sys.executable, "-m", "attnlab", "probe", str(exp), "--plugin", str(plugin)]
    _run([*cmd, "--out", "out"], tmp_path)
    out = tmp_path / "out"
    run = out / "runs" / "scaled"
    record = json.loads((run / "probe.json").read_text())
    assert record["method"] == "scaled"
    adapter = load_file(str(run / "adapter.safetensors"))
    gains = [abs(adapter[f"{i}.side_branch.gain"].item()) for i in range(2)]
    assert all(g != 1.0 for g in gains)  # trained away from its init
    assert record["layer_stats"] == {"scaled_skip_gain": pytest.approx(gains, rel=1e-6)}
    assert record["layer_stats_doc"]["scaled_skip_gain"].startswith("|g|, the learned gain")
    rows = (run / "layer_stats" / "scaled_skip_gain.csv").read_text().splitlines()
    assert rows[0] == "layer,scaled" and len(rows) == 3
    assert [float(r.split(",")[1]) for r in rows[1:]] == pytest.approx(gains, rel=1e-5)
    skip_record = json.loads((out / "runs" / "preproj-skip" / "probe.json").read_text())
    assert list(skip_record["layer_stats"]) == ["content_skip_norm"]

    combined = out / "layer_stats"
    assert (combined / "scaled_skip_gain.csv").read_text().splitlines()[0] == "layer,scaled"
    assert (combined / "content_skip_norm.csv").read_text().splitlines()[0] == "layer,preproj+skip"
    assert (combined / "scaled_skip_gain.png").stat().st_size > 0
    report = (out / "report.md").read_text()
    assert "## Scaled skip gain per layer" in report and "|g|, the learned gain" in report
    assert "## Content skip norm per layer" in report
    assert "![scaled skip gain](layer_stats/scaled_skip_gain.png)" in report


def test_tables_have_one_column_per_method_and_blanks_where_a_layer_lacks_a_value():
    stats = collect({"a": {"s": [1.0, 2.5]}, "b": {"s": [None, 3.0], "t": [None, None]}})
    assert stats == {"s": {"a": [1.0, 2.5], "b": [None, 3.0]}}  # an all-None series is dropped
    assert to_csv(stats["s"]) == "layer,a,b\n0,1,\n1,2.5,3\n"
    assert to_markdown(stats["s"]).splitlines()[2:] == [
        "| 0 | 1.0000 |  |",
        "| 1 | 2.5000 | 3.0000 |",
    ]
