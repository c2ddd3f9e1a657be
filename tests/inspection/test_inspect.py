"""``attnlab inspect``: the page of one or two models on one prompt, for a run of every built-in
variant, a plugin run, every family, and a long prompt on a fused part (bounded memory).

The page's data is read back from the written HTML (its JSON element) and checked against the
model itself: the maps are the model's own ``return_attn`` maps, the per-token loss is the
model's cross-entropy, a part's per-token view is what the part computes."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.cli import main
from attnlab.inspection import capture
from attnlab.model.transformer import build_model
from attnlab.train import train
from tests.helpers.data import sentence_data, tiny_run_config
from tests.helpers.model import tiny

PROMPT = "the cat sat on the mat and looked at the dog."
IDENTITY_HEAD = (
    "model.readout.kind=identity_head",
    "model.residual=false",
    "model.mlp=false",
    "model.mixer.kind=nonlinear",
)
#: a run of every built-in variant (short: two steps)
VARIANTS = {
    "baseline": (),
    "nonlinear_query": ("model.query.kind=nonlinear",),
    "preproj_skip": (
        "model.feature_map.kind=pre_projection",
        "model.side_branch.kind=content_skip",
    ),
    "identity_head": IDENTITY_HEAD,
    "moe_values": (
        "model.value.kind=moe",
        "model.value.n_experts=4",
        "model.mlp=false",
        "model.n_layers=1",
        "model.loops=2",
    ),
    "virtual_heads": ("model.score.kind=virtual_heads", "model.score.kernel_size=3"),
    "virtual_heads_fused": ("model.score.kind=virtual_heads_fused", "model.score.kernel_size=3"),
    "sliding": ("model.mask.kind=sliding", "model.mask.window=8"),
}
PLUGIN = textwrap.dedent(
    '''
    import torch
    from torch import nn
    from attnlab.parts import Field, ScorePart, SideBranchPart, register


    @register("side_branch", "gated_echo")
    class GatedEcho(SideBranchPart):
        """out += g * x~ with a learned scalar gate g (starts at 0.1)."""

        @classmethod
        def param_count(cls, opts, dims):
            return 1

        def __init__(self, opts, dims):
            super().__init__(opts, dims)
            self.gate = nn.Parameter(torch.full((), 0.1))

        def init_weights(self, init):
            with torch.no_grad():
                self.gate.fill_(0.1)

        def forward(self, x_tilde):
            out = self.gate * x_tilde
            if self.recording:
                self._norms = out[0].detach().norm(dim=-1, keepdim=True)
            return out

        def train_stats(self):
            return {"echo_gate": self.gate.detach()}

        def token_stats(self):
            norms = self.__dict__.get("_norms")
            return {} if norms is None else {"echo_norm": norms}

        @classmethod
        def token_stats_doc(cls):
            return {"echo_norm": ("norm of g x~ per token", ["|g x~|"])}


    @register("score", "halfcap")
    class HalfCap(ScorePart):
        """s' = 2 tanh(s / 2) on the logits."""

        needs_attention_matrix = True
        on = "logits"

        @classmethod
        def param_count(cls, opts, dims):
            return 0

        def transform(self, s, allowed):
            return 2 * (s / 2).tanh()

        def forward(self, q, k, v, core, ctx):
            return core.explicit(q, k, v, ctx, transform=self)
    '''
)


def page_json(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    m = re.search(r"<script id='data' type='application/json'>(.*?)</script>", text, re.S)
    assert m is not None
    return json.loads(m.group(1).replace("<\\/", "</"))


def maps_of(layer: dict, key: str, n: int) -> np.ndarray:
    m = layer["maps"][key]
    return np.asarray(m["data"], dtype=np.float64).reshape(m["heads"], n, n) / 1000


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("inspect")
    data = sentence_data(root)
    plugin = root / "my_parts.py"
    plugin.write_text(PLUGIN)
    out = {}
    torch.manual_seed(0)
    for name, sets in VARIANTS.items():
        out[name] = root / name
        assert train(tiny_run_config(data, *sets, steps=2), out[name]).status == "finished"
    sets = (
        f"plugins=[{json.dumps(str(plugin))}]",
        "model.side_branch.kind=gated_echo",
        "model.score.kind=halfcap",
    )
    from attnlab.parts.plugins import load_plugins

    load_plugins([str(plugin)])
    out["plugin"] = root / "plugin"
    assert train(tiny_run_config(data, *sets, steps=2), out["plugin"]).status == "finished"
    out["data"] = data
    return out


@pytest.mark.parametrize("variant", [*VARIANTS, "plugin"])
def test_inspect_a_run_of_every_variant(runs, tmp_path, variant, capsys):
    page = tmp_path / "page.html"
    assert main(["inspect", str(runs[variant]), "--prompt", PROMPT, "--out", str(page)]) == 0
    assert "wrote" in capsys.readouterr().out
    data = page_json(page)
    (cap,) = data["captures"]
    n = len(PROMPT.encode())
    assert len(cap["tokens"]) == n and cap["start"] == 0
    assert len(cap["layers"]) >= 1
    from attnlab.runs.load import load_run_model

    model, cfg, _ = load_run_model(runs[variant])
    ids = torch.tensor([list(PROMPT.encode())])
    with torch.no_grad():
        out = model(ids, return_attn=True)
    # the page's maps are the model's own (return_attn, the materialised path), to 1e-3
    for layer, want in zip(cap["layers"], out.attn, strict=True):
        key = list(layer["maps"])[-1]  # after the score part where there is one
        got = maps_of(layer, key, n)
        np.testing.assert_allclose(got, want[0].numpy(), atol=1.1e-3)
    # per-token loss: the model's next-token cross-entropy
    ce = torch.nn.functional.cross_entropy(out.logits[0, :-1], ids[0, 1:], reduction="none")
    assert cap["loss"][:-1] == pytest.approx(ce.tolist(), abs=1e-3)
    assert cap["loss"][-1] is None and len(cap["top"][0]) == 5
    # the mask drawn is the model's: causal or the sliding window
    mask = np.array([[c == "1" for c in row] for row in cap["mask"]])
    i, j = np.indices((n, n))
    want_mask = (j <= i) & ((i - j) < 8) if variant == "sliding" else j <= i
    assert (mask == want_mask).all()
    kinds = {p["kind"] for p in cap["parts"]}
    if variant == "identity_head":
        views = [p for p in cap["parts"] if p["kind"] == "readout/identity_head"]
        assert len(views) == cfg.model.n_layers
        w = np.asarray(views[0]["tokens"]["head_weights"]["data"])
        assert w.shape == (n, cfg.model.attention.n_heads + 1)
        # the part's own per-token weights: its linear layer on the layer's input
        assert views[0]["summary"]["head_weights"] == pytest.approx(w.mean(0), abs=1e-3)
    if variant in ("virtual_heads", "virtual_heads_fused"):
        keys = list(cap["layers"][0]["maps"])
        assert keys == ["attention", f"after {cfg.model.score.kind}"]
    if variant == "moe_values":
        assert [layer["name"] for layer in cap["layers"]] == [
            "decoder.blocks.0.attention (loop 1)",
            "decoder.blocks.0.attention (loop 2)",
        ]
        (moe,) = [p for p in cap["parts"] if p["kind"] == "value/moe"]
        probs = np.asarray(moe["tokens"]["router_probs"]["data"])
        assert probs.shape == (n, 4) and probs.sum(1) == pytest.approx(1.0, abs=1e-3)
        assert sum(moe["summary"]["expert_load"]) == pytest.approx(1.0, abs=1e-3)
    if variant == "preproj_skip":
        skip = [p for p in cap["parts"] if p["kind"] == "side_branch/content_skip"]
        assert len(skip) == cfg.model.n_layers
        assert "content_skip_norm" in skip[0]["numbers"]
    if variant == "plugin":
        assert "side_branch/gated_echo" in kinds
        assert list(cap["layers"][0]["maps"]) == ["attention", "after halfcap"]
        echo = next(p for p in cap["parts"] if p["kind"] == "side_branch/gated_echo")
        assert np.asarray(echo["tokens"]["echo_norm"]["data"]).shape == (n, 1)


def test_two_runs_side_by_side_share_tokens(runs, tmp_path):
    page = tmp_path / "two.html"
    args = [str(runs["baseline"]), str(runs["identity_head"])]
    assert main(["inspect", *args, "--prompt", PROMPT, "--out", str(page)]) == 0
    data = page_json(page)
    assert data["same_tokens"] and len(data["captures"]) == 2
    assert [c["name"] for c in data["captures"]] == ["baseline", "identity_head"]


def test_data_dir_window_and_bad_input(runs, tmp_path, capsys):
    page = tmp_path / "d.html"
    args = ["inspect", str(runs["baseline"]), "--data-dir", str(runs["data"]), "--index", "1"]
    assert main([*args, "--length", "16", "--out", str(page)]) == 0
    from attnlab.data import TokenData

    val = TokenData.open(runs["data"]).val
    cap = page_json(page)["captures"][0]
    assert cap["n_tokens"] == 16 and len(cap["tokens"]) == 16
    assert cap["tokens"][0] == chr(int(val[16])).replace(" ", "\u2423")
    assert main([*args, "--length", "16", "--index", "99999", "--out", str(page), "--force"]) == 2
    assert "outside" in capsys.readouterr().err
    assert main(["inspect", str(runs["baseline"]), "--out", str(page)]) == 2


def test_long_prompt_shows_the_last_rows_and_says_what_it_summarised(runs, tmp_path):
    page = tmp_path / "long.html"
    text = PROMPT * 2  # 90 byte tokens, within tiny's context of 128
    args = ["inspect", str(runs["virtual_heads"]), "--prompt", text, "--max-tokens", "20"]
    assert main([*args, "--out", str(page)]) == 0
    cap = page_json(page)["captures"][0]
    n = len(text.encode())
    assert cap["start"] == n - 20 and len(cap["tokens"]) == 20
    assert any("summarised" in note for note in cap["notes"])
    from attnlab.runs.load import load_run_model

    model, _, _ = load_run_model(runs["virtual_heads"])
    with torch.no_grad():
        full = model(torch.tensor([list(text.encode())]), return_attn=True).attn
    got = maps_of(cap["layers"][1], "after virtual_heads", 20)
    np.testing.assert_allclose(got, full[1][0, :, -20:, -20:].numpy(), atol=1.1e-3)
    earlier = np.asarray(cap["layers"][1]["earlier"]["after virtual_heads"])
    want = full[1][0, :, -20:, : n - 20].sum(-1).mean(-1).numpy()
    np.testing.assert_allclose(earlier, want, atol=1e-3)


@pytest.mark.fast
@pytest.mark.parametrize("family", ["encoder", "encoder_decoder"])
def test_other_families(family):
    sets = [f"model.family={family}", "model.mask.kind=full"]
    if family == "encoder_decoder":
        sets = [f"model.family={family}", "model.n_decoder_layers=1"]
    torch.manual_seed(0)
    model = build_model(tiny(*sets))
    ids = [i % 64 for i in PROMPT.encode()][:16]  # tests.helpers.model.tiny: vocabulary 64
    cap = capture(
        model,
        ids,
        lambda t: bytes(t).decode("utf-8", "replace"),
        name="m",
        target="m",
        family=family,
    )
    names = [lv.name for lv in cap.layers]
    if family == "encoder":
        assert names == ["encoder.blocks.0.attention", "encoder.blocks.1.attention"]
        assert cap.mask.all() and cap.predicts == "this token"
    else:
        assert any(n.startswith("encoder.") for n in names)
        assert any(n.startswith("decoder.") for n in names)
        assert cap.predicts == "next token"


def test_a_checkpoint_and_an_export_show_the_same_maps_as_the_run(runs, tmp_path):
    run = runs["identity_head"]
    (ckpt,) = sorted((run / "checkpoints").glob("step_*"))[-1:]
    export = tmp_path / "export"
    assert main(["export", str(run), "--out", str(export)]) == 0
    pages = {}
    for name, target in (("run", run), ("checkpoint", ckpt), ("export", export)):
        pages[name] = tmp_path / f"{name}.html"
        assert main(["inspect", str(target), "--prompt", PROMPT, "--out", str(pages[name])]) == 0
    caps = {k: page_json(p)["captures"][0] for k, p in pages.items()}
    n = len(caps["run"]["tokens"])
    for other in ("checkpoint", "export"):
        assert caps[other]["tokens"] == caps["run"]["tokens"]
        for a, b in zip(caps["run"]["layers"], caps[other]["layers"], strict=True):
            np.testing.assert_allclose(
                maps_of(a, "attention", n), maps_of(b, "attention", n), atol=1.1e-3
            )
    # the export's own copy of the identity head still shows its per-token weights
    assert any(p["kind"] == "readout/identity_head" for p in caps["export"]["parts"])
