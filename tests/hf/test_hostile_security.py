"""Issue 32, "code runs from data": a model folder's code runs only with the user's consent, only
as exported (the recorded SHA-256, checked before import) and only from inside the folder.

The folder's plugin file writes a sentinel file when it is imported, so every refusal also proves
that nothing was imported. Loading happens in this process with the plugin's parts taken out of
the registry (as in a fresh process, where the folder's copy would be imported), and once through
the real CLI in a fresh interpreter; the folder's own remote code is loaded by transformers in a
child interpreter where attnlab cannot be imported.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.hf.export import export
from attnlab.parts import plugins, registry
from attnlab.parts.plugins import source_hash
from tests.helpers.hf import BLOCK_ATTNLAB, fake_run
from tests.helpers.paths import EXAMPLES

torch.set_num_threads(1)
SENTINEL_ENV = "ATTNLAB_TEST_SENTINEL"
KIND = "gated_sec"
PLUGIN = "sec_ideas.py"
#: first lines of the plugin: record every import of it in the sentinel file, when one is named
SENTINEL_CODE = (
    "import os as _os\n"
    f"if _os.environ.get({SENTINEL_ENV!r}):\n"
    f"    with open(_os.environ[{SENTINEL_ENV!r}], 'a') as _f:\n"
    "        _f.write(__file__ + '\\n')\n"
)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> Path:
    """An export of a run whose query part comes from a plugin file that writes the sentinel."""
    root = tmp_path_factory.mktemp("sec")
    text = (EXAMPLES / "my_ideas.py").read_text()
    text = text.replace('"gated")', f'"{KIND}")').replace('"low_rank_skip")', '"lrs_sec")')
    (root / "lab").mkdir()
    (root / "lab" / PLUGIN).write_text(SENTINEL_CODE + text)
    run = fake_run(root / "run", [f"model.query.kind={KIND}"], plugins=[str(root / "lab" / PLUGIN)])
    return export(run, root / "hf").out


@pytest.fixture
def folder(export_dir, tmp_path) -> Path:
    """A copy of the export of this test's own (tests tamper with it)."""
    return Path(shutil.copytree(export_dir, tmp_path / "model"))


@pytest.fixture
def sentinel(tmp_path, monkeypatch) -> Path:
    """The file the plugin writes when it is imported (it must stay absent when refused)."""
    path = tmp_path / "IMPORTED"
    monkeypatch.setenv(SENTINEL_ENV, str(path))
    return path


@pytest.fixture
def fresh(monkeypatch):
    """This process as a fresh one: the plugin's parts and records are not loaded (restored
    after the test)."""
    parts = {slot: dict(specs) for slot, specs in registry._parts.items()}
    loaded = dict(plugins._loaded)
    for specs in registry._parts.values():
        for kind in [k for k in specs if k in (KIND, "lrs_sec")]:
            del specs[kind]
    yield
    registry._parts.clear()
    registry._parts.update(parts)
    plugins._loaded.clear()
    plugins._loaded.update(loaded)


def _inspect(target: str, tmp_path: Path, *flags: str) -> tuple[int, Path]:
    page = tmp_path / "page.html"
    code = main(["inspect", target, "--prompt", "hello there", "--out", str(page), *flags])
    return code, page


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _set_plugin(folder: Path, **changes) -> None:
    config = _config(folder)
    config["attnlab_plugins"][0].update(changes)
    (folder / "config.json").write_text(json.dumps(config, indent=1))


# ------------------------------------------------------------------------------------- consent


@pytest.mark.usefixtures("fresh")
def test_inspect_and_eval_refuse_the_folders_code_without_consent(
    folder, sentinel, tmp_path, capsys
):
    code, page = _inspect(f"hf:{folder}", tmp_path)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"plugins/{PLUGIN}" in err and "--trust-remote-code" in err
    assert not sentinel.exists() and not page.exists()
    text = tmp_path / "text.txt"
    text.write_text("some text to score " * 20)
    args = ["eval", f"hf:{folder}", "--tasks", f"perplexity:{text}", "--no-save", "--device", "cpu"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"plugins/{PLUGIN}" in err and "--trust-remote-code" in err
    assert not sentinel.exists()
    # consent: the same commands run, and the folder's plugin file is what was imported
    assert main([*args, "--trust-remote-code"]) == 0, capsys.readouterr().err
    assert sentinel.read_text().splitlines() == [str((folder / "plugins" / PLUGIN).resolve())]
    code, page = _inspect(f"hf:{folder}", tmp_path, "--trust-remote-code")
    assert code == 0 and page.is_file()


@pytest.mark.usefixtures("fresh")
def test_from_pretrained_needs_trust_remote_code_for_an_exports_plugin_code(folder, sentinel):
    """With attnlab imported, transformers builds the export with attnlab's own class; the
    folder's plugin file is imported only with transformers' own consent keyword."""
    from transformers import AutoModelForCausalLM

    import attnlab.hf
    from attnlab.hf.export_plugins import RemoteCodeError

    with pytest.raises(RemoteCodeError, match=r"trust_remote_code=True") as refused:
        AutoModelForCausalLM.from_pretrained(folder)
    assert f"plugins/{PLUGIN}" in str(refused.value)
    assert not sentinel.exists()
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    assert type(model) is attnlab.hf.AttnlabForCausalLM
    assert registry.get("query", KIND).source == str((folder / "plugins" / PLUGIN).resolve())
    assert sentinel.is_file()


def test_a_fresh_attnlab_eval_process_refuses_then_consents(folder, tmp_path):
    """The trial's case through the real command in a fresh interpreter."""
    text = tmp_path / "text.txt"
    text.write_text("some text to score " * 20)
    sentinel = tmp_path / "IMPORTED"
    env = {**os.environ, SENTINEL_ENV: str(sentinel), "HF_MODULES_CACHE": str(tmp_path / "m")}
    argv = [sys.executable, "-m", "attnlab", "eval", f"hf:{folder}", "--tasks"]
    argv += [f"perplexity:{text}", "--no-save", "--device", "cpu", "--no-progress"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--trust-remote-code" in proc.stderr and "Traceback" not in proc.stderr
    assert not sentinel.exists()
    proc = subprocess.run(
        [*argv, "--trust-remote-code"], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sentinel.is_file()


def test_nothing_is_imported_when_the_parts_are_already_loaded_from_the_same_code(folder, sentinel):
    """``--init-from`` with ``--plugin``: the registered parts were loaded from a file with the
    recorded hash, so the folder's copy is not imported and no consent is asked."""
    from transformers import AutoModelForCausalLM

    import attnlab.hf  # noqa: F401

    AutoModelForCausalLM.from_pretrained(folder)
    assert not sentinel.exists()


def test_a_foreign_folders_own_modeling_code_needs_the_flag(tmp_path, sentinel, capsys):
    """A Hugging Face folder with ``auto_map`` code: refused with the flag named (transformers
    would otherwise prompt on the terminal), nothing of it run."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    d = tmp_path / "custom"
    d.mkdir()
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<eos>": 1, "a": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>"})
    )
    auto = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (d / "config.json").write_text(json.dumps({"model_type": "evil_s32", "auto_map": auto}))
    (d / "evil.py").write_text(SENTINEL_CODE + "raise SystemExit('ran')\n")
    text = tmp_path / "text.txt"
    text.write_text("a a a a")
    args = ["eval", f"hf:{d}", "--tasks", f"perplexity:{text}", "--no-save", "--device", "cpu"]
    assert main(args) == 2
    assert "--trust-remote-code" in capsys.readouterr().err
    assert not sentinel.exists()


# ---------------------------------------------------------------------------- hash and escape


@pytest.mark.usefixtures("fresh")
def test_a_changed_plugin_file_is_refused_even_with_consent(folder, sentinel, tmp_path, capsys):
    path = folder / "plugins" / PLUGIN
    path.write_text(path.read_text() + "\nprint('changed after export')\n")
    code, page = _inspect(f"hf:{folder}", tmp_path, "--trust-remote-code")
    err = capsys.readouterr().err
    assert code == 2 and f"plugins/{PLUGIN}" in err and "SHA-256" in err, err
    assert not sentinel.exists() and not page.exists()


@pytest.mark.parametrize(
    "entry", ["../outside.py", "plugins/../../outside.py", "ABSOLUTE", "plugins/sub/x.py", None]
)
@pytest.mark.usefixtures("fresh")
def test_a_plugin_path_out_of_the_folder_is_refused(folder, sentinel, tmp_path, capsys, entry):
    """config.json may name only ``plugins/NAME.py``: even with consent and the right hash of
    the file it points at, nothing outside the folder is imported."""
    outside = tmp_path / "outside.py"
    shutil.copyfile(folder / "plugins" / PLUGIN, outside)
    (folder / "plugins" / "sub").mkdir()
    shutil.copyfile(outside, folder / "plugins" / "sub" / "x.py")
    relative = str(outside) if entry == "ABSOLUTE" else entry
    if entry is None:  # a package plugin: loaded by name, never by a path in config.json
        _set_plugin(folder, file=None, spec=str(outside))
    else:
        _set_plugin(folder, file=relative, sha256=source_hash([outside]))
    code, _ = _inspect(f"hf:{folder}", tmp_path, "--trust-remote-code")
    err = capsys.readouterr().err
    assert code == 2, err
    assert "outside" in err or "inside the folder" in err or "does not hold" in err, err
    assert not sentinel.exists()


@pytest.mark.usefixtures("fresh")
def test_a_plugin_file_linked_out_of_the_folder_is_refused(folder, sentinel, tmp_path, capsys):
    outside = tmp_path / "elsewhere" / PLUGIN
    outside.parent.mkdir()
    shutil.move(folder / "plugins" / PLUGIN, outside)  # the same bytes: the hash would match
    (folder / "plugins" / PLUGIN).symlink_to(outside)
    code, _ = _inspect(f"hf:{folder}", tmp_path, "--trust-remote-code")
    err = capsys.readouterr().err
    assert code == 2 and "outside the folder" in err, err
    assert not sentinel.exists()


# ------------------------------------------------------------------- the folder's remote code

REMOTE = """
import json, sys
from transformers import AutoModelForCausalLM
out = {}
for name, folder in json.loads(sys.argv[1]).items():
    try:
        AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
        out[name] = "loaded"
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"
print("RESULT", json.dumps(out))
"""


def test_the_folders_remote_code_checks_its_plugin_files_before_importing(export_dir, tmp_path):
    """transformers with ``trust_remote_code=True`` and no attnlab: the consent is to run the
    folder as exported, so its own code refuses a changed copied plugin, a copy linked out of
    the folder and a config.json whose record differs, importing none of them."""
    config = _config(export_dir)["attnlab_plugins"][0]
    flat = f"{config['flat_module']}.py"
    folders = {}
    for case in ("intact", "changed", "linked", "recorded"):
        folders[case] = Path(shutil.copytree(export_dir, tmp_path / case))
    (folders["changed"] / flat).write_text((export_dir / flat).read_text() + "\nX = 1\n")
    outside = tmp_path / "outside" / flat
    outside.parent.mkdir()
    shutil.move(folders["linked"] / flat, outside)
    (folders["linked"] / flat).symlink_to(outside)
    _set_plugin(folders["recorded"], flat_sha256=hashlib.sha256(b"other").hexdigest())
    sentinel = tmp_path / "IMPORTED"
    env = {**os.environ, SENTINEL_ENV: str(sentinel), "HF_MODULES_CACHE": str(tmp_path / "m")}
    argv = [sys.executable, "-c", BLOCK_ATTNLAB + REMOTE]
    jobs = {k: str(v) for k, v in folders.items() if k != "intact"}
    proc = subprocess.run(
        [*argv, json.dumps(jobs)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    for case in jobs:
        assert result[case].startswith("ValueError") and flat in result[case], (case, result)
    assert "not the code the model was exported with" in result["changed"]
    assert "outside the folder" in result["linked"] or "not the code" in result["linked"]
    assert not sentinel.exists()
    proc = subprocess.run(  # the intact folder: its plugin is imported (the control)
        [*argv, json.dumps({"intact": str(folders["intact"])})],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert json.loads(proc.stdout.split("RESULT", 1)[1]) == {"intact": "loaded"}, proc.stderr
    assert sentinel.is_file()


# ------------------------------------------------------ a received run directory's plugin file


def test_a_run_directorys_config_naming_a_plugin_inside_it_needs_consent(
    hostile_lab, tmp_path, sentinel, capsys
):
    """A run directory from elsewhere whose config.toml names a plugin file it carries: the
    file is code that came with the data, imported only with --trust-remote-code."""
    import re

    run = Path(shutil.copytree(hostile_lab.run, tmp_path / "received"))
    (run / "extra.py").write_text(SENTINEL_CODE)
    config = run / "config.toml"
    text = re.sub(r"(?m)^plugins = \[.*\]\n", "", config.read_text())
    config.write_text('plugins = ["extra.py"]\n' + text)
    data = tmp_path / "text.txt"
    data.write_text("some text to score " * 20)
    args = ["eval", str(run), "--tasks", f"perplexity:{data}", "--no-save", "--device", "cpu"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "extra.py" in err and "--trust-remote-code" in err and "Traceback" not in err, err
    assert not sentinel.exists()
    assert main(["generate", str(run), "--prompt", "the", "--max-new-tokens", "2"]) == 2
    assert "extra.py" in capsys.readouterr().err and not sentinel.exists()
    assert main([*args, "--trust-remote-code"]) == 0, capsys.readouterr().err
    assert sentinel.is_file()
