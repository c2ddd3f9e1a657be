"""Every bundled preset builds and trains one step at tiny width with its variant flags intact: a
finite loss, and a gradient on every trainable parameter except the documented ones."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import load_config, preset_names
from attnlab.model import build_model

SHRINK = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.attention.n_heads=4",
    "model.vocab_size=128",
    "model.max_seq_len=64",
    "data.seq_len=32",
]
SHRUNK_FIELDS = {"d_model", "n_layers", "vocab_size", "max_seq_len", "attention"}

# Parameters that get exactly zero gradient at init, and why:
# - identity head: all head weight sits on the identity head (w = e_(H+1)), so the H attention
#   heads' outputs are multiplied by 0 and W_Q, W_K, W_V receive no gradient until the head-weight
#   layer (which does get one) moves off its init.
# (Outside the presets: an anchored query's f sits behind a zero LayerNorm gain, so W1, W2 and f's
#  RMSNorm gain get none at init either; tests/model/test_query.py pins that.)
ZERO_GRAD_AT_INIT = {
    "tiny-identity-head": (".attention.query.", ".attention.key.", ".attention.value."),
}


@pytest.fixture(autouse=True)
def _threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)


def test_the_bundled_presets_are_all_here() -> None:
    names = set(preset_names())
    assert {
        "tiny",
        "gpt2-124m",
        "gpt2-124m-nonlinear-query",
        "gpt2-124m-identity-query",
        "gpt2-124m-mlp4.75",
        "pythia-160m",
        "pythia-160m-preproj-skip",
        "pythia-410m",
        "pythia-410m-preproj-skip",
        "tiny-identity-head",
        "tiny-moe-values",
        "tiny-virtual-heads",
    } <= names


@pytest.mark.parametrize("name", preset_names())
def test_preset_trains_one_step_at_tiny_width(name: str) -> None:
    full = load_config(name).model
    cfg = load_config(name, SHRINK).model
    # shrinking keeps every variant flag of the preset
    for field in type(cfg).model_fields:
        if field not in SHRUNK_FIELDS:
            assert getattr(cfg, field) == getattr(full, field), field
    assert cfg.attention.model_dump(exclude={"n_heads"}) == full.attention.model_dump(
        exclude={"n_heads"}
    )
    model = build_model(cfg).train()
    ids = torch.randint(0, 128, (2, 32))
    out = model(ids, targets=ids)
    assert out.logits.shape == (2, 32, 128)
    assert torch.isfinite(out.total_loss)
    out.total_loss.backward()
    exempt = ZERO_GRAD_AT_INIT.get(name, ())
    for pname, p in model.named_parameters():
        if not p.requires_grad:
            continue
        got = p.grad is not None and bool(p.grad.abs().sum() > 0)
        if any(e in pname for e in exempt):
            assert not got, f"{pname} was documented as gradient-free at init"
        else:
            assert got, f"{pname} got no gradient"
        if p.grad is not None:
            assert torch.isfinite(p.grad).all(), pname


def test_identity_head_attention_learns_once_head_weights_move() -> None:
    model = build_model(load_config("tiny-identity-head", SHRINK).model).train()
    for blk in model.decoder.blocks:
        torch.nn.init.normal_(blk.attention.readout.head_weights.weight, 0, 0.1)
    ids = torch.randint(0, 128, (2, 16))
    model(ids, targets=ids).loss.backward()
    for blk in model.decoder.blocks:
        assert blk.attention.key.w_k.weight.grad.abs().sum() > 0
        assert blk.attention.query.w_q.weight.grad.abs().sum() > 0
