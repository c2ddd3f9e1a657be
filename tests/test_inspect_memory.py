"""``attnlab inspect`` on a 2,048-token prompt with the fused virtual heads builds its page in
bounded memory: peak RSS (measured in a fresh process) exceeds that of the model's own forward
pass by less than ONE full [H', T, T] float32 map, while a forward that returns the maps
(``return_attn``) exceeds it by more (so the measure can tell)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attnlab.train import train
from data_helpers import sentence_data, tiny_run_config

T = 2048
SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    import torch
    torch.set_num_threads(1)
    from attnlab.inspection import inspect_targets, load_target
    run, mode, out = sys.argv[1:4]
    text = ("attention " * 300)[:%d]
    lm, family, mask = load_target(run)
    ids = torch.tensor([lm.encode(text)])
    notes = []
    if mode == "forward":
        with torch.no_grad():
            lm.model(ids)
    elif mode == "maps":
        with torch.no_grad():
            lm.model(ids, return_attn=True)
    else:
        _, caps = inspect_targets([run], out, prompt=text, max_tokens=128)
        notes = caps[0].notes
    print(json.dumps({"rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "notes": notes}))
    """
    % T
)


@pytest.fixture(scope="module")
def fused_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("long")
    data = sentence_data(root)
    sets = (
        "model.score.kind=virtual_heads_fused",
        "model.score.kernel_size=3",
        f"model.max_seq_len={T}",
        "model.position.kind=rope",
    )
    run = root / "run"
    assert train(tiny_run_config(data, *sets, steps=2), run).status == "finished"
    return run


def _peak(run: Path, mode: str, out: Path) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(run), mode, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_2048_token_page_on_fused_virtual_heads_is_built_in_bounded_memory(fused_run, tmp_path):
    page = tmp_path / "long.html"
    forward = _peak(fused_run, "forward", page)["rss_kib"] * 1024
    got = _peak(fused_run, "inspect", page)
    maps = _peak(fused_run, "maps", page)["rss_kib"] * 1024
    heads = 4  # tiny: 4 heads, H' = H
    one_map = heads * T * T * 4  # one layer's [H', T, T] float32 map: 64 MiB
    extra = got["rss_kib"] * 1024 - forward
    print(
        f"peak RSS: forward {forward / 2**20:.0f} MiB, inspect +{extra / 2**20:.0f} MiB, "
        f"return_attn +{(maps - forward) / 2**20:.0f} MiB"
    )
    assert extra < one_map
    assert maps - forward > one_map
    (note,) = [n for n in got["notes"] if "summarised" in n]
    assert f"the prompt has {T} tokens" in note and "last 128 positions" in note
    assert page.stat().st_size < 5_000_000
