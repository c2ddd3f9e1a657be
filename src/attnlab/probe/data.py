"""The probe's tokens: the corpus tokenized with the BASE model's own tokenizer.

``attnlab.data.prepare`` takes a tokenizer by name or path. A local model directory and a hub id
(``hf:ID``, online) are passed as they are; a GGUF file's tokenizer exists only inside the GGUF,
so it is written once with ``save_pretrained`` to ``<data root>/tokenizers/<base>/`` and that
directory is passed. Every method of an experiment then reads one data directory and one stored
batch schedule (:func:`attnlab.data.get_schedule`), so all of them see identical batches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.base.errors import UserError
from attnlab.data import TokenData, default_data_dir, get_schedule, prepare, read_meta
from attnlab.data.schedule import Schedule
from attnlab.probe.base import BaseSource
from attnlab.probe.config import ProbeConfig

_CHECK_TEXT = "The probe checks that a data directory was tokenized like this: 1234, naïve café."


def tokenizer_spec(source: BaseSource, tokenizer: Any, root: Path) -> str:
    """What to pass to ``prepare`` as the tokenizer of ``source``."""
    if source.kind == "local":
        return source.location
    if source.kind == "hub":
        return f"hf:{source.location}"
    out = root / "tokenizers" / source.slug()
    if not (out / "tokenizer_config.json").is_file():
        tokenizer.save_pretrained(str(out))
    return str(out)


def data_dir_for(cfg: ProbeConfig, source: BaseSource, root: str | Path = "data") -> Path:
    if cfg.data.dir:
        return Path(cfg.data.dir)
    return default_data_dir(cfg.data.corpus, source.slug(), root)


def _same_tokens(data: TokenData, tokenizer: Any) -> bool:
    theirs = list(data.tokenizer.encode(_CHECK_TEXT))
    ours = list(tokenizer.encode(_CHECK_TEXT, add_special_tokens=False))
    return theirs == ours


def probe_data(
    cfg: ProbeConfig, source: BaseSource, tokenizer: Any, root: str | Path = "data"
) -> TokenData:
    """Open (preparing it on first use) the data directory of ``cfg`` in the base's tokens."""
    directory = data_dir_for(cfg, source, root)
    if not (directory / "meta.json").exists():
        prepare(
            cfg.data.corpus,
            tokenizer_spec(source, tokenizer, Path(root)),
            directory,
            val_fraction=cfg.data.val_fraction,
            replace_invalid_utf8=cfg.data.replace_invalid_utf8,
            max_documents=cfg.data.max_documents,
        )
    meta = read_meta(directory)
    if meta.get("corpus_spec") != cfg.data.corpus:
        raise UserError(
            f"{directory} holds corpus {meta.get('corpus_spec')!r}, not data.corpus="
            f"{cfg.data.corpus!r}; set data.dir to another directory"
        )
    data = TokenData.open(directory)
    if not _same_tokens(data, tokenizer):
        raise UserError(
            f"{directory} was tokenized with {meta['tokenizer'].get('name')!r}, which does not "
            f"encode text like the base {source.label!r}; set data.dir to a new directory"
        )
    return data


def train_schedule(cfg: ProbeConfig, data: TokenData) -> Schedule:
    """The stored schedule: ``train.max_steps`` rows of one step's sequence offsets (the
    micro-batches of the step, ``train.plan.sequences`` sequences)."""
    t = cfg.train
    return get_schedule(data.directory, "train", t.seq_len, t.plan.sequences, t.max_steps, t.seed)
