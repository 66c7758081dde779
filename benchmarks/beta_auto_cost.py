"""Benchmark: the step cost of `mrtpo_beta: auto` against a fixed beta, side by side.

One process, the embedded SmolLM2-135M-Instruct (or `--model`), the bundled tool-calling task,
2 prompts x 4 completions per micro-batch, 2 micro-batches a step (so a probe has pairs inside
its step), 32 new tokens. Three trainers from the same seed, one after the other for
`--steps` optimizer steps each: fixed beta 0.5 (no warm-up), auto at the default probe period
(every 4 steps) and auto probing every step (the probe's own cost). Each optimizer step is
timed from `on_step_begin` to `on_step_end` (generation, scoring, replay, loss, backward, the
probe, optimizer); we report each variant's median and mean step time and the ratios to the
fixed beta's (the mean is what a run pays: probed steps are 1 in 4 at the default, so the
median is a step that did not probe). Other jobs share the CPU: ratios only.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/beta_auto_cost.py --steps 8
"""

from __future__ import annotations

import argparse
import statistics
import time
from tempfile import TemporaryDirectory

import torch
from transformers import TrainerCallback

VARIANTS = {
    "fixed 0.5": dict(mrtpo_beta=0.5),
    "auto (probe every 4)": dict(mrtpo_beta="auto"),
    "auto (probe every step)": dict(mrtpo_beta="auto", mrtpo_beta_probe_every=1),
}


class StepTimer(TrainerCallback):
    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self._started)


def run(settings: dict, args: argparse.Namespace, output_dir: str) -> list[float]:
    from mrtpo import tasks
    from mrtpo.models import load_model
    from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

    model, tokenizer = load_model(args.model)
    task = tasks.get("tool_calling")
    config = MRTPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=8,
        num_generations=4,
        gradient_accumulation_steps=2,
        max_completion_length=32,
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
    return timer.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    for name, settings in VARIANTS.items():
        with TemporaryDirectory() as output_dir:
            results[name] = run(settings, args, output_dir)
    fixed = results["fixed 0.5"]
    for name, seconds in results.items():
        median, mean = statistics.median(seconds), statistics.fmean(seconds)
        print(
            f"{name:24s} median x{median / statistics.median(fixed):.2f}  "
            f"mean x{mean / statistics.fmean(fixed):.2f}  "
            f"(steps: {', '.join(f'{s:.1f}' for s in seconds)} s)"
        )


if __name__ == "__main__":
    main()
