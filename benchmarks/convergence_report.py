"""The convergence studies' report, from their results files alone (`python
benchmarks/convergence.py --report`): steps to the threshold, the curves and their medians, the
paired differences, the evaluation, replay and time tables, README.md and its figures.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from convergence_runs import (  # noqa: E402
    BASELINE,
    EVAL_FILE,
    METRICS_FILE,
    PROPOSED,
    RUN_FILE,
    STUDY_FILE,
    TASK,
    THRESHOLD,
    TOP_SHARE_KEY,
    WINDOW,
    _read_json,
    read_metrics,
)
from paired_stats import paired_t  # noqa: E402  (the statistics, one place)

# ----------------------------------------------------------------------------- the report


def steps_to_threshold(
    values: Sequence[float], threshold: float = THRESHOLD, window: int = WINDOW
) -> int | None:
    """The first step (1-based) at which the mean of the last `window` values reaches
    `threshold` (up to float rounding); None when it never does."""
    for end in range(window, len(values) + 1):
        if np.mean(values[end - window : end]) >= threshold - 1e-9:  # (0.7+0.8+0.9)/3 is 0.8
            return end
    return None


def median_steps(values: Sequence[int | None]) -> float | None:
    """The median with "not reached" (None) counted as later than any step; None when the
    median itself is not reached."""
    if not values:
        return None
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    middle = len(ordered) // 2
    pair = ordered[middle : middle + 1] if len(ordered) % 2 else ordered[middle - 1 : middle + 1]
    return None if any(v is None for v in pair) else float(np.mean(pair))


def load_results(results: Path, task: str = TASK) -> dict[str, Any]:
    """The study's files (`<results>/<task>`): its study.json and, per method and seed, the
    run's records, evaluation and run.json (None where absent)."""
    root = Path(results) / task
    study = _read_json(root / STUDY_FILE)
    if study is None:
        raise SystemExit(f"no {root / STUDY_FILE}: run the study first")
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for method, seeds in study["seeds"].items():
        for seed in seeds:
            folder = root / method / f"seed{seed}"
            runs.setdefault(method, {})[seed] = {
                "records": read_metrics(folder / METRICS_FILE),
                "eval": _read_json(folder / EVAL_FILE),
                "run": _read_json(folder / RUN_FILE),
            }
    return {"study": study, "runs": runs}


def reward_names(runs: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> list[str]:
    """The rewards logged (`rewards/<name>/mean`), in first-seen order."""
    names: list[str] = []
    for seeds in runs.values():
        for run in seeds.values():
            for record in run["records"]:
                for key in record:
                    if key.startswith("rewards/") and key.endswith("/mean"):
                        name = key[len("rewards/") : -len("/mean")]
                        if name not in names:
                            names.append(name)
    return names


def curve(records: Sequence[Mapping[str, Any]], key: str, steps: int) -> np.ndarray:
    """[steps] the value of `key` at steps 1..steps (NaN where missing)."""
    values = np.full(steps, np.nan)
    for record in records:
        if 1 <= record["step"] <= steps and record.get(key) is not None:
            values[record["step"] - 1] = record[key]
    return values


def median_band(curves: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per step: the median over seeds and the inter-quartile band, ignoring missing values
    (NaN; a step no seed has stays NaN). curves: each [steps]."""
    stacked = np.vstack(curves)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "All-NaN slice": a step not run yet
        return (
            np.nanmedian(stacked, axis=0),
            np.nanpercentile(stacked, 25, axis=0),
            np.nanpercentile(stacked, 75, axis=0),
        )


def plot_curves(data: Mapping[str, Any], names: Sequence[str], path: Path) -> None:
    """The paper's Figure 4 for our runs: each reward's training mean over steps, median over
    seeds with the inter-quartile band, one line per method."""
    from matplotlib.figure import Figure

    steps = data["study"]["settings"]["steps"]
    figure = Figure(figsize=(6 * len(names), 4), dpi=110)
    x = np.arange(1, steps + 1)
    for index, name in enumerate(names):
        axes = figure.add_subplot(1, len(names), index + 1)
        for method, seeds in data["runs"].items():
            curves = [
                curve(run["records"], f"rewards/{name}/mean", steps) for run in seeds.values()
            ]
            if not curves or all(np.isnan(c).all() for c in curves):
                continue
            median, low, high = median_band(curves)
            run_count = sum(not np.isnan(c).all() for c in curves)
            (line,) = axes.plot(x, median, label=f"{method} ({run_count} of {len(curves)} seeds)")
            axes.fill_between(x, low, high, color=line.get_color(), alpha=0.2)
        if index == 0:
            axes.axhline(THRESHOLD, color="black", linewidth=0.8, linestyle="--")
        axes.set_xlabel("step")
        axes.set_ylabel("training reward (mean of the step)")
        axes.set_title(name)
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, format="png")


def plot_replay(data: Mapping[str, Any], names: Sequence[str], path: Path) -> bool:
    """Each reward's mean replay distance and top-10% share over training (median over seeds)
    for the methods that replay; False when none logged any."""
    from matplotlib.figure import Figure

    steps = data["study"]["settings"]["steps"]
    x = np.arange(1, steps + 1)
    figure = Figure(figsize=(12, 4), dpi=110)
    drawn = False
    for index, statistic in enumerate(("mean", TOP_SHARE_KEY)):
        axes = figure.add_subplot(1, 2, index + 1)
        for method, seeds in data["runs"].items():
            for name in names:
                key = f"mrtpo/distance/{name}/{statistic}"
                curves = [curve(run["records"], key, steps) for run in seeds.values()]
                if not curves or all(np.isnan(c).all() for c in curves):
                    continue
                drawn = True
                axes.plot(x, median_band(curves)[0], marker=".", label=f"{method}: {name}")
        axes.set_xlabel("step")
        axes.set_ylabel(
            "mean JS distance" if statistic == "mean" else "share on the top 10% of tokens"
        )
        axes.grid(alpha=0.3)
        if drawn:
            axes.legend(fontsize="small")
    figure.tight_layout()
    if drawn:
        figure.savefig(path, format="png")
    return drawn


def _cell(value: float | None, digits: int = 3, sign: bool = False) -> str:
    """A table cell: the value to `digits` places (with its sign when `sign`), "–" when absent."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _steps_done(run: Mapping[str, Any]) -> int:
    return run["records"][-1]["step"] if run["records"] else 0


def _steps_cell(run: Mapping[str, Any], reached: int | None, steps: int) -> str:
    """A seed's cell: the step it reached 0.8 at; "not reached" once it has run every step;
    "pending" before (a run in progress or not started must not read as "not reached")."""
    done = _steps_done(run)
    if done == 0:
        return "–"
    progress = "" if done >= steps else f" ({done}/{steps} steps)"
    if reached is not None:
        return f"{reached}{progress}"
    return "not reached" if done >= steps else f"pending{progress}"


def steps_table(data: Mapping[str, Any], format_name: str) -> tuple[str, dict[str, Any]]:
    """Steps to a training format reward of 0.8 (rolling mean of 3 steps), every seed and the
    median; "not reached" is counted, never dropped."""
    steps = data["study"]["settings"]["steps"]
    seeds = sorted({seed for runs in data["runs"].values() for seed in runs})
    lines = [
        "| method | " + " | ".join(f"seed {seed}" for seed in seeds) + " | median |",
        "|---|" + "---:|" * (len(seeds) + 1),
    ]
    found: dict[str, Any] = {}
    for method, runs in data["runs"].items():
        values = {
            seed: steps_to_threshold(
                [
                    r[f"rewards/{format_name}/mean"]
                    for r in run["records"]
                    if r.get(f"rewards/{format_name}/mean") is not None
                ]
            )
            for seed, run in runs.items()
        }
        found[method] = values
        cells = [
            "" if seed not in runs else _steps_cell(runs[seed], values[seed], steps)
            for seed in seeds
        ]
        # The median over the decided seeds (reached, or run to the end without reaching it).
        decided = [
            value
            for seed, value in values.items()
            if value is not None or _steps_done(runs[seed]) >= steps
        ]
        median = median_steps(decided)
        median_cell = "–" if not decided else "not reached" if median is None else f"{median:g}"
        if decided and len(decided) < len(values):
            median_cell += f" ({len(decided)} of {len(values)} seeds)"
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {median_cell} |")
    return "\n".join(lines) + "\n", found


EVAL_COLUMNS = (
    ("test", "format", "test format rate"),
    ("test", "correctness", "test correctness"),
    ("test", "exact", "test exact calls"),
    ("bfcl_simple_python", "exact", "BFCL simple_python exact"),
    ("bfcl_simple_python", "format", "BFCL simple_python format"),
)


def eval_value(run: Mapping[str, Any], part: str, metric: str) -> float | None:
    evaluation = (run.get("eval") or {}).get(part) or {}
    return (evaluation.get(metric) or {}).get("mean")


def eval_table(data: Mapping[str, Any]) -> str:
    """Final-policy accuracy per method: the median over seeds, every seed in brackets."""
    lines = [
        "| method | " + " | ".join(label for _, _, label in EVAL_COLUMNS) + " |",
        "|---|" + "---:|" * len(EVAL_COLUMNS),
    ]
    for method, runs in data["runs"].items():
        cells = []
        for part, metric, _ in EVAL_COLUMNS:
            values = [eval_value(run, part, metric) for _, run in sorted(runs.items())]
            present = [v for v in values if v is not None]
            median = float(np.median(present)) if present else None
            cells.append(f"{_cell(median)} ({', '.join(_cell(v, 2) for v in values)})")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def paired_table(data: Mapping[str, Any], format_name: str, reached: Mapping[str, Any]) -> str:
    """PROPOSED - BASELINE per seed (seeds both finished): the mean, the range over seeds and
    the paired 95% t interval (a bootstrap over so few seeds would only be their range)."""
    runs = data["runs"]
    if PROPOSED not in runs or BASELINE not in runs:
        return f"({PROPOSED} and {BASELINE} are both needed.)\n"
    steps = data["study"]["settings"]["steps"]
    metrics: list[tuple[str, Any]] = [
        (label, lambda run, part=part, metric=metric: eval_value(run, part, metric))
        for part, metric, label in EVAL_COLUMNS
    ]
    metrics.append(
        (
            f"training {format_name}, mean of the last {WINDOW} steps",
            lambda run: (
                float(
                    np.nanmean(
                        curve(run["records"], f"rewards/{format_name}/mean", steps)[-WINDOW:]
                    )
                )
                if len(run["records"]) >= steps
                else None
            ),
        )
    )
    seeds = sorted(set(runs[PROPOSED]) & set(runs[BASELINE]))
    lines = [
        "| metric | "
        + " | ".join(f"seed {s}" for s in seeds)
        + " | mean | range over seeds | 95% t interval (paired) |",
        "|---|" + "---:|" * (len(seeds) + 3),
    ]
    for label, value in metrics:
        differences = {}
        for seed in seeds:
            mine, theirs = value(runs[PROPOSED][seed]), value(runs[BASELINE][seed])
            if (
                mine is not None
                and theirs is not None
                and not (math.isnan(mine) or math.isnan(theirs))
            ):
                differences[seed] = mine - theirs
        cells = [_cell(differences.get(seed)) for seed in seeds]
        values = list(differences.values())
        summary = "– | – | –"
        if values:
            summary = f"{_cell(float(np.mean(values)))} | [{min(values):.3f}, {max(values):.3f}]"
            if len(values) >= 2:
                test = paired_t(values)
                summary += f" | [{test['low']:.3f}, {test['high']:.3f}]"
            else:
                summary += " | –"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {summary} |")
    both = [
        s for s in seeds if reached.get(PROPOSED, {}).get(s) and reached.get(BASELINE, {}).get(s)
    ]
    note = (
        f"\nSteps to {THRESHOLD} ({PROPOSED} - {BASELINE}), seeds where both reached it: "
        + (
            ", ".join(f"seed {s}: {reached[PROPOSED][s] - reached[BASELINE][s]:+d}" for s in both)
            or "none"
        )
        + ".\n"
    )
    return "\n".join(lines) + "\n" + note


def replay_table(data: Mapping[str, Any], names: Sequence[str]) -> str:
    """Per replaying method and reward: mean distance and top-10% share, over the first and
    the last third of the steps (mean over steps and seeds of the logged values)."""
    steps = data["study"]["settings"]["steps"]
    third = max(1, steps // 3)
    lines = [
        "| method | reward | mean distance, first third | last third | top-10% share, first third | last third |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for method, runs in data["runs"].items():
        for name in names:
            cells = []
            for statistic in ("mean", TOP_SHARE_KEY):
                curves = np.vstack(
                    [
                        curve(run["records"], f"mrtpo/distance/{name}/{statistic}", steps)
                        for run in runs.values()
                    ]
                )
                for part in (curves[:, :third], curves[:, -third:]):
                    cells.append(float(np.nanmean(part)) if not np.isnan(part).all() else None)
            if all(cell is None for cell in cells):
                continue
            lines.append(f"| {method} | {name} | " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def time_table(data: Mapping[str, Any]) -> str:
    """Per method: each run's median step time (TRL's `step_time`, wall clock), their median
    over seeds, the training CPU seconds per step (that median times the training's CPU seconds
    over its wall seconds in `run.json`; CPU time counts this machine's work whatever else ran)
    and the evaluation's CPU seconds. Ratios to the baseline are paired
    by seed, then the median over seeds: the machine's speed can differ between the sessions
    that ran different seeds, and pairing removes that where a seed's runs shared a machine
    (where they did not, as in the SQL training study, the ratio is rough and its page says
    so)."""
    seeds = sorted({seed for runs in data["runs"].values() for seed in runs})
    wall: dict[str, dict[int, float]] = {}
    cpu: dict[str, dict[int, float]] = {}
    evaluation: dict[str, list[float]] = {}
    for method, runs in data["runs"].items():
        wall[method], cpu[method], evaluation[method] = {}, {}, []
        for seed, run in runs.items():
            times = [r["step_time"] for r in run["records"] if r.get("step_time")]
            if times:
                wall[method][seed] = float(np.median(times))
            record = run["run"] or {}
            if record.get("train_cpu_seconds") and record.get("train_seconds") and times:
                # The CPU share of the timed training, times the step's wall time: run.json is
                # written when training stops, so a run killed and resumed (after a machine
                # restart) has timed only its last part; dividing by every step would undercount.
                share = record["train_cpu_seconds"] / record["train_seconds"]
                cpu[method][seed] = wall[method][seed] * share
            if record.get("eval_cpu_seconds"):
                evaluation[method].append(record["eval_cpu_seconds"])

    def median(values: Mapping[int, float]) -> float | None:
        return float(np.median(list(values.values()))) if values else None

    def paired_ratio(column: Mapping[str, Mapping[int, float]], method: str) -> str:
        base = column.get(BASELINE, {})
        ratios = [value / base[s] for s, value in column[method].items() if base.get(s)]
        return _cell(float(np.median(ratios)), 2) if ratios else "–"

    lines = [
        "| method | "
        + " | ".join(f"seed {seed}, wall (s)" for seed in seeds)
        + f" | median step, wall (s) | / {BASELINE} | CPU s per step | / {BASELINE} | evaluation CPU s |",  # fmt: skip
        "|---|" + "---:|" * (len(seeds) + 5),
    ]
    for method in data["runs"]:
        per_seed = " | ".join(_cell(wall[method].get(seed), 1) for seed in seeds)
        mean_eval = float(np.mean(evaluation[method])) if evaluation[method] else None
        lines.append(
            f"| {method} | {per_seed} | {_cell(median(wall[method]), 1)} "
            f"| {paired_ratio(wall, method)} | {_cell(median(cpu[method]), 1)} "
            f"| {paired_ratio(cpu, method)} | {_cell(mean_eval, 0)} |"
        )
    return "\n".join(lines) + "\n"


def write_report(results: Path) -> Path:
    """`README.md`, `curves.png` and `replay.png` in `results` from the results files alone."""
    data = load_results(results)
    study, results = data["study"], Path(results)
    names = reward_names(data["runs"])
    if not names:
        raise SystemExit(f"no metrics under {results / TASK}: no run has logged a step yet")
    format_name = names[0]
    plot_curves(data, names, results / "curves.png")
    has_replay = plot_replay(data, names, results / "replay.png")
    settings = study["settings"]
    steps_markdown, reached = steps_table(data, format_name)
    methods = "\n".join(f"- `{m}`: `{json.dumps(o)}`" for m, o in study["methods"].items())
    text = f"""# Convergence study: {TASK}

Regenerated by `python benchmarks/convergence.py --report` from the files in this folder. The
study (resumable; rerun it to finish unfinished runs):

    {study["command"]}

Settings shared by every run: {settings["prompts"]} prompts x {settings["generations"]} completions
per step, {settings["max_completion_length"]} new tokens, learning rate {settings["learning_rate"]:g},
{settings["steps"]} steps, from the cold start of {settings["model_name_or_path"]}
({settings["sft_max_steps"]} SFT steps); device {settings["device"]}. Methods (`MRTPOConfig` overrides):

{methods}

## Training rewards

![training rewards](curves.png)

Median over seeds, band: inter-quartile range; dashed: {THRESHOLD}.

## Steps to a training {format_name} of {THRESHOLD} (rolling mean of {WINDOW} steps)

{steps_markdown}
## Final policy

Test rows: {settings["eval_samples"]} samples each at temperature {settings["eval_temperature"]:g}
(standard errors in each run's `final_eval.json`); BFCL v4 simple_python: the first
{settings["bfcl_examples"]} ids, greedy. Median over seeds (each seed's value in brackets).

{eval_table(data)}
## {PROPOSED} - {BASELINE}, paired by seed

{paired_table(data, format_name, reached)}
## Replay distances during training

{"![replay distances](replay.png)" if has_replay else "(no replaying method has logged a step)"}

{replay_table(data, names)}
## Wall time per step

Each run's median step time per seed; ratios to {BASELINE} are paired by seed (median over
seeds). The runs of a seed start `--jobs` at a time in the order of `--methods` (the command
above), so runs side by side shared the machine, and different seeds may have run in sessions
of different machine speed.

{time_table(data)}"""
    path = results / "README.md"
    path.write_text(text)
    return path
