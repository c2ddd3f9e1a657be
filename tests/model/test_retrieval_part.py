"""Chunked cross-attention as a part: the built-in ``cross_attention.cca`` passes ``attnlab check``
(its retrieval case), a plugin's variant that drops RETRO's m - 1 shift fails causality there,
and a plugin's gated CCA trains through the retrieval family like the built-in one. Retrieval
configs that name no cross_attention table get ``cca``; other families refuse one."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("bm25s")

from attnlab.config import ConfigError, load_config
from attnlab.parts import load_plugin
from attnlab.testing import check_part
from tests.helpers.data import WORDS, prepare_bytes, word_corpus

PLUGIN = textwrap.dedent(
    '''
    """Two CCA variants written against the public part API, as a researcher would."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from attnlab.model.parts.cross_attention_cca import ChunkedCrossAttention
    from attnlab.parts import register


    @register("cross_attention", "cca_noshift_f27")
    class NoShiftCCA(ChunkedCrossAttention):
        """Token p reads chunk p // m's neighbours: retrieved with tokens after p (a leak)."""

        def forward(self, h, memory):
            B, T, d = h.shape
            m = self.m
            C = -(-T // m)
            x = F.pad(self.norm(h), (0, 0, 0, C * m - T)).reshape(B * C, m, d)
            mem = memory[:, :C].reshape(B * C, memory.shape[2], d)
            z = torch.zeros(0, dtype=torch.long, device=h.device)
            from attnlab.model.context import AttnContext

            out, _ = self.cross_attention(x, AttnContext(z, z, None, False), memory=mem)
            return out.reshape(B, C * m, d)[:, :T]


    @register("cross_attention", "cca_gated_f27")
    class GatedCCA(ChunkedCrossAttention):
        """CCA scaled by tanh(g), one learned gate per layer (g starts at 1)."""

        @classmethod
        def param_count(cls, opts, dims):
            n = super().param_count(opts, dims)
            return None if n is None else n + 1

        def __init__(self, opts, dims):
            super().__init__(opts, dims)
            self.gate = nn.Parameter(torch.ones(()))

        def init_weights(self, init):
            super().init_weights(init)
            with torch.no_grad():
                self.gate.fill_(1.0)

        def forward(self, h, memory):
            return torch.tanh(self.gate) * super().forward(h, memory)
    '''
)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plug") / "cca_variants_f27.py"
    path.write_text(PLUGIN)
    load_plugin(str(path))
    return path


def _results(report) -> dict[str, str]:
    return {r.name: r.status for r in report.results}


def test_builtin_cca_passes_the_battery():
    report = check_part("cross_attention", "cca", export=False)
    got = _results(report)
    assert report.cases == ["retrieval/causal/learned"]
    for prop in ("causality", "batch", "params", "flops", "state_dict", "init", "compile"):
        assert got[prop] == "passed", (prop, report.results)
    assert got["kv_cache"] == "skipped"  # retrieval decodes without a cache


def test_check_catches_a_cca_without_the_shift(plugin):
    report = check_part("cross_attention", "cca_noshift_f27", export=False, compile=False)
    causality = next(r for r in report.results if r.name == "causality")
    assert causality.status == "failed", report.results
    assert causality.where == "retrieval/causal/learned"
    assert "changed the outputs before it" in causality.detail


def test_gated_plugin_cca_checks_and_trains(plugin, tmp_path):
    report = check_part("cross_attention", "cca_gated_f27", export=False, compile=False)
    got = _results(report)
    assert got["causality"] == got["params"] == got["flops"] == "passed", report.results

    from attnlab.train import train
    from tests.helpers.data import tiny_run_config

    corpus = word_corpus(tmp_path / "corpus.jsonl", WORDS, n_docs=40, length=(40, 80), seed=1)
    data = prepare_bytes(corpus, tmp_path / "prepared", val_fraction=0.1)
    cfg = tiny_run_config(
        data,
        "model.family=retrieval",
        "model.retrieval.chunk_size=8",
        "model.cross_attention.kind=cca_gated_f27",
        steps=3,
        eval_every=3,
    )
    cfg = cfg.model_copy(update={"plugins": [str(plugin)]})
    result = train(cfg, tmp_path / "run")
    from attnlab.runs.checkpoint import load_latest

    state = load_latest(tmp_path / "run", with_optim=False).model
    gates = [v for k, v in state.items() if k.endswith(".gate")]
    assert gates and all(float(g) != 1.0 for g in gates)  # the gate was trained
    assert result.status == "finished"


def test_retrieval_configs_get_cca_and_other_families_refuse_the_table():
    cfg = load_config("tiny", ["model.family=retrieval", "model.retrieval.chunk_size=8"])
    assert cfg.model.cross_attention.kind == "cca"
    assert load_config("tiny").model.cross_attention.kind == "none"
    with pytest.raises(ConfigError, match="read only by model"):
        load_config("tiny", ["model.cross_attention.kind=cca"])
    with pytest.raises(ConfigError, match="cross_attention part"):
        load_config(
            "tiny",
            [
                "model.family=retrieval",
                "model.retrieval.chunk_size=8",
                "model.cross_attention.kind=none",
            ],
        )
    assert torch.get_default_dtype() == torch.float32
