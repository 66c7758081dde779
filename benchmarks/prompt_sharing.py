"""Benchmark: a training step with each group's prompt computed once (`share_prompt`) or per row.

Side by side in one process, step by step, the same samples for every variant (each step
starts from the same seed; sharing keeps TRL's random stream, so the rows are the same): GRPO,
GDPO and MRTPO with `share_prompt` off (TRL's per-row path) and on, and TRL's own
`GRPOTrainer` with `multi_objective_aggregation="normalize_then_sum"` (GDPO) as the peer row.
Each step: generation, scoring, (MRTPO: replay), the loss's forward and backward, the optimizer
step. Reported per variant: the median step, its parts (generation; scoring and advantages,
replay included; replay alone; loss forward + backward + optimizer), the peak memory of a step
(CPU: resident set above the step's start), and the ratios. Targets (issue 27): GDPO shared <=
0.45x GDPO per-row on the tool task; MRTPO shared <= 1.25x GDPO shared; no peak-memory increase.

    # the tool task from the cold start (mrtpo sft --task tool_calling --output_dir outputs/sft-tool)
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/prompt_sharing.py --model outputs/sft-tool \\
        --task tool_calling --prompts 4 --max-new-tokens 96
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/prompt_sharing.py --task sql --prompts 2 \\
        --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from tempfile import TemporaryDirectory

import torch
from step_time import PeakMemory, ready_to_step

VARIANTS = (
    "gdpo/per-row",
    "gdpo/shared",
    "mrtpo/per-row",
    "mrtpo/shared",
    "grpo/per-row",
    "grpo/shared",
    "trl-grpo-trainer",
    # bf16 autocast (fp32 weights, `--bf16`), the shared path: is it the faster CPU default?
    "gdpo/shared+bf16",
    "mrtpo/shared+bf16",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct", help="name, folder or 'tiny'")
    parser.add_argument("--task", default="tool_calling")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--variants", default=",".join(VARIANTS[:7]), help="comma-separated")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument(
        "--replay-precision",
        action="store_true",
        help="also replay mrtpo/shared's last batch under bf16 autocast and in fp32 and compare "
        "the distances (scripts/gpu_check.py's comparison)",
    )
    args = parser.parse_args(argv)
    args.variants = tuple(name.strip() for name in args.variants.split(",") if name.strip())
    unknown = [name for name in args.variants if name not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {', '.join(unknown)}; choose from {VARIANTS}")
    return args


class Timed:
    """Mixin: seconds spent generating and in the whole of generation + scoring per step."""

    def _generate(self, prompts):
        started = time.perf_counter()
        try:
            return super()._generate(prompts)
        finally:
            self.parts["generation"] += time.perf_counter() - started

    def _generate_and_score_completions(self, inputs):
        started = time.perf_counter()
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            self.parts["generate_and_score"] += time.perf_counter() - started


def build_trainer(variant: str, args: argparse.Namespace, output_dir: str):
    """A trainer ready to step by hand (`step_time.ready_to_step`)."""
    from trl import GRPOConfig, GRPOTrainer

    from mrtpo import tasks
    from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

    if args.model == "tiny":
        from mrtpo.testing import tiny_model_and_tokenizer

        model, tokenizer = tiny_model_and_tokenizer()
    else:
        from mrtpo.models import load_model

        model, tokenizer = load_model(args.model)
    task = tasks.get(args.task)
    common = dict(
        output_dir=output_dir,
        per_device_train_batch_size=args.prompts * args.generations,
        num_generations=args.generations,
        max_completion_length=args.max_new_tokens,
        max_steps=args.steps + 1,
        use_cpu=not torch.cuda.is_available(),
        bf16=variant.endswith("+bf16"),
        report_to=[],
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    if variant == "trl-grpo-trainer":
        config = GRPOConfig(multi_objective_aggregation="normalize_then_sum", **common)
        base = GRPOTrainer
    else:
        estimator, path = variant.removesuffix("+bf16").split("/")
        config = MRTPOConfig(
            advantage_estimator=estimator,
            share_prompt=path == "shared",
            mrtpo_warmup_steps=0,  # the full beta from the first step: the replay's full cost
            **common,
        )
        base = MRTPOTrainer
    trainer_class = type(f"Timed{base.__name__}", (Timed, base), {})
    trainer = trainer_class(
        model=model,
        reward_funcs=task.verifiers(),
        args=config,
        train_dataset=task.load("train"),
        processing_class=tokenizer,
    )
    return ready_to_step(trainer)


def one_step(trainer, batch: list[dict], seed: int) -> dict[str, float]:
    """One optimizer step of one micro-batch: seconds of the step and of its parts."""
    torch.manual_seed(seed)
    trainer._metrics["train"].clear()
    trainer.parts = {"generation": 0.0, "generate_and_score": 0.0}
    with PeakMemory(trainer.accelerator.device) as memory:
        started = time.perf_counter()
        trainer.training_step(trainer.model, batch, None)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - started
    trainer.state.global_step += 1
    metrics = trainer._metrics["train"]
    replay = (metrics.get("mrtpo/replay_seconds") or [0.0])[-1]
    return {
        "seconds": seconds,
        "generation": trainer.parts["generation"],
        "scoring_and_advantages": trainer.parts["generate_and_score"] - trainer.parts["generation"],
        "replay": replay,
        "loss": seconds - trainer.parts["generate_and_score"],
        "peak_mb": memory.peak / 2**20,
        "reward": metrics["reward"][-1],
        "mean_length": metrics["completions/mean_length"][-1],
    }


def run(args: argparse.Namespace) -> dict:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in args.variants}
    with TemporaryDirectory() as scratch:
        trainers = {
            name: build_trainer(name, args, f"{scratch}/{i}")
            for i, name in enumerate(args.variants)
        }
        batches = {name: iter(trainers[name].get_train_dataloader()) for name in args.variants}
        for step in range(args.steps):
            first = step % len(args.variants)  # rotate: none always runs on a warmer machine
            for name in args.variants[first:] + args.variants[:first]:
                measured = one_step(trainers[name], next(batches[name]), seed=1000 + step)
                results[name].append(measured)
                print(f"step {step} {name}: " + json.dumps(measured), file=sys.stderr, flush=True)
        precision = None
        if args.replay_precision and "mrtpo/shared" in trainers:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
            from gpu_check import compare_precisions

            precision = compare_precisions(trainers["mrtpo/shared"])
    parts = ("seconds", "generation", "scoring_and_advantages", "replay", "loss")
    summary = {
        name: {part: statistics.median(r[part] for r in runs) for part in parts}
        | {"peak_mb": max(r["peak_mb"] for r in runs)}
        for name, runs in results.items()
    }
    return {
        "args": {k: str(v) for k, v in vars(args).items()},
        "runs": results,
        "summary": summary,
        "replay_precision": precision,
    }


def table(result: dict) -> str:
    summary = result["summary"]
    lines = [
        "| variant | step (s) | generation | scoring + advantages | of which replay | "
        "loss fwd+bwd+opt | peak (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in summary.items():
        lines.append(
            f"| {name} | {s['seconds']:.1f} | {s['generation']:.1f} | "
            f"{s['scoring_and_advantages']:.1f} | {s['replay']:.1f} | {s['loss']:.1f} | "
            f"{s['peak_mb']:.0f} |"
        )
    ratios = []
    for estimator in ("grpo", "gdpo", "mrtpo"):
        on, off = summary.get(f"{estimator}/shared"), summary.get(f"{estimator}/per-row")
        if on and off:
            ratios.append(
                f"{estimator} shared / per-row: {on['seconds'] / off['seconds']:.2f}x "
                f"(loss part {on['loss'] / off['loss']:.2f}x, generation "
                f"{on['generation'] / off['generation']:.2f}x)"
            )
    if "mrtpo/shared" in summary and "gdpo/shared" in summary:
        ratios.append(
            "mrtpo shared / gdpo shared: "
            f"{summary['mrtpo/shared']['seconds'] / summary['gdpo/shared']['seconds']:.2f}x"
        )
    for estimator in ("gdpo", "mrtpo"):
        bf16, fp32 = summary.get(f"{estimator}/shared+bf16"), summary.get(f"{estimator}/shared")
        if bf16 and fp32:
            ratios.append(
                f"{estimator} shared, bf16 autocast / fp32: "
                f"{bf16['seconds'] / fp32['seconds']:.2f}x "
                f"(loss part {bf16['loss'] / fp32['loss']:.2f}x)"
            )
    if "trl-grpo-trainer" in summary and "gdpo/shared" in summary:
        ratios.append(
            "gdpo shared / TRL's GRPOTrainer: "
            f"{summary['gdpo/shared']['seconds'] / summary['trl-grpo-trainer']['seconds']:.2f}x"
        )
    precision = result.get("replay_precision")
    if precision:
        ratios.append(
            "replay distances, bf16 autocast vs fp32 (mrtpo/shared's last batch): max |diff| "
            f"{precision['max_abs_difference']:.2e}, mean {precision['mean_abs_difference']:.2e}, "
            f"correlation {precision['correlation']:.4f}; replay {precision['bf16_replay_seconds']:.1f} "
            f"s vs {precision['fp32_replay_seconds']:.1f} s"
        )
    return "\n".join(lines + [""] + [f"- {line}" for line in ratios])


def main() -> None:
    args = parse_args()
    result = run(args)
    print(
        f"\n{args.model}, task {args.task}, {args.prompts} prompts x {args.generations} "
        f"completions, {args.max_new_tokens} new tokens, {args.steps} steps each, "
        f"{os.cpu_count()} cores, {args.threads} torch thread(s)\n"
    )
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
