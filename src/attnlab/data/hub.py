"""Hugging Face Hub datasets as a corpus (online only): ``hf:NAME[:CONFIG]``.

Aliases name the usual pretraining corpora; anything else is passed to
``datasets.load_dataset(NAME, CONFIG, split="train", streaming=True)``. Streaming means a
``--max-documents`` run downloads only what it reads. WikiText's line records are regrouped into
articles (a new article starts at a `` = Title = `` line), so the split stays by document.

Offline, a quick reachability check of the Hub endpoint fails in seconds with a ``UserError``
instead of ``datasets``' half-minute of retries; with ``HF_HUB_OFFLINE=1`` or
``HF_DATASETS_OFFLINE=1`` the local cache is used and no check is made.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from attnlab.base.errors import UserError
from attnlab.base.extras import require
from attnlab.data.corpus import Corpus, SourceOptions


@dataclass(frozen=True)
class HubDataset:
    path: str
    config: str | None
    license: str
    wikitext: bool = False


ALIASES: dict[str, HubDataset] = {
    "wikitext-103": HubDataset("Salesforce/wikitext", "wikitext-103-raw-v1", "CC BY-SA 3.0", True),
    "wikitext-2": HubDataset("Salesforce/wikitext", "wikitext-2-raw-v1", "CC BY-SA 3.0", True),
    "openwebtext": HubDataset("Skylion007/openwebtext", None, "CC0 1.0 (as released)"),
    "fineweb-edu": HubDataset("HuggingFaceFW/fineweb-edu", "sample-10BT", "ODC-By 1.0"),
}

_OFFLINE_HINT = (
    "offline, use --corpus wiki-sample or a local .txt/.jsonl/.parquet file; "
    "if the dataset is in your local cache, set HF_HUB_OFFLINE=1"
)


def _offline_mode() -> bool:
    return any(
        os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
        for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def hub_reachable(timeout: float = 3.0) -> bool:
    """Can a TCP connection to the Hub endpoint (``HF_ENDPOINT``) be opened?"""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout):
            return True
    except OSError:
        return False


def require_hub(what: str, hint: str = _OFFLINE_HINT) -> None:
    """UserError unless the Hub can be reached (or offline mode points at the local cache)."""
    if not _offline_mode() and not hub_reachable():
        raise UserError(
            f"cannot load {what}: the Hugging Face Hub is unreachable (no network); {hint}"
        )


def group_wikitext(lines: Iterable[str]) -> Iterator[str]:
    """WikiText line records -> one document per article (`` = Title = `` starts one)."""
    title = re.compile(r"^ = [^=].* = $")
    cur: list[str] = []
    for line in lines:
        if title.match(line.rstrip("\n")) and any(s.strip() for s in cur):
            yield "".join(cur).strip()
            cur = []
        cur.append(line)
    if any(s.strip() for s in cur):
        yield "".join(cur).strip()


class HubCorpus(Corpus):
    """A Hub dataset's ``train`` split, streamed."""

    def __init__(self, dataset: HubDataset, name: str, options: SourceOptions) -> None:
        self.dataset = dataset
        self.name = name
        self.options = options

    @classmethod
    def from_spec(cls, spec: str, options: SourceOptions) -> HubCorpus:
        rest = spec.removeprefix("hf:").strip()
        if not rest:
            raise UserError("hf: needs a dataset name, e.g. hf:wikitext-103 or hf:ORG/NAME:CONFIG")
        if rest in ALIASES:
            dataset = ALIASES[rest]
        else:
            path, _, config = rest.partition(":")
            dataset = HubDataset(path, config or None, "see the dataset card")
        slug = "hf-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", rest).strip("-")
        return cls(dataset, slug, options)

    def _load(self) -> Any:
        ref = self.dataset.path + (f" ({self.dataset.config})" if self.dataset.config else "")
        require("data", "datasets", what=f"the hf: corpus {ref}")
        require_hub(ref)
        import datasets

        try:
            return datasets.load_dataset(
                self.dataset.path, self.dataset.config, split="train", streaming=True
            )
        except Exception as e:  # datasets raises many types; all mean "could not load it"
            raise UserError(
                f"cannot load {ref} from the Hugging Face Hub ({type(e).__name__}: "
                f"{str(e)[:300]}); check the name and config, or {_OFFLINE_HINT}"
            ) from None

    def _rows(self) -> Iterator[dict[str, Any]]:
        ds = self._load()
        try:
            self._size_hint = int(ds.info.splits["train"].num_bytes) or None
        except (AttributeError, KeyError, TypeError, ValueError):
            self._size_hint = None
        it = iter(ds)
        while True:
            try:
                row = next(it)
            except StopIteration:
                return
            except Exception as e:  # a stream can fail mid-way (network, bad shard)
                raise UserError(
                    f"reading hf:{self.dataset.path} failed ({type(e).__name__}: {str(e)[:300]}); "
                    "retry, or use a local file"
                ) from None
            yield row

    def _texts(self, rows: Iterable[dict[str, Any]]) -> Iterator[str]:
        field = self.options.text_field
        for i, row in enumerate(rows):
            if field not in row:
                raise UserError(
                    f"hf:{self.dataset.path} row {i} has no {field!r} field "
                    f"(fields: {sorted(row)}); choose one with --text-field (data.text_field "
                    "in a run config)"
                )
            value = row[field]
            if isinstance(value, str):
                yield value

    def size_hint(self) -> int | None:
        """The train split's size from the dataset card, once the stream is open (else None)."""
        return getattr(self, "_size_hint", None)

    def documents(self) -> Iterator[str]:
        texts = self._texts(self._rows())
        yield from group_wikitext(texts) if self.dataset.wikitext else texts

    def attribution(self) -> dict[str, Any]:
        return {
            "source": f"https://huggingface.co/datasets/{self.dataset.path}",
            "config": self.dataset.config,
            "split": "train",
            "license": self.dataset.license,
        }
