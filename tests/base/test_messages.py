"""Messages a user can act on: numbers are numbers (no booleans, no inf/NaN, no values beyond
int64) in every config table, advice that works when followed, safe run names, exit codes."""

from __future__ import annotations

import re
import typing

import pytest
from pydantic import BaseModel

from attnlab.base import exitcodes
from attnlab.base.schema import slot_of
from attnlab.cli import build_parser, main
from attnlab.config import Config, ConfigError, load_config, validate
from attnlab.parts import registry
from tests.helpers.paths import DOCS, ROOT


def _numeric_fields(
    model: type[BaseModel], prefix: str = "", kind: dict | None = None
) -> list[tuple[str, set[type], dict]]:
    """(dotted key, scalar kinds, the slot tables' kinds to set beside it) of every numeric field,
    the options of every registered part of every slot included."""
    out = []
    for name, field in model.model_fields.items():
        slot = slot_of(field)
        if slot is not None:
            for spec in registry.specs(slot):
                here = {**(kind or {}), f"{prefix}{name}.kind": spec.kind}
                out += _numeric_fields(spec.options, f"{prefix}{name}.", here)
            continue
        args = typing.get_args(field.annotation) or (field.annotation,)
        subs = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if subs:
            out += _numeric_fields(subs[0], f"{prefix}{name}.", kind)
        kinds = {a for a in args if a in (int, float, bool)}
        if kinds:
            out.append((f"{prefix}{name}", kinds, kind or {}))
    return out


NUMERIC = _numeric_fields(Config)


def _raw(key: str, value, kinds: dict | None = None) -> dict:
    raw: dict = {}
    for k, v in [*(kinds or {}).items(), (key, value)]:
        node = raw
        parts = k.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return raw


def test_every_numeric_config_field_refuses_booleans_infinities_and_huge_ints():
    assert len(NUMERIC) > 60  # the walk found the tree
    assert any(key == "model.query.ratio" for key, _, _ in NUMERIC)  # and the parts' options
    for key, kinds, slot_kinds in NUMERIC:
        if kinds == {bool}:  # and a switch refuses numbers
            for bad in (1, 0, "yes"):
                with pytest.raises(ConfigError, match=re.escape(key) + ".*true or false"):
                    validate(_raw(key, bad, slot_kinds))
            continue
        for bad in (True, False):
            with pytest.raises(ConfigError, match=re.escape(key) + ".*boolean"):
                validate(_raw(key, bad, slot_kinds))
        if float in kinds:
            for bad in (float("inf"), float("-inf"), float("nan")):
                with pytest.raises(ConfigError, match=re.escape(key) + ".*finite"):
                    validate(_raw(key, bad, slot_kinds))
        with pytest.raises(ConfigError, match=re.escape(key)):
            validate(_raw(key, 2**64, slot_kinds))


def test_seeds_are_not_negative():
    for key in ("train.seed", "data.split_seed", "experiment.seed_index"):
        with pytest.raises(ConfigError, match=re.escape(key)):
            load_config("tiny", [f"{key}=-1"])
    assert load_config("tiny", ["train.seed=0"]).train.seed == 0


@pytest.mark.fast
def test_help_and_readme_document_every_exit_code():
    text = build_parser().format_help()
    readme = (ROOT / "README.md").read_text()
    for code in (exitcodes.OK, exitcodes.FAILED, exitcodes.USER_ERROR, exitcodes.DIVERGED, 130):
        assert re.search(rf"^\s*{code}\s+\S", text, re.M), code
        assert re.search(rf"^\|\s*`?{code}`?\s*\|", readme, re.M), code
    assert exitcodes.DIVERGED not in (exitcodes.OK, exitcodes.FAILED, exitcodes.USER_ERROR)


def test_the_advised_max_new_tokens_works(hostile_lab, capsys):
    run = str(hostile_lab.run)
    assert main(["generate", run, "--prompt", "the model", "--max-new-tokens", "5000"]) == 2
    err = capsys.readouterr().err
    advised = re.search(r"use --max-new-tokens (\d+)", err)
    assert advised, err
    args = ["generate", run, "--prompt", "the model", "--max-new-tokens", advised.group(1)]
    assert main([*args, "--temperature", "0"]) == 0


def test_the_advised_prompt_length_works(hostile_lab, capsys):
    run = str(hostile_lab.run)
    assert main(["generate", run, "--prompt", "x" * 400, "--max-new-tokens", "8"]) == 2
    err = capsys.readouterr().err
    advised = re.search(r"shorten the prompt to at most (\d+) tokens", err)
    assert advised and "--max-new-tokens 1" not in err, err
    prompt = "x" * int(advised.group(1))  # byte tokenizer: one token per character
    assert main(["generate", run, "--prompt", prompt, "--max-new-tokens", "8"]) == 0


def test_a_diverged_run_is_not_told_to_train_longer(hostile_lab, capsys):
    assert main(["generate", str(hostile_lab.diverged_run), "--prompt", "a"]) == 3
    err = capsys.readouterr().err
    assert "train longer" not in err and "train.lr" in err and "--restart" in err


def test_a_one_document_corpus_in_train_gets_advice_train_can_follow(
    hostile_lab, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # the data is prepared under ./data on first use
    cfg = tmp_path / "one.toml"
    cfg.write_text(f'extends = "tiny"\n[data]\ncorpus = "{hostile_lab.files / "one.jsonl"}"\n')
    code = main(["train", str(cfg), "--out", str(tmp_path / "r"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "add documents" in err
    assert not re.search(r"or pass --val-fraction 0", err)


@pytest.mark.parametrize("name", [".", "..", ".hidden", "-x", "a\\b", "c:d", "x" * 101, "tab\tx"])
def test_probe_run_names_must_be_plain_directory_names(name):
    from attnlab.probe.config import validate_probe

    with pytest.raises(ConfigError, match="cannot be a directory name"):
        validate_probe({"method": "frozen", "name": name})


def test_probe_names_that_share_a_directory_are_refused(tmp_path):
    from attnlab.probe.config import load_experiment, validate_probe

    assert validate_probe({"method": "frozen", "name": "LoRA r8+skip"}).dir_name == "LoRA-r8+skip"
    exp = tmp_path / "e.toml"
    exp.write_text(
        'methods = [{method = "frozen", name = "a b"}, {method = "preproj", name = "a-b"}]\n'
    )
    with pytest.raises(ConfigError, match="runs/a-b"):
        load_experiment(exp)


def test_non_finite_scores_are_an_error():
    from attnlab.base.errors import NonFiniteError
    from attnlab.base.finite import check_metrics

    ok = {"perplexity": {"metrics": {"loss": 3.2, "n": 4}}}
    check_metrics(ok, "m")
    bad = {"perplexity": {"metrics": {"loss": float("nan"), "n": 4}}}
    with pytest.raises(NonFiniteError, match=r"perplexity\.loss") as e:
        check_metrics(bad, "m")
    assert e.value.exit_code == exitcodes.DIVERGED


def test_warnings_are_one_line_and_foreign_deprecations_are_dropped(capsys, monkeypatch):
    """The CLI's rule (attnlab.base.warning_lines): attnlab's warnings as they are, another package's
    named and on one line, another package's deprecation notices dropped unless the user
    configured warnings (-W / PYTHONWARNINGS)."""
    import sys
    import warnings

    import torch

    from attnlab.base.warning_lines import cli_warnings
    from attnlab.runs.records import RunFileWarning

    before = warnings.showwarning

    def emit() -> list[str]:
        with cli_warnings("eval"):
            warnings.simplefilter("always")
            warnings.warn_explicit("torch\n  says this", UserWarning, torch.__file__, 1)
            warnings.warn_explicit("an old API", FutureWarning, torch.__file__, 2)
            warnings.warn_explicit("an older API", DeprecationWarning, torch.__file__, 3)
            warnings.warn_explicit("run file damaged", RunFileWarning, "/elsewhere/x.py", 4)
        return capsys.readouterr().err.splitlines()

    assert emit() == [
        "attnlab eval: warning: (torch) torch says this",
        "attnlab eval: warning: run file damaged",
    ]
    monkeypatch.setattr(sys, "warnoptions", ["default"])
    assert emit() == [
        "attnlab eval: warning: (torch) torch says this",
        "attnlab eval: warning: (torch) an old API",
        "attnlab eval: warning: (torch) an older API",
        "attnlab eval: warning: run file damaged",
    ]
    assert warnings.showwarning is before  # restored after the block


def test_contracts_doc_states_every_slot_dims_field_and_score_context_field():
    """docs/CONTRACTS.md repeats the contracts of parts/slots.py: a section per slot, every Dims
    field, every ScoreContext field; each contract class states its forward's shapes."""
    import dataclasses

    from attnlab.parts import Dims, ScoreContext
    from attnlab.parts.slots import SLOTS

    doc = (DOCS / "CONTRACTS.md").read_text()
    for name, slot in SLOTS.items():
        assert f"`{name}` (`{slot.base.__name__}`" in doc, name
        assert "forward(" in (slot.base.__doc__ or ""), slot.base.__name__
    for f in dataclasses.fields(Dims):
        assert f"| `{f.name}`" in doc or f", `{f.name}`" in doc, f.name
        assert f"``{f.name}``" in (Dims.__doc__ or ""), f.name
    for f in dataclasses.fields(ScoreContext):
        assert f"`{f.name}`" in doc.split("### `score`")[1].split("###")[0], f.name
        assert f"``{f.name}``" in (ScoreContext.__doc__ or ""), f.name
