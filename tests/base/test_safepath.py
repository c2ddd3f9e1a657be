"""No write leaves its directory through a link; output paths are checked before any work."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnlab.base.errors import UserError
from attnlab.base.safepath import UnsafePathError, check_out_dir, check_out_file, check_tree, inside


@pytest.mark.fast
def test_inside_follows_links_and_refuses_the_ones_that_leave(tmp_path):
    root, away = tmp_path / "run", tmp_path / "away"
    (root / "real").mkdir(parents=True)
    away.mkdir()
    assert inside(root, root / "real" / "f.json") == root / "real" / "f.json"
    (root / "here").symlink_to(root / "real")  # a link that stays inside is fine
    assert inside(root, root / "here" / "f.json")
    (root / "eval").symlink_to(away)
    with pytest.raises(UnsafePathError, match=r"eval is a link to .*away, outside"):
        inside(root, root / "eval" / "results.json")
    (root / "real" / "results.json").symlink_to(away / "x.json")  # the file itself
    with pytest.raises(UnsafePathError, match=r"results\.json is a link"):
        inside(root, root / "real" / "results.json")


def test_check_tree_finds_a_nested_link_out(tmp_path):
    root = tmp_path / "exp"
    (root / "runs" / "a").mkdir(parents=True)
    check_tree(root)
    check_tree(tmp_path / "missing")  # nothing there yet: nothing to refuse
    (root / "runs" / "a" / "plots").symlink_to("/tmp")
    with pytest.raises(UnsafePathError, match=r"plots is a link to /tmp"):
        check_tree(root)


def test_output_directories_are_checked_without_leaving_traces(tmp_path):
    new = tmp_path / "a" / "b" / "run"
    assert check_out_dir(new) == new
    assert not (tmp_path / "a").exists()  # probed by creating and removing it
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UserError, match="is a file"):
        check_out_dir(f)
    with pytest.raises(UserError, match=r"file is a file, not a directory"):
        check_out_dir(f / "sub")
    with pytest.raises(UserError, match="cannot"):
        check_out_dir("/proc/attnlab-no-such-dir")
    with pytest.raises(UserError, match="is a directory"):
        check_out_file(tmp_path)
    assert check_out_file(tmp_path / "new" / "r.json") == tmp_path / "new" / "r.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_eval_refuses_to_write_through_a_link_out_of_the_run(hostile_lab, tmp_path):
    from attnlab.eval.evaluate import evaluate

    run, away = tmp_path / "run", tmp_path / "away"
    shutil.copytree(hostile_lab.run, run)
    away.mkdir()
    (run / "eval").symlink_to(away, target_is_directory=True)
    with pytest.raises(UnsafePathError, match="outside"):
        evaluate(str(run), "perplexity", limit=1, device="cpu")
    assert list(away.iterdir()) == []
    results = evaluate(str(run), "perplexity", limit=1, device="cpu", save=False)
    assert results["perplexity"]["metrics"]  # without saving, nothing is written anywhere
    assert list(away.iterdir()) == []


def test_a_run_directory_with_a_link_out_is_not_trained_into(hostile_lab, tmp_path, capsys):
    from attnlab.cli import main

    run = tmp_path / "run"
    shutil.copytree(hostile_lab.run, run)
    (run / "checkpoints" / "elsewhere").symlink_to(tmp_path, target_is_directory=True)
    before = {p: p.read_bytes() for p in Path(run).rglob("*") if p.is_file() and not p.is_symlink()}
    code = main(["train", str(hostile_lab.cfg), "--out", str(run), "--quiet", "--restart"])
    assert code == 2 and "elsewhere is a link" in capsys.readouterr().err
    assert all(p.read_bytes() == b for p, b in before.items())  # --restart deleted nothing
