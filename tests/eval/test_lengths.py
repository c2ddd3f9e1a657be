"""Train short, test long: evaluation at lengths past the training context, the loss by token
position, generation and the KV cache past it, and a position part of one's own (a plugin of
fewer than 40 lines) through params, train, eval --lengths, generate and export."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torch.utils._python_dispatch
import torch.utils._pytree

from attnlab.base.errors import InvalidRequestError, UserError
from attnlab.cli import main
from attnlab.data.byte_tokenizer import ByteTokenizer
from attnlab.eval.lengths import check_lengths, length_loss, parse_lengths, token_stream
from attnlab.eval.native import AttnlabLM
from attnlab.eval.perplexity import Document
from attnlab.model import build_model
from attnlab.model.generate import generate
from attnlab.parts import registry
from tests.helpers.hf import fake_run
from tests.helpers.model import tiny

TRAINED = 32  # the models below hold positions up to this: the "training" context
POSITIONS = list(registry.kinds("position"))


def _model(kind: str):
    torch.manual_seed(0)
    cfg = tiny(
        f"model.position.kind={kind}", f"model.max_seq_len={TRAINED}", "model.vocab_size=288"
    )
    return build_model(cfg).eval()


def _lm(kind: str) -> AttnlabLM:
    model = _model(kind)
    return AttnlabLM(model, ByteTokenizer(), TRAINED, device="cpu")


@pytest.mark.parametrize("kind", POSITIONS)
def test_every_position_decodes_past_the_training_length_with_the_cache_exact(kind: str) -> None:
    """Greedy decoding with the KV cache gives the tokens of the uncached forward, beyond the
    training length for every position without a table; a learned table refuses with why."""
    model = _model(kind)
    prompt = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    new = TRAINED - 8 + 12  # 12 tokens past the training length
    if model.cfg.position_limit is not None:
        with pytest.raises(
            InvalidRequestError, match=r"of learned positions \(model\.position\.kind="
        ):
            generate(model, prompt, new, temperature=0)
        return
    cached = generate(model, prompt, new, temperature=0, use_cache=True)
    plain = generate(model, prompt, new, temperature=0, use_cache=False)
    assert cached.shape == (2, 8 + new) and torch.equal(cached, plain)


def test_alibi_at_1024_and_300_generated_tokens_with_the_cache_equal_to_the_forward() -> None:
    """An ALiBi model of 32 positions reads 1,024 tokens and decodes 300 past its prompt, each
    cached step's token the argmax of the uncached forward."""
    model = _model("alibi")
    x = torch.randint(0, 64, (1, 1024), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(x).logits
    assert full.shape == (1, 1024, 288) and torch.isfinite(full).all()
    out = generate(model, x[:, :12], 300, temperature=0, use_cache=True)
    with torch.no_grad():  # every generated token is the argmax of the uncached forward
        logits = model(out[:, :-1]).logits
    assert torch.equal(logits[0, 11:].argmax(-1), out[0, 12:])


def test_length_loss_is_the_mean_cross_entropy_by_position_over_windows() -> None:
    lm = _lm("alibi")
    docs = [Document(list(range(3, 3 + n))) for n in (100, 77, 150)]
    stream = token_stream(docs, lm.prefix_id)
    assert stream.numel() == 330 and int(stream[0]) == lm.prefix_id
    res = length_loss(lm, stream, 96, batch_size=2)
    assert res.windows == 3 and res.tokens == 288 and len(res.loss_by_position) == 96
    want = torch.zeros(96, dtype=torch.float64)
    for w in range(3):  # the naive form: one window at a time
        win = stream[w * 96 : w * 96 + 97]
        with torch.no_grad():
            logits = lm.model(win[None, :-1]).logits[0].double()
        want += F.cross_entropy(logits, win[1:], reduction="none")
    got = torch.tensor(res.loss_by_position, dtype=torch.float64)
    torch.testing.assert_close(got, want / 3, atol=1e-5, rtol=1e-5)
    assert res.loss == pytest.approx(float((want / 3).mean()))
    assert length_loss(lm, stream, 96, limit=1).windows == 1


def test_lengths_past_a_learned_table_are_refused_with_the_reason() -> None:
    check_lengths(_lm("alibi"), [64, 1024])
    with pytest.raises(UserError, match="1024") as e:
        check_lengths(_lm("learned"), [64, 1024])
    assert "learned positions have one trained vector" in str(e.value)
    assert parse_lengths("256, 64,128,64") == [64, 128, 256]
    with pytest.raises(UserError, match="at least 2"):
        parse_lengths("64,0")


# ------------------------------------------------------------------------ 8,192 tokens

LONG = 8192
#: the three models issue 34 names, each trained (here: initialised) at 64 tokens
LONG_ARMS = {
    "alibi": (["model.position.kind=alibi"], []),
    "rope_yarn": (
        ["model.position.kind=rope"],
        ["--set", "model.position.scaling=yarn", "--set", "model.position.factor=128"],
    ),
    "sliding": (
        ["model.position.kind=rope", "model.mask.kind=sliding", "model.mask.window=16"],
        [],
    ),
}


class LargestTensor(torch.utils._python_dispatch.TorchDispatchMode):
    """The most elements any operation's output held while active."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


@pytest.mark.parametrize("arm", list(LONG_ARMS))
def test_eval_lengths_reaches_8192_tokens_without_a_t_by_t_tensor(
    arm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """``attnlab eval --lengths 8192`` on ALiBi, RoPE with YaRN (set at evaluation) and a
    sliding window, 1 layer, d = 32, 64 trained positions: it scores one window of 8,192 tokens
    and no operation makes a tensor of T^2 / 4 elements (a dense mask or bias is T^2 or H T^2;
    the largest legitimate one is the logits, T x 288)."""
    monkeypatch.chdir(tmp_path)
    model_sets, eval_sets = LONG_ARMS[arm]
    small = ["model.n_layers=1", "model.d_model=32", "model.attention.n_heads=2"]
    fake_run(tmp_path / "run", [*small, "model.max_seq_len=64", *model_sets])
    (tmp_path / "long.txt").write_text("the quick brown fox jumps over the lazy dog. " * 190)
    largest = LargestTensor()
    with largest:
        _attnlab(capsys, "eval", "run", "--tasks", "perplexity:long.txt", "--lengths", str(LONG),
                 "--limit", "1", "--no-progress", *eval_sets)  # fmt: skip
    assert largest.numel < LONG * LONG // 4, largest.numel
    results = json.loads((tmp_path / "run" / "eval" / "results.json").read_text())
    [row] = [v for k, v in results["tasks"].items() if k.startswith(f"perplexity:long@{LONG}")]
    assert row["metrics"]["windows"] == 1 and len(row["loss_by_position"]) == LONG
    assert all(map(math.isfinite, row["loss_by_position"]))


# ------------------------------------------------------------------------ a position plugin

PLUGIN = '''"""A learned bias per head on the query-key distance, capped: b[h, min(|i - j|, D)]."""
import torch
from pydantic import Field
from torch import nn

from attnlab.parts import PartOptions, PositionPart, register


@register("position", "distance_bias")
class DistanceBias(PositionPart):
    """bias[h, i, j] = b[h, min(|i - j|, D)]; params H (D + 1); no length limit."""

    logit_bias = True

    class Options(PartOptions):
        max_distance: int = Field(16, ge=1)

    @classmethod
    def param_count(cls, opts, dims):
        return dims.n_heads * (opts.max_distance + 1)

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.table = nn.Parameter(torch.zeros(dims.n_heads, opts.max_distance + 1))

    def init_weights(self, init):
        nn.init.normal_(self.table, 0.0, init.std)

    def bias(self, q_pos, k_pos):
        dist = (q_pos[:, None] - k_pos[None, :]).abs().clamp_max(self.opts.max_distance)
        return self.table[:, dist]
'''


def _attnlab(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``attnlab ARGS`` in this process (the working directory is the test's): its stdout."""
    capsys.readouterr()
    assert main(list(args)) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return out


def test_a_position_plugin_runs_through_params_train_eval_lengths_generate_export(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The commands' own entry point, in process (five interpreters started for it took a minute
    on two shared cores); the plugin is loaded from its file by the config, as a user's is."""
    assert len(PLUGIN.splitlines()) < 40
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dist.py").write_text(PLUGIN)
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        'extends = "tiny"\nplugins = ["dist.py"]\n[model]\nmax_seq_len = 32\nn_layers = 1\n'
        '[model.position]\nkind = "distance_bias"\nmax_distance = 8\n'
        f"[data]\ncorpus = {json.dumps(str(data_dir.parent / 'corpus.jsonl'))}\n"
        f"dir = {json.dumps(str(data_dir))}\nseq_len = 32\n"
        "[train]\nmax_steps = 2\nbatch_size = 2\nwarmup_steps = 1\neval_every = 2\n"
        "eval_batches = 1\ncheckpoint_every = 2\nlog_every = 1\ndevice = 'cpu'\n"
    )
    params = json.loads(_attnlab(capsys, "params", str(cfg), "--json"))
    assert params["by_part"]["position"] == 4 * 9  # H (D + 1), declared and counted
    # the plugin's conformance check is tests/testing/test_check.py's subject, not this one's
    _attnlab(capsys, "train", str(cfg), "--out", "run", "--quiet", "--skip-check")
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "finished"
    _attnlab(capsys, "eval", "run", "--tasks", "perplexity", "--lengths", "32,128", "--limit",
             "2", "--no-progress")  # fmt: skip
    results = json.loads((tmp_path / "run" / "eval" / "results.json").read_text())
    long = results["tasks"]["perplexity@128"]
    assert long["metrics"]["windows"] == 2 and len(long["loss_by_position"]) == 128
    out = _attnlab(capsys, "generate", "run", "--prompt", "the", "--max-new-tokens", "60",
                   "--temperature", "0")  # fmt: skip
    assert out.strip()
    pytest.importorskip("transformers")
    _attnlab(capsys, "export", "run", "--out", "hf")
    assert (tmp_path / "hf" / "config.json").is_file()
    assert any(p.name == "dist.py" or "distance_bias" in p.read_text() for p in
               (tmp_path / "hf").glob("*.py"))  # fmt: skip


def test_the_report_section_tables_and_draws_perplexity_by_length(tmp_path: Path) -> None:
    """Each arm's mean perplexity [min, max over seeds] per length, an evaluation-time change
    (``+position.scaling=...``) as an arm of its own, and both figures written."""
    from types import SimpleNamespace

    from attnlab.experiments.reports.lengths import collect, is_length_column, lengths_section

    rows = []
    for seed, scale in ((0, 1.0), (1, 2.0)):
        run = tmp_path / f"rope{seed}"
        (run / "eval").mkdir(parents=True)
        tasks = {}
        for n in (8, 16):
            for tag, extra in (("", 0.0), ("+position.scaling=yarn", 1.0)):
                tasks[f"perplexity@{n}{tag}"] = {
                    "metrics": {"perplexity": n * scale + extra, "loss": 1.0},
                    "loss_by_position": [1.0] * n,
                    "trained_length": 8,
                }
        tasks["perplexity"] = {"metrics": {"perplexity": 3.0}}
        (run / "eval" / "results.json").write_text(json.dumps({"tasks": tasks}))
        rows.append(SimpleNamespace(variant="rope", run_dir=str(run)))
    arms = collect(rows)
    assert set(arms) == {"rope", "rope+position.scaling=yarn"} and set(arms["rope"]) == {8, 16}
    lines = lengths_section(tmp_path, rows)
    text = "\n".join(lines)
    assert "| rope | 12.00 [8.00, 16.00] | 24.00 [16.00, 32.00] |" in text
    assert "| rope+position.scaling=yarn | 13.00 [9.00, 17.00] |" in text
    assert (tmp_path / "plots" / "perplexity_by_length.png").stat().st_size > 1000
    assert (tmp_path / "plots" / "loss_by_position.png").stat().st_size > 1000
    assert is_length_column("perplexity@64/loss") and not is_length_column("perplexity/loss")
