"""`mrtpo_beta: auto`'s rule as pure math (docs/METHOD.md, "beta from the step's own evidence";
the trainer's side is `mrtpo.trainer_beta_auto`): the probe's agreement from its sums of
gradient dot products, the window's one-sided 95% lower bound, and beta's move after a probe.
Floats in, floats out; nothing of the package but the math's own checks.
"""

from __future__ import annotations

from collections.abc import Sequence

from mrtpo.advantages import _check_beta

# One-sided 95% quantiles of Student's t with 1..30 degrees of freedom; the normal's beyond.
# The window of agreements is small (a few probes), where the normal's 1.645 would be too bold.
_T95 = (
    6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812,
    1.796, 1.782, 1.771, 1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725,
    1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697,
)  # fmt: skip
_NORMAL95 = 1.645


def t_quantile_95(degrees_of_freedom: int) -> float:
    """The one-sided 95% quantile of Student's t (table to 30 degrees of freedom, then 1.645)."""
    if degrees_of_freedom < 1:
        raise ValueError(f"degrees_of_freedom must be >= 1, got {degrees_of_freedom!r}")
    if degrees_of_freedom <= len(_T95):
        return _T95[degrees_of_freedom - 1]
    return _NORMAL95


def gradient_cosine(dot: float, first_sq: float, second_sq: float) -> float:
    """The cosine ``<a, b> / (|a| |b|)`` of two vectors given by sums, in [-1, 1].

    Args:
        dot: ``<a, b>``, a float (here summed over a probe's pairs, so the cosine is of the
            concatenated vectors).
        first_sq: ``|a|^2``, a float >= 0.
        second_sq: ``|b|^2``, a float >= 0.

    Returns:
        A float; NaN where either squared norm is 0 (no evidence).
    """
    if first_sq <= 0 or second_sq <= 0:
        return float("nan")
    return dot / (first_sq * second_sq) ** 0.5


def gradient_agreement(
    reallocation_dot: float,
    uniform_dot: float,
    reallocation_sq: float,
    uniform_sq: float,
    cross: float,
    reference_sq: float,
    beta: float,
) -> float:
    """One probe's agreement for ``mrtpo_beta: auto``: the sign of ``d/dbeta cos(g(beta), G)``.

    The step is ``g(beta) = g_U + beta g_R`` (GDPO's uniform gradient plus beta times the
    re-allocation's) and is clipped, so only its direction matters; its cosine with a reference
    ``G`` rises with beta exactly where ``cos(g_R, G) > cos(g, G) cos(g, g_R)``. The agreement is
    the difference, ``cos(g_R, G) - cos(g, G) cos(g, g_R)`` =
    ``(A N2 - B X) / (N2 sqrt(RR GG))`` with ``B = B0 + beta A``, ``N2 = |g|^2 = UU + 2 beta UR
    + beta^2 RR`` and ``X = <g, g_R> = UR + beta RR``; ``d/dbeta cos(g, G)`` is it times
    ``|g_R| / |g|``. It equals ``<g_R', G'> / (|g_R| |G|)``, g_R' and G' the parts of g_R and G
    orthogonal to g, so it lies in [-1, 1] (up to rounding), and it is 0 where g_R only
    lengthens g, whatever cos(g_R, G).

    Args (floats: each a sum over the probe's (micro-batch, process) pairs, so that the
    vectors are the pairs' concatenations; A, B0, RR, UU, UR, GG above):
        reallocation_dot: ``A = <g_R, G>``.
        uniform_dot: ``B0 = <g_U, G>``.
        reallocation_sq: ``RR = |g_R|^2``, >= 0.
        uniform_sq: ``UU = |g_U|^2``, >= 0.
        cross: ``UR = <g_U, g_R>``.
        reference_sq: ``GG = |G|^2``, >= 0.
        beta: the beta the step trained at, in [0, 1].

    Returns:
        A float; NaN where RR, GG or |g(beta)|^2 is 0 (nothing re-allocated, no reference, no
        step): no evidence.
    """
    _check_beta(beta)
    norm_sq = uniform_sq + 2 * beta * cross + beta * beta * reallocation_sq  # N2 = |g|^2
    if reallocation_sq <= 0 or reference_sq <= 0 or norm_sq <= 0:
        return float("nan")
    step_dot = uniform_dot + beta * reallocation_dot  # B = <g, G>
    along = cross + beta * reallocation_sq  # X = <g, g_R>
    numerator = reallocation_dot * norm_sq - step_dot * along
    return numerator / (norm_sq * (reallocation_sq * reference_sq) ** 0.5)


def agreement_bound(agreements: Sequence[float]) -> tuple[float, float, float]:
    """(mean, standard error, one-sided 95% lower bound) of the probes' agreements.

    Standard error: sample standard deviation over sqrt(n); the bound is mean - t(n-1) * SE.
    NaN where there is nothing to say: mean with no value, SE and bound with fewer than two.
    """
    values = [float(a) for a in agreements]
    n = len(values)
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan"), float("nan")
    variance = sum((a - mean) ** 2 for a in values) / (n - 1)
    se = (variance / n) ** 0.5
    return mean, se, mean - t_quantile_95(n - 1) * se


def next_auto_beta(
    beta: float, agreements: Sequence[float], beta_max: float, beta_step: float
) -> float:
    """``mrtpo_beta: auto``'s update after a probe: up by beta_step (at most beta_max) when the
    agreements' one-sided 95% lower bound (``agreement_bound``) is above 0, else down by
    beta_step (at least 0). Fewer than two agreements: no bound, so down (beta starts at 0).

    beta and beta_max in [0, 1]; beta_step > 0.
    """
    _check_beta(beta)
    _check_beta(beta_max)
    if beta_step <= 0:
        raise ValueError(f"beta_step must be > 0, got {beta_step!r}")
    lower = agreement_bound(agreements)[2]
    # Rounded so that steps up and down return to exactly 0 (0.1 + 0.2 - 0.3 is not 0).
    if lower > 0:  # NaN compares False: no evidence is no rise
        return min(beta_max, round(beta + beta_step, 12))
    return max(0.0, round(beta - beta_step, 12))
