"""Masks are a slot (issue 34): each built-in mask is a registered part declaring the attention
engine's ``mask_mod`` and hints; no code outside the mask parts branches on a mask name; the old
``model.attention`` keys load through config/'s one migration table with an OldKeyWarning; and
the document mask reads the document boundaries the data pipeline records."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch

from attnlab.config import ConfigError, ModelConfig, load_config
from attnlab.config.legacy_mask import OldKeyWarning
from attnlab.data.documents import boundaries, document_ids
from attnlab.model import build_model
from attnlab.model.engine import Mask
from attnlab.parts import MaskPart, registry
from attnlab.train.objectives import make_batch, resolve_objective
from tests.helpers.model import make_part, tiny
from tests.helpers.paths import PACKAGE

#: files that may name a mask: the mask parts, the engine's masks, the migration table, the
#: families' check cases (one small model per mask) and the slot's contract
ALLOWED = (
    "model/parts/mask_*.py",
    "model/engine/*.py",
    "config/legacy_mask.py",
    "config/mask_checks.py",
    "model/families/*.py",
    "parts/slots.py",
    "parts/slot_mask.py",
    "parts/family.py",
)
NAMES = ("bidirectional", "prefix", "sliding", "local_global", "bigbird", "document")
_ALT = "|".join(NAMES)
#: a quoted mask name, or a comparison of anything called mask (``cfg.mask.kind == ...``)
BRANCH = re.compile(rf"""["']({_ALT})["']|\bmask\w*(\.kind)?\s*(==|!=|\bin\b|\bnot in\b)""")


@pytest.mark.fast
def test_no_code_outside_the_mask_parts_branches_on_a_mask() -> None:
    allowed = {p for pattern in ALLOWED for p in PACKAGE.glob(pattern)}
    assert len([p for p in allowed if p.name.startswith("mask_")]) >= 7
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in allowed:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if BRANCH.search(line):
                hits.append(f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)


@pytest.mark.fast
def test_the_grep_would_catch_a_branch_on_a_mask() -> None:
    assert BRANCH.search('if a.mask == "prefix" and ids.shape[1] < a.prefix_len:')
    assert BRANCH.search('simple = mask in ("causal", "bidirectional")')
    assert BRANCH.search("if cfg.mask.kind != 'sliding':")
    assert not BRANCH.search("padding_mask = batch.mask_of(x)")


def test_every_builtin_mask_is_a_registered_part_declaring_an_engine_mask() -> None:
    kinds = set(registry.kinds("mask"))
    assert kinds >= {"causal", "full", "prefix", "sliding", "local_global", "bigbird", "document"}
    options = {
        "prefix": {"prefix_len": 2},
        "sliding": {"window": 2},
        "local_global": {"window": 2, "n_global": 1},
        "bigbird": {"window": 2, "random_blocks": 1, "block_size": 2},
    }
    for kind in kinds - {"none"}:
        part = make_part("mask", kind, **options.get(kind, {}))
        assert isinstance(part, MaskPart)
        for causal in (True, False):
            mask = part(causal)
            assert isinstance(mask, Mask), kind
            allowed = mask.fit(6, 6, "cpu").mask_mod(
                torch.tensor(0), torch.tensor(0), torch.arange(6)[:, None], torch.arange(6)[None]
            )
            assert allowed.shape == (6, 6) and bool(allowed.diagonal().all()), kind


def test_old_attention_keys_load_as_the_mask_slot_with_a_warning() -> None:
    with pytest.warns(OldKeyWarning, match=r"model\.attention\.mask is the old spelling"):
        cfg = tiny("model.attention.mask=sliding", "model.attention.window=3")
    assert cfg.mask.kind == "sliding" and cfg.mask.window == 3
    with pytest.warns(OldKeyWarning):
        enc = tiny("model.family=encoder", "model.attention.mask=bidirectional")
    assert enc.mask.kind == "full"
    # a recorded config of the old version held every key, zeros for the unused ones
    recorded = {
        "attention": {
            "mask": "local_global",
            "window": 4,
            "global_every": 0,
            "n_global": 2,
            "prefix_len": 0,
            "block_size": 16,
            "random_blocks": 0,
            "random_seed": 0,
        }
    }
    with pytest.warns(OldKeyWarning, match=r"\[model\.mask\] kind = 'local_global'"):
        cfg = ModelConfig.model_validate(recorded)
    assert cfg.mask.model_dump() == {
        "kind": "local_global",
        "window": 4,
        "n_global": 2,
        "global_every": 0,
    }
    assert "mask" not in cfg.attention.model_dump()


def test_the_new_keys_load_without_a_warning_and_bad_options_name_the_key() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", OldKeyWarning)
        cfg = tiny("model.mask.kind=prefix", "model.mask.prefix_len=3")
    assert cfg.mask_class.decoder_only and cfg.mask.prefix_len == 3
    with pytest.raises(ConfigError, match=r"model\.mask\.kind='sliding' needs model\.mask\.window"):
        tiny("model.mask.kind=sliding")
    with pytest.raises(ConfigError, match=r"would let it see the tokens it predicts"):
        tiny("model.mask.kind=full")


def test_document_ids_come_from_the_end_of_text_tokens() -> None:
    x = np.array([[5, 9, 256, 7, 7, 256, 1], [256, 3, 4, 5, 6, 7, 8]])
    assert [b.tolist() for b in boundaries(x, 256)] == [[2, 5], [0]]
    assert document_ids(x, 256).tolist() == [[0, 0, 0, 1, 1, 1, 2], [0, 1, 1, 1, 1, 1, 1]]


def test_the_document_mask_keeps_packed_documents_apart_in_training_batches() -> None:
    """The batch carries the ids (the mask part declares ``needs_doc_ids``); a position's
    logits do not move when another document's tokens change, and do when its own do."""
    cfg = tiny("model.mask.kind=document")
    x = np.random.default_rng(0).integers(0, 60, (2, 13))
    x[0, 4], x[1, 8] = 63, 63  # the end-of-text token
    objective = resolve_objective(cfg, load_config("tiny").train)
    batch = make_batch(
        objective, x[:, :-1], x[:, 1:], None, vocab=64, mask_prob=0.15, eos_id=63, model=cfg
    )
    assert torch.equal(batch.doc_ids, torch.from_numpy(document_ids(x[:, :-1], 63)))
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():
        base = model(batch.input_ids, **batch.inputs).logits
        other = batch.input_ids.clone()
        other[0, :4] = (other[0, :4] + 1) % 60  # row 0's first document
        moved = model(other, **batch.inputs).logits
        plain = model(other).logits  # no ids: one document per row
    assert torch.equal(moved[0, 5:], base[0, 5:]) and torch.equal(moved[1], base[1])
    assert not torch.allclose(moved[0, :4], base[0, :4])
    assert not torch.allclose(plain[0, 5:], base[0, 5:])
