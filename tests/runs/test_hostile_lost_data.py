"""Issue 32, "lost data": no command replaces a byte attnlab did not write, or one a user edited
after attnlab wrote it, and a killed export leaves the old folder or the new one in place.

- ``inspect --out`` replaces only an earlier page of attnlab's (a self-verifying stamp), and
  only with ``--force``; never a user's file, a device, a link, or a run's own files;
- a copied ``.attnlab.json`` does not make a user's folder attnlab's (``train --restart``);
- a user's edits to files attnlab wrote (a run's config.toml, an experiment's report.md, an
  export's card) are kept aside, or refused by name;
- ``export --force`` killed (SIGKILL, in a child process) at each moment of the replacement.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

from attnlab.base import owned
from attnlab.base.swap import leftovers
from attnlab.cli import main
from attnlab.hf.export import export
from attnlab.hf.export_out import ExportWarning, recover_out
from tests.helpers.data import tiny_experiment
from tests.helpers.hf import fake_run

torch.set_num_threads(1)
PROMPT = ["--prompt", "the cat sat on the mat"]


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` but the marker and the lock file (a refused command may leave
    its empty lock), with its bytes."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in owned.ALWAYS_OURS
    }


# ----------------------------------------------------------------------------- inspect --out


def test_inspect_out_replaces_only_its_own_unchanged_page(hostile_lab, tmp_path, capsys):
    run = str(hostile_lab.run)
    page = tmp_path / "page.html"
    assert main(["inspect", run, *PROMPT, "--out", str(page)]) == 0
    first = page.read_bytes()
    assert main(["inspect", run, *PROMPT, "--out", str(page)]) == 2
    assert "pass --force" in capsys.readouterr().err and page.read_bytes() == first
    assert main(["inspect", run, *PROMPT, "--out", str(page), "--force"]) == 0
    page.write_text(page.read_text().replace("attnlab inspect", "my notes", 1))
    edited = page.read_bytes()
    assert main(["inspect", run, *PROMPT, "--out", str(page), "--force"]) == 2
    assert "changed since" in capsys.readouterr().err and page.read_bytes() == edited


@pytest.mark.parametrize("case", ["thesis", "config", "checkpoint", "device", "fifo", "link"])
def test_inspect_out_never_replaces_what_attnlab_did_not_write(hostile_lab, tmp_path, case, capsys):
    lab_run = tmp_path / "run"
    shutil.copytree(hostile_lab.run, lab_run)
    thesis = tmp_path / "thesis.md"
    thesis.write_text("three years of work\n")
    ckpt = sorted((lab_run / "checkpoints").glob("step_*"))[-1] / "model.safetensors"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link.html"
    link.symlink_to(thesis)
    out = {
        "thesis": thesis,
        "config": lab_run / "config.toml",
        "checkpoint": ckpt,
        "device": Path("/dev/null"),
        "fifo": fifo,
        "link": link,
    }[case]
    before = out.read_bytes() if out.is_file() else None
    for force in ([], ["--force"]):
        assert main(["inspect", str(hostile_lab.run), *PROMPT, "--out", str(out), *force]) == 2
        err = capsys.readouterr().err
        assert str(out) in err and "Traceback" not in err, err
    if before is not None:
        assert out.read_bytes() == before
    assert link.is_symlink() and fifo.exists() and not fifo.is_file()


# ----------------------------------------------------------------------------- copied marker


def test_a_copied_marker_does_not_make_a_users_folder_attnlabs(hostile_lab, tmp_path, capsys):
    """The trial's case: ``train --out U --restart`` (what the refusal of a plain rerun advises)
    on a folder of the user's holding a copy of a run's marker."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.toml").write_text("# my own config, by hand\n[model]\nn_layers = 12\n")
    (mine / "notes.md").write_text("notes\n")
    time.sleep(0.01)
    shutil.copyfile(hostile_lab.run / owned.MARKER, mine / owned.MARKER)
    before = _tree(mine)
    cfg = str(hostile_lab.cfg)
    for extra in (["--restart"], []):
        assert main(["train", cfg, "--out", str(mine), "--quiet", *extra]) == 2
        err = capsys.readouterr().err
        assert "not attnlab's run directory" in err and str(hostile_lab.run.resolve()) in err, err
        assert _tree(mine) == before
    # an earlier attnlab's marker (no home) copied in after the user's files: refused too
    marker = json.loads((hostile_lab.run / owned.MARKER).read_text())
    old = {k: marker[k] for k in ("written_by", "kind", "version")}
    (mine / owned.MARKER).write_text(json.dumps(old))
    assert main(["train", cfg, "--out", str(mine), "--quiet", "--restart"]) == 2
    assert "put there after the files" in capsys.readouterr().err
    assert _tree(mine) == before


def test_a_run_directory_copied_or_moved_whole_is_still_attnlabs(hostile_lab, tmp_path, capsys):
    copy = Path(shutil.copytree(hostile_lab.run, tmp_path / "copy"))
    assert main(["train", str(hostile_lab.cfg), "--out", str(copy), "--quiet"]) == 0
    assert "already finished" in capsys.readouterr().out
    moved = tmp_path / "moved"
    copy.rename(moved)
    assert main(["train", str(hostile_lab.cfg), "--out", str(moved), "--quiet"]) == 0


def test_an_earlier_attnlabs_marker_is_honoured_in_its_own_directory(tmp_path):
    """A marker without ``home`` (written by an attnlab before this one): honoured where it was
    written first (ctime) or the kind's evidence says so; not where it came in later."""
    old = {"written_by": "attnlab", "kind": "run", "version": "0.1"}
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / owned.MARKER).write_text(json.dumps(old))
    time.sleep(0.01)
    (ours / "config.toml").write_text("[model]\n")
    owned.claim(ours, "run", what="run directory")  # honoured (nothing written)
    owned.record_files(ours, "config.toml")  # attnlab's next write binds it here
    assert owned.read_marker(ours)["home"]["path"] == str(ours.resolve())
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "config.toml").write_text("[model]\n")
    time.sleep(0.01)
    (theirs / owned.MARKER).write_text(json.dumps(old))
    with pytest.raises(owned.UserError, match="put there after the files"):
        owned.claim(theirs, "run", what="run directory")
    owned.claim(theirs, "run", what="run directory", legacy=lambda d: True)  # the kind's evidence


# ------------------------------------------------------------------------------ edited files


def test_restart_keeps_a_config_the_user_edited(hostile_lab, tmp_path, capsys):
    run = Path(shutil.copytree(hostile_lab.run, tmp_path / "run"))
    mine = (run / "config.toml").read_text() + "\n# my note: try lr 3e-3 next\n"
    (run / "config.toml").write_text(mine)
    assert main(["train", str(hostile_lab.cfg), "--out", str(run), "--quiet", "--restart"]) == 0
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "kept as" in x]
    assert re.fullmatch(
        r"attnlab train: warning: .*kept as config\.user-edited-\d{8}-\d{6}\.toml", line
    )
    (kept,) = run.glob("config.user-edited-*.toml")
    assert kept.read_text() == mine
    assert "my note" not in (run / "config.toml").read_text()


def test_a_rerun_compare_keeps_the_report_the_user_edited(data_dir, tmp_path, capsys):
    tail = '[[variants]]\nname = "baseline"\n'
    exp = tiny_experiment(tmp_path / "exp.toml", data_dir, tail, seeds="[0]", device="cpu")
    out = tmp_path / "out"
    assert main(["compare", str(exp), "--out", str(out), "--quiet"]) == 0
    report = out / "report.md"
    mine = report.read_text() + "\n## My discussion\n\nThe baseline wins because...\n"
    report.write_text(mine)
    capsys.readouterr()
    assert main(["compare", str(exp), "--out", str(out), "--quiet"]) == 0
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "kept as" in x]
    assert "attnlab compare: warning:" in line and "kept as report.user-edited-" in line
    (kept,) = out.glob("report.user-edited-*.md")
    assert kept.read_text() == mine and "My discussion" not in report.read_text()
    assert main(["report", str(out)]) == 0  # unedited now: replaced without a word
    assert len(list(out.glob("report.user-edited-*.md"))) == 1


def test_export_force_refuses_a_card_the_user_edited(tmp_path, capsys):
    run = fake_run(tmp_path / "run", [], step=3)
    out = tmp_path / "hf"
    export(run, out)
    card = (out / "README.md").read_text() + "\n## Intended use\n\nMy words.\n"
    (out / "README.md").write_text(card)
    args = ["export", str(run), "--out", str(out), "--force"]
    assert main(args) == 2
    assert "README.md changed since attnlab wrote it" in capsys.readouterr().err
    assert (out / "README.md").read_text() == card
    # an earlier attnlab recorded names only: a file newer than its marker counts as edited
    marker = owned.read_marker(out)
    marker["files"] = sorted(marker["files"])
    del marker["home"]
    (out / owned.MARKER).write_text(json.dumps(marker))
    time.sleep(0.01)
    os.utime(out / "README.md")
    assert main(args) == 2 and "README.md changed since" in capsys.readouterr().err
    (out / "README.md").unlink()  # the user took their card away: the export may be replaced
    assert main(args) == 0


# --------------------------------------------------------------------------- a killed export

KILL = """
import os, signal, shutil, sys, types
from pathlib import Path
import attnlab.base.swap as swap
import attnlab.hf.tokenizer_files as tokenizer_files
from attnlab.hf.export import export

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

def after(fn):
    def run(*args, **kwargs):
        fn(*args, **kwargs)
        die()
    return run

def half_rmtree(path, ignore_errors=False):
    files = sorted(p for p in Path(path).rglob("*") if p.is_file())
    for p in files[: len(files) // 2]:
        p.unlink()
    die()

moment = sys.argv[3]
if moment == "writing":
    tokenizer_files.write_tokenizer = after(tokenizer_files.write_tokenizer)
elif moment == "before-swap":
    swap._exchange = die
elif moment == "after-swap":
    swap._exchange = after(swap._exchange)
elif moment == "deleting-old":
    swap.shutil = types.SimpleNamespace(rmtree=half_rmtree)
elif moment == "between-renames":
    swap._exchange = lambda a, b: False
    swap._aside = after(swap._aside)
export(sys.argv[1], sys.argv[2], force=True)
print("not killed")
"""


@pytest.fixture(scope="module")
def two_exports(tmp_path_factory):
    """Two runs, and their exports as references (in folders named like the destination)."""
    root = tmp_path_factory.mktemp("kill")
    runs = [fake_run(root / "run_a", [], seed=1, step=3), fake_run(root / "run_b", [], seed=2)]
    refs = [_tree(export(r, root / f"ref_{i}" / "hf").out) for i, r in enumerate(runs)]
    return runs, refs


@pytest.mark.parametrize(
    "moment", ["writing", "before-swap", "after-swap", "deleting-old", "between-renames"]
)
def test_a_killed_export_force_leaves_the_old_or_the_new_export(two_exports, tmp_path, moment):
    (run_a, run_b), (old, new) = two_exports
    out = tmp_path / "hf"
    export(run_a, out)
    proc = subprocess.run(
        [sys.executable, "-c", KILL, str(run_b), str(out), moment],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])
    assert leftovers(out), "the kill left no hidden folder: it did not hit the replacement"
    if moment == "between-renames":  # no exchange: the one moment without a folder at --out
        assert not out.exists()
        with pytest.warns(ExportWarning) as said:
            recover_out(out)  # what the next export does first
        assert "restored the folder it was replacing" in str(said[0].message)
        assert "left behind by a killed process" in str(said[1].message)
    assert _tree(out) in (old, new)  # complete: the old export or the new one, nothing else
    expected = new if moment in ("after-swap", "deleting-old") else old
    assert _tree(out) == expected
    with pytest.warns(ExportWarning, match="left behind") if leftovers(out) else nullcontext():
        export(run_b, out, force=True)
    assert _tree(out) == new and not leftovers(out)
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]


def test_the_hidden_folder_of_an_earlier_attnlab_is_removed(tmp_path):
    run = fake_run(tmp_path / "run", [], step=3)
    stranded = tmp_path / ".hf.export-999999999"  # what an earlier attnlab left when killed
    (stranded / "plugins").mkdir(parents=True)
    with pytest.warns(ExportWarning, match=r"removed \.hf\.export-999999999"):
        export(run, tmp_path / "hf")
    assert not stranded.exists()
