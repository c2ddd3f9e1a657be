"""The model's contract beyond the forward math: init (stds per part), AdamW parameter groups,
FLOPs per token, train/eval behaviour of dropout and stochastic depth, and generate's options."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.config import load_config
from attnlab.model import build_model, generate
from attnlab.model.block import DropPath

pytestmark = pytest.mark.usefixtures("float64")

TINY = [
    "model.d_model=64",
    "model.n_layers=3",
    "model.attention.n_heads=4",
    "model.vocab_size=64",
    "model.max_seq_len=32",
    "data.seq_len=16",
]


def tiny(*overrides: str):
    return load_config(None, [*TINY, *overrides]).model


# ------------------------------------------------------------------------------------------ init


def test_init_stds_follow_the_recipe() -> None:
    """All Linear/Embedding N(0, 0.02); output projections N(0, 0.02 / sqrt(2L)); norms 1, 0."""
    model = build_model(tiny("model.bias=true", "model.query.kind=nonlinear"))
    blk = model.decoder.blocks[0]
    out_std = 0.02 / math.sqrt(2 * 3)
    checks = [
        (model.embed.weight, 0.02),
        (model.abs_pos.table.weight, 0.02),
        (blk.attention.key.w_k.weight, 0.02),
        (blk.attention.query.f.w1.weight, 0.02),
        (blk.ffn.w_in.weight, 0.02),
        (blk.attention.mixer.w_o.weight, out_std),
        (blk.ffn.w_out.weight, out_std),
    ]
    for w, std in checks:
        assert float(w.detach().std()) == pytest.approx(std, rel=0.15)
    assert torch.count_nonzero(blk.attention.key.w_k.bias) == 0
    assert (
        torch.equal(blk.norm1.weight, torch.ones(64)) and torch.count_nonzero(blk.norm1.bias) == 0
    )
    assert torch.equal(blk.attention.query.f.ln.weight, torch.ones(64))  # nonlinear: not zeroed
    assert model.lm_head.weight is model.embed.weight  # tied


def test_anchored_final_gain_starts_at_zero_and_reset_keeps_part_inits() -> None:
    model = build_model(tiny("model.query.kind=anchored", "model.readout.kind=identity_head"))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.5)
    model.reset_parameters()
    attn = model.decoder.blocks[0].attention
    assert torch.count_nonzero(attn.query.f.ln.weight) == 0
    assert attn.readout.head_weights.bias.tolist() == [0, 0, 0, 0, 1]
    assert torch.count_nonzero(attn.readout.head_weights.weight) == 0


# ---------------------------------------------------------------------------------- param groups


def test_weight_decay_only_on_matrices_and_embeddings() -> None:
    model = build_model(
        tiny("model.bias=true", "model.norm.kind=scalenorm", "model.score.kind=virtual_heads")
    )
    decay, no_decay = model.param_groups(0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    d_ids = {id(p) for p in decay["params"]}
    n_ids = {id(p) for p in no_decay["params"]}
    assert not d_ids & n_ids
    assert d_ids | n_ids == {id(p) for p in model.parameters()}
    for name, p in model.named_parameters():
        assert (id(p) in d_ids) == (p.dim() >= 2), name  # biases, norm gains, ScaleNorm's scalar
    assert id(model.decoder.blocks[0].attention.score.weight) in d_ids  # a 3-D kernel


def test_stacked_expert_biases_are_not_decayed() -> None:
    model = build_model(load_config("tiny-moe-values", ["model.bias=true"]).model)
    _, no_decay = model.param_groups(0.1)
    moe = model.decoder.blocks[0].attention.value
    n_ids = {id(p) for p in no_decay["params"]}
    assert id(moe.b_in) in n_ids and id(moe.b_out) in n_ids


# ----------------------------------------------------------------------------------------- FLOPs


@pytest.mark.fast
def test_flops_per_token_counts_matmuls_and_attention() -> None:
    cfg = tiny()
    model = build_model(cfg)
    T, d, L, V = 16, 64, 3, 64
    matmuls = L * (4 * d * d + 8 * d * d) + d * V  # blocks + LM head
    assert model.flops_per_token(T) == 2 * matmuls + L * 4 * T * d
    nl = build_model(tiny("model.query.kind=nonlinear"))
    assert nl.flops_per_token(T) == model.flops_per_token(T)  # 2dr = d^2, as W_Q


# ------------------------------------------------------------------------- train / eval behaviour


def test_dropout_and_stochastic_depth_act_only_in_training() -> None:
    model = build_model(tiny("model.dropout=0.3", "model.stochastic_depth=0.5"))
    ids = torch.randint(0, 64, (4, 8))
    model.eval()
    assert torch.equal(model(ids).logits, model(ids).logits)
    model.train()
    assert not torch.equal(model(ids).logits, model(ids).logits)


def test_drop_path_drops_whole_samples_and_rescales() -> None:
    dp = DropPath(0.5).train()
    x = torch.ones(2000, 3, 4)
    y = dp(x)
    per_sample = y.flatten(1)
    assert set(per_sample.unique().tolist()) <= {0.0, 2.0}
    assert (per_sample == per_sample[:, :1]).all()  # one decision per sample
    assert float(y.mean()) == pytest.approx(1.0, abs=0.1)
    assert torch.equal(dp.eval()(x), x)


def test_aux_loss_only_while_training() -> None:
    model = build_model(load_config("tiny-moe-values").model)
    ids = torch.randint(0, 64, (2, 8))
    out = model.train()(ids, targets=ids)
    assert out.aux_loss is not None and out.total_loss == out.loss + out.aux_loss
    out = model.eval()(ids, targets=ids)
    assert out.aux_loss is None and out.total_loss == out.loss


# -------------------------------------------------------------------------------------- generate


def _model():
    model = build_model(tiny())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


@pytest.mark.fast
def test_generate_greedy_is_the_argmax_of_the_forward() -> None:
    model = _model().eval()
    prompt = torch.randint(0, 64, (2, 3))
    out = generate(model, prompt, 4, temperature=0.0)
    for t in range(3, 7):
        nxt = model(out[:, :t]).logits[:, -1].argmax(-1)
        assert torch.equal(out[:, t], nxt)


def test_generate_top_k_one_is_greedy_and_sampling_is_seeded() -> None:
    model = _model().train()
    prompt = torch.randint(0, 64, (2, 3))
    greedy = generate(model, prompt, 5, temperature=0.0)
    assert model.training  # restored
    g = torch.Generator().manual_seed(1)
    assert torch.equal(generate(model, prompt, 5, temperature=1.0, top_k=1, generator=g), greedy)
    a = generate(model, prompt, 5, temperature=1.0, generator=torch.Generator().manual_seed(3))
    b = generate(model, prompt, 5, temperature=1.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_generate_pads_finished_rows_with_eos_and_stops_when_all_are_done() -> None:
    model = _model().eval()
    prompt = torch.randint(0, 64, (3, 3))
    free = generate(model, prompt, 6, temperature=0.0)
    eos = int(free[0, 3])  # row 0 produces it at once
    out = generate(model, prompt, 6, temperature=0.0, eos_id=eos)
    row0 = out[0, 3:]
    assert (row0 == eos).all()
    for r in range(3):
        gen = out[r, 3:].tolist()
        if eos in gen:
            first = gen.index(eos)
            assert all(t == eos for t in gen[first:])
    assert out.shape[1] <= 9
    one = generate(model, prompt[:1], 6, temperature=0.0, eos_id=eos)
    assert one.shape == (1, 4)  # stops as soon as every row is done


def test_generate_refuses_to_run_past_learned_positions() -> None:
    model = _model()
    assert generate(model, torch.randint(0, 64, (1, 4)), 28, temperature=0.0).shape == (1, 32)
    with pytest.raises(ValueError, match="max_seq_len"):
        generate(model, torch.randint(0, 64, (1, 4)), 29, temperature=0.0)


def test_generate_on_a_prefix_lm_needs_the_prompt_to_cover_the_prefix() -> None:
    """Generated tokens inside the bidirectional prefix would make the cached and uncached paths
    disagree, so a prompt shorter than prefix_len is refused; a covering one decodes identically."""
    model = build_model(tiny("model.mask.kind=prefix", "model.mask.prefix_len=6"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.eval()
    with pytest.raises(ValueError, match="prefix"):
        generate(model, torch.randint(0, 64, (2, 2)), 8, temperature=0.0)
    prompts = torch.randint(0, 64, (10, 6))
    cached = generate(model, prompts, 8, temperature=0.0)
    assert torch.equal(cached, generate(model, prompts, 8, temperature=0.0, use_cache=False))


def test_generate_refuses_tokens_from_non_finite_scores() -> None:
    """Finite weights can still overflow: tokens picked from NaN/inf scores are refused (exit 3)
    instead of printed as NUL bytes."""
    from attnlab.base.errors import NonFiniteError
    from attnlab.model import generate

    model = build_model(tiny()).eval()
    with torch.no_grad():
        model.lm_head.weight.fill_(1e308)  # finite, but h @ W^T overflows to inf (float64)
    with pytest.raises(NonFiniteError, match="held NaN or inf"):
        generate(model, torch.tensor([[1, 2, 3]]), 2, temperature=0.0)
