"""The model card (``README.md``) of an exported folder: what the model is, the run's config, its
data, its training outcome and its evaluation results, and how to load it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnlab.config import Config, dump_toml


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1e4 else f"{v:.4g}"
    return "" if v is None else str(v)


def _slots(cfg: Config) -> list[str]:
    rows = []
    for slot, opts in cfg.model.slots().items():
        extra = {k: v for k, v in opts.model_dump(mode="json").items() if k != "kind"}
        rows.append(f"| {slot} | {opts.kind} | {json.dumps(extra) if extra else ''} |")
    return rows


def _results(results: dict[str, Any]) -> list[str]:
    rows = ["| task | metric | value |", "| --- | --- | ---: |"]
    for task, entry in results.items():
        metrics = entry.get("metrics", entry) if isinstance(entry, dict) else {}
        for name, value in metrics.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                rows.append(f"| {task} | {name} | {_fmt(value)} |")
    return rows if len(rows) > 2 else []


def model_card(
    *,
    cfg: Config,
    source: str,
    step: int | None,
    status: dict[str, Any] | None,
    data_meta: dict[str, Any] | None,
    results: dict[str, Any] | None,
    params: dict[str, Any],
    tokenizer: dict[str, Any],
    plugins: list[dict[str, Any]],
    name: str,
) -> str:
    """The card's Markdown, with a YAML header transformers' Hub reads."""
    m = cfg.model
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags: [attnlab, custom_code]",
        "---",
        "",
        f"# {name}",
        "",
        f"An attnlab decoder exported from `{source}`"
        + (f" at step {step}" if step is not None else "")
        + f": {m.n_layers} layer(s)"
        + (f" looped {m.loops} times" if m.loops > 1 else "")
        + f", d_model {m.d_model}, {m.attention.n_heads} heads ({m.n_kv_heads} K/V), "
        f"context {m.max_seq_len}, vocabulary {m.vocab_size}; "
        f"{params['total']:,} parameters ({params['non_embedding']:,} non-embedding).",
        "",
        "## Load it",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'model = AutoModelForCausalLM.from_pretrained("PATH", trust_remote_code=True)',
        'tokenizer = AutoTokenizer.from_pretrained("PATH")',
        "```",
        "",
        "The folder carries its own code: `modeling_attnlab.py` and `configuration_attnlab.py` "
        "with attnlab's model sources they import (`attnlab_*.py`, copied, imports made "
        "relative). It needs torch and transformers (pydantic, which attnlab's configs use, "
        "comes with transformers). With attnlab installed, `import attnlab.hf` registers the "
        "classes and `trust_remote_code` is not needed.",
        "",
        "## Block",
        "",
        "| slot | part | options |",
        "| --- | --- | --- |",
        *_slots(cfg),
        "",
    ]
    if plugins:
        lines += ["Plugin parts (their source is in this folder, `plugins/` and flattened):", ""]
        lines += [
            f"- `{p['spec']}` (sha256 {p['sha256'][:16] if p.get('sha256') else '?'}): "
            + ", ".join(f"{s}.{k}" for s, k, _ in p["parts"])
            for p in plugins
        ]
        lines.append("")
    if cfg.model.family == "retrieval":
        r = cfg.model.retrieval
        lines += [
            "## Retrieval (not in this folder)",
            "",
            f"A RETRO-style decoder: chunked cross-attention after decoder layers "
            f"{r.layers(cfg.model.n_layers)} reads, for every chunk of {r.chunk_size} tokens, "
            f"{r.neighbours} neighbours of {r.neighbour_len} tokens (a retrieved chunk and its "
            f"continuation) through a {r.encoder_layers}-layer encoder. The retrieval database "
            "is not exported: pass `neighbours=` (token ids [batch, chunks, "
            f"{r.neighbours}, {r.neighbour_len}]) to `forward`, chunk j's neighbours retrieved "
            "with chunk j's tokens (attnlab builds them with `attnlab data retrieval`: BM25 "
            "over the training split's chunks). Without `neighbours` (and so in `generate()` "
            "and pipelines) the model runs as its decoder without retrieval.",
            "",
        ]
    lines += ["## Data", ""]
    d = cfg.data
    lines.append(f"- corpus `{d.corpus}`, tokenizer `{d.tokenizer}`, sequence length {d.seq_len}")
    if data_meta:
        counts = {k: v for k, v in (data_meta.get("splits") or {}).items()}
        for split, info in counts.items():
            if isinstance(info, dict) and "tokens" in info:
                lines.append(f"- {split}: {info['tokens']:,} tokens")
        if data_meta.get("attribution"):
            lines.append(f"- attribution: {data_meta['attribution']}")
    lines.append(
        f"- tokenizer files: {tokenizer['class']} (vocab {tokenizer['vocab_size']:,}, "
        f"end-of-text `{tokenizer['eos_token']}` = {tokenizer['eos_token_id']})"
    )
    lines += ["", "## Training", ""]
    if status:
        for key in ("status", "step", "max_steps", "tokens", "final_val_loss", "best_val_loss"):
            if status.get(key) is not None:
                lines.append(f"- {key}: {_fmt(status[key])}")
    else:
        lines.append("- no status.json in the run directory")
    table = _results(results or {})
    if table:
        lines += ["", "## Evaluation (attnlab eval)", "", *table]
    lines += ["", "## The run's config", "", "```toml", dump_toml(cfg).strip(), "```", ""]
    return "\n".join(lines)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
