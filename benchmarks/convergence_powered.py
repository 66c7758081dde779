"""The powered convergence study: does MRTPO learn tool calling faster than GDPO, and is it the
verifier's own information that does it? Design, pre-registered analysis and report.

The runs are `benchmarks/convergence.py`'s (same cold start recipe, data rule, training,
evaluation and resumption); this file fixes the design (`METHODS`, `SEEDS`, the settings in
`grid_argv`), writes the analysis plan (`PREREGISTRATION`) and the power calculation into the
study's `study.json` before the first run (a later run with another plan is refused), and
reads the results the way the plan says (`write_report`).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/convergence_powered.py           # resumable
    .venv/bin/python benchmarks/convergence_powered.py --report                    # report only
    .venv/bin/python benchmarks/convergence_powered.py --power                     # the sizing

Results: `benchmarks/results/convergence-powered/` (README.md, curves.png, diagnostics.png; per
run `tool_calling/<method>/seed<k>/`: metrics.jsonl, final_eval.json, run.json; the cold
start's evaluation in `tool_calling/cold_start/`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import convergence  # noqa: E402  (a sibling script, not a package)
import convergence_report  # noqa: E402
import convergence_runs  # noqa: E402
from paired_stats import holm, paired_power, paired_t  # noqa: E402  (the statistics, one place)

RESULTS = Path("benchmarks/results/convergence-powered")
FIRST_STUDY = Path("benchmarks/results/convergence")
SEEDS = tuple(range(6))
STEPS = 20
# β = 1 after a 2-step smoothstep warm-up (β 0, 0.5, then 1): MRTPO's difference from GDPO is
# linear in β, so the contrast is as large as the method allows.
MRTPO_SCHEDULE = {"mrtpo_beta": 1.0, "mrtpo_warmup_steps": 2}
METHODS: dict[str, dict[str, Any]] = {
    "gdpo": {"advantage_estimator": "gdpo"},
    "mrtpo": {"advantage_estimator": "mrtpo", **MRTPO_SCHEDULE},
    "mrtpo_shuffled": {
        "advantage_estimator": "mrtpo",
        "shuffle_token_weights": True,
        **MRTPO_SCHEDULE,
    },
    "mrtpo_placebo": {
        "advantage_estimator": "mrtpo",
        "replay_information": "placebo",
        **MRTPO_SCHEDULE,
    },
}
ENDPOINTS = ("tool_format", "tool_correctness")
CONTRASTS = (("mrtpo", "gdpo"), ("mrtpo", "mrtpo_shuffled"), ("mrtpo", "mrtpo_placebo"))
ALPHA = 0.05
NOT_REACHED = STEPS + 1  # steps to 0.8 of a run that never reaches it
# The paper (Figure 4, Qwen2.5-1.5B tool calling): median steps to a format reward of 0.8.
PAPER_STEPS_TO_THRESHOLD = {"mrtpo": 13, "gdpo": 19}

PREREGISTRATION = f"""\
Written before the first run and stored in `study.json` ("analysis"); a run with another plan
is refused.

- **Primary endpoints**: per seed, the AUC of the training `tool_format` and `tool_correctness`
  rewards: the mean over steps 1-{STEPS} of the step's mean reward (`rewards/<name>/mean`, 16
  responses a step).
- **Contrasts**, paired by seed: mrtpo - gdpo, mrtpo - mrtpo_shuffled, mrtpo - mrtpo_placebo;
  3 contrasts x 2 endpoints = 6 tests.
- **Test**: two-sided paired t-test over the {len(SEEDS)} seeds, Holm's step-down correction over
  the 6 p-values, family-wise α = {ALPHA}. **Estimates**: the mean difference with its 95% t
  interval (t with n - 1 degrees of freedom, not corrected).
- A seed enters a contrast once both of its runs have all {STEPS} steps. No seed or run is
  dropped or replaced; an interrupted run resumes from its checkpoint (its `run.json` says so).
- **Secondary** (reported, not part of the headline test): steps to a training `tool_format`
  of 0.8 (rolling mean of 3 steps; "not reached" counted as {NOT_REACHED}); the final policy on
  the study's test rows (6 samples each at temperature 1: format rate, correctness, exact
  calls) and on BFCL v4 simple_python, first 100 (greedy: exact calls, format), with the cold
  start's values beside them; paired differences with 95% t intervals, not corrected.
- **Diagnostics per step**: the share of rows whose `tool_format` and `tool_correctness` Ã
  have opposite signs (where MRTPO can differ from GDPO); per reward, the mean replay distance
  and its top-10% share; the share of rows where the bounded normalization engaged.
- **Reading**, fixed in advance; a contrast *differs* when at least one of its two endpoints
  is significant after Holm:
  - mrtpo differs from gdpo, from the placebo and from the shuffled weights: the verifier's own
    information placing credit matters (in the direction of the estimates);
  - mrtpo differs from gdpo but not from the placebo: any added context reweights tokens as
    well (this is then the headline);
  - mrtpo differs from gdpo and the placebo but not from the shuffled weights: the weights'
    spread matters, not where they fall;
  - mrtpo differs from none: no effect detected at this scale; the 95% t intervals of
    mrtpo - gdpo are stated as the bound on the effect;
  - any other pattern is reported as it is, with its direction.
"""


# ----------------------------------------------------------------------------- the grid


def grid_argv(jobs: int, threads: int, device: str) -> list[str]:
    """`benchmarks/convergence.py`'s arguments for this study (the design, in one place)."""
    argv = ["--results", str(RESULTS), "--methods", *METHODS, "--seeds", *map(str, SEEDS)]
    for name, overrides in METHODS.items():
        argv += ["--variant", f"{name}={json.dumps(overrides, sort_keys=True)}"]
    argv += ["--steps", str(STEPS), "--prompts", "4", "--generations", "4"]
    argv += ["--max_completion_length", "96", "--learning_rate", "1e-5", "--eval_cold_start"]
    return argv + ["--jobs", str(jobs), "--threads", str(threads), "--device", device]


# ----------------------------------------------------------------------------- the analysis


def auc(records: Sequence[Mapping[str, Any]], name: str, steps: int = STEPS) -> float | None:
    """The mean over steps 1..steps of `rewards/<name>/mean`; None until every step is logged."""
    values = convergence_report.curve(records, f"rewards/{name}/mean", steps)
    return None if np.isnan(values).any() else float(values.mean())


def steps_to_threshold(records: Sequence[Mapping[str, Any]], name: str) -> int | None:
    """Steps to a training `name` of 0.8 (rolling mean of 3); NOT_REACHED for a complete run
    that never gets there; None for an unfinished run that has not (yet)."""
    values = convergence_report.curve(records, f"rewards/{name}/mean", STEPS)
    done = values[~np.isnan(values)]
    reached = convergence_report.steps_to_threshold(list(done))
    if reached is not None:
        return reached
    return NOT_REACHED if len(done) == STEPS else None


def paired_differences(
    runs: Mapping[str, Mapping[int, Any]], first: str, second: str, value: Any
) -> dict[int, float]:
    """value(run of `first`) - value(run of `second`) per seed where both are known."""
    out = {}
    for seed in sorted(set(runs.get(first, {})) & set(runs.get(second, {}))):
        mine, theirs = value(runs[first][seed]), value(runs[second][seed])
        if mine is not None and theirs is not None:
            out[seed] = mine - theirs
    return out


def auc_tests(
    runs: Mapping[str, Mapping[int, Any]], contrasts: Sequence[tuple[str, str]]
) -> list[dict[str, Any]]:
    """Per contrast and endpoint: the paired AUC differences by seed and their paired t-test
    (None below 2 seeds)."""
    tests = []
    for first, second in contrasts:
        for name in ENDPOINTS:
            differences = paired_differences(
                runs, first, second, lambda run, name=name: auc(run["records"], name)
            )
            test = paired_t(list(differences.values())) if len(differences) > 1 else None
            tests.append(
                {
                    "contrast": (first, second),
                    "endpoint": name,
                    "differences": differences,
                    "test": test,
                }
            )
    return tests


def primary_tests(runs: Mapping[str, Mapping[int, Any]]) -> list[dict[str, Any]]:
    """The 6 pre-registered tests (`auc_tests` over CONTRASTS) with Holm's adjusted p over the
    tests that have at least 2 seeds."""
    tests = auc_tests(runs, CONTRASTS)
    adjusted = holm({index: t["test"]["p"] for index, t in enumerate(tests) if t["test"]})
    for index, test in enumerate(tests):
        test["holm_p"] = adjusted.get(index)
        test["significant"] = test["holm_p"] is not None and test["holm_p"] <= ALPHA
    return tests


def reading(tests: Sequence[Mapping[str, Any]], complete: bool) -> str:
    """The pre-registered reading of the 6 tests (see PREREGISTRATION)."""
    differs = {
        second: any(t["significant"] for t in tests if t["contrast"] == ("mrtpo", second))
        for _, second in CONTRASTS
    }
    prefix = "" if complete else "**Interim (the grid is not complete; not the result):** "
    if not any(t["test"] for t in tests):
        return prefix + "no contrast has two seeds with both runs finished yet."
    gdpo, placebo, shuffled = differs["gdpo"], differs["mrtpo_placebo"], differs["mrtpo_shuffled"]
    if gdpo and placebo and shuffled:
        text = "MRTPO differs from GDPO, from the placebo and from the shuffled weights: the verifier's own information placing credit matters."
    elif gdpo and not placebo:
        text = "MRTPO differs from GDPO but not from the placebo: any added context reweights tokens as well."
    elif gdpo and placebo and not shuffled:
        text = "MRTPO differs from GDPO and from the placebo but not from the shuffled weights: the weights' spread matters, not where they fall."
    elif not any(differs.values()):
        bounds = [
            f"{t['endpoint']} [{t['test']['low']:+.3f}, {t['test']['high']:+.3f}]"
            for t in tests
            if t["contrast"] == ("mrtpo", "gdpo") and t["test"]
        ]
        text = (
            "MRTPO differs from none of GDPO, the placebo and the shuffled weights: no effect "
            "detected at this scale. The 95% t intervals of the AUC difference MRTPO - GDPO bound "
            f"the effect: {'; '.join(bounds) or 'none computed yet'}."
        )
    else:
        which = [
            f"differs from {m}" if d else f"does not differ from {m}" for m, d in differs.items()
        ]
        text = "None of the patterns named in advance: MRTPO " + ", ".join(which) + "."
    significant = [t for t in tests if t["significant"]]
    if significant:
        text += (
            " Significant after Holm: "
            + "; ".join(
                f"{t['contrast'][0]} - {t['contrast'][1]} on {t['endpoint']} "
                f"{t['test']['mean']:+.3f} ({'higher' if t['test']['mean'] > 0 else 'lower'})"
                for t in significant
            )
            + "."
        )
    return prefix + text


# ----------------------------------------------------------------------------- power


def power_calculation(first_study: Path = FIRST_STUDY, seeds: int = len(SEEDS)) -> dict[str, Any]:
    """Power of the primary test for a paper-sized effect, from the first study's curves.

    Noise: the within-method SD of per-seed AUC over the first study's steps, pooled over its
    methods (a paired difference of two independent seeds has sqrt(2) times it; the measured
    mrtpo - gdpo differences are given beside). Effect: GDPO's slope b (least squares on the
    median curve over steps 1-15) and the paper's speed-up, steps to 0.8 of 13 for MRTPO
    against 19 for GDPO: learning 19/13 as fast adds b (19/13 - 1) t at step t, an AUC
    difference of b (19/13 - 1) mean(1..20). Power of a two-sided paired t-test with `seeds`
    pairs (noncentral t) at α = 0.05 and at Holm's first threshold α / 6.
    """
    data = convergence_report.load_results(first_study)
    steps = data["study"]["settings"]["steps"]
    speedup = PAPER_STEPS_TO_THRESHOLD["gdpo"] / PAPER_STEPS_TO_THRESHOLD["mrtpo"] - 1
    out: dict[str, Any] = {
        "source": str(first_study),
        "first_study_steps": steps,
        "seeds": seeds,
        "paper_speedup": speedup + 1,
    }
    for name in ENDPOINTS:
        residuals, degrees = [], 0
        for runs in data["runs"].values():
            values = [auc(run["records"], name, steps) for run in runs.values()]
            values = [v for v in values if v is not None]
            if len(values) > 1:
                residuals += list(np.asarray(values) - np.mean(values))
                degrees += len(values) - 1
        pooled = float(math.sqrt(np.sum(np.square(residuals)) / degrees))
        gdpo = [
            convergence_report.curve(run["records"], f"rewards/{name}/mean", steps)
            for run in data["runs"]["gdpo"].values()
        ]
        median = np.nanmedian(np.vstack(gdpo), axis=0)
        slope = float(np.polyfit(np.arange(1, steps + 1), median, 1)[0])
        effect = slope * speedup * float(np.mean(np.arange(1, STEPS + 1)))
        measured = paired_differences(
            data["runs"], "mrtpo", "gdpo", lambda run, name=name: auc(run["records"], name, steps)
        )
        sd_difference = math.sqrt(2) * pooled
        power = {
            label: paired_power(effect, sd_difference, seeds, alpha)
            for label, alpha in (("alpha_0.05", ALPHA), ("alpha_0.05/6", ALPHA / 6))
        }
        out[name] = {
            "pooled_auc_sd": pooled,
            "pooled_degrees_of_freedom": degrees,
            "difference_sd": sd_difference,
            "measured_mrtpo_minus_gdpo": measured,
            "measured_difference_sd": float(np.std(list(measured.values()), ddof=1))
            if len(measured) > 1
            else None,
            "gdpo_slope_per_step": slope,
            "paper_sized_auc_effect": effect,
            "power": power,
        }
    return out


def power_markdown(power: Mapping[str, Any]) -> str:
    lines = [
        f"From the first study's files (`{power['source']}`, {power['first_study_steps']} steps): "
        f"a paper-sized effect is MRTPO learning {power['paper_speedup']:.2f}x as fast as GDPO "
        f"(steps to 0.8: 13 against 19 in the paper's Figure 4); {power['seeds']} paired seeds.",
        "",
        "| endpoint | GDPO slope / step | paper-sized AUC effect | pooled AUC SD (df) | SD of a paired difference | measured mrtpo - gdpo SD | power, α = 0.05 | power, α = 0.05/6 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ENDPOINTS:
        part = power[name]
        lines.append(
            f"| {name} | {part['gdpo_slope_per_step']:.4f} | {part['paper_sized_auc_effect']:.3f} "
            f"| {part['pooled_auc_sd']:.3f} ({part['pooled_degrees_of_freedom']}) "
            f"| {part['difference_sd']:.3f} | {convergence_report._cell(part['measured_difference_sd'])} "
            f"| {part['power']['alpha_0.05']:.2f} | {part['power']['alpha_0.05/6']:.2f} |"
        )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the report


def primary_table(tests: Sequence[Mapping[str, Any]]) -> str:
    seeds = sorted({seed for t in tests for seed in t["differences"]})
    lines = [
        "| contrast | endpoint (AUC) | "
        + " | ".join(f"seed {s}" for s in seeds)
        + " | n | mean | 95% t interval | p | Holm p | significant |",
        "|---|---|" + "---:|" * (len(seeds) + 5) + "---|",
    ]
    for t in tests:
        cells = [convergence_report._cell(t["differences"].get(s), sign=True) for s in seeds]
        test = t["test"]
        summary = (
            f"{test['n']} | {test['mean']:+.3f} | [{test['low']:+.3f}, {test['high']:+.3f}] "
            f"| {test['p']:.3f} | {t['holm_p']:.3f} | {'yes' if t['significant'] else 'no'}"
            if test
            else f"{len(t['differences'])} | – | – | – | – | –"
        )
        lines.append(
            f"| {t['contrast'][0]} - {t['contrast'][1]} | {t['endpoint']} | "
            + " | ".join(cells)
            + f" | {summary} |"
        )
    return "\n".join(lines) + "\n"


def per_method_table(runs: Mapping[str, Mapping[int, Any]]) -> str:
    """Per method and seed: both AUCs and steps to 0.8."""
    lines = [
        "| method | seed | steps done | AUC tool_format | AUC tool_correctness | steps to 0.8 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for method, seeds in runs.items():
        for seed, run in sorted(seeds.items()):
            reached = steps_to_threshold(run["records"], ENDPOINTS[0])
            cell = (
                "–"
                if reached is None
                else "not reached (21)"
                if reached == NOT_REACHED
                else str(reached)
            )
            lines.append(
                f"| {method} | {seed} | {convergence_report._steps_done(run)} "
                f"| {convergence_report._cell(auc(run['records'], ENDPOINTS[0]))} "
                f"| {convergence_report._cell(auc(run['records'], ENDPOINTS[1]))} | {cell} |"
            )
    return "\n".join(lines) + "\n"


def secondary_table(data: Mapping[str, Any], cold_start: Mapping[str, Any] | None) -> str:
    """Medians per method of the secondary endpoints, the cold start beside; then the paired
    differences of each contrast with 95% t intervals (not corrected)."""
    runs = data["runs"]

    def steps(run: Mapping[str, Any]) -> float | None:
        value = steps_to_threshold(run["records"], ENDPOINTS[0])
        return None if value is None else float(value)

    metrics = [("steps to 0.8 (21: not reached)", steps)] + [
        (
            label,
            lambda run, part=part, metric=metric: convergence_report.eval_value(run, part, metric),
        )
        for part, metric, label in convergence_report.EVAL_COLUMNS
    ]
    lines = [
        "| metric | cold start | " + " | ".join(f"{m} (median)" for m in runs) + " |",
        "|---|---:|" + "---:|" * len(runs),
    ]
    for (label, value), column in zip(
        metrics, [None, *convergence_report.EVAL_COLUMNS], strict=True
    ):
        start = (
            convergence_report.eval_value({"eval": cold_start}, column[0], column[1])
            if column and cold_start
            else None
        )
        cells = []
        for seeds in runs.values():
            values = [v for v in (value(run) for run in seeds.values()) if v is not None]
            cells.append(
                f"{convergence_report._cell(float(np.median(values)) if values else None)} (n={len(values)})"
            )
        lines.append(
            # Steps to 0.8 is a property of a training run; the cold start has none.
            f"| {label} | {convergence_report._cell(start) if column else '–'} | "
            + " | ".join(cells)
            + " |"
        )
    lines += ["", "| contrast | metric | n | mean | 95% t interval |", "|---|---|---:|---:|---:|"]
    for first, second in CONTRASTS:
        for label, value in metrics:
            differences = list(paired_differences(runs, first, second, value).values())
            summary = paired_cells(differences)
            lines.append(f"| {first} - {second} | {label} | {len(differences)} | {summary} |")
    return "\n".join(lines) + "\n"


def paired_cells(differences: Sequence[float], digits: int = 3) -> str:
    """Two table cells: the mean of paired differences and its 95% t interval ("–" below 2)."""
    if len(differences) < 2:
        return "– | –"
    test = paired_t(differences)
    return f"{test['mean']:+.{digits}f} | [{test['low']:+.{digits}f}, {test['high']:+.{digits}f}]"


def evaluation_draw_note(runs: Mapping[str, Mapping[int, Any]]) -> str:
    """What the test-row evaluations' seeds allow: a run.json without `eval_seed` was sampled
    with seed 0, as `benchmarks/convergence.py` sampled every evaluation before each run got
    its own seed. With one seed for all, a limitation and, per method, test correctness's
    between-seed SD beside a run's own sampling SE."""
    evaluated = [run for seeds in runs.values() for run in seeds.values() if run["eval"]]
    seeds = {
        (run["run"] or {}).get("eval_seed", convergence_runs.COLD_START_EVAL_SEED)
        for run in evaluated
    }
    if len(evaluated) < 2 or len(seeds) > 1:
        return (
            "Each run's test rows were sampled with its own seed (1000 + its training seed, in "
            "its run.json).\n"
        )
    lines = [
        "| method | between-seed SD of test correctness | a run's sampling SE: mean (range) |",
        "|---|---:|---:|",
    ]
    below = []
    for method, method_runs in runs.items():
        tests = [run["eval"]["test"]["correctness"] for run in method_runs.values() if run["eval"]]
        if len(tests) < 2:
            continue
        spread = float(np.std([test["mean"] for test in tests], ddof=1))
        errors = [test["se"] for test in tests]
        if spread < np.mean(errors):
            below.append(f"`{method}`")
        lines.append(
            f"| {method} | {spread:.3f} | {np.mean(errors):.3f} "
            f"({min(errors):.3f}-{max(errors):.3f}) |"
        )
    table = "\n".join(lines)
    here = f"here it is below it for {', '.join(below) or 'no method'}"
    return f"""**Limitation: one sampling draw for every run's test rows.** Every run's final policy
was sampled on the test rows with seed {seeds.pop()} (`benchmarks/convergence.py` then used one
seed for every evaluation; a run now draws with 1000 + its training seed, recorded in its
run.json). Runs of similar policies then draw alike, so the seeds' evaluations are not
independent replicates of the evaluation's sampling noise. With independent draws, the
between-seed SD of test correctness would be expected at least as large as one run's sampling
SE (the training's own spread adds to it); {here}:

{table}

The secondary intervals on the test rows (format rate, correctness, exact calls) are therefore
too narrow: they leave part of the sampling noise out. BFCL simple_python is greedy and draws
nothing, and the primary endpoints, the training rewards, are not affected.
"""


EXPLORATORY_CONTRASTS = (("mrtpo_placebo", "gdpo"), ("mrtpo_shuffled", "gdpo"))


def exploratory_table(runs: Mapping[str, Mapping[int, Any]]) -> str:
    """The two controls against GDPO (not in the plan): both AUCs, paired by seed, with 95% t
    intervals and uncorrected p. They say whether a control that differs from MRTPO did so by
    falling below GDPO or MRTPO by rising above it; they never change the reading."""
    lines = [
        "| contrast | endpoint (AUC) | n | mean | 95% t interval | p (uncorrected) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for t in auc_tests(runs, EXPLORATORY_CONTRASTS):
        test = t["test"]
        summary = (
            f"{test['mean']:+.3f} | [{test['low']:+.3f}, {test['high']:+.3f}] | {test['p']:.3f}"
            if test
            else "– | – | –"
        )
        first, second = t["contrast"]
        lines.append(
            f"| {first} - {second} | {t['endpoint']} | {len(t['differences'])} | {summary} |"
        )
    return "\n".join(lines) + "\n"


DIAGNOSTICS = (
    ("mrtpo/opposite_sign_rows_share", "rows with opposite-sign Ã"),
    ("mrtpo/bounded_rows_share", "rows bounded"),
    *(
        (f"mrtpo/distance/{name}/{statistic}", f"{name} {label}")
        for name in ENDPOINTS
        for statistic, label in (
            ("mean", "distance"),
            (convergence_runs.TOP_SHARE_KEY, "top-10% share"),
        )
    ),
)


def diagnostics_table(
    runs: Mapping[str, Mapping[int, Any]], diagnostics: Sequence[tuple[str, str]] = DIAGNOSTICS
) -> str:
    """Per method and block of 5 steps: each diagnostic's (metric key, label) mean over the
    block's steps and the seeds (the per-step values are in each run's metrics.jsonl and in
    diagnostics.png)."""
    blocks = [(start, min(start + 4, STEPS)) for start in range(1, STEPS + 1, 5)]
    lines = [
        "| method | steps | " + " | ".join(label for _, label in diagnostics) + " |",
        "|---|---|" + "---:|" * len(diagnostics),
    ]
    for method, seeds in runs.items():
        if not seeds:  # an arm with no run logged yet
            continue
        for start, end in blocks:
            cells = []
            for key, _ in diagnostics:
                stacked = np.vstack(
                    [convergence_report.curve(run["records"], key, STEPS) for run in seeds.values()]
                )[:, start - 1 : end]
                cells.append(None if np.isnan(stacked).all() else float(np.nanmean(stacked)))
            if all(cell is None for cell in cells):
                continue
            lines.append(
                f"| {method} | {start}-{end} | "
                + " | ".join(convergence_report._cell(c) for c in cells)
                + " |"
            )
    return "\n".join(lines) + "\n"


def plot_curves(
    runs: Mapping[str, Mapping[int, Any]], cold_start: Mapping[str, Any] | None, path: Path
) -> None:
    """Figure 4 of our runs: each endpoint's training reward per step, median over seeds with
    the inter-quartile band per method; dotted: the cold start's level on the test rows."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.2), dpi=110)
    x = np.arange(1, STEPS + 1)
    for index, (name, metric) in enumerate(zip(ENDPOINTS, ("format", "correctness"), strict=True)):
        axes = figure.add_subplot(1, 2, index + 1)
        for method, seeds in runs.items():
            curves = [
                convergence_report.curve(run["records"], f"rewards/{name}/mean", STEPS)
                for run in seeds.values()
            ]
            if not curves or all(np.isnan(c).all() for c in curves):
                continue
            median, low, high = convergence_report.median_band(curves)
            done = sum(convergence_report._steps_done(run) >= STEPS for run in seeds.values())
            (line,) = axes.plot(x, median, label=f"{method} ({done}/{len(curves)} seeds done)")
            axes.fill_between(x, low, high, color=line.get_color(), alpha=0.15)
        level = (
            convergence_report.eval_value({"eval": cold_start}, "test", metric)
            if cold_start
            else None
        )
        if level is not None:
            axes.axhline(
                level, color="black", linestyle=":", linewidth=1, label="cold start (test rows)"
            )
        if index == 0:
            axes.axhline(convergence_runs.THRESHOLD, color="grey", linestyle="--", linewidth=0.8)
        axes.set_xlabel("step")
        axes.set_ylabel("training reward (mean of the step)")
        axes.set_title(name)
        axes.set_xticks(range(0, STEPS + 1, 5))
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, format="png")


def plot_diagnostics(runs: Mapping[str, Mapping[int, Any]], path: Path) -> None:
    """Per step, median over seeds: the opposite-sign share, the bounded share and each
    reward's mean replay distance."""
    from matplotlib.figure import Figure

    keys = [DIAGNOSTICS[0], DIAGNOSTICS[1], DIAGNOSTICS[2], DIAGNOSTICS[4]]
    figure = Figure(figsize=(16, 3.8), dpi=100)
    x = np.arange(1, STEPS + 1)
    for index, (key, label) in enumerate(keys):
        axes = figure.add_subplot(1, len(keys), index + 1)
        for method, seeds in runs.items():
            curves = [
                convergence_report.curve(run["records"], key, STEPS) for run in seeds.values()
            ]
            if curves and not all(np.isnan(c).all() for c in curves):
                axes.plot(x, convergence_report.median_band(curves)[0], marker=".", label=method)
        axes.set_title(label)
        axes.set_xlabel("step")
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, format="png")


def machines_table(runs: Mapping[str, Mapping[int, Any]]) -> str:
    """Per seed and method, from run.json: the CPU model of each start of training (a
    resumption adds one) and the cold start's weights digest (first 12 hex digits; recorded
    from 2026-12-03 on), so a reader sees which paired runs shared a machine and a build."""

    def cell(run: Mapping[str, Any] | None) -> str:
        sessions = ((run or {}).get("run") or {}).get("sessions") or []
        if not sessions:
            return "–"
        return "; ".join(
            f"{session['cpu']}, cold start {(session.get('cold_start_sha256') or 'not recorded')[:12]}"
            for session in sessions
        )

    lines = [
        "CPU of each start of training and the cold start's sha256 (first 12 hex digits): the",
        "cold start is rebuilt on every fresh machine, so seeds trained in different sessions",
        "may start from builds that differ in rounding.",
        "",
        "| seed | " + " | ".join(METHODS) + " |",
        "|---:|" + "---|" * len(METHODS),
    ]
    for seed in SEEDS:
        row = [cell(runs.get(method, {}).get(seed)) for method in METHODS]
        lines.append(f"| {seed} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def write_report(results: Path = RESULTS) -> Path:
    """README.md, curves.png and diagnostics.png in `results`, from its files alone."""
    results = Path(results)
    data = convergence_report.load_results(results)
    study, runs = data["study"], data["runs"]
    cold_start = convergence_runs._read_json(
        results / convergence_runs.TASK / "cold_start" / convergence_runs.EVAL_FILE
    )
    tests = primary_tests(runs)
    complete = (
        all(
            convergence_report._steps_done(runs.get(m, {}).get(s, {"records": []})) >= STEPS
            for m in METHODS
            for s in SEEDS
        )
        and all(runs[m][s]["eval"] for m in METHODS for s in SEEDS)
        and cold_start is not None
    )
    plot_curves(runs, cold_start, results / "curves.png")
    plot_diagnostics(runs, results / "diagnostics.png")
    trained = [
        run
        for seeds in runs.values()
        for run in seeds.values()
        if convergence_report._steps_done(run) >= STEPS
    ]
    # Finished = trained and evaluated; a run being evaluated is trained, not finished.
    done = sum(bool(run["eval"]) for run in trained)
    evaluating = len(trained) - done
    progress = (
        f"{done} of {len(METHODS) * len(SEEDS)} runs finished (trained and evaluated)"
        + (f", {evaluating} more trained and not yet evaluated" if evaluating else "")
        + f"; the cold start {'evaluated' if cold_start else 'not evaluated yet'}"
    )
    methods = "\n".join(
        f"- `{m}`: `{json.dumps(o, sort_keys=True)}`" for m, o in study["methods"].items()
    )
    settings = study["settings"]
    text = f"""# The powered convergence study: {convergence_runs.TASK}

Regenerated by `python benchmarks/convergence_powered.py --report` from the files in this
folder. The study (resumable; rerun to finish what is unfinished):

    {study["command"]}

Settings shared by every run: {settings["prompts"]} prompts x {settings["generations"]} completions
per step, {settings["max_completion_length"]} new tokens, learning rate {settings["learning_rate"]:g},
{settings["steps"]} steps, from the cold start of {settings["model_name_or_path"]}
({settings["sft_max_steps"]} SFT steps); device {settings["device"]}. Methods (`MRTPOConfig`
overrides; the MRTPO variants at β = 1 after a 2-step warm-up):

{methods}

Progress: {progress}.

## The analysis, as pre-registered

{study["analysis"]}
## Power (computed before the runs)

{power_markdown(study["power"])}
## Result

{reading(tests, complete)}

![training rewards](curves.png)

Median over seeds, band: inter-quartile range; dotted: the cold start on the test rows
(sampled, temperature 1); dashed: 0.8.

### Primary: AUC differences, paired by seed

{primary_table(tests)}
### Per run

{per_method_table(runs)}
### Secondary

{secondary_table(data, cold_start)}
{evaluation_draw_note(runs)}
### Exploratory: the controls against GDPO (not pre-registered)

Not part of the plan and not tested for the headline; shown so that a difference between MRTPO
and a control can be read in its direction (the control below GDPO, or MRTPO above it).

{exploratory_table(runs)}
## Diagnostics

![diagnostics](diagnostics.png)

{diagnostics_table(runs)}
## Time

{convergence_report.time_table(data)}
Each run's median step (TRL's `step_time`); the ratios to gdpo are taken per seed (a seed's
runs share a machine) and their median over seeds is shown; evaluation CPU s: the mean over
runs. The wall times count whatever else ran on the machine (the other lane at least).

## Where each run trained

{machines_table(runs)}"""
    path = results / "README.md"
    path.write_text(text)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs at once")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--report", action="store_true", help="only regenerate the report")
    parser.add_argument("--power", action="store_true", help="print the power calculation")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.power:
        print(power_markdown(power_calculation()))
        return 0
    if args.report:
        print(f"wrote {write_report()}")
        return 0
    grid = convergence_runs.parse_args(grid_argv(args.jobs, args.threads, args.device))
    # The plan and the sizing go into study.json before any run; record_study refuses a change.
    previous = (
        convergence_runs._read_json(RESULTS / convergence_runs.TASK / convergence_runs.STUDY_FILE)
        or {}
    )
    extra = {"analysis": PREREGISTRATION, "power": previous.get("power") or power_calculation()}
    failed = convergence.run_grid(grid, extra=extra, report=write_report)
    print(f"{failed} stage(s) failed" if failed else f"all runs finished; {RESULTS / 'README.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
