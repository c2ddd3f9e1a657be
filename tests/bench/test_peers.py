"""The nanoGPT peer is the same network as attnlab's baseline: equal parameters, equal logits."""

from __future__ import annotations

import pytest
import torch

from attnlab.bench.peers import build_peer, nanogpt_state_from_attnlab, peer_logits
from attnlab.bench.subjects import n_params
from attnlab.config import load_config
from attnlab.model import build_model


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("bias", [False, True])
def test_nanogpt_and_attnlab_baseline_have_the_same_parameter_count(bias):
    b = str(bias).lower()
    cfg = load_config("tiny", [f"model.bias={b}", f"model.norm.bias={b}"]).model
    assert n_params(build_peer("nanogpt", cfg)) == n_params(build_model(cfg))


def test_x_transformers_peer_has_the_same_parameter_count():
    cfg = load_config("tiny").model
    assert n_params(build_peer("x_transformers", cfg)) == n_params(build_model(cfg))


@pytest.mark.parametrize("bias", [False, True])
def test_nanogpt_with_copied_weights_gives_the_same_logits_and_loss(bias):
    b = str(bias).lower()
    cfg = load_config("tiny", [f"model.bias={b}", f"model.norm.bias={b}"]).model
    torch.manual_seed(0)
    ours = build_model(cfg).eval()
    if bias:  # nonzero biases, so a mis-mapped bias would show
        with torch.no_grad():
            for name, p in ours.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.1)
    peer = build_peer("nanogpt", cfg).eval()
    missing, unexpected = peer.load_state_dict(nanogpt_state_from_attnlab(ours), strict=True)
    assert not missing and not unexpected
    x = torch.randint(0, cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = ours(x, x)
        logits, loss = peer(x, x)
    torch.testing.assert_close(logits, a.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, a.loss, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits, build_peer("nanogpt", cfg)(x, x)[0])  # weights mattered


@pytest.mark.parametrize("peer", ["nanogpt", "hf_gpt2", "x_transformers"])
def test_every_peer_gives_full_logits(peer):
    cfg = load_config("tiny").model
    x = torch.randint(0, cfg.vocab_size, (2, 10))
    out = peer_logits(peer, build_peer(peer, cfg), x)
    assert out.shape == (2, 10, cfg.vocab_size)
