"""The attention engine's three plugin examples, one file each, run through every command like a
built-in part (issue 34): a per-head score temperature (a score_mod with a head-scale fold), sigmoid
attention (a normaliser) and a dilated-window mask. Each passes ``attnlab check`` (its fused path
equal to its explicit one, cached decoding equal to the full forward), trains, generates with the
KV cache (equal to decoding without it), exports to a folder transformers loads in a fresh
interpreter where attnlab cannot be imported (the exported code runs the engine's SDPA /
block-sparse / explicit paths), and ``inspect`` draws its maps."""

from __future__ import annotations

import json
import sys

import pytest

from attnlab.cli import main
from tests.helpers.data import run_config
from tests.helpers.paths import EXAMPLES

#: (file, slot, kind, options, the path the engine takes when training on CPU)
PLUGINS = [
    ("score_temperature.py", "score", "temperature", {"init": 0.7}, "sdpa"),
    ("sigmoid_attention.py", "score", "sigmoid_attention", {}, "explicit"),
    ("dilated_window.py", "mask", "dilated_window", {"width": 4, "dilation": 3}, "block_sparse"),
]


def _attnlab(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> str:
    capsys.readouterr()
    assert main(list(args)) == code
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return out


@pytest.mark.parametrize(
    ("file", "slot", "kind", "options", "path"), PLUGINS, ids=[p[2] for p in PLUGINS]
)
def test_an_engine_plugin_runs_through_check_train_generate_export_and_inspect(
    tmp_path, data_dir, capsys, monkeypatch, file, slot, kind, options, path
) -> None:
    monkeypatch.chdir(tmp_path)
    plugin = str(EXAMPLES / file)
    spec = ",".join(f"{k}={v}" for k, v in options.items())
    out = _attnlab(capsys, "check", "--plugin", plugin, f"{slot}:{kind}" + (f",{spec}" if spec else ""),
                   "--no-compile", "--no-export", "--json")  # fmt: skip
    (report,) = json.loads(out)
    status = {r["name"]: r["status"] for r in report["results"]}
    assert status["fused"] == "passed" and status["kv_cache"] == "passed", report
    assert "failed" not in status.values(), report

    cfg = run_config(tmp_path / "run.toml", data_dir.parent / "corpus.jsonl", data_dir,
                     max_steps=2, batch_size=2, warmup_steps=1, eval_every=2, eval_batches=1,
                     checkpoint_every=2, log_every=1)  # fmt: skip
    sets = [f"model.{slot}.kind={kind}", *(f"model.{slot}.{k}={v}" for k, v in options.items())]
    _attnlab(capsys, "train", str(cfg), "--out", "run", "--quiet", "--plugin", plugin,
             *(a for s in sets for a in ("--set", s)))  # fmt: skip
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "finished"

    gen = ("generate", "run", "--prompt", "the cat sat", "--max-new-tokens", "8",
           "--temperature", "0")  # fmt: skip
    cached = _attnlab(capsys, *gen)
    assert cached.startswith("the cat sat") and cached == _attnlab(capsys, *gen, "--no-cache")

    from attnlab.hf.export import load_source
    from attnlab.model.attention import AttentionCore

    model, _, tok, _, _ = load_source(tmp_path / "run")
    model.train()
    model(model_input(tok)).logits.sum().backward()
    (core, *_) = [m for m in model.modules() if isinstance(m, AttentionCore)]
    assert core.engine.last_plan.path == path, core.engine.last_plan

    pytest.importorskip("transformers")
    _attnlab(capsys, "export", "run", "--out", "hf")
    from attnlab.hf.verify import check_exports

    (check,) = check_exports([(tmp_path / "hf", model.eval(), tok)], new_tokens=6, pipeline=False)
    assert check.passed, check.sentence()

    _attnlab(capsys, "inspect", "run", "--prompt", "the cat sat on the mat", "--out", "page.html")
    assert (tmp_path / "page.html").stat().st_size > 0


def model_input(tok):
    import torch

    return torch.tensor([tok.encode("the cat sat on the mat, and the dog")])


def test_a_plugin_mods_parameter_gets_its_gradient_through_a_bias_it_scales(float64) -> None:
    """The temperature's mod is no nn.Module (it holds its part's Parameter); after a learned
    bias (T5) its gain multiplies the bias, and the fused block-sparse path must carry that
    gradient as the explicit path does (the battery's "fused" property caught its loss)."""
    import torch

    from attnlab.model.engine import AttentionEngine, AttentionSpec, EngineOptions, Sliding, T5Bias
    from attnlab.parts import load_plugin

    record = load_plugin(str(EXAMPLES / "score_temperature.py"))
    temperature = sys.modules[record.module].HeadTemperature
    t5 = T5Bias(4, 8, 16)
    torch.nn.init.normal_(t5.table.weight)
    holder = torch.nn.Module()
    holder.theta = torch.nn.Parameter(torch.randn(4) * 0.3)
    theta = holder.theta
    q, k, v = (torch.randn(2, 4, 10, 8, requires_grad=True) for _ in range(3))
    got = []
    for path in ("auto", "explicit"):
        engine = AttentionEngine(
            AttentionSpec(Sliding(3), (t5, temperature(holder))), EngineOptions(path=path)
        )
        out, _ = engine(q, k, v)
        got.append((out, *torch.autograd.grad(out.square().sum(), [q, theta, t5.table.weight])))
    assert engine.last_plan.path == "explicit"
    for a, b in zip(*got):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
