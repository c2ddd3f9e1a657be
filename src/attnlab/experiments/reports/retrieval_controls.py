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

from typing import Any

import numpy as np

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
            f"(paired over {t['windows']} windows: t-test p = {_p(t['p_ttest'])}, "
            f"sign-flip p = {_p(t['p_sign_flip'])})"
        )
    return lines


def flat_metrics(res: dict[str, Any]) -> dict[str, Any]:
    """What ``eval/results.json`` keeps: the losses and the tests, not the per-window lists."""
    keep = {k: v for k, v in res.items() if k not in ("chunks", "per_window")}
    keep["tests"] = control_tests(res)
    return keep
