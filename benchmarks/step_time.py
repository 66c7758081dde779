"""Benchmark: one MRTPO training step against one GDPO training step, side by side.

The same step for every variant: the embedded model (or `--model`: e.g. a cold-start
checkpoint), the bundled SQL task (or `--task`), 8 prompts x 4 completions, 128 new tokens;
generation, verification, (MRTPO: replay), loss, backward and optimizer step. The trainers take
turns step by step in one process, each step starting from the same seed so that all sample
the same way:
  gdpo;
  mrtpo (as it trains: only the (row, reward) pairs whose advantage Ã_k is not 0 are replayed,
  which is exact: elsewhere the weights multiply 0);
  mrtpo-rows (every reward of a row where some Ã_k is not 0: how MRTPO trained before it
  skipped single rewards; same advantages);
  mrtpo-every-row (every pair of every row: the replay's full cost, what MRTPO costs once
  every reward varies in every group).
We report each one's median step time, the ratios to GDPO (target: MRTPO as trained at most
1.10x), the replay's seconds, the share of rows and of contexts replayed, the share of
(row, reward) pairs with Ã_k = 0, and the peak memory of a step (CUDA: peak allocated; CPU:
peak resident memory above the step's start).

    .venv/bin/python benchmarks/step_time.py            # the full setting
    .venv/bin/python benchmarks/step_time.py --quick    # 2 prompts x 4, 32 tokens, 3 steps
    # as trained on the tool task, from the cold-start checkpoint (`mrtpo sft --task
    # tool_calling --output_dir outputs/sft-tool`), where groups do vary:
    .venv/bin/python benchmarks/step_time.py --model outputs/sft-tool --task tool_calling
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path
from tempfile import TemporaryDirectory

import torch

VARIANTS = ("gdpo", "mrtpo", "mrtpo-rows", "mrtpo-every-row")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="smollm2-135m-instruct", help="name, local folder or 'tiny'"
    )
    parser.add_argument("--task", default="sql")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per variant first")
    parser.add_argument("--quick", action="store_true", help="2 prompts x 4, 32 tokens, 3 steps")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, from {', '.join(VARIANTS)} (gdpo is always run: the baseline)",
    )
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.max_new_tokens, args.steps = 2, 32, 3
    for name in ("prompts", "generations", "max_new_tokens", "steps"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    chosen = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {', '.join(unknown)}; choose from {VARIANTS}")
    args.variants = tuple(name for name in VARIANTS if name == "gdpo" or name in chosen)
    return args


class PeakMemory:
    """Peak memory of a block: CUDA peak allocated bytes, or on CPU the peak resident set size
    above the block's start (sampled every 2 ms from /proc/self/statm)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak = 0

    def _rss(self) -> int:
        with open("/proc/self/statm") as file:
            return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss() - self._start)
            time.sleep(0.002)

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._start = self._rss()
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            self._thread.join()


def build_trainer(variant: str, args: argparse.Namespace, output_dir: str):
    """An MRTPOTrainer ready to step by hand: optimizer, scheduler and activation checkpointing
    set up as `Trainer.train` would."""
    from mrtpo import advantages, tasks
    from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

    class Measured(MRTPOTrainer):
        """Keeps each step's share of (row, reward) pairs with Ã_k = 0 (NaN counted as 0, as
        the trainer counts it), whatever the estimator."""

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            normalized = advantages.per_reward(self._scored.rewards, self.num_generations)
            self.zero_advantage_share = (torch.nan_to_num(normalized) == 0).float().mean().item()
            return output

    class RowsReplayed(Measured):
        """Every reward of a row where some Ã_k is not 0 (before single rewards were skipped)."""

        def _pairs_to_replay(self, normalized):
            rows = (normalized != 0).any(dim=1, keepdim=True)
            return rows.expand_as(normalized).clone()

    class EveryRowReplayed(Measured):
        """MRTPO without its exact skips: every pair of every row, the replay's full cost."""

        def _pairs_to_replay(self, normalized):
            return torch.ones_like(normalized, dtype=torch.bool)

    estimator = "mrtpo" if variant.startswith("mrtpo") else variant
    trainer_class = {"mrtpo-rows": RowsReplayed, "mrtpo-every-row": EveryRowReplayed}.get(
        variant, Measured
    )

    if args.model == "tiny":
        from mrtpo.testing import tiny_model_and_tokenizer

        model, tokenizer = tiny_model_and_tokenizer()
    else:
        from mrtpo.models import load_model

        model, tokenizer = load_model(args.model)
    task = tasks.get(args.task)
    config = MRTPOConfig(
        output_dir=output_dir,
        advantage_estimator=estimator,
        mrtpo_warmup_steps=0,  # the full beta from the first step (the cost does not depend on it)
        per_device_train_batch_size=args.prompts * args.generations,
        num_generations=args.generations,
        max_completion_length=args.max_new_tokens,
        max_steps=args.warmup + args.steps,
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        report_to=[],
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    trainer = trainer_class(
        model=model,
        reward_funcs=task.verifiers(),
        args=config,
        train_dataset=task.load("train"),
        processing_class=tokenizer,
    )
    return ready_to_step(trainer)


def ready_to_step(trainer):
    """`trainer` set up as `Trainer.train` would before its first step (optimizer, scheduler,
    activation checkpointing, one micro-batch a step), to be stepped by hand."""
    config = trainer.args
    trainer.create_optimizer_and_scheduler(num_training_steps=config.max_steps)
    if config.activation_checkpointing:  # Trainer.train would turn it on (TRL's default: on)
        kwargs = dict(config.activation_checkpointing_kwargs or {})
        trainer.model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=kwargs or None
        )
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which we step by hand
    trainer.model.train()
    return trainer


def one_step(trainer, batch: list[dict], seed: int) -> dict[str, float]:
    """Generate, score, (replay), loss, backward, optimizer step; seconds and peak memory."""
    torch.manual_seed(seed)  # every variant samples the same way at the same step
    trainer._metrics["train"].clear()
    device = trainer.accelerator.device
    with PeakMemory(device) as memory:
        started = time.perf_counter()
        trainer.training_step(trainer.model, batch, None)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
    trainer.state.global_step += 1
    metrics = trainer._metrics["train"]
    replay = metrics.get("mrtpo/replay_seconds")
    replayed = metrics.get("mrtpo/replayed_rows_share")
    contexts = metrics.get("mrtpo/replayed_contexts_share")
    return {
        "seconds": seconds,
        "replay_seconds": replay[-1] if replay else 0.0,
        "replayed_rows_share": replayed[-1] if replayed else 0.0,
        "replayed_contexts_share": contexts[-1] if contexts else 0.0,
        "zero_advantage_share": trainer.zero_advantage_share,
        "peak_mb": memory.peak / 2**20,
        "mean_length": metrics["completions/mean_length"][-1],
    }


def main() -> None:
    args = parse_args()
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    variants = args.variants
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    with TemporaryDirectory() as scratch:
        trainers = {
            name: build_trainer(name, args, os.path.join(scratch, name)) for name in variants
        }
        batches = {name: iter(trainers[name].get_train_dataloader()) for name in variants}
        for step in range(args.warmup + args.steps):
            # Rotate which variant goes first, so that none always runs on a warmer machine.
            first = step % len(variants)
            order = variants[first:] + variants[:first]
            for name in order:
                measured = one_step(trainers[name], next(batches[name]), seed=1000 + step)
                if step >= args.warmup:
                    results[name].append(measured)
                print(
                    f"step {step} {name}: {measured['seconds']:.2f} s "
                    f"(replay {measured['replay_seconds']:.2f} s of "
                    f"{measured['replayed_rows_share']:.0%} of the rows, "
                    f"{measured['replayed_contexts_share']:.0%} of the contexts; "
                    f"Ã_k = 0 on {measured['zero_advantage_share']:.0%} of the pairs; "
                    f"peak {measured['peak_mb']:.0f} MB, mean length {measured['mean_length']:.0f})",
                    file=sys.stderr,
                    flush=True,
                )

    device = (
        "CUDA " + torch.cuda.get_device_name()
        if torch.cuda.is_available()
        else f"CPU ({os.cpu_count()} cores)"
    )
    summary = {}
    for name in variants:
        runs = results[name]
        summary[name] = {
            "median_seconds": statistics.median(r["seconds"] for r in runs),
            "median_replay_seconds": statistics.median(r["replay_seconds"] for r in runs),
            "replayed_rows_share": statistics.mean(r["replayed_rows_share"] for r in runs),
            "replayed_contexts_share": statistics.mean(r["replayed_contexts_share"] for r in runs),
            "zero_advantage_share": statistics.mean(r["zero_advantage_share"] for r in runs),
            "peak_mb": max(r["peak_mb"] for r in runs),
            "mean_length": statistics.mean(r["mean_length"] for r in runs),
        }
    ratios = {
        name: summary[name]["median_seconds"] / summary["gdpo"]["median_seconds"]
        for name in variants
    }
    print(
        f"\n{args.model}, task {args.task}, {args.prompts} prompts x {args.generations} completions, "
        f"{args.max_new_tokens} new tokens, {args.steps} timed steps each (+{args.warmup} warm-up), "
        f"{device}, {torch.get_num_threads()} torch threads\n"
    )
    print(
        "| variant | median step (s) | / GDPO | of which replay (s) | rows replayed | "
        "contexts replayed | pairs with Ã_k = 0 | peak step memory (MB) | mean completion length |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in variants:
        s = summary[name]
        print(
            f"| {name} | {s['median_seconds']:.2f} | {ratios[name]:.2f}x | "
            f"{s['median_replay_seconds']:.2f} | {s['replayed_rows_share']:.0%} | "
            f"{s['replayed_contexts_share']:.0%} | {s['zero_advantage_share']:.0%} | "
            f"{s['peak_mb']:.0f} | {s['mean_length']:.1f} |"
        )
    if "mrtpo" in variants:
        print(
            f"\nMRTPO as trained / GDPO median step time: {ratios['mrtpo']:.2f}x (target <= 1.10x)"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"json": str(args.json)},
                    "runs": results,
                    "summary": summary,
                    "ratios": ratios,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
