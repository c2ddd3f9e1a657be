"""A run's recorded plugins against the ones loaded now: which changed since the run was made
(their source, or a helper module's), for the warning on evaluation and the refusal of a resume."""

from __future__ import annotations

from attnlab.parts.identity import helper_changes
from attnlab.parts.plugins import PluginRecord, moved_here, record_of


def changed(records: list[dict]) -> list[str]:
    """Sentences for recorded plugins whose source (or a helper's) differs from what is loaded
    now."""
    out = []
    for rec in records:
        if (
            not isinstance(rec, dict)
            or not rec.get("sha256")
            or moved_here(str(rec.get("spec"))) is not None
        ):
            continue  # a moved plugin's sources were compared when it was replaced
        now = record_of(str(rec.get("spec")))
        if now is not None and now.sha256 != rec["sha256"]:
            out.append(
                f"plugin {rec['spec']} changed since the run was made (sha256 "
                f"{rec['sha256'][:12]} then, {now.sha256 and now.sha256[:12]} now"
                f"{_helper_detail(rec, now)}): its parts may not compute what was trained"
            )
    return out


def _helper_detail(rec: dict, now: PluginRecord) -> str:
    said = helper_changes(rec.get("helpers"), now.helpers)
    return f"; {'; '.join(said)}" if said else ""


def source_changes(records: list[dict]) -> list[tuple[str, str, str, str]]:
    """(spec, sha256 recorded, sha256 loaded now, what changed) of every recorded plugin whose
    source differs from the one loaded now (a moved plugin is compared with the file standing in
    for it); what changed names each helper module that differs (empty when the record has no
    helpers to compare, as records of earlier versions); plugins not loaded, or recorded without
    a sha256, are left out."""
    out = []
    for rec in records:
        if not isinstance(rec, dict) or not isinstance(rec.get("sha256"), str):
            continue
        spec = str(rec.get("spec"))
        now = moved_here(spec) or record_of(spec)
        if now is not None and now.sha256 != rec["sha256"]:
            said = helper_changes(rec.get("helpers"), now.helpers)
            out.append((spec, rec["sha256"], now.sha256 or "-", "; ".join(said)))
    return out
