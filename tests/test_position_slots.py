"""Positions and norms are slots: no code outside their own part files (and the config schema,
and the mappings of outside architectures) names a position or norm kind, and every built-in
position part runs through the model the same way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from attnlab.config import ConfigError
from attnlab.model import build_model
from attnlab.parts import registry
from model_helpers import tiny

SRC = Path(__file__).resolve().parents[1] / "src" / "attnlab"

#: files that may name a position or norm kind: the parts themselves, the config schema (its old
#: keys), the slot table (the defaults), the translations of outside architectures (Hugging Face
#: configs, benchmark peers) and the conformance cases (one small model per position)
ALLOWED = (
    "model/parts/position_*.py",
    "model/parts/norm_*.py",
    "config.py",
    "parts/slots.py",
    "hf/arch_*.py",
    "bench/peers.py",
    "testing/cases.py",
)
KINDS = ("learned", "sinusoidal", "rope", "alibi", "t5", "layernorm", "rmsnorm", "scalenorm")
_ALT = "|".join(KINDS)
NAMED = re.compile(rf"""["']({_ALT})["']|=({_ALT})\b""")


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
