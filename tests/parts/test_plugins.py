"""A new idea is one file: parts written outside the package, loaded as a plugin, used by every
command from the command line (params, train, eval, generate, compare with --jobs workers, bench,
parts), recorded in the runs, and refused clearly when broken or missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.data import WORDS, prepare_bytes, word_corpus
from tests.helpers.paths import ROOT

EXAMPLE = ROOT / "examples" / "my_ideas.py"

#: a score transform, appended to the README's example file: three slots from one file
SOFTCAP = '''

from attnlab.parts import ScorePart


@register("score", "softcap")
class SoftCap(ScorePart):
    """s' = c tanh(s / c) on the logits before the softmax (a soft cap)."""

    param_label = "softcap"
    cost = "params 0; FLOPs 0 beyond attention (a tanh per score is elementwise); memory O(T^2 H)"
    needs_attention_matrix = True
    on = "logits"

    class Options(ScorePart.Options):
        cap: float = Field(5.0, gt=0)

    @classmethod
    def param_count(cls, opts, dims):
        return 0

    def transform(self, s, allowed):
        return self.opts.cap * (s / self.opts.cap).tanh()

    def forward(self, q, k, v, core, ctx):
        return core.explicit(q, k, v, ctx, transform=self)
'''
PARTS = [
    "model.query.kind=gated",
    "model.side_branch.kind=low_rank_skip",
    "model.side_branch.rank=4",
    "model.score.kind=softcap",
]


def attnlab(*args: str, cwd: Path | None = None, ok: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run(
        [sys.executable, "-m", "attnlab", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if ok:
        assert p.returncode == 0, p.stderr + p.stdout
    assert "Traceback" not in p.stderr, p.stderr
    return p


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict[str, Path]:
    """A researcher's folder (outside src/): the plugin file, prepared data, a run config."""
    root = tmp_path_factory.mktemp("lab")
    plugin = root / "ideas" / "my_ideas.py"
    plugin.parent.mkdir()
    plugin.write_text(EXAMPLE.read_text() + SOFTCAP)
    corpus = word_corpus(root / "corpus.jsonl", WORDS, n_docs=60, length=(30, 60), seed=0)
    data = prepare_bytes(corpus, root / "data")
    cfg = root / "run.toml"
    cfg.write_text(
        'extends = "tiny"\nplugins = ["ideas/my_ideas.py"]\n'
        f"[data]\ncorpus = {json.dumps(str(corpus))}\ndir = {json.dumps(str(data))}\n"
        "seq_len = 32\n[train]\nmax_steps = 4\nbatch_size = 4\nwarmup_steps = 1\n"
        "eval_every = 2\neval_batches = 1\ncheckpoint_every = 2\nlog_every = 1\ndevice = 'cpu'\n"
    )
    return {"root": root, "plugin": plugin, "corpus": corpus, "data": data, "cfg": cfg}


def test_params_counts_the_plugin_parts_under_their_labels(lab):
    sets = [a for s in PARTS for a in ("--set", s)]
    out = attnlab("params", "tiny", "--plugin", str(lab["plugin"]), *sets, "--json").stdout
    rep = json.loads(out)
    d, d_q, r = 64, 64, 4
    assert rep["by_part"]["gated_query"] == 2 * 2 * d * d_q  # W_Q and W_g, 2 layers
    assert rep["by_part"]["side_branch"] == 2 * 2 * d * r
    base = json.loads(attnlab("params", "tiny", "--json").stdout)
    # the soft cap adds no matmul FLOPs (what FlopCounterMode counts and `attnlab check` holds a
    # part's declaration to): its tanh per score is elementwise
    extra = 2 * (2 * d * d_q) + 2 * (4 * d * r)
    assert rep["flops_per_token"] - base["flops_per_token"] == extra


def test_parts_lists_the_plugin_parts_with_their_source(lab):
    rows = json.loads(attnlab("parts", "--plugin", str(lab["plugin"]), "--json").stdout)
    mine = {(r["slot"], r["kind"]): r for r in rows if r["source"] != "built-in"}
    assert set(mine) == {("query", "gated"), ("side_branch", "low_rank_skip"), ("score", "softcap")}
    assert all(r["source"] == str(lab["plugin"]) for r in mine.values())
    assert mine[("side_branch", "low_rank_skip")]["options"]["rank"]["default"] == 8
    assert "needs the T x T matrix" in mine[("score", "softcap")]["declares"]
    assert "not fused" in mine[("query", "gated")]["declares"]


def test_train_records_the_plugin_and_eval_generate_find_it_again(lab):
    root, sets = lab["root"], [a for s in PARTS for a in ("--set", s)]
    attnlab("train", str(lab["cfg"]), "--out", "runs/mine", "--quiet", *sets, cwd=root)
    run = root / "runs" / "mine"
    assert f'plugins = ["{lab["plugin"]}"]' in (run / "config.toml").read_text()
    # a later process (no --plugin) rebuilds the model from the run's own record
    out = attnlab("generate", str(run), "--prompt", "the", "--max-new-tokens", "3", cwd=root)
    assert out.stdout.strip()
    attnlab("eval", str(run), "--tasks", "perplexity", "--limit", "1", cwd=root)


def test_compare_with_jobs_runs_plugin_variants_and_reports_their_params(lab):
    root = lab["root"]
    exp = root / "exp.toml"
    exp.write_text(
        'name = "plugin-e2e"\nplugins = ["ideas/my_ideas.py"]\nseeds = [0, 1]\n'
        f"[base]\nextends = {json.dumps(str(lab['cfg']))}\n"
        "[budget]\nsteps = 3\n"
        '[[variants]]\nname = "baseline"\n'
        '[[variants]]\nname = "mine"\n'
        f"set = {json.dumps(PARTS)}\n"
    )
    attnlab("compare", str(exp), "--out", "cmp", "--jobs", "2", cwd=root)
    results = json.loads((root / "cmp" / "results.json").read_text())
    rows = results["runs"] if isinstance(results, dict) and "runs" in results else results
    assert {(r["variant"], r["status"]) for r in rows} == {
        ("baseline", "finished"),
        ("mine", "finished"),
    }
    report = (root / "cmp" / "report.md").read_text()
    assert "gated_query" in report and "softcap" in report
    record = json.loads((root / "cmp" / "experiment.json").read_text())
    mine = next(v for v in record["variants"] if v["name"] == "mine")
    assert mine["config"]["plugins"] == [str(lab["plugin"])]
    assert [r["spec"] for r in record["plugins"]] == [str(lab["plugin"])]
    assert record["plugins"][0]["sha256"]


#: the smallest bench: one step, one round, no warmup, two decoded tokens, batch 1
SMALLEST_BENCH = [
    "--peers", "none", "--steps", "1", "--repeats", "1", "--warmup", "0",
    "--decode-repeats", "1", "--new-tokens", "2", "--prompt-len", "2",
    "--batch-size", "1", "--seq-len", "16", "--threads", "1", "--json",
]  # fmt: skip
SECTIONS = ("training", "inference", "memory")


def test_bench_measures_plugin_parts_in_every_section(lab):
    """--variant NAME:... of plugin parts, and a plugin part by its kind, have a row in the
    training, inference and memory tables (the memory child loads the plugin itself)."""
    p = attnlab(
        "bench", "--preset", "tiny", "--plugin", str(lab["plugin"]),
        "--variant", "mine:" + ",".join(PARTS), "--variants", "baseline,low_rank_skip",
        "--sections", ",".join(SECTIONS), *SMALLEST_BENCH,
    )  # fmt: skip
    result = json.loads(p.stdout)
    assert result["failures"] == [] and result["skipped"] == {}
    for section in SECTIONS:
        assert [r["name"] for r in result[section]] == ["baseline", "low_rank_skip", "mine"]
    rows = {r["name"]: r for r in result["training"]}
    assert rows["mine"]["flops_per_token"] > rows["low_rank_skip"]["flops_per_token"]
    assert rows["low_rank_skip"]["flops_per_token"] > rows["baseline"]["flops_per_token"]
    assert rows["mine"]["attention"].startswith("O(T^2 H)")  # the soft cap forms the matrix
    for r in result["inference"]:  # every part here supports the KV cache
        assert r["greedy_identical"] is True and r["decode_cached_tokens_per_s"] > 0
    for r in result["memory"]:
        assert r["error"] is None and r["peak_rss_mib"] > 0 and r["growth_mib"] > 0


#: a side branch that declares it breaks the KV cache, and a query part with a shape bug
NO_CACHE_AND_BROKEN = '''
from torch import nn

from attnlab.parts import QueryPart, SideBranchPart, register


@register("side_branch", "running_mean")
class RunningMean(SideBranchPart):
    """S(x~)_t = W mean(x~_1..t): reads earlier positions, so cached decoding is not exact."""

    supports_kv_cache = False

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.w = nn.Linear(dims.d_model, dims.d_model, bias=False)

    def forward(self, x_tilde):
        n = x_tilde.new_ones(x_tilde.shape[1]).cumsum(0)[None, :, None]
        return self.w(x_tilde.cumsum(1) / n)


@register("query", "broken")
class Broken(QueryPart):
    """One column too many: the attention cannot split q into heads."""

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.w = nn.Linear(dims.d_model, dims.d_q + 1, bias=False)

    def forward(self, u):
        return self.w(u)
'''


def test_bench_names_a_failing_subject_and_section_and_exits_1(tmp_path):
    """A part that raises fails its subject in every section (a FAILED row each, one stderr
    line each, exit 1) while the others are measured; a part without KV-cache support is in the
    inference table, decoding by recomputation."""
    plugin = tmp_path / "more_ideas.py"
    plugin.write_text(NO_CACHE_AND_BROKEN)
    out = tmp_path / "res"
    args = [
        "bench", "--preset", "tiny", "--plugin", str(plugin),
        "--variants", "baseline,running_mean,broken", "--sections", ",".join(SECTIONS),
        "--out", str(out), *SMALLEST_BENCH,
    ]  # fmt: skip
    # the conformance check stops a bench whose plugin part is broken before anything runs ...
    p = attnlab(*args, ok=False)
    assert p.returncode == 2 and "the conformance check fails on query.broken" in p.stderr
    # ... and with --skip-check the bench itself reports the part failing in each section
    p = attnlab(*args, "--skip-check", ok=False)
    assert "the conformance check of the plugin parts was skipped (--skip-check)" in p.stderr
    assert p.returncode == 1, p.stderr
    failed = [line for line in p.stderr.splitlines() if line.startswith("attnlab bench: ")]
    assert [line.split(": RuntimeError")[0] for line in failed] == [
        f"attnlab bench: broken failed in {section}" for section in SECTIONS
    ]
    assert all("shape" in line for line in failed)
    result = json.loads(p.stdout)
    assert {(f["section"], f["name"]) for f in result["failures"]} == {
        (section, "broken") for section in SECTIONS
    }
    for section in SECTIONS:
        assert [r["name"] for r in result[section] if not r.get("error")] == [
            "baseline",
            "running_mean",
        ]
    mean = next(r for r in result["inference"] if r["name"] == "running_mean")
    assert mean["decode_cached_tokens_per_s"] is None and mean["decode_uncached_tokens_per_s"] > 0
    assert mean["greedy_identical"] is None and mean["cache_bytes_per_token"] is None
    md = (tmp_path / "res.md").read_text()
    assert md.count("| broken | FAILED: RuntimeError") == 3 and "| running_mean |" in md
    assert "no KV cache" in md


def test_a_broken_or_clashing_plugin_is_a_clear_error(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    p = attnlab("params", "tiny", "--plugin", str(broken), ok=False)
    assert p.returncode == 2 and "broken.py" in p.stderr and "not_a_module_anywhere" in p.stderr
    clash = tmp_path / "clash.py"
    clash.write_text(
        "from attnlab.parts import QueryPart, register\n\n\n"
        '@register("query", "nonlinear")\nclass Mine(QueryPart):\n    pass\n'
    )
    p = attnlab("params", "tiny", "--plugin", str(clash), ok=False)
    assert p.returncode == 2
    assert "query.nonlinear is already registered by built-in" in p.stderr
    p = attnlab("params", "tiny", "--plugin", str(tmp_path / "missing.py"), ok=False)
    assert p.returncode == 2 and "does not exist" in p.stderr


def test_a_run_whose_plugin_is_gone_names_it(lab, tmp_path):
    plugin = tmp_path / "gone.py"
    plugin.write_text(EXAMPLE.read_text())
    cfg = tmp_path / "run.toml"
    cfg.write_text(lab["cfg"].read_text().replace('"ideas/my_ideas.py"', '"gone.py"'))
    attnlab("train", str(cfg), "--out", "r", "--quiet", "--set", PARTS[0], cwd=tmp_path)
    plugin.unlink()
    p = attnlab("generate", "r", "--prompt", "the", cwd=tmp_path, ok=False)
    assert p.returncode == 2 and "gone.py" in p.stderr and "does not exist" in p.stderr


def test_loading_twice_is_harmless_and_records_the_source_hash(lab):
    from attnlab.parts import registry
    from attnlab.parts.plugins import load_plugin, source_hash

    first = load_plugin(str(lab["plugin"]))
    again = load_plugin(str(lab["plugin"]))
    assert first is again and first.sha256 == source_hash([lab["plugin"]])
    assert registry.get("query", "gated").source == str(lab["plugin"])


def test_a_plugin_side_branch_probes_a_tiny_pretrained_model(lab, tmp_path):
    """The plugin's side branch as a probe method on a tiny local Llama: trains, only its
    tensors are trainable and saved, and the run's config records the plugin."""
    from tests.helpers.probe_doubles import save_tiny_model, write_corpus

    base = save_tiny_model("llama", tmp_path / "llama")
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    sets = [
        f"base.model={base}",
        "method=low_rank_skip+preproj",
        "probe.side_branch.rank=2",
        f"data.corpus={corpus}",
        "data.val_fraction=0.2",
        "train.max_steps=3",
        "train.batch_size=2",
        "train.seq_len=16",
        "train.lr=3e-3",
        "eval.val_tokens=32",
        "eval.batch_size=4",
    ]
    args = [a for s in sets for a in ("--set", s)]
    attnlab("probe", "--plugin", str(lab["plugin"]), "--out", "probe", *args, cwd=tmp_path)
    run = tmp_path / "probe"
    record = json.loads((run / "probe.json").read_text())
    status = json.loads((run / "status.json").read_text())
    assert record["method"] == "preproj+low_rank_skip" and status["status"] == "finished"
    from safetensors.torch import load_file

    adapter = load_file(str(run / "adapter.safetensors"))
    layers = 2  # save_tiny_model's depth
    rank_a = [k for k in adapter if k.endswith("side_branch.a.weight")]
    assert len(rank_a) == layers and adapter[rank_a[0]].shape[0] == 2
    assert str(lab["plugin"]) in (run / "probe.toml").read_text()
    # the adapter re-attaches from the run alone: its config names the plugin to load
    from attnlab.probe import load_probed_model

    model, _ = load_probed_model(run)
    assert sum("side_branch" in n for n, _ in model.named_parameters()) == 2 * layers


def test_runs_record_plugin_hashes_and_warn_when_the_source_changed(lab, tmp_path):
    plugin = tmp_path / "mine.py"
    plugin.write_text(EXAMPLE.read_text())
    cfg = tmp_path / "run.toml"
    cfg.write_text(lab["cfg"].read_text().replace('"ideas/my_ideas.py"', '"mine.py"'))
    attnlab("train", str(cfg), "--out", "r", "--quiet", "--set", PARTS[0], cwd=tmp_path)
    records = json.loads((tmp_path / "r" / "plugins.json").read_text())["plugins"]
    from attnlab.parts.plugins import source_hash

    assert [(r["spec"], r["sha256"]) for r in records] == [(str(plugin), source_hash([plugin]))]
    plugin.write_text(EXAMPLE.read_text() + "\n# edited after training\n")
    p = attnlab("generate", "r", "--prompt", "the", "--max-new-tokens", "2", cwd=tmp_path)
    assert "changed since the run was made" in p.stderr and str(plugin) in p.stderr


def test_a_pickled_config_loads_its_plugins_in_a_fresh_process(lab, tmp_path):
    """Configs cross process boundaries (``--jobs`` workers, submitit jobs) as their dict: the
    receiving process loads the recorded plugin before it validates the plugin part's options."""
    import pickle

    from attnlab.config import load_config

    cfg = load_config("tiny", PARTS, plugins=[str(lab["plugin"])])
    blob = tmp_path / "cfg.pkl"
    blob.write_bytes(pickle.dumps(cfg))
    code = (
        "import pickle, sys; cfg = pickle.loads(open(sys.argv[1], 'rb').read()); "
        "print(cfg.model.query.kind, cfg.model.side_branch.rank, cfg.plugins == [sys.argv[2]])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-c", code, str(blob), str(lab["plugin"])],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["gated", "4", "True"]


def _stderr_lines(p: subprocess.CompletedProcess) -> list[str]:
    """stderr's lines, without the attention-path lines every model-running command prints."""
    return [
        line
        for line in p.stderr.splitlines()
        if line.strip() and not line.startswith("attention: ")
    ]


def test_a_moved_plugin_is_replaced_by_plugin_newpath_in_every_command(lab, tmp_path):
    """After the plugin file moves, generate/eval/export/train fail with the fix, and work with
    --plugin NEWPATH: the same model, one warning line naming both paths and both sha256."""
    from attnlab.parts.plugins import source_hash

    old = tmp_path / "ideas" / "my_ideas.py"
    old.parent.mkdir()
    old.write_text(EXAMPLE.read_text())
    cfg = tmp_path / "run.toml"
    cfg.write_text(lab["cfg"].read_text())  # plugins = ["ideas/my_ideas.py"], next to it
    train = ["train", str(cfg), "--out", "r", "--quiet", "--set", PARTS[0], "--set", PARTS[1]]
    attnlab(*train, cwd=tmp_path)
    gen = ["generate", "r", "--prompt", "the", "--max-new-tokens", "8", "--temperature", "0"]
    before = attnlab(*gen, cwd=tmp_path).stdout
    new = tmp_path / "elsewhere" / "my_ideas.py"
    new.parent.mkdir()
    old.rename(new)
    commands = {
        "generate": gen,
        "eval": ["eval", "r", "--tasks", "perplexity", "--limit", "1", "--no-progress"],
        "export": ["export", "r", "--out", "hf", "--force"],
        "train": train,
    }
    sha = source_hash([new])[:12]
    for name, cmd in commands.items():
        p = attnlab(*cmd, cwd=tmp_path, ok=False)
        assert p.returncode == 2, (name, p.stderr)
        fix = "if it moved, pass --plugin NEWPATH"
        if name == "train":  # it loads the run's recorded plugins first (issue 32)
            fix = (
                "the run in r was trained with it (plugins.json). If it moved, pass --plugin "
                f"NEWPATH: a file named my_ideas.py, accepted when its sha256 matches the "
                f"recorded {sha} (a changed source resumes only with --allow-plugin-change); to "
                "train afresh without it, pass --restart"
            )
        assert _stderr_lines(p) == [
            f"attnlab {name}: error: plugin file {old} does not exist; {fix}"
        ]
    same = (
        f"plugin {old} does not exist; using {new} instead (same module name 'my_ideas'); "
        f"sha256 recorded {sha}, now {sha} (the same source)"
    )
    outs = {}
    for name, cmd in commands.items():
        p = attnlab(*cmd, "--plugin", str(new), cwd=tmp_path)
        assert _stderr_lines(p) == [f"attnlab {name}: warning: {same}"], name
        outs[name] = p.stdout
    assert outs["generate"] == before  # the trained model, greedy: the same continuation
    assert "already finished" in outs["train"]  # the config check saw the same plugin
    assert str(new) in outs["export"] and (tmp_path / "hf" / "plugins" / "my_ideas.py").is_file()
    # a changed source says so with both hashes; an interrupted run refuses to resume with it
    # (issue 24) unless --allow-plugin-change, which plugins.json records
    new.write_text(EXAMPLE.read_text() + "\n# edited after the move\n")
    ckpts = tmp_path / "r" / "checkpoints"
    shutil.rmtree(ckpts / "step_0000004")  # as if killed after the step-2 checkpoint
    (ckpts / "latest").write_text("step_0000002")
    (tmp_path / "r" / "status.json").unlink()
    moved = (
        f"attnlab train: warning: plugin {old} does not exist; using {new} instead (same module "
        f"name 'my_ideas'); sha256 recorded {sha}, now {source_hash([new])[:12]} (a different "
        "source: its parts may not compute what was trained)"
    )
    p = attnlab(*commands["train"], "--plugin", str(new), cwd=tmp_path, ok=False)
    assert p.returncode == 2 and _stderr_lines(p)[0] == moved, p.stderr
    assert f"{source_hash([new])} (now)" in p.stderr and "--allow-plugin-change" in p.stderr
    p = attnlab(*commands["train"], "--plugin", str(new), "--allow-plugin-change", cwd=tmp_path)
    assert _stderr_lines(p)[0] == moved and "--allow-plugin-change" in p.stderr
    assert "resumed from step 2" in p.stdout
    assert json.loads((tmp_path / "r" / "plugins.json").read_text())["plugins"][0]["spec"] == str(
        new
    )


def test_a_moved_plugin_must_keep_its_module_name(lab, tmp_path):
    plugin = tmp_path / "mine.py"
    plugin.write_text(EXAMPLE.read_text())
    cfg = tmp_path / "run.toml"
    cfg.write_text(lab["cfg"].read_text().replace('"ideas/my_ideas.py"', '"mine.py"'))
    attnlab("train", str(cfg), "--out", "r", "--quiet", "--set", PARTS[0], cwd=tmp_path)
    renamed = tmp_path / "other.py"
    plugin.rename(renamed)
    p = attnlab(
        "generate", "r", "--prompt", "the", "--plugin", str(renamed), cwd=tmp_path, ok=False
    )
    assert p.returncode == 2
    assert f"plugin file {plugin} does not exist; if it moved, pass --plugin NEWPATH" in p.stderr
    assert "the new file must be named mine.py; --plugin gave 'other'" in p.stderr


def test_a_damaged_run_file_is_one_warning_line(lab, tmp_path):
    """Warnings print like errors: `attnlab CMD: warning: ...`, no source path or line."""
    plugin = tmp_path / "mine.py"
    plugin.write_text(EXAMPLE.read_text())
    cfg = tmp_path / "run.toml"
    cfg.write_text(lab["cfg"].read_text().replace('"ideas/my_ideas.py"', '"mine.py"'))
    attnlab("train", str(cfg), "--out", "r", "--quiet", "--set", PARTS[0], cwd=tmp_path)
    gen = ["generate", "r", "--prompt", "the", "--max-new-tokens", "2"]
    (tmp_path / "r" / "plugins.json").write_text("{not json")
    p = attnlab(*gen, cwd=tmp_path)
    assert _stderr_lines(p) == [
        "attnlab generate: warning: r/plugins.json is damaged; the plugins' sources cannot be "
        "checked against the run"
    ]
    (tmp_path / "r" / "plugins.json").unlink()
    model = tmp_path / "r" / "checkpoints" / "step_0000004" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:100])
    p = attnlab(*gen, cwd=tmp_path)
    (line,) = _stderr_lines(p)
    assert line.startswith("attnlab generate: warning: skipping damaged checkpoint step_0000004")
    assert line.endswith("falling back to step_0000002")
    assert "Warning" not in p.stderr and ".py:" not in p.stderr


KILLED_RUN = """
import sys
from attnlab.config import load_config
from attnlab.parts.plugins import load_plugins
from attnlab.train import train

load_plugins(["mine.py"])
r = train(load_config("run.toml", [sys.argv[1]]), "r", _stop_after=2)
assert r.status == "running", r
"""


def test_a_changed_plugin_source_is_refused_on_resume_and_allowed_only_by_a_recorded_flag(
    lab, tmp_path
):
    """Issue 24 case 9: sigmoid -> tanh between a kill and the resume."""
    from attnlab.parts.plugins import source_hash

    plugin = tmp_path / "mine.py"
    plugin.write_text(EXAMPLE.read_text())
    cfg = tmp_path / "run.toml"
    cfg.write_text(lab["cfg"].read_text().replace('"ideas/my_ideas.py"', '"mine.py"'))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    subprocess.run(
        [sys.executable, "-c", KILLED_RUN, PARTS[0]], cwd=tmp_path, env=env, check=True, timeout=600
    )
    then = source_hash([plugin])
    plugin.write_text(EXAMPLE.read_text().replace("w_g(u).sigmoid()", "w_g(u).tanh()"))
    now = source_hash([plugin])
    run = tmp_path / "r"
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    p = attnlab(
        "train", str(cfg), "--out", "r", "--quiet", "--set", PARTS[0], cwd=tmp_path, ok=False
    )
    assert p.returncode == 2, p.stderr
    assert f"{plugin}: sha256 {then} (trained) -> {now} (now)" in p.stderr, p.stderr
    assert "--allow-plugin-change" in p.stderr and "--restart" not in p.stderr
    assert {q: q.read_bytes() for q in before} == before  # plugins.json and all: untouched
    p = attnlab(
        "train",
        str(cfg),
        "--out",
        "r",
        "--quiet",
        "--set",
        PARTS[0],
        "--allow-plugin-change",
        cwd=tmp_path,
    )
    record = json.loads((run / "plugins.json").read_text())
    assert [r["sha256"] for r in record["plugins"]] == [now]
    (old,) = record["history"]
    assert [r["sha256"] for r in old["plugins"]] == [then]
    assert old["until_step"] == 2 and old["allowed_by"] == "--allow-plugin-change"
