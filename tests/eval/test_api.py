"""``evaluate`` / ``attnlab eval``: targets (attnlab runs and checkpoints, Hugging Face dirs,
probe dirs), tasks, results merged into RUN_DIR/eval/results.json, the cloze builder CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from attnlab.base.errors import UserError
from attnlab.cli import main
from attnlab.data import prepare
from attnlab.eval import evaluate, load_language_model
from attnlab.eval.hf import HFCausalLM
from attnlab.eval.native import AttnlabLM
from attnlab.eval.registry import split_tasks, task_key
from attnlab.eval.results import load_results
from tests.helpers import paths
from tests.helpers.eval_doubles import (
    ByteTokenizer,
    CausalBytesModel,
    byte_hf_tokenizer,
    tiny_hf_model,
)

torch.set_num_threads(1)
FIXTURES = paths.FIXTURES / "eval"
WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "it", "then", "sun"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hf")
    tiny_hf_model("gpt_neox", max_length=256).save_pretrained(d)
    byte_hf_tokenizer().save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A 4-step attnlab run on a tiny story corpus, with an explicit data dir."""
    root = tmp_path_factory.mktemp("run")
    rng = random.Random(0)
    corpus = root / "story.jsonl"
    with open(corpus, "w", encoding="utf-8") as f:
        for _ in range(60):
            sentences = [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(4)]
            text = " ".join(s.capitalize() + "." for s in sentences)
            f.write(json.dumps({"text": text}) + "\n")
    prepare(str(corpus), "bytes", root / "data", val_fraction=0.2, progress=False)
    cfg = root / "exp.toml"
    cfg.write_text(
        "\n".join(
            [
                'extends = "tiny"',
                "[data]",
                f"corpus = {json.dumps(str(corpus))}",
                f"dir = {json.dumps(str(root / 'data'))}",
                "seq_len = 32",
                "val_fraction = 0.2",
                "[train]",
                "max_steps = 4",
                "batch_size = 4",
                "warmup_steps = 1",
                "eval_every = 2",
                "checkpoint_every = 2",
                "eval_batches = 1",
                "threads = 1",
                "[eval]",
                'tasks = ["perplexity"]',
                "limit = 3",
            ]
        )
        + "\n"
    )
    assert main(["train", str(cfg), "--out", str(root / "run"), "--quiet"]) == 0
    return root / "run"


def test_attnlab_lm_logits_ignore_right_padding():
    lm = AttnlabLM(CausalBytesModel(), ByteTokenizer(), max_length=32, device="cpu")
    a, b = lm.encode("hello there"), lm.encode("hi")
    batch = torch.zeros(2, len(a), dtype=torch.long)
    batch[0], batch[1, : len(b)] = torch.tensor(a), torch.tensor(b)
    out = lm.logits(batch)
    assert out.dtype == torch.float32 and out.shape == (2, len(a), 257)
    alone = lm.logits(torch.tensor([b]))
    assert torch.allclose(out[1, : len(b)], alone[0], atol=1e-5)


def test_tasks_parse_and_key():
    assert split_tasks(["perplexity,cloze:a/b.jsonl", " arc:x.jsonl "]) == [
        "perplexity",
        "cloze:a/b.jsonl",
        "arc:x.jsonl",
    ]
    assert task_key("cloze:dir/my_set.jsonl") == "cloze:my_set"
    assert task_key("perplexity:data/wiki-bytes/") == "perplexity:wiki-bytes"
    with pytest.raises(UserError, match="Did you mean cloze"):
        task_key("clozee:x")


def test_targets_resolve_or_explain(hf_dir, tmp_path):
    lm = load_language_model(f"hf:{hf_dir}", device="cpu", max_length=64)
    assert isinstance(lm, HFCausalLM) and lm.max_length == 64 and lm.prefix_id == 256
    assert isinstance(load_language_model(str(hf_dir), device="cpu"), HFCausalLM)
    with pytest.raises(UserError, match="does not exist"):
        load_language_model(tmp_path / "missing")
    with pytest.raises(UserError, match="is not an evaluation target"):
        load_language_model(tmp_path)
    with pytest.raises(UserError, match="GGUF file"):
        load_language_model(tmp_path / "x.gguf")
    with pytest.raises(UserError, match="must be between 1 and"):
        load_language_model(f"hf:{hf_dir}", device="cpu", max_length=10_000)


def test_directory_kinds_come_from_the_registry(monkeypatch, tmp_path):
    from attnlab.eval import targets

    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "probe.json").write_text("{}")
    monkeypatch.setattr(targets, "_KINDS", {})
    monkeypatch.setattr(targets, "_discovered", True)  # no entry points either
    with pytest.raises(UserError, match=r"recognised once attnlab\.probe is imported"):
        load_language_model(probe)
    seen = []

    def load(path, device):
        seen.append((path, device))
        return HFCausalLM(
            tiny_hf_model("llama"), byte_hf_tokenizer(), device=device, results_dir=path
        )

    targets.register_target_kind(targets.TargetKind("probe", ("probe.json",), load))
    lm = load_language_model(probe, device="cpu")
    assert isinstance(lm, HFCausalLM) and seen[-1] == (probe, torch.device("cpu"))
    assert lm.results_dir == probe
    load_language_model(f"probe:{probe}", device="cpu")  # the explicit prefix
    assert seen[-1][0] == probe
    res = evaluate(lm, ["arc:" + str(FIXTURES / "arc.jsonl")], limit=2)
    assert load_results(probe / "eval" / "results.json")["tasks"]["arc:arc"] == res["arc:arc"]


def test_the_probe_package_registers_its_directories():
    from attnlab.eval.targets import target_kinds
    from attnlab.probe import PROBE_TARGET

    assert target_kinds()["probe"] is PROBE_TARGET
    assert "probe.json" in PROBE_TARGET.markers


def test_evaluate_run_merges_results_per_task(run_dir, capsys):
    lm = load_language_model(run_dir, device="cpu")
    assert isinstance(lm, AttnlabLM) and lm.max_length == 128
    assert lm.data_dir == run_dir.parent / "data"
    first = evaluate(lm, ["perplexity"], limit=3, stride=32)
    m = first["perplexity"]["metrics"]
    assert m["documents"] == 3 and m["tokens"] > 0 and 0 < m["bits_per_byte"] < 10
    assert m["loss"] == pytest.approx(m["bits_per_byte"] * m["bytes"] / m["tokens"] * 0.6931, 1e-3)
    cloze = "cloze:" + str(FIXTURES / "lambada.jsonl")
    evaluate(lm, [cloze], limit=2)
    stored = load_results(run_dir / "eval" / "results.json")["tasks"]
    assert set(stored) == {"perplexity", "cloze:lambada"}
    assert stored["perplexity"]["limit"] == 3 and stored["perplexity"]["stride"] == 32
    assert stored["cloze:lambada"]["metrics"]["n"] == 2
    evaluate(lm, ["perplexity"], limit=2)  # replaces only that task's entry
    stored = load_results(run_dir / "eval" / "results.json")["tasks"]
    assert stored["perplexity"]["metrics"]["documents"] == 2 and "cloze:lambada" in stored


def test_checkpoint_dir_target(run_dir):
    ckpts = sorted((run_dir / "checkpoints").glob("step_*"))
    assert len(ckpts) >= 2
    early = load_language_model(ckpts[0], device="cpu")
    late = load_language_model(run_dir, device="cpu")
    assert early.step == 2 and early.name.endswith("@" + ckpts[0].name)
    x = torch.tensor([early.encode("the cat sat")])
    assert not torch.allclose(early.logits(x), late.logits(x))


def test_cli_eval_run_uses_config_defaults_and_prints_a_table(run_dir, capsys):
    assert main(["eval", str(run_dir), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "perplexity" in out and "bits_per_byte" in out and "results.json" in out
    stored = load_results(run_dir / "eval" / "results.json")["tasks"]["perplexity"]
    assert stored["limit"] == 3  # from the run's [eval] section


def test_perplexity_windows_default_to_the_training_length(run_dir, capsys):
    """A run trained at data.seq_len=32 (context 128) is scored in 32-token windows unless
    --max-length says otherwise; the result records the length used."""
    fed = []
    lm = load_language_model(run_dir, device="cpu")
    logits = lm.logits
    lm.logits = lambda x, *a, **k: (fed.append(x.shape[1]), logits(x, *a, **k))[1]
    assert lm.max_length == 128 and lm.trained_length == 32 and lm.perplexity_length == 32
    res = evaluate(lm, ["perplexity"], limit=3, save=False)["perplexity"]
    assert max(fed) == 32 and (res["max_length"], res["stride"]) == (32, 16)
    out = {}
    for extra in ([], ["--max-length", "32"], ["--max-length", "128"]):
        args = ["eval", str(run_dir), "--tasks", "perplexity", "--limit", "3", "--no-progress"]
        assert main([*args, "--no-save", "--json", *extra]) == 0
        out[" ".join(extra)] = json.loads(capsys.readouterr().out)["perplexity"]
    assert out[""]["metrics"] == res["metrics"] == out["--max-length 32"]["metrics"]
    assert out[""]["max_length"] == 32 and out["--max-length 128"]["max_length"] == 128
    assert out["--max-length 128"]["metrics"]["loss"] != res["metrics"]["loss"]  # docs > 32


def test_cli_eval_hf_to_out_file_and_errors(hf_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = tmp_path / "res.json"
    args = ["eval", f"hf:{hf_dir}", "--device", "cpu", "--no-progress", "--out", str(out)]
    tasks = f"hellaswag:{FIXTURES / 'hellaswag.jsonl'},perplexity:{FIXTURES / 'texts.jsonl'}"
    assert main([*args, "--tasks", tasks, "--limit", "2"]) == 0
    data = json.loads(out.read_text())["tasks"]
    assert data["hellaswag:hellaswag"]["metrics"]["n"] == 2
    assert data["perplexity:texts"]["metrics"]["documents"] == 2
    capsys.readouterr()
    assert main([*args, "--tasks", "clozee:x.jsonl"]) == 2
    assert "Did you mean cloze" in capsys.readouterr().err
    assert main([*args]) == 2
    assert "give --tasks" in capsys.readouterr().err
    assert main(["eval", f"hf:{hf_dir}", "--tasks", "lambada"]) == 2  # hub: offline here
    assert "cloze:FILE.jsonl" in capsys.readouterr().err


def test_cli_build_cloze_from_a_prepared_corpus(run_dir, tmp_path, capsys):
    data_dir = run_dir.parent / "data"
    out = tmp_path / "cloze.jsonl"
    args = ["--build-cloze", str(data_dir), "--out", str(out), "--n", "5"]
    code = main(["eval", *args, "--min-context-words", "10"])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert 1 <= len(rows) <= 5 and all(r["text"].rsplit(" ", 1)[1].isalpha() for r in rows)
    assert main(["eval", "--build-cloze", str(data_dir)]) == 2  # needs --out


def test_corpus_perplexity_retokenizes_only_when_tokenizers_differ(run_dir):
    from attnlab.eval.corpus import corpus_documents

    data_dir = run_dir.parent / "data"
    native = AttnlabLM(CausalBytesModel(), ByteTokenizer(), max_length=64, device="cpu")
    docs, retok = corpus_documents(native, data_dir, limit=3)
    assert not retok and len(docs) == 3

    class ShiftedBytes(ByteTokenizer):  # same name, another vocabulary
        def encode(self, text):
            return [(b + 1) % 256 for b in text.encode("utf-8")]

    shifted = AttnlabLM(CausalBytesModel(), ShiftedBytes(), max_length=64, device="cpu")
    docs2, retok2 = corpus_documents(shifted, data_dir, limit=3)
    assert retok2 and [d.n_bytes for d in docs2] == [d.n_bytes for d in docs]
    assert list(docs2[0].tokens) == [(t + 1) % 256 for t in docs[0].tokens]
    hf = HFCausalLM(tiny_hf_model("gpt2"), byte_hf_tokenizer(), device="cpu")
    res = evaluate(hf, [f"perplexity:{data_dir}"], limit=2, save=False)
    entry = res["perplexity:data"]
    assert entry["retokenized"] and entry["metrics"]["tokens"] == entry["metrics"]["bytes"]


def test_lm_eval_adapter_loads_an_attnlab_run(run_dir, tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    import attnlab.eval.harness  # noqa: F401  (registers "attnlab")
    from attnlab.eval.lm_eval_tasks import write_task_yamls
    from attnlab.eval.multiple_choice import evaluate_multiple_choice, load_mc_file

    arc = FIXTURES / "arc.jsonl"
    out = simple_evaluate(
        model="attnlab",
        model_args={"path": str(run_dir), "device": "cpu"},
        tasks=["attnlab_arc_local"],
        task_manager=TaskManager(
            include_path=str(write_task_yamls(tmp_path, arc=arc)), include_defaults=False
        ),
        log_samples=True,
        bootstrap_iters=0,
        verbosity="ERROR",
    )
    ours = evaluate_multiple_choice(
        load_language_model(run_dir, device="cpu"), load_mc_file("arc", arc)
    )
    samples = sorted(out["samples"]["attnlab_arc_local"], key=lambda s: s["doc_id"])
    for s, lls in zip(samples, ours.logprobs, strict=True):
        assert [r[0][0] for r in s["resps"]] == pytest.approx(lls, abs=1e-4)


def test_register_task_adds_a_named_task(monkeypatch):
    from attnlab.eval.registry import TASKS, TaskOutcome, register_task

    monkeypatch.setattr("attnlab.eval.registry.TASKS", dict(TASKS))

    @register_task("count_chars")
    def count_chars(run):
        return TaskOutcome({"n": len(run.arg or "")}, "inline")

    lm = AttnlabLM(CausalBytesModel(), ByteTokenizer(), max_length=8, device="cpu")
    assert evaluate(lm, ["count_chars:abcd"], save=False)["count_chars:abcd"]["metrics"] == {"n": 4}
