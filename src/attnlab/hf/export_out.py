"""Where an export may go, and how it replaces an earlier one without losing a byte.

- :func:`check_out`: ``--out`` may not be, contain or lie inside the exported run or any attnlab
  directory; an existing non-empty ``--out`` is replaced (``--force``) only when it is an earlier
  export of attnlab's (its marker honoured, :func:`attnlab.base.owned.unbound`) that holds
  nothing but the files that export wrote, each as it was written: the marker records their
  SHA-256, so a card (``README.md``) the user edited is theirs now and is refused by name, never
  dropped (an earlier attnlab recorded names only: a file changed after its marker counts as
  edited).
- :func:`put_in_place`: the new folder, written whole under a hidden sibling name, is marked
  (every file's SHA-256) and swapped in atomically (:mod:`attnlab.base.swap`): a kill at any
  moment leaves the old export or the new one at ``--out``.
- :func:`recover_out`: before the next export to the same ``--out``, what a killed export left
  (a hidden folder) is restored or removed, with a one-line :class:`ExportWarning` each.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

from attnlab.base.errors import UserError

EXPORT_KIND = "export"
#: the temporary folder name of the attnlab versions before :mod:`attnlab.base.swap`
LEGACY_TEMP = "export"


class ExportWarning(UserWarning):
    """Something a killed export left behind was restored or removed (the message says what)."""


def looks_exported(folder: Path) -> bool:
    """The files every attnlab export holds: config.json (model_type attnlab), the weights and
    the modeling code (evidence for a marker of an earlier attnlab, which records no hashes)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(config, dict)
        and config.get("model_type") == "attnlab"
        and (folder / "model.safetensors").is_file()
        and (folder / "modeling_attnlab.py").is_file()
    )


def _complete(folder: Path) -> bool:
    """A finished export: its marker is written last."""
    from attnlab.base.owned import kind_of

    return kind_of(folder) == EXPORT_KIND and looks_exported(folder)


def recover_out(out: Path) -> None:
    """Restore or remove what a killed export to ``out`` left (see the module doc)."""
    from attnlab.base.swap import recover

    for sentence in recover(Path(os.path.abspath(out)), _complete, legacy=LEGACY_TEMP):
        warnings.warn(sentence, ExportWarning, stacklevel=2)


def put_in_place(tmp: Path, out: Path) -> None:
    """Mark the complete folder ``tmp`` (every file and its SHA-256) and swap it in at ``out``."""
    from attnlab.base.owned import MARKER, file_hashes, mark
    from attnlab.base.swap import replace_dir

    written = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
    hashes = file_hashes(tmp, [f for f in written if f != MARKER])
    mark(tmp, EXPORT_KIND, files=hashes, at=out)
    replace_dir(tmp, out)


def _source_run(source: str | Path) -> Path:
    path = Path(source)
    if (path / "model.safetensors").is_file() and path.parent.name == "checkpoints":
        return path.parent.parent
    return path


def _check_place(source: str | Path, out: Path) -> None:
    """``out`` is not the run, inside it, or inside any attnlab directory."""
    from attnlab.base.owned import enclosing_owned, overlaps
    from attnlab.runs.load import is_run_dir

    run = _source_run(source)
    how = overlaps(out, run) if run.exists() else None
    if how is not None:
        raise UserError(
            f"--out {out} {how} the run being exported ({run}); the export would replace it. "
            "Give --out a new directory outside the run"
        )
    resolved = Path(os.path.abspath(out))
    home = enclosing_owned(resolved.parent, ("run", "experiment", "probe"))
    if home is None:
        home = next((d for d in resolved.parents if is_run_dir(d)), None)
    if home is not None:
        raise UserError(
            f"--out {out} lies inside the attnlab directory {home}; an export there would mix "
            "with its files. Give --out a directory outside it"
        )


def _written(out: Path, marker: dict) -> tuple[set[str], list[str]]:
    """(the files the earlier export wrote, those of them changed since it wrote them)."""
    from attnlab.base.owned import MARKER, edited, recorded_files

    hashes = recorded_files(marker)
    if hashes:
        return set(hashes), [f for f in sorted(hashes) if edited(out, f)]
    names = {f for f in marker.get("files") or [] if isinstance(f, str)}
    since = (out / MARKER).stat().st_mtime_ns  # an earlier attnlab wrote its marker last
    changed = []
    for f in sorted(names):
        p = out / f
        if p.is_symlink() or (p.exists() and (not p.is_file() or p.stat().st_mtime_ns > since)):
            changed.append(f)
    return names, changed


def check_out(source: str | Path, out: str | Path, *, force: bool = False) -> None:
    """Refuse an ``--out`` that would replace anything but an earlier export of attnlab's, as it
    wrote it (see the module doc)."""
    from attnlab.base.owned import ALWAYS_OURS, MARKER, kind_of, read_marker, shown, unbound

    out = Path(out)
    _check_place(source, out)
    if out.is_symlink():
        raise UserError(f"--out {out} is a link; give the real directory (or a new one)")
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory")
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return
    marker = read_marker(out)
    why = unbound(out, marker, looks_exported) if marker else "is missing"
    if kind_of(out) != EXPORT_KIND or why is not None:
        mine = f" (its {MARKER} {why})" if kind_of(out) == EXPORT_KIND else ""
        raise UserError(
            f"--out {out} is not empty and is not an export of attnlab's{mine}: it holds "
            f"{shown(entries)}. attnlab never replaces a folder it did not write; give another "
            "--out (a new or empty directory)"
        )
    written, changed = _written(out, marker)
    extra = [
        str(p.relative_to(out))
        for p in sorted(out.rglob("*"))
        if not p.is_dir() and str(p.relative_to(out)) not in written and p.name not in ALWAYS_OURS
    ]
    if extra:
        raise UserError(
            f"--out {out} is an earlier export, but it also holds files the export did not "
            f"write: {shown(extra)}; attnlab will not delete them. Move them out, or give another "
            "--out"
        )
    if changed:
        raise UserError(
            f"--out {out} is an earlier export, but {shown(changed)} changed since attnlab wrote "
            f"{'it' if len(changed) == 1 else 'them'}: your edits are yours, and attnlab will not "
            "replace them. Move the file(s) out of the folder (or give another --out), then rerun"
        )
    if not force:
        raise UserError(
            f"--out {out} holds an earlier export; pass --force to replace it, or give another "
            "--out"
        )
