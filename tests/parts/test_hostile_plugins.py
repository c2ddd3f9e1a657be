"""Hostile plugins (issue 32): plugin code and part declarations that ``check``, ``train`` and a
resume must not take at face value. Each class of the issue's part-API findings has a test that
fails on the code before the fix: a plugin's ``sys.exit()``, helper modules outside its
identity, declarations that leave a part unused, a correct raw ``nn.Parameter`` refused, a
moved plugin that cannot resume, NaN read as agreement, a part raising or allocating while it is
built, a silent ``check``, terminal markup eating user text, and what a part author must guess."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.commands.check import COLUMNS
from attnlab.parts import PluginError
from attnlab.parts.plugins import load_plugin, source_hash
from attnlab.testing import check_part
from tests.helpers.data import run_config
from tests.helpers.paths import ROOT


def attnlab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI in a fresh process (plugins import once per process), never a traceback."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200"}
    p = subprocess.run(
        [sys.executable, "-m", "attnlab", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "Traceback" not in p.stderr + p.stdout, p.stderr
    return p


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def quick(slot: str, kind: str, **options):
    return check_part(slot, kind, compile=False, export=False, **options)


def train_args(tmp_path: Path, data_dir: Path, out: str, *extra: str, **train) -> list[str]:
    """A two-step ``tiny`` training on the module's data (a checkpoint every step)."""
    settings = dict(max_steps=2, batch_size=2, warmup_steps=1, eval_every=2, eval_batches=1)
    settings.update(checkpoint_every=1, log_every=1, **train)
    cfg = run_config(tmp_path / "run.toml", data_dir.parent / "corpus.jsonl", data_dir, **settings)
    return ["train", str(cfg), "--out", str(tmp_path / out), "--quiet", *extra]


def as_if_killed_after_step_1(run: Path) -> None:
    ckpts = run / "checkpoints"
    shutil.rmtree(ckpts / "step_0000002")
    (ckpts / "latest").write_text("step_0000001")
    (run / "status.json").unlink()


# ---------------------------------------------------------------- 1. sys.exit() in plugin code

QUITTER = '''
import sys
from torch import nn
from attnlab.parts import SideBranchPart, register


@register("side_branch", "{kind}")
class Quitter(SideBranchPart):
    """Calls sys.exit(0) in a training forward (the check's models run in eval mode)."""

    @classmethod
    def param_count(cls, opts, dims):
        return dims.d_model * dims.d_model

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.w = nn.Linear(dims.d_model, dims.d_model, bias=False)

    def forward(self, x):
        if self.training:
            sys.exit(0)
        return self.w(x)
'''


def test_a_plugin_that_exits_while_imported_is_an_error_naming_it(tmp_path):
    path = write(tmp_path / "leaver.py", "import sys\n\nsys.exit(0)\n")
    p = attnlab("check", "--plugin", str(path), "--no-compile", "--no-export")
    assert p.returncode == 2, p.stdout + p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith(f"attnlab check: error: plugin '{path}' failed to import")
    assert f"raised sys.exit(0) at {path}:3 (sys.exit(0))" in line
    assert "must raise an exception" in line
    # any BaseException that is not a Ctrl-C, in-process too
    odd = write(tmp_path / "odd.py", "class Odd(BaseException):\n    pass\n\nraise Odd()\n")
    with pytest.raises(PluginError, match=r"raised Odd \(a BaseException that is not an Exc"):
        load_plugin(str(odd))


def test_a_part_that_exits_in_forward_fails_the_check_which_goes_on(tmp_path):
    path = write(tmp_path / "quitter_c.py", QUITTER.format(kind="quitter_c"))
    load_plugin(str(path))
    report = quick("side_branch", "quitter_c")  # no SystemExit escapes
    # the properties that run its forward in training mode meet its exit
    assert {r.name for r in report.failures()} == {"gradcheck", "coord_check"}, report.summary()
    msg = report.result("gradcheck").message()
    assert f"raised sys.exit(0) at {path}:" in msg and "while this was checked" in msg
    p = attnlab("check", "--plugin", str(path), "--no-compile", "--no-export")
    assert p.returncode == 1 and "1 of 1 part(s) failed 2 propert(ies)" in p.stdout


def test_train_with_a_part_that_exits_fails_and_records_it(tmp_path, data_dir, capsys):
    path = write(tmp_path / "quitter_t.py", QUITTER.format(kind="quitter_t"))
    args = train_args(tmp_path, data_dir, "r", "--plugin", str(path), "--skip-check")
    assert main([*args, "--set", "model.side_branch.kind=quitter_t"]) == 2
    err = capsys.readouterr().err
    assert f"attnlab train: error: plugin code raised sys.exit(0) at {path}:" in err
    status = json.loads((tmp_path / "r" / "status.json").read_text())
    assert status["status"] == "failed"
    assert status["reason"].startswith("PluginExitError: plugin code raised sys.exit(0)")


# ---------------------------------------------------------- 2. helpers are part of the plugin

HELPED = '''
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import {helper}  # noqa: E402
from attnlab.parts import SideBranchPart, register  # noqa: E402


@register("side_branch", "{kind}")
class Helped(SideBranchPart):
    """A running mean over time, computed by a helper module next to this file."""

    supports_kv_cache = False

    @classmethod
    def param_count(cls, opts, dims):
        return 0

    def forward(self, x):
        import {lazy}  # imported only when it runs

        return {lazy}.scale({helper}.mix(x))
'''
RUNNING_MEAN = """
import torch


def mix(x):
    n = torch.arange(1, x.shape[1] + 1, dtype=x.dtype, device=x.device).view(1, -1, 1)
    return x.cumsum(1) / n
"""
WHOLE_MEAN = "\n\ndef mix(x):\n    return x.mean(1, keepdim=True).expand_as(x)\n"
SCALE = "def scale(x):\n    return 0.5 * x\n"


def test_a_plugin_s_identity_covers_its_helpers_eager_and_lazy(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    helper = write(tmp_path / "helper_id.py", RUNNING_MEAN)
    lazy = write(tmp_path / "lazy_id.py", SCALE)
    plugin = write(
        tmp_path / "helped_id.py", HELPED.format(helper="helper_id", lazy="lazy_id", kind="h_id")
    )
    rec = load_plugin(str(plugin))
    assert {h.module: h.file for h in rec.helpers} == {
        "helper_id": str(helper),
        "lazy_id": str(lazy),
    }
    assert rec.sha256 != source_hash([plugin])  # the helpers are in it
    saved = rec.to_dict()["helpers"]
    assert {h["module"] for h in saved} == {"helper_id", "lazy_id"}
    assert all(len(h["sha256"]) == 64 for h in saved)


def test_check_of_a_plugin_checks_the_parts_its_helpers_register(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "path", list(sys.path))
    write(
        tmp_path / "parts_in_helper.py",
        "from attnlab.parts import SideBranchPart, register\n\n\n"
        "@register('side_branch', 'in_helper')\nclass InHelper(SideBranchPart):\n"
        "    @classmethod\n    def param_count(cls, opts, dims):\n        return 0\n\n"
        "    def forward(self, x):\n        return 0.5 * x\n",
    )
    plugin = write(
        tmp_path / "thin.py",
        "import sys\nfrom pathlib import Path\n\nsys.path.insert(0, str(Path(__file__).parent))\n"
        "import parts_in_helper  # noqa: E402, F401\n",
    )
    args = ["check", "--plugin", str(plugin), "--no-compile", "--no-export", "--json", "-q"]
    assert main(args) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [(r["slot"], r["kind"], r["source"]) for r in reports] == [
        ("side_branch", "in_helper", str(plugin))
    ]


def test_a_changed_helper_is_checked_again_and_refused_on_resume(tmp_path, data_dir):
    lab = tmp_path / "lab"
    helper = write(lab / "helper_r.py", RUNNING_MEAN)
    write(lab / "lazy_r.py", SCALE)
    plugin = write(lab / "helped.py", HELPED.format(helper="helper_r", lazy="lazy_r", kind="h_r"))
    sets = ("--plugin", str(plugin), "--set", "model.side_branch.kind=h_r")
    first = train_args(tmp_path, data_dir, "a", *sets)
    assert attnlab(*first).returncode == 0
    assert json.loads((tmp_path / "a" / "check.json").read_text())["parts"][0]["result"] == "passed"
    # a harmless edit of the helper: the run refuses to resume, naming the helper
    as_if_killed_after_step_1(tmp_path / "a")
    helper.write_text(RUNNING_MEAN + "\n# edited\n")
    p = attnlab(*first)
    assert p.returncode == 2, p.stderr
    assert f"helper {helper} (module helper_r) changed: sha256" in p.stderr
    assert "--allow-plugin-change" in p.stderr
    # the helper now reads the future: the cached pass no longer counts, the check runs again
    helper.write_text(WHOLE_MEAN)
    p = attnlab(*train_args(tmp_path, data_dir, "b", *sets))
    assert p.returncode == 2, p.stdout + p.stderr
    assert "the conformance check fails on side_branch.h_r" in p.stderr
    assert "causality: changing the tokens at and after position" in p.stderr


# ------------------------------------------------ 3. declarations that leave a part unused

POSITION = '''
import torch
from torch import nn
from attnlab.parts import PositionPart, register


@register("position", "{kind}")
class Kerple(PositionPart):
    """KERPLE-log: bias = -r1 log(1 + r2 |i - j|) per head."""
{flag}
    @classmethod
    def param_count(cls, opts, dims):
        return 2 * dims.n_heads

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.r1 = nn.Parameter(torch.ones(dims.n_heads))
        self.r2 = nn.Parameter(torch.ones(dims.n_heads))

    def bias(self, q_pos, k_pos):
        d = (q_pos[:, None] - k_pos[None, :]).abs().to(self.r1.dtype)
        return -self.r1[:, None, None] * torch.log1p(self.r2[:, None, None].abs() * d)
'''
UNUSED = {
    "kerple without its flag": (
        POSITION.format(kind="kerple_bare", flag=""),
        "implements bias() but does not declare logit_bias = True, so the model never calls it",
    ),
    "a position part with only forward": (
        "from attnlab.parts import PositionPart, register\n\n\n"
        "@register('position', 'fwd_only')\nclass P(PositionPart):\n"
        "    def forward(self, x):\n        return x\n",
        "declares none of absolute = True (embed(positions) added to the token embeddings), "
        "logit_bias = True",
    ),
    "rotary without rotate": (
        "from attnlab.parts import PositionPart, register\n\n\n"
        "@register('position', 'half_rope')\nclass P(PositionPart):\n    rotary = True\n\n"
        "    def rotation(self, positions, dtype):\n        return positions\n",
        "declares rotary = True but implements no rotate()",
    ),
    "key_fold without logit_bias": (
        "from attnlab.parts import PositionPart, register\n\n\n"
        "@register('position', 'folded')\nclass P(PositionPart):\n    absolute = True\n"
        "    key_fold = staticmethod(lambda q, k, s, o: (q, k))\n\n"
        "    def embed(self, positions):\n        return positions\n",
        "it sets key_fold, which is read only with logit_bias = True",
    ),
    "a score transform with a misspelt on": (
        "from attnlab.parts import ScorePart, register\n\n\n"
        "@register('score', 'cap_typo')\nclass S(ScorePart):\n    on = 'prob'\n\n"
        "    def transform(self, s, allowed):\n        return s.tanh()\n\n"
        "    def forward(self, q, k, v, core, ctx):\n"
        "        return core.explicit(q, k, v, ctx, transform=self)\n",
        "implements transform(scores, allowed) but declares on = 'prob'",
    ),
    "a side branch without forward": (
        "from attnlab.parts import SideBranchPart, register\n\n\n"
        "@register('side_branch', 'no_forward')\nclass S(SideBranchPart):\n    pass\n",
        "it implements no forward(...)",
    ),
    "a norm without reset_norm": (
        "from attnlab.parts import NormPart, register\n\n\n"
        "@register('norm', 'no_reset')\nclass N(NormPart):\n"
        "    def forward(self, x):\n        return x\n",
        "implements neither reset_norm() nor init_weights(init)",
    ),
}


@pytest.mark.parametrize("case", list(UNUSED))
def test_a_part_its_declarations_leave_unused_is_refused_where_it_registers(case, tmp_path):
    source, words = UNUSED[case]
    path = write(tmp_path / "unused.py", source)
    with pytest.raises(PluginError) as e:
        load_plugin(str(path))
    assert "would be unused: " in str(e.value) and words in str(e.value), str(e.value)


def test_a_declared_kerple_part_enters_the_model_and_passes(tmp_path, capsys):
    path = write(
        tmp_path / "kerple.py", POSITION.format(kind="kerple", flag="    logit_bias = True\n")
    )
    load_plugin(str(path))
    report = quick("position", "kerple")
    assert report.passed, report.summary()
    assert report.result("effect").status == "passed"
    assert report.result("params").status == "passed"
    assert (
        main(["params", "tiny", "--plugin", str(path), "--set", "model.position.kind=kerple"]) == 0
    )
    assert "position" in capsys.readouterr().out


def test_a_part_with_no_effect_on_the_output_fails_effect(tmp_path):
    path = write(
        tmp_path / "zero_bias.py",
        "import torch\nfrom attnlab.parts import PositionPart, register\n\n\n"
        "@register('position', 'zero_bias')\nclass Z(PositionPart):\n    logit_bias = True\n\n"
        "    @classmethod\n    def param_count(cls, opts, dims):\n        return 0\n\n"
        "    def bias(self, q_pos, k_pos):\n"
        "        return torch.zeros(self.dims.n_heads, len(q_pos), len(k_pos))\n",
    )
    load_plugin(str(path))
    r = quick("position", "zero_bias").result("effect")
    assert r.status == "failed" and r.measured <= r.limit == 1e-10
    assert "position.zero_bias has no effect on the model's output" in r.message()
    assert (
        f"or emptying its slot changes the logits by {r.measured:.3g} (limit 1e-10)" in r.message()
    )


def test_effect_and_params_fail_a_part_the_models_do_not_hold():
    from attnlab.parts import registry
    from attnlab.testing import declarations, effect
    from attnlab.testing.cases import accepted, build, float64

    cls = registry.get("side_branch", "content_skip").cls
    ok, _ = accepted("query", "linear", {})  # models without that side branch
    case, cfg = ok[0]
    with float64():
        built = [(case, build(cfg))]
        r = effect.check("side_branch.content_skip", cls, "side_branch", built)
        counted = declarations.check_params("side_branch.content_skip", cls, built)
    assert r.status == "failed"
    assert f"the model of this config holds no {cls.__name__} module" in r.detail
    assert counted.status == "failed"  # was "skipped": no config builds the part
    assert "its parameters are neither counted nor trained" in counted.detail


# ------------------------------------------ 4. a raw nn.Parameter set in __init__ is an init

RAW = '''
import torch
from torch import nn
from attnlab.parts import SideBranchPart, register


@register("side_branch", "{kind}")
class Scaled(SideBranchPart):
    """x~ * g, g a raw parameter."""

    @classmethod
    def param_count(cls, opts, dims):
        return dims.d_model

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.g = nn.Parameter({init})

    def forward(self, x):
        return x * self.g
'''


def test_a_raw_parameter_given_values_in_init_passes_and_trains(tmp_path, data_dir):
    path = write(
        tmp_path / "raw.py", RAW.format(kind="raw_ok", init="torch.full((dims.d_model,), 0.5)")
    )
    load_plugin(str(path))
    r = quick("side_branch", "raw_ok").result("init")
    assert r.status == "passed", r.message()
    assert "init_weights sets 0, 2 keep the constructor's values" in r.detail
    args = train_args(tmp_path, data_dir, "r", "--plugin", str(path))
    assert main([*args, "--set", "model.side_branch.kind=raw_ok"]) == 0
    assert json.loads((tmp_path / "r" / "check.json").read_text())["parts"][0]["result"] == "passed"


def test_a_parameter_nothing_initialises_still_fails_init(tmp_path):
    path = write(
        tmp_path / "empty.py", RAW.format(kind="raw_empty", init="torch.empty(dims.d_model)")
    )
    load_plugin(str(path))
    r = quick("side_branch", "raw_empty").result("init")
    assert r.status == "failed"
    assert "side_branch.raw_empty's 0.g, 1.g is not initialised" in r.message()
    assert "set it in init_weights(init)" in r.message()


# ------------------------------------------- 5. a moved plugin resumes with its own command


def test_a_run_resumes_with_its_own_command_and_a_moved_plugin_with_its_new_path(
    tmp_path, data_dir
):
    plugin = write(
        tmp_path / "ideas" / "my_ideas.py", (ROOT / "examples" / "my_ideas.py").read_text()
    )
    args = train_args(tmp_path, data_dir, "r", "--set", "model.query.kind=gated")
    assert attnlab(*args, "--plugin", str(plugin)).returncode == 0
    as_if_killed_after_step_1(tmp_path / "r")
    p = attnlab(*args)  # the run's own command, without naming the plugin again
    assert p.returncode == 0 and "resumed from step 1" in p.stdout, p.stderr
    as_if_killed_after_step_1(tmp_path / "r")
    moved = tmp_path / "elsewhere" / "my_ideas.py"
    moved.parent.mkdir()
    plugin.rename(moved)
    p = attnlab(*args)
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    sha = source_hash([moved])[:12]
    assert line.startswith(f"attnlab train: error: plugin file {plugin} does not exist; the run")
    assert "If it moved, pass --plugin NEWPATH: a file named my_ideas.py" in line
    assert f"accepted when its sha256 matches the recorded {sha}" in line
    p = attnlab(*args, "--plugin", str(moved))
    assert p.returncode == 0 and "resumed from step 1" in p.stdout, p.stderr
    assert f"sha256 recorded {sha}, now {sha} (the same source)" in p.stderr


# ---------------------------------------------------------------- 6. NaN is not agreement

NAN_FUTURE = '''
from attnlab.parts import SideBranchPart, register


@register("side_branch", "nan_future")
class NanFuture(SideBranchPart):
    """Reads the whole sequence (the future too) and writes NaN at position 0."""

    supports_kv_cache = False

    @classmethod
    def param_count(cls, opts, dims):
        return 0

    def forward(self, x):
        m = x.mean(1, keepdim=True).expand_as(x).clone()
        m[:, 0] = float("nan")
        return m
'''


def test_a_nan_output_fails_causality_with_its_own_message(tmp_path):
    load_plugin(str(write(tmp_path / "nan_future.py", NAN_FUTURE)))
    report = quick("side_branch", "nan_future")
    r = report.result("causality")
    assert r.status == "failed", report.summary()
    assert (
        "gives 5760 non-finite outputs of 5760 (NaN or infinity; the first at position 0)"
        in r.detail
    )
    assert {"causality", "batch", "state_dict", "effect"} <= {x.name for x in report.failures()}


def test_comparisons_count_nan_and_infinity_as_differences():
    from attnlab.testing.finite import difference

    a = torch.zeros(2, 3)
    nan, inf = a.clone(), a.clone()
    nan[0, 0], inf[1, 2] = math.nan, math.inf
    assert difference(a, a) == 0.0
    assert difference(nan, nan) == math.inf and difference(a, nan) == math.inf
    assert difference(inf, inf) == math.inf
    assert difference(a, torch.zeros(3, 2)) == math.inf


# ------------------------------------ 7. a part that raises or allocates while it is built

BUILD = """
import torch
from attnlab.parts import SideBranchPart, register


@register("side_branch", "{kind}")
class Bad(SideBranchPart):
    @classmethod
    def param_count(cls, opts, dims):
        return 0

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        {init}

    def forward(self, x):
        {forward}
        return x
"""


def test_a_part_raising_in_init_is_a_build_failure_with_progress(tmp_path):
    path = write(
        tmp_path / "raises.py",
        BUILD.format(kind="raises", init="raise ValueError('no table for you')", forward="pass"),
    )
    p = attnlab("check", "--plugin", str(path), "--no-compile", "--no-export")
    assert p.returncode == 1
    out = " ".join(p.stdout.split())
    assert (
        "side_branch.raises build: side_branch.raises raised ValueError while its small model "
        "was built: no table for you [decoder/causal/learned]"
    ) in out
    assert "refuse the settings the part cannot take in Options.check(model_cfg)" in out
    assert "attnlab check: [1/1] side_branch.raises ...\n" in p.stderr
    assert "side_branch.raises build: failed" in p.stderr


def test_a_huge_buffer_is_refused_before_anything_is_allocated(tmp_path):
    init = "self.register_buffer('table', torch.zeros(2**42))"
    load_plugin(
        str(write(tmp_path / "huge.py", BUILD.format(kind="huge", init=init, forward="pass")))
    )
    report = quick("side_branch", "huge")
    (r,) = report.results
    assert r.name == "build" and r.status == "failed"
    assert "side_branch.huge's small models would need " in r.detail
    assert " TB of parameters and buffers in " in r.detail  # 2^42 float64 per layer, no less
    assert "nothing was built" in r.detail and r.measured > 2**42 * 8 > r.limit


def test_a_forward_that_cannot_allocate_fails_with_a_memory_message(tmp_path):
    fwd = "torch.empty(2**42, dtype=torch.float64)"
    load_plugin(str(write(tmp_path / "hog.py", BUILD.format(kind="hog", init="pass", forward=fwd))))
    report = quick("side_branch", "hog")
    r = report.result("causality")
    assert r.status == "failed"
    assert "side_branch.hog ran out of memory while this was checked (RuntimeError:" in r.detail
    assert "declare activation_elements(opts, dims, seq_len)" in r.fix


# -------------------------------------------- 8. progress, and user text printed as text


def test_check_shows_its_progress_and_keeps_brackets_in_names(capsys):
    p = attnlab("check", "query:nonlinear,ratio=0.25", "--no-compile", "--no-export")
    assert p.returncode == 0, p.stderr
    assert "│ query.nonlinear[ratio=0.25] │" in p.stdout
    lines = p.stderr.splitlines()
    assert lines[0] == "attnlab check: [1/1] query.nonlinear[ratio=0.25] ..."
    assert "attnlab check: [1/1] query.nonlinear[ratio=0.25] causality: passed (" in p.stderr
    assert sum("query.nonlinear[ratio=0.25] " in line for line in lines) == 1 + len(COLUMNS)
    assert main(["check", "query:nonlinear,ratio=0.25", "--no-compile", "--no-export", "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_parts_params_and_tables_print_paths_and_names_as_text(tmp_path, capsys, monkeypatch):
    from rich.console import Console

    from attnlab.eval.results import render_table

    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.chdir(tmp_path)  # `parts` prints the plugin's path relative to here
    folder = tmp_path / "v[ratio=0.25]"
    plugin = write(folder / "my_ideas.py", (ROOT / "examples" / "my_ideas.py").read_text())
    assert main(["parts", "side_branch", "--plugin", str(plugin)]) == 0
    assert " v[ratio=0.25]/my_ideas.py " in capsys.readouterr().out
    write(folder / "[bold]cfg.toml", 'extends = "tiny"\n')
    assert main(["params", "v[ratio=0.25]/[bold]cfg.toml"]) == 0
    assert "v[ratio=0.25]/[bold]cfg.toml: parameters by part" in capsys.readouterr().out
    con = Console(record=True, width=200)
    con.print(render_table({"mc:[red]items.jsonl": {"metrics": {"acc": 0.5}}}, "[x] run"))
    text = con.export_text()
    assert "mc:[red]items.jsonl" in text and "[x] run" in text


# --------------------------------------------------------- 9. what a part author must know


def test_contracts_name_every_contract_class_and_the_position_declarations():
    from attnlab.parts import SLOTS

    contracts = (ROOT / "docs" / "CONTRACTS.md").read_text()
    register_line = contracts[contracts.index("- `@register(slot, kind)`") :]
    register_line = register_line[: register_line.index("\n- ")]
    for slot in SLOTS.values():
        assert f"`{slot.base.__name__}`" in register_line, slot.base.__name__
    for words in (
        "`absolute = True`",
        "`logit_bias = True`",
        "`rotary = True`",
        "`init_weights(init)` receives",
        "`init.std`",
        "`init.out_std`",
    ):
        assert words in contracts, words
    readme = (ROOT / "README.md").read_text()
    assert "logit_bias = True" in readme and "init_weights" in readme
