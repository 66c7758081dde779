"""Benchmark: learning curves of GRPO, GDPO, MRTPO and MRTPO with shuffled weights, resumable.

Tool calling from one shared cold-start checkpoint (`mrtpo sft --task tool_calling`, the demo's
3 steps, built once into the results folder if missing). Every method trains with the same
data order (same seed), batch, completion length, learning rate and steps; only its
`MRTPOConfig` overrides differ (`METHODS`; more with `--variant NAME=JSON`, e.g.
`--variant 'mrtpo_saw={"advantage_estimator": "mrtpo", "reward_weighting": "saw"}'`).

Each run (method x seed) writes into `benchmarks/results/convergence/tool_calling/<method>/seed<k>/`:
`metrics.jsonl` (one line per step, as `mrtpo train` logs it), `final_eval.json` (the final
policy on the bundled test split, sampled with the run's own seed, 1000 + its training seed,
and on BFCL v4 simple_python, greedy) and `run.json` (settings, wall time, resumptions, the
evaluation seed); TRL's checkpoints go into its `checkpoints/` subfolder,
which git ignores. Rerunning skips finished runs and resumes an unfinished one from its last
checkpoint (saved every `--save_steps` steps). Runs go `--jobs` at a time, each in its own
process with `--threads` torch threads; a second grid process started beside the first takes
the runs the first has not locked (`run_lock`), so a lane freed later can join. `--report`
(also run after the grid) regenerates `benchmarks/results/convergence/README.md` and its
figures from the results files alone.

Training rows: the bundled train split's rows whose reference response fits in the completion
length with 16 tokens to spare (`--max_reference_tokens`; the same rule picks the test rows), so
that a format reward near 1 is reachable. The defaults are sized from measured steps to about 6
hours of two CPU cores (`benchmarks/README.md`, "Convergence").

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/convergence.py            # the study, resumable
    .venv/bin/python benchmarks/convergence.py --report                     # the report only
    .venv/bin/python benchmarks/convergence.py --device cuda --prompts 16 --steps 40 \
        --results benchmarks/results/convergence-gpu                        # a GPU grid
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from convergence_report import (  # noqa: E402
    write_report,
)
from convergence_runs import (  # noqa: E402
    CHECKPOINTS,
    COLD_START_EVAL,
    EVAL_FILE,
    STUDY_FILE,
    _read_json,
    _write_json,
    build_cold_start,
    cold_start_eval_dir,
    evaluate_cold_start,
    is_finished,
    parse_args,
    run_dir,
    run_lock,
    seeds_of,
    study_settings,
    task_root,
    train_run,
    write_study_data,
)

# ----------------------------------------------------------------------------- the grid


def pending_runs(args: argparse.Namespace) -> list[tuple[str, int]]:
    """(method, seed) of every unfinished run, seed by seed (so that a grid cut short holds
    whole seeds of every method)."""
    seeds = seeds_of(args)
    order = sorted({seed for values in seeds.values() for seed in values})
    evaluate = args.eval_samples > 0
    return [
        (method, seed)
        for seed in order
        for method in args.methods
        if seed in seeds[method] and not is_finished(run_dir(args, method, seed), evaluate)
    ]


def record_study(
    args: argparse.Namespace,
    extra: Mapping[str, Any] | None = None,
    command: str | None = None,
) -> None:
    """Write `study.json` (the command, default this script's with `args`, the shared settings
    and `extra`, e.g. a study's pre-registered analysis); refuse to mix settings or to change
    `extra` afterwards."""
    path = task_root(args) / STUDY_FILE
    settings = study_settings(args)
    previous = _read_json(path)
    if previous is not None and previous["settings"] != settings:
        changed = sorted(k for k in settings if previous["settings"].get(k) != settings[k])
        raise SystemExit(
            f"{path} was made with other settings ({', '.join(changed)}); use another --results "
            "folder or the same settings"
        )
    extra = dict(extra or {})
    if previous is not None:
        changed = sorted(k for k in extra if k in previous and previous[k] != extra[k])
        if changed:
            raise SystemExit(
                f"{path} was made with another {', '.join(changed)}: a study's recorded design "
                "is not changed once it has started; use another --results folder"
            )
    command = command or shlex.join(["python", "benchmarks/convergence.py", *args.argv])
    methods = {**(previous or {}).get("methods", {}), **{m: args.variants[m] for m in args.methods}}
    seeds = {**(previous or {}).get("seeds", {}), **seeds_of(args)}
    _write_json(
        path,
        {
            **(previous or {}),
            **extra,
            "command": command,
            "settings": settings,
            "methods": methods,
            "seeds": seeds,
        },
    )


def worker_command(args: argparse.Namespace, *worker: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args.argv, "--worker", *worker]


def run_worker(args: argparse.Namespace, worker: Sequence[str], log: Path) -> int:
    """One stage in its own process, `--threads` torch threads, output appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    threads = str(args.threads)
    environment = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    with open(log, "a") as handle:
        process = subprocess.run(
            worker_command(args, *worker), stdout=handle, stderr=subprocess.STDOUT, env=environment
        )
    status = "done" if process.returncode == 0 else f"failed ({process.returncode}), see {log}"
    print(f"{' '.join(worker)}: {status}", flush=True)
    return process.returncode


def run_grid(
    args: argparse.Namespace,
    extra: Mapping[str, Any] | None = None,
    report: Callable[[Path], Path] | None = None,
) -> int:
    """Cold start (once), the study's data files, the cold start's evaluation (with
    `--eval_cold_start`, first in the queue), every pending run `--jobs` at a time, then the
    report (`report`, default `write_report`). Returns the number of stages that failed."""
    record_study(args, extra)
    if run_worker(args, ["cold_start"], task_root(args) / CHECKPOINTS / "cold_start.log"):
        return 1
    todo = pending_runs(args)
    print(f"{len(todo)} run(s) to do: {todo}", flush=True)
    jobs = [
        ([method, str(seed)], run_dir(args, method, seed) / CHECKPOINTS / "train.log")
        for method, seed in todo
    ]
    if args.eval_cold_start and not (cold_start_eval_dir(args) / EVAL_FILE).is_file():
        log = cold_start_eval_dir(args) / CHECKPOINTS / "eval.log"
        jobs.insert(0, ([COLD_START_EVAL], log))
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        codes = list(pool.map(lambda job: run_worker(args, *job), jobs))
    (report or write_report)(args.results)
    return sum(code != 0 for code in codes)


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda, but torch sees no CUDA device")
    if args.worker == ["cold_start"]:
        from transformers import AutoTokenizer

        with run_lock(task_root(args) / "data", wait=True):
            write_study_data(args, AutoTokenizer.from_pretrained(build_cold_start(args)))
        return
    if args.worker == [COLD_START_EVAL]:
        with run_lock(cold_start_eval_dir(args)) as held:
            if held:
                evaluate_cold_start(args)
        return
    method, seed = args.worker
    with run_lock(run_dir(args, method, int(seed))) as held:
        if not held:
            print(f"{method} seed {seed}: another grid process has it; skipped", flush=True)
            return
        train_run(args, method, int(seed))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.report:
        print(f"wrote {write_report(args.results)}")
        return 0
    if args.worker:
        worker(args)
        return 0
    failed = run_grid(args)
    print(
        f"{failed} run(s) failed"
        if failed
        else f"all runs finished; report in {args.results / 'README.md'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
