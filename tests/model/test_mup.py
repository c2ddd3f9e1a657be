"""µP (attnlab.model.mup) and the coordinate check (attnlab.testing.coord_check): roles from
shapes and declarations, the init, attention and readout factors, the Adam groups, and the check
itself: µP passes, the standard parametrisation and deliberately mis-scaled plugin parts fail
with the weight named."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from attnlab.base.errors import UserError
from attnlab.config import load_config
from attnlab.model.linear import Linear
from attnlab.model.mup import apply_mup, infer, mup_param_groups, scalings, set_lr
from attnlab.model.transformer import build_model
from attnlab.parts import Dims, SideBranchPart, WidthScaling, register
from attnlab.testing.coord_check import coordinate_check

WIDTHS = (32, 64, 128)
SMALL = ["model.n_layers=2", "model.vocab_size=256", "model.max_seq_len=32", "data.seq_len=32"]


def cfg_at(width: int, *sets: str, head_dim: int = 16):
    return load_config(
        "tiny",
        [
            f"model.d_model={width}",
            f"model.attention.n_heads={width // head_dim}",
            f"model.attention.head_dim={head_dim}",
            *SMALL,
            *sets,
        ],
    ).model


def maker(*sets: str):
    return lambda w: cfg_at(w, *sets)


def check(*sets: str, mup: bool = True):
    return coordinate_check(maker(*sets), WIDTHS, mup=mup, steps=3, seeds=1)


# ------------------------------------------------------------------------- roles


@pytest.mark.fast
@pytest.mark.parametrize(
    ("shape", "base", "fan_in", "want"),
    [
        ((128, 128), (64, 64), 1, ("hidden", 2.0)),
        ((128, 256), (64, 64), 1, ("hidden", 4.0)),  # m is the fan-in's own ratio
        ((256, 128), (256, 64), 1, ("output", 2.0)),  # width -> a finite size (a router)
        ((128, 256), (64, 256), 1, ("input", 1.0)),  # a finite size -> width
        ((256, 128), (256, 64), 0, ("input", 1.0)),  # an embedding [vocab, d]
        ((128,), (64,), 1, ("input", 1.0)),  # a bias or a norm's gain
        ((7,), (7,), 1, ("fixed", 1.0)),
        ((), (), 1, ("fixed", 1.0)),
    ],
)
def test_a_parameters_role_follows_from_which_dimensions_grow(shape, base, fan_in, want):
    assert infer(torch.Size(shape), torch.Size(base), fan_in) == want


def test_the_baselines_roles_against_a_base_of_half_the_width_and_another_depth():
    cfg = cfg_at(128, "model.n_layers=3")
    model = build_model(cfg)
    s = scalings(model, cfg_at(64))  # 2 layers: matched by name without the layer index
    assert s["embed.weight"].role == "input" and s["abs_pos.table.weight"].role == "input"
    assert "lm_head.weight" not in s  # tied to the embedding: one parameter, an input
    q = s["decoder.blocks.2.attention.query.w_q.weight"]
    assert (q.role, q.width_mult, q.init_scale, q.lr_scale) == ("hidden", 2.0, 2**-0.5, 0.5)
    ffn = s["decoder.blocks.0.ffn.w_out.weight"]  # fan-in 4d: m = 512 / 256
    assert (ffn.role, ffn.width_mult) == ("hidden", 2.0)
    assert s["decoder.blocks.0.norm1.weight"].role == "input"
    assert all(not x.declared for x in s.values())
    untied = build_model(cfg_at(128, "model.tie_embeddings=false"))
    head = scalings(untied, cfg_at(64, "model.tie_embeddings=false"))["lm_head.weight"]
    assert (head.role, head.init_scale, head.lr_scale) == ("readout", 1.0, 1.0)


def test_declared_roles_replace_the_shape_rule():
    """MoE values stack experts as [E, d, h] (the shape rule would read E as the fan-out and
    call it an output); virtual heads keep their identity init."""
    moe = cfg_at(64, "model.value.kind=moe", "model.bias=true")
    s = scalings(build_model(moe), cfg_at(32, "model.value.kind=moe", "model.bias=true"))
    w_in = s["decoder.blocks.0.attention.value.w_in"]
    assert (w_in.role, w_in.width_mult, w_in.declared) == ("hidden", 2.0, True)
    assert s["decoder.blocks.0.attention.value.b_in"].role == "input"
    assert s["decoder.blocks.0.attention.value.router.weight"].role == "output"
    vh = ["model.score.kind=virtual_heads", "model.attention.backend=math"]
    s = scalings(build_model(cfg_at(64, *vh)), cfg_at(32, *vh))
    w = s["decoder.blocks.0.attention.score.weight"]
    assert (w.role, w.keep_init, w.init_scale, w.lr_scale) == ("hidden", True, 1.0, 0.5)


# ------------------------------------------------------------------------- apply and groups


def test_at_the_base_width_mup_is_the_standard_model():
    cfg = cfg_at(64)
    torch.manual_seed(0)
    plain = build_model(cfg)
    mup = copy.deepcopy(plain)
    plan = apply_mup(mup, cfg, cfg)
    assert plan.hooks == [] and plan.attention_scale == 1.0
    ids = torch.randint(0, 256, (2, 12))
    assert torch.equal(plain(ids).logits, mup(ids).logits)
    groups = mup_param_groups(mup, plan, 0.1)
    assert {g["lr_scale"] for g in groups} == {1.0}


def test_init_attention_and_readout_factors_at_four_times_the_width():
    cfg, base = cfg_at(256, head_dim=32), cfg_at(64, head_dim=16)
    torch.manual_seed(0)
    plain = build_model(cfg)
    mup = copy.deepcopy(plain)
    apply_mup(mup, cfg, base)
    w = "decoder.blocks.0.attention.query.w_q.weight"
    got, was = dict(mup.named_parameters())[w], dict(plain.named_parameters())[w]
    assert torch.allclose(got, was * 0.5)  # m = 4: std x 4^-1/2
    assert torch.equal(mup.embed.weight, plain.embed.weight)  # input: unchanged
    core = mup.decoder.blocks[0].attention.core
    assert core.scale == pytest.approx(math.sqrt(16) / 32)  # c sqrt(d_h(base)) / d_h
    # the readout: with the plain weights back, logits are the plain model's times 1/m
    mup.load_state_dict(plain.state_dict())
    for m in mup.modules():
        if type(m).__name__ == "AttentionCore":
            m.scale = plain.decoder.blocks[0].attention.core.scale
    ids = torch.randint(0, 256, (2, 12))
    assert torch.allclose(mup(ids).logits, plain(ids).logits / 4, atol=1e-6)
    targets = torch.randint(0, 256, (2, 12))  # the fused loss reads the same scaled state
    with torch.no_grad():
        fused = float(mup(ids, targets, return_logits=False).loss)
        assert fused == pytest.approx(float(mup(ids, targets).loss), rel=1e-5)
    with pytest.raises(ValueError, match="already applied"):
        apply_mup(mup, cfg, base)


def test_adam_groups_scale_hidden_learning_rates_and_keep_lr_times_decay():
    cfg = cfg_at(128)
    model = build_model(cfg)
    plan = apply_mup(model, cfg, cfg_at(32))
    groups = mup_param_groups(model, plan, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert sum(len(g["params"]) for g in groups) == len(names)
    for g in groups:
        for p in g["params"]:
            assert g["lr_scale"] == plan.params[names[id(p)]].lr_scale
        if g["weight_decay"]:
            assert g["weight_decay"] * g["lr_scale"] == pytest.approx(0.1)
    opt = torch.optim.AdamW(groups, lr=1.0)
    set_lr(opt, 3e-3)
    assert {g["lr"] for g in opt.param_groups} == {3e-3, 3e-3 / 4}


def test_a_declaration_of_a_missing_parameter_is_a_user_error():
    @register("side_branch", "mup_typo")
    class Typo(SideBranchPart):
        def __init__(self, opts, dims: Dims) -> None:
            super().__init__(opts, dims)
            self.w = Linear(dims.d_model, dims.d_model, bias=False)

        def width_scaling(self):
            return {"w.wieght": WidthScaling("hidden")}

        def forward(self, x):
            return self.w(x)

    model = build_model(cfg_at(64, "model.side_branch.kind=mup_typo"))
    with pytest.raises(UserError, match=r"declares width_scaling for 'w.wieght'.*w.weight"):
        scalings(model, cfg_at(32, "model.side_branch.kind=mup_typo"))


# ------------------------------------------------------------------------- coordinate check


@pytest.fixture(scope="module")
def baseline_check():
    return check()


def test_mup_passes_the_coordinate_check_for_the_baseline(baseline_check):
    baseline_check.assert_passed()
    assert "passed" in baseline_check.message()
    assert max(baseline_check.growth(n) for n in baseline_check.order) < 0.15
    assert len(baseline_check.slopes) > 10 and "lm_head" in baseline_check.slopes


@pytest.mark.parametrize(
    "sets",
    [
        ("model.query.kind=nonlinear",),
        ("model.feature_map.kind=pre_projection", "model.side_branch.kind=content_skip"),
    ],
    ids=["nonlinear_query", "preproj_skip"],
)
def test_mup_passes_the_coordinate_check_for_the_seed_parts(sets):
    result = check(*sets)
    result.assert_passed()
    assert "passed" in result.message()
    assert max(result.growth(n) for n in result.order) < 0.15  # well inside the threshold
    assert len(result.slopes) > 10 and "lm_head" in result.slopes


def test_the_standard_parametrisation_fails_it():
    result = check(mup=False)
    assert not result.passed
    assert "coordinate check failed (the standard parametrisation" in result.message()
    first = result.failures[0]
    assert result.growth(first) > 0.5
    assert all(w.startswith(first) for w in result.weights[first])


class MisDeclaredSkip(SideBranchPart):
    """out = x~ W (d x d), declared input-like: its learning rate is not scaled with width."""

    def __init__(self, opts, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.w_skip = Linear(dims.d_model, dims.d_model, bias=False)

    def width_scaling(self):
        return {"w_skip.weight": WidthScaling("input")}

    def forward(self, x_tilde):
        return self.w_skip(x_tilde)


class LearningRateOnlySkip(SideBranchPart):
    """out = x~ W with a right µP init (std ~ 1/sqrt(d), kept) but declared input-like: only its
    learning rate is wrong, which the change over the steps shows."""

    def __init__(self, opts, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.w_lr = Linear(dims.d_model, dims.d_model, bias=False)

    def init_weights(self, init) -> None:
        nn.init.normal_(self.w_lr.weight, 0.0, 0.02 * math.sqrt(32 / self.dims.d_model))

    def width_scaling(self):
        return {"w_lr.weight": WidthScaling("input", keep_init=True)}

    def forward(self, x_tilde):
        return self.w_lr(x_tilde)


class LoudSkip(SideBranchPart):
    """out = x~ W sqrt(d / 16): a forward factor that grows with width, whatever the init."""

    def __init__(self, opts, dims: Dims) -> None:
        super().__init__(opts, dims)
        self.w_loud = Linear(dims.d_model, dims.d_model, bias=False)

    def forward(self, x_tilde):
        return self.w_loud(x_tilde) * math.sqrt(self.dims.d_model / 16)


@pytest.fixture(scope="module")
def mis_scaled_parts():
    """The three mis-scaled parts, registered for this module only (registered at import, they
    would be collected as parts by the battery's items in the same process)."""
    register("side_branch", "mis_declared_skip")(MisDeclaredSkip)
    register("side_branch", "lr_only_skip")(LearningRateOnlySkip)
    register("side_branch", "loud_skip")(LoudSkip)


def test_a_mis_declared_plugin_weight_fails_and_is_named(mis_scaled_parts):
    result = check("model.side_branch.kind=mis_declared_skip")
    assert not result.passed
    first = result.failures[0]
    assert first == "decoder.blocks.0.side_branch.w_skip"
    msg = result.message()
    assert "the output of decoder.blocks.0.side_branch.w_skip grows with width (its " in msg
    assert "its weights: decoder.blocks.0.side_branch.w_skip.weight" in msg
    assert "Part.width_scaling" in msg
    with pytest.raises(AssertionError, match=r"w_skip\.weight"):
        result.assert_passed()


def test_a_wrong_learning_rate_alone_fails_through_the_change_it_makes(mis_scaled_parts):
    result = check("model.side_branch.kind=lr_only_skip")
    first = "decoder.blocks.0.side_branch.w_lr"
    assert result.failures[0] == first
    assert result.slopes[first] < result.update_slopes[first]
    assert "its change over the steps as width^" in result.message()
    assert "decoder.blocks.0.side_branch.w_lr.weight" in result.message()


def test_a_plugin_whose_forward_grows_with_width_fails_and_is_named(mis_scaled_parts):
    result = check("model.side_branch.kind=loud_skip")
    assert result.failures[0] == "decoder.blocks.0.side_branch"
    assert result.growth("decoder.blocks.0.side_branch.w_loud") < 0.25  # the Linear is fine
    assert "its weights: decoder.blocks.0.side_branch.w_loud.weight" in result.message()


def test_the_check_needs_three_widths():
    with pytest.raises(ValueError, match="at least 3 widths"):
        coordinate_check(maker(), (32, 64))


def test_every_module_with_weights_is_watched(baseline_check):
    result = baseline_check
    model = build_model(cfg_at(32))
    own = {n for n, m in model.named_modules() if n and next(m.parameters(False), None) is not None}
    assert own <= set(result.scales)  # the fused Q, K, V weights too: the check unfuses them
    assert "decoder.blocks.0.attention.query.w_q" in own and "embed" in result.scales


# ------------------------------------------------------------------ the battery's property


def test_the_battery_fails_a_mis_scaled_plugin_part_naming_its_weight():
    from attnlab.testing import check_part

    report = check_part("side_branch", "mis_declared_skip", compile=False, export=False)
    result = next(r for r in report.results if r.name == "coord_check")
    assert result.status == "failed"
    assert result.measured > result.limit == 0.25
    assert "decoder.blocks.0.side_branch.w_skip.weight" in result.message()
    assert "grows with width" in result.message()
    assert not report.passed


def test_the_battery_passes_the_seed_parts():
    from attnlab.testing.cases import CASES, float64
    from attnlab.testing.width_transfer import check as coord_property

    with float64():
        for slot, kind in (("query", "nonlinear"), ("side_branch", "content_skip")):
            result = coord_property(f"{slot}.{kind}", slot, kind, {}, CASES[0])
            assert result.status == "passed", result.message()
            assert result.measured < result.limit


# ------------------------------------------------------------------ µP through the config


def test_model_parametrisation_mup_is_applied_by_build_model_and_the_optimizer():
    from attnlab.model import build_model
    from attnlab.runs.optim import recipe_optimizer, set_lr

    sets = ["model.parametrisation=mup", "model.mup_base_width=32"]
    cfg = load_config("tiny", [*SMALL, "model.d_model=128", "model.attention.n_heads=8",
                               "model.attention.head_dim=16", *sets])  # fmt: skip
    model = build_model(cfg.model)
    plan = model.mup_plan
    assert (plan.base_d_model, plan.d_model, plan.output_multiplier) == (32, 128, 0.25)
    opt = recipe_optimizer(model, cfg.train, torch.device("cpu"))
    set_lr(opt, 1e-2)
    names = {id(p): n for n, p in model.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            assert group["lr"] == pytest.approx(1e-2 * plan.params[names[id(p)]].lr_scale)
    hidden = "decoder.blocks.0.ffn.w_in.weight"
    assert plan.params[hidden].lr_scale == 0.25
    # the same config, standard: one learning rate, no plan
    std = build_model(load_config("tiny", [*SMALL, "model.d_model=128"]).model)
    assert getattr(std, "mup_plan", None) is None
    # the base is the standard model at the base width: µP there changes nothing
    same = load_config("tiny", [*SMALL, "model.parametrisation=mup"]).model
    torch.manual_seed(0)
    a = build_model(same)
    torch.manual_seed(0)
    b = build_model(same.model_copy(update={"parametrisation": "standard"}))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_export_refuses_a_mup_model_naming_why(tmp_path):
    from attnlab.base.errors import UserError
    from attnlab.hf.export import export_model

    cfg = load_config("tiny", [*SMALL, "model.parametrisation=mup", "model.mup_base_width=32"])
    with pytest.raises(UserError, match=r"parametrisation='mup'.*attnlab eval"):
        export_model(None, cfg, None, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
