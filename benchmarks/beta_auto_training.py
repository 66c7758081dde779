"""Does `mrtpo_beta: auto` learn tool calling no worse than GDPO? SmolLM2, issue #50.

The update-quality benchmark measured MRTPO's step pointing less far uphill than GDPO's on
SmolLM2-135M tool calling, more so with beta. This study trains `mrtpo_beta: auto` (its
defaults; the warm-up of the powered study's MRTPO arm, 2 steps) with the powered convergence
study's recipe and seeds, and pairs each seed with that study's GDPO run of the same seed.

Those GDPO runs were trained at an older commit. So the first run here is GDPO seed 0 again,
at today's commit, compared step by step with the committed one (`reproduction`); the plan's
rule (`PLAN`) then fixes which GDPO runs are the baseline: the committed six when it
reproduces, else GDPO's six rerun here (the script adds seeds 1-5 by itself). The plan, the
margins and the auto arm's settings are stored in `study.json` before the first auto run
(convergence.record_study: a changed plan is refused), the reproduction's result and the
baseline beside them once seed 0 is done.

The runs are `benchmarks/convergence.py`'s (`train_run`: resumable from the last checkpoint,
one run.json per run, metrics.jsonl as logged, the final evaluation on the study's test rows
and BFCL simple_python); the cold start and the data rows are its own, built once here and
checked against the powered study's (same rows, same cold-start digest).

    python benchmarks/beta_auto_training.py --plan          # store the plan (refused if changed)
    OMP_NUM_THREADS=1 python benchmarks/beta_auto_training.py --threads 1 --jobs 1 --commit
    python benchmarks/beta_auto_training.py --report        # README.md and figures from files

With `--commit` each finished run's files and the regenerated report are committed (those
paths only). Results: `benchmarks/results/beta-auto-training/` (README.md, curves.png,
beta.png; `tool_calling/study.json`; per run `tool_calling/<arm>/seed<k>/`: metrics.jsonl,
run.json, final_eval.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import convergence  # noqa: E402  (a sibling script: runs, resumption, cold start, curves)
import convergence_powered  # noqa: E402  (the recipe, AUC, paired differences, tables)
import convergence_report  # noqa: E402
import convergence_runs  # noqa: E402

RESULTS = Path("benchmarks/results/beta-auto-training")
POWERED = HERE / "results" / "convergence-powered"  # the committed GDPO runs and their recipe
POWERED_NAME = "benchmarks/results/convergence-powered"
TASK = convergence_runs.TASK
BASELINE, AUTO = "gdpo", "auto"
SEEDS, STEPS, ENDPOINTS = (
    convergence_powered.SEEDS,
    convergence_powered.STEPS,
    convergence_powered.ENDPOINTS,
)
CHECK_SEED = 0  # the GDPO seed rerun first, against its committed run
ARMS: dict[str, dict[str, Any]] = {
    BASELINE: convergence_powered.METHODS[BASELINE],
    # The powered study's MRTPO warm-up; every auto option at its default.
    AUTO: {"advantage_estimator": "mrtpo", "mrtpo_beta": "auto", "mrtpo_warmup_steps": 2},
}
AUTO_OPTIONS = ("mrtpo_beta_max", "mrtpo_beta_step", "mrtpo_beta_probe_every", "mrtpo_beta_window")
# Half the paper-sized AUC effect the powered study was sized to detect (its study.json
# "power" ... "paper_sized_auc_effect": 0.094 and 0.075, rounded down; a test checks them).
MARGINS = {"tool_format": 0.047, "tool_correctness": 0.037}
# A sampled response that differs moves a step's format mean by 1/16 and its correctness mean
# by far more than this; float32 rounding of the same responses' mean stays far below it.
TOLERANCE = 1e-6
REPRODUCED_KEYS = (*(f"rewards/{name}/mean" for name in ENDPOINTS), "loss")
BETA, PREFIX = "mrtpo/beta", "mrtpo/beta_auto/"  # the trainer's logged names (trainer_beta_auto)
STUDY_FILE = convergence_runs.STUDY_FILE


# ----------------------------------------------------------------------------- the design


def auto_defaults() -> dict[str, Any]:
    """The auto arm's options that it leaves at MRTPOConfig's defaults."""
    from mrtpo.config import MRTPOConfig

    return {name: MRTPOConfig.__dataclass_fields__[name].default for name in AUTO_OPTIONS}


def beta_ceiling(steps: int = STEPS) -> list[float]:
    """The largest beta the auto arm can apply at steps 1..steps: a probe at each step whose
    0-based index is a multiple of the probe period; beta rises by one step per probe from the
    second on (a bound needs two agreements), up to its maximum, under the warm-up's cap."""
    from mrtpo.advantages import beta_at

    options = auto_defaults()
    beta, probes, ceiling = 0.0, 0, []
    for index in range(steps):
        cap = beta_at(index, options["mrtpo_beta_max"], ARMS[AUTO]["mrtpo_warmup_steps"])
        ceiling.append(min(beta, cap))
        if index % options["mrtpo_beta_probe_every"] == 0:
            probes += 1
            if probes >= 2:
                beta = min(options["mrtpo_beta_max"], round(beta + options["mrtpo_beta_step"], 12))
    return ceiling


def _ceiling_text() -> str:
    ceiling = beta_ceiling()
    runs, start = [], 1
    for step in range(2, STEPS + 2):
        if step > STEPS or ceiling[step - 1] != ceiling[start - 1]:
            runs.append(f"{ceiling[start - 1]:g} at steps {start}-{step - 1}")
            start = step
    return ", ".join(runs) + f" (mean over the {STEPS} steps {np.mean(ceiling):.3f})"


def plan_text() -> str:
    """The analysis plan, stored in study.json ("analysis") before the first auto run."""
    options = ", ".join(f"`{name}` {value}" for name, value in auto_defaults().items())
    margins = "; ".join(f"{name} {value:.3f}" for name, value in MARGINS.items())
    probes = ", ".join(map(str, range(1, STEPS + 1, auto_defaults()["mrtpo_beta_probe_every"])))
    return f"""\
Written before the first auto run and stored in `study.json` ("analysis"); a run with another
plan is refused.

- **Arms.** `{AUTO}`: `{json.dumps(ARMS[AUTO], sort_keys=True)}`, the other auto
  options at their defaults ({options}). `{BASELINE}`: `{json.dumps(ARMS[BASELINE])}`. Every
  other setting is the powered study's (`{POWERED_NAME}`, checked against its
  study.json); seeds {", ".join(map(str, SEEDS))}, paired by seed (same cold start, prompt order
  and training seed).
- **What the defaults allow in {STEPS} steps.** Probes at steps {probes}; beta rises by at
  most one step per probe from the second probe on, so at most:
  {_ceiling_text()}.
  Until beta first rises the auto arm trains as MRTPO at beta 0 (GDPO's advantage on every
  token); it rises only where the probes' bound is above 0.
- **Which GDPO runs are the baseline.** GDPO seed {CHECK_SEED} is trained again here first, at
  this commit, and compared with the committed run step by step: it *reproduces* when both
  rewards' step means (`rewards/<name>/mean`) differ by at most {TOLERANCE:g} at every one of
  the {STEPS} steps (the loss's largest difference is reported beside). Then the baseline is
  the powered study's six committed GDPO runs; else GDPO's seeds are all rerun here and the
  baseline is these six. The result and the baseline are stored in study.json.
- **Primary endpoints**: per seed, the AUC of the training `tool_format` and `tool_correctness`
  rewards: the mean over steps 1-{STEPS} of the step's mean reward (16 responses a step).
- **Estimate**: {AUTO} - {BASELINE} paired by seed: the mean difference and its 95% t
  interval (t with n - 1 degrees of freedom). A seed enters once both runs have all {STEPS}
  steps; no run is dropped or replaced; an interrupted run resumes from its checkpoint.
- **Goal "not below GDPO"**, judged per endpoint once all {len(SEEDS)} seeds are complete, by the
  interval's lower bound against a margin fixed here: it holds when the lower bound is above
  minus the margin. Margins: {margins} (half the paper-sized AUC effect the powered study was
  sized to detect). The goal holds when it holds for both endpoints (each bound is one-sided
  97.5%; requiring both needs no correction). An interval entirely below 0 on an endpoint
  reads "{AUTO} is below GDPO"; any other failure reads "not shown".
- **Reported beside, not judged**: beta and the agreement per step and seed (`{BETA}`,
  `{PREFIX}*`), the first step at which an auto run's rewards differ from its GDPO pair's,
  the final policy's evaluation (paired differences with 95% t intervals), time per step and
  the probes' seconds.
"""


def study_argv(results: Path, baseline_seeds: Sequence[int], jobs: int, threads: int) -> list[str]:
    """`benchmarks/convergence.py`'s arguments: the powered study's recipe, these two arms."""
    argv = ["--results", str(results), "--methods", BASELINE, AUTO, "--seeds", *map(str, SEEDS)]
    argv += ["--seeds_for", f"{BASELINE}={','.join(map(str, baseline_seeds))}"]
    for name, overrides in ARMS.items():
        argv += ["--variant", f"{name}={json.dumps(overrides, sort_keys=True)}"]
    argv += ["--steps", str(STEPS), "--prompts", "4", "--generations", "4"]
    argv += ["--max_completion_length", "96", "--learning_rate", "1e-5"]
    return argv + ["--jobs", str(jobs), "--threads", str(threads), "--device", "auto"]


def study_args(
    results: Path, baseline_seeds: Sequence[int] = (CHECK_SEED,), jobs: int = 1, threads: int = 1
) -> argparse.Namespace:
    return convergence_runs.parse_args(study_argv(results, baseline_seeds, jobs, threads))


def check_recipe(args: argparse.Namespace, powered: Path = POWERED) -> None:
    """Refuse to run with other shared settings than the powered study's."""
    stored = convergence_runs._read_json(Path(powered) / TASK / STUDY_FILE)["settings"]
    mine = convergence_runs.study_settings(args)
    if mine != stored:
        changed = sorted(key for key in mine if stored.get(key) != mine[key])
        raise SystemExit(f"settings differ from the powered study's: {', '.join(changed)}")


def design(checked: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What study.json holds beside the runs: the plan and its numbers; after the check of
    GDPO seed 0, its result and the baseline (record_study refuses a change of either)."""
    stored: dict[str, Any] = {
        "analysis": plan_text(),
        "auto_options": auto_defaults(),
        "margins": MARGINS,
        "powered_study": POWERED_NAME,
    }
    if checked is not None:
        stored["reproduction"] = checked
        stored["baseline"] = "powered" if checked["reproduces"] else "rerun"
    return stored


# ----------------------------------------------------------------------------- the check


def reproduction(
    rerun: Sequence[Mapping[str, Any]], committed: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """GDPO seed 0 here against the committed run, per logged value: the steps where the two
    are equal, the first that differs (beyond TOLERANCE), the largest absolute difference; and
    whether it reproduces (the plan's rule). None until both runs have every step."""
    pair = {
        name: [convergence_report.curve(records, key, STEPS) for key in REPRODUCED_KEYS]
        for name, records in (("rerun", rerun), ("committed", committed))
    }
    if any(np.isnan(values).any() for curves in pair.values() for values in curves):
        return None
    out: dict[str, Any] = {}
    for key, mine, theirs in zip(REPRODUCED_KEYS, pair["rerun"], pair["committed"], strict=True):
        difference = np.abs(mine - theirs)
        differing = np.flatnonzero(difference > TOLERANCE)
        out[key] = {
            "equal_steps": int(np.sum(difference == 0)),
            "first_differing_step": int(differing[0]) + 1 if len(differing) else None,
            "largest_difference": float(difference.max()),
        }
    out["reproduces"] = all(
        out[f"rewards/{name}/mean"]["first_differing_step"] is None for name in ENDPOINTS
    )
    return out


def first_difference(
    auto: Sequence[Mapping[str, Any]], gdpo: Sequence[Mapping[str, Any]]
) -> int | None:
    """The first step at which either reward's step mean differs (beyond TOLERANCE) between an
    auto run and its GDPO pair (identical samples until then); None where none does."""
    for step in range(1, STEPS + 1):
        for name in ENDPOINTS:
            mine = convergence_report.curve(auto, f"rewards/{name}/mean", STEPS)[step - 1]
            theirs = convergence_report.curve(gdpo, f"rewards/{name}/mean", STEPS)[step - 1]
            if np.isnan(mine) or np.isnan(theirs):
                return None
            if abs(mine - theirs) > TOLERANCE:
                return step
    return None


def digest(paths: Sequence[Path]) -> str:
    hasher = hashlib.sha256()
    for path in paths:
        hasher.update(Path(path).read_bytes())
    return hasher.hexdigest()


def check_data(results: Path, powered: Path = POWERED) -> None:
    """Refuse to train on other rows than the powered study's (same files, byte for byte)."""
    names = ("train.jsonl", "test.jsonl", "possible_answer/train.jsonl", "possible_answer/test.jsonl")  # fmt: skip
    mine, theirs = (
        digest([Path(root) / TASK / "data" / name for name in names]) for root in (results, powered)
    )
    if mine != theirs:
        raise SystemExit(f"{results}/{TASK}/data differs from the powered study's rows")


# ----------------------------------------------------------------------------- the runs


def worker(results: Path, method: str, seed: int, threads: int) -> None:
    """One run in this process: trained (resuming) and evaluated, the commit recorded."""
    import torch
    import update_quality_passes  # the commit of the code (a heavy import: the worker only)

    torch.set_num_threads(threads)
    args = study_args(results, threads=threads)
    with convergence_runs.run_lock(convergence_runs.run_dir(args, method, seed)) as held:
        if not held:
            print(f"{method} seed {seed}: another process has it; skipped", flush=True)
            return
        convergence_runs.train_run(args, method, seed, provenance=update_quality_passes.engine())


def result_files(args: argparse.Namespace, method: str, seed: int, results: Path) -> list[Path]:
    folder = convergence_runs.run_dir(args, method, seed)
    names = (convergence_runs.METRICS_FILE, convergence_runs.RUN_FILE, convergence_runs.EVAL_FILE)
    report = [Path(results) / name for name in ("README.md", "curves.png", "beta.png")]
    return [folder / name for name in names] + [
        convergence_runs.task_root(args) / STUDY_FILE,
        *report,
    ]


def baseline_seeds(results: Path) -> list[int]:
    """The GDPO seeds trained here: seed 0 (the check), all six once the check has failed."""
    stored = convergence_runs._read_json(Path(results) / TASK / STUDY_FILE) or {}
    return list(SEEDS) if stored.get("baseline") == "rerun" else [CHECK_SEED]


def check_gdpo_seed(args: argparse.Namespace, command: str, powered: Path = POWERED) -> None:
    """The plan's check of GDPO seed 0 against its committed run, stored in study.json with the
    baseline it implies (refused if it changed); SystemExit before the run has every step."""
    path = convergence_runs.METRICS_FILE
    mine = convergence_runs.read_metrics(
        convergence_runs.run_dir(args, BASELINE, CHECK_SEED) / path
    )
    theirs = convergence_runs.read_metrics(
        Path(powered) / TASK / BASELINE / f"seed{CHECK_SEED}" / path
    )
    checked = reproduction(mine, theirs)
    if checked is None:
        raise SystemExit(f"{BASELINE} seed {CHECK_SEED} has not logged all {STEPS} steps")
    seeds = [CHECK_SEED] if checked["reproduces"] else list(SEEDS)
    again = study_args(args.results, seeds, args.jobs, args.threads)
    convergence.record_study(again, design(checked), command=command)
    said = "reproduces" if checked["reproduces"] else "does not reproduce"
    print(f"{BASELINE} seed {CHECK_SEED} {said}: {json.dumps(checked)}", flush=True)


def run_study(results: Path, threads: int, jobs: int, commit: bool, argv: Sequence[str]) -> int:
    """The cold start and data (checked against the powered study's), GDPO seed 0 and the
    check, then every pending run under the plan's baseline, `jobs` at a time; after each the
    report, and with `commit` the run's files. Returns the number of failures."""
    command = shlex.join(["python", "benchmarks/beta_auto_training.py", *argv])
    args = study_args(results, baseline_seeds(results), jobs, threads)
    check_recipe(args)
    convergence.record_study(args, design(), command=command)
    log = convergence_runs.task_root(args) / convergence_runs.CHECKPOINTS / "cold_start.log"
    if convergence.run_worker(args, ["cold_start"], log):
        return 1
    check_data(results)
    lock = threading.Lock()  # one report and one commit at a time

    def run_one(method: str, seed: int) -> int:
        print(f"{method} seed {seed}", flush=True)
        worker_argv = ["--results", str(results), "--threads", str(threads), "--worker", method, str(seed)]  # fmt: skip
        environment = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}  # fmt: skip
        code = subprocess.run([sys.executable, __file__, *worker_argv], env=environment).returncode
        print(f"{method} seed {seed}: {'done' if code == 0 else f'failed ({code})'}", flush=True)
        with lock:
            if code == 0 and (method, seed) == (BASELINE, CHECK_SEED):
                check_gdpo_seed(args, command)  # before its report and commit
            write_report(results)
            if commit and code == 0:
                message = f"#50: beta auto training, {method} seed {seed}"
                convergence_runs.commit_files(result_files(args, method, seed, results), message)
        return code

    if not convergence_runs.is_finished(convergence_runs.run_dir(args, BASELINE, CHECK_SEED), True):
        if run_one(BASELINE, CHECK_SEED):
            return 1
    else:
        check_gdpo_seed(args, command)  # the same result again (a change is refused)
    args = study_args(results, baseline_seeds(results), jobs, threads)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        codes = list(pool.map(lambda run: run_one(*run), convergence.pending_runs(args)))
    return sum(code != 0 for code in codes)


# ----------------------------------------------------------------------------- the analysis


def load(results: Path, powered: Path = POWERED) -> dict[str, Any]:
    """study.json, the runs {arm: {seed: run}} under the stored baseline (no GDPO runs before
    the check) and this folder's rerun of GDPO seed 0."""
    data = convergence_report.load_results(results)
    study, mine = data["study"], data["runs"]
    baseline = study.get("baseline")
    gdpo = {}
    if baseline == "powered":
        gdpo = convergence_report.load_results(powered)["runs"][BASELINE]
    elif baseline == "rerun":
        gdpo = mine.get(BASELINE, {})
    return {
        "study": study,
        "runs": {BASELINE: gdpo, AUTO: mine.get(AUTO, {})},
        "rerun": mine.get(BASELINE, {}).get(CHECK_SEED),
        "mine": mine,
    }


def primary(runs: Mapping[str, Mapping[int, Any]]) -> list[dict[str, Any]]:
    """Per endpoint: the AUC differences auto - gdpo by seed, the paired t interval (from 2
    seeds), the margin and the plan's verdict ("holds", "below", "not shown"; "pending"
    before every seed is complete)."""
    tests = convergence_powered.auc_tests(runs, [(AUTO, BASELINE)])
    for test in tests:
        margin, result = MARGINS[test["endpoint"]], test["test"]
        test["margin"] = margin
        if result is None or len(test["differences"]) < len(SEEDS):
            test["verdict"] = "pending"
        elif result["high"] < 0:
            test["verdict"] = "below"
        elif result["low"] > -margin:
            test["verdict"] = "holds"
        else:
            test["verdict"] = "not shown"
    return tests


def reading(tests: Sequence[Mapping[str, Any]]) -> str:
    """The plan's reading of the two endpoints."""
    verdicts = {test["endpoint"]: test["verdict"] for test in tests}
    if "pending" in verdicts.values():
        done = min(len(test["differences"]) for test in tests)
        return f"Pending: {done} of {len(SEEDS)} seeds have both runs complete (no verdict before all)."  # fmt: skip
    bounds = "; ".join(
        f"{t['endpoint']} {t['test']['mean']:+.3f} [{t['test']['low']:+.3f}, {t['test']['high']:+.3f}], margin -{t['margin']:.3f}"  # fmt: skip
        for t in tests
    )
    below = [name for name, verdict in verdicts.items() if verdict == "below"]
    if below:
        return f"**{AUTO} is below GDPO** on {', '.join(below)} (the interval entirely below 0): {bounds}."  # fmt: skip
    if all(verdict == "holds" for verdict in verdicts.values()):
        return f"**The goal holds**: {AUTO} is not below GDPO on either endpoint (both lower bounds above minus the margin): {bounds}."  # fmt: skip
    short = [name for name, verdict in verdicts.items() if verdict == "not shown"]
    return f"**The goal is not shown** on {', '.join(short)} (the lower bound at or below minus the margin): {bounds}."  # fmt: skip


# ----------------------------------------------------------------------------- the report


def _cell(value: float | None, digits: int = 3, sign: bool = False) -> str:
    return convergence_report._cell(value, digits, sign)


def reproduction_text(study: Mapping[str, Any], rerun: Mapping[str, Any] | None) -> str:
    checked = study.get("reproduction")
    if checked is None:
        steps = convergence_report._steps_done(rerun) if rerun else 0
        return f"Pending: {BASELINE} seed {CHECK_SEED} here has {steps} of {STEPS} steps.\n"
    lines = [
        "| logged value | steps equal | first step differing (> 1e-06) | largest difference |",
        "|---|---:|---:|---:|",
    ]
    for key in REPRODUCED_KEYS:
        part = checked[key]
        first = part["first_differing_step"]
        lines.append(f"| `{key}` | {part['equal_steps']} of {STEPS} | {first or 'none'} | {part['largest_difference']:.3g} |")  # fmt: skip
    sessions = ((rerun or {}).get("run") or {}).get("sessions") or [{}]
    commit = (sessions[0].get("commit") or "not recorded")[:10]
    cold_start = (sessions[0].get("cold_start_sha256") or "not recorded")[:12]
    verdict = (
        f"**It reproduces**: the baseline is the powered study's six committed {BASELINE} runs."
        if checked["reproduces"]
        else f"**It does not reproduce**: {BASELINE}'s six seeds are rerun here and are the baseline."
    )
    return (
        "\n".join(lines)
        + f"\n\nRerun at commit {commit}, cold start sha256 {cold_start} (the powered study's "
        f"runs that recorded theirs: {powered_cold_starts()}). {verdict}\n"
    )


def powered_cold_starts(powered: Path = POWERED) -> str:
    """The cold-start digests (first 12 hex digits) the powered study's runs recorded (from
    2026-12-03 on; earlier starts of training recorded none)."""
    found = set()
    for path in sorted((Path(powered) / TASK).glob(f"*/seed*/{convergence_runs.RUN_FILE}")):
        for session in convergence_runs._read_json(path).get("sessions", []):
            if session.get("cold_start_sha256"):
                found.add(session["cold_start_sha256"][:12])
    return ", ".join(sorted(found)) or "none"


def primary_table(tests: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "| endpoint (AUC) | "
        + " | ".join(f"seed {s}" for s in SEEDS)
        + " | n | mean | 95% t interval | margin | verdict |",
        "|---|" + "---:|" * (len(SEEDS) + 4) + "---|",
    ]
    for test in tests:
        cells = [_cell(test["differences"].get(s), sign=True) for s in SEEDS]
        result = test["test"]
        summary = (
            f"{result['mean']:+.3f} | [{result['low']:+.3f}, {result['high']:+.3f}]"
            if result
            else "– | –"
        )
        lines.append(
            f"| {test['endpoint']} | "
            + " | ".join(cells)
            + f" | {len(test['differences'])} | {summary} | -{test['margin']:.3f} | {test['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def beta_table(runs: Mapping[str, Mapping[int, Any]]) -> str:
    """Per auto seed: each probe's agreement, the steps with beta above 0, the largest and the
    mean beta over the steps logged, and the first step whose rewards differ from GDPO's."""
    probe_steps = range(1, STEPS + 1, auto_defaults()["mrtpo_beta_probe_every"])
    lines = [
        "| seed | steps | "
        + " | ".join(f"agreement, step {s}" for s in probe_steps)
        + " | steps with beta > 0 | largest beta | mean beta | first step differing from gdpo |",
        "|---:|---:|" + "---:|" * (len(probe_steps) + 4),
    ]
    for seed, run in sorted(runs[AUTO].items()):
        records = run["records"]
        if not records:
            continue
        agreement = convergence_report.curve(records, PREFIX + "probe_agreement", STEPS)
        beta = convergence_report.curve(records, BETA, STEPS)
        logged = beta[~np.isnan(beta)]
        gdpo = runs[BASELINE].get(seed)
        first = first_difference(records, gdpo["records"]) if gdpo else None
        differs = "–" if gdpo is None else first or "none"
        lines.append(
            f"| {seed} | {convergence_report._steps_done(run)} | "
            + " | ".join(
                _cell(None if np.isnan(agreement[s - 1]) else float(agreement[s - 1]), sign=True)
                for s in probe_steps
            )
            + f" | {int(np.sum(logged > 0))} | {_cell(float(logged.max()) if len(logged) else None, 2)} "
            f"| {_cell(float(logged.mean()) if len(logged) else None)} | {differs} |"
        )
    return "\n".join(lines) + "\n"


def secondary_table(runs: Mapping[str, Mapping[int, Any]]) -> str:
    """The final policy's evaluation: each arm's median, auto - gdpo paired by seed (95% t)."""
    lines = [
        f"| metric | {BASELINE} (median) | {AUTO} (median) | n | mean {AUTO} - {BASELINE} | 95% t interval |",  # fmt: skip
        "|---|---:|---:|---:|---:|---:|",
    ]
    for part, metric, label in convergence_report.EVAL_COLUMNS:

        def value(run: Mapping[str, Any], part: str = part, metric: str = metric) -> float | None:
            return convergence_report.eval_value(run, part, metric)

        medians = []
        for arm in (BASELINE, AUTO):
            values = [v for v in (value(run) for run in runs[arm].values()) if v is not None]
            medians.append(_cell(float(np.median(values)) if values else None))
        differences = list(
            convergence_powered.paired_differences(runs, AUTO, BASELINE, value).values()
        )
        lines.append(
            f"| {label} | {medians[0]} | {medians[1]} | {len(differences)} | "
            f"{convergence_powered.paired_cells(differences)} |"
        )
    return "\n".join(lines) + "\n"


def probe_table(runs: Mapping[str, Mapping[int, Any]]) -> str:
    """Per auto seed: the probes' seconds (the slowest process's, per probed step) and their
    share of the run's summed step time."""
    lines = ["| seed | probed steps | probe s, mean | share of the step time |", "|---:|---:|---:|---:|"]  # fmt: skip
    for seed, run in sorted(runs[AUTO].items()):
        probes = [
            r[PREFIX + "probe_seconds"]
            for r in run["records"]
            if r.get(PREFIX + "probe_seconds") is not None
        ]
        total = sum(r.get("step_time") or 0.0 for r in run["records"])
        if probes:
            share = _cell(sum(probes) / total if total else None)
            lines.append(f"| {seed} | {len(probes)} | {np.mean(probes):.1f} | {share} |")
    return "\n".join(lines) + "\n"


DIAGNOSTICS = (
    (BETA, "beta"),
    (PREFIX + "agreement", "agreement (window mean)"),
    (PREFIX + "agreement_lower", "its 95% lower bound"),
    ("mrtpo/reallocation_ratio", "reallocation ratio"),
    ("mrtpo/opposite_sign_rows_share", "rows with opposite-sign Ã"),
)


def plot_beta(runs: Mapping[str, Mapping[int, Any]], path: Path) -> None:
    """Per auto seed and step: beta as applied, with the defaults' ceiling; the agreement's
    lower bound that moves it, and each probe's agreement."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.2), dpi=100)
    x = np.arange(1, STEPS + 1)
    left, right = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    left.step(
        x,
        beta_ceiling(),
        where="mid",
        color="black",
        linestyle="--",
        linewidth=1,
        label="ceiling of the defaults",
    )
    for seed, run in sorted(runs[AUTO].items()):
        if not run["records"]:
            continue
        (line,) = left.plot(
            x,
            convergence_report.curve(run["records"], BETA, STEPS),
            marker=".",
            label=f"seed {seed}",
        )
        right.plot(
            x,
            convergence_report.curve(run["records"], PREFIX + "agreement_lower", STEPS),
            color=line.get_color(),
            label=f"seed {seed}: lower bound",
        )
        right.plot(
            x,
            convergence_report.curve(run["records"], PREFIX + "probe_agreement", STEPS),
            "o",
            color=line.get_color(),
            markersize=4,
        )
    right.axhline(0, color="black", linewidth=0.8)
    for axes, label in ((left, "beta applied"), (right, "agreement (dots: each probe)")):
        axes.set_xlabel("step")
        axes.set_ylabel(label)
        axes.set_xticks(range(0, STEPS + 1, 5))
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, format="png")


def write_report(results: Path = RESULTS, powered: Path = POWERED) -> Path:
    """README.md, curves.png and beta.png in `results`, from the results files alone (this
    folder's and the powered study's committed GDPO runs)."""
    results = Path(results)
    data = load(results, powered)
    study, runs = data["study"], data["runs"]
    tests = primary(runs)
    convergence_powered.plot_curves(runs, None, results / "curves.png")
    plot_beta(runs, results / "beta.png")
    finished = {
        arm: sum(bool(run["eval"]) for run in seeds.values()) for arm, seeds in data["mine"].items()
    }
    progress = ", ".join(
        f"{arm} {count} of {len(study['seeds'][arm])}" for arm, count in finished.items()
    )
    settings = study["settings"]
    baseline = {
        "powered": f"the powered study's committed runs (`{POWERED_NAME}`)",
        "rerun": "the six rerun here",
    }.get(study.get("baseline"), "not decided yet (the check of seed 0 is pending)")
    paired = sorted(set(data["mine"].get(BASELINE, {})) & set(data["mine"].get(AUTO, {})))
    pairs = (
        f"The ratios to {BASELINE} pair the seeds with a {BASELINE} run here "
        f"({', '.join(map(str, paired)) or 'none'}), each on whatever ran beside it: not a "
        "side-by-side timing. The probes' cost against a fixed beta is measured side by side by "
        "`benchmarks/beta_auto_cost.py` (`benchmarks/README.md`)."
    )
    text = f"""# `mrtpo_beta: auto` against GDPO in training: SmolLM2-135M, tool calling

Regenerated by `python benchmarks/beta_auto_training.py --report` from the files in this folder
and the powered study's (issue #50). The study's command (resumable): `{study["command"]}`.

Settings (the powered study's, checked): {settings["prompts"]} prompts x {settings["generations"]} completions per step,
{settings["max_completion_length"]} new tokens, learning rate {settings["learning_rate"]:g}, {settings["steps"]} steps, from the cold start of
{settings["model_name_or_path"]} ({settings["sft_max_steps"]} SFT steps).

Runs finished (trained and evaluated) here: {progress}. GDPO baseline: {baseline}.

## The plan, as stored before the first auto run

{study["analysis"]}
## GDPO seed {CHECK_SEED} again, at this study's commit

{reproduction_text(study, data["rerun"])}
## Result

{reading(tests)}

![training rewards](curves.png)

Median over seeds, band: inter-quartile range; dashed: 0.8.

### Primary: AUC differences {AUTO} - {BASELINE}, paired by seed

{primary_table(tests)}
### Per run

{convergence_powered.per_method_table(runs)}
## Beta over the steps

![beta and the agreement per step](beta.png)

{beta_table(runs)}
Diagnostics per block of 5 steps (mean over steps and seeds):

{convergence_powered.diagnostics_table(runs, DIAGNOSTICS)}
## Secondary: the final policy

Test rows: {settings["eval_samples"]} samples each at temperature {settings["eval_temperature"]:g}
(each run's own seed); BFCL v4 simple_python: the first {settings["bfcl_examples"]} ids, greedy.

{secondary_table(runs)}
## Time

Runs of this folder only (the powered study's ran two at a time, in other sessions). {pairs}

{convergence_report.time_table({"runs": data["mine"]})}
The probes:

{probe_table(runs)}"""
    path = results / "README.md"
    path.write_text(text)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--results", type=Path, default=RESULTS, help="results folder")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of a run")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once after the check")
    parser.add_argument("--commit", action="store_true", help="commit each finished run's files")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--plan", action="store_true", help="store the plan (refused if changed)")
    action.add_argument("--report", action="store_true", help="only regenerate the report")
    action.add_argument("--worker", nargs=2, metavar=("ARM", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads < 1 or args.jobs < 1:
        raise SystemExit("--threads and --jobs must be >= 1")
    if args.worker:
        worker(args.results, args.worker[0], int(args.worker[1]), args.threads)
        return 0
    if args.report:
        print(f"wrote {write_report(args.results)}")
        return 0
    if args.plan:
        study = study_args(args.results)
        check_recipe(study)
        command = shlex.join(["python", "benchmarks/beta_auto_training.py", *argv])
        convergence.record_study(study, design(), command=command)
        print(f"plan stored in {convergence_runs.task_root(study) / STUDY_FILE}")
        return 0
    failed = run_study(args.results, args.threads, args.jobs, args.commit, argv)
    print(f"{failed} run(s) failed" if failed else f"all runs finished; {args.results / 'README.md'}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
