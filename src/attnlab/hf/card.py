"""The model card (``README.md``) of an exported folder: what the model is, the run's config, its
data, its training outcome and its evaluation results, and how to load it.

The YAML header carries what the Hugging Face Hub reads: ``license`` and ``datasets`` from the
corpus's own metadata (``meta.json``'s ``attribution``), and a ``model-index`` with the run's
``attnlab eval`` results (``eval/results.json``). The data attribution in full (e.g. every article title) goes to
``data_attribution.json`` beside the card (:func:`attribution_file`). Stored counts (``n``,
``tokens``, ...) and standard errors are not model-index metrics; the table shows them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from attnlab.config import Config, dump_toml

#: the file beside the card holding the corpus's attribution in full
ATTRIBUTION_FILE = "data_attribution.json"

#: license text of a corpus's metadata (a prefix, lower case) -> the Hub's license id
HUB_LICENSES = {
    "cc by-sa 3.0": "cc-by-sa-3.0",
    "cc by-sa 4.0": "cc-by-sa-4.0",
    "cc by 4.0": "cc-by-4.0",
    "cc0 1.0": "cc0-1.0",
    "odc-by": "odc-by",
    "public domain": "other",
}


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


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def result_entries(results: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The task entries of an ``eval/results.json`` (``{"tasks": {KEY: ENTRY}}``); a file in
    another shape gives none rather than garbage."""
    tasks = (results or {}).get("tasks")
    if not isinstance(tasks, dict):
        return {}
    return {k: v for k, v in tasks.items() if isinstance(v, dict)}


#: metrics that are counts, not scores: in the table's ``items`` column or left out
COUNTS = frozenset({"n", "tokens", "bytes", "words", "target_tokens"})


def _metrics(entry: dict[str, Any]) -> dict[str, Any]:
    metrics = entry.get("metrics")
    return metrics if isinstance(metrics, dict) else {}


def _results(entries: dict[str, dict[str, Any]]) -> list[str]:
    rows = [
        "| task | file | items | metric | value | ± stderr |",
        "| --- | --- | ---: | --- | ---: | ---: |",
    ]
    for task, entry in entries.items():
        metrics = _metrics(entry)
        n = metrics.get("n", "")
        source = Path(str(entry.get("source", ""))).name
        for name, value in metrics.items():
            if _is_number(value) and name not in COUNTS and not name.endswith("_stderr"):
                se = metrics.get(f"{name}_stderr")
                se_text = _fmt(se) if _is_number(se) else ""
                rows.append(f"| {task} | {source} | {n} | {name} | {_fmt(value)} | {se_text} |")
    return rows if len(rows) > 2 else []


def eval_results(entries: dict[str, dict[str, Any]]) -> list[Any]:
    """The run's results as ``huggingface_hub.EvalResult`` (one per task and metric; standard
    errors and counts left out), from which ``ModelCardData`` writes the ``model-index``."""
    from huggingface_hub import EvalResult

    out = []
    for task, entry in entries.items():
        for metric, value in _metrics(entry).items():
            if _is_number(value) and metric not in COUNTS and not metric.endswith("_stderr"):
                out.append(
                    EvalResult(
                        task_type="text-generation",
                        task_name="Text Generation",
                        dataset_type=task.split(":")[0],
                        dataset_name=task,
                        metric_type=metric,
                        metric_name=metric,
                        metric_value=value,
                    )
                )
    return out


def hub_license(attribution: dict[str, Any] | None) -> tuple[str, str | None]:
    """``(license id, license name)`` for the Hub from the corpus's license text: a known
    license gives its id; another text gives ``other`` with the text as its name; no metadata
    gives ``unknown``."""
    text = str((attribution or {}).get("license") or "").strip()
    if not text:
        return "unknown", None
    low = text.lower()
    for prefix, hub_id in HUB_LICENSES.items():
        if low.startswith(prefix):
            return hub_id, (text if hub_id == "other" else None)
    return "other", text


def hub_datasets(cfg: Config, attribution: dict[str, Any] | None) -> list[str]:
    """A Hub dataset id for a corpus read from the Hub, else the corpus's attnlab name (none for
    a corpus given by a path, which would leak a local file name)."""
    source = str((attribution or {}).get("source") or "")
    m = re.match(r"https://huggingface\.co/datasets/(.+)$", source)
    if m:
        return [m.group(1)]
    return [cfg.data.corpus] if re.fullmatch(r"[\w.-]+", cfg.data.corpus) else []


def _attribution_lines(attribution: dict[str, Any]) -> list[str]:
    """A few readable lines: source, origin, license, credit, counts; lists are counted only
    (the full lists are in :data:`ATTRIBUTION_FILE`)."""
    lines = []
    for key in ("source", "origin", "config", "split", "license", "credit"):
        if attribution.get(key):
            lines.append(f"- {key}: {attribution[key]}")
    for key, value in attribution.items():
        if key.startswith("n_") and isinstance(value, int):
            lines.append(f"- {key[2:].replace('_', ' ')}: {value:,}")
        elif isinstance(value, list) and f"n_{key}" not in attribution:
            lines.append(f"- {key}: {len(value):,}")
    lines.append(f"- in full (every item listed): [{ATTRIBUTION_FILE}]({ATTRIBUTION_FILE})")
    return lines


def attribution_file(data_meta: dict[str, Any] | None) -> str | None:
    """The text of :data:`ATTRIBUTION_FILE`, or None when the corpus has no attribution."""
    attribution = (data_meta or {}).get("attribution")
    if not isinstance(attribution, dict) or not attribution:
        return None
    return json.dumps(attribution, indent=2, ensure_ascii=False) + "\n"


def _header(
    cfg: Config, name: str, attribution: dict[str, Any] | None, entries: dict[str, Any]
) -> list[str]:
    """The YAML header, written by huggingface_hub's ``ModelCardData`` (a dependency of
    transformers and tokenizers): the Hub's own schema for ``model-index``."""
    from huggingface_hub import ModelCardData

    license_id, license_name = hub_license(attribution)
    extra: dict[str, Any] = {}
    if license_name:
        extra["license_name"] = re.sub(r"[^a-z0-9]+", "-", license_name.lower()).strip("-")[:64]
    results = eval_results(entries)
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["attnlab", "custom_code"],
        license=license_id,
        datasets=hub_datasets(cfg, attribution) or None,
        model_name=name if results else None,
        eval_results=results or None,
        **extra,
    )
    return ["---", data.to_yaml(), "---"]


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
    """The card's Markdown, with a YAML header the Hub reads (license, datasets, model-index)."""
    m = cfg.model
    attribution = (data_meta or {}).get("attribution")
    attribution = attribution if isinstance(attribution, dict) and attribution else None
    entries = result_entries(results)
    lines = [
        *_header(cfg, name, attribution, entries),
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
        *_load_lines(name),
        "## Block",
        "",
        "| slot | part | options |",
        "| --- | --- | --- |",
        *_slots(cfg),
        "",
    ]
    lines += _plugin_lines(plugins) + _family_lines(cfg)
    lines += _data_lines(cfg, data_meta, tokenizer, attribution)
    lines += ["", "## Training", ""]
    if status:
        for key in ("status", "step", "max_steps", "tokens", "final_val_loss", "best_val_loss"):
            if status.get(key) is not None:
                lines.append(f"- {key}: {_fmt(status[key])}")
    else:
        lines.append("- no status.json in the run directory")
    table = _results(entries)
    if table:
        lines += ["", "## Evaluation (attnlab eval)", "", *table]
    elif results is not None:
        lines += ["", "## Evaluation", "", "- eval/results.json holds no task results"]
    lines += ["", "## The run's config", "", "```toml", dump_toml(cfg).strip(), "```", ""]
    return "\n".join(lines)


def _load_lines(name: str) -> list[str]:
    """How to load the folder with transformers alone: code that runs as written."""
    return [
        "## Load it",
        "",
        "From the folder that holds this one (or give its Hub id once uploaded):",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f"path = {json.dumps(name)}",
        "model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)",
        "tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)",
        'inputs = tokenizer("The", return_tensors="pt")',
        "output = model.generate(**inputs, max_new_tokens=8, do_sample=False)",
        "print(tokenizer.decode(output[0]))",
        "```",
        "",
        "The folder carries its own code: `modeling_attnlab.py` and `configuration_attnlab.py` "
        "with attnlab's model sources they import (`attnlab_*.py`, copied, imports made "
        "relative). It needs torch and transformers (pydantic, which attnlab's configs use, "
        "comes with transformers). With attnlab installed, `import attnlab.hf` registers the "
        "classes and `trust_remote_code` is not needed, unless the model has plugin parts "
        "(their code is in `plugins/`).",
        "",
    ]


def _plugin_lines(plugins: list[dict[str, Any]]) -> list[str]:
    """The plugin files whose parts the model uses (their sources travel in the folder)."""
    if not plugins:
        return []
    lines = ["Plugin parts (their source is in this folder, `plugins/` and flattened):", ""]
    lines += [
        f"- `{p['spec']}` (sha256 {p['sha256'][:16] if p.get('sha256') else '?'}): "
        + ", ".join(f"{s}.{k}" for s, k, _ in p["parts"])
        for p in plugins
    ]
    return [*lines, ""]


def _data_lines(
    cfg: Config,
    data_meta: dict[str, Any] | None,
    tokenizer: dict[str, Any],
    attribution: dict[str, Any] | None,
) -> list[str]:
    """The corpus, its token counts per split, the tokenizer files and the attribution."""
    lines = ["## Data", ""]
    d = cfg.data
    lines.append(f"- corpus `{d.corpus}`, tokenizer `{d.tokenizer}`, sequence length {d.seq_len}")
    if data_meta:
        counts = {k: v for k, v in (data_meta.get("splits") or {}).items()}
        for split, info in counts.items():
            if isinstance(info, dict) and "tokens" in info:
                lines.append(f"- {split}: {info['tokens']:,} tokens")
    lines.append(
        f"- tokenizer files: {tokenizer['class']} (vocab {tokenizer['vocab_size']:,}, "
        f"end-of-text `{tokenizer['eos_token']}` = {tokenizer['eos_token_id']})"
    )
    if attribution:
        lines += ["", "### Attribution", "", *_attribution_lines(attribution)]
    return lines


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _family_lines(cfg: Config) -> list[str]:
    """What the model's family says of it on the card (retrieval: what it expects at its input,
    its database is not exported)."""
    from attnlab.parts import families

    return families.of(cfg.model).card_lines(cfg.model)
