"""The content controls of a retrieval evaluation as a report: the loss with real, mismatched
and no neighbours per token class (:func:`attnlab.eval.retrieval.retrieval_losses`), and the
retrieval gain stated only as real-vs-mismatched with a paired test over validation windows.

    gain = mean_w (L_mismatched(w) - L_real(w))   over the windows w holding tokens of the class

(> 0: the real neighbours help), tested by :func:`~attnlab.experiments.reports.stats.paired_test`
(two-sided paired t and sign-flip) on the per-window class means. "none - real" is printed
beside it but is not a gain: a cross-attention that ignores the neighbours' content has it too.
Cost O(windows x classes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnlab.experiments.reports.markdown import pm, table
from attnlab.experiments.reports.stats import MONTE_CARLO_SAMPLES, paired_test

ROWS = (("real", "real neighbours"), ("mismatched", "mismatched neighbours"), ("none", "none"))


def control_tests(res: dict[str, Any]) -> dict[str, dict[str, float | int | None]]:
    """{class: {'windows', 'gain', 'p_ttest', 'p_sign_flip'}}: real-vs-mismatched per window."""
    out = {}
    for name, per in res.get("per_window", {}).items():
        if "mismatched" not in per:
            continue
        real, mis = np.asarray(per["real"]), np.asarray(per["mismatched"])
        keep = np.isfinite(real) & np.isfinite(mis)
        test = paired_test(real[keep], mis[keep])
        out[name] = {
            "windows": int(keep.sum()),
            "gain": test.mean_diff,
            "p_ttest": test.p_ttest,
            "p_sign_flip": test.p_sign_flip,
        }
    return out


def _p(p: float | None) -> str:
    if p is None or not np.isfinite(p):
        return "n/a"
    if p == 0.0:  # the sign-flip test's Monte Carlo found no flip as extreme
        return f"< {1 / MONTE_CARLO_SAMPLES:.0e}"
    return f"{p:.3g}" if p >= 1e-4 else f"{p:.1e}"


def _eq(p: float | None) -> str:
    text = _p(p)
    return text if text.startswith("<") else f"= {text}"


def control_lines(res: dict[str, Any], tests: dict[str, dict] | None = None) -> list[str]:
    """The eval command's table: a row per condition, a column per token class, then the gain
    (mismatched - real) with its paired test per class."""
    tests = control_tests(res) if tests is None else tests
    classes = res["classes"]
    names = list(classes)
    head = f"  {'':<30}" + "".join(f"{n:>12}" for n in names)
    lines = [head, f"  {'tokens':<30}" + "".join(f"{classes[n]['tokens']:>12,}" for n in names)]
    for cond, label in ROWS:
        if cond in classes["all"]:
            lines.append(
                f"  {'loss, ' + label:<30}" + "".join(f"{classes[n][cond]:>12.4f}" for n in names)
            )
    for n in names:
        t = tests.get(n)
        if t is None:
            continue
        lines.append(
            f"  retrieval gain on {n}: mismatched - real = {t['gain']:+.4f} nats "
            f"(paired over {t['windows']} windows: t-test p {_eq(t['p_ttest'])}, "
            f"sign-flip p {_eq(t['p_sign_flip'])})"
        )
    return lines


def _stored(run_dir: str) -> dict[str, Any] | None:
    """The ``retrieval`` task's controls (``classes``, ``per_window``) in a run's
    ``eval/results.json`` (None without)."""
    import json
    from pathlib import Path

    f = Path(run_dir) / "eval" / "results.json"
    try:
        metrics = json.loads(f.read_text(encoding="utf-8"))["tasks"]["retrieval"]["controls"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(metrics, dict) or "classes" not in metrics:
        return None
    for per in metrics.get("per_window", {}).values():  # JSON stores NaN as null
        for cond, xs in per.items():
            per[cond] = [math.nan if x is None else x for x in xs]
    return metrics


def retrieval_section(rows: Sequence[Any]) -> list[str]:
    """The compare report's three rows (real, mismatched, no neighbours) per variant and token
    class, mean ± std over seeds, and per run the gain mismatched - real with its paired test
    over windows; nothing when no run has the ``retrieval`` task's results."""
    found = [(r, m) for r in rows if r.ok and (m := _stored(r.run_dir)) is not None]
    if not found:
        return []
    classes = list(found[0][1]["classes"])
    lines = ["## Retrieval: real, mismatched and no neighbours", ""]
    cells = []
    for variant in dict.fromkeys(r.variant for r, _ in found):
        mine = [m for r, m in found if r.variant == variant]
        for cond, label in ROWS:
            vals = [[m["classes"][c].get(cond, math.nan) for c in classes] for m in mine]
            if all(math.isnan(v) for row in vals for v in row):
                continue
            a = np.asarray(vals, dtype=float)
            sd = a.std(0, ddof=1) if len(a) > 1 else np.full(a.shape[1], math.nan)
            cells.append([variant, label, *(pm(mu, s) for mu, s in zip(a.mean(0), sd))])
    lines += [table(["variant", "neighbours", *classes], cells, "ll" + "r" * len(classes)), ""]
    tests = []
    for r, m in found:
        for c, t in control_tests(m).items():
            tests.append(
                [
                    r.variant,
                    str(r.seed),
                    c,
                    f"{t['gain']:+.4f}",
                    str(t["windows"]),
                    _p(t["p_ttest"]),
                    _p(t["p_sign_flip"]),
                ]
            )
    if tests:
        heads = ["variant", "seed", "class", "mismatched - real", "windows", "p (t)", "p (flip)"]
        lines += [table(heads, tests, "llrrrrr"), ""]
    lines += [
        "Validation loss (nats/token, mean ± std over seeds) on the same windows with each run's "
        "real neighbours, with *mismatched* ones (another window's, drawn from the seed in "
        "`eval/results.json`) and with none. A retrieval gain is only *mismatched - real* "
        "(> 0: the real neighbours help), paired over windows; *none* is higher for a model "
        "that uses its cross-attention as a content-free input too.",
        "",
    ]
    return lines
