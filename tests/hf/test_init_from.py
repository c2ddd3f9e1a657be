"""``attnlab train --init-from``: tiny random GPT-2, GPT-NeoX and Llama checkpoints saved locally
map onto attnlab's parts with the checkpoint's logits; what does not map is refused, named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.config import validate
from attnlab.hf.init_from import ArchitectureError, load_pretrained, model_table
from attnlab.model import build_model
from attnlab.runs.load import load_run_model
from tests.helpers.data import run_config, sentence_data
from tests.helpers.eval_doubles import tiny_hf_model
from tests.helpers.hf import spread_weights

torch.set_num_threads(1)
ARCHES = ("gpt2", "gpt_neox", "llama")


def _checkpoint(folder: Path, arch: str, **config) -> Path:
    """A tiny random ``arch`` model, its weights spread out, saved with save_pretrained."""
    model = tiny_hf_model(arch, max_length=64)
    for key, value in config.items():
        setattr(model.config, key, value)
    if config:
        model = type(model)(model.config)
    spread_weights(model, std=0.1)
    model.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("arch", ARCHES)
def test_mapped_model_gives_the_checkpoints_logits(tmp_path, arch):
    folder = _checkpoint(tmp_path / arch, arch)
    cfg = validate({"model": model_table(str(folder)), "data": {"seq_len": 32}})
    ours = build_model(cfg.model).eval()
    report = load_pretrained(str(folder), ours)
    assert report.fresh == [] and report.model_type == arch
    from transformers import AutoModelForCausalLM

    theirs = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.randint(0, 257, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = ours(ids).logits, theirs(ids).logits
    assert b.abs().max() > 1.0  # not a near-zero model
    assert (a - b).abs().max() < 1e-4


def test_the_mappings_say_what_they_set():
    gpt2 = tiny_hf_model("gpt2").config
    neox = tiny_hf_model("gpt_neox").config
    llama = tiny_hf_model("llama").config
    from attnlab.hf import arch_gpt2, arch_llama, arch_neox

    t = arch_gpt2.table(gpt2, [])
    assert (t["position"]["kind"], t["ffn"]["kind"], t["bias"]) == ("learned", "gelu_tanh", True)
    t = arch_neox.table(neox, [])
    assert t["residual_kind"] == "parallel" and t["position"]["fraction"] == 0.25
    t = arch_llama.table(llama, [])
    assert (t["norm"]["kind"], t["ffn"]["kind"], t["attention"]["n_kv_heads"]) == (
        "rmsnorm",
        "swiglu",
        2,
    )


def test_an_architecture_that_does_not_map_is_refused_naming_the_difference(tmp_path):
    folder = _checkpoint(tmp_path / "inv", "gpt2", scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(ArchitectureError, match="scale_attn_by_inverse_layer_idx"):
        model_table(str(folder))
    folder = _checkpoint(tmp_path / "scaled", "llama", hidden_act="gelu")
    with pytest.raises(ArchitectureError, match="hidden_act='gelu'"):
        model_table(str(folder))
    from transformers import BertConfig, BertForMaskedLM

    BertForMaskedLM(
        BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    ).save_pretrained(tmp_path / "bert")
    with pytest.raises(ArchitectureError, match="'bert' has no exact attnlab mapping"):
        model_table(str(tmp_path / "bert"))


def test_train_init_from_starts_at_the_checkpoint(tmp_path, capsys):
    """The run's [model] is the checkpoint's and its weights start as the checkpoint's (one step
    at lr 1e-9 leaves the logits where they were)."""
    folder = _checkpoint(tmp_path / "neox", "gpt_neox")
    (tmp_path / "data").mkdir()
    data = sentence_data(tmp_path / "data")
    cfg_file = run_config(
        tmp_path / "run.toml",
        data.parent / "corpus.jsonl",
        data,
        max_steps=1,
        batch_size=2,
        warmup_steps=0,
        eval_every=1,
        checkpoint_every=1,
        eval_batches=1,
        lr=1e-9,
        min_lr=0.0,
        threads=1,
    )
    out = tmp_path / "run"
    code = main(["train", str(cfg_file), "--out", str(out), "--init-from", str(folder), "--quiet"])
    assert code == 0, capsys.readouterr().err
    model, cfg, _ = load_run_model(out)
    assert cfg.train.init_from == str(folder) and cfg.model.residual_kind == "parallel"
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.arange(5, 45)[None]
    with torch.no_grad():  # lr 1e-9: one step moves nothing visible
        assert (model(ids).logits - ref(ids).logits).abs().max() < 1e-4


def test_init_from_a_missing_folder_is_a_clear_error(tmp_path, capsys):
    code = main(["train", "tiny", "--out", str(tmp_path / "r"), "--init-from", "no/such/dir"])
    assert code == 2
    assert "not a directory" in capsys.readouterr().err


def test_an_attnlab_export_comes_back_exactly(tmp_path):
    """Out and back: the export's [model] table is the run's and, before any step, the model
    computes the run's logits (same parts, same weights)."""
    from attnlab.hf.export import export
    from tests.helpers.hf import fake_run

    run = fake_run(tmp_path / "run", ["model.position.kind=rope", "model.query.kind=nonlinear"])
    folder = export(run, tmp_path / "export").out
    original, run_cfg, _ = load_run_model(run)
    table = model_table(str(folder))
    assert table == run_cfg.model.model_dump(mode="json")
    cfg = validate({"model": table})
    back = build_model(cfg.model).eval()
    report = load_pretrained(str(folder), back)
    assert report.model_type == "attnlab" and report.fresh == []
    ids = torch.randint(
        0, cfg.model.vocab_size, (2, 40), generator=torch.Generator().manual_seed(2)
    )
    with torch.no_grad():
        want = original.eval()(ids).logits
        assert torch.equal(back(ids).logits, want)
    assert want.std() > 0.1  # spread weights: a wrong tensor would show
