"""Issue 32, the config and evaluation inputs: nothing a user writes is silently dropped, coerced
or falsely refused.

* a slot whose kind changes keeps the preset's options the new kind has, and names the ones it
  drops (config files, ``--set``, experiment variants, and ``compare``'s plan and report);
* two keys that name one option are refused, naming both;
* seeds outside what numpy and torch take are refused with the range;
* task items are validated (strict types), not coerced, and refused naming file, line and field;
* a one-item task is scored, its standard error "n/a", exit 0;
* ``attnlab-lm-eval`` on bad local files: clear errors, out-of-range labels refused, an over-long
  item handled on its own;
* ``mc:FILE`` reads the common field shapes and a field mapping;
* the experiment-file schema is documented key by key, and advice names flags that exist.
"""

from __future__ import annotations

import json
import textwrap
import warnings
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.config import ConfigError, DroppedOptionWarning, load_config, validate
from attnlab.model.params import count
from tests.helpers import paths
from tests.helpers.paths import PACKAGE

DYT = '''
"""Dynamic Tanh (Zhu et al. 2025) as a norm: g * tanh(alpha x) + b; params d + 1 (+ d bias)."""
import torch
from torch import nn

from attnlab.parts import Field, NormPart, register


@register("norm", "dyt")
class DyT(NormPart):
    cost = "params d + 1 (2d + 1 with bias); FLOPs 0"

    class Options(NormPart.Options):
        alpha: float = Field(0.5, gt=0)

    @classmethod
    def param_count(cls, opts, dims):
        return dims.d_model * (2 if opts.bias else 1) + 1

    def __init__(self, opts, dims):
        super().__init__(opts, dims)
        self.alpha = nn.Parameter(torch.full((1,), opts.alpha))
        self.weight = nn.Parameter(torch.ones(dims.d_model))
        self.bias = nn.Parameter(torch.zeros(dims.d_model)) if opts.bias else None

    def reset_norm(self):
        with torch.no_grad():
            self.weight.fill_(1.0)
            if self.bias is not None:
                self.bias.zero_()

    def forward(self, x):
        y = self.weight * torch.tanh(self.alpha * x)
        return y if self.bias is None else y + self.bias
'''


@pytest.fixture(scope="module")
def dyt(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("plugin") / "dyt_norm.py"
    path.write_text(DYT, encoding="utf-8")
    return str(path)


def norm_params(cfg) -> int:
    return count(cfg.model).by_part["norm"]


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``attnlab ARGV`` in this process: (exit code, stdout, stderr); argparse's exit included."""
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out
    return code, out.out, out.err


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


# ------------------------------------------------------------ 1. a slot's kind changes


def test_set_kind_keeps_the_presets_options_the_new_kind_has(dyt) -> None:
    """tiny has norm.bias = false: a DyT norm chosen by --set keeps it (5 norms x 65 params,
    not 5 x 129 with a bias the preset turned off)."""
    switched = load_config("tiny", ["model.norm.kind=dyt"], [dyt])
    assert switched.model.norm.bias is False
    explicit = load_config("tiny", ["model.norm.kind=dyt", "model.norm.bias=false"], [dyt])
    with_bias = load_config("tiny", ["model.norm.kind=dyt", "model.norm.bias=true"], [dyt])
    assert norm_params(switched) == norm_params(explicit) < norm_params(with_bias)


def test_a_file_extending_a_preset_keeps_its_options_too(tmp_path, dyt) -> None:
    path = write(
        tmp_path / "dyt.toml",
        f"""
        extends = "tiny"
        plugins = [{json.dumps(dyt)}]
        [model.norm]
        kind = "dyt"
        alpha = 0.25
        """,
    )
    cfg = load_config(path)
    assert cfg.model.norm.bias is False and cfg.model.norm.alpha == 0.25


def test_an_option_the_new_kind_lacks_is_dropped_with_a_note_naming_it(tmp_path) -> None:
    path = write(
        tmp_path / "rope.toml",
        """
        extends = "tiny"
        [model.position]
        kind = "rope"
        base = 500.0
        fraction = 0.5
        """,
    )
    with pytest.warns(DroppedOptionWarning) as got:
        cfg = load_config(path, ["model.position.kind=sinusoidal"])
    assert cfg.model.position.base == 500.0  # sinusoidal has a base: carried over
    (line,) = [str(w.message) for w in got]
    assert "model.position.kind = 'sinusoidal'" in line and "'fraction'" in line
    assert "'rope'" in line and "\n" not in line
    notes: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # given a list, validate collects instead of warning
        from attnlab.config import apply_overrides, source_dict

        validate(apply_overrides(source_dict(path), ["model.position.kind=alibi"]), notes)
    assert len(notes) == 1 and "has no options 'base', 'fraction'" in notes[0]


def test_a_dumped_config_carries_its_choices_not_its_defaults() -> None:
    """A config written out lists every default; switching a kind over it carries only what
    differs from the old kind's defaults (no note for a default left behind)."""
    from attnlab.config import apply_overrides

    rope = load_config("tiny", ["model.position.kind=rope", "model.position.base=500.0"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = validate(apply_overrides(rope.to_dict(), ["model.position.kind=sinusoidal"]))
    assert cfg.model.position.base == 500.0
    nonlinear = load_config("tiny", ["model.query.kind=nonlinear", "model.query.ratio=0.25"])
    notes: list[str] = []
    validate(apply_overrides(nonlinear.to_dict(), ["model.query.kind=linear"]), notes)
    assert notes == [
        "model.query.kind = 'linear' has no option 'ratio' (set for kind 'nonlinear'), so it "
        "was dropped"
    ]


def test_the_note_is_one_warning_line_on_the_command_line(tmp_path, capsys) -> None:
    path = write(tmp_path / "r.toml", 'extends = "tiny"\n[model.position]\nkind = "rope"\n')
    path.write_text(path.read_text() + "fraction = 0.5\n")
    code, _, err = cli(capsys, "params", str(path), "--set", "model.position.kind=alibi")
    assert code == 0
    assert "attnlab params: warning: model.position.kind = 'alibi' has no option 'fraction'" in err


def test_an_option_set_after_the_kind_change_is_the_users_not_a_carried_one(tmp_path) -> None:
    """An option the user sets with the new kind is never dropped as a carried one: one the new
    kind lacks is refused as an unknown key."""
    path = write(
        tmp_path / "r.toml", 'extends = "tiny"\n[model.position]\nkind = "rope"\nfraction = 0.5\n'
    )
    with pytest.raises(ConfigError, match=r"unknown key 'model\.position\.fraction'"):
        load_config(path, ["model.position.kind=alibi", "model.position.fraction=0.25"])


EXPERIMENT = """
seeds = [0]
[base]
extends = "tiny"
[base.model.position]
kind = "rope"
fraction = 0.5
base = 500.0
[budget]
steps = 30
[[variants]]
name = "rope"
[[variants]]
name = "sinusoidal"
set = ["model.position.kind=sinusoidal"]
[[variants]]
name = "dyt"
model = { norm = { kind = "dyt" } }
"""


def test_compare_reports_per_variant_what_a_kind_change_dropped(tmp_path, dyt) -> None:
    from attnlab.experiments import load_experiment
    from attnlab.experiments.sweeps.plan import print_plan

    path = write(tmp_path / "exp.toml", f"plugins = [{json.dumps(dyt)}]\n" + EXPERIMENT)
    exp = load_experiment(path)
    assert exp.variants["sinusoidal"].config.model.position.base == 500.0
    assert exp.variants["dyt"].config.model.norm.bias is False
    assert exp.variants["rope"].dropped == [] and exp.variants["dyt"].dropped == []
    (dropped,) = exp.variants["sinusoidal"].dropped
    assert "'fraction'" in dropped
    lines: list[str] = []
    print_plan(exp, lines.append)
    assert any("note: variant 'sinusoidal'" in s and "'fraction'" in s for s in lines)
    record = {v["name"]: v for v in exp.to_record()["variants"]}
    assert record["sinusoidal"]["dropped_options"] == [dropped]
    assert any("variant 'sinusoidal'" in n for n in exp.to_record()["notes"])


# ------------------------------------------------------------ 2. one option, two keys


@pytest.mark.parametrize(
    "sets,named",
    [
        (
            ["model.position.rope_base=500", "model.position.base=1000"],
            ["model.position.rope_base=500", "model.position.base=1000"],
        ),
        (["model.d_model=32", "model.d_model=64"], ["model.d_model=32", "model.d_model=64"]),
    ],
)
def test_two_set_of_one_option_are_refused_naming_both(capsys, sets, named) -> None:
    argv = ["params", "tiny", "--set", "model.position.kind=rope"]
    for s in sets:
        argv += ["--set", s]
    code, _, err = cli(capsys, *argv)
    assert code == 2 and all(n in err for n in named)


def test_the_same_set_twice_with_one_value_is_fine(capsys) -> None:
    code, _, _ = cli(
        capsys, "params", "tiny", "--set", "model.d_model=64", "--set", "model.d_model=64"
    )
    assert code == 0


def test_an_old_key_name_replaces_the_presets_value_under_its_new_name(tmp_path) -> None:
    path = write(
        tmp_path / "r.toml", 'extends = "tiny"\n[model.position]\nkind = "rope"\nbase = 10000.0\n'
    )
    assert load_config(path, ["model.position.rope_base=500"]).model.position.base == 500.0


def test_a_table_with_an_old_and_a_new_name_of_one_option_is_refused(tmp_path) -> None:
    path = write(
        tmp_path / "r.toml",
        '[model.position]\nkind = "rope"\nrope_base = 500.0\nbase = 1000.0\n',
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "model.position.rope_base = 500.0" in str(info.value)
    assert "model.position.base = 1000.0" in str(info.value)


def test_a_variant_setting_one_option_in_a_table_and_in_set_is_refused(tmp_path) -> None:
    from attnlab.experiments import load_experiment

    path = write(
        tmp_path / "exp.toml",
        """
        base = "tiny"
        [budget]
        steps = 30
        [[variants]]
        name = "a"
        model = { d_model = 32 }
        set = ["model.d_model=48"]
        """,
    )
    with pytest.raises(ConfigError, match=r"variant 'a'.*model\.d_model=32.*model\.d_model=48"):
        load_experiment(path)


def test_a_probe_config_naming_one_part_twice_is_refused() -> None:
    from attnlab.probe.config import load_probe_config

    with pytest.raises(ConfigError) as info:
        load_probe_config(None, ["parts.preproj.expansion=2", "parts.pre_projection.expansion=3"])
    assert "parts.preproj and parts.pre_projection are the same part" in str(info.value)


# ------------------------------------------------------------ 7. seeds


@pytest.mark.parametrize("key", ["model.mask.random_seed", "train.seed", "data.split_seed"])
@pytest.mark.parametrize("value", [2**63 - 1, 2**32, -1])
def test_a_seed_outside_what_generators_take_is_refused_with_the_range(key, value) -> None:
    sets = ["model.mask.kind=bigbird", "model.mask.window=2"]
    sets += ["model.mask.random_blocks=1", f"{key}={value}"]
    with pytest.raises(ConfigError) as info:
        load_config("tiny", sets)
    assert f"'{key}' = {value}" in str(info.value) and "0 to 4294967295" in str(info.value)


def test_the_largest_seed_builds_a_bigbird_model() -> None:
    from attnlab.model import build_model

    cfg = load_config(
        "tiny",
        [
            "model.mask.kind=bigbird",
            "model.mask.window=2",
            "model.mask.random_blocks=1",
            "model.mask.block_size=8",
            f"model.mask.random_seed={2**32 - 1}",
        ],
    )
    build_model(cfg.model)


def test_an_experiments_seeds_are_bounded_too(tmp_path) -> None:
    from attnlab.experiments import load_experiment

    path = write(
        tmp_path / "exp.toml",
        f'base = "tiny"\nseeds = [0, {2**40}]\n[budget]\nsteps = 30\n[[variants]]\nname = "a"\n',
    )
    with pytest.raises(ConfigError, match="0 to 4294967295"):
        load_experiment(path)


# ------------------------------------------------------------ 3. task items are validated

GOOD_MC = '{"query": "q", "choices": ["a", "b"], "gold": 0}'
GOOD_HS = '{"ctx_a": "A man", "ctx_b": "he", "endings": ["x", "y"], "label": 1}'
GOOD_ARC = (
    '{"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "B"}'
)


def task_file(tmp_path: Path, *lines: str, name: str = "items.jsonl") -> Path:
    """A JSONL file whose items are ``lines``, with a blank line after the first (so a line
    number and an item index differ)."""
    path = tmp_path / name
    path.write_text("\n\n".join(lines[:1]) + "\n\n" + "\n".join(lines[1:]) + "\n")
    return path


@pytest.mark.parametrize(
    "fmt,good,bad,field",
    [
        ("mc", GOOD_MC, '{"query": "q", "choices": ["a", "b"], "gold": 1.7}', "gold"),
        ("mc", GOOD_MC, '{"query": "q", "choices": ["a", "b"], "gold": true}', "gold"),
        ("mc", GOOD_MC, '{"query": "q", "choices": ["a", "b"], "gold": Infinity}', "gold"),
        ("mc", GOOD_MC, '{"query": "q", "choices": ["a", "b"], "gold": 2}', "gold"),
        ("mc", GOOD_MC, '{"query": "q", "choices": "ab", "gold": 0}', "choices"),
        ("mc", GOOD_MC, '{"query": "q", "choices": {"a": 1, "b": 2}, "gold": 0}', "choices"),
        ("mc", GOOD_MC, '{"query": null, "choices": ["a", "b"], "gold": 0}', "query"),
        ("mc", GOOD_MC, '{"query": "q", "choices": ["a", 3], "gold": 0}', "choices"),
        (
            "hellaswag",
            GOOD_HS,
            '{"ctx_a": "A", "ctx_b": "b", "endings": "xy", "label": 0}',
            "endings",
        ),
        (
            "hellaswag",
            GOOD_HS,
            '{"ctx_a": "A", "ctx_b": "b", "endings": {"x": 1, "y": 2}, "label": 0}',
            "endings",
        ),
        (
            "hellaswag",
            GOOD_HS,
            '{"ctx_a": null, "ctx_b": "b", "endings": ["x"], "label": 0}',
            "ctx_a",
        ),
        ("hellaswag", GOOD_HS, '{"ctx": "c", "endings": ["x", "y"], "label": 1.7}', "label"),
        ("hellaswag", GOOD_HS, '{"ctx": "c", "endings": ["x", "y"], "label": "B"}', "label"),
        (
            "arc",
            GOOD_ARC,
            '{"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B", "C"]}, '
            '"answerKey": "C"}',
            "choices",
        ),
        (
            "arc",
            GOOD_ARC,
            '{"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, '
            '"answerKey": "E"}',
            "answerKey",
        ),
        (
            "arc",
            GOOD_ARC,
            '{"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, '
            '"answerKey": 1}',
            "answerKey",
        ),
    ],
)
def test_a_wrong_item_is_refused_naming_file_line_item_and_field(tmp_path, fmt, good, bad, field):
    from attnlab.base.errors import UserError
    from attnlab.eval.multiple_choice import load_mc_file

    path = task_file(tmp_path, good, good, bad)
    with pytest.raises(UserError) as info:
        load_mc_file(fmt, path)
    message = str(info.value)
    assert f"{path}:4: item 2 (0-based): field {field!r}" in message, message
    assert "Traceback" not in message and "\n" not in message


@pytest.mark.parametrize("text", ["null", "3", '["a b"]'])
def test_a_cloze_or_document_text_that_is_no_string_is_refused(tmp_path, text) -> None:
    from attnlab.base.errors import UserError
    from attnlab.eval.cloze import load_cloze_file
    from attnlab.eval.registry import _text_documents

    path = task_file(tmp_path, '{"text": "a b c"}', f'{{"text": {text}}}')
    with pytest.raises(UserError, match=r"items.jsonl:3: item 1 \(0-based\): field 'text' = "):
        load_cloze_file(path)
    with pytest.raises(UserError, match=r"items.jsonl:3: item 1 \(0-based\): field 'text'"):
        _text_documents(None, path, None)  # refused before the model is asked anything


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny attnlab run (one training step: the scores do not matter, only the plumbing)."""
    from tests.helpers.hf import alternation_run

    return alternation_run(tmp_path_factory.mktemp("eval") / "run", steps=1)


def test_eval_refuses_a_wrong_item_with_one_line_and_exit_2(tmp_path, run, capsys) -> None:
    path = task_file(tmp_path, GOOD_MC, '{"query": "q", "choices": ["a", "b"], "gold": true}')
    code, _, err = cli(capsys, "eval", str(run), "--tasks", f"mc:{path}", "--no-save")
    assert code == 2
    assert f"{path}:3: item 1 (0-based): field 'gold' = True" in err


# ------------------------------------------------------------ 4. a task of one item


@pytest.mark.parametrize(
    "task,line",
    [("mc", GOOD_MC), ("cloze", '{"text": "the cat sat on the mat"}'), ("arc", GOOD_ARC)],
)
def test_a_one_item_task_is_scored_with_stderr_na_and_exit_0(tmp_path, run, capsys, task, line):
    path = tmp_path / "one.jsonl"
    path.write_text(line + "\n")
    code, out, err = cli(
        capsys,
        "eval",
        str(run),
        "--tasks",
        f"{task}:{path}",
        "--no-save",
        "--json",
        "--no-progress",
    )
    assert code == 0, err
    metrics = json.loads(out)[f"{task}:one"]["metrics"]
    assert metrics["n"] == 1 and metrics["acc_stderr"] is None
    assert metrics["acc"] in (0.0, 1.0)
    code, out, _ = cli(
        capsys, "eval", str(run), "--tasks", f"{task}:{path}", "--no-save", "--no-progress"
    )
    assert code == 0 and "n/a" in out and "retrain" not in out


def test_an_all_empty_document_file_is_refused_not_scored_nan(tmp_path, run, capsys) -> None:
    path = tmp_path / "empty_docs.jsonl"
    path.write_text('{"text": ""}\n{"text": ""}\n')
    code, _, err = cli(capsys, "eval", str(run), "--tasks", f"perplexity:{path}", "--no-save")
    assert code == 2 and "every one is empty" in err and "retrain" not in err


# ------------------------------------------------------------ 6. mc reads the common shapes

SHAPES = {
    "hellaswag_fields": [
        {"ctx": "The sky is", "endings": ["blue", "loud", "wet"], "label": "0"},
        {"ctx": "Grass is", "endings": ["red", "green"], "label": 1},
    ],
    "question_list_letter": [
        {"question": "The sky is", "choices": ["blue", "loud", "wet"], "answer": "A"},
        {"question": "Grass is", "choices": ["red", "green"], "answer": 1},
    ],
    "question_arc_object": [
        {
            "question": "The sky is",
            "choices": {"text": ["blue", "loud", "wet"], "label": ["1", "2", "3"]},
            "answer": "1",
        },
        {
            "question": "Grass is",
            "choices": {"text": ["red", "green"], "label": ["A", "B"]},
            "answerKey": "B",
        },
    ],
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_mc_recognises_the_common_shapes(tmp_path, shape) -> None:
    from attnlab.eval.multiple_choice import MCItem, load_mc_file

    rows = SHAPES[shape]
    if shape == "question_arc_object":
        rows = [rows[0], {**rows[1], "answer": rows[1].pop("answerKey")}]
    path = tmp_path / f"{shape}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_mc_file("mc", path) == [
        MCItem("The sky is", ["blue", "loud", "wet"], 0),
        MCItem("Grass is", ["red", "green"], 1),
    ]


def test_mc_takes_a_field_mapping_in_the_task_name(tmp_path) -> None:
    import torch

    from attnlab.eval.evaluate import evaluate
    from attnlab.eval.registry import task_key
    from tests.helpers.eval_doubles import TableLM

    rows = [{"prompt": "x", "options": ["a", "b"], "right": 1}] * 3
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = f"mc:{path}?query=prompt&choices=options&gold=right"
    assert task_key(spec) == "mc:mine"
    table = torch.zeros(257)
    table[ord("b")] = 5.0  # every position prefers "b": the right choice of every item
    result = evaluate(TableLM(lambda prev: table), [spec], save=False)
    assert result["mc:mine"]["metrics"]["acc"] == 1.0 and result["mc:mine"]["metrics"]["n"] == 3


def test_mc_names_the_shapes_and_the_mapping_when_it_knows_none(tmp_path) -> None:
    from attnlab.base.errors import UserError
    from attnlab.eval.multiple_choice import load_mc_file, split_fields

    path = tmp_path / "odd.jsonl"
    path.write_text('{"prompt": "x", "options": ["a"], "right": 0}\n')
    with pytest.raises(UserError) as info:
        load_mc_file("mc", path)
    assert "{ctx, endings, label}" in str(info.value) and "?query=FIELD" in str(info.value)
    with pytest.raises(UserError, match="'answer=right' is not a field mapping"):
        split_fields(f"{path}?answer=right")


# ------------------------------------------------------------ 5. attnlab-lm-eval on local files


def lm_eval_main(monkeypatch, capsys, argv: list[str]) -> tuple[int, str]:
    """``attnlab-lm-eval ARGV`` with lm-eval's own run replaced by a stand-in that fails the test:
    a bad file must be refused before lm-eval (and ``datasets``) read it."""
    import sys

    import lm_eval.__main__

    from attnlab.eval import lm_eval_cli

    def reached() -> None:
        raise AssertionError("lm-eval ran on a file attnlab should have refused")

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", reached)
    monkeypatch.setattr(sys, "argv", ["attnlab-lm-eval", *argv])
    with pytest.raises(SystemExit) as info:
        lm_eval_cli.main()
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    return int(info.value.code), err


@pytest.mark.parametrize(
    "content,words",
    [
        ("", ["has no items"]),
        ("\n  \n", ["has no items"]),
        (GOOD_MC + "\nnot json\n", [":2: not valid JSON"]),
        (
            GOOD_MC + "\n" + '{"query": "q", "choices": ["a", "b"], "gold": 2}\n',
            [":2: item 1", "'gold' = 2 is out of range"],
        ),
        ('{"query": "q", "choices": ["a", "b"], "gold": "B"}\n', [":1: item 0", "integer index"]),
    ],
)
def test_attnlab_lm_eval_refuses_a_bad_local_file_naming_file_and_line(
    tmp_path, monkeypatch, capsys, content, words
) -> None:
    from attnlab.eval.lm_eval_tasks import write_task_yamls

    data = tmp_path / "mine.jsonl"
    data.write_text(content)
    tasks = write_task_yamls(tmp_path / "tasks", mc=data)
    argv = ["--model", "attnlab", "--tasks", "attnlab_mc_local", "--include_path", str(tasks)]
    code, err = lm_eval_main(monkeypatch, capsys, argv)
    assert code == 2 and err.startswith("attnlab-lm-eval: error: task 'attnlab_mc_local': ")
    assert str(data) in err and all(w in err for w in words), err


def test_attnlab_lm_eval_checks_every_local_kind_and_a_missing_file(
    tmp_path, monkeypatch, capsys
) -> None:
    from attnlab.eval.lm_eval_tasks import write_task_yamls

    bad = {
        "hellaswag": '{"ctx": "c", "endings": "xy", "label": 0}',
        "arc": '{"question": "q", "choices": {"text": ["a"], "label": ["A", "B"]}, "answerKey": "B"}',
        "cloze": '{"text": null}',
        "text": '{"text": 3}',
    }
    for kind, line in bad.items():
        data = tmp_path / f"{kind}.jsonl"
        data.write_text(line + "\n")
        tasks = write_task_yamls(tmp_path / f"tasks_{kind}", **{kind: data})
        argv = ["-t", f"attnlab_{kind}_local,other", "--include_path", str(tasks)]
        code, err = lm_eval_main(monkeypatch, capsys, argv)
        assert code == 2 and f"{data}:1: item 0 (0-based): field" in err, err
    tasks = write_task_yamls(tmp_path / "gone", mc=tmp_path / "hellaswag.jsonl")
    (tmp_path / "hellaswag.jsonl").unlink()
    argv = ["--tasks", "attnlab_mc_local", "--include_path", str(tasks)]
    code, err = lm_eval_main(monkeypatch, capsys, argv)
    assert code == 2 and "which is not a file" in err and "write_task_yamls" in err


# ------------------------------------------------------------ 8. the experiment-file schema

DOCS = paths.DOCS / "commands.md"


def schema_section() -> str:
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("### The experiment file, key by key")
    return text[start : text.index("\n### ", start + 10)]


def spec_keys() -> dict[str, object]:
    """Every key of the experiment schema, dotted (``variants.match_by``), from the pydantic
    models themselves; the sweep's grid is written as its keys: ``sweep."KEY"``."""
    from typing import get_args

    from attnlab.base.section import Section
    from attnlab.experiments.spec import ExperimentSpec

    out: dict[str, object] = {}

    def walk(cls, prefix: str) -> None:
        for name, field in cls.model_fields.items():
            key = f"{prefix}{name}"
            key = 'sweep."KEY"' if key == "sweep.grid" else key
            out[key] = field.annotation
            args = [field.annotation, *get_args(field.annotation)]
            args += [b for a in args for b in get_args(a)]
            for sub in {a for a in args if isinstance(a, type) and issubclass(a, Section)}:
                walk(sub, f"{key}.")

    walk(ExperimentSpec, "")
    return out


def documented_keys() -> list[str]:
    import re

    keys = []
    for line in schema_section().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[1].startswith("`"):
            continue
        table = re.sub(r"[`\[\]]", "", cells[0])
        key = cells[1].strip("`")
        keys.append(key if table == "(top)" else f"{table}.{key}")
    return keys


def test_every_key_of_the_experiment_schema_is_documented() -> None:
    documented, schema = documented_keys(), spec_keys()
    # a table ([budget], [[variants]]) is documented by its keys' rows
    missing = [
        k
        for k in schema
        if k not in documented and not any(d.startswith(f"{k}.") for d in documented)
    ]
    assert not missing, f"keys of ExperimentSpec missing from docs/commands.md: {missing}"
    # a documented key is a key of the schema, or lies in a table-valued one (base.extends)
    stale = [
        k
        for k in documented
        if k not in schema
        and not any(k.startswith(f"{t}.") and "dict" in str(schema[t]) for t in schema)
    ]
    assert not stale, f"docs/commands.md documents keys the schema does not have: {stale}"
    assert len(documented) == len(set(documented))


def test_the_documented_example_loads_and_uses_every_key(tmp_path) -> None:
    import re
    import shutil
    import tomllib

    from attnlab.experiments import load_experiment

    example = re.search(r"```toml\n(.*?)```", schema_section(), re.S).group(1)
    shutil.copyfile(DOCS.parents[1] / "examples" / "my_ideas.py", tmp_path / "my_ideas.py")
    exp = load_experiment(write(tmp_path / "demo.toml", example))
    assert exp.name == "demo" and exp.steps == 300 and exp.variants["mlp-matched@weight_decay=0.1"]
    raw, used = tomllib.loads(example), set()

    def collect(d, prefix=""):
        for k, v in d.items():
            key = f"{prefix}{k}"
            used.add(key)
            if isinstance(v, dict):
                collect(v, f"{key}.")
            if isinstance(v, list) and v and isinstance(v[0], dict):
                for item in v:
                    collect(item, f"{key}.")

    collect(raw)
    grid = {k for k in used if k.startswith("sweep.train")}
    used = (used - grid) | ({'sweep."KEY"'} if grid else set())
    # a key set only in a comment is the alternative of another (budget.tokens for steps)
    assert not [
        k for k in spec_keys() if k not in used and f"# or: {k.split('.')[-1]} =" not in example
    ]


# ------------------------------------------------------------ 9. advice names real flags

#: module (under src/attnlab) -> the commands its messages speak for
ADVICE_MODULES = {
    "commands/eval.py": ("eval",),
    **{
        f"config/{p.name}": ("params", "train", "compare", "bench", "probe")
        for p in (PACKAGE / "config").glob("*.py")
    },
    "recipe.py": ("train", "compare", "probe"),
    "base/section.py": ("params", "train", "compare", "bench", "probe"),
    "experiments/resolve.py": ("compare",),
    "experiments/spec.py": ("compare",),
    "experiments/sweep_spec.py": ("compare",),
    "probe/config.py": ("probe",),
    **{f"eval/{p.name}": ("eval",) for p in (PACKAGE / "eval").glob("*.py")},
    **{f"eval/{m}.py": ("lm-eval",) for m in ("lm_eval_cli", "lm_eval_files", "harness")},
    "eval/lm_eval_tasks.py": ("lm-eval",),
    # consent to run a model folder's code: every command that loads a folder, a received run or
    # probe directory, or an export as a base or an initialisation
    "base/consent.py": ("eval", "inspect", "generate", "export", "train", "probe"),
    "hf/export_plugins.py": ("eval", "inspect", "export", "train", "probe"),
    "hf/init_from.py": ("train",),
    "probe/base.py": ("probe", "eval"),
    "base/outfile.py": ("inspect", "bench"),
}


def command_flags() -> dict[str, set[str]]:
    """Every command's flags, from the CLI's own parser (and lm-eval's run parser)."""
    import argparse
    import re

    import lm_eval

    from attnlab.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = {
        name: {s for a in p._actions for s in a.option_strings} for name, p in sub.choices.items()
    }
    run = (Path(lm_eval.__file__).parent / "_cli" / "run.py").read_text(encoding="utf-8")
    out["lm-eval"] = set(re.findall(r'"(--[a-z_]+)"', run))
    return out


def advice(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string in a module that is not a docstring: what users may see."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            docstrings.add(id(body[0].value))
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


def test_every_flag_an_eval_or_config_message_names_exists() -> None:
    import re

    flags = command_flags()
    src = PACKAGE
    bad, seen = [], 0
    for module, commands in ADVICE_MODULES.items():
        for line, text in advice(src / module):
            for m in re.finditer(r"(?<![\w-])--[a-z][a-z0-9_-]*[a-z0-9]", text):
                # the program named last before the flag: `attnlab CMD`, lm-eval's CLI, or pip
                named = [
                    (n.group(0), n.group(1))
                    for n in re.finditer(
                        r"attnlab-lm-eval|lm_eval_cli|lm_eval |pip install|attnlab ([a-z]+)",
                        text[: m.start()],
                    )
                ]
                if named and named[-1][0] == "pip install":
                    continue  # pip's own flags (--no-deps, --force)
                where = commands
                if named and named[-1][1] in flags:
                    where = (named[-1][1],)
                elif named and not named[-1][1]:
                    where = ("lm-eval",)
                seen += 1
                if not all(m.group() in flags[c] for c in where):
                    bad.append(f"{module}:{line}: {m.group()} (for {', '.join(where)})")
    assert seen > 20  # the walk reads the messages
    assert not bad, "advice names flags the command lacks:\n" + "\n".join(bad)


def test_a_probe_methods_table_of_a_part_replaces_the_shared_one_under_another_name(
    tmp_path,
) -> None:
    from attnlab.probe.config import load_experiment

    path = write(
        tmp_path / "probe.toml",
        """
        [parts.preproj]
        expansion = 2.0
        [[methods]]
        method = "preproj"
        [[methods]]
        method = "preproj"
        name = "wide"
        parts = { pre_projection = { expansion = 3.0 } }
        """,
    )
    _, (shared, wide) = load_experiment(path)
    assert shared.probe.feature_map.expansion == 2.0
    assert wide.probe.feature_map.expansion == 3.0
