"""`mrtpo train`: MRTPO (or GDPO, GRPO) on a task with TRL, configured like TRL's own scripts.

`TrlParser` reads a YAML `--config` (a recipe) and then flags, over three dataclasses: what to
train (`TrainArguments`), the cold-start budget a recipe records for `mrtpo sft`
(`ColdStartArguments`, ignored here) and every `MRTPOConfig` field. Precedence: flag > recipe >
the CPU defaults below > TRL's defaults.

With no arguments it trains the embedded SmolLM2-135M-Instruct on the bundled tool-calling task
with MRTPO, sized to finish in about 10 minutes on 2 CPU cores, with a progress bar and one
summary line per step. Outputs in `output_dir` (default `outputs/<task>-<estimator>`): TRL
checkpoints, `metrics.jsonl`, `curves.png` and the final model folder (model + tokenizer), which
`mrtpo eval --model_name_or_path` takes.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mrtpo.models import DEFAULT_MODEL


@dataclass
class TrainArguments:
    task: str = field(
        default="tool_calling", metadata={"help": "sql, tool_calling or instructions."}
    )
    model_name_or_path: str = field(
        default=DEFAULT_MODEL,
        metadata={
            "help": "The embedded model's name, a local model folder (e.g. from `mrtpo sft`), or a hub id."
        },
    )
    data: str | None = field(
        default=None,
        metadata={
            "help": "The user's files (Spider/BIRD/BFCL/IFEval) for the task's loader; default: bundled data."
        },
    )
    split: str = field(default="train", metadata={"help": "Which split to train on."})
    max_train_examples: int | None = field(
        default=None, metadata={"help": "Train on the first N examples only."}
    )
    dtype: str = field(
        default="float32",
        metadata={
            "help": "Weights' dtype: float32 (with bf16=True, mixed precision), bfloat16 or float16."
        },
    )


@dataclass
class ColdStartArguments:
    """The cold-start budget a recipe records; `mrtpo sft --config` and `mrtpo demo` read it."""

    sft_max_steps: int | None = field(
        default=None, metadata={"help": "mrtpo sft: optimizer steps."}
    )
    sft_learning_rate: float | None = field(
        default=None, metadata={"help": "mrtpo sft: learning rate."}
    )
    sft_per_device_train_batch_size: int | None = field(
        default=None, metadata={"help": "mrtpo sft: demonstrations per micro-batch."}
    )
    sft_gradient_accumulation_steps: int | None = field(
        default=None, metadata={"help": "mrtpo sft: micro-batches per optimizer step."}
    )
    sft_max_train_examples: int | None = field(
        default=None, metadata={"help": "mrtpo sft: number of demonstrations."}
    )


# Sized for the embedded model on 2 CPU cores: ~10 minutes for the tool-calling task. One
# generation of 2 prompts x 4 completions (96 new tokens) per optimizer step, trained in 2
# micro-batches of 4 (a micro-batch of 8 peaks at ~17 GB of activations on CPU; this ~11 GB).
# Measured (the demo's MRTPO run from the cold start, one torch thread, the other core idle):
# 51-109 s a step, mostly generation; 8 steps 10.3 min. Beta ramps over the first 5 steps (the
# paper's 10 on GPU recipes). Learning rate 1e-5: from the demo's cold start, 8 steps at 2e-5
# (MRTPO or GDPO alike) raised the sampled rewards but cut the greedy format rate 0.97 -> 0.81;
# at 1e-5 the sampled rewards still rise and greedy decoding keeps 0.97 (README).
CPU_DEFAULTS: dict[str, Any] = {
    "num_generations": 4,
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 2,
    "max_completion_length": 96,
    "max_steps": 8,
    "mrtpo_warmup_steps": 5,
    "learning_rate": 1e-5,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "logging_steps": 1,
    "save_steps": 5,
    "save_total_limit": 2,
    "report_to": "none",
    "activation_checkpointing": False,
    "bf16": torch.cuda.is_available(),
    "seed": 0,
    "dataloader_pin_memory": torch.cuda.is_available(),
}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_parser() -> Any:
    from trl import TrlParser

    from mrtpo.trainer import MRTPOConfig

    parser = TrlParser((TrainArguments, ColdStartArguments, MRTPOConfig), prog="mrtpo train")
    parser.set_defaults_with_config(**CPU_DEFAULTS)
    return parser


def parse_args(argv: list[str]) -> tuple[TrainArguments, ColdStartArguments, Any]:
    """(what to train, the recorded cold-start budget, MRTPOConfig) from a recipe and flags."""
    argv = list(argv)
    if "--config" in argv:
        at = argv.index("--config")
        if at + 1 >= len(argv):
            raise ValueError("--config needs a YAML path")
        if not Path(argv[at + 1]).is_file():
            raise FileNotFoundError(f"config {argv[at + 1]!r} does not exist")
    script_args, cold_start, config = build_parser().parse_args_and_config(argv)
    if config.output_dir == "trainer_output":  # neither the recipe nor a flag chose one
        config.output_dir = f"outputs/{script_args.task}-{config.advantage_estimator}"
    return script_args, cold_start, config


def load_train_dataset(task: Any, args: TrainArguments) -> Any:
    """The task's split (bundled, or the user's files), cut to `max_train_examples`."""
    if args.data is not None and not Path(args.data).exists():
        raise FileNotFoundError(f"data path {args.data!r} does not exist")
    dataset = task.load(args.split, path=args.data)
    if args.max_train_examples is not None:
        if args.max_train_examples < 1:
            raise ValueError(f"max_train_examples must be >= 1, got {args.max_train_examples}")
        dataset = dataset.select(range(min(args.max_train_examples, len(dataset))))
    if len(dataset) == 0:
        raise ValueError(f"split {args.split!r} of task {args.task!r} has no examples")
    return dataset


def check_reward_weights(verifiers: list[Any], reward_weights: list[float] | None) -> None:
    if reward_weights is not None and len(reward_weights) != len(verifiers):
        names = ", ".join(v.name for v in verifiers)
        raise ValueError(
            f"reward_weights has {len(reward_weights)} values but the task has {len(verifiers)} "
            f"verifiers ({names})"
        )


def resume_path(config: Any) -> str | None:
    """`--resume_from_checkpoint PATH`, or `last`/`true` for the newest checkpoint in output_dir."""
    from transformers.trainer_utils import get_last_checkpoint

    wanted = config.resume_from_checkpoint
    if wanted is None or str(wanted).lower() in {"", "false", "none"}:
        return None
    if str(wanted).lower() in {"last", "true"}:
        found = get_last_checkpoint(config.output_dir) if Path(config.output_dir).is_dir() else None
        if found is None:
            raise FileNotFoundError(f"no checkpoint to resume from in {config.output_dir!r}")
        return found
    if not Path(wanted).is_dir():
        raise FileNotFoundError(f"resume_from_checkpoint {wanted!r} does not exist")
    return str(wanted)


def _number(value: Any, digits: int = 2) -> str:
    """A logged value for the summary line: "-" when missing or NaN (no applicable rows)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if value != value else f"{value:.{digits}f}"


def step_summary(logs: dict[str, Any], step: int, max_steps: int) -> str | None:
    """One line per training log: step, each reward's mean, beta, replay share, step time."""
    rewards = {
        key[len("rewards/") : -len("/mean")]: value
        for key, value in logs.items()
        if key.startswith("rewards/") and key.endswith("/mean")
    }
    if not rewards and "loss" not in logs:
        return None  # the end-of-training summary, not a step
    parts = [f"step {step}/{max_steps}"]
    if "reward" in logs:
        parts.append(f"reward {_number(logs['reward'], 3)}")
    parts.append(" ".join(f"{name} {_number(value)}" for name, value in rewards.items()))
    if "mrtpo/beta" in logs:
        parts.append(f"beta {_number(logs['mrtpo/beta'])}")
    if "mrtpo/replay_share" in logs:
        parts.append(f"replay {_number(100 * (logs['mrtpo/replay_share'] or 0), 0)}%")
    if "step_time" in logs:
        parts.append(f"{_number(logs['step_time'], 1)} s")
    return " | ".join(part for part in parts if part)


def progress_callback() -> Any:
    """TRL's progress bar, writing one summary line per step instead of the raw log dict."""
    from transformers.trainer_callback import ProgressCallback

    class StepSummaryCallback(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or self.training_bar is None or not logs:
                return
            line = step_summary(logs, state.global_step, state.max_steps)
            if line:
                self.training_bar.write(line)

    return StepSummaryCallback()


def main(argv: list[str]) -> int:
    script_args, _cold_start, config = parse_args(argv)
    from transformers.trainer_callback import ProgressCallback

    from mrtpo import tasks
    from mrtpo.models import load_model, resolve_model_path
    from mrtpo.trainer import MRTPOTrainer

    # Cheap checks first, so bad input fails before a model is loaded.
    task = tasks.get(script_args.task)
    if script_args.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {script_args.dtype!r}")
    verifiers = task.verifiers()
    check_reward_weights(verifiers, config.reward_weights)
    if script_args.model_name_or_path != DEFAULT_MODEL:
        resolve_model_path(script_args.model_name_or_path)
    dataset = load_train_dataset(task, script_args)
    checkpoint = resume_path(config)

    model, tokenizer = load_model(script_args.model_name_or_path, dtype=DTYPES[script_args.dtype])
    trainer = MRTPOTrainer(
        model=model,
        reward_funcs=verifiers,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    if not config.disable_tqdm:
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(progress_callback())

    started = time.perf_counter()
    trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(config.output_dir)
    tokenizer.save_pretrained(config.output_dir)
    minutes = (time.perf_counter() - started) / 60
    if trainer.is_world_process_zero():
        output = Path(config.output_dir)
        print(
            f"trained {task.name} with {config.advantage_estimator} for {trainer.state.global_step} steps "
            f"in {minutes:.1f} min; model in {output}, curves in {output / 'curves.png'}",
            file=sys.stdout,
        )
    return 0
