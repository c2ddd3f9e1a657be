"""``open_corpus``: from a ``--corpus`` string to a :class:`~attnlab.data.corpus.Corpus`.

``open_corpus`` resolves, in order:

1. a registered name (``wiki-sample``, ``dict-gcide``, ``wordnet``, ``bible-kjv``, ``python-doc``);
2. ``hf:NAME[:CONFIG]``, a Hugging Face dataset (online only);
3. an existing local file or directory (``.txt``, ``.jsonl``, ``.parquet``, optionally ``.gz``);
4. a glob pattern (``data/*.jsonl``, ``books/**/*.txt``).

Anything else is a :class:`~attnlab.base.errors.UserError` naming the nearest registered source.
The lookup sits beside the interface (:mod:`attnlab.data.corpus`), not in it: the members import
the interface and register their names there; this module imports them on first use.
"""

from __future__ import annotations

import difflib
import glob
from pathlib import Path

from attnlab.base.errors import UserError
from attnlab.base.pathkind import not_a_file
from attnlab.data.corpus import REGISTRY, Corpus, SourceOptions


def registered_corpora() -> dict[str, str]:
    """Registered source names and their one-line descriptions."""
    _load_builtin_sources()
    return {k: v.description for k, v in sorted(REGISTRY.items())}


def _load_builtin_sources() -> None:
    # Imported for their @register_corpus side effect.
    from attnlab.data import debian, wiki  # noqa: F401


def _has_glob(spec: str) -> bool:
    return any(c in spec for c in "*?[")


def open_corpus(
    spec: str, *, text_field: str = "text", replace_invalid_utf8: bool = False
) -> Corpus:
    """Resolve a ``--corpus`` string (see the module docstring) into a :class:`Corpus`."""
    _load_builtin_sources()
    options = SourceOptions(text_field=text_field, replace_invalid_utf8=replace_invalid_utf8)
    spec = spec.strip()
    if not spec:
        raise UserError("empty corpus name: use wiki-sample, hf:NAME, or a local file/dir/glob")
    if spec in REGISTRY:
        return REGISTRY[spec].factory(options)
    if spec.startswith("hf:"):
        from attnlab.data.hub import HubCorpus

        return HubCorpus.from_spec(spec, options)

    from attnlab.data.local import LocalFiles

    path = Path(spec).expanduser()
    if path.exists():
        return LocalFiles.from_path(path, options)
    if _has_glob(spec):
        matches = sorted(glob.glob(str(path), recursive=True))
        if not matches:
            raise UserError(f"corpus glob {spec!r} matched no files; check the pattern")
        return LocalFiles.from_glob(spec, [Path(m) for m in matches], options)
    if "/" in spec or "\\" in spec or path.suffix:
        raise UserError(f"corpus path {spec!r} {not_a_file(path)}")
    near = difflib.get_close_matches(spec, list(REGISTRY), n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise UserError(
        f"unknown corpus {spec!r}: {hint}known sources are {', '.join(sorted(REGISTRY))}; "
        "or give hf:NAME[:CONFIG], a local .txt/.jsonl/.parquet file, a directory or a glob"
    )
