"""Benchmark: the step cost of `mrtpo_beta: auto` against a fixed beta, side by side.

One process, the embedded SmolLM2-135M-Instruct (or `--model`, e.g. the powered study's cold
start, where the rewards vary and the probes have something to measure), the bundled
tool-calling task (or `--task`: Qwen2.5-Coder-0.5B as installed on `sql`, where its rewards vary
untrained), 2 prompts x 4 completions per micro-batch, 2 micro-batches a step (so a
probe has pairs inside its step), `--max_completion_length` new tokens (default 96, the
powered study's: at 32 every completion of the cold start is cut before its call closes, every
reward is 0 and the probes have nothing to run). Three trainers from the same seed, one after
the other for `--steps` optimizer steps each: fixed beta 0.5 (no warm-up), auto at the default
probe period (every 4 steps) and auto probing every step (the probe's own cost). Each
optimizer step is timed from `on_step_begin` to `on_step_end` (generation, scoring, replay,
loss, backward, the probe, optimizer). This is repeated `--repetitions` times, the order of
the variants rotated each time (so a drift of the machine's speed falls on each in turn).

Per repetition, each variant's median and mean step and their ratios to the fixed beta's in
the same repetition; reported: the median over repetitions of each ratio. The mean is what a
run pays (probed steps are 1 in 4 at the default, so the median is a step that did not probe);
the issue's target is a mean step at most 1.3x the fixed beta's. Other jobs share the CPU:
ratios only. Each trainer's peak resident memory is read from the kernel (`VmHWM`, reset before
each trainer through `/proc/self/clear_refs`; None where the kernel does not allow it): the
issue's other target, Qwen's trainer under 20 GB. `--output` gets every step's time, each
probe's seconds (0 where every advantage of the probed micro-batches was 0 and nothing ran),
the peaks, the ratios and the machine.

The trainer probing every step also gives the probe's share in the same steps: each step's
time less its probe's is a step without the probe, so the mean step of a long run probing
every k steps over a fixed beta's is 1 + probe / (k x rest) (`steady_state`, for k in
`PERIODS`; the run's first step, whose probe has no reference, left out). That variant alone
(`--variants every`) is the cheapest measurement of the target, and the only one that fits a
session: a SmolLM2 step at 96 tokens took about 350 s beside a Qwen run, so the three variants
x 8 steps x 3 repetitions would take about 7 hours. `--resume` continues a measurement cut
short (a repetition is written as it finishes): the repetitions in `--output` are kept where its
settings, variants and src/ are this run's, the others run, and each session is recorded.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/beta_auto_cost.py --variants every \
        --steps 5 --repetitions 2 \
        --model benchmarks/results/beta-auto-training/tool_calling/cold_start/checkpoints \
        --output benchmarks/results/beta-auto-cost/smollm2-cold-start.json
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/beta_auto_cost.py --variants every \
        --steps 5 --repetitions 2 \
        --model qwen2.5-coder-0.5b-instruct --task sql --max_completion_length 128 \
        --output benchmarks/results/beta-auto-cost/qwen-sql.json     # the machine to itself
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import resident_memory
import torch
from transformers import TrainerCallback

VARIANTS = {
    "fixed 0.5": dict(mrtpo_beta=0.5),
    "auto (probe every 4)": dict(mrtpo_beta="auto"),
    "auto (probe every step)": dict(mrtpo_beta="auto", mrtpo_beta_probe_every=1),
}
FIXED = "fixed 0.5"
EVERY_STEP = "auto (probe every step)"
# --variants' short names
SHORT = dict(zip(("fixed", "auto", "every"), VARIANTS, strict=True))
PERIODS = (1, 2, 4, 8)  # the probe periods the steady state is given for
PROBE_SECONDS = "mrtpo/beta_auto/probe_seconds"


class StepTimer(TrainerCallback):
    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self._started)


def run(
    settings: dict, args: argparse.Namespace, output_dir: str
) -> tuple[list[float], list[float], float | None]:
    """One trainer of a variant for `--steps` steps: each optimizer step's seconds, each
    probe's (logged as `mrtpo/beta_auto/probe_seconds`; none for the fixed beta) and the peak
    resident GB from loading the model to the end (None where it cannot be read alone)."""
    from mrtpo import tasks
    from mrtpo.models import load_model
    from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

    alone = resident_memory.reset_peak()
    model, tokenizer = load_model(args.model)
    task = tasks.get(args.task)
    config = MRTPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=8,
        num_generations=4,
        gradient_accumulation_steps=2,
        max_completion_length=args.max_completion_length,
        max_steps=args.steps,
        mrtpo_warmup_steps=0,
        learning_rate=1e-6,
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        **settings,
    )
    timer = StepTimer()
    trainer = MRTPOTrainer(
        model=model,
        reward_funcs=task.verifiers(),
        args=config,
        train_dataset=task.load("train"),
        processing_class=tokenizer,
        callbacks=[timer],
    )
    trainer.train()
    probes = [log[PROBE_SECONDS] for log in trainer.state.log_history if PROBE_SECONDS in log]
    return timer.seconds, probes, resident_memory.peak_gb() if alone else None


def ratios(repetitions: list[dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Per variant: the median over repetitions of its median and mean step over the fixed
    beta's in the same repetition."""
    out = {}
    for name in VARIANTS:
        out[name] = {
            statistic: statistics.median(
                measure(times[name]) / measure(times[FIXED]) for times in repetitions
            )
            for statistic, measure in (("median", statistics.median), ("mean", statistics.fmean))
        }
    return out


def steady_state(
    seconds: list[float], probes: list[float], periods: tuple[int, ...] = PERIODS
) -> dict[str, float]:
    """A long run's mean step over a fixed beta's, probing every k steps, from one trainer that
    probed every step: each step's time less its probe's is the step without the probe (an
    auto step at beta 0 replays and trains as a fixed beta's does), so the probe's share is
    measured in the same steps, side by side. The run's first step is left out (its probe has
    no reference yet and runs P's pass only). seconds, probes: per step. Returns
    {"every <k>": 1 + probe / (k x rest)} over the other steps' sums."""
    if len(seconds) != len(probes) or len(seconds) < 2:
        raise ValueError(f"need a probe per step and at least 2 steps, got {len(seconds)} steps and {len(probes)} probes")  # fmt: skip
    probe = sum(probes[1:])
    rest = sum(step - spent for step, spent in zip(seconds[1:], probes[1:], strict=True))
    return {f"every {k}": 1 + probe / (k * rest) for k in periods}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--task", default="tool_calling", choices=["tool_calling", "sql"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--max_completion_length", type=int, default=96)
    parser.add_argument("--output", type=Path, help="a JSON file for every step's time")
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=list(SHORT),
        default=list(SHORT),
        help="which trainers (fixed 0.5, auto at the default period, auto probing every step); "
        "'every' alone gives the steady state at each period (`steady_state`) in the least time",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the repetitions already in --output (same settings, same src/) and run the rest",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    started, load = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), os.getloadavg()
    names = [SHORT[short] for short in args.variants]
    earlier = load_earlier(args, names) if args.resume else {}
    repetitions: list[dict[str, list[float]]] = earlier.get("seconds", [])
    probes: list[dict[str, list[float]]] = earlier.get("probe_seconds", [])
    peaks: list[dict[str, float | None]] = earlier.get("peak_resident_gb", [])
    sessions: list[dict[str, Any]] = earlier.get("sessions", [])
    sessions.append({"started_at": started, "load_average_at_start": list(load), "from_repetition": len(repetitions)})  # fmt: skip
    for repetition in range(len(repetitions), args.repetitions):
        order = names[repetition % len(names) :] + names[: repetition % len(names)]
        times, probed, peak = {}, {}, {}
        for name in order:
            with TemporaryDirectory() as output_dir:
                times[name], probed[name], peak[name] = run(VARIANTS[name], args, output_dir)
            print(f"repetition {repetition}, {name}: {', '.join(f'{s:.1f}' for s in times[name])} s; probes {', '.join(f'{s:.1f}' for s in probed[name])} s; peak {peak[name]} GB", flush=True)  # fmt: skip
        repetitions.append(times)
        probes.append(probed)
        peaks.append(peak)
        # After each repetition: a session cut short keeps the repetitions it finished.
        report(args, names, repetitions, probes, peaks, sessions)


# What a resumed measurement must share with the file it continues.
SETTINGS = ("model", "task", "steps", "max_completion_length")


def load_earlier(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """The measurement in `--output` to continue: {} where there is none yet; an error where its
    settings, variants or measured code (src/ at its commit against this checkout's) differ."""
    if args.output is None:
        raise SystemExit("--resume needs --output: the file whose repetitions to keep")
    if not args.output.exists():
        return {}
    earlier = json.loads(args.output.read_text())
    different = {key: (earlier[key], getattr(args, key)) for key in SETTINGS if earlier[key] != getattr(args, key)}  # fmt: skip
    if different:
        raise SystemExit(f"--resume: {args.output} was measured with other settings: {different}")
    if earlier["seconds"] and sorted(earlier["seconds"][0]) != sorted(names):
        raise SystemExit(f"--resume: {args.output} measured the variants {sorted(earlier['seconds'][0])}, not {sorted(names)}")  # fmt: skip
    if not same_src(earlier["commit"]):
        raise SystemExit(f"--resume: src/ here differs from the commit {earlier['commit']} that measured {args.output}: a measurement runs on one engine")  # fmt: skip
    if "sessions" not in earlier:  # written before --resume existed: one session
        earlier["sessions"] = [{"started_at": earlier["started_at"], "load_average_at_start": earlier["load_average_at_start"], "load_average_at_end": earlier["load_average_at_end"], "commit": earlier["commit"], "from_repetition": 0}]  # fmt: skip
    return earlier


def same_src(commit: str | None) -> bool:
    """Whether this checkout's src/ (committed and working tree) is src/ at `commit`."""
    import subprocess

    if commit is None:
        return False
    here = Path(__file__).resolve().parent
    result = subprocess.run(["git", "diff", "--quiet", commit, "--", "../src"], cwd=here, check=False)  # fmt: skip
    return result.returncode == 0


def report(
    args: argparse.Namespace,
    names: list[str],
    repetitions: list[dict[str, list[float]]],
    probes: list[dict[str, list[float]]],
    peaks: list[dict[str, float | None]],
    sessions: list[dict[str, Any]],
) -> None:
    """Print the ratios so far and, with `--output`, write every time, probe, peak and ratio
    with the commit of the code measured."""
    summary = ratios(repetitions) if FIXED in names else {}
    for name, ratio in summary.items():
        largest = max((p[name] for p in peaks if p[name] is not None), default=None)
        print(f"{name:24s} median x{ratio['median']:.2f}  mean x{ratio['mean']:.2f}  peak {largest} GB")  # fmt: skip
    steady = {}
    if EVERY_STEP in names:  # the median over repetitions of each period's steady state
        each = [steady_state(t[EVERY_STEP], p[EVERY_STEP]) for t, p in zip(repetitions, probes, strict=True)]  # fmt: skip
        steady = {period: statistics.median(s[period] for s in each) for period in each[0]}
        print("steady state over a fixed beta's step (probe every k):", ", ".join(f"{k} x{v:.3f}" for k, v in steady.items()))  # fmt: skip
    largest = max((p[n] for p in peaks for n in names if p[n] is not None), default=None)
    print(f"largest peak resident: {largest} GB", flush=True)
    if args.output:
        import update_quality_resume  # a sibling script: the commit of the code measuring

        args.output.parent.mkdir(parents=True, exist_ok=True)
        engine = update_quality_resume.engine()
        sessions[-1].update(commit=engine["commit"], load_average_at_end=list(os.getloadavg()))
        result: dict[str, Any] = {
            "command": " ".join(["python", "benchmarks/beta_auto_cost.py", *sys.argv[1:]]),
            **engine,
            "model": args.model,
            "task": args.task,
            "steps": args.steps,
            "repetitions_planned": args.repetitions,
            "repetitions_done": len(repetitions),
            "started_at": sessions[0]["started_at"],
            "load_average_at_start": sessions[0]["load_average_at_start"],
            "load_average_at_end": sessions[-1]["load_average_at_end"],
            "sessions": sessions,
            "torch_threads": torch.get_num_threads(),
            "max_completion_length": args.max_completion_length,
            "seconds": repetitions,
            "probe_seconds": probes,
            "peak_resident_gb": peaks,
            "ratio_to_fixed": summary,
            "steady_state_to_fixed": steady,
        }
        args.output.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
