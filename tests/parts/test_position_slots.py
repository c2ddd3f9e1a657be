"""Positions and norms are slots: no code outside their own part files (and the config schema,
and the mappings of outside architectures) names a position or norm kind, and every built-in
position part runs through the model the same way."""

from __future__ import annotations

import re

import pytest
import torch

from attnlab.config import ConfigError
from attnlab.model import build_model
from attnlab.parts import registry
from tests.helpers.model import tiny
from tests.helpers.paths import PACKAGE, ROOT

SRC = PACKAGE

#: files that may name a position or norm kind: the parts themselves, the config schema (its old
#: keys), the slot table (the defaults), the translations of outside architectures (Hugging Face
#: configs, benchmark peers) and the conformance cases (one small model per position: the cases
#: each family declares, and the battery's base)
ALLOWED = (
    "model/parts/position_*.py",
    "model/parts/norm_*.py",
    "config/legacy.py",
    "parts/slots.py",
    "hf/arch_*.py",
    "bench/peers.py",
    "testing/cases.py",
    "model/families/*.py",
)
KINDS = ("learned", "sinusoidal", "rope", "alibi", "t5", "layernorm", "rmsnorm", "scalenorm")
_ALT = "|".join(KINDS)
NAMED = re.compile(rf"""["']({_ALT})["']|=({_ALT})\b""")


@pytest.mark.fast
def test_no_code_outside_the_parts_names_a_position_or_norm_kind() -> None:
    allowed = {p for pattern in ALLOWED for p in SRC.glob(pattern)}
    assert len(allowed) >= 10
    hits = []
    for path in sorted(SRC.rglob("*.py")):
        if path in allowed:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if NAMED.search(line):
                hits.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_the_grep_would_catch_a_branch_on_a_kind() -> None:
    assert NAMED.search('if cfg.position.kind == "rope":')
    assert NAMED.search("kind='alibi'")
    assert not NAMED.search("cfg.position_limit")


@pytest.mark.fast
def test_every_builtin_position_and_norm_is_a_registered_part() -> None:
    assert set(registry.kinds("position")) >= {
        "none",
        "learned",
        "sinusoidal",
        "rope",
        "alibi",
        "t5",
    }
    assert set(registry.kinds("norm")) >= {"layernorm", "rmsnorm", "scalenorm"}
    declared = {k: registry.get("position", k).cls for k in registry.kinds("position")[1:]}
    assert [k for k, c in declared.items() if c.logit_bias] == ["alibi", "t5"]
    assert [k for k, c in declared.items() if c.rotary] == ["rope"]
    assert [k for k, c in declared.items() if c.absolute] == ["learned", "sinusoidal"]


def test_old_position_keys_keep_loading_with_the_same_numbers() -> None:
    """A recorded config held every option of every kind; the kind's own ones carry over."""
    old = {
        "kind": "rope",
        "rope_fraction": 0.5,
        "rope_base": 500.0,
        "t5_buckets": 32,
        "t5_max_distance": 128,
    }
    from attnlab.config import validate

    cfg = validate({"model": {"d_model": 32, "attention": {"n_heads": 4}, "position": old}})
    assert cfg.model.position.fraction == 0.5 and cfg.model.position.base == 500.0
    cfg = validate({"model": {"position": {**old, "kind": "learned"}}})
    assert cfg.model.position.kind == "learned"
    assert cfg.model.position.model_dump() == {"kind": "learned"}


def test_flash_is_refused_for_a_logit_bias_position() -> None:
    with pytest.raises(ConfigError, match="adds a bias to the logits"):
        tiny("model.position.kind=alibi", "model.attention.backend=flash")
    tiny("model.position.kind=rope", "model.attention.backend=flash")


def test_an_old_t5_checkpoint_loads_into_the_position_slot() -> None:
    model = build_model(tiny("model.position.kind=t5"))
    state = model.state_dict()
    old = {k.replace("decoder.position.", "decoder.t5_bias."): v for k, v in state.items()}
    assert "decoder.t5_bias.table.weight" in old
    fresh = build_model(tiny("model.position.kind=t5"))
    fresh.load_state_dict(old, strict=True)
    assert torch.equal(fresh.decoder.position.table.weight, model.decoder.position.table.weight)


def _rope(*sets: str):
    model = build_model(tiny("model.position.kind=rope", "model.max_seq_len=64", *sets))
    return model.decoder.position


def test_rope_scalings_change_the_angles_as_their_papers_define() -> None:
    pos = torch.arange(0, 200, dtype=torch.float64)
    plain = _rope()
    inv, m = plain.inv_freq(pos.device)
    assert m == 1.0 and plain.rot == 8
    # position interpolation (Chen et al. 2023): position t at factor s is position t / s
    pi = _rope("model.position.scaling=linear", "model.position.factor=4")
    cos, sin = pi.rotation(pos, torch.float64)
    want = plain.rotation(pos / 4, torch.float64)
    torch.testing.assert_close(cos, want[0]) and torch.testing.assert_close(sin, want[1])
    # NTK-aware: base * s^(rot / (rot - 2)): the highest frequency kept, the lowest divided by s
    ntk, _ = _rope("model.position.scaling=ntk", "model.position.factor=4").inv_freq(pos.device)
    assert float(ntk[0]) == pytest.approx(float(inv[0]))
    assert float(ntk[-1]) == pytest.approx(float(inv[-1]) / 4)
    # YaRN: dims turning > beta_fast times in the original 1,024 tokens kept, < beta_slow
    # times interpolated by s, a ramp between; logits scaled by (0.1 ln s + 1)^2 (cos and sin)
    yarn = _rope(
        "model.position.scaling=yarn",
        "model.position.factor=4",
        "model.position.original_length=1024",
    )
    y, mscale = yarn.inv_freq(pos.device)
    turns = 1024 * inv / (2 * torch.pi)
    assert [int((turns >= 32).sum()), int(((turns > 1) & (turns < 32)).sum())] == [1, 2]
    assert mscale == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1)
    torch.testing.assert_close(y[turns >= 32], inv[turns >= 32])
    torch.testing.assert_close(y[turns <= 1], inv[turns <= 1] / 4)
    mid = (turns > 1) & (turns < 32)
    assert mid.any() and bool(((y[mid] < inv[mid]) & (y[mid] > inv[mid] / 4)).all())
    c, _ = yarn.rotation(pos[:3], torch.float64)
    torch.testing.assert_close(c[0], torch.full((8,), mscale, dtype=torch.float64))


@pytest.mark.parametrize(
    "head_dim,fraction,base,factor,original,fast,slow",
    [
        (16, 1.0, 10000.0, 4.0, 1024, 32.0, 1.0),
        (64, 1.0, 10000.0, 8.0, 2048, 32.0, 1.0),
        (128, 1.0, 500000.0, 16.0, 4096, 32.0, 1.0),
        (64, 0.25, 10000.0, 2.0, 512, 16.0, 2.0),
        (32, 1.0, 10000.0, 32.0, 64, 8.0, 0.5),
    ],
)
def test_yarn_equals_transformers_compute_yarn_parameters(
    head_dim: int, fraction: float, base: float, factor: float, original: int, fast, slow
) -> None:
    """attnlab's YaRN gives transformers' inverse frequencies and attention factor (Llama config,
    rope_type yarn, default truncate=True), item by item."""
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers import LlamaConfig

    heads = 2
    model = build_model(
        tiny(
            f"model.d_model={head_dim * heads}",
            f"model.attention.n_heads={heads}",
            "model.position.kind=rope",
            f"model.position.fraction={fraction}",
            f"model.position.base={base}",
            "model.position.scaling=yarn",
            f"model.position.factor={factor}",
            f"model.position.original_length={original}",
            f"model.position.beta_fast={fast}",
            f"model.position.beta_slow={slow}",
        )
    )
    ours, scale = model.decoder.position.inv_freq(torch.device("cpu"))
    config = LlamaConfig(
        hidden_size=head_dim * heads,
        num_attention_heads=heads,
        head_dim=head_dim,
        max_position_embeddings=int(original * factor),
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": base,
            "partial_rotary_factor": fraction,
            "factor": factor,
            "original_max_position_embeddings": original,
            "beta_fast": fast,
            "beta_slow": slow,
        },
    )
    theirs, their_scale = rope_utils._compute_yarn_parameters(config, torch.device("cpu"))
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-6, atol=1e-6)
    assert scale == pytest.approx(their_scale, abs=1e-6)


def test_rope_scaling_keeps_the_weights_so_a_run_can_take_it_at_evaluation() -> None:
    model = build_model(tiny("model.position.kind=rope"))
    scaled = build_model(
        tiny("model.position.kind=rope", "model.position.scaling=yarn", "model.position.factor=8")
    )
    scaled.load_state_dict(model.state_dict(), strict=True)
    x = torch.randint(0, 64, (1, 40))
    assert not torch.allclose(model(x).logits, scaled(x).logits)


def test_shipped_files_write_todays_position_keys() -> None:
    """Presets, the Hugging Face architecture maps and every other shipped file write today's
    position options (``fraction``, ``base``, ...); only the table of old keys names the old."""
    from attnlab.config import LEGACY_POSITION_KEYS

    root = ROOT
    old = re.compile(rf"\b({'|'.join(LEGACY_POSITION_KEYS)})\b")
    files = [p for d in ("src/attnlab", "configs", "examples") for p in (root / d).rglob("*")]
    hits = [
        str(p.relative_to(root))
        for p in files
        if p.suffix in (".py", ".toml")
        and p != SRC / "config" / "legacy.py"
        and old.search(p.read_text(encoding="utf-8"))
    ]
    assert len(files) > 100 and hits == []
