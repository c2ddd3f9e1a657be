"""Issue 32, the rest of "lost data" and "code runs from data": every output file a user names is
attnlab's own or new, code comes from the bytes that were checked, and an export carries what
its plugins import.

- ``bench --out``/``--save``, ``eval --out`` and ``eval --build-cloze --out`` follow the rule of
  ``inspect --out`` (:mod:`attnlab.base.outfile`): never a link, a device, a FIFO, a file inside an
  attnlab directory, a file attnlab did not write or one edited since; ``--force`` (bench,
  inspect) replaces only attnlab's own unedited file, and ``eval --out`` merges only into one;
- an old page without a stamp is refused even with ``--force``, and the message says to move or
  delete it by hand.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from attnlab.base.outfile import STAMP_KEY, written_by_attnlab
from attnlab.cli import main
from tests.helpers.paths import EXAMPLES

torch.set_num_threads(1)
PROMPT = ["--prompt", "the cat sat on the mat"]
#: the fastest bench there is: one tiny peer, one training step
BENCH = ["bench", "tiny", "--variants", "none", "--peers", "nanogpt", "--sections", "training"]
BENCH += ["--steps", "1", "--repeats", "1", "--warmup", "0", "--batch-size", "1", "--seq-len", "8"]
BENCH += ["--threads", "1"]


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err


@pytest.fixture
def hostile_outs(hostile_lab, tmp_path) -> dict[str, Path]:
    """Paths an output must never replace: a user's file, a copied run's config, /dev/null, a
    FIFO, a link to the user's file."""
    run = Path(shutil.copytree(hostile_lab.run, tmp_path / "run"))
    thesis = tmp_path / "thesis.md"
    thesis.write_text("three years of work\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link.json"
    link.symlink_to(thesis)
    return {
        "user": thesis,
        "run": run / "config.toml",
        "device": Path("/dev/null"),
        "fifo": fifo,
        "link": link,
    }


def _same(paths: dict[str, Path], before: dict[str, bytes | None]) -> None:
    for case, p in paths.items():
        if before[case] is not None:
            assert p.read_bytes() == before[case], case
    assert paths["link"].is_symlink() and paths["fifo"].exists() and not paths["fifo"].is_file()


def _bytes(paths: dict[str, Path]) -> dict[str, bytes | None]:
    return {k: p.read_bytes() if p.is_file() else None for k, p in paths.items()}


# ----------------------------------------------------------------------------- bench --out


def test_bench_out_writes_stamped_files_and_replaces_them_only_with_force(tmp_path, capsys):
    stem = tmp_path / "speed"
    md, js = stem.with_suffix(".md"), stem.with_suffix(".json")
    assert main([*BENCH, "--out", str(stem)]) == 0, _err(capsys)
    assert written_by_attnlab(md) is True and written_by_attnlab(js) is True
    assert STAMP_KEY in json.loads(js.read_text())
    first = md.read_bytes(), js.read_bytes()
    assert main([*BENCH, "--out", str(stem)]) == 2
    assert "pass --force" in _err(capsys)
    assert (md.read_bytes(), js.read_bytes()) == first
    assert main([*BENCH, "--out", str(stem), "--force"]) == 0, _err(capsys)
    assert js.read_bytes() != first[1] and written_by_attnlab(js) is True
    md.write_text(md.read_text().replace("# attnlab bench", "# my notes", 1))
    edited = md.read_bytes(), js.read_bytes()
    assert main([*BENCH, "--out", str(stem), "--force"]) == 2
    assert "changed since" in _err(capsys)
    assert (md.read_bytes(), js.read_bytes()) == edited  # neither file of the pair is written


@pytest.mark.parametrize("case", ["user", "run", "fifo", "link"])
def test_bench_out_never_replaces_what_attnlab_did_not_write(hostile_outs, tmp_path, case, capsys):
    """FILE.md or FILE.json of ``--out FILE`` is the user's file, a run's own file, a FIFO or a
    link; the other one of the pair is not written either."""
    fifo = tmp_path / "fifo.md"
    os.mkfifo(fifo)
    link = tmp_path / "linked.json"
    link.symlink_to(hostile_outs["user"])
    run_file = hostile_outs["run"].parent / "notes.md"  # a new name, but inside a run
    target = {"user": hostile_outs["user"], "run": run_file, "fifo": fifo, "link": link}[case]
    before = _bytes(hostile_outs)
    stem = target.with_suffix("")
    for force in ([], ["--force"]):
        assert main([*BENCH, "--out", str(stem), *force]) == 2
        err = _err(capsys)
        assert str(target) in err, err
    _same(hostile_outs, before)
    assert not run_file.exists() and link.is_symlink() and not fifo.is_file()
    other = {".md": ".json", ".json": ".md"}[target.suffix]
    assert not target.with_suffix(other).exists()  # nothing half-written beside it


def test_bench_save_refuses_a_result_file_it_did_not_write(tmp_path, monkeypatch, capsys):
    """``--save`` names its file itself (benchmarks/results/MACHINE-CONFIG); a file there that
    attnlab did not write is not replaced either, and the message names --save."""
    monkeypatch.setenv("ATTNLAB_RESULTS_DIR", str(tmp_path))
    assert main([*BENCH, "--save"]) == 0, _err(capsys)
    (md,) = tmp_path.glob("*.md")
    md.write_text("my own notes about this machine\n")
    assert main([*BENCH, "--save", "--force"]) == 2
    err = _err(capsys)
    assert "--save" in err and "carries no attnlab stamp" in err, err
    assert md.read_text() == "my own notes about this machine\n"


# ------------------------------------------------------------------------------- eval --out


def _eval(hostile_lab, tmp_path: Path, out: Path, *tasks: str) -> list[str]:
    text = tmp_path / "text.txt"
    if not text.exists():
        text.write_text("the cat sat on the mat and looked at the dog. " * 8)
    tasks = tasks or (f"perplexity:{text}",)
    args = ["eval", str(hostile_lab.run), "--tasks", ",".join(tasks), "--limit", "2"]
    return [*args, "--no-save", "--device", "cpu", "--no-progress", "--out", str(out)]


def test_eval_out_merges_only_into_its_own_unedited_results(hostile_lab, tmp_path, capsys):
    out = tmp_path / "results.json"
    assert main(_eval(hostile_lab, tmp_path, out)) == 0, _err(capsys)
    assert written_by_attnlab(out) is True
    (key,) = json.loads(out.read_text())["tasks"]
    other = tmp_path / "other.txt"
    other.write_text("a dog and a cat. " * 20)
    assert main(_eval(hostile_lab, tmp_path, out, f"perplexity:{other}")) == 0, _err(capsys)
    tasks = json.loads(out.read_text())["tasks"]
    assert len(tasks) == 2 and key in tasks  # merged: the first result is kept
    assert written_by_attnlab(out) is True
    data = json.loads(out.read_text())
    data["tasks"][key]["metrics"]["note"] = "checked by hand"
    out.write_text(json.dumps(data, indent=2))
    edited = out.read_bytes()
    assert main(_eval(hostile_lab, tmp_path, out)) == 2
    err = _err(capsys)
    assert "changed since" in err and "--force" not in err, err  # eval has no --force
    assert out.read_bytes() == edited


@pytest.mark.parametrize("case", ["user", "run", "device", "fifo", "link"])
def test_eval_out_never_writes_into_what_attnlab_did_not_write(
    hostile_lab, hostile_outs, tmp_path, case, capsys
):
    before = _bytes(hostile_outs)
    assert main(_eval(hostile_lab, tmp_path, hostile_outs[case])) == 2
    err = _err(capsys)
    assert str(hostile_outs[case]) in err, err
    _same(hostile_outs, before)


def test_an_unstamped_results_file_says_to_move_it_by_hand(hostile_lab, tmp_path, capsys):
    """A results file from before eval --out stamped its files: refused, and the message says
    what to do about it (no flag of eval's replaces it)."""
    out = tmp_path / "old.json"
    out.write_text(json.dumps({"tasks": {"perplexity": {"metrics": {"ppl": 3.0}}}}))
    before = out.read_bytes()
    assert main(_eval(hostile_lab, tmp_path, out)) == 2
    err = _err(capsys)
    assert "carries no attnlab stamp" in err and "by hand" in err, err
    assert out.read_bytes() == before


def test_build_cloze_writes_only_a_new_file(hostile_lab, hostile_outs, tmp_path, capsys):
    """A JSON-lines set has no room for a stamp: it is written only where nothing is."""
    from attnlab.base.errors import UserError
    from attnlab.eval.cloze_build import build_cloze_set
    from tests.eval.test_cloze import DOC

    texts = [DOC.replace("boats", w) for w in ("boats", "ships", "nets", "sails")]
    out = tmp_path / "cloze.jsonl"
    rows = build_cloze_set(texts, n=2, min_context_words=30, out=out)
    first = out.read_bytes()
    assert [json.loads(line) for line in first.decode().splitlines()] == rows
    with pytest.raises(UserError, match="only as a new file"):  # not even its own
        build_cloze_set(texts, n=2, min_context_words=30, seed=1, out=out)
    assert out.read_bytes() == first
    args = ["eval", "--build-cloze", str(hostile_lab.data), "--n", "3"]
    before = _bytes(hostile_outs)
    for case, path in [("own", out), *hostile_outs.items()]:
        assert main([*args, "--out", str(path)]) == 2, case
        assert str(path) in _err(capsys)
    _same(hostile_outs, before)
    assert out.read_bytes() == first


# --------------------------------------------------------------------- an old page (issue 6)


def test_an_old_page_without_a_stamp_is_refused_even_with_force_saying_how(
    hostile_lab, tmp_path, capsys
):
    """A page from before pages were stamped cannot be told from a user's file: --force does
    not replace it, and the message says so and to move or delete it by hand."""
    page = tmp_path / "page.html"
    page.write_text("<html><body>an inspect page from an earlier attnlab</body></html>\n")
    before = page.read_bytes()
    assert main(["inspect", str(hostile_lab.run), *PROMPT, "--out", str(page), "--force"]) == 2
    err = _err(capsys)
    assert "not even with --force" in err and "delete it by hand" in err, err
    assert "earlier attnlab" in err or "from before" in err, err
    assert page.read_bytes() == before


# ------------------------------------------------------------- a probe's LoRA directory (5)

KILL_LORA = """
import os, signal, sys, types
from pathlib import Path
import attnlab.base.swap as swap
import attnlab.probe.artifacts as artifacts

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

def after(fn):
    def run(*args, **kwargs):
        fn(*args, **kwargs)
        die()
    return run

def save_pretrained(folder, save_embedding_layers=False):
    for name in artifacts.LORA_FILES:
        Path(folder, name).write_text(sys.argv[2])

moment = sys.argv[3]
if moment == "before-swap":
    swap._exchange = die
elif moment == "after-swap":
    swap._exchange = after(swap._exchange)
elif moment == "between-renames":
    swap._exchange = lambda a, b: False
    swap._aside = after(swap._aside)
artifacts.probe_record = lambda *a: {"files": {"adapter": None, "lora": artifacts.LORA_DIR}}
probed = types.SimpleNamespace(
    injection=None, lora=True, model=types.SimpleNamespace(save_pretrained=save_pretrained)
)
artifacts.save_probe(Path(sys.argv[1]), probed, None, 1)
print("not killed")
"""


@pytest.mark.parametrize("moment", ["before-swap", "after-swap", "between-renames", "none"])
def test_a_killed_probe_leaves_its_old_or_new_lora_directory(tmp_path, moment):
    """The probe's LoRA directory is swapped in with the atomic exchange of base.swap (killed
    right after it, the new one is in place); where the exchange is missing, the rename-aside
    fallback's one gap is closed by the recovery that loading the probe runs."""
    import subprocess
    import sys

    from attnlab.base.swap import leftovers
    from attnlab.probe.artifacts import LORA_DIR, LORA_FILES, AdapterWarning, recover_lora

    lora = tmp_path / "probe" / LORA_DIR

    def content() -> set[str]:
        return {(lora / name).read_text() for name in LORA_FILES}

    def save(tag: str, when: str):
        argv = [sys.executable, "-c", KILL_LORA, str(lora.parent), tag, when]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    assert save("old", "none").returncode == 0 and content() == {"old"}
    proc = save("new", moment)
    if moment == "none":
        assert proc.returncode == 0 and content() == {"new"} and not leftovers(lora)
        return
    assert proc.returncode == -9, (proc.returncode, proc.stderr[-2000:])
    assert leftovers(lora), "the kill did not hit the replacement"
    if moment == "between-renames":
        assert not lora.exists()
        with pytest.warns(AdapterWarning, match="restored the folder it was replacing"):
            recover_lora(lora)  # what loading the probe does when the directory is missing
    assert content() == ({"new"} if moment == "after-swap" else {"old"})
    left = bool(leftovers(lora))
    proc = save("newer", "none")  # the next save clears what was left, saying so
    assert proc.returncode == 0 and ("left behind by a killed process" in proc.stderr) == left
    assert content() == {"newer"} and not leftovers(lora)


# ------------------------------------------------------- an export carries its plugin's helpers

LOAD = """
import json, sys, torch
if sys.argv[2] == "without-attnlab":
    exec(BLOCK)
else:
    import attnlab.hf  # attnlab's own class, which imports the folder's plugins/ copies
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
with torch.no_grad():
    logits = model(torch.tensor([IDS])).logits
print("RESULT", json.dumps({"class": type(model).__module__, "logits": logits.tolist()}))
"""
IDS = [5, 17, 3, 99, 42, 7, 7, 250]


@pytest.fixture(scope="module")
def helped_export(tmp_path_factory):
    """An export of a run whose side branch comes from a plugin with an eager and a lazy helper
    module (beside it, found through sys.path), the reference logits, and the plugin's own
    directory deleted afterwards."""
    import sys

    from attnlab.hf.export import export
    from attnlab.runs.load import load_run_model
    from tests.helpers.hf import fake_run
    from tests.parts.test_hostile_plugins import HELPED, RUNNING_MEAN, SCALE

    root = tmp_path_factory.mktemp("helped")
    lab = root / "lab"
    lab.mkdir()
    (lab / "helper_xo.py").write_text(RUNNING_MEAN)
    (lab / "lazy_xo.py").write_text(SCALE)
    (lab / "helped_xo.py").write_text(
        HELPED.format(helper="helper_xo", lazy="lazy_xo", kind="h_xo")
    )
    path = list(sys.path)
    try:
        run = fake_run(
            root / "run", ["model.side_branch.kind=h_xo"], plugins=[str(lab / "helped_xo.py")]
        )
        out = export(run, root / "hf").out
        model, _, _ = load_run_model(run)
        with torch.no_grad():
            reference = model(torch.tensor([IDS])).logits
    finally:
        sys.path[:] = path
        for name in ("helper_xo", "lazy_xo"):
            sys.modules.pop(name, None)
    shutil.rmtree(lab)  # the plugin's directory is gone: only the export holds the code
    return out, reference


def _load_fresh(folder: Path, route: str, tmp_path: Path) -> dict:
    import subprocess
    import sys

    from tests.helpers.hf import BLOCK_ATTNLAB

    code = LOAD.replace("BLOCK)", f"{BLOCK_ATTNLAB!r})").replace("IDS", repr(IDS))
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / f"modules-{route}")}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(folder), route],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RESULT", 1)[1])


@pytest.mark.parametrize("route", ["without-attnlab", "with-attnlab"])
def test_an_export_carries_its_plugins_helpers(helped_export, tmp_path, route):
    """The folder loads in a fresh process with trust_remote_code=True, the plugin's own
    directory deleted, and computes the run's logits: through its flat remote code (no
    attnlab), and through attnlab's class importing plugins/ and plugins/helpers/."""
    folder, reference = helped_export
    entry = json.loads((folder / "config.json").read_text())["attnlab_plugins"][0]
    helpers = {h["module"]: h for h in entry["helpers"]}
    assert set(helpers) == {"helper_xo", "lazy_xo"}
    for h in helpers.values():  # copied, recorded with the hash of the copy, inside plugins/
        assert h["file"] == f"plugins/helpers/{h['module']}.py"
        data = (folder / h["file"]).read_bytes()
        assert h["sha256"] == __import__("hashlib").sha256(data).hexdigest()
        assert (folder / f"{h['flat_module']}.py").is_file()
    result = _load_fresh(folder, route, tmp_path)
    module = "transformers_modules" if route == "without-attnlab" else "attnlab.hf"
    assert result["class"].startswith(module), result["class"]
    torch.testing.assert_close(torch.tensor(result["logits"]), reference, rtol=0, atol=1e-6)


@pytest.fixture
def unloaded_xo(monkeypatch):
    """This process as a fresh one for the helped plugin: its part unregistered, its helper
    modules not imported (all restored after the test)."""
    import sys

    from attnlab.parts import plugins, registry

    parts = {slot: dict(specs) for slot, specs in registry._parts.items()}
    loaded = dict(plugins._loaded)
    registry._parts.get("side_branch", {}).pop("h_xo", None)
    modules = {n: sys.modules.pop(n) for n in ("helper_xo", "lazy_xo") if n in sys.modules}
    before = set(sys.modules)
    yield
    registry._parts.clear()
    registry._parts.update(parts)
    plugins._loaded.clear()
    plugins._loaded.update(loaded)
    for name in set(sys.modules) - before:  # the plugin modules this test imported
        if name.startswith("attnlab_plugin_") or name in ("helper_xo", "lazy_xo"):
            del sys.modules[name]
    sys.modules.update(modules)


def _from_pretrained(folder: Path):
    from transformers import AutoModelForCausalLM

    import attnlab.hf  # noqa: F401

    return AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()


@pytest.mark.usefixtures("unloaded_xo")
def test_a_changed_or_escaping_helper_is_refused(helped_export, tmp_path):
    from attnlab.base.consent import RemoteCodeError

    folder = Path(shutil.copytree(helped_export[0], tmp_path / "changed"))
    helper = folder / "plugins" / "helpers" / "helper_xo.py"
    helper.write_text(helper.read_text() + "\nprint('changed after export')\n")
    with pytest.raises(RemoteCodeError, match=r"plugins/helpers/helper_xo\.py.*SHA-256"):
        _from_pretrained(folder)
    folder = Path(shutil.copytree(helped_export[0], tmp_path / "escaping"))
    config = json.loads((folder / "config.json").read_text())
    config["attnlab_plugins"][0]["helpers"][0]["file"] = "plugins/helpers/../../../x.py"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(RemoteCodeError, match="inside the folder"):
        _from_pretrained(folder)


EVIL = "open({sentinel!r}, 'a').write('EVIL ' + __name__ + '\\n')\n"


@pytest.mark.usefixtures("unloaded_xo")
def test_a_file_swapped_after_the_check_never_runs(helped_export, tmp_path, monkeypatch):
    """The plugin file and its helpers are replaced on disk right after their SHA-256 was
    checked: the bytes that were checked are the ones imported (the model computes the run's
    logits), the swapped-in code never runs."""
    from attnlab.hf import export_plugins

    folder = Path(shutil.copytree(helped_export[0], tmp_path / "model"))
    sentinel = tmp_path / "SWAPPED-CODE-RAN"
    checked = export_plugins._needed

    def check_then_swap(config):
        todo = checked(config)
        for path in (folder / "plugins").rglob("*.py"):
            path.write_text(EVIL.format(sentinel=str(sentinel)))
        return todo

    monkeypatch.setattr(export_plugins, "_needed", check_then_swap)
    model = _from_pretrained(folder)
    assert not sentinel.exists(), sentinel.read_text()
    with torch.no_grad():
        logits = model(torch.tensor([IDS])).logits
    torch.testing.assert_close(logits, helped_export[1], rtol=0, atol=1e-6)


SPY = """
import hashlib, os, pathlib
_real = hashlib.sha256
def _spy(data=b"", **kw):
    h = _real(data, **kw)
    if h.hexdigest() in TARGETS:  # the check just hashed a plugin file: swap it now
        for p in pathlib.Path(os.environ["HF_MODULES_CACHE"]).rglob("*.py"):
            if p.stem == TARGETS[h.hexdigest()]:
                p.write_text(EVIL)
    return h
hashlib.sha256 = _spy
"""


def test_the_remote_codes_files_swapped_after_the_check_never_run(helped_export, tmp_path):
    """The folder's own remote code (no attnlab): its copied plugin and helper modules are
    replaced right after check_plugin_files hashed them; the checked bytes are imported."""
    import subprocess
    import sys

    from tests.helpers.hf import BLOCK_ATTNLAB

    folder = helped_export[0]
    entry = json.loads((folder / "config.json").read_text())["attnlab_plugins"][0]
    targets = {e["flat_sha256"]: e["flat_module"] for e in [entry, *entry["helpers"]]}
    sentinel = tmp_path / "SWAPPED-CODE-RAN"
    spy = SPY.replace("TARGETS", repr(targets)).replace(
        "EVIL", repr(EVIL.format(sentinel=str(sentinel)))
    )
    code = LOAD.replace("exec(BLOCK)", f"exec({BLOCK_ATTNLAB!r})\n    exec({spy!r})")
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")}
    proc = subprocess.run(
        [sys.executable, "-c", code.replace("IDS", repr(IDS)), str(folder), "without-attnlab"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not sentinel.exists(), sentinel.read_text()
    swapped = [p for p in (tmp_path / "modules").rglob("*.py") if p.stem in targets.values()]
    assert swapped and all("EVIL" in p.read_text() for p in swapped)  # the swap did happen
    logits = torch.tensor(json.loads(proc.stdout.split("RESULT", 1)[1])["logits"])
    torch.testing.assert_close(logits, helped_export[1], rtol=0, atol=1e-6)


SELF_SWAPPING = """
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import helper_sw  # noqa: E402

# what a swap right after the loader read this file does: the file on disk changes now
Path(__file__).write_text("raise SystemExit('the swapped file')\\n")
Path(helper_sw.__file__).write_text("X = 'swapped'\\n")
"""


def test_a_plugins_recorded_hash_is_of_the_bytes_that_ran(tmp_path, monkeypatch):
    """A run records (and a resume compares) the plugin's SHA-256: it is the hash of the code
    that was imported, the plugin's and its helper's, not of the files read again after."""
    import hashlib
    import sys

    from attnlab.parts.identity import Helper, identity_hash
    from attnlab.parts.plugins import load_plugin, source_hash

    monkeypatch.setattr(sys, "path", list(sys.path))
    lab, kept = tmp_path / "lab", tmp_path / "as-imported"
    lab.mkdir()
    kept.mkdir()
    (lab / "helper_sw.py").write_text("X = 'original'\n")
    (lab / "swapping.py").write_text(SELF_SWAPPING)
    shutil.copy(lab / "swapping.py", kept / "swapping.py")
    own = source_hash([kept / "swapping.py"])
    helper = hashlib.sha256(b"X = 'original'\n").hexdigest()
    try:
        record = load_plugin(str(lab / "swapping.py"))
        assert sys.modules["helper_sw"].X == "original"
    finally:
        sys.modules.pop("helper_sw", None)
    assert [(h.module, h.sha256) for h in record.helpers] == [("helper_sw", helper)]
    assert record.sha256 == identity_hash(own, [Helper("helper_sw", "", helper)])
    assert record.sha256 != identity_hash(
        source_hash([lab / "swapping.py"]), [Helper("helper_sw", "", helper)]
    )


# ----------------------------------------------------- consent on every command that loads code


def _flags(command: str) -> set[str]:
    import argparse

    from attnlab.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {s for a in sub.choices[command]._actions for s in a.option_strings}


def _refused_naming_real_flags(argv: list[str], capsys) -> str:
    """Run ``argv``: refused (exit 2) with the consent flag named, and every flag its message
    names is one the command has."""
    import re

    assert main(argv) == 2
    err = _err(capsys)
    assert "--trust-remote-code" in err, err
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]", err))
    assert named <= _flags(argv[0]), (argv[0], named - _flags(argv[0]), err)
    return err


@pytest.fixture
def received_run(hostile_lab, tmp_path) -> Path:
    """A run directory from elsewhere whose config.toml names a plugin file it carries."""
    import re

    run = Path(shutil.copytree(hostile_lab.run, tmp_path / "received"))
    (run / "extra.py").write_text("X = 1\n")
    config = run / "config.toml"
    text = re.sub(r"(?m)^plugins = \[.*\]\n", "", config.read_text())
    config.write_text('plugins = ["extra.py"]\n' + text)
    return run


def test_generate_of_a_received_run_takes_the_consent_it_asks_for(received_run, capsys):
    generate = ["generate", str(received_run), "--prompt", "the", "--max-new-tokens", "2"]
    err = _refused_naming_real_flags(generate, capsys)
    assert "extra.py" in err
    assert main([*generate, "--trust-remote-code"]) == 0, _err(capsys)


def test_export_of_a_run_trained_with_a_plugin_inside_it_takes_the_consent_it_asks_for(
    tmp_path, capsys
):
    """A run shipped with the plugin it was trained with inside it: exporting it imports that
    file, so export asks for --trust-remote-code, a flag it has."""
    import sys

    from attnlab.parts import plugins, registry
    from tests.helpers.hf import fake_run

    text = (EXAMPLES / "my_ideas.py").read_text()
    text = text.replace('"gated")', '"gated_rcv")').replace('"low_rank_skip")', '"lrs_rcv")')
    run = tmp_path / "run"
    run.mkdir()
    (run / "ideas_rcv.py").write_text(text)
    parts = {slot: dict(specs) for slot, specs in registry._parts.items()}
    loaded, modules = dict(plugins._loaded), set(sys.modules)
    try:
        fake_run(run, ["model.query.kind=gated_rcv"], plugins=[str(run / "ideas_rcv.py")])
        for name in set(sys.modules) - modules:  # as received: nothing of it loaded here
            if name.startswith("attnlab_plugin_ideas_rcv"):
                del sys.modules[name]
        registry._parts["query"].pop("gated_rcv")
        registry._parts["side_branch"].pop("lrs_rcv")
        plugins._loaded.clear()
        plugins._loaded.update(loaded)
        export = ["export", str(run), "--out", str(tmp_path / "hf")]
        err = _refused_naming_real_flags(export, capsys)
        assert "ideas_rcv.py" in err and not (tmp_path / "hf").exists()
        assert main([*export, "--trust-remote-code"]) == 0, _err(capsys)
    finally:
        registry._parts.clear()
        registry._parts.update(parts)
        plugins._loaded.clear()
        plugins._loaded.update(loaded)


@pytest.mark.usefixtures("unloaded_xo")
def test_train_init_from_an_export_with_plugins_takes_the_consent_it_asks_for(
    helped_export, hostile_lab, tmp_path, capsys
):
    """Without --plugin, the refusal names --plugin and --trust-remote-code, both train's own;
    with the consent, the export's checked copies (plugin and helpers) are the run's plugins,
    where the plugin's own directory is gone."""
    folder = helped_export[0]
    argv = ["train", str(hostile_lab.cfg), "--init-from", str(folder), "--out"]
    argv += [str(tmp_path / "run"), "--skip-check", "--quiet", "--set", "train.max_steps=1"]
    argv += ["--set", "train.warmup_steps=0", "--set", "train.eval_every=1"]
    err = _refused_naming_real_flags(argv, capsys)
    assert "--plugin" in err and str(folder / "plugins") in err
    assert main([*argv, "--trust-remote-code"]) == 0, _err(capsys)
    plugins = json.loads((tmp_path / "run" / "plugins.json").read_text())["plugins"]
    assert [p["spec"] for p in plugins] == [str(folder / "plugins" / "helped_xo.py")]
    assert {h["module"] for h in plugins[0]["helpers"]} == {"helper_xo", "lazy_xo"}


@pytest.mark.usefixtures("unloaded_xo")
def test_probe_on_an_export_with_plugins_takes_the_consent_it_asks_for(
    helped_export, tmp_path, capsys
):
    """The probe refused with a flag it did not have (and, for a folder of remote code, asked on
    the terminal); now --trust-remote-code is the probe's, and with it the folder's code loads
    (the probe then says which architectures it can inject into)."""
    from tests.helpers.probe_doubles import write_corpus

    corpus = write_corpus(tmp_path / "corpus.jsonl")
    argv = ["probe", "--out", str(tmp_path / "probe"), "--data-root", str(tmp_path / "data")]
    for s in (f"base.model={helped_export[0]}", "method=lora", f"data.corpus={corpus}"):
        argv += ["--set", s]
    err = _refused_naming_real_flags(argv, capsys)
    assert "plugins/helped_xo.py" in err and "plugins/helpers/helper_xo.py" in err, err
    assert main([*argv, "--trust-remote-code"]) == 2
    err = _err(capsys)
    assert "--trust-remote-code" not in err and "architecture 'attnlab'" in err, err
