"""``attnlab inspect``: look inside one or two models on one prompt (one self-contained HTML page).

Targets are whatever ``attnlab eval`` loads (:mod:`attnlab.eval.targets`): a run directory, a
checkpoint, a probe directory (the injected parts on a frozen pretrained base), an exported
Hugging Face folder or ``hf:DIR``. :func:`inspect_targets` captures each
(:mod:`attnlab.inspection.capture`) and writes the page (:mod:`attnlab.inspection.page`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from attnlab.base.errors import UserError
from attnlab.inspection.capture import Capture, LayerView, PartView, capture
from attnlab.inspection.page import page_data, render, write_page


def load_target(target: str, *, trust_remote_code: bool = False):
    """(language model, family, mask name) of an ``attnlab eval`` target, on the CPU;
    ``trust_remote_code``: consent to run code the model folder carries
    (:mod:`attnlab.base.consent`)."""
    import attnlab.probe
    import attnlab.quant.target  # noqa: F401  (registers quantized directories as targets)
    from attnlab.eval.targets import load_language_model

    lm = load_language_model(target, device="cpu", trust_remote_code=trust_remote_code)
    cfg = getattr(lm, "config", None)
    model_cfg = getattr(cfg, "model", None)
    if model_cfg is None:  # an export: its config.json carries the attnlab model config
        model_cfg = getattr(getattr(lm.model, "config", None), "attnlab_model", None)
    from attnlab.parts import families

    family = getattr(model_cfg, "family", families.DEFAULT)
    table = getattr(model_cfg, "mask", None)
    mask = getattr(table, "kind", "") if table is not None else ""
    return lm, family, mask


def prompt_ids(
    lm,
    *,
    prompt: str | None = None,
    data_dir: str | Path | None = None,
    index: int = 0,
    length: int = 64,
) -> list[int]:
    """The prompt's token ids: ``prompt`` encoded, or the ``index``-th ``length``-token window
    of ``data_dir``'s validation split."""
    if (prompt is None) == (data_dir is None):
        raise UserError("give exactly one of --prompt TEXT or --data-dir DIR (with --index N)")
    if prompt is not None:
        ids = list(lm.encode(prompt))
        if not ids:
            raise UserError("--prompt encodes to no tokens; give some text")
        return ids
    from attnlab.data import TokenData

    data = TokenData.open(Path(data_dir))  # type: ignore[arg-type]
    n = len(data.val) // max(length, 1)
    if index < 0 or index >= n:
        raise UserError(
            f"--index {index} is outside {data_dir}'s validation split, which holds {n} windows "
            f"of --length {length} tokens; give 0..{max(n - 1, 0)}"
        )
    return [int(i) for i in data.val[index * length : (index + 1) * length]]


def inspect_targets(
    targets: Sequence[str],
    out: str | Path,
    *,
    prompt: str | None = None,
    data_dir: str | Path | None = None,
    index: int = 0,
    length: int = 64,
    max_tokens: int = 128,
    trust_remote_code: bool = False,
    force: bool = False,
) -> tuple[Path, list[Capture]]:
    """Capture every target on the same prompt and write the page to ``out``
    (``trust_remote_code``: see :func:`load_target`). ``out`` may replace only an earlier page of
    attnlab's, unchanged since, and only with ``force`` (:func:`attnlab.base.outfile.claim_out_file`:
    never a user's file, a device, a link, or a file inside an attnlab directory)."""
    from attnlab.base.outfile import claim_out_file

    if not 1 <= len(targets) <= 2:
        raise UserError("attnlab inspect takes one run, or two to compare")
    if max_tokens < 1:
        raise UserError("--max-tokens must be at least 1")
    claim_out_file(out, force=force, what="page")  # before anything is loaded
    caps, notes = [], []
    for i, target in enumerate(targets):
        lm, family, mask = load_target(target, trust_remote_code=trust_remote_code)
        ids = prompt_ids(lm, prompt=prompt, data_dir=data_dir, index=index, length=length)
        limit = lm.context_limit  # the position part's limit; None: it places any length
        if limit is not None and len(ids) > limit:
            notes.append(
                f"{target}: the prompt's {len(ids)} tokens exceed the model's context of {limit}; "
                f"it reads the last {limit}"
            )
            ids = ids[-limit:]
        name = Path(str(target).split(":", 1)[-1]).name or str(target)
        if len(targets) == 2 and name == Path(str(targets[1 - i]).split(":", 1)[-1]).name:
            name = f"{name} ({i + 1})"
        caps.append(
            capture(
                lm.model,
                ids,
                lm.decode,
                name=name,
                target=str(target),
                family=family,
                max_tokens=max_tokens,
                mask_name=mask,
            )
        )
    return write_stamped_page(out, caps, notes, force=force), caps


def write_stamped_page(
    out: str | Path, caps: list[Capture], notes: list[str], *, force: bool = False
) -> Path:
    """The page, with a closing comment that stamps it as attnlab's (its own SHA-256:
    :mod:`attnlab.base.outfile`), written atomically once ``out`` is claimed again (a file put
    there while the targets loaded is refused, not replaced)."""
    from attnlab.base.outfile import markdown_stamp, write_out_text

    text = render(page_data(caps, notes)) + markdown_stamp("attnlab inspect")
    return write_out_text(out, text, force=force, what="page")


__all__ = [
    "Capture",
    "LayerView",
    "PartView",
    "capture",
    "inspect_targets",
    "load_target",
    "page_data",
    "prompt_ids",
    "render",
    "write_page",
    "write_stamped_page",
]
