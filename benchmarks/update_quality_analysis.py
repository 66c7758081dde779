"""The update-quality benchmark's analysis (`update_quality.py`): each estimator's measures per
mini-batch from the stored dot products, the paired tests of the plan, the power calculation,
and the comparison of two measurements of the same mini-batches."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from paired_stats import fold_jackknife, holm, paired_power, paired_t
from update_quality_plan2 import ESTIMATORS_2
from update_quality_references import record_mode
from update_quality_states import (
    ALPHA,
    EFFECT_SHARE,
    ESTIMATORS,
    GROUP_SIZE,
    MAX_GRAD_NORM,
    PILOT_BATCHES,
    POWER,
    PRIMARY_CONTRASTS,
    PROMPTS_PER_BATCH,
    SAMPLES,
    SECONDARY_CONTRASTS,
    STATES,
    main_sample_size,
    read_json,
    sample_dir,
)

# Every estimator of either plan: (variant, beta). A name means the same in both plans.
ALL_ESTIMATORS: dict[str, tuple[str, float | None]] = {**ESTIMATORS, **ESTIMATORS_2}

# ----------------------------------------------------------------------------- the analysis


def load_measures(
    results: Path, states: Iterable[str] = STATES
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """{state: {sample: [measures of its mini-batches, by index]}} from the results files, for
    `states` (default the first plan's). Each record gets `sample_batches`, the sample's
    planned size (the pilot's fixed size, the main sample's from the power calculation or a
    checkpoint state's fixed one): its reference averages over the other mini-batches of all of
    them, whether or not they are measured yet."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for state in states:
        for sample in SAMPLES:
            folder = sample_dir(results, state, sample) / "measures"
            records = [read_json(path) for path in sorted(folder.glob("batch*.json"))]
            planned = PILOT_BATCHES if sample == "pilot" else main_sample_size(results, state)
            for record in records:
                record["sample_batches"] = max(planned or 0, len(records))
            if records:
                out.setdefault(state, {})[sample] = records
    return out


DOTS = ("ref_dots", "reward_dots")  # a direction's dots with references (reward_dots: `whole`)


def direction(record: Mapping[str, Any], estimator: str) -> dict[str, Any]:
    """An estimator's dots on one mini-batch: ref_dots [K] (with the references kept per fold:
    the rewards', or the summed reward's alone), reward_dots (with the rewards' whole
    references, where kept so), norm2, diff2 (its squared distance from gdpo's gradient). At
    beta < 1 a token-level variant is the blend (1 - beta) g_gdpo + beta g_variant(1), whose
    dots are bilinear in the measured ones."""
    variant, beta = ALL_ESTIMATORS[estimator]
    measured = record["directions"]
    gdpo = measured["gdpo"]
    one = measured[variant]
    if beta is None:
        cross = one.get("dot_gdpo", one["norm2"] if variant == "gdpo" else float("nan"))
        return {
            **{key: list(one[key]) for key in DOTS if key in one},
            "norm2": one["norm2"],
            "diff2": one["norm2"] - 2 * cross + gdpo["norm2"] if variant != "gdpo" else 0.0,
        }
    cross = one["dot_gdpo"]
    dots = {
        key: [(1 - beta) * a + beta * b for a, b in zip(gdpo[key], one[key], strict=True)]
        for key in DOTS
        if key in one
    }
    norm2 = (1 - beta) ** 2 * gdpo["norm2"] + 2 * beta * (1 - beta) * cross + beta**2 * one["norm2"]
    diff2 = beta**2 * (one["norm2"] - 2 * cross + gdpo["norm2"])
    return {**dots, "norm2": norm2, "diff2": diff2}


def batch_measures(
    record: Mapping[str, Any], estimator: str, batches: int, weights: Sequence[float] | None = None
) -> dict[str, Any]:
    """One estimator on one mini-batch: cosine with the summed-reward reference and with each
    reward's, the gradient norm, the first-order gain of the clipped step and the norm of the
    difference from gdpo's gradient. `batches`: the sample's number of mini-batches (the
    reference averages over the other ones' prompts). weights: the rewards' in the sum (a
    record with the rewards' references per fold only). The per-reward cosines: with the
    rewards' references per fold or whole, as the record kept them; NaN where it kept none."""
    values = direction(record, estimator)
    gram = np.asarray(record["ref_gram"], dtype=float)
    mode = record_mode(record)
    if weights is not None and mode != "per_fold":
        raise ValueError(f"a record with --reward_references {mode} holds the summed reward only")
    c = np.ones(len(gram)) if weights is None else np.asarray(weights, dtype=float)
    dots = np.asarray(values["ref_dots"], dtype=float)
    norm = math.sqrt(max(values["norm2"], 0.0))
    summed_dot, summed_norm = float(c @ dots), math.sqrt(max(float(c @ gram @ c), 0.0))
    per_prompt = (batches - 1) * PROMPTS_PER_BATCH * GROUP_SIZE  # the reference's 1 / (P G)
    if per_prompt <= 0:
        raise ValueError(
            f"batches must be at least 2 (the reference is the others'), got {batches}"
        )
    if mode != "per_fold":  # the rewards' own references: kept whole, or not kept
        gram = np.asarray(record.get("reward_gram", np.zeros((0, 0))), dtype=float)
        dots = np.asarray(values.get("reward_dots", []), dtype=float)
    return {
        "cosine": _safe_ratio(summed_dot, norm * summed_norm),
        "reward_cosines": [
            _safe_ratio(float(dots[k]), norm * math.sqrt(max(gram[k, k], 0.0)))
            if k < len(dots)
            else float("nan")
            for k in range(len(record["reward_names"]))
        ],
        "norm": norm,
        "gain": summed_dot / per_prompt / max(MAX_GRAD_NORM, norm),
        "diff_norm": math.sqrt(max(values["diff2"], 0.0)),
    }


def _safe_ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else float("nan")


def per_estimator(
    records: Sequence[Mapping[str, Any]],
    batches: int | None = None,
    estimators: Iterable[str] = ESTIMATORS,
) -> dict[str, dict[str, list[float]]]:
    """{estimator: {measure: [value per mini-batch]}} (reward_cosines: one list per reward) for
    `estimators` (default the first plan's). batches: the sample's size; by default each
    record's `sample_batches` (set by `load_measures`), else the number of records."""
    out: dict[str, dict[str, Any]] = {}
    for estimator in estimators:
        rows = [
            batch_measures(r, estimator, batches or r.get("sample_batches", len(records)))
            for r in records
        ]
        out[estimator] = {
            key: [row[key] for row in rows] for key in ("cosine", "norm", "gain", "diff_norm")
        }
        out[estimator]["reward_cosines"] = [
            list(v) for v in zip(*(r["reward_cosines"] for r in rows), strict=True)
        ]
    return out


def contrast_tests(
    values: Mapping[str, Mapping[str, Sequence[float]]], contrasts: Sequence[tuple[str, str]]
) -> list[dict[str, Any]]:
    """Paired t-test of the cosine differences over mini-batches, per contrast."""
    tests = []
    for first, second in contrasts:
        differences = np.subtract(values[first]["cosine"], values[second]["cosine"])
        test = paired_t(list(differences)) if len(differences) > 1 else None
        tests.append({"contrast": (first, second), "test": test})
    return tests


def primary_tests(measures: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The 6 pre-registered tests (3 per state, on the main sample), Holm over those present."""
    tests = []
    for state in STATES:
        records = measures.get(state, {}).get("main")
        if not records:
            continue
        for test in contrast_tests(per_estimator(records), PRIMARY_CONTRASTS):
            tests.append({"state": state, **test})
    adjusted = holm({i: t["test"]["p"] for i, t in enumerate(tests) if t["test"] is not None})
    for i, test in enumerate(tests):
        test["holm_p"] = adjusted.get(i)
        test["significant"] = test["holm_p"] is not None and test["holm_p"] <= ALPHA
    return tests


def power_calculation(pilot: Sequence[Mapping[str, Any]], cap: int) -> dict[str, Any]:
    """From the pilot's mini-batches: the mini-batches for power POWER to detect EFFECT_SHARE of
    gdpo's mean cosine in mrtpo(0.5) - gdpo at ALPHA / 6 (Holm's first step); at most `cap`."""
    values = per_estimator(pilot)
    gdpo_mean = float(np.mean(values["gdpo"]["cosine"]))
    differences = np.subtract(values["mrtpo(0.5)"]["cosine"], values["gdpo"]["cosine"])
    sd = float(np.std(differences, ddof=1))
    effect = EFFECT_SHARE * abs(gdpo_mean)
    alpha = ALPHA / 6
    needed = next(
        (n for n in range(2, 10_001) if paired_power(effect, sd, n, alpha) >= POWER), None
    )
    chosen = min(needed or cap, cap)
    return {
        "pilot_batches": len(pilot),
        "gdpo_mean_cosine": gdpo_mean,
        "effect": effect,
        "difference_mean": float(differences.mean()),
        "difference_sd": sd,
        "alpha": alpha,
        "needed_batches": needed,
        "cap": cap,
        "batches": max(chosen, 2),
        "power_at_batches": paired_power(effect, sd, max(chosen, 2), alpha),
        "contrast_sds": {
            f"{a} - {b}": float(
                np.std(np.subtract(values[a]["cosine"], values[b]["cosine"]), ddof=1)
            )
            for a, b in (*PRIMARY_CONTRASTS, *SECONDARY_CONTRASTS)
        },
    }


def precision_comparison(
    reference: Sequence[Mapping[str, Any]],
    other: Sequence[Mapping[str, Any]],
    estimators: Iterable[str] = ESTIMATORS,
) -> dict[str, Any]:
    """The same mini-batches measured twice (e.g. float32 and `--bf16`): per estimator the mean
    cosine of each, the largest per-mini-batch change of the cosine, and per contrast (primary
    and secondary, those between `estimators`: default the first plan's, all of them) the mean
    difference of each with the change of its mean. Only the mini-batches measured both ways
    count (a partial second measurement compares on its own)."""
    common = sorted({r["batch"] for r in reference} & {r["batch"] for r in other})
    if not common:
        raise ValueError("precision_comparison: the two measurements share no mini-batch")
    names = list(estimators)
    batches = len({r["batch"] for r in reference})  # the sample's size sets each reference's scale
    first = per_estimator([r for r in reference if r["batch"] in common], batches, names)
    second = per_estimator([r for r in other if r["batch"] in common], batches, names)
    compared = {
        name: {
            "mean_cosine": [
                float(np.mean(first[name]["cosine"])),
                float(np.mean(second[name]["cosine"])),
            ],
            "max_abs_change": float(
                np.max(np.abs(np.subtract(first[name]["cosine"], second[name]["cosine"])))
            ),
            "mean_norm": [
                float(np.mean(first[name]["norm"])),
                float(np.mean(second[name]["norm"])),
            ],
        }
        for name in names
    }
    contrasts = {}
    for a, b in (*PRIMARY_CONTRASTS, *SECONDARY_CONTRASTS):
        if a not in names or b not in names:
            continue
        means = [
            float(np.mean(np.subtract(values[a]["cosine"], values[b]["cosine"])))
            for values in (first, second)
        ]
        contrasts[f"{a} - {b}"] = {"mean_difference": means, "change": means[1] - means[0]}
    return {"batches": common, "estimators": compared, "contrasts": contrasts}


# ----------------------------------------------------------------------------- folds


def restricted(record: Mapping[str, Any], folds: Sequence[int]) -> dict[str, Any]:
    """A measured mini-batch with its references restricted to some folds: every dot product
    with a reference (each direction's, the Gram matrix) summed over `folds` only. Needs a
    record measured with folds (`ref_fold_dots`); the rest of the record is unchanged."""
    if "ref_fold_gram" not in record:
        raise ValueError(f"mini-batch {record.get('batch')} was measured without folds")
    kept = sorted(set(folds))
    gram = np.asarray(record["ref_fold_gram"], dtype=float)[:, :, kept][:, :, :, kept]
    directions = {}
    for name, entry in record["directions"].items():
        fold_dots = np.asarray(entry["ref_fold_dots"], dtype=float)[:, kept]
        directions[name] = {**entry, "ref_dots": fold_dots.sum(axis=1).tolist()}
    return {**record, "ref_gram": gram.sum(axis=(2, 3)).tolist(), "directions": directions}


def reference_agreement(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """How much the summed reward's reference agrees with itself across folds: per mini-batch
    and pair of folds (f < g, both parts non-zero), the cosine between the two folds' parts of
    its reference. Near 0, one group of prompts shares no direction of improvement with another,
    and every estimator's cosine with the reference is near 0 whatever the estimator. Returns
    the pairs' count, mean, standard deviation, min and max, and `ceiling`: the cosine with the
    whole reference (F folds) of a direction that is exactly what the folds share, at the mean
    agreement c, sqrt(F c / (1 + (F - 1) c)) (the Spearman-Brown step-up, the folds taken as
    equal; 0 where c <= 0). None without records measured with folds."""
    cosines, folds = [], 0
    for record in records:
        if "ref_fold_gram" not in record:
            return None
        # every kept reference's parts summed: the summed reward's (its weights are 1)
        gram = np.asarray(record["ref_fold_gram"], dtype=float).sum(axis=(0, 1))
        folds = max(folds, len(gram))
        for f in range(len(gram)):
            for g in range(f + 1, len(gram)):
                if gram[f, f] > 0 and gram[g, g] > 0:
                    cosines.append(gram[f, g] / math.sqrt(gram[f, f] * gram[g, g]))
    if not cosines:
        return None
    mean = float(np.mean(cosines))
    ceiling = math.sqrt(folds * mean / (1 + (folds - 1) * mean)) if mean > 0 else 0.0
    return {
        "pairs": len(cosines),
        "mean": mean,
        "sd": float(np.std(cosines, ddof=1)) if len(cosines) > 1 else float("nan"),
        "min": float(min(cosines)),
        "max": float(max(cosines)),
        "folds": folds,
        "ceiling": ceiling,
    }


def cosine_differences(records: Sequence[Mapping[str, Any]], first: str, second: str) -> np.ndarray:
    """Per mini-batch, the cosine of `first` minus that of `second` (summed reward)."""
    return np.array(
        [
            # (the sample size, 2 here, scales only the gain, not the cosine)
            batch_measures(r, first, 2)["cosine"] - batch_measures(r, second, 2)["cosine"]
            for r in records
        ]
    )


def fold_statistic(
    records: Sequence[Mapping[str, Any]],
    statistic: Callable[[Sequence[Mapping[str, Any]]], float],
) -> tuple[float, list[float]] | None:
    """A statistic of the mini-batches and its delete-one-fold values, the jackknife's inputs:
    (statistic on every record, [statistic with fold f left out of the mini-batches and out of
    every remaining mini-batch's reference, per fold present]). None where the records hold
    no folds or fewer than 2 folds are measured."""
    if not records or any("ref_fold_gram" not in r for r in records):
        return None
    folds = records[0]["folds"]
    present = sorted({r["fold"] for r in records})
    if folds < 2 or len(present) < 2:
        return None
    deleted = []
    for fold in present:
        others = [f for f in range(folds) if f != fold]
        deleted.append(statistic([restricted(r, others) for r in records if r["fold"] != fold]))
    return statistic(records), deleted


def mean_difference(first: str, second: str) -> Callable[[Sequence[Mapping[str, Any]]], float]:
    """The statistic of a contrast: the mean over mini-batches of `first`'s cosine minus
    `second`'s (summed reward)."""
    return lambda records: float(cosine_differences(records, first, second).mean())


def fold_test(
    records: Sequence[Mapping[str, Any]], first: str, second: str, level: float = 0.95
) -> dict[str, float] | None:
    """The mean cosine difference `first` - `second` over the mini-batches with its fold
    jackknife interval (`paired_stats.fold_jackknife`): fold f left out of the mean and out of
    every remaining mini-batch's reference. None where the records hold no folds or fewer than
    2 folds are measured."""
    return fold_interval(records, mean_difference(first, second), level)


def fold_tests(
    records: Sequence[Mapping[str, Any]], contrasts: Sequence[tuple[str, str]]
) -> list[dict[str, Any]]:
    """`fold_test` per contrast, in `contrast_tests`' form."""
    return [
        {"contrast": (first, second), "test": fold_test(records, first, second)}
        for first, second in contrasts
    ]


def mean_cosine(estimator: str) -> Callable[[Sequence[Mapping[str, Any]]], float]:
    """The statistic of an estimator: its mean cosine over the mini-batches (summed reward)."""
    return lambda records: float(
        np.mean([batch_measures(r, estimator, 2)["cosine"] for r in records])
    )


def mean_ratio(
    measure: str, first: str, second: str
) -> Callable[[Sequence[Mapping[str, Any]]], float]:
    """The statistic of two estimators' `measure` ("gain": the first-order gain of the clipped
    step; "norm": the gradient norm): `first`'s mean over the mini-batches over `second`'s (the
    sample's size scales both gains alike: it cancels)."""

    def statistic(records: Sequence[Mapping[str, Any]]) -> float:
        means = [
            float(np.mean([batch_measures(r, name, 2)[measure] for r in records]))
            for name in (first, second)
        ]
        return means[0] / means[1] if means[1] else float("nan")

    return statistic


def fold_interval(
    records: Sequence[Mapping[str, Any]],
    statistic: Callable[[Sequence[Mapping[str, Any]]], float],
    level: float = 0.95,
) -> dict[str, float] | None:
    """A statistic of the mini-batches with its fold jackknife interval (`fold_statistic`,
    `paired_stats.fold_jackknife`); None where the records hold no folds or fewer than 2."""
    values = fold_statistic(records, statistic)
    return None if values is None else fold_jackknife(*values, level)
