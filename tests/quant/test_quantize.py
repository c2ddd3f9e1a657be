"""``attnlab quantize`` (issue 35): the plan the parts declare, the schemes' torchao configs, the
quantized directory (safetensors, never a pickle) and its use as a target of eval, generate and
inspect. References are independent of the code under test: torchao's own tensor classes, the
full-precision model's logits, and a float64 re-computation of the int8 rounding."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("torchao")

from attnlab.base.errors import UserError
from attnlab.config import load_config
from attnlab.model import build_model
from attnlab.parts import Part
from attnlab.quant import SCHEMES, get_scheme, plan, quantizable_config, quantize_model, store
from tests.helpers.hf import fake_run
from tests.helpers.paths import FIXTURES

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return fake_run(tmp_path_factory.mktemp("q") / "run")


def attnlab(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnlab", *args], capture_output=True, text=True, cwd=cwd
    )


# ----------------------------------------------------------------------------------------- plan
def test_the_plan_quantizes_the_parts_linears_and_names_why_the_rest_is_kept(tiny):
    _, model = tiny
    p = plan(model)
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert sorted(p.quantized) == sorted(n for n in linears if n != "lm_head")
    assert "tied to the token embedding" in p.kept["lm_head.weight"]
    assert "table lookup" in p.kept["embed.weight"]
    assert "a norm's gain" in p.kept["decoder.blocks.0.norm1.weight"]
    assert "table lookup" in p.kept["abs_pos.table.weight"]


def test_an_untied_head_is_quantized_and_a_tied_one_kept():
    cfg = quantizable_config(load_config("tiny", ["model.tie_embeddings=false"]))
    assert "lm_head" in plan(build_model(cfg.model)).quantized
    tied = build_model(quantizable_config(load_config("tiny")).model)
    reasons = plan(tied).kept
    assert any("tied to the token embedding" in r for r in reasons.values()), reasons
    assert "lm_head" in plan(tied, tied_head=True).quantized


def test_a_tied_head_is_quantized_as_its_own_copy_and_reloads(tiny, tmp_path):
    """tied_head=True: the head multiplies by an int8 copy of the embedding, whose lookups stay
    float and untouched; the directory reloads it untied, with the same logits."""
    cfg, model = tiny
    q = copy.deepcopy(model)
    done = quantize_model(q, get_scheme("int8-weight"), tied_head=True)
    assert "lm_head" in done.quantized and "lm_head.weight" not in done.kept
    assert type(q.lm_head.weight).__name__ == "Int8Tensor"
    assert type(q.embed.weight.data) is torch.Tensor
    assert torch.equal(q.embed.weight, model.embed.weight)
    w = model.embed.weight.detach().double()
    deq = q.lm_head.weight.qdata.double() * q.lm_head.weight.scale.double().view(-1, 1)
    # round to nearest on the per-row grid of step max|w_row| / 127.5 (float32 scale: 1e-4 slack)
    assert ((deq - w).abs() <= w.abs().amax(1, keepdim=True) / 255 * (1 + 1e-4)).all()
    store.save(
        tmp_path / "q",
        q,
        cfg,
        {"scheme": "int8-weight", "group_size": None, "tied_head": True},
        full_precision=model,
    )
    back = store.load(tmp_path / "q").model
    assert type(back.lm_head.weight).__name__ == "Int8Tensor"
    assert back.lm_head.weight is not back.embed.weight
    x = torch.randint(0, cfg.model.vocab_size, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(back(x).logits, q(x).logits)


class _Gated(Part):
    """A stand-in plugin part: a big Linear, a small gate Linear and a raw gate tensor."""

    slot, kind = "side_branch", "test_gated"

    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.big = nn.Linear(64, 64)
        self.gate = nn.Linear(64, 4)
        self.alpha = nn.Parameter(torch.zeros(4))


class _KeepsBig(_Gated):
    def quantizable(self):
        return {}

    def full_precision_notes(self):
        return {"big": "its weight is read directly by forward()"}


def test_a_plugin_part_gets_the_default_and_may_override_it():
    default = plan(nn.ModuleDict({"p": _Gated()}))
    assert default.quantized == ["p.big"]
    assert "below the 32 inputs and outputs" in default.kept["p.gate.weight"]
    assert "own tensor (4,)" in default.kept["p.alpha"]
    override = plan(nn.ModuleDict({"p": _KeepsBig()}))
    assert override.quantized == []
    assert override.kept["p.big.weight"] == "its weight is read directly by forward()"


# -------------------------------------------------------------------------------------- schemes
def test_the_identity_head_variants_padded_mixer_quantizes():
    """The nonlinear mixer pads its Linears' weights for a wider matmul in training; a quantized
    weight cannot be padded (torchao has no constant_pad_nd): its Linears run unpadded."""
    from attnlab.bench.variants import find_variant

    sets = find_variant("identity_head").resolved_overrides(load_config("tiny"))
    cfg = quantizable_config(load_config("tiny", [f"model.{o}" for o in sets]))
    torch.manual_seed(0)
    full = build_model(cfg.model).eval()
    ids = torch.randint(
        0, cfg.model.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0)
    )
    ref = full(ids).logits
    for name in ("int8-weight", "int8-dynamic"):
        model = copy.deepcopy(full)
        done = quantize_model(model, get_scheme(name))
        assert any(".mixer." in n for n in done.quantized)
        got = model(ids).logits
        assert float((got - ref).norm() / ref.norm()) < get_scheme(name).tolerance


@pytest.mark.fast
def test_schemes_and_their_options_are_checked_with_the_fix_named():
    with pytest.raises(UserError, match="did you mean 'int8-weight'"):
        get_scheme("int8-weights")
    with pytest.raises(UserError, match="applies to int4-weight only"):
        get_scheme("int8-weight").group_size(64)
    with pytest.raises(UserError, match="takes groups of 32, 64, 128"):
        get_scheme("int4-weight").group_size(48)
    assert get_scheme("int4-weight").group_size(None) == 128


def test_int8_weight_is_torchaos_per_row_rounding(tiny):
    """The stored int8 data and scale are round-to-nearest on a symmetric per-row grid,
    recomputed here in float64."""
    from torchao.quantization import Int8Tensor

    _, model = tiny
    q = copy.deepcopy(model)
    quantize_model(q, get_scheme("int8-weight"))
    w = model.decoder.blocks[0].ffn.w_in.weight.detach().double()
    got = q.decoder.blocks[0].ffn.w_in.weight
    assert isinstance(got, Int8Tensor)
    # symmetric over int8's 256 levels: s = max|w_row| / ((127 - (-128)) / 2)
    scale = w.abs().amax(1, keepdim=True) / 127.5
    assert torch.allclose(got.scale.double().view(-1, 1), scale, rtol=1e-5)
    q8 = got.qdata.double()
    assert q8.abs().max() <= 128
    assert ((q8 * scale - w).abs() <= scale / 2 * (1 + 1e-5)).all()  # round to nearest step


@pytest.mark.parametrize("name", list(SCHEMES))
def test_each_scheme_moves_logits_a_little_and_the_fused_qkv_model_is_refused(tiny, name):
    cfg, model = tiny
    x = torch.randint(0, cfg.model.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    q = copy.deepcopy(model)
    result = quantize_model(q, get_scheme(name), 32 if name == "int4-weight" else None)
    assert result.quantized
    with torch.no_grad():
        ref, got = model(x).logits, q(x).logits
    err = float((got - ref).norm() / ref.norm())
    assert 0 < err < 2 * get_scheme(name).tolerance
    fused = build_model(load_config("tiny").model)
    with pytest.raises(UserError, match=r"model\.attention\.fuse_qkv=false"):
        quantize_model(fused, get_scheme(name))


def test_int4_shapes_its_kernel_cannot_take_are_kept_with_the_reason():
    cfg = quantizable_config(load_config("tiny", ["model.ffn.ratio=1.25"]))  # 64 -> 80 -> 64
    model = build_model(cfg.model)
    p = quantize_model(model, get_scheme("int4-weight"), 64)
    assert "decoder.blocks.0.ffn.w_out" not in p.quantized  # 80 inputs, groups of 64
    assert "not a multiple of the group size 64" in p.kept["decoder.blocks.0.ffn.w_out.weight"]


# ---------------------------------------------------------------------------------- directories
@pytest.mark.parametrize("name", list(SCHEMES))
def test_the_directory_reloads_the_same_model_without_pickle(tiny, tmp_path, name):
    cfg, model = tiny
    q = copy.deepcopy(model)
    gs = 32 if name == "int4-weight" else None
    quantize_model(q, get_scheme(name), gs)
    rec = store.save(
        tmp_path / "q", q, cfg, {"scheme": name, "group_size": gs}, full_precision=model
    )
    raw = (tmp_path / "q" / store.WEIGHTS_FILE).read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    assert "__metadata__" in header  # a safetensors file (torchao's metadata inside)
    back = store.load(tmp_path / "q")
    x = torch.randint(0, cfg.model.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(back.model(x).logits, q(x).logits)
    assert not rec["stored_in_float_requantized_at_load"]  # int4 too: packed, not float
    assert bool(rec["int4_packed"]) == (name == "int4-weight")
    assert rec["size_on_disk_bytes"] < 0.5 * sum(p.numel() * 4 for p in model.parameters())


def test_a_disallowed_class_in_the_metadata_is_refused(tiny, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    cfg, model = tiny
    q = copy.deepcopy(model)
    quantize_model(q, get_scheme("int8-weight"))
    store.save(
        tmp_path / "q", q, cfg, {"scheme": "int8-weight", "group_size": None}, full_precision=model
    )
    path = tmp_path / "q" / store.WEIGHTS_FILE
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
    name = "decoder.blocks.0.ffn.w_in.weight"
    meta[name] = meta[name].replace('"Int8Tensor"', '"os.system"')
    save_file(load_file(path), path, metadata=meta)
    with pytest.raises(UserError, match="cannot be read as a torchao state"):
        store.load(tmp_path / "q")


# ------------------------------------------------------------------------------------------ CLI
def test_quantize_then_eval_generate_and_inspect_take_the_directory(run, tmp_path):
    out = tmp_path / "q8"
    p = attnlab("quantize", str(run), "--scheme", "int8-weight", "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "quantized 12 Linears" in p.stdout and "tied to the token embedding" in p.stdout
    assert "Failed to load" not in p.stderr and "register_constant" not in p.stderr
    info = json.loads((out / "quantized.json").read_text())
    assert info["scheme"] == "int8-weight" and info["step"] == 5
    assert not (out / "config.toml").exists()  # not a run: nothing takes it for one
    fixture = FIXTURES / "eval" / "lambada.jsonl"
    p = attnlab("eval", str(out), "--tasks", f"cloze:{fixture}", "--limit", "4", "--json")
    assert p.returncode == 0, p.stderr
    ours = json.loads(p.stdout)
    base = json.loads(
        attnlab(
            "eval", str(run), "--tasks", f"cloze:{fixture}", "--limit", "4", "--json", "--no-save"
        ).stdout
    )
    (key,) = ours
    assert ours[key]["metrics"]["logprob"] == pytest.approx(
        base[key]["metrics"]["logprob"], rel=0.05
    )
    assert ours[key]["metrics"]["logprob"] != base[key]["metrics"]["logprob"]
    assert (out / "eval" / "results.json").is_file()
    p = attnlab(
        "generate", str(out), "--prompt", "ab", "--max-new-tokens", "4", "--temperature", "0"
    )
    assert p.returncode == 0 and p.stdout.startswith("ab"), p.stderr
    p = attnlab("inspect", str(out), "--prompt", "abc", "--out", str(tmp_path / "page.html"))
    assert p.returncode == 0, p.stderr


def test_bench_times_the_directory_against_its_source_run(run, tmp_path):
    out = tmp_path / "q8"
    assert (
        attnlab("quantize", str(run), "--scheme", "int8-weight", "--out", str(out)).returncode == 0
    )
    fast = ["--new-tokens", "3", "--decode-repeats", "1", "--warmup", "0"]
    p = attnlab("bench", str(out), *fast, "--sections", "inference", "--json")
    assert p.returncode == 0, p.stderr
    rows = {r["name"]: r for r in json.loads(p.stdout)["rows"]}
    assert set(rows) == {"float32", "int8-weight"}
    # the int8 weights are a quarter of the float ones (the tied head and norms stay float32)
    assert rows["int8-weight"]["weight_bytes"] < rows["float32"]["weight_bytes"]
    assert rows["float32"]["speedup"] == 1.0 and rows["int8-weight"]["decode_tokens_per_s"] > 0
    p = attnlab("bench", str(out), *fast)  # with memory: a fresh process per model
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith(f"{out}: greedy decoding with the KV cache, 3 tokens after 16")
    assert [ln.split()[0] for ln in lines[2:]] == ["float32", "int8-weight"]
    assert all(ln.split()[-1] != "-" for ln in lines[2:])  # peak memory measured
    p = attnlab("bench", str(out), "--set", "model.d_model=32")
    assert p.returncode == 2 and "--overrides" not in p.stderr and "--set" in p.stderr


def test_quantize_refuses_a_foreign_out_and_replaces_its_own_only_with_force(run, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    p = attnlab("quantize", str(run), "--scheme", "int8-weight", "--out", str(mine))
    assert p.returncode == 2 and "not a quantized model of attnlab's" in p.stderr
    assert "Traceback" not in p.stderr
    out = tmp_path / "q"
    assert (
        attnlab("quantize", str(run), "--scheme", "int8-dynamic", "--out", str(out)).returncode == 0
    )
    p = attnlab("quantize", str(run), "--scheme", "int8-dynamic", "--out", str(out))
    assert p.returncode == 2 and "--force" in p.stderr
    p = attnlab(
        "quantize",
        str(run),
        "--scheme",
        "int4-weight",
        "--group-size",
        "32",
        "--out",
        str(out),
        "--force",
    )
    assert p.returncode == 0, p.stderr
    assert json.loads((out / "quantized.json").read_text())["group_size"] == 32
    p = attnlab(
        "quantize", str(run), "--scheme", "int8-weight", "--group-size", "32", "--out", str(out)
    )
    assert p.returncode == 2 and "applies to int4-weight only" in p.stderr


def test_quantize_tied_head_quantizes_the_head_and_export_refuses_it(run, tmp_path):
    out = tmp_path / "qh"
    p = attnlab("quantize", str(run), "--scheme", "int8-weight", "--tied-head", "--out", str(out))
    assert p.returncode == 0, p.stderr
    info = json.loads((out / "quantized.json").read_text())
    assert info["tied_head"] is True and "lm_head" in info["quantized"]
    assert not any("tied to the token embedding" in r["reason"] for r in info["kept"])
    p = attnlab("export", str(out), "--out", str(tmp_path / "hf"))
    assert p.returncode == 2 and "--tied-head" in p.stderr and "Traceback" not in p.stderr


def test_check_weights_reads_a_quantized_weights_inner_tensors(tiny):
    from attnlab.base.errors import NonFiniteError
    from attnlab.base.finite import check_weights

    _, model = tiny
    q = copy.deepcopy(model)
    quantize_model(q, get_scheme("int8-weight"))
    check_weights(q, "q")
    with torch.no_grad():
        q.decoder.blocks[0].ffn.w_in.weight.scale[0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"ffn\.w_in\.weight\.scale"):
        check_weights(q, "q")
