"""``attnlab inspect`` on a 2,048-token prompt with the fused virtual heads builds its page in
bounded memory: its peak RSS (Linux VmHWM, reset before each phase through /proc/self/clear_refs,
in a fresh process) exceeds that of the model's own forward pass by less than ONE full
[H', T, T] float32 map, while a forward that returns the maps (``return_attn``) exceeds it by more
(so the measure can tell)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attnlab.train import train
from tests.helpers.data import sentence_data, tiny_run_config

T = 2048
pytestmark = pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="peak RSS per phase needs Linux /proc"
)
SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    torch.set_num_threads(1)
    from attnlab.inspection import capture, load_target, write_page
    run, out = sys.argv[1:3]
    text = ("attention " * 300)[:__T__]

    def reset():  # Linux: writing 5 to clear_refs resets the peak RSS (VmHWM) to the current RSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def peak():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

    lm, family, mask = load_target(run)
    ids = torch.tensor([lm.encode(text)])
    with torch.no_grad():
        lm.model(ids)  # warm up (allocator, kernels) before measuring
    reset()
    with torch.no_grad():
        lm.model(ids)
    forward = peak()
    reset()
    cap = capture(lm.model, ids[0].tolist(), lm.decode, name="run", target=run, max_tokens=128)
    write_page(out, [cap])
    inspect = peak()
    reset()
    with torch.no_grad():
        lm.model(ids, return_attn=True)
    maps = peak()
    print(json.dumps({"forward": forward, "inspect": inspect, "maps": maps,
                      "notes": cap.notes}))
    """
).replace("__T__", str(T))


@pytest.fixture(scope="module")
def fused_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("long")
    data = sentence_data(root)
    sets = (
        "model.score.kind=virtual_heads_fused",
        "model.score.kernel_size=3",
        "model.score.mixing=none",  # each virtual head convolves its own head's keys (fast)
        f"model.max_seq_len={T}",
        "model.position.kind=rope",
    )
    run = root / "run"
    assert train(tiny_run_config(data, *sets, steps=2), run).status == "finished"
    return run


def test_a_2048_token_page_on_fused_virtual_heads_is_built_in_bounded_memory(fused_run, tmp_path):
    page = tmp_path / "long.html"
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(fused_run), str(page)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    heads = 4  # tiny: 4 heads, H' = H
    one_map = heads * T * T * 4  # one layer's [H', T, T] float32 map: 64 MiB
    extra = got["inspect"] - got["forward"]
    more = got["maps"] - got["forward"]
    print(
        f"peak RSS: forward {got['forward'] / 2**20:.0f} MiB, inspect "
        f"+{extra / 2**20:.0f} MiB, return_attn +{more / 2**20:.0f} MiB (each peak from its own "
        "start)"
    )
    assert extra < one_map
    assert more > one_map  # the measure sees a materialised map
    (note,) = [n for n in got["notes"] if "summarised" in n]
    assert f"the prompt has {T} tokens" in note and "last 128 positions" in note
    assert page.stat().st_size < 5_000_000
