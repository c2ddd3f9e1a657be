"""The core install works without any extra, and each extra's entry point names its install line.

A fresh interpreter blocks every optional package (an import hook on ``sys.meta_path`` that raises
``ModuleNotFoundError``, as if they were not installed), then imports every attnlab module, runs
the core commands (``--help``, ``params``, ``data prepare``, ``train``, compare's statistics) and
calls each entry point of an extra, which must fail with ``pip install 'attnlab[EXTRA]'``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from attnlab.base.extras import EXTRAS, install_line
from tests.helpers.paths import ROOT, SRC

OPTIONAL = (
    "transformers",
    "peft",
    "accelerate",
    "gguf",
    "lm_eval",
    "datasets",
    "pyarrow",
    "scipy",
    "psutil",
    "x_transformers",
    "tensorboard",
    "wandb",
)

SCRIPT = textwrap.dedent(
    r"""
    import contextlib, importlib, importlib.abc, io, json, pkgutil, sys

    BLOCKED = set(sys.argv[2].split(","))

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    for name in list(sys.modules):
        if name.split(".")[0] in BLOCKED:
            del sys.modules[name]
    sys.meta_path.insert(0, Blocker())
    work = sys.argv[1]
    out = {"import_errors": {}, "calls": {}}

    import attnlab
    from attnlab.cli import main

    for info in pkgutil.walk_packages(attnlab.__path__, "attnlab."):
        # the lm-eval plugin module itself (loaded only by lm-eval); python -m entry points;
        # attnlab.hf, whose classes subclass transformers' (reached through `attnlab export` and
        # `train --init-from`, which name their extra: checked below)
        if (
            info.name == "attnlab.eval.harness"
            or info.name.endswith("__main__")
            or info.name.split(".")[:2] == ["attnlab", "hf"]
        ):
            continue
        try:
            importlib.import_module(info.name)
        except Exception as e:
            out["import_errors"][info.name] = repr(e)

    def call(key, fn):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = fn()
            except SystemExit as e:  # sys.exit("message") prints it and exits 1
                rc = e.code if not isinstance(e.code, str) else err.write(e.code) and 1
        out["calls"][key] = {"rc": rc, "stderr": err.getvalue()}

    with open(f"{work}/docs.jsonl", "w") as f:
        for i in range(40):
            f.write(json.dumps({"text": f"document {i}: " + "the cat sat on the mat. " * 8}) + "\n")
    open(f"{work}/t.parquet", "wb").close()

    call("help", lambda: main(["--help"]))
    call("params", lambda: main(["params", "tiny"]))
    call("prepare", lambda: main(["data", "prepare", "--corpus", f"{work}/docs.jsonl",
                                  "--out", f"{work}/data", "--no-progress"]))
    call("train", lambda: main(["train", "tiny", "--out", f"{work}/run",
                                "--set", f"data.dir={work}/data",
                                "--set", f"data.corpus={work}/docs.jsonl",
                                "--set", "train.max_steps=2", "--set", "train.warmup_steps=1",
                                "--set", "train.eval_every=2", "--set", "train.eval_batches=1"]))
    from attnlab.experiments.reports.stats import paired_test
    out["p_ttest"] = paired_test([3.0, 3.1, 3.05], [2.9, 3.0, 3.0]).p_ttest

    call("probe", lambda: main(["probe", "--out", f"{work}/probe"]))
    call("export", lambda: main(["export", f"{work}/run", "--out", f"{work}/exported"]))
    call("init_from", lambda: main(["train", "tiny", "--init-from", "hf:gpt2",
                                    "--out", f"{work}/init"]))
    call("eval_hf", lambda: main(["eval", f"hf:{work}", "--tasks", "perplexity"]))
    call("hf_corpus", lambda: main(["data", "prepare", "--corpus", "hf:wikitext-2",
                                    "--out", f"{work}/hf", "--no-progress"]))
    call("parquet", lambda: main(["data", "prepare", "--corpus", f"{work}/t.parquet",
                                  "--out", f"{work}/pq", "--no-progress"]))
    call("auto_tokenizer", lambda: main(["data", "prepare", "--corpus", f"{work}/docs.jsonl",
                                         "--tokenizer", "hf:gpt2", "--out", f"{work}/at",
                                         "--no-progress"]))
    call("bench_memory", lambda: main(["bench", "--sections", "memory"]))
    from attnlab.eval import lm_eval_cli
    call("lm_eval_cli", lm_eval_cli.main)
    sys.argv = ["attnlab-lm-eval", "--help"]
    call("lm_eval_cli_help", lm_eval_cli.main)

    out["imported_optional"] = sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)
    print("RESULT " + json.dumps(out))
    """
)


def _run_lean(tmp_path: Path) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *sys.path])
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), ",".join(OPTIONAL)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_core_works_without_extras_and_entry_points_name_the_extra(tmp_path: Path) -> None:
    out = _run_lean(tmp_path)
    assert out["import_errors"] == {}
    assert out["imported_optional"] == []
    calls = out["calls"]
    for core in ("help", "params", "prepare", "train"):
        assert calls[core]["rc"] == 0, (core, calls[core]["stderr"][-2000:])
    assert (tmp_path / "data" / "meta.json").is_file()
    assert (tmp_path / "run" / "status.json").is_file()
    assert 0.0 < out["p_ttest"] < 1.0
    expected = {
        "probe": "probe",
        "export": "hf",
        "init_from": "hf",
        "eval_hf": "eval",
        "lm_eval_cli": "eval",
        "lm_eval_cli_help": "eval",
        "hf_corpus": "data",
        "parquet": "data",
        "auto_tokenizer": "data",
        "bench_memory": "bench",
    }
    for key, extra in expected.items():
        call = calls[key]
        assert call["rc"] == 2, (key, call["rc"])  # a missing extra exits 2 everywhere
        assert install_line(extra) in call["stderr"], (key, call["stderr"][-2000:])
        assert "Traceback" not in call["stderr"], (key, call["stderr"][-2000:])


def test_extras_table_matches_pyproject() -> None:
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = pyproject["project"]["optional-dependencies"]
    for extra in EXTRAS:
        assert extra in declared, extra
    in_all = set(declared["all"][0].split("[")[1].rstrip("]").split(","))
    assert set(EXTRAS) - {"offline"} == in_all  # offline: local data, not a feature
    assert {"all", "offline"} <= set(declared["test"][0].split("[")[1].rstrip("]").split(","))
    core = " ".join(pyproject["project"]["dependencies"])
    for heavy in ("transformers", "peft", "lm-eval", "datasets", "scipy", "accelerate", "gguf"):
        assert heavy not in core, heavy
