"""The second plan's analysis (`update_quality_plan2.py`, stored in `plan-2.json`): the power
step from its pilot, the primary tests with fold-jackknife intervals and Holm, the secondary
ones, and the reading the plan fixed for each pattern. Everything reads the stored plan, and
the power step writes the sizing beside it (`<state>/power.json`, as the first plan's), so the
plan itself never changes once stored.

The power step (`update_quality.py --power --state qwen_instructions`): from the pilot's
mini-batches (8, in 4 folds), for each primary contrast its mean cosine difference and its
fold-jackknife standard error SE; the main sample's size n is the smallest with power >= 0.8
for mrtpo(0.5) - gdpo to detect 20% of gdpo's mean pilot cosine in the test the analysis runs:
two-sided at alpha 0.05 / 3 (Holm's first step), t on F - 1 degrees of freedom (F = min(4, n)
folds), the pilot's SE scaled to SE * sqrt(8 / n). It is capped by the budget (10 CPU-hours
over the pilot's CPU seconds per mini-batch, sampling and both passes, summed over its lanes),
by the prompts the split holds and by `--max_batches`; the power then reached is stored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from paired_stats import fold_jackknife, holm, jackknife_error, jackknife_power, paired_t
from update_quality_analysis import (
    ALL_ESTIMATORS,
    batch_measures,
    cosine_differences,
    fold_statistic,
    fold_test,
    mean_difference,
    per_estimator,
)
from update_quality_plan2 import PLAN_2_FILE, plan_2
from update_quality_references import record_mode
from update_quality_states import read_json

# ----------------------------------------------------------------------------- the plan


def stored_plan_2(results: Path) -> dict[str, Any]:
    """The second plan as stored in `results` (what every step reads), else as the code holds
    it (a folder where nothing is measured yet)."""
    return read_json(Path(results) / PLAN_2_FILE) or plan_2()


def measurable(records: Sequence[Mapping[str, Any]], *estimators: str) -> bool:
    """Whether every record measured the directions the estimators are made of (a first-plan
    state measured again may lack the second plan's variants)."""
    variants = {"gdpo"} | {ALL_ESTIMATORS[name][0] for name in estimators}
    return bool(records) and all(variants <= set(r["directions"]) for r in records)


# ----------------------------------------------------------------------------- the power step


def sample_cost(run: Mapping[str, Any] | None, batches: int) -> dict[str, Any] | None:
    """A measured sample's CPU cost from its `run.json`: CPU seconds per stage (sample,
    reference, measure) summed over its lanes, and per mini-batch over `batches`."""
    if not run or not run.get("lanes"):
        return None
    stages: dict[str, float] = {}
    for info in run["lanes"].values():
        for stage, seconds in info["cpu_seconds"].items():
            stages[stage] = stages.get(stage, 0.0) + seconds
    total = sum(stages.values())
    return {"cpu_seconds": stages, "total_cpu_seconds": total, "per_batch": total / batches}


def scaled_power(
    effect: float, error: float, pilot_batches: int, batches: int, folds: int, alpha: float
) -> float:
    """The power at `batches` mini-batches of the fold jackknife's two-sided test at `alpha`
    to detect `effect`, from the pilot's standard error `error` over `pilot_batches`:
    SE * sqrt(pilot_batches / batches), t on min(folds, batches) - 1 degrees of freedom."""
    scaled = error * math.sqrt(pilot_batches / batches)
    return jackknife_power(effect, scaled, min(folds, batches) - 1, alpha)


def batches_for_power(
    effect: float,
    error: float,
    pilot_batches: int,
    folds: int,
    alpha: float,
    power: float,
    limit: int = 10_000,
) -> int | None:
    """The fewest mini-batches (2 to `limit`) at which `scaled_power` reaches `power`; None if
    none does (or the effect or error is not a positive number). The power rises with the
    mini-batches (the shift as their root, the degrees of freedom up to folds - 1): bisection."""

    def enough(batches: int) -> bool:
        return scaled_power(effect, error, pilot_batches, batches, folds, alpha) >= power

    if not enough(limit):
        return None
    low, high = 1, limit  # enough(high); low: not enough, or below the range
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


def power_2(
    pilot: Sequence[Mapping[str, Any]],
    run: Mapping[str, Any] | None,
    plan: Mapping[str, Any],
    prompt_batches: int | None = None,
    max_batches: int | None = None,
) -> dict[str, Any]:
    """The second plan's sizing of the main sample from its pilot (the module's docstring).

    pilot: the pilot's measures, measured with folds; run: the pilot's `run.json` (its CPU
    seconds; None: no budget cap); plan: the stored second plan; prompt_batches: the most
    mini-batches of the main sample's prompts; max_batches: a further cap (`--max_batches`).
    Returns what `<state>/power.json` holds (`batches`: the main sample's size)."""
    sizing = tuple(plan["primary_contrasts"][0])
    if sizing != ("mrtpo(0.5)", "gdpo"):
        raise ValueError(f"the plan sizes on mrtpo(0.5) - gdpo, its first contrast is {sizing}")
    folds, target = plan["folds"], plan["power"]
    alpha = plan["alpha"] / plan["holm_family"]
    batches = len(pilot)
    gdpo_mean = float(np.mean(per_estimator(pilot, estimators=["gdpo"])["gdpo"]["cosine"]))
    effect = plan["effect_share"] * abs(gdpo_mean)
    contrasts = {}
    for first, second in plan["primary_contrasts"]:
        values = fold_statistic(pilot, mean_difference(first, second))
        if values is None:
            raise ValueError("the pilot was measured without folds (or in fewer than 2)")
        estimate, deleted = values
        error = jackknife_error(deleted)
        contrasts[f"{first} - {second}"] = {
            "difference_mean": estimate,
            "jackknife_se": error,
            "pilot_folds": len(deleted),
            "needed_batches": batches_for_power(effect, error, batches, folds, alpha, target),
            "needed_batches_at_pilot_difference": batches_for_power(
                abs(estimate), error, batches, folds, alpha, target
            ),
        }
    cost = sample_cost(run, batches)
    caps = {
        "budget": None
        if cost is None
        else int(plan["budget_cpu_hours"] * 3600 // cost["per_batch"]),
        "prompts": prompt_batches,
        "max_batches": max_batches,
    }
    cap = min([value for value in caps.values() if value is not None] or [10_000])
    needed = contrasts["mrtpo(0.5) - gdpo"]["needed_batches"]
    chosen = max(min(needed or cap, cap), 2)
    for contrast in contrasts.values():
        contrast["power_at_batches"] = scaled_power(
            effect, contrast["jackknife_se"], batches, chosen, folds, alpha
        )
    return {
        "plan": PLAN_2_FILE,
        "pilot_batches": batches,
        "folds": folds,
        "gdpo_mean_cosine": gdpo_mean,
        "effect": effect,
        "alpha": alpha,
        "power": target,
        "sizing_contrast": "mrtpo(0.5) - gdpo",
        "contrasts": contrasts,
        "cost": cost,
        "budget_cpu_hours": plan["budget_cpu_hours"],
        "caps": caps,
        "cap": cap,
        "needed_batches": needed,
        "batches": chosen,
        "power_at_batches": contrasts["mrtpo(0.5) - gdpo"]["power_at_batches"],
        "main_cpu_hours": None if cost is None else chosen * cost["per_batch"] / 3600,
    }


# ----------------------------------------------------------------------------- the tests


def plan_2_tests(
    records: Sequence[Mapping[str, Any]],
    contrasts: Sequence[Sequence[str]],
    alpha: float | None = None,
) -> list[dict[str, Any]]:
    """Per contrast: the fold-jackknife test of its mean cosine difference (`test`, None where
    not measured or without 2 folds), the paired t over mini-batches beside it (`paired`: it
    does not count the shared reference), whether its directions were measured. With `alpha`
    (a family, the primary contrasts), Holm's adjusted p over the jackknife tests present
    (`holm_p`) and `significant` (holm_p <= alpha)."""
    tests = []
    for first, second in contrasts:
        measured = measurable(records, first, second)
        test = fold_test(records, first, second) if measured else None
        paired = None
        if measured and len(records) > 1:
            paired = paired_t(list(cosine_differences(records, first, second)))
        tests.append(
            {"contrast": (first, second), "measured": measured, "test": test, "paired": paired}
        )
    if alpha is not None:
        adjusted = holm({i: t["test"]["p"] for i, t in enumerate(tests) if t["test"] is not None})
        for i, test in enumerate(tests):
            test["holm_p"] = adjusted.get(i)
            test["significant"] = test["holm_p"] is not None and test["holm_p"] <= alpha
    return tests


def reward_cosine_test(
    records: Sequence[Mapping[str, Any]], estimator: str, reward: int
) -> dict[str, float] | None:
    """An estimator's mean cosine with one reward's reference (the mini-batches where it is
    defined) and its fold-jackknife interval; where the rewards' references were kept whole
    (`--reward_references whole`), the paired t's over the mini-batches instead. None where
    not measured (or not kept: `none`), or where it is not defined on every fold's deletion (a
    reward with no varying group left)."""
    if not measurable(records, estimator) or record_mode(records[0]) == "none":
        return None

    def cosines(kept: Sequence[Mapping[str, Any]]) -> list[float]:
        values = [batch_measures(r, estimator, 2)["reward_cosines"][reward] for r in kept]
        return [c for c in values if not math.isnan(c)]

    if record_mode(records[0]) == "whole":
        defined = cosines(records)
        return paired_t(defined) if len(defined) > 1 else None

    def statistic(kept: Sequence[Mapping[str, Any]]) -> float:
        defined = cosines(kept)
        return float(np.mean(defined)) if defined else float("nan")

    values = fold_statistic(records, statistic)
    if values is None or any(math.isnan(v) for v in [values[0], *values[1]]):
        return None
    return fold_jackknife(*values)


# ----------------------------------------------------------------------------- the reading

# The readings the plan fixed (plan-2.json's "Reading"), by contrast and outcome.
READINGS = {
    ("gdpo", "above"): "the reallocation points the step further uphill on this task",
    ("gdpo", "below"): "it displaces the uniform signal (the dose-response says how: {dose})",
    ("gdpo", "none"): "no difference from gdpo detected, the interval bounding it",
    ("placebo", "above"): (
        "the information matters (the replay's weights depend on what the verifier says, not "
        "only on a context being there)"
    ),
    ("placebo", "not above"): (
        "the information is not what moves the step at this scale, the interval bounding it "
        "({shares})"
    ),
    ("contrastive", "above"): (
        "the contrast is worth its replay (1.6-2.0x the plain replay's cost)"
    ),
    ("contrastive", "not above"): "the plain replay stays the default",
    ("generic", "equal"): "the replay finds uncertain tokens, not relevant ones",
    ("generic", "not equal"): "generic(0.5) not shown equal to mrtpo(0.5)",
}
PRIMARY_ROLES = ("gdpo", "placebo", "contrastive")  # plan-2.json's primary contrasts, in order


def outcome(test: Mapping[str, Any]) -> int:
    """+1 significantly above 0 after Holm, -1 below, 0 not significant."""
    if not test["significant"]:
        return 0
    return 1 if test["test"]["mean"] > 0 else -1


def pattern(
    primary: Sequence[Mapping[str, Any]],
    generic: Mapping[str, Any] | None,
    effect: float | None,
) -> dict[str, str]:
    """The outcome of each contrast the reading names: {role: outcome}, READINGS' keys.

    primary: `plan_2_tests` of the three primary contrasts (with Holm), in the plan's order;
    generic: the fold-jackknife test of mrtpo(0.5) - generic(0.5) (secondary, uncorrected);
    effect: the effect the plan is powered for (power.json). Generic equals own where that
    interval holds 0 and is narrower than the effect."""
    signs = dict(zip(PRIMARY_ROLES, (outcome(t) for t in primary), strict=True))
    out = {"gdpo": {1: "above", -1: "below", 0: "none"}[signs["gdpo"]]}
    for role in ("placebo", "contrastive"):
        out[role] = "above" if signs[role] > 0 else "not above"
    if generic is not None and effect is not None:
        holds = generic["low"] <= 0 <= generic["high"]
        narrow = generic["high"] - generic["low"] < effect
        out["generic"] = "equal" if holds and narrow else "not equal"
    return out
