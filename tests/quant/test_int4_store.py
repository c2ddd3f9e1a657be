"""int4 weights on disk (attnlab.quant.int4_store): packed two per byte, reloaded into the very
tensor ``quantize_model`` made, and a damaged file refused. References: a nibble packing written
out here byte by byte, torchao's own ``Int4OpaqueTensor`` from ``quantize_``, and the size the
format's formula gives."""

from __future__ import annotations

import copy
import json

import pytest
import torch

pytest.importorskip("torchao")

from attnlab.base.errors import UserError
from attnlab.quant import get_scheme, quantize_model, store
from attnlab.quant.int4_store import NIBBLES, pack_nibbles, unpack_nibbles

GROUP = 32


@pytest.fixture(scope="module")
def int4_dir(tiny, tmp_path_factory):
    cfg, model = tiny
    q = copy.deepcopy(model)
    quantize_model(q, get_scheme("int4-weight"), GROUP)
    out = tmp_path_factory.mktemp("int4") / "q"
    rec = store.save(
        out, q, cfg, {"scheme": "int4-weight", "group_size": GROUP}, full_precision=model
    )
    return q, out, rec


def _int4_weights(model):
    return {n: t for n, t in model.state_dict().items() if type(t).__name__ == "Int4OpaqueTensor"}


@pytest.mark.fast
def test_nibbles_pack_two_per_byte_low_nibble_first():
    q = torch.randint(0, 16, (3, 8), generator=torch.Generator().manual_seed(0))
    packed = pack_nibbles(q)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 4)
    for r in range(3):
        for j in range(4):
            assert int(packed[r, j]) == int(q[r, 2 * j]) + 16 * int(q[r, 2 * j + 1])
    assert torch.equal(unpack_nibbles(packed), q.to(torch.int32))


def test_int4_reloads_bit_identical(tiny, int4_dir):
    cfg, _ = tiny
    q, out, rec = int4_dir
    assert rec["stored_in_float_requantized_at_load"] == []
    made = _int4_weights(q)
    assert sorted(rec["int4_packed"]) == sorted(made)
    back = _int4_weights(store.load(out).model)
    assert sorted(back) == sorted(made)
    for name, t in made.items():
        assert torch.equal(back[name].qdata, t.qdata), name
        assert torch.equal(back[name].scale_and_zero, t.scale_and_zero), name
    x = torch.randint(0, cfg.model.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(store.load(out).model(x).logits, q(x).logits)


def test_int4_file_is_a_quarter_of_float_plus_the_group_scales(tiny, int4_dir):
    """Bound: each int4 weight in/2 bytes + a float32 scale and zero per group of 32, every other
    tensor float32 once, plus the safetensors header; well under half of float32's file."""
    _, model = tiny
    q, _, rec = int4_dir
    made = _int4_weights(q)
    int4 = sum(t.shape[0] * t.shape[1] * (0.5 + 8 / GROUP) for t in made.values())
    seen, rest = set(), 0
    for name, t in model.state_dict().items():
        if name not in made and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            rest += t.numel() * 4
    assert rec["size_on_disk_bytes"] <= int4 + rest + 64 * 1024
    fp32_of_the_int4_weights = sum(t.shape[0] * t.shape[1] * 4 for t in made.values())
    assert int4 <= 0.1875 * fp32_of_the_int4_weights  # 0.125 + 2 x 4 B per 32 weights
    assert rec["size_on_disk_bytes"] < 0.45 * (rest + fp32_of_the_int4_weights)


def _flip_a_nibble_byte(path, which: str) -> None:
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    name = next(k for k in header if k.endswith(which))
    start = 8 + n + header[name]["data_offsets"][0]
    raw[start] ^= 0x11
    path.write_bytes(bytes(raw))


def test_a_damaged_int4_payload_or_record_is_refused(int4_dir, tmp_path):
    import shutil

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    _, out, _ = int4_dir
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    _flip_a_nibble_byte(bad / store.WEIGHTS_FILE, f".{NIBBLES}")
    with pytest.raises(UserError, match="is damaged"):
        store.load(bad)

    shutil.rmtree(bad)
    shutil.copytree(out, bad)
    path = bad / store.WEIGHTS_FILE
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
    records = json.loads(meta["attnlab_int4"])
    first = next(iter(records))
    records[first]["shape"] = [records[first]["shape"][0], records[first]["shape"][1] * 2]
    meta["attnlab_int4"] = json.dumps(records)
    save_file(load_file(path), path, metadata=meta)
    with pytest.raises(UserError, match="is damaged"):
        store.load(bad)

    path.write_bytes(path.read_bytes()[:-100])  # truncated
    with pytest.raises(UserError, match="cannot be read"):
        store.load(bad)


def test_a_rounding_that_would_not_rebuild_the_same_tensor_falls_back_to_float(
    tiny, tmp_path, monkeypatch
):
    """If torchao's rounding ever differs from the stored form's (a new release), the weight is
    stored in float and quantized again at load, never written in a form that loads different."""
    import attnlab.quant.int4_store as int4_store

    cfg, model = tiny
    q = copy.deepcopy(model)
    quantize_model(q, get_scheme("int4-weight"), GROUP)
    real = int4_store._rounding

    def off_by_one_step(w, group_size):
        qint, sz = real(w, group_size)
        return qint, sz * 1.001

    monkeypatch.setattr(int4_store, "_rounding", off_by_one_step)
    rec = store.save(
        tmp_path / "q", q, cfg, {"scheme": "int4-weight", "group_size": GROUP}, full_precision=model
    )
    assert rec["int4_packed"] == [] and rec["stored_in_float_requantized_at_load"]
    monkeypatch.setattr(int4_store, "_rounding", real)
    x = torch.randint(0, cfg.model.vocab_size, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(store.load(tmp_path / "q").model(x).logits, q(x).logits)
