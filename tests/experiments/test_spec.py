"""Experiment files: schema errors with nearest spellings, variant resolution, fairness rules,
budget, ``--set`` routing, and that variants never leak overrides into each other."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from attnlab.config import ConfigError
from attnlab.experiments import load_experiment
from attnlab.model.params import count
from tests.helpers.paths import CONFIGS

HEADER = """
base = "tiny"
seeds = [0, 1]
[budget]
steps = 20
"""


def write(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent(header) + textwrap.dedent(body), encoding="utf-8")
    return path


@pytest.mark.fast
def test_variants_resolve_in_order_with_their_overrides(tmp_path):
    exp = load_experiment(
        write(
            tmp_path,
            """
            [[variants]]
            name = "baseline"
            [[variants]]
            name = "nonlinear-query"
            set = ["model.query.kind=nonlinear"]
            train = { lr = 2e-3 }
            [[variants]]
            name = "nlq-relu"
            extends = "nonlinear-query"
            model = { query = { activation = "relu" } }
            """,
        )
    )
    assert list(exp.variants) == ["baseline", "nonlinear-query", "nlq-relu"]
    assert exp.baseline == "baseline"  # default: the first variant
    base, nlq, relu = (exp.variants[n].config for n in exp.variants)
    assert base.model.query.kind == "linear" and base.train.lr == pytest.approx(3e-3)
    assert nlq.model.query.kind == "nonlinear" and nlq.train.lr == pytest.approx(2e-3)
    # extends: the parent's overrides first, then the child's own
    assert relu.model.query.kind == "nonlinear" and relu.model.query.activation == "relu"
    assert relu.train.lr == pytest.approx(2e-3)
    assert exp.steps == 20 and all(v.config.train.max_steps == 20 for v in exp.variants.values())
    assert exp.variants["nonlinear-query"].params.non_embedding == count(nlq.model).non_embedding


def test_overrides_do_not_leak_between_variants(tmp_path):
    exp = load_experiment(
        write(
            tmp_path,
            """
            [[variants]]
            name = "a"
            set = ["model.side_branch.kind=content_skip", "model.ffn.ratio=2.0"]
            [[variants]]
            name = "b"
            """,
        )
    )
    b = exp.variants["b"].config.model
    assert b.side_branch.kind == "none" and b.ffn.ratio == 4.0


def test_runs_are_seed_major_with_seed_labels(tmp_path):
    exp = load_experiment(write(tmp_path, '[[variants]]\nname = "a"\n[[variants]]\nname = "b"\n'))
    runs = exp.runs(tmp_path / "out")
    assert [(r.variant, r.seed) for r in runs] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    r = runs[3]
    assert r.run_dir == tmp_path / "out" / "runs" / "b" / "seed1"
    assert r.config.train.seed == 1 and r.config.experiment.variant == "b"
    assert r.config.experiment.seed_index == 1 and r.config.experiment.name == "exp"
    only = exp.runs(tmp_path / "out", ["b"])
    assert [(r.variant, r.seed) for r in only] == [("b", 0), ("b", 1)]
    with pytest.raises(ConfigError, match="did you mean 'b'"):
        exp.runs(tmp_path, ["bb"])


def test_unknown_top_level_key_names_the_nearest_spelling(tmp_path):
    path = write(
        tmp_path,
        '[[variants]]\nname = "a"\n',
        header='base = "tiny"\nseedz = [0]\n[budget]\nsteps = 5\n',
    )
    with pytest.raises(ConfigError, match=r"unknown key seedz\. did you mean 'seeds'"):
        load_experiment(path)


def test_unknown_variant_key_names_the_variant_and_the_nearest_spelling(tmp_path):
    path = write(tmp_path, '[[variants]]\nname = "a"\n[[variants]]\nname = "nlq"\nsett = []\n')
    with pytest.raises(ConfigError) as e:
        load_experiment(path)
    msg = str(e.value)
    assert "variants[1].sett (variant 'nlq')" in msg and "did you mean 'set'" in msg


def test_unknown_override_key_in_a_variant_fails_at_load(tmp_path):
    path = write(
        tmp_path,
        '[[variants]]\nname = "a"\n[[variants]]\nname = "nlq"\n'
        'set = ["model.querry.kind=nonlinear"]\n',
    )
    with pytest.raises(ConfigError) as e:
        load_experiment(path)
    assert "variant 'nlq'" in str(e.value) and "did you mean 'model.query'" in str(e.value)


def test_unknown_key_in_a_variant_table_fails_at_load(tmp_path):
    path = write(
        tmp_path, '[[variants]]\nname = "nlq"\nmodel = { query = { knd = "nonlinear" } }\n'
    )
    with pytest.raises(ConfigError, match=r"did you mean 'model\.query\.kind'"):
        load_experiment(path)


def test_an_impossible_variant_fails_before_anything_trains(tmp_path):
    path = write(
        tmp_path,
        '[[variants]]\nname = "a"\n[[variants]]\nname = "mixer"\n'
        'set = ["model.mixer.kind=nonlinear"]\n',
    )
    with pytest.raises(ConfigError, match=r"(?s)variant 'mixer'.*impossible combination"):
        load_experiment(path)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('match_params = "nope"', "match_params = 'nope': no such variant"),
        ('match_params = "basline"', "did you mean 'baseline'"),
        ('match_params = "m"', "match_params names itself"),
        ('match_by = "model.ffn.hidden"', "match_by needs match_params"),
    ],
)
def test_bad_match_params_target(tmp_path, body, message):
    path = write(tmp_path, f'[[variants]]\nname = "baseline"\n[[variants]]\nname = "m"\n{body}\n')
    with pytest.raises(ConfigError, match=message):
        load_experiment(path)


def test_match_params_target_must_not_be_matched_itself(tmp_path):
    path = write(
        tmp_path,
        '[[variants]]\nname = "a"\nmatch_params = "b"\n[[variants]]\nname = "b"\n'
        'match_params = "c"\n[[variants]]\nname = "c"\n',
    )
    with pytest.raises(ConfigError, match="is itself matched"):
        load_experiment(path)


def test_match_params_without_an_mlp_asks_for_match_by(tmp_path):
    path = write(
        tmp_path,
        '[[variants]]\nname = "a"\nset = ["model.side_branch.kind=content_skip"]\n'
        '[[variants]]\nname = "m"\nset = ["model.mlp=false"]\nmatch_params = "a"\n',
    )
    with pytest.raises(Exception, match="match_by"):
        load_experiment(path)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ('set = ["train.batch_size=8"]', "train.batch_size"),
        ('set = ["train.seed=3"]', "train.seed"),
        ("train = { eval_every = 7 }", "train.eval_every"),
    ],
)
def test_variants_may_not_change_the_batch_schedule(tmp_path, override, key):
    path = write(tmp_path, f'[[variants]]\nname = "a"\n[[variants]]\nname = "b"\n{override}\n')
    with pytest.raises(ConfigError, match=f"variant 'b' changes {key}"):
        load_experiment(path)


def test_variants_may_not_set_data(tmp_path):
    path = write(tmp_path, '[[variants]]\nname = "b"\ndata = { seq_len = 32 }\n')
    with pytest.raises(ConfigError, match=r"\[base.data\]"):
        load_experiment(path)


def test_a_budget_shorter_than_the_warmup_names_the_fix(tmp_path):
    path = write(
        tmp_path, '[[variants]]\nname = "a"\n', header='base = "tiny"\n[budget]\nsteps = 5\n'
    )
    with pytest.raises(ConfigError, match=r"warmup_steps=20.*\[base.train\]"):
        load_experiment(path)


def test_budget_needs_exactly_one_of_steps_and_tokens(tmp_path):
    path = write(
        tmp_path,
        '[[variants]]\nname = "a"\n',
        header='base = "tiny"\n[budget]\nsteps = 5\ntokens = 100\n',
    )
    with pytest.raises(ConfigError, match=r"exactly one of budget\.steps or budget\.tokens"):
        load_experiment(path)


def test_token_budget_rounds_up_to_whole_steps(tmp_path):
    # tiny: 16 sequences x 64 tokens = 1024 tokens per step
    path = write(
        tmp_path, '[[variants]]\nname = "a"\n', header='base = "tiny"\n[budget]\ntokens = 30000\n'
    )
    exp = load_experiment(path)
    assert exp.tokens_per_step == 1024 and exp.steps == 30
    assert any("rounded up" in n for n in exp.notes)


def test_base_table_and_set_routing(tmp_path):
    header = """
    seeds = [0]
    [base]
    extends = "tiny"
    [base.model]
    d_model = 32
    [budget]
    steps = 25
    """
    path = write(tmp_path, '[[variants]]\nname = "a"\n[[variants]]\nname = "b"\n', header=header)
    exp = load_experiment(
        path, ["model.n_layers=3", "budget.steps=30", "seeds=[2, 5]", 'baseline="b"']
    )
    assert exp.steps == 30 and exp.seeds == [2, 5] and exp.baseline == "b"
    for v in exp.variants.values():
        assert v.config.model.d_model == 32 and v.config.model.n_layers == 3


def test_unknown_evaluation_task_fails_at_load(tmp_path):
    path = write(tmp_path, '[evaluate]\ntasks = ["perplexty"]\n[[variants]]\nname = "a"\n')
    with pytest.raises(Exception, match=r"(?i)did you mean perplexity"):
        load_experiment(path)


def test_duplicate_variant_names_and_bad_names(tmp_path):
    with pytest.raises(ConfigError, match="repeated: a"):
        load_experiment(write(tmp_path, '[[variants]]\nname = "a"\n[[variants]]\nname = "a"\n'))
    with pytest.raises(ConfigError, match="cannot name a directory"):
        load_experiment(write(tmp_path, '[[variants]]\nname = "a/b"\n'))


def test_missing_experiment_file_is_a_user_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_experiment(tmp_path / "nope.toml")


SHIPPED = sorted((CONFIGS / "experiments").glob("*.toml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_experiments_load(path):
    exp = load_experiment(path)
    assert len(exp.variants) >= 2
    for v in exp.variants.values():
        if v.match is not None:
            assert abs(v.match.rel_gap) < 0.01
