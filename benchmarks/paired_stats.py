"""The paired statistics of the benchmarks, in one place: Student's paired t interval and test,
Holm's step-down correction, the power of a paired t-test (and of any t-test from its
noncentrality), and the fold jackknife that counts a reference shared by every pair, with its
standard error and its power (`benchmarks/update_quality*.py`, `convergence.py`,
`convergence_powered.py`, `sql_training_study_plan.py`, `sql_training_study_report.py` all import them from here).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def paired_t(differences: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """Student's paired t-test of mean(differences) = 0 over n seeds (n >= 2): the mean, its
    `level` t interval (mean ± t_{n-1} s / sqrt(n)), t, the two-sided p-value, n.

    With identical differences (s = 0) the interval is the point and p is 0 (or 1 at mean 0)."""
    values = np.asarray(differences, dtype=float)
    n = len(values)
    if n < 2:
        raise ValueError(f"a paired t-test needs at least 2 differences, got {n}")
    mean, error = float(values.mean()), float(values.std(ddof=1) / math.sqrt(n))
    return t_interval(mean, error, n - 1, level, n=n)


def t_interval(
    mean: float, error: float, degrees: int, level: float = 0.95, n: int | None = None
) -> dict[str, float]:
    """An estimate with a standard error on `degrees` degrees of freedom: its `level` t interval,
    t, and the two-sided p-value of "the estimand is 0". n: the pairs it was computed from
    (default degrees + 1). A zero error gives the point as interval and p 0 (or 1 at 0)."""
    from scipy import stats

    if degrees < 1:
        raise ValueError(f"degrees must be at least 1, got {degrees}")
    n = degrees + 1 if n is None else n
    if error == 0.0:
        p = 1.0 if mean == 0.0 else 0.0
        return {"mean": mean, "low": mean, "high": mean, "t": math.inf, "p": p, "n": n}
    quantile = float(stats.t.ppf(0.5 + level / 2, degrees))
    statistic = mean / error
    p = float(2 * stats.t.sf(abs(statistic), degrees))
    return {
        "mean": mean,
        "low": mean - quantile * error,
        "high": mean + quantile * error,
        "t": statistic,
        "p": p,
        "n": n,
    }


def holm(pvalues: Mapping[Any, float]) -> dict[Any, float]:
    """Holm's step-down adjusted p-values: the i-th smallest p (1-based) times (m - i + 1),
    made non-decreasing in that order, capped at 1. Reject where adjusted p <= α."""
    ordered = sorted(pvalues, key=lambda key: pvalues[key])
    adjusted, running = {}, 0.0
    for index, key in enumerate(ordered):
        running = max(running, min(1.0, (len(ordered) - index) * pvalues[key]))
        adjusted[key] = running
    return adjusted


def paired_power(effect: float, sd: float, n: int, alpha: float) -> float:
    """Power of the two-sided paired t-test of n differences with mean `effect` and SD `sd`
    (noncentral t, `t_power`); NaN for n < 2 or sd <= 0."""
    if n < 2 or sd <= 0:
        return float("nan")
    return t_power(effect / sd * math.sqrt(n), n - 1, alpha)


def t_power(shift: float, degrees: int, alpha: float) -> float:
    """Power of a two-sided t-test at level `alpha` on `degrees` degrees of freedom whose
    statistic's noncentrality is `shift` (the effect over the estimate's standard error):
    P(|T| > t_{degrees, 1 - alpha/2}) with T noncentral t. NaN for a NaN shift."""
    from scipy import stats

    if math.isnan(shift):
        return float("nan")
    critical = stats.t.ppf(1 - alpha / 2, degrees)
    upper = stats.nct.sf(critical, degrees, shift)
    lower = stats.nct.cdf(-critical, degrees, shift)
    # scipy's far tail turns NaN at a large shift (|shift| ~ 20 and more); it is below the
    # chance that T falls on the far side of 0, Phi(-|shift|), so 0 where that is negligible
    if stats.norm.cdf(-abs(shift)) < 1e-12:
        lower = 0.0 if shift > 0 and math.isnan(lower) else lower
        upper = 0.0 if shift < 0 and math.isnan(upper) else upper
    return float(upper + lower)


def jackknife_power(effect: float, error: float, degrees: int, alpha: float) -> float:
    """Power of the fold jackknife's test (`fold_jackknife`: t on `degrees` = F - 1 degrees of
    freedom) to detect `effect` where the estimate's standard error is `error`; NaN for
    error <= 0."""
    return t_power(effect / error, degrees, alpha) if error > 0 else float("nan")


def fold_jackknife(
    estimate: float, deleted: Sequence[float], level: float = 0.95
) -> dict[str, float]:
    """The delete-one-fold jackknife interval of a statistic computed from F disjoint folds.

    estimate: the statistic on every fold; deleted: F values, the statistic recomputed with
    fold f left out of everything it enters (where each pair's reference is the sum of the
    other pairs' parts, fold f leaves both the pairs and the references). The variance
    (F - 1) / F sum_f (deleted_f - mean)^2 counts whatever the folds share, which a t over the
    pairs leaves out; the interval is the estimate ± t_{F-1} times its root.
    """
    folds = len(deleted)
    return t_interval(float(estimate), jackknife_error(deleted), folds - 1, level, n=folds)


def jackknife_error(deleted: Sequence[float]) -> float:
    """The delete-one-fold jackknife standard error from the F recomputed values:
    sqrt((F - 1) / F sum_f (deleted_f - mean)^2) (`fold_jackknife`)."""
    values = np.asarray(deleted, dtype=float)
    folds = len(values)
    if folds < 2:
        raise ValueError(f"deleted must hold at least 2 folds' values, got {folds}")
    return math.sqrt((folds - 1) / folds * float(np.sum((values - values.mean()) ** 2)))
