"""The SQL training study's analysis and report (issue #47), from its results files alone:
the primary paired tests with Holm, the noise check after 3 seeds, the per-run, secondary,
diagnostic and cost tables, the step measured at gdpo seed 0 after 10 steps (item 2:
`sql_training_study_step.py`), the figures, and README.md (`python benchmarks/sql_training_study.py
--report`, byte for byte from the files). The design it reads is `sql_training_study_plan.py`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import convergence_powered  # noqa: E402  (Holm, paired differences)
import convergence_report  # noqa: E402
import convergence_runs  # noqa: E402
from paired_stats import holm, paired_power, paired_t  # noqa: E402  (the statistics, one place)
from sql_training_study_plan import (  # noqa: E402  (the design, one place)
    ALPHA,
    ARMS,
    BASELINE,
    CHECK_AFTER_SEEDS,
    DIAGNOSTICS,
    ENDPOINTS,
    EXECUTION,
    LEARNING_RATES,
    LEVEL,
    NOT_REACHED,
    PILOT_SEED,
    PILOT_STEPS,
    PLAN_FILE,
    PROPOSED,
    RESULTS,
    SEEDS,
    STEPS,
    SUMMED,
    TASK,
    WINDOW,
    area,
    fmt_rate,
    learned_area,
    load_pilot,
    load_pilot_runs,
    pilot_rule,
    prediction,
    study_results,
)
from sql_training_study_step import step_section  # noqa: E402  (item 2: the step at step 10)

# ----------------------------------------------------------------------------- the analysis


def load_study(results: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """The study's runs {arm: {seed: run}} (convergence_report.load_results), empty before it starts."""
    root = study_results(results)
    if not (root / TASK / convergence_runs.STUDY_FILE).is_file():
        return {}
    return convergence_report.load_results(root, TASK)["runs"]


def complete_seeds(runs: Mapping[str, Mapping[int, Any]]) -> list[int]:
    """Seeds whose two runs both have all STEPS steps."""
    return [
        seed
        for seed in SEEDS
        if all(
            convergence_report._steps_done(runs.get(arm, {}).get(seed, {"records": []})) >= STEPS
            for arm in ARMS
        )
    ]


def gdpo_learned_area(runs: Mapping[str, Mapping[int, Any]], key: str, seeds: Sequence[int]) -> float | None:  # fmt: skip
    values = [learned_area(runs[BASELINE][seed]["records"], key) for seed in seeds]
    return float(np.mean(values)) if values else None


def primary_tests(runs: Mapping[str, Mapping[int, Any]]) -> list[dict[str, Any]]:
    """Per endpoint: the paired AUC differences mrtpo - gdpo by seed, their paired t-test (from
    2 seeds), Holm's adjusted p over the endpoints tested, and the prediction in reward units."""
    share = prediction()["share_central"]
    seeds = complete_seeds(runs)
    tests = []
    for key in ENDPOINTS:
        differences = convergence_powered.paired_differences(
            {arm: {s: runs[arm][s] for s in seeds} for arm in ARMS},
            PROPOSED,
            BASELINE,
            lambda run, key=key: area(run["records"], key),
        )
        rise = gdpo_learned_area(runs, key, seeds)
        tests.append(
            {
                "endpoint": key,
                "differences": differences,
                "test": paired_t(list(differences.values()))
                if len(differences) > 1
                else None,  # fmt: skip
                "gdpo_learned_area": rise,
                "predicted": None if rise is None else share * max(rise, 0.0),
            }
        )
    adjusted = holm({t["endpoint"]: t["test"]["p"] for t in tests if t["test"]})
    for test in tests:
        test["holm_p"] = adjusted.get(test["endpoint"])
        test["significant"] = test["holm_p"] is not None and test["holm_p"] <= ALPHA
    return tests


def reading(test: Mapping[str, Any]) -> str:
    """The plan's reading of one endpoint, and prediction against outcome."""
    result = test["test"]
    if result is None:
        return "not tested yet (fewer than 2 complete seeds)"
    if test["significant"]:
        text = "MRTPO learns faster" if result["mean"] > 0 else "MRTPO learns slower"
    else:
        text = f"no difference shown; the 95% t interval bounds it: [{result['low']:+.4f}, {result['high']:+.4f}]"  # fmt: skip
    predicted = test["predicted"]
    if predicted is None:
        return text
    if result["low"] <= predicted <= result["high"]:
        versus = "consistent with the prediction"
    elif result["high"] < predicted:
        versus = "smaller than predicted"
    else:
        versus = "larger than predicted"
    return f"{text}; {versus} ({predicted:+.4f})"


def noise_check(runs: Mapping[str, Mapping[int, Any]], plan: Mapping[str, Any]) -> str:
    """From CHECK_AFTER_SEEDS complete seeds: the measured SD of each endpoint's paired AUC
    difference, as a share of gdpo's learned area, against the sizing's assumption, and the
    power of the 5-seed plan for the central prediction under the measured SD."""
    seeds = complete_seeds(runs)
    assumed = plan["sizing"]["assumed_sd_share"]
    if len(seeds) < CHECK_AFTER_SEEDS:
        return f"(after {CHECK_AFTER_SEEDS} complete seeds; {len(seeds)} so far)\n"
    share = plan["prediction"]["share_central"]
    lines = [
        f"From {len(seeds)} complete seeds; assumed SD share {assumed:.3f}.",
        "",
        "| endpoint | gdpo learned area | SD of the paired difference | as a share of the area | predicted difference | power of 5 seeds, alpha 0.05 | alpha 0.025 |",  # fmt: skip
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for test in primary_tests(runs):
        values = list(test["differences"].values())
        sd = float(np.std(values, ddof=1))
        rise = test["gdpo_learned_area"]
        effect = share * max(rise, 0.0)
        powers = [paired_power(effect, sd, len(SEEDS), alpha) for alpha in (ALPHA, ALPHA / 2)]  # fmt: skip
        relative = sd / rise if rise > 0 else float("nan")
        lines.append(
            f"| {ENDPOINTS[test['endpoint']]} | {rise:+.4f} | {sd:.4f} | {relative:.3f} "
            f"| {effect:+.4f} | {powers[0]:.2f} | {powers[1]:.2f} |"
        )
    return "\n".join(lines) + "\n"


def steps_to_level(records: Sequence[Mapping[str, Any]]) -> int | None:
    """Steps to a summed training reward of LEVEL (rolling mean of WINDOW); NOT_REACHED for a
    complete run that never gets there; None for an unfinished run that has not (yet)."""
    values = convergence_report.curve(records, SUMMED, STEPS)
    done = values[~np.isnan(values)]
    reached = convergence_report.steps_to_threshold(list(done), LEVEL, WINDOW)
    if reached is not None:
        return reached
    return NOT_REACHED if len(done) == STEPS else None


# ----------------------------------------------------------------------------- the report


def _number(value: float | None, digits: int = 3, sign: bool = False) -> str:
    return convergence_report._cell(value, digits, sign)


def pilot_table(rule: Mapping[str, Any]) -> str:
    lines = [
        "| learning rate | steps done | summed reward, steps 1-5 | steps 6-10 | rises | collapse |",
        "|---:|---:|---:|---:|---|---|",
    ]
    for rate, part in rule["rates"].items():
        lines.append(
            f"| {fmt_rate(rate)} | {part['steps']} | {_number(part['early'])} | {_number(part['late'])} "
            f"| {'yes' if part['rises'] else 'no'} | {part['collapse'] or 'none'} |"
        )
    chosen = (
        f"**The study's learning rate: {fmt_rate(rule['chosen'])}.**"
        if rule["complete"]
        else "The pilot is not complete: no rate is chosen yet."
    )
    return "\n".join(lines) + "\n\n" + chosen + "\n"


def primary_table(tests: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "| endpoint (AUC) | "
        + " | ".join(f"seed {s}" for s in SEEDS)
        + " | n | mean | 95% t interval | p | Holm p | significant | gdpo learned area | predicted |",  # fmt: skip
        "|---|" + "---:|" * (len(SEEDS) + 5) + "---|---:|---:|",
    ]
    for test in tests:
        cells = [_number(test["differences"].get(s), 4, sign=True) for s in SEEDS]
        result = test["test"]
        summary = (
            f"{result['n']} | {result['mean']:+.4f} | [{result['low']:+.4f}, {result['high']:+.4f}] "
            f"| {result['p']:.3g} | {test['holm_p']:.3g} | {'yes' if test['significant'] else 'no'}"
            if result
            else f"{len(test['differences'])} | – | – | – | – | –"
        )
        lines.append(
            f"| {ENDPOINTS[test['endpoint']]} | " + " | ".join(cells) + f" | {summary} "
            f"| {_number(test['gdpo_learned_area'], 4, sign=True)} | {_number(test['predicted'], 4, sign=True)} |"  # fmt: skip
        )
    lines.append("")
    lines += [f"- {ENDPOINTS[t['endpoint']]}: {reading(t)}." for t in tests]
    return "\n".join(lines) + "\n"


def per_run_table(runs: Mapping[str, Mapping[int, Any]]) -> str:
    """Per arm and seed: steps done, both AUCs, the step-1 summed reward (the same sample in
    both arms of a seed), steps to the level, final test execution accuracy."""
    lines = [
        f"| arm | seed | steps done | AUC execution | AUC summed | step-1 summed | steps to {LEVEL:g} | test execution, sampled | greedy |",  # fmt: skip
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, seeds in runs.items():
        for seed, run in sorted(seeds.items()):
            first = convergence_report.curve(run["records"], SUMMED, STEPS)[0]
            reached = steps_to_level(run["records"])
            evaluation = run["eval"] or {}
            accuracy = [((evaluation.get(part) or {}).get("sql_execution") or {}).get("mean") for part in ("sampled", "greedy")]  # fmt: skip
            lines.append(
                f"| {arm} | {seed} | {convergence_report._steps_done(run)} "
                f"| {_number(area(run['records'], EXECUTION))} | {_number(area(run['records'], SUMMED))} "
                f"| {_number(None if math.isnan(first) else float(first))} "
                f"| {'–' if reached is None else reached} | {_number(accuracy[0])} | {_number(accuracy[1])} |"
            )
    return "\n".join(lines) + "\n"


def secondary_table(runs: Mapping[str, Mapping[int, Any]]) -> str:
    """Paired mrtpo - gdpo of the secondary endpoints over the complete, evaluated seeds."""

    def accuracy(part: str, name: str) -> Any:
        return lambda run: ((run["eval"] or {}).get(part) or {}).get(name, {}).get("mean")

    def steps(run: Mapping[str, Any]) -> float | None:
        value = steps_to_level(run["records"])
        return None if value is None else float(value)

    metrics = [(f"steps to a summed reward of {LEVEL:g} ({NOT_REACHED}: not reached)", steps)]
    for part in ("sampled", "greedy"):
        for name in ("sql_execution", "sql_executable", "sql_format"):
            metrics.append((f"test {name}, {part}", accuracy(part, name)))
    lines = ["| metric | n | mean mrtpo - gdpo | 95% t interval |", "|---|---:|---:|---:|"]
    for label, value in metrics:
        differences = list(convergence_powered.paired_differences(runs, PROPOSED, BASELINE, value).values())  # fmt: skip
        summary = convergence_powered.paired_cells(differences, 4)
        lines.append(f"| {label} | {len(differences)} | {summary} |")
    return "\n".join(lines) + "\n"


def cost_tables(results: Path, runs: Mapping[str, Mapping[int, Any]]) -> str:
    """Time (`convergence_report.time_table`: each run's median step wall time, the CPU seconds a step
    as that times the CPU share of its timed training, so a run killed and resumed is not
    undercounted) for the pilot and the study; then each run's starts of training, peak memory
    and the commit(s) it trained from."""
    pilot = {f"pilot lr {fmt_rate(rate)}": {PILOT_SEED: run} for rate, run in load_pilot_runs(results).items()}  # fmt: skip
    text = "Pilot:\n\n" + convergence_report.time_table({"runs": pilot})
    if runs:
        text += "\nStudy (ratios to gdpo paired by seed):\n\n" + convergence_report.time_table(
            {"runs": runs}
        )
    lines = [
        "| run | steps | starts of training | peak RSS GB | commit(s) |",
        "|---|---:|---:|---:|---|",
    ]
    named = [(name, seeds[PILOT_SEED]) for name, seeds in pilot.items()]
    named += [(f"{arm} seed {seed}", run) for arm, seeds in runs.items() for seed, run in sorted(seeds.items())]  # fmt: skip
    for name, run in named:
        record = run["run"]
        if not record:
            continue
        sessions = record.get("sessions", [])
        commits = sorted({(session.get("commit") or "?")[:10] for session in sessions})
        lines.append(
            f"| {name} | {len(run['records'])} | {len(sessions)} "
            f"| {_number(record.get('peak_rss_mb', 0) / 1024, 1)} | {', '.join(commits)} |"
        )
    return text + "\n" + "\n".join(lines) + "\n"


def plot_curves(runs: Mapping[str, Mapping[int, Any]], path: Path) -> None:
    """Both primary endpoints per step: a thin line per seed and the mean over seeds per arm."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.2), dpi=100)
    x = np.arange(1, STEPS + 1)
    colors = {BASELINE: "tab:blue", PROPOSED: "tab:orange"}
    for index, (key, label) in enumerate(ENDPOINTS.items()):
        axes = figure.add_subplot(1, 2, index + 1)
        for arm, seeds in runs.items():
            curves = [
                convergence_report.curve(run["records"], key, STEPS) for run in seeds.values()
            ]
            curves = [c for c in curves if not np.isnan(c).all()]
            for values in curves:
                axes.plot(x, values, color=colors[arm], linewidth=0.7, alpha=0.4)
            if curves:
                with np.errstate(all="ignore"):
                    mean = np.nanmean(np.vstack(curves), axis=0) if len(curves) > 1 else curves[0]
                axes.plot(x, mean, color=colors[arm], linewidth=2, label=f"{arm} (mean of {len(curves)} seeds)")  # fmt: skip
        axes.set_xlabel("step")
        axes.set_ylabel(f"training {label} (mean of the step)")
        axes.set_xticks(range(0, STEPS + 1, 5))
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, format="png")


def plot_pilot(pilot: Mapping[float, Sequence[Mapping[str, Any]]], path: Path) -> None:
    """The pilot's summed training reward per step, one line per learning rate."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4), dpi=100)
    axes = figure.add_subplot(1, 1, 1)
    x = np.arange(1, PILOT_STEPS + 1)
    for rate, records in pilot.items():
        if records:
            axes.plot(x, convergence_report.curve(records, SUMMED, PILOT_STEPS), marker=".", label=f"lr {fmt_rate(rate)}")  # fmt: skip
    axes.set_xlabel("step")
    axes.set_ylabel("summed training reward (mean of the step)")
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, format="png")


NOT_STARTED = "(no study run yet)\n"


def write_report(results: Path = RESULTS) -> Path:
    """README.md, curves.png and pilot.png in `results`, from its files alone."""
    results = Path(results)
    plan = convergence_runs._read_json(results / PLAN_FILE)
    if plan is None:
        raise SystemExit(f"no {results / PLAN_FILE}: store the plan first (--plan)")
    pilot = load_pilot(results)
    rule = pilot_rule(pilot)
    runs = load_study(results)
    plot_pilot(pilot, results / "pilot.png")
    plot_curves(runs, results / "curves.png")
    expected = plan["prediction"]
    seeds = complete_seeds(runs) if runs else []
    evaluated = sum(bool(run["eval"]) for seeds_ in runs.values() for run in seeds_.values())
    study = convergence_runs._read_json(study_results(results) / TASK / convergence_runs.STUDY_FILE)
    command = study["command"] if study else "(not started)"
    tests = primary_tests(runs) if runs else []
    text = f"""# Does the better step make faster learning? Qwen2.5-Coder-0.5B on SQL, gdpo vs mrtpo (beta 1)

Regenerated by `python benchmarks/sql_training_study.py --report` from the files in this folder
(issue #47). The study's command (resumable): `{command}`.

Progress: pilot {sum(part["steps"] for part in rule["rates"].values())} of {PILOT_STEPS * len(LEARNING_RATES)} steps; study {len(seeds)} of {len(SEEDS)} seeds complete (both arms, {STEPS} steps), {evaluated} of {len(SEEDS) * len(ARMS)} runs evaluated.

## The plan, as stored before the first pilot run

{plan["text"]}
Stored numbers: warm-up-weighted first-order gain {expected["warmup_weighted_gain"]:.3f}, predicted
share r {expected["share_central"]:+.3f} (range {expected["share_range"][0]:+.3f} to {expected["share_range"][1]:+.3f});
assumed SD share {plan["sizing"]["assumed_sd_share"]:.3f}; power: {"; ".join(f"{k} {v:.2f}" for k, v in plan["sizing"]["power"].items())}.

## The learning-rate pilot (gdpo, seed {PILOT_SEED}, {PILOT_STEPS} steps)

![pilot](pilot.png)

{pilot_table(rule)}
## Result

![training curves](curves.png)

Thin lines: one seed; thick: the mean over seeds.

### Primary: AUC differences mrtpo - gdpo, paired by seed (Holm over the two endpoints)

{primary_table(tests) if tests else NOT_STARTED}
### The noise assumption, checked after {CHECK_AFTER_SEEDS} seeds

{noise_check(runs, plan) if runs else NOT_STARTED}
### Per run

{per_run_table(runs) if runs else NOT_STARTED}
### Secondary (paired 95% t intervals, not corrected)

{secondary_table(runs) if runs else NOT_STARTED}
### Diagnostics per block of 5 steps (mean over steps and seeds)

{convergence_powered.diagnostics_table(runs, DIAGNOSTICS) if runs else NOT_STARTED}
## The step at gdpo seed 0 after 10 steps (item 2)

{step_section(results)}
## Cost and provenance

{cost_tables(results, runs)}"""
    path = results / "README.md"
    path.write_text(text)
    return path
