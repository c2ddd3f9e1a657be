"""Building a probed model from a local directory: freezing, exactly-which-tensors-train, gradient
checkpointing, and the LoRA rank solved on PEFT's actual parameter count."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab.probe.build import build_probed_model
from attnlab.probe.config import load_probe_config
from attnlab.probe.inject import injected_count
from attnlab.probe.lora import lora_count
from attnlab.probe.methods import parse_method
from attnlab.probe.trainer import enable_gradient_checkpointing, lm_loss, probe_optimizer
from tests.helpers.probe_doubles import KINDS, save_tiny_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bases")
    return {k: save_tiny_model(k, root / k) for k in KINDS}


def _cfg(model_dir: Path, method: str, *extra: str):
    return load_probe_config(
        None,
        [f"base.model={model_dir}", f"method={method}", "train.lr=1e-2", "lora.rank=4", *extra],
    )


def _batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(1, vocab, (2, 17), generator=g)
    return t[:, :-1], t[:, 1:]


@pytest.mark.parametrize("kind", KINDS)
def test_exactly_the_injected_and_lora_tensors_change(model_dirs, kind):
    cfg = _cfg(model_dirs[kind], "preproj+skip+anchored-query+lora")
    probed = build_probed_model(cfg)
    trainable = {n for n, _ in probed.trainable()}
    names = {n for n, _ in probed.model.named_parameters()}
    assert trainable == {n for n in names if "attnlab_probe." in n or ".lora_" in n}
    assert sum(p.numel() for _, p in probed.trainable()) == probed.counts()["trainable"]
    before = {n: p.detach().clone() for n, p in probed.model.named_parameters()}
    x, y = _batch(probed.hf_model.config.vocab_size)
    # two steps: at step 1 the zero-initialised LN gain of f and LoRA's B block the gradient of
    # W1/W2 and LoRA's A; from step 2 on every trainable tensor has a gradient
    opt = probe_optimizer(probed, cfg, torch.device("cpu"))
    probed.model.train()
    for _ in range(2):
        lm_loss(probed.model, x, y).backward()
        opt.step()
        opt.zero_grad()
    for n, p in probed.model.named_parameters():
        if n in trainable:
            assert not torch.equal(p, before[n]), f"{n} did not train"
        else:
            assert torch.equal(p, before[n]), f"frozen {n} changed"
            assert p.grad is None


@pytest.mark.parametrize("reentrant", [True, False])
@pytest.mark.parametrize("kind", ["gpt_neox", "llama"])
def test_gradient_checkpointing_keeps_gradients_flowing(model_dirs, kind, reentrant):
    cfg = _cfg(model_dirs[kind], "preproj+skip")
    x, y = _batch(64)
    reference = build_probed_model(cfg)
    reference.model.train()
    lm_loss(reference.model, x, y).backward()
    ref_grads = {n: p.grad.clone() for n, p in reference.trainable()}

    probed = build_probed_model(cfg)  # same seed: same initial injected weights
    enable_gradient_checkpointing(probed.model, use_reentrant=reentrant)
    layers = probed.spec.layer_list(probed.hf_model)
    assert all(layer.gradient_checkpointing for layer in layers)
    before = {n: p.detach().clone() for n, p in probed.trainable()}
    opt = probe_optimizer(probed, cfg, torch.device("cpu"))
    probed.model.train()
    lm_loss(probed.model, x, y).backward()
    for n, p in probed.trainable():  # the recomputed forward gives the same gradients
        torch.testing.assert_close(p.grad, ref_grads[n], atol=1e-6, rtol=1e-5)
    opt.step()
    changed = [n for n, p in probed.trainable() if not torch.equal(p, before[n])]
    assert len(changed) == len(before)


@pytest.mark.parametrize("kind", KINDS)
def test_lora_rank_is_solved_on_the_actual_count(model_dirs, kind):
    cfg = _cfg(model_dirs[kind], "lora@preproj+skip")
    probed = build_probed_model(cfg)
    target = injected_count(probed.dims, parse_method("preproj+skip"), cfg)
    plan = probed.lora
    counts = probed.counts()
    assert plan is not None and plan.matched_to == "preproj+skip" and plan.budget == target
    assert counts["lora"] == lora_count(probed.model) == plan.rank * plan.per_rank
    assert counts["trainable"] == counts["lora"] and counts["injected"] == 0
    # the nearest integer rank: no other rank is closer to the target
    for r in (plan.rank - 1, plan.rank + 1):
        assert abs(counts["trainable"] - target) <= abs(r * plan.per_rank - target)
    d, L = probed.dims.d_model, probed.dims.n_layers
    assert plan.naive_rank == round(target / (4 * d * L))
    if kind == "gpt_neox":  # q/k/v fused d -> 3d plus dense d -> d: 6 d r per layer, 1.5x naive
        assert plan.per_rank == 6 * d * L
    # LoRA starts at B = 0: the wrapped model computes the base's logits
    x, _ = _batch(probed.hf_model.config.vocab_size)
    with torch.no_grad():
        with probed.model.disable_adapter():
            base = probed.model(input_ids=x).logits
        torch.testing.assert_close(probed.model(input_ids=x).logits, base)


def test_preproj_plus_lora_matched_spends_the_rest_on_lora(model_dirs):
    cfg = _cfg(model_dirs["llama"], "preproj+lora@preproj+skip")
    probed = build_probed_model(cfg)
    c = probed.counts()
    target = injected_count(probed.dims, parse_method("preproj+skip"), cfg)
    assert c["injected"] == injected_count(probed.dims, parse_method("preproj"), cfg)
    assert abs(c["trainable"] - target) <= probed.lora.per_rank / 2
    assert c["trainable"] == c["injected"] + c["lora"]
