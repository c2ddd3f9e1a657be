"""Parameter accounting from the config alone (``attnlab.model.params.count``): the published counts
of the seeds' shapes, K/V-cache bytes, and agreement with a really built model for every variant."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import load_config
from attnlab.model import build_model
from attnlab.model.params import EMBEDDING_PARTS, count, labels
from tests.helpers.model import TINY


@pytest.fixture(scope="module")
def reports():
    names = [
        "gpt2-124m",
        "gpt2-124m-nonlinear-query",
        "gpt2-124m-identity-query",
        "gpt2-124m-mlp4.75",
        "pythia-160m",
        "pythia-160m-preproj-skip",
        "pythia-410m",
        "pythia-410m-preproj-skip",
    ]
    return {n: count(load_config(n).model) for n in names}


def test_gpt2_124m_non_embedding(reports) -> None:
    r = reports["gpt2-124m"]
    # 12 x (4 d^2 attention + 8 d^2 MLP + 2 d LayerNorm gains) + final gain, d = 768, no biases
    assert r.non_embedding == 12 * (12 * 768**2 + 2 * 768) + 768 == 84_953_856
    assert r.total == r.non_embedding + 50304 * 768 + 1024 * 768  # tied head: counted once
    assert r.kv_cache_bytes_per_token == 2 * 12 * 12 * 64 * 2 == 36_864


def test_nonlinear_query_non_embedding(reports) -> None:
    r = reports["gpt2-124m-nonlinear-query"]
    assert r.non_embedding == 84_972_288  # + RMSNorm and LayerNorm gains, 2d per layer
    assert r.non_embedding - reports["gpt2-124m"].non_embedding == 12 * 2 * 768
    assert r.by_part["query"] == 12 * (768 * 384 * 2 + 2 * 768)
    assert r.by_part["query"] - reports["gpt2-124m"].by_part["query"] == 12 * 2 * 768


def test_identity_query_drops_w_q(reports) -> None:
    r = reports["gpt2-124m-identity-query"]
    assert "query" not in r.by_part
    assert reports["gpt2-124m"].non_embedding - r.non_embedding == 12 * 768**2


def test_mlp_control_is_twelve_and_a_half_percent_larger(reports) -> None:
    r = reports["gpt2-124m-mlp4.75"]
    assert r.non_embedding == 95_570_688
    ratio = r.non_embedding / reports["gpt2-124m"].non_embedding
    assert ratio == pytest.approx(1.125, rel=1e-3)


def test_pythia_160m_total_is_the_released_checkpoints(reports) -> None:
    assert reports["pythia-160m"].total == 162_322_944


@pytest.mark.parametrize(
    "base,variant,pre,skip",
    [
        ("pythia-160m", "pythia-160m-preproj-skip", 17_694_720, 7_077_888),
        ("pythia-410m", "pythia-410m-preproj-skip", 62_914_560, 25_165_824),
    ],
)
def test_pre_projection_overhead_matches_the_papers_table(reports, base, variant, pre, skip):
    b, v = reports[base], reports[variant]
    assert v.by_part["pre_projection"] == pre and v.by_part["content_skip"] == skip
    assert v.total - b.total == pre + skip  # nothing else changed
    assert round((pre + skip) / 1e6, 1) == {17_694_720: 24.8, 62_914_560: 88.1}[pre]
    assert v.kv_cache_bytes_per_token == b.kv_cache_bytes_per_token  # no cache overhead


def test_report_is_consistent(reports) -> None:
    for r in reports.values():
        assert sum(r.by_part.values()) == r.total
        emb = sum(r.by_part.get(k, 0) for k in EMBEDDING_PARTS)
        assert r.non_embedding == r.total - emb
        assert r.active_non_embedding == r.non_embedding  # nothing routed
        assert list(r.by_part.values()) == sorted(r.by_part.values(), reverse=True)
        d = r.to_dict()
        assert {"total", "non_embedding", "kv_cache_bytes_per_token", "by_part"} <= set(d)
        assert r.flops_per_token > 2 * r.non_embedding  # matmuls + attention + head


# ------------------------------------------------------------- the meta count equals a real model

VARIANTS = {
    "baseline": ("tiny", []),
    "untied_bias": ("tiny", ["model.tie_embeddings=false", "model.bias=true"]),
    "nonlinear": ("tiny", ["model.query.kind=nonlinear"]),
    "anchored": ("tiny", ["model.query.kind=anchored", "model.bias=true"]),
    "identity_query": ("tiny", ["model.query.kind=identity"]),
    "preproj_skip_gated": (
        "pythia-160m-preproj-skip",
        ["model.feature_map.gated=true", "model.vocab_size=64"],
    ),
    "identity_head": ("tiny-identity-head", []),
    "moe_values": ("tiny-moe-values", []),
    "virtual_heads": ("tiny-virtual-heads", ["model.score.n_virtual=8"]),
    "t5_gqa_qknorm": (
        "tiny",
        ["model.position.kind=t5", "model.attention.n_kv_heads=2", "model.attention.qk_norm=true"],
    ),
    "alibi_rmsnorm_swiglu": (
        "tiny",
        ["model.position.kind=alibi", "model.norm.kind=rmsnorm", "model.ffn.kind=swiglu"],
    ),
    "scalenorm_sinusoidal": (
        "tiny",
        ["model.norm.kind=scalenorm", "model.position.kind=sinusoidal"],
    ),
    "encoder": ("tiny", ["model.family=encoder", "model.mask.kind=full"]),
    "encoder_decoder": ("tiny", ["model.family=encoder_decoder", "model.n_decoder_layers=3"]),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_count_equals_the_parameters_of_a_built_model(name: str) -> None:
    preset, flags = VARIANTS[name]
    cfg = load_config(preset, [*TINY, *flags]).model
    rep = count(cfg)
    model = build_model(cfg)
    rows = labels(model)
    unique = {id(p): p for p in model.parameters()}  # tied weights once
    assert rep.total == sum(p.numel() for p in unique.values())
    by_part: dict[str, int] = {}
    seen: set[int] = set()
    for pname, p in model.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            part = rows[pname]
            by_part[part] = by_part.get(part, 0) + p.numel()
    assert by_part == rep.by_part
    assert "other" not in rep.by_part, "every parameter belongs to a named part"
    cache = model.new_cache(1, 1, dtype=torch.bfloat16) if model.supports_cache else None
    expect_kv = cache.nbytes() if cache is not None else 0
    assert rep.kv_cache_bytes_per_token == expect_kv


def test_moe_active_params_are_fewer_than_total() -> None:
    cfg = load_config("tiny-moe-values").model
    rep = count(cfg)
    moe = cfg.value
    d, h = cfg.d_model, moe.expert_hidden or cfg.d_model
    per_expert = d * h + h * d
    assert rep.non_embedding - rep.active_non_embedding == (moe.n_experts - moe.top_k) * per_expert
    assert any("experts active" in n for n in rep.notes)


def test_parameters_are_counted_in_the_row_their_part_declares() -> None:
    flags = ["model.query.kind=nonlinear", "model.feature_map.kind=pre_projection"]
    rows = labels(build_model(load_config("tiny", flags).model))
    assert rows["decoder.blocks.0.attention.query.f.ln.weight"] == "query"
    assert rows["decoder.blocks.1.feature_map.w_up.weight"] == "pre_projection"
    assert rows["decoder.final_norm.weight"] == "norm"
    assert rows["embed.weight"] == "embedding"  # a tied lm_head is counted once, here
    seq2seq = ["model.family=encoder_decoder", "model.n_decoder_layers=1", "data.seq_len=16"]
    rows = labels(build_model(load_config("tiny", seq2seq).model))
    assert rows["decoder.blocks.0.cross_attention.key.w_k.weight"] == "cross_attention"
    assert rows["decoder.blocks.0.attention.key.w_k.weight"] == "key"
