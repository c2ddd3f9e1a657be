"""``attnlab params``: JSON and table output from a preset, and a clear error for a bad name."""

from __future__ import annotations

import json

import pytest

from attnlab.cli import main


@pytest.mark.fast
def test_params_json(capsys) -> None:
    assert main(["params", "gpt2-124m", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("total", "non_embedding", "kv_cache_bytes_per_token"):
        assert isinstance(data[key], int)
    assert data["non_embedding"] == 84_953_856
    assert data["kv_cache_bytes_per_token"] == 36_864
    assert isinstance(data["by_part"], dict)
    assert all(isinstance(v, int) for v in data["by_part"].values())
    assert sum(data["by_part"].values()) == data["total"]


def test_params_json_with_overrides(capsys) -> None:
    assert main(["params", "gpt2-124m", "--set", "model.query.kind=nonlinear", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["non_embedding"] == 84_972_288


def test_params_table_mentions_the_headline_count(capsys) -> None:
    assert main(["params", "gpt2-124m"]) == 0
    out = capsys.readouterr().out
    assert "84.95M" in out
    assert "query" in out and "ffn" in out


def test_params_table_for_pre_projection(capsys) -> None:
    assert main(["params", "pythia-160m-preproj-skip"]) == 0
    out = capsys.readouterr().out
    assert "17.69M" in out and "7.08M" in out


@pytest.mark.fast
def test_bad_preset_exits_2_naming_close_matches(capsys) -> None:
    assert main(["params", "gpt2-124n"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'gpt2-124n'" in err and "gpt2-124m" in err
    assert "Traceback" not in err


def test_bad_override_exits_2(capsys) -> None:
    assert main(["params", "tiny", "--set", "model.qurey.kind=linear"]) == 2
    assert "did you mean 'model.query'" in capsys.readouterr().err


def test_every_set_option_is_the_one_shared_definition() -> None:
    """``--set`` is defined once (``commands._common.add_set_argument``) and every command that
    takes it collects repeated values in ``overrides``."""
    import argparse
    from pathlib import Path

    import attnlab.commands
    from attnlab.cli import build_parser

    folder = Path(attnlab.commands.__file__).parent
    defining = [p.name for p in sorted(folder.glob("*.py")) if '"--set"' in p.read_text()]
    assert defining == ["_common.py"]
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    taking = set()
    for name, parser in sub.choices.items():
        for action in parser._actions:
            if "--set" in action.option_strings:
                assert (action.dest, action.metavar, action.default) == (
                    "overrides",
                    "KEY=VALUE",
                    [],
                )
                assert isinstance(action, argparse._AppendAction)
                assert action.help.startswith("override ") and action.help.endswith("(repeatable)")
                taking.add(name)
    assert {"bench", "compare", "params", "probe", "train"} <= taking
