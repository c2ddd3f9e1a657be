"""The report sections that come from the parts' own declarations.

- **Layer statistics**: for every statistic a variant's parts declare (``Part.layer_stats``,
  e.g. the content skip's ``||W_skip||_F``), a per-layer table over seeds and a bar plot, with the
  part's own sentence on what it measures (``Part.layer_stats_doc``).
- **Attention maps**: every layer's attention probabilities on one fixed validation sequence,
  for the variants that hold a part declaring ``attention_maps_label`` (identity head, virtual
  heads), with the parts' recorded ``forward_stats`` (e.g. the identity head's weights).
- **Part statistics over training**: every ``part/KEY`` column the runs' ``metrics.jsonl`` hold
  (the parts' ``train_stats``, mean over layers), against step per variant, mean and min-max
  over seeds, with the part's sentence (``Part.train_stats_doc``) and a per-layer table of the
  last logged values.

The report module calls :func:`layer_stats_section`, :func:`train_stats_section` and
:func:`attention_section`; nothing here
names a part.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.experiments.reports import analysis, plots
from attnlab.experiments.results import RunRow
from attnlab.parts import Part, registry

PLOTS = "plots"
ATTENTION_TOKENS = 48


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    sep = ["---"] + ["---:"] * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _f(x: float, digits: int) -> str:
    return "—" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def variant_parts(variant: dict[str, Any]) -> list[tuple[type[Part], Any]]:
    """(part class, its options as a dict) for every filled slot of a variant's model config."""
    out = []
    model = variant["config"]["model"]
    from attnlab.parts.slots import SLOTS

    for slot in SLOTS:
        table = model.get(slot)
        if not isinstance(table, dict) or not registry.has(slot, table.get("kind", "")):
            continue
        spec = registry.get(slot, table["kind"])
        if spec.kind != "none":
            out.append((spec.cls, table))
    return out


def parts_section(record) -> list[str]:
    """Per variant: the part in every slot that differs from the baseline's defaults, the
    parameters counted in each part's declared row, and the forward FLOPs per token."""
    from attnlab.config import validate
    from attnlab.runs.preflight import param_count as count

    reps, kinds = {}, {}
    for v in record["variants"]:
        cfg = validate(v["config"])
        reps[v["name"]] = count(cfg.model)
        kinds[v["name"]] = ", ".join(
            f"{slot}={opts.kind}"
            for slot, opts in cfg.model.slots().items()
            if opts.kind != registry.default_kind(slot)
        )
    names = list(reps)
    labels = list(dict.fromkeys(k for r in reps.values() for k in r.by_part))
    rows = [["parts", *(kinds[n] or "—" for n in names)]]
    rows += [[lab, *(f"{reps[n].by_part.get(lab, 0):,}" for n in names)] for lab in labels]
    rows.append(["non-embedding", *(f"{reps[n].non_embedding:,}" for n in names)])
    rows.append(["FLOPs/token (fwd)", *(f"{reps[n].flops_per_token:,}" for n in names)])
    return [
        "## Parameters by part",
        "",
        "Each part's parameters, counted in the row the part declares (`attnlab params`), and "
        "the forward FLOPs per token at the model's context length, with each part's declared "
        "cost.",
        "",
        _table(["", *names], rows),
        "",
    ]


def _declares(cls: type[Part], method: str) -> bool:
    return getattr(cls, method) is not getattr(Part, method)


def layer_stats_section(out: Path, record, rows: list[RunRow], notes: list[str]) -> list[str]:
    chosen = [
        v
        for v in record["variants"]
        if any(_declares(c, "layer_stats") for c, _ in variant_parts(v))
    ]
    if not chosen:
        return []
    per_stat: dict[str, dict[str, dict[int, list[float]]]] = {}
    docs: dict[str, str] = {}
    for v in chosen:
        for cls, table in variant_parts(v):
            if _declares(cls, "layer_stats"):
                opts = cls.Options.model_validate(table)
                docs.update(cls.layer_stats_doc(opts, v["config"]["model"]["d_model"]))
        for r in rows:
            if r.variant != v["name"] or r.status not in ("finished", "diverged"):
                continue
            try:
                stats = analysis.layer_stats(r.run_dir)
            except Exception as e:
                notes.append(f"layer statistics of {r.variant} seed{r.seed}: {e}")
                continue
            for key, values in stats.items():
                per_stat.setdefault(key, {}).setdefault(v["name"], {})[r.seed] = values
    lines: list[str] = []
    for key, per_var in per_stat.items():
        arrays = {n: np.array(list(seeds.values())) for n, seeds in per_var.items()}
        title = key.replace("_", " ")
        path = plots.layer_stat_bars(arrays, out / PLOTS / f"{key}.png", title)
        headers, cols = ["layer"], []
        for name, seeds in per_var.items():
            for s in sorted(seeds):
                headers.append(f"{name} seed{s}")
                cols.append(seeds[s])
            if len(seeds) > 1:
                headers.append(f"{name} mean")
                cols.append(list(arrays[name].mean(0)))
        n_layers = max(len(c) for c in cols)
        table = [
            [str(i), *(_f(c[i], 4) if i < len(c) else "—" for c in cols)] for i in range(n_layers)
        ]
        lines += [f"## {title[0].upper()}{title[1:]}", ""]
        if key in docs:
            lines += [docs[key], ""]
        lines += [f"![{title}]({path.relative_to(out).as_posix()})", "", _table(headers, table), ""]
    return lines


def attention_section(out: Path, record, rows: list[RunRow], notes: list[str]) -> list[str]:
    def label(v: dict[str, Any]) -> str | None:
        labels = [c.attention_maps_label for c, _ in variant_parts(v) if c.attention_maps_label]
        return ", ".join(labels) if labels else None

    chosen = [(v["name"], label(v)) for v in record["variants"] if label(v)]
    if not chosen:
        return []
    base = record["baseline"]
    if base not in [n for n, _ in chosen]:
        chosen.insert(0, (base, "baseline, for reference"))
    lines = [
        "## Attention maps",
        "",
        f"Attention probabilities of every layer and head on one fixed validation sequence (the "
        f"first {ATTENTION_TOKENS} tokens of the validation split; rows = queries, columns = "
        "keys), from the final checkpoint of each variant's first finished seed.",
        "",
    ]
    text_shown = False
    for name, what in chosen:
        run = next(
            (r for r in sorted(rows, key=lambda r: r.seed) if r.variant == name and r.ok), None
        )
        if run is None:
            continue
        try:
            probe = analysis.attention_probe(run.run_dir, ATTENTION_TOKENS)
        except Exception as e:
            notes.append(f"attention maps of {name} seed{run.seed}: {e}")
            continue
        if not probe.maps:
            continue
        if not text_shown:
            snippet = probe.text.replace("\n", " ⏎ ").replace("`", "'")
            lines += [f"Sequence: `{snippet}`", ""]
            text_shown = True
        p = plots.attention_grid(
            probe.maps,
            f"{name} ({what}), seed {run.seed}",
            out / PLOTS / f"attention_{name}.png",
            probe.virtual,
        )
        lines += [
            f"### {name} ({what})",
            "",
            f"![attention {name}]({p.relative_to(out).as_posix()})",
            "",
        ]
        for key, per_layer in probe.forward_stats.items():
            sentence, trailing = probe.docs.get(key, (key.replace("_", " "), None))
            n = len(per_layer[0])
            tail = list(trailing or [])
            labels = [f"head {h}" for h in range(n - len(tail))] + tail
            hp = plots.head_weight_bars(
                per_layer,
                f"{name}: {key.replace('_', ' ')} (mean over the sequence)",
                out / PLOTS / f"{key}_{name}.png",
                labels,
            )
            table = [[str(i), *(_f(float(x), 3) for x in w)] for i, w in enumerate(per_layer)]
            lines += [
                f"{sentence}:",
                "",
                f"![{key} {name}]({hp.relative_to(out).as_posix()})",
                "",
                _table(["layer", *labels], table),
                "",
            ]
    return lines


def _per_layer(key: str) -> tuple[str, int] | None:
    """``part/KEY/LAYER`` -> (KEY, LAYER); None for a ``part/KEY`` (mean) column."""
    head, _, tail = key.rpartition("/")
    return (head[len("part/") :], int(tail)) if tail.isdigit() and head != "part" else None


def train_stats_section(out: Path, record, rows: list[RunRow], notes: list[str]) -> list[str]:
    """The parts' training statistics (``part/KEY`` columns of metrics.jsonl) against step."""
    from attnlab.experiments.reports.curves import band
    from attnlab.runs.rundir import read_metrics

    curves: dict[str, dict[str, dict[int, list[tuple[int, float]]]]] = {}
    last: dict[str, dict[str, dict[int, float]]] = {}  # key -> variant -> layer -> last value
    for r in sorted(rows, key=lambda r: (r.variant, r.seed)):
        if not r.run_dir or r.status == "missing":
            continue
        for m in read_metrics(r.run_dir):
            for col, value in m.items():
                if not col.startswith("part/") or not isinstance(value, int | float):
                    continue
                layer = _per_layer(col)
                if layer is not None:
                    if r.seed == min(x.seed for x in rows if x.variant == r.variant):
                        last.setdefault(layer[0], {}).setdefault(r.variant, {})[layer[1]] = value
                    continue
                key = col[len("part/") :]
                if "/" in key:  # one column per expert etc.: the table, not a plot each
                    continue
                per_seed = curves.setdefault(key, {}).setdefault(r.variant, {})
                per_seed.setdefault(r.seed, []).append((int(m["step"]), float(value)))
    if not curves:
        return []
    docs: dict[str, str] = {}
    for v in record["variants"]:
        for cls, _ in variant_parts(v):
            docs.update(cls.train_stats_doc())
    lines = [
        "## Part statistics over training",
        "",
        "What the parts declare to follow during training (`Part.train_stats`, logged every "
        "`train.log_every` steps to metrics.jsonl as `part/KEY/LAYER` and to the trackers): "
        "the mean over layers against step, mean (line) and min-max (band) over seeds; the table "
        "gives each layer's last logged value (first seed).",
        "",
    ]
    for key, per_var in curves.items():
        bands = {name: band(list(seeds.values())) for name, seeds in per_var.items()}
        title = key.replace("_", " ")
        path = plots.train_stat_curves(bands, out / PLOTS / f"train_{key}.png", title)
        lines += [f"### {title[0].upper()}{title[1:]}", ""]
        if key in docs:
            lines += [docs[key], ""]
        lines += [f"![{title} over training]({path.relative_to(out).as_posix()})", ""]
        table = last.get(key, {})
        if table:
            names = list(table)
            n_layers = max(max(t) for t in table.values()) + 1
            body = [
                [str(i), *(_f(table[n].get(i, math.nan), 4) for n in names)]
                for i in range(n_layers)
            ]
            lines += [_table(["layer", *names], body), ""]
    return lines
