"""Probe method strings and the probe config: parsing, validation, overrides, experiments."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnlab.config import ConfigError
from attnlab.probe.config import load_experiment, load_probe_config
from attnlab.probe.methods import MethodError, method_slug, parse_method


@pytest.mark.parametrize(
    ("text", "components", "name"),
    [
        ("frozen", set(), "frozen"),
        ("baseline", set(), "frozen"),
        ("lora", {"lora"}, "lora"),
        ("skip+preproj", {"preproj", "skip"}, "preproj+skip"),
        ("pre-projection + content-skip", {"preproj", "skip"}, "preproj+skip"),
        ("anchored+preproj", {"preproj", "anchored-query"}, "preproj+anchored-query"),
        ("preproj+lora", {"preproj", "lora"}, "preproj+lora"),
    ],
)
def test_parse_method_components_and_canonical_name(text, components, name):
    m = parse_method(text)
    assert set(m.components) == components
    assert m.name == name
    assert m.frozen == (not components)


def test_lora_match_target():
    m = parse_method("lora@skip+preproj")
    assert m.components == {"lora"}
    assert m.lora_match is not None and m.lora_match.name == "preproj+skip"
    assert m.name == "lora@preproj+skip"
    assert method_slug(m) == "lora-at-preproj-skip"
    assert [c.name for c in parse_method("preproj+lora@preproj+skip").injects] == ["preproj"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty method"),
        ("prepoj", "did you mean 'preproj'"),
        ("preproj++skip", "stray '+'"),
        ("preproj+preproj", "twice"),
        ("frozen+skip", "cannot be combined"),
        ("preproj@skip", "needs 'lora'"),
        ("lora@frozen", "0 parameters"),
        ("lora@lora@preproj", "more than one '@'"),
        ("lora@preproj+lora@skip", "more than one '@'"),
    ],
)
def test_bad_methods_say_why(text, fragment):
    with pytest.raises(MethodError, match=fragment.replace("+", r"\+")):
        parse_method(text)


def test_config_defaults_follow_the_paper_recipe():
    cfg = load_probe_config(None)
    t = cfg.train
    assert (t.lr, t.batch_size, t.seq_len, t.steps) == (1e-5, 16, 512, 500)
    assert t.dtype == "auto" and t.accumulation == 1


def test_config_overrides_and_method_canonicalisation(tmp_path: Path):
    f = tmp_path / "p.toml"
    f.write_text('method = "skip+preproj"\n[train]\nsteps = 3\n')
    cfg = load_probe_config(f, ["train.micro_batch_size=4", "lora.rank=8"])
    assert cfg.method == "preproj+skip"
    assert cfg.train.steps == 3 and cfg.train.accumulation == 4 and cfg.lora.rank == 8


def test_unknown_key_names_the_nearest_spelling(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"unknown key 'train.lr_max'.*did you mean 'train.lr'"):
        load_probe_config(None, ["train.lr_max=1e-3"])
    with pytest.raises(ConfigError, match=r"unknown key 'parts.pre_projection.expanson'"):
        load_probe_config(None, ["parts.pre_projection.expanson=2"])
    with pytest.raises(ConfigError, match=r"it is now \[parts.pre_projection\]"):
        load_probe_config(None, ["pre_projection.expansion=2"])


def test_bad_values_fail_at_load_time():
    with pytest.raises(ConfigError, match="did you mean 'preproj'"):
        load_probe_config(None, ["method=prepoj"])
    with pytest.raises(ConfigError, match="not a multiple"):
        load_probe_config(None, ["train.batch_size=16", "train.micro_batch_size=5"])
    with pytest.raises(ConfigError, match=r"'base\.dtype'"):
        load_probe_config(None, ["base.dtype=int8"])


def test_experiment_file_methods_and_fairness(tmp_path: Path):
    f = tmp_path / "e.toml"
    f.write_text(
        'name = "x"\n'
        'methods = ["frozen", "lora@preproj+skip", {method = "preproj+lora", name = "pl", '
        "lora = {rank = 4}, train = {micro_batch_size = 2}}]\n"
        "[train]\nsteps = 7\nbatch_size = 4\n"
    )
    name, cfgs = load_experiment(f, ["train.lr=1e-3"])
    assert name == "x"
    assert [c.label for c in cfgs] == ["frozen", "lora@preproj+skip", "pl"]
    assert all(c.train.steps == 7 and c.train.lr == 1e-3 for c in cfgs)
    assert cfgs[2].lora.rank == 4 and cfgs[2].train.micro == 2 and cfgs[0].lora.rank == 64
    with pytest.raises(ConfigError, match="experiment file"):
        load_probe_config(f)

    unfair = tmp_path / "u.toml"
    unfair.write_text('methods = [{method = "preproj", train = {steps = 9}}]\n')
    with pytest.raises(ConfigError, match=r"train\.steps.*same base, data, batches"):
        load_experiment(unfair)
    dup = tmp_path / "d.toml"
    dup.write_text('methods = ["preproj", "pre-projection"]\n')
    with pytest.raises(ConfigError, match="appears twice"):
        load_experiment(dup)
