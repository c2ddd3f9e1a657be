"""FLOP counting used for MFU: exact for a hand-counted baseline, and the same for the peers."""

from __future__ import annotations

import pytest
import torch

from attnlab.bench.peers import build_peer, matmul_weights, peer_flops_per_token
from attnlab.config import load_config
from attnlab.model import build_model


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.mark.fast
def test_tiny_baseline_flops_match_a_hand_count():
    cfg = load_config("tiny").model  # d=64, L=2, H=4, vocab 288, GELU MLP 4d, tied, no bias
    d, L, H, V, T = 64, 2, 4, 288, 64
    assert (cfg.d_model, cfg.n_layers, cfg.attention.n_heads, cfg.vocab_size) == (d, L, H, V)
    per_layer_weights = 4 * d * d + 2 * d * (4 * d)  # W_Q, W_K, W_V, W_O; MLP in and out
    attention = 4 * T * (d // H) * H  # q k^T and p v per head at full context T
    hand = L * (2 * per_layer_weights + attention) + 2 * d * V  # + tied LM head
    assert hand == 266_240
    assert build_model(cfg).flops_per_token(T) == hand


def test_training_flops_are_the_6n_formula_plus_attention():
    cfg = load_config("tiny", ["model.d_model=96", "model.n_layers=3"]).model
    model = build_model(cfg)
    n_matmul = matmul_weights(model)  # non-embedding matmuls + the (tied) LM head, once
    T = 48
    six_n = 6 * n_matmul + 12 * cfg.n_layers * cfg.d_model * T  # nanoGPT/PaLM convention
    assert 3 * model.flops_per_token(T) == six_n


@pytest.mark.parametrize("peer", ["nanogpt", "hf_gpt2", "x_transformers"])
def test_peer_flops_equal_attnlab_baseline_at_equal_config(peer):
    cfg = load_config("tiny").model
    T = 32
    net = build_peer(peer, cfg)
    assert peer_flops_per_token(peer, net, cfg, T) == build_model(cfg).flops_per_token(T)


def test_nanogpt_own_flop_formula_agrees_with_the_module_count():
    cfg = load_config("tiny", ["model.d_model=128", "model.attention.n_heads=8"]).model
    net = build_peer("nanogpt", cfg)
    assert net.flops_per_token(100) == peer_flops_per_token("nanogpt", net, cfg, 100)
