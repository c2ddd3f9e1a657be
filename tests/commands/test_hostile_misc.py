"""Issue 32, hostile inputs to retrieval, advice, ``inspect`` and ``--init-from``: each case
ends in a clear message naming the cause and the fix (no traceback), or in output that is true."""

from __future__ import annotations

import json
import re
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from attnlab.cli import main
from tests.helpers.data import WORDS, prepare_bytes, word_corpus


# ------------------------------------------------------------------------------ retrieval
@pytest.fixture(scope="module")
def one_document(tmp_path_factory) -> Path:
    """Data whose training split is one document (and validation another), with its database
    of k=2 neighbours built."""
    root = tmp_path_factory.mktemp("one-doc")
    corpus = word_corpus(root / "corpus.jsonl", WORDS, n_docs=2, length=300, seed=1)
    data = prepare_bytes(corpus, root / "prepared", val_fraction=0.5)
    assert [
        s["documents"] for s in json.loads((data / "meta.json").read_text())["splits"].values()
    ] == [1, 1]
    from attnlab.data.retrieval import build_database

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warning is the test's, below
        build_database(data, chunk_size=16, neighbours=2, workers=1)
    return data


def _retrieval(data: Path, *extra: str) -> int:
    return main(["data", "retrieval", "--data", str(data), "--workers", "1", *extra])


def test_a_one_document_training_split_warns_that_its_chunks_have_no_neighbours(
    one_document, capsys
):
    """Every training chunk shares the one document with every database chunk, so RETRO's
    no-leakage rule leaves it no neighbour: said, with the rule and the numbers, not "k=2"."""
    assert _retrieval(one_document) == 0
    cap = capsys.readouterr()
    train = np.load(one_document / "retrieval" / "m16-k2-c16" / "train.npy")
    assert (train < 0).all()  # the premise: no training chunk has a neighbour
    n = len(train)
    assert f"fewer for {n:,} train chunks" in cap.out
    warning = cap.err
    assert "warning:" in warning and f"{n:,} of {n:,} train chunks" in warning
    assert f"({n:,} have none)" in warning
    assert "no-leakage rule" in warning and "holds 1 document," in warning
    assert f"{n:,} of the {n:,} database chunks" in warning  # what the rule excluded
    assert "val chunks have fewer" not in warning  # validation retrieves from all of train


def _copy_database(one_document: Path, tmp_path: Path) -> tuple[Path, Path]:
    data = tmp_path / "data"
    shutil.copytree(one_document, data)
    return data, data / "retrieval" / "m16-k2-c16"


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


DAMAGE = {
    "meta-a-string": ("meta.json", lambda p: p.write_text('"a string"'), "a JSON string"),
    "meta-a-list": ("meta.json", lambda p: p.write_text("[1, 2]"), "a JSON list"),
    "meta-no-settings": (
        "meta.json",
        lambda p: p.write_text('{"format": "attnlab-retrieval", "version": 1}'),
        "no valid 'chunk_size'",
    ),
    "meta-a-directory": (
        "meta.json",
        lambda p: (p.unlink(), p.mkdir()),
        "is a directory, not a file",
    ),
    "npy-truncated": ("train.npy", _truncate, "cannot be read as a NumPy array"),
    "npy-other-shape": (
        "val.npy",
        lambda p: np.save(p, np.zeros((3, 5))),
        "holds float64 [3, 5], not int64",
    ),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_database_file_is_named_with_the_command_that_rebuilds_it(
    one_document, tmp_path, capsys, case
):
    name, damage, said = DAMAGE[case]
    data, db = _copy_database(one_document, tmp_path)
    damage(db / name)
    assert _retrieval(data) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"{db / name}" in err and said in err
    fix = f"attnlab data retrieval --data {data} --chunk-size 16 --neighbours 2 --continuation 16 --restart"
    assert fix in err
    # the advice works: that command rebuilds the database
    assert main([*fix.split()[1:], "--workers", "1"]) == 0
    capsys.readouterr()
    assert _retrieval(data) == 0


def test_live_retrieval_without_bm25s_names_the_extra(one_document, monkeypatch):
    """A database without a stored index (built before indexes were stored) is searched by
    BM25 built at decoding time, with bm25s: when it is not installed, the [retrieval] extra's
    install line, not a ModuleNotFoundError."""
    from attnlab.base.errors import UserError
    from attnlab.data import TokenData
    from attnlab.data.retrieval import live_retriever

    data = TokenData.open(one_document)
    monkeypatch.setitem(sys.modules, "bm25s", None)  # as if not installed
    with pytest.raises(UserError, match=r"pip install 'attnlab\[retrieval\]'.*") as e:
        live_retriever(data.train, 16, 2, 32, data.eos_id)
    assert "--no-retrieval" in str(e.value)


def test_generate_of_a_retrieval_run_reads_its_stored_index_without_bm25s(
    one_document, tmp_path, monkeypatch, capsys
):
    """``generate`` loads the database's stored index (no BM25 build, so no bm25s): the same
    tokens with bm25s importable or not."""
    from attnlab.train import train
    from tests.helpers.data import tiny_run_config

    cfg = tiny_run_config(
        one_document,
        "model.family=retrieval",
        "model.retrieval.chunk_size=16",
        steps=2,
        eval_every=2,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(cfg, tmp_path / "run")
    argv = ["generate", str(tmp_path / "run"), "--prompt", "the", "--max-new-tokens", "40"]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert re.search(r"\b[1-9]\d* retrievals took", first.err), first.err  # chunks completed
    monkeypatch.setitem(sys.modules, "bm25s", None)  # as if not installed
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert captured.out == first.out


# ----------------------------------------------------------------- advice names real flags
def _parsers() -> dict[tuple[str, ...], set[str]]:
    """Every (sub)command's flags, by its words: ("data", "retrieval") -> {"--data", ...}."""
    import argparse

    from attnlab.cli import build_parser

    table: dict[tuple[str, ...], set[str]] = {}

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        table[path] = {o for a in parser._actions for o in a.option_strings}
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, (*path, name))

    walk(build_parser(), ())
    return table


def _messages() -> list[tuple[str, int, str]]:
    """(file, line, text) of every string in attnlab's source, an f-string's fields as ``X``."""
    import ast

    import attnlab

    out = []
    for path in sorted(Path(attnlab.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            out.append((str(path.relative_to(Path(attnlab.__file__).parent)), node.lineno, text))
    return out


def _advised(text: str, table: dict[tuple[str, ...], set[str]]):
    """(command words, flag) of each ``attnlab CMD [SUB] ... --flag`` that ``text`` advises; the
    command line ends at a backtick, a comma, a semicolon, a closing parenthesis or the end."""
    import re

    for found in re.finditer(r"attnlab ((?:[a-z][\w-]* ?){1,2})([^`,;)]*)", text):
        words = tuple(found.group(1).split())
        while words and words not in table:
            words = words[:-1]
        if not words:
            continue
        for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", found.group(1) + found.group(2)):
            yield words, flag


def test_every_command_line_the_source_advises_uses_flags_that_command_has():
    """Advice like "rebuild with `attnlab data retrieval --data D ... --restart`" is checked
    against the real parsers: each flag must exist on the command it is given to."""
    table = _parsers()
    wrong = []
    seen = 0
    for file, line, text in _messages():
        for words, flag in _advised(text, table):
            seen += 1
            if flag not in table[words] and not any(
                flag in flags for path, flags in table.items() if path[: len(words)] == words
            ):
                wrong.append(f"{file}:{line}: `attnlab {' '.join(words)}` has no {flag}")
    assert seen > 20  # the walk finds the advice
    assert not wrong, "\n".join(wrong)


#: command lines of other programs in attnlab's help texts (their flags are not attnlab's)
OTHER_TOOLS = r"(?:lm_eval|pip|python|torchrun|tensorboard|git|apt-get) (?:\\\n|[^`\n;])*"


def test_a_command_module_advises_only_its_own_flags():
    """The messages written in ``attnlab/commands/CMD.py`` reach only CMD's users: every bare
    ``--flag`` there (one not inside an ``attnlab OTHER ...`` command line) is one of CMD's."""
    import re

    table = _parsers()
    wrong = []
    for file, line, text in _messages():
        if not file.startswith("commands/") or file.startswith("commands/_"):
            continue
        cmd = Path(file).stem
        mine = set().union(*(f for p, f in table.items() if p[:1] == (cmd,)))
        bare = re.sub(r"attnlab [a-z][^`,;)]*", "", text)  # other commands' lines: above
        bare = re.sub(OTHER_TOOLS, "", bare)
        for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", bare):
            if flag not in mine and not text.lstrip().startswith(flag):  # its own declaration
                wrong.append(f"{file}:{line}: `attnlab {cmd}` has no {flag}: {text[:80]!r}")
    assert not wrong, "\n".join(wrong)


def test_data_retrieval_that_cannot_write_names_the_data_directory_not_out(
    one_document, tmp_path, capsys
):
    """`data retrieval` has no --out: the database goes inside the data directory."""
    data = tmp_path / "data"
    shutil.copytree(one_document, data, ignore=shutil.ignore_patterns("retrieval"))
    (data / "retrieval").write_text("a file where the databases go\n")
    assert _retrieval(data) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--out" not in err
    assert f"make {data} writable" in err


def test_train_preparing_its_data_names_data_dir_not_its_own_out(tmp_path, monkeypatch, capsys):
    """`train` prepares a missing default data directory itself; its --out is the run's, so
    a problem with the data directory names data.dir."""
    from attnlab.data import default_data_dir

    monkeypatch.chdir(tmp_path)
    word_corpus(tmp_path / "c.jsonl", WORDS, n_docs=20, length=40, seed=0)
    target = default_data_dir("c.jsonl", "bytes")
    target.parent.mkdir(parents=True)
    target.write_text("not a directory\n")
    argv = ["train", "tiny", "--out", "run", "--skip-check", "--set", "data.corpus=c.jsonl"]
    argv += ["--set", "data.tokenizer=bytes", "--set", "train.max_steps=1"]
    assert main([*argv, "--set", "train.warmup_steps=0"]) == 2
    err = capsys.readouterr().err
    assert "error: data.dir " in err and f"{target} is a file" in err and "--out" not in err


@pytest.fixture(scope="module")
def tiny_run(data_dir, tmp_path_factory) -> Path:
    """A 2-step run of ``tiny`` (checkpoints at steps 2)."""
    from attnlab.train import train
    from tests.helpers.data import tiny_run_config

    out = tmp_path_factory.mktemp("tiny-run") / "run"
    train(tiny_run_config(data_dir, steps=2, eval_every=2), out)
    return out


def test_a_run_whose_checkpoints_are_all_damaged_is_retrained_with_train_not_generate(
    tiny_run, tmp_path, capsys
):
    """`generate` has no --restart: the advice names `attnlab train ... --restart`."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    for f in (run / "checkpoints").rglob("*"):
        if f.is_file() and f.suffix in (".safetensors", ".pt", ".json"):
            f.write_bytes(b"damaged")
    assert main(["generate", str(run), "--prompt", "the", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "is intact" in err
    assert "`attnlab train CONFIG --out RUN_DIR --restart`" in err
    assert "rerun with --restart" not in err


def test_the_engine_advises_each_command_its_own_way_to_start_over():
    """train and probe have --restart; compare restarts a run by deleting its directory."""
    from attnlab.base.advice import restart
    from attnlab.cli import build_parser

    parser = build_parser()
    said = {}
    for cmd, argv in {
        "train": ["train", "tiny", "--out", "x"],
        "compare": ["compare", "e.toml", "--out", "x"],
        "eval": ["eval", "x"],
    }.items():
        from attnlab.base.advice import restart_as

        with restart_as(parser.parse_args(argv)._restart):
            said[cmd] = restart()
    assert "--restart" in said["train"] and "attnlab train" not in said["train"]
    assert "--restart" not in said["compare"] and "attnlab compare" in said["compare"]
    assert "attnlab train" in said["eval"]
    assert "--restart" in _parsers()[("train",)] and "--restart" not in _parsers()[("compare",)]


# ---------------------------------------------- "does not exist" only when nothing is there
def _not_files(tmp: Path) -> dict[str, tuple[list[str], str]]:
    corpus = word_corpus(tmp / "c.jsonl", WORDS, n_docs=4, length=20, seed=0)
    (tmp / "dir.toml").mkdir()
    (tmp / "broken.toml").symlink_to(tmp / "gone.toml")
    prep = ["data", "prepare", "--out", str(tmp / "p")]
    return {
        "config-a-device": (["train", "/dev/null", "--out", str(tmp / "r")], "a character device"),
        "config-a-broken-link": (
            ["train", str(tmp / "broken.toml"), "--out", str(tmp / "r")],
            "a broken symbolic link",
        ),
        "experiment-a-directory": (
            ["compare", str(tmp / "dir.toml"), "--out", str(tmp / "o")],
            "is a directory, not a file",
        ),
        "corpus-a-device": ([*prep, "--corpus", "/dev/null"], "a character device"),
        "tokenizer-a-device": (
            [*prep, "--corpus", str(corpus), "--tokenizer", "/dev/null"],
            "a character device",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "config-a-device",
        "config-a-broken-link",
        "experiment-a-directory",
        "corpus-a-device",
        "tokenizer-a-device",
    ],
)
def test_a_path_that_is_there_but_not_a_file_is_named_for_what_it_is(tmp_path, capsys, case):
    argv, said = _not_files(tmp_path)[case]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and "does not exist" not in err and "Traceback" not in err


# ------------------------------------------------------------------------- the inspect page
#: run directory names (no "/": a path component) that are markup in some HTML context
HOSTILE_NAMES = ["<!--", "<!--<script>", "<script>x<", "a&amp;b\u2028c", "]]>--><img src=x>"]


def _page_json(page: Path):
    import re

    text = page.read_text(encoding="utf-8")
    payload = re.search(r"<script id='data' type='application/json'>(.*?)</script>", text, re.S)
    return text, payload.group(1)


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_hostile_run_name_is_data_in_the_page_not_markup(tiny_run, tmp_path, capsys, name):
    """The page's JSON holds no <, > or &: nothing in it is read as markup by the HTML
    parser, and JSON gives the name back unchanged."""
    run = tmp_path / name
    shutil.copytree(tiny_run, run)
    page = tmp_path / "page.html"
    assert main(["inspect", str(run), "--prompt", "the model", "--out", str(page)]) == 0
    capsys.readouterr()
    text, payload = _page_json(page)
    assert not set("<>&") & set(payload) and "\u2028" not in payload
    data = json.loads(payload)
    assert data["captures"][0]["name"] == name and name in data["title"]
    assert text.count("</script>") == 2  # the data's and the page script's


def test_a_hostile_run_name_renders_in_chromium(tiny_run, tmp_path, capsys):
    """In a browser: every hostile name's page draws all its panels, and shows the name."""
    import html
    import re

    from tests.helpers.browser import run_browser

    for i, name in enumerate(HOSTILE_NAMES):
        run = tmp_path / f"{i}" / name
        shutil.copytree(tiny_run, run)
        page = tmp_path / f"{i}.html"
        assert main(["inspect", str(run), "--prompt", "the model", "--out", str(page)]) == 0
        capsys.readouterr()
        dom, console = run_browser(page, "--dump-dom")
        assert console == [], name
        assert 'data-rendered="yes"' in dom, name
        assert int(re.search(r'data-panels="(\d+)"', dom).group(1)) > 2, name
        h1 = html.unescape(re.search(r"<h1>(.*?)</h1>", dom, re.S).group(1))
        assert h1 == f"attnlab inspect: {name}", name


def _nan_capture():
    import torch

    from attnlab.config import load_config
    from attnlab.inspection import capture
    from attnlab.model.transformer import build_model

    torch.manual_seed(0)
    model = build_model(load_config("tiny").model)
    with torch.no_grad():  # one query weight of the last layer: its maps and the loss
        dict(model.named_parameters())["decoder.blocks.1.attention.query.w_q.weight"][0, 0] = float(
            "nan"
        )
    ids = list(b"a NaN weight in one layer")
    decode = lambda t: bytes(t).decode("utf-8", "replace")  # noqa: E731
    return capture(model, ids, decode, name="nan", target="nan")


def test_a_nan_model_writes_a_page_that_shows_its_nans(tmp_path):
    """JSON has no NaN: the values are written as strings the page reads back, a note counts
    them, and nothing is turned into a harmless-looking 0."""
    from attnlab.inspection import write_page

    c = _nan_capture()
    assert any(x is not None and np.isnan(x) for x in c.loss)  # the premise
    page = write_page(tmp_path / "nan.html", [c])
    _, payload = _page_json(page)
    data = json.loads(payload)
    loss = data["captures"][0]["loss"]
    assert "NaN" in loss
    maps = [
        v for lv in data["captures"][0]["layers"] for m in lv["maps"].values() for v in m["data"]
    ]
    assert "NaN" in maps
    assert any("NaN or infinite" in n for n in data["notes"])


def test_a_nan_model_page_renders_in_chromium(tmp_path):
    import re

    from attnlab.inspection import write_page
    from tests.helpers.browser import run_browser

    page = write_page(tmp_path / "nan.html", [_nan_capture()])
    dom, console = run_browser(page, "--dump-dom")
    assert console == [] and 'data-rendered="yes"' in dom
    assert int(re.search(r'data-panels="(\d+)"', dom).group(1)) > 2
    assert "mean loss NaN" in dom and "NaN or infinite" in dom


def test_inspect_cuts_a_prompt_only_where_the_position_part_has_a_limit(data_dir, tmp_path, capsys):
    """RoPE places any length: a prompt past max_seq_len is read whole; learned positions
    (a table of max_seq_len rows) cut it to the last max_seq_len tokens, with a note."""
    from attnlab.train import train
    from tests.helpers.data import tiny_run_config

    prompt = "the model learns " * 12  # 204 bytes > max_seq_len = 128
    pages = {}
    for kind in ("rope", "learned"):
        cfg = tiny_run_config(data_dir, f"model.position.kind={kind}", steps=2, eval_every=2)
        assert cfg.model.max_seq_len < len(prompt)
        train(cfg, tmp_path / kind)
        out = tmp_path / f"{kind}.html"
        assert main(["inspect", str(tmp_path / kind), "--prompt", prompt, "--out", str(out)]) == 0
        notes = " ".join(json.loads(_page_json(out)[1])["notes"])
        pages[kind] = (capsys.readouterr().out, notes)
    assert f"{len(prompt)} tokens" in pages["rope"][0] and "exceed" not in pages["rope"][1]
    assert f"{cfg.model.max_seq_len} tokens" in pages["learned"][0]
    assert f"the prompt's {len(prompt)} tokens exceed" in pages["learned"][1]


# ------------------------------------------------------------------------------ --init-from
def test_init_from_weights_of_another_shape_than_config_json_names_each_tensor(
    data_dir, tmp_path, capsys
):
    """A folder whose config.json was edited (64 -> 128 positions) after its weights were
    saved: transformers raised a RuntimeError pointing at a logged report; the error names the
    tensor, both shapes and the fix, and the run trains nothing."""
    from tests.helpers.data import run_config
    from tests.helpers.eval_doubles import tiny_hf_model

    folder = tmp_path / "gpt2"
    tiny_hf_model("gpt2", max_length=64).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["n_positions"] = 128
    (folder / "config.json").write_text(json.dumps(config))
    cfg = run_config(
        tmp_path / "run.toml", data_dir.parent / "corpus.jsonl", data_dir, max_steps=1,
        warmup_steps=0, threads=1,
    )  # fmt: skip
    argv = ["train", str(cfg), "--out", str(tmp_path / "run"), "--init-from", str(folder)]
    assert main([*argv, "--quiet", "--skip-check"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "RuntimeError" not in err
    assert (
        "transformer.wpe.weight: the weights hold [64, 32], config.json makes it [128, 32]" in err
    )
    assert "restore the config.json saved with these weights" in err
    assert not list((tmp_path / "run").rglob("*.safetensors"))


# ------------------------------------------------------- names with "[...]" on a terminal
def test_data_info_shows_a_directory_named_like_terminal_markup(one_document, tmp_path, capsys):
    data = tmp_path / "[ratio=0.25]"
    shutil.copytree(one_document, data)
    assert main(["data", "info", str(data)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == str(data)


def test_compare_progress_prints_names_and_reasons_as_text():
    import io

    from attnlab.experiments.running.progress import ExperimentProgress

    out = io.StringIO()
    progress = ExperimentProgress(1, {"v[ratio=0.25]": 1.0}, rich=True, stream=out)
    progress.begin([("v[ratio=0.25]", 0, 5)])
    progress.start_run("v[ratio=0.25]", 0, 5)
    progress.note("a note about runs/[bold]x/[ratio=0.25]")
    progress.finish()
    text = out.getvalue()
    assert "v[ratio=0.25] seed0" in text
    assert "runs/[bold]x/[ratio=0.25]" in text
