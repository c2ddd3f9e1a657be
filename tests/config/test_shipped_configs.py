"""Every config the repository ships or documents loads with today's keys: the experiment and
probe files under configs/, and the ``train.*`` keys and ``--set`` items the README and docs/
(docs/commands.md, the command reference, above all) name, so a renamed key cannot linger in the
documentation. The presets: test_config.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.config import ConfigError, TrainConfig, load_config
from attnlab.probe.config import ProbeTrainConfig, is_experiment_file, load_probe_config
from attnlab.probe.config import load_experiment as load_probe_experiment
from attnlab.probe.moved_keys import MOVED
from tests.helpers.paths import ROOT
from tests.helpers.registry import restored

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _files(folder: str) -> list[Path]:
    return sorted((ROOT / "configs" / folder).glob("*.toml"))


@pytest.mark.parametrize("path", _files("probe"), ids=lambda p: p.name)
def test_every_probe_config_loads(path: Path):
    if is_experiment_file(path):
        _, configs = load_probe_experiment(path)
        assert configs
        assert len({c.train.plan.sequences for c in configs}) == 1
    else:
        load_probe_config(path)


def test_the_paper_recipe_files_keep_an_effective_batch_of_16_sequences_of_512():
    for name in ("smollm2-table2", "pythia-160m-table2", "smollm2"):
        path = ROOT / "configs" / "probe" / f"{name}.toml"
        cfgs = (
            load_probe_experiment(path)[1]
            if is_experiment_file(path)
            else [load_probe_config(path)]
        )
        for cfg in cfgs:
            t = cfg.train
            assert (t.max_steps, t.lr, t.plan.sequences, t.seq_len) == (500, 1e-5, 16, 512)


def _doc_texts() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in DOCS} | {
        str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
        for p in (ROOT / "configs").rglob("*.toml")
    }


def test_every_documented_train_key_exists():
    """``train.KEY`` in the README, docs/ and the config comments is a key of the shared recipe or
    of a protocol's ``[train]`` table (or a moved probe key, where its move is explained)."""
    known = set(TrainConfig.model_fields) | set(ProbeTrainConfig.model_fields) | set(MOVED)
    missing = {
        f"{name}: train.{key}"
        for name, text in _doc_texts().items()
        for key in re.findall(r"(?<![\w./])train\.(?!bin\b)([a-z_0-9]+)", text)
        if key not in known
    }
    assert not missing, sorted(missing)


def _commands(verbs: tuple[str, ...]) -> list[tuple[str, str | None]]:
    """(command line, the error line printed under it or None) for every documented command of
    ``verbs`` with ``--set`` items."""
    out = []
    for doc in DOCS:
        lines = [x.strip().removeprefix("$ ") for x in doc.read_text(encoding="utf-8").splitlines()]
        for i, line in enumerate(lines):
            if re.match(rf"attnlab ({'|'.join(verbs)}) ", line) and "--set" in line:
                said = lines[i + 1 : i + 3]
                error = None
                if said and ": error:" in said[0]:  # its message: on that line, or the next
                    first = said[0].partition(": error:")[2].strip().removeprefix("--set: ")
                    error = said[1].removeprefix("- ") if first.endswith(":") else first
                out.append((line, error))
    return out


def test_the_command_reference_is_among_the_checked_documents():
    """The per-command reference (docs/commands.md) holds most documented commands; its
    ``--set`` items are checked like the README's, and so are its error lines."""
    assert ROOT / "docs" / "commands.md" in DOCS
    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    lines = [x.strip().removeprefix("$ ") for x in text.splitlines()]
    checked = [x for x in lines if re.match(r"attnlab (train|params) ", x) and "--set" in x]
    assert len(checked) >= 5, checked


@pytest.mark.parametrize(("line", "error"), _commands(("train", "params")))
def test_documented_set_items_validate(line: str, error: str | None, monkeypatch, capsys):
    """A documented command's ``--set`` items load; where the docs show the error it prints, it
    prints that error (up to a closing '...')."""
    argv = shlex.split(line)
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    plugins = [argv[i + 1] for i, a in enumerate(argv) if a == "--plugin"]
    if plugins:  # the plugin's parts leave the registry again with the block
        args = [x for p in plugins for x in ("--plugin", p)] + [
            x for s in sets for x in ("--set", s)
        ]
        monkeypatch.chdir(ROOT)  # the documented plugin paths are the repository's
        with restored():
            assert main(["params", argv[2], *args]) == 0, capsys.readouterr().err
        return
    if error is None:
        load_config(argv[2], sets)
        return
    with pytest.raises(ConfigError) as e:
        load_config(argv[2], sets)
    assert error.removesuffix("...").strip() in str(e.value)
