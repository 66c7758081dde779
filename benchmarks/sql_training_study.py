"""Does the better step make faster learning? A pre-registered training study (issue #47).

Qwen2.5-Coder-0.5B-Instruct as installed (no cold start) on the bundled SQL task, the recipe
`recipes/sql-qwen2.5-coder-0.5b.yaml`'s settings, 20 optimizer steps; arms `gdpo` and `mrtpo`
at beta 1 (the recipe's 5-step warm-up), 5 paired seeds. The update-quality benchmark measured
MRTPO's step pointing further uphill than GDPO's on this state (+55% first-order gain at
beta 1); the plan (`sql_training_study_plan.PLAN`, with the learning-rate rule, the endpoints, the prediction and the
sizing) is stored in `plan.json` before the first pilot run, and a run under another plan is
refused.

The runs are `benchmarks/convergence.py`'s (`train_run`: resumable from the last checkpoint,
one `run.json` per run, `metrics.jsonl` as logged); this file runs them: the pilot, then the
study at the rate the pilot's stored rule picks, each study run evaluated on every test
prompt, the report rewritten after each run. The design and the plan are
`sql_training_study_plan.py`; the analysis and the report `sql_training_study_report.py`.

    python benchmarks/sql_training_study.py --plan          # store the plan (refused if changed)
    OMP_NUM_THREADS=2 python benchmarks/sql_training_study.py --pilot --threads 2 --commit
    OMP_NUM_THREADS=2 python benchmarks/sql_training_study.py --study --threads 2 --commit
    python benchmarks/sql_training_study.py --report        # README.md and figures from files

`--pilot` and `--study` resume: a finished run is skipped, an unfinished one resumes from its
last checkpoint (every `SAVE_STEPS` steps; checkpoints are git-ignored). With `--commit` each
finished run's files and the regenerated report are committed (those paths only).

Results: `benchmarks/results/sql-training-study/` (plan.json, README.md, curves.png, pilot.png;
`pilot/lr<rate>/sql/gdpo/seed100/` and `study/sql/<arm>/seed<k>/`: metrics.jsonl, run.json,
final_eval.json; `step-at-10/`: item 2, the step measured at gdpo seed 0's policy after 10
steps by `benchmarks/update_quality.py`, reported by `sql_training_study_step.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import convergence  # noqa: E402  (a sibling script: runs, resumption, paired t)
import convergence_runs  # noqa: E402
import update_quality  # noqa: E402  (the code's commit)
from sql_training_study_plan import (  # noqa: E402  (the design, one place)
    ARMS,
    BASELINE,
    EVAL_BATCH,
    GENERATIONS,
    KEPT_RUN,
    KEPT_STEP,
    LEARNING_RATES,
    MAX_COMPLETION_LENGTH,
    MICRO_BATCH,
    MODEL,
    PILOT_SEED,
    PILOT_STEPS,
    PLAN_FILE,
    PROMPTS,
    RESULTS,
    SAVE_STEPS,
    SEEDS,
    STEPS,
    TASK,
    chosen_rate,
    fmt_rate,
    pilot_results,
    plan_digest,
    store_plan,
    study_results,
)
from sql_training_study_report import write_report  # noqa: E402
from sql_training_study_step import step_results  # noqa: E402

# ----------------------------------------------------------------------------- the runs


def stage_argv(stage: str, results: Path, rate: float, threads: int) -> list[str]:
    """`benchmarks/convergence.py`'s arguments for a stage's runs (the design, in one place)."""
    if stage == "pilot":
        folder, methods, seeds, steps, samples = (
            pilot_results(results, rate), [BASELINE], [PILOT_SEED], PILOT_STEPS, 0,
        )  # fmt: skip
    elif stage == "study":
        folder, methods, seeds, steps, samples = study_results(results), list(ARMS), SEEDS, STEPS, 1
    else:
        raise ValueError(f"stage must be 'pilot' or 'study', got {stage!r}")
    argv = ["--results", str(folder), "--task", TASK, "--model_name_or_path", MODEL]
    argv += ["--methods", *methods, "--seeds", *map(str, seeds)]
    for name, overrides in ARMS.items():
        argv += ["--variant", f"{name}={json.dumps(overrides, sort_keys=True)}"]
    argv += ["--steps", str(steps), "--prompts", str(PROMPTS), "--generations", str(GENERATIONS)]
    argv += ["--micro_batch", str(MICRO_BATCH), "--max_completion_length", str(MAX_COMPLETION_LENGTH)]  # fmt: skip
    argv += ["--learning_rate", repr(rate), "--save_steps", str(SAVE_STEPS)]
    argv += ["--eval_samples", str(samples), "--eval_temperature", "1", "--bfcl_examples", "0"]
    return argv + ["--eval_batch", str(EVAL_BATCH), "--device", "cpu", "--jobs", "1", "--threads", str(threads)]  # fmt: skip


def summarize_sql(result: Mapping[str, Any], max_tokens: int, **about: Any) -> dict[str, Any]:
    """Each verifier's mean and standard error over an evaluation's examples, the share capped
    at `max_tokens`, and each example's execution score (for paired comparisons later)."""
    examples = result["examples"]
    names = list(examples[0]["verdicts"])
    summary: dict[str, Any] = {"rows": len(examples), **about}
    for name in names:
        scores = [e["verdicts"][name]["score"] for e in examples]
        summary[name] = convergence_runs.proportion_summary([s for s in scores if s is not None])
    capped = [float(e["completion_tokens"] >= max_tokens) for e in examples]
    summary["capped"] = convergence_runs.proportion_summary(capped)
    summary["execution_scores"] = [e["verdicts"]["sql_execution"]["score"] for e in examples]
    return summary


def evaluate_sql(args: argparse.Namespace, model_dir: Path, seed: int) -> dict[str, Any]:
    """The final policy on every prompt of the bundled SQL test split: `--eval_samples` samples
    each at `--eval_temperature` drawn with `seed`, and greedy."""
    from mrtpo import tasks
    from mrtpo.evaluation import evaluate
    from mrtpo.models import load_model

    task = tasks.get(TASK)
    model, tokenizer = load_model(str(model_dir))
    model = model.to(convergence_runs.device_of(args))
    test, sampled = convergence_runs.sample_test_rows(args, task, model, tokenizer, task.load("test"), seed)  # fmt: skip
    length = args.max_completion_length
    greedy = evaluate(model, tokenizer, task, test, args.eval_batch, length)
    return {
        "sampled": summarize_sql(
            sampled,
            length,
            samples_per_row=args.eval_samples,
            temperature=args.eval_temperature,
            seed=seed,
        ),
        "greedy": summarize_sql(greedy, length, decoding="greedy"),
    }


def stage_args(stage: str, results: Path, rate: float, threads: int) -> argparse.Namespace:
    return convergence_runs.parse_args(stage_argv(stage, results, rate, threads))


def worker(results: Path, stage: str, method: str, seed: int, rate: float, threads: int) -> None:
    """One run in this process: trained (resuming) and, in the study, evaluated."""
    import torch

    torch.set_num_threads(threads)
    args = stage_args(stage, results, rate, threads)
    with convergence_runs.run_lock(convergence_runs.run_dir(args, method, seed)) as held:
        if not held:
            print(f"{stage} {method} seed {seed}: another process has it; skipped", flush=True)
            return
        convergence_runs.train_run(
            args,
            method,
            seed,
            start=MODEL,
            evaluate=evaluate_sql if stage == "study" else None,
            provenance=update_quality.engine(),
            keep_steps=[KEPT_STEP] if stage == "study" and (method, seed) == KEPT_RUN else [],
        )
        # A finished run needs no resumption: its checkpoints would fill the disk (7 GB each).
        folder = convergence_runs.run_dir(args, method, seed)
        if convergence_runs.is_finished(folder, evaluate=stage == "study"):
            freed = convergence_runs.drop_resume_checkpoints(folder / convergence_runs.CHECKPOINTS)
            print(f"{stage} {method} seed {seed}: {freed / 1e9:.1f} GB of checkpoints deleted")


def run_files(args: argparse.Namespace, method: str, seed: int) -> list[Path]:
    folder = convergence_runs.run_dir(args, method, seed)
    files = (convergence_runs.METRICS_FILE, convergence_runs.RUN_FILE, convergence_runs.EVAL_FILE)
    return [folder / name for name in files] + [convergence_runs.task_root(args) / convergence_runs.STUDY_FILE]  # fmt: skip


REBUILD_FILE = "rebuild.json"  # in step_results: how item 2's policy came to this machine


def rebuild_kept_policy(results: Path, threads: int) -> dict[str, Any]:
    """Item 2's policy where this machine lacks it (machines are not kept between sessions):
    gdpo seed 0 trained again to step 10 with the study's settings (`convergence_runs.
    rebuild_kept_policy`: its logged steps compared with the committed run's), its record in
    `step-at-10/rebuild.json`."""
    import torch

    torch.set_num_threads(threads)
    args = stage_args("study", results, chosen_rate(results), threads)
    method, seed = KEPT_RUN
    scratch = step_results(results) / "rebuild"
    record = convergence_runs.rebuild_kept_policy(
        args, method, seed, KEPT_STEP, scratch, start=MODEL, provenance=update_quality.engine()
    )
    if record["rebuilt"]:
        record = {"run": f"{method} seed {seed}", "step": KEPT_STEP, "threads": threads, **record}
        convergence_runs._write_json(step_results(results) / REBUILD_FILE, record)
    return record


# A failed run is resumed this many times before the stage goes on to the next run: a kill
# from outside (the kernel's OOM killer took one beside other jobs) costs the steps since the
# last checkpoint, not the run's place in the order.
RETRIES = 1


def run_stage(stage: str, results: Path, threads: int, commit: bool, argv: Sequence[str]) -> int:
    """Every pending run of the stage, one at a time, each in its own process; after each the
    report, and with `commit` the run's files and the report committed. Returns the failures."""
    store_plan(results)
    rates = sorted(LEARNING_RATES, reverse=True) if stage == "pilot" else [chosen_rate(results)]
    failed = 0
    command = shlex.join(["python", "benchmarks/sql_training_study.py", *argv])
    for rate in rates:
        args = stage_args(stage, results, rate, threads)
        convergence.record_study(args, {"plan_sha256": plan_digest(results)}, command=command)
        for method, seed in convergence.pending_runs(args):
            print(f"{stage} {method} seed {seed} at learning rate {fmt_rate(rate)}", flush=True)
            worker_argv = ["--results", str(results), "--threads", str(threads)]
            worker_argv += ["--worker", stage, method, str(seed), repr(rate)]
            environment = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}  # fmt: skip
            for attempt in range(1 + RETRIES):
                code = subprocess.run(
                    [sys.executable, __file__, *worker_argv], env=environment
                ).returncode
                print(f"{stage} {method} seed {seed}: {'done' if code == 0 else f'failed ({code})'}", flush=True)  # fmt: skip
                if code == 0 or attempt == RETRIES:
                    break
                print(f"{stage} {method} seed {seed}: resuming from its last checkpoint", flush=True)  # fmt: skip
            failed += code != 0
            report = write_report(results)
            if commit and code == 0:
                files = [*run_files(args, method, seed), report, Path(results) / PLAN_FILE]
                files += [Path(results) / name for name in ("curves.png", "pilot.png")]
                message = f"#47: sql training study, {stage} {method} seed {seed} (lr {fmt_rate(rate)})"  # fmt: skip
                convergence_runs.commit_files(files, message)
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--results", type=Path, default=RESULTS, help="results folder")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of a run")
    parser.add_argument("--commit", action="store_true", help="commit each finished run's files")
    stage = parser.add_mutually_exclusive_group(required=True)
    stage.add_argument("--plan", action="store_true", help="store the plan (refused if changed)")
    stage.add_argument("--pilot", action="store_true", help="the learning-rate pilot")
    stage.add_argument("--study", action="store_true", help="the study, at the pilot's rate")
    stage.add_argument("--report", action="store_true", help="only regenerate the report")
    stage.add_argument(
        "--rebuild_kept_policy",
        action="store_true",
        help="item 2's policy (gdpo seed 0 after 10 steps) trained again where this machine "
        "lacks it, checked against the committed run's logged steps",
    )
    stage.add_argument("--worker", nargs=4, metavar=("STAGE", "ARM", "SEED", "RATE"), help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args(argv)
    if args.threads < 1:
        raise SystemExit(f"--threads must be >= 1, got {args.threads}")
    if args.worker:
        name, method, seed, rate = args.worker
        worker(args.results, name, method, int(seed), float(rate), args.threads)
        return 0
    if args.plan:
        store_plan(args.results)
        print(f"plan stored in {args.results / PLAN_FILE}")
        return 0
    if args.report:
        print(f"wrote {write_report(args.results)}")
        return 0
    if args.rebuild_kept_policy:
        print(json.dumps(rebuild_kept_policy(args.results, args.threads), indent=1))
        return 0
    failed = run_stage("pilot" if args.pilot else "study", args.results, args.threads, args.commit, argv)  # fmt: skip
    print(f"{failed} run(s) failed" if failed else "all runs of the stage finished")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
