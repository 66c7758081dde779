"""`mrtpo_beta: auto` judged offline on the update-quality benchmark's mini-batches, cross-fitted
(issue #50, "How to judge it / Offline").

    .venv/bin/python benchmarks/beta_auto_offline.py            # print the judgement
    .venv/bin/python benchmarks/beta_auto_offline.py --report   # write it: README.md

**The directions.** A stored token-level direction is the variant's step at beta 1
(`update_quality_passes.estimator_advantages` sets `mrtpo_beta=1.0`), not its slope: MRTPO's
step is g(beta) = g_U + beta g_R = (1 - beta) g_gdpo + beta g_mrtpo, so g_U = g_gdpo and the
re-allocation's gradient is g_R = g_mrtpo - g_gdpo. Every dot product of a combination of the
two is a combination of the stored ones (`combination`); its cosine and clipped gain are the
benchmark's own (`update_quality_analysis.batch_measures`).

**The rule offline.** The trainer's agreement (`mrtpo.auto_beta.gradient_agreement`, the
trainer's own function) is the sign of the derivative in beta of the clipped step's cosine
with the reference: cos(g_R, T) - cos(g, T) cos(g, g_R) at the step g = g_U + beta g_R, T the
reference. Its sums come from the stored numbers (`batch_sums`): <g_R, T> and <g_U, T> from the
dots with the references (`combination`), |g_R|^2 = norm2_mrtpo - 2 dot_gdpo + norm2_gdpo,
|g_U|^2 = norm2_gdpo, <g_U, g_R> = dot_gdpo - norm2_gdpo, |T|^2 from the reference's Gram
matrix. A state measured with F folds (mini-batch b in fold b % F, each reference kept per
fold: R_g^{-b} is fold g's part of b's leave-one-out reference of the summed reward, less b's
own part where b is in g). For each fold f, from beta = 0:

1. the agreements at beta of every mini-batch c outside f, against its reference
   sum_{g != f} R_g^{-c} (undefined ones, |g_R^c| = 0, dropped, as the trainer drops a probe
   without one);
2. their mean, standard error and one-sided 95% lower bound: `mrtpo.auto_beta.
   agreement_bound`, the trainer's own function (Student's t from its table);
3. while the bound is above 0 and beta below beta_max (1, `mrtpo_beta_max`'s default), beta
   rises by 0.1 (`mrtpo_beta_step`'s default) and the agreements are taken again at the new
   beta; beta_f is where this walk stops (0 where the bound at 0 is not above 0);
4. every mini-batch b of fold f is judged at the auto step g_U^b + beta_f g_R^b.

Neither side of the choice holds a sample of fold f: the g_R^c and g_U^c are of other folds'
mini-batches, their references leave fold f out.

**Why the walk.** The trainer moves beta by `mrtpo_beta_step` after each probe, up while the
window's bound at the beta it trained with is above 0, down otherwise, within [0, beta_max].
The agreement depends on beta (the cosine of the step can peak between 0 and 1), so on one
policy the rule climbs from 0 until the bound stops being positive and then hovers between
that beta and one step below (or stays at 0, or at beta_max); the walk is that climb, and
beta_f the highest beta it reaches. Every other fold's agreement enters the bound, not the
last 8 (`mrtpo_beta_window`): the window forgets probes of earlier policies (and of other
betas), and here every probe is of the same policy at the same beta. What it cannot mirror:
the sequential steps (a run starts at 0, its first probe has no bound, and with the defaults
the powered study's 20 steps allow at most 0.4, at steps 18-20:
`beta_auto_training.beta_ceiling`), so this judges the beta the rule heads for, not the one a
20-step run trains at; the policy moving under the probes; the window of 8, whose bound flips
sign more often than a bound over every fold (the report prints, at beta 0, the bound 8
agreements of the same mean and SD would have); the warm-up's cap. A probe pools a step's
micro-batches; here a probe is one mini-batch, the training shape.

**The reference.** The trainer's reference is the summed reward's policy gradient (each row's
reward less its group's other rows' mean, on every trained token) summed over the step's other
micro-batches; here it is the benchmark's reference, the summed reward's leave-one-out policy
gradient of the other mini-batches: the same estimate, from more samples (every other
mini-batch rather than a step's few micro-batches). The records hold no dot product of one
mini-batch's g_R with another's g_U, and none is needed: each direction is stored through its
dots with the references and `dot_gdpo`, its dot with gdpo's step of the same responses, which
gives <g_U, g_R> of the same mini-batch, as the trainer's probe takes it.

**The judgement.** Per state, mini-batch b in fold f: the auto step's cosine with b's reference
(every fold, less b: the benchmark's primary endpoint) and its clipped first-order gain, paired
with gdpo's and mrtpo(0.25), (0.5), (1)'s on the same mini-batch. Cosine: the mean paired
difference; gain: the mean gain over the other's, less 1 (the mean paired difference over the
other's mean gain; none where the other's mean gain is not shown to be above or below 0, its
own interval holding 0: a ratio to a gain that may be 0 can take any size, and the report says
so instead). Intervals: the fold jackknife (`paired_stats.fold_jackknife`), fold f' out of the
mini-batches, of every reference and of every choice (beta re-chosen without it), t on F - 1
degrees of freedom. b's whole reference holds the other folds, whose agreements chose
beta_f; the cosine with b's own fold's part alone, which no evidence of the choice entered, is
printed beside it (noisier: a fold's prompts only).

**Goals** (the issue's): SmolLM2 tool calling, auto not below gdpo beyond its interval: the
95% interval's upper end of auto - gdpo is at least 0 for the cosine and for the gain. Qwen SQL,
auto at least mrtpo(0.5): the mean of auto - mrtpo(0.5) is at least 0 for both (no tolerance
is named; the interval is printed).

**Data.** SmolLM2 tool calling and Qwen SQL measured again with folds (`update-quality/folds/`),
qwen_instructions (the second plan, with folds). The first plan's measures have no folds: each
other mini-batch's reference holds the judged mini-batch's samples, so no beta chosen from
their agreements is blind to it; they are shown in sample, as a preview, not as a judgement.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from paired_stats import fold_jackknife
from update_quality_analysis import batch_measures, fold_statistic, load_measures, restricted
from update_quality_plan2 import FOLDS_RESULTS, PLAN_2_STATES
from update_quality_plan2_report import NOT_YET, _table, _test_cell
from update_quality_states import RESULTS, STATES

from mrtpo.auto_beta import agreement_bound, gradient_agreement, t_quantile_95

OUT = Path("benchmarks/results/beta-auto-offline")
REPORT = "README.md"
COMMAND = ".venv/bin/python benchmarks/beta_auto_offline.py --report"
VARIANT = "mrtpo"  # the token-level variant whose slope g_R the rule weighs
BETA_MAX = 1.0  # `mrtpo_beta_max`'s default
STEP = 0.1  # `mrtpo_beta_step`'s default: the walk's step (`walk`)
WINDOW = 8  # `mrtpo_beta_window`'s default: only the report's column
AUTO = "auto"
COMPARED = ("gdpo", "mrtpo(0.25)", "mrtpo(0.5)", "mrtpo(1)")
# The goals' forms ({}: the estimator auto is held against).
NOT_BELOW, AT_LEAST = "not below {}'s beyond its interval", "at least {}'s"
_QWEN = "--reward_references none --recompute --store_dtype bfloat16 --rows_per_forward 4"


def _folds_command(state: str, flags: str) -> str:
    """How a first-plan state is measured again with folds (benchmarks/README.md)."""
    return (
        f"the folds re-measurement: copy `{state}/power.json` and `{state}/main/samples/` into "
        f"`folds/{state}/`, then `OMP_NUM_THREADS=1 .venv/bin/python benchmarks/update_quality.py "
        f"--state {state} --sample main {flags} --results benchmarks/results/update-quality/folds`"
    )


@dataclass(frozen=True)
class Source:
    """Where a state's folded measures live and how they are made; its goal, if the issue
    sets one: (the estimator auto is held against, NOT_BELOW or AT_LEAST)."""

    folder: str  # under the update-quality results: FOLDS_RESULTS, or "" (the folder itself)
    needs: str  # what measures it (benchmarks/README.md, "Update quality")
    goal: tuple[str, str] | None


SOURCES: dict[str, Source] = {
    "smollm2_tool_calling": Source(
        FOLDS_RESULTS,
        _folds_command("smollm2_tool_calling", "--rows_per_forward 4"),
        ("gdpo", NOT_BELOW),
    ),
    "qwen_sql": Source(
        FOLDS_RESULTS,
        _folds_command("qwen_sql", _QWEN),
        ("mrtpo(0.5)", AT_LEAST),
    ),
    "qwen_instructions": Source(
        "",
        "the second plan's main sample: `.venv/bin/python benchmarks/update_quality.py --state "
        f"qwen_instructions --sample main {_QWEN}` (after its pilot, `--decide_cap` "
        "and `--power`)",
        None,
    ),
}


# ----------------------------------------------------------------------------- the rule


def combination(
    record: Mapping[str, Any], gdpo_weight: float, variant_weight: float, variant: str = VARIANT
) -> dict[str, Any]:
    """The stored entry of a g_gdpo + b g_variant on one mini-batch (a = gdpo_weight,
    b = variant_weight): its dots with the references (ref_dots [K], ref_fold_dots [K, F],
    reward_dots [K'] where kept) are linear in the two entries', its squared norm and its dot
    with gdpo's bilinear (from norm2 and dot_gdpo). (1 - beta, beta): the step at beta;
    (-1, 1): the slope g_R. At a weight of exactly 0 the other entry's numbers come back as
    stored."""
    gdpo, other = record["directions"]["gdpo"], record["directions"][variant]
    a, b = gdpo_weight, variant_weight
    entry = {
        key: (
            a * np.asarray(gdpo[key], dtype=float) + b * np.asarray(other[key], dtype=float)
        ).tolist()
        for key in ("ref_dots", "ref_fold_dots", "reward_dots")
        if key in other
    }
    cross = other["dot_gdpo"]
    entry["norm2"] = a * a * gdpo["norm2"] + 2 * a * b * cross + b * b * other["norm2"]
    entry["dot_gdpo"] = a * gdpo["norm2"] + b * cross
    return entry


def measures_of(
    record: Mapping[str, Any], entry: Mapping[str, Any], folds: Sequence[int] | None = None
) -> dict[str, Any]:
    """`batch_measures` of a direction given by its stored entry (`combination`), against the
    record's reference, or its restriction to `folds`. The entry stands in gdpo's place, which
    `batch_measures` reads as stored (no blend): the benchmark's cosine and gain, unchanged."""
    alone = {**record, "directions": {"gdpo": entry}}
    return batch_measures(alone if folds is None else restricted(alone, folds), "gdpo", 2)


def batch_sums(record: Mapping[str, Any], folds: Sequence[int] | None = None) -> dict[str, float]:
    """`gradient_agreement`'s sums of one mini-batch: g_U gdpo's stored direction, g_R =
    g_mrtpo - g_gdpo (`combination`), the reference T restricted to `folds` (None: as the record
    holds it); the summed reward's reference with every reward's weight 1, as `batch_measures`."""
    slope, uniform = combination(record, -1.0, 1.0), record["directions"]["gdpo"]
    dots = []
    for entry in (slope, uniform):
        alone = {**record, "directions": {"gdpo": entry}}
        alone = alone if folds is None else restricted(alone, folds)
        dots.append(float(np.sum(alone["directions"]["gdpo"]["ref_dots"])))
    return {
        "reallocation_dot": dots[0],
        "uniform_dot": dots[1],
        "reallocation_sq": slope["norm2"],
        "uniform_sq": uniform["norm2"],
        "cross": slope["dot_gdpo"],
        "reference_sq": float(np.sum(alone["ref_gram"])),
    }


def agreement(
    record: Mapping[str, Any], folds: Sequence[int] | None = None, beta: float = 0.0
) -> float:
    """The trainer's agreement at `beta` (`gradient_agreement` of `batch_sums`): cos(g_R, T) -
    cos(g, T) cos(g, g_R), g = g_U + beta g_R; NaN where |g_R|, T or g is 0."""
    return gradient_agreement(**batch_sums(record, folds), beta=beta)


def fold_agreements(
    records: Sequence[Mapping[str, Any]], fold: int, kept: Sequence[int], beta: float = 0.0
) -> list[float]:
    """The evidence for fold `fold`'s beta at `beta`: the agreement of every mini-batch outside
    it with its reference restricted to the folds in `kept` but `fold`; undefined ones dropped."""
    folds = [g for g in kept if g != fold]
    values = [agreement(r, folds, beta) for r in records if r["fold"] != fold]
    return [value for value in values if not math.isnan(value)]


def window_bound(mean: float, se: float, n: int, window: int = WINDOW) -> float:
    """The one-sided 95% lower bound that `window` agreements of this mean and SD would have
    (the SD from the standard error of n: se sqrt(n)); NaN where se is."""
    return mean - t_quantile_95(window - 1) * se * math.sqrt(n / window)


def walk(
    evidence: Callable[[float], Sequence[float]], beta_max: float, step: float = STEP
) -> tuple[float, float]:
    """(beta, its bound) where the rule's climb stops (the module's docstring): from 0, up by
    `step` (at most beta_max) while the bound of `evidence(beta)`, the agreements at beta, is
    above 0 (NaN, fewer than 2: no rise)."""
    beta = 0.0
    while True:
        lower = agreement_bound(evidence(beta))[2]
        if not lower > 0 or beta >= beta_max:
            return beta, lower
        beta = min(beta_max, round(beta + step, 12))


def fold_choice(
    records: Sequence[Mapping[str, Any]], fold: int, kept: Sequence[int], beta_max: float
) -> dict[str, Any]:
    """Fold `fold`'s beta by the rule (the module's docstring), with the evidence at beta 0
    (n, mean, SE, lower bound, a window's bound: `window_bound`) and the bound where it
    stopped."""
    values = fold_agreements(records, fold, kept)
    mean, se, lower = agreement_bound(values)
    beta, stop = walk(lambda b: fold_agreements(records, fold, kept, b), beta_max)
    return {
        "fold": fold,
        "batches": sum(r["fold"] == fold for r in records),
        "agreements": len(values),
        "mean": mean,
        "se": se,
        "lower": lower,
        "window_lower": window_bound(mean, se, len(values)),
        "beta": beta,
        "stop_lower": stop,
    }


def kept_folds(records: Sequence[Mapping[str, Any]], measured: set[int]) -> list[int]:
    """The folds the records' references still hold: every fold but those measured and absent
    from `records` (`fold_statistic` leaves a fold out of both; a fold none of whose
    mini-batches is measured yet is in every reference and never left out)."""
    present = {r["fold"] for r in records}
    return [g for g in range(records[0]["folds"]) if g in present or g not in measured]


def choices(
    records: Sequence[Mapping[str, Any]], measured: set[int], beta_max: float = BETA_MAX
) -> dict[int, dict[str, Any]]:
    """{fold: `fold_choice`} for every fold present in `records`."""
    kept = kept_folds(records, measured)
    return {
        f: fold_choice(records, f, kept, beta_max) for f in sorted({r["fold"] for r in records})
    }


# ----------------------------------------------------------------------------- the judgement


def statistics(
    measured: set[int], beta_max: float = BETA_MAX
) -> Callable[[Sequence[Mapping[str, Any]]], dict[str, float]]:
    """The judgement's statistics of a set of mini-batches, beta chosen per fold from them
    (`choices`), as one dict (`fold_statistic` hands back what the statistic returns):
    "cosine/<X>": mean cosine of auto - X; "gain/<X>": mean gain of auto over X's, less 1;
    "base_gain/<X>": X's mean gain, up to a positive factor (`batch_measures` with 2 for the
    sample's size: only its sign and its interval's are read; where that interval holds 0,
    "gain/<X>" means nothing);
    "own_fold/<X>": mean cosine difference with each mini-batch's own fold's reference alone;
    "mean/<name>": the mean cosine of auto and of each X. `measured`: the folds of the whole
    sample (`kept_folds`)."""

    def statistic(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        chosen = choices(records, measured, beta_max)
        betas = [chosen[r["fold"]]["beta"] for r in records]
        steps = [combination(r, 1 - beta, beta) for r, beta in zip(records, betas, strict=True)]
        auto = [measures_of(r, e) for r, e in zip(records, steps, strict=True)]
        own = [measures_of(r, e, [r["fold"]]) for r, e in zip(records, steps, strict=True)]
        out = {f"mean/{AUTO}": float(np.mean([m["cosine"] for m in auto]))}
        for name in COMPARED:
            other = [batch_measures(r, name, 2) for r in records]
            alone = [batch_measures(restricted(r, [r["fold"]]), name, 2) for r in records]
            gain = float(np.mean([m["gain"] for m in other]))
            out[f"cosine/{name}"] = float(
                np.mean([a["cosine"] - o["cosine"] for a, o in zip(auto, other, strict=True)])
            )
            out[f"gain/{name}"] = (
                float(np.mean([m["gain"] for m in auto])) / gain - 1 if gain else math.nan
            )
            out[f"base_gain/{name}"] = gain
            out[f"own_fold/{name}"] = float(
                np.mean([a["cosine"] - o["cosine"] for a, o in zip(own, alone, strict=True)])
            )
            out[f"mean/{name}"] = float(np.mean([m["cosine"] for m in other]))
        return out

    return statistic


def usable(records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the records can be judged: every one measured with folds (at least 2 of them
    measured) and with the variant's direction."""
    return (
        bool(records)
        and all("ref_fold_gram" in r and VARIANT in r["directions"] for r in records)
        and len({r["fold"] for r in records}) >= 2
    )


def judge(records: Sequence[Mapping[str, Any]], beta_max: float = BETA_MAX) -> dict[str, Any]:
    """A state's judgement: the folds' choices on the whole sample and every statistic's fold
    jackknife interval ({key: `fold_jackknife`}); `usable` records only."""
    measured = {r["fold"] for r in records}
    full, deleted = fold_statistic(records, statistics(measured, beta_max))
    intervals = {key: fold_jackknife(full[key], [d[key] for d in deleted]) for key in full}
    return {
        "batches": len(records),
        "planned": records[0].get("sample_batches", len(records)),
        "folds": records[0]["folds"],
        "choices": list(choices(records, measured, beta_max).values()),
        "intervals": intervals,
    }


def goal(state: str, judged: Mapping[str, Any] | None) -> tuple[bool | None, str]:
    """(holds, the sentence) of the state's goal; holds None where it is not judged: not
    measured, or measured in part (interim numbers judge nothing)."""
    compared, kind = SOURCES[state].goal
    what = f"auto {kind.format(compared)} (cosine and gain of the clipped step)"
    if judged is None:
        return None, f"{what}: not judged, {NOT_YET}"
    intervals = judged["intervals"]
    cosine, gain = intervals[f"cosine/{compared}"], intervals[f"gain/{compared}"]
    if judged["batches"] < judged["planned"]:
        return None, (
            f"{what}: not judged before all {judged['planned']} mini-batches are measured "
            f"({judged['batches']} so far; interim: auto - {compared} cosine "
            f"{_test_cell(cosine)}, gain {_gain_cell(intervals, compared)})"
        )
    end = "high" if kind == NOT_BELOW else "mean"
    # A relative gain to a gain not shown to differ from 0 judges nothing: the cosine alone.
    gain_holds = gain[end] >= 0 if relative_gain_defined(intervals, compared) else True
    holds = cosine[end] >= 0 and gain_holds
    return holds, (
        f"{what}: {'holds' if holds else 'does not hold'} (auto - {compared}: cosine "
        f"{_test_cell(cosine)}, gain {_gain_cell(intervals, compared)}; judged on the "
        f"{'upper ends of the intervals' if kind == NOT_BELOW else 'means'})"
    )


# ----------------------------------------------------------------------------- the report


def state_records(results: Path, state: str, folder: str | None = None) -> list[dict[str, Any]]:
    """The state's main-sample measures from `folder` under the update-quality results
    (default its source's: `SOURCES`); [] where none."""
    folder = SOURCES[state].folder if folder is None else folder
    root = Path(results) / folder if folder else Path(results)
    return load_measures(root, [state]).get(state, {}).get("main", [])


def relative_gain_defined(intervals: Mapping[str, Mapping[str, float]], compared: str) -> bool:
    """Whether auto's gain relative to `compared`'s means anything: `compared`'s own mean gain
    is shown above or below 0 (its fold-jackknife interval does not hold 0)."""
    base = intervals[f"base_gain/{compared}"]
    return not base["low"] <= 0 <= base["high"]


def _gain_cell(intervals: Mapping[str, Mapping[str, float]], compared: str) -> str:
    if not relative_gain_defined(intervals, compared):
        return f"none: {compared}'s mean gain is not shown to differ from 0 (its interval holds 0)"
    test = intervals[f"gain/{compared}"]
    return f"{test['mean']:+.1%} [{test['low']:+.1%}, {test['high']:+.1%}]"


def _number(value: float, form: str = "+.4f") -> str:
    return "–" if math.isnan(value) else format(value, form)


def state_lines(state: str, records: Sequence[Mapping[str, Any]]) -> list[str]:
    """A state's section: its status, or the folds' betas and the comparisons."""
    lines = [f"## {state}", ""]
    if not records:
        return [*lines, f"{NOT_YET} (needs {SOURCES[state].needs}).", ""]
    if not usable(records):
        return [
            *lines,
            f"Measured without folds, or without `{VARIANT}`: not judged ({NOT_YET} with folds: "
            f"needs {SOURCES[state].needs}).",
            "",
        ]
    judged = judge(records)
    lines += [
        f"{judged['batches']} mini-batches measured (of {judged['planned']} planned) in "
        f"{judged['folds']} folds"
        + ("." if judged["batches"] >= judged["planned"] else ": interim numbers."),
        "",
        "Each fold's beta, from the other folds' agreements with references without it (at "
        "beta 0, and the bound where the walk stopped):",
        "",
    ]
    header = ["fold", "its mini-batches", "agreements", "mean", "SE", "95% lower bound"]
    header += [f"a window of {WINDOW}'s bound", "beta", "bound at beta"]
    rows = [
        [
            str(c["fold"]),
            str(c["batches"]),
            str(c["agreements"]),
            _number(c["mean"]),
            _number(c["se"], ".4f"),
            _number(c["lower"]),
            _number(c["window_lower"]),
            f"{c['beta']:g}",
            _number(c["stop_lower"]),
        ]
        for c in judged["choices"]
    ]
    lines += [*_table(header, rows), ""]
    intervals = judged["intervals"]
    header = [
        "auto -",
        "cosine [fold-jackknife 95% interval] (n: folds)",
        "gain of the clipped step, relative [95%]",
        "cosine with the own fold's reference alone [95%]",
    ]
    rows = [
        [
            name,
            _test_cell(intervals[f"cosine/{name}"]),
            _gain_cell(intervals, name),
            _test_cell(intervals[f"own_fold/{name}"]),
        ]
        for name in COMPARED
    ]
    means = ", ".join(
        f"{name} {intervals[f'mean/{name}']['mean']:.4f}" for name in (AUTO, *COMPARED)
    )
    lines += [*_table(header, rows), "", f"Mean cosines: {means}.", ""]
    if SOURCES[state].goal is not None:
        lines += [f"Goal: {goal(state, judged)[1]}.", ""]
    return lines


def in_sample_lines(results: Path) -> list[str]:
    """The first plan's fold-less measures: each mini-batch's agreement at beta 0 with its
    whole reference, their bound and the beta the rule's walk reaches in sample (not a
    judgement)."""
    header = ["state", "mini-batches", "mean agreement", "SE", "95% lower bound"]
    header += [f"a window of {WINDOW}'s bound", "mean cos(g_R, T)", "beta in sample"]
    rows = []
    for state in STATES:
        records = [r for r in state_records(results, state, "") if VARIANT in r["directions"]]
        if not records:
            rows.append([state, NOT_YET, *["–"] * (len(header) - 2)])
            continue

        def evidence(beta: float, records: list[dict[str, Any]] = records) -> list[float]:
            values = (agreement(r, beta=beta) for r in records)
            return [a for a in values if not math.isnan(a)]

        values = evidence(0.0)
        mean, se, lower = agreement_bound(values)
        cosines = [measures_of(r, combination(r, -1.0, 1.0))["cosine"] for r in records]
        rows.append(
            [
                state,
                str(len(records)),
                _number(mean),
                _number(se, ".4f"),
                _number(lower),
                _number(window_bound(mean, se, len(values))),
                _number(float(np.nanmean(cosines))),
                f"{walk(evidence, BETA_MAX)[0]:g}",
            ]
        )
    return [
        "## The first plan's measures, in sample (not a judgement)",
        "",
        "Measured without folds, each mini-batch's reference is one sum over every other "
        "mini-batch: the reference of every mini-batch whose agreement would choose a beta "
        "holds the samples of the mini-batch that beta is judged on, so nothing here is "
        "cross-fitted. Each mini-batch's agreement at beta 0 with its whole reference T, "
        "cos(g_R, T) - cos(g_U, T) cos(g_U, g_R), beside the cosine cos(g_R, T) alone (the "
        "rule before issue #50's revision asked only for its sign), and the beta the rule's "
        "walk reaches from all of them, a preview of what the folds will be asked:",
        "",
        *_table(header, rows),
        "",
        "At beta 1 the auto step is mrtpo(1)'s, at 0 gdpo's: their contrasts on these "
        "mini-batches are the first plan's report's (`benchmarks/results/update-quality/"
        "README.md`).",
        "",
    ]


def report_text(results: Path = RESULTS) -> str:
    """The report, from the update-quality results files under `results` alone."""
    records = {state: state_records(results, state) for state in SOURCES}
    verdicts = []
    for state, source in SOURCES.items():
        if source.goal is not None:
            judged = judge(records[state]) if usable(records[state]) else None
            verdicts.append(f"- {state}: {goal(state, judged)[1]}.")
    doc = (__doc__ or "").split("\n\n")
    first = next(i for i, part in enumerate(doc) if part.startswith("**The directions."))
    last = next(i for i, part in enumerate(doc) if part.startswith("**Data."))
    lines = [
        "# `mrtpo_beta: auto` offline: the update-quality mini-batches, cross-fitted",
        "",
        f"Generated by `{COMMAND}` from the update-quality results files alone (issue #50, "
        f'"How to judge it / Offline"): `benchmarks/results/update-quality/{FOLDS_RESULTS}/` '
        "(SmolLM2 tool calling and Qwen SQL measured again with folds), "
        f"`benchmarks/results/update-quality/` ({', '.join(PLAN_2_STATES)}; the first plan's "
        "fold-less measures, in sample only). The code: `benchmarks/beta_auto_offline.py`.",
        "",
        "## Goals",
        "",
        *verdicts,
        "",
        "## The rule and the judgement",
        "",
        *(line for part in doc[first:last] for line in (part, "")),
    ]
    for state in SOURCES:
        lines += state_lines(state, records[state])
    lines += in_sample_lines(results)
    return "\n".join(lines)


def write_report(results: Path = RESULTS, out: Path = OUT) -> Path:
    """`README.md` in `out`, from the files under `results` alone."""
    path = Path(out) / REPORT
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report_text(results))
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="update-quality results")
    parser.add_argument("--out", type=Path, default=OUT, help="where --report writes README.md")
    parser.add_argument("--report", action="store_true", help=f"write {REPORT} into --out")
    args = parser.parse_args(argv)
    if args.report:
        print(write_report(args.results, args.out))
    else:
        print(report_text(args.results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
