"""Training a task with MRTPO (or GDPO, GRPO) end to end: the split, the model, TRL's trainer
with one summary line per step, the saved model. `mrtpo train` and the demo call `run_training`.

`CPU_DEFAULTS` are the `MRTPOConfig` values `mrtpo train` starts from (under a recipe and
flags); `train_config` builds a config from them and overrides.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from mrtpo.models import EMBEDDED_MODELS

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
    "mrtpo_beta": "auto",  # beta from the run's own gradients (docs/METHOD.md); 0.5 is the paper's
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


def train_config(**overrides: Any) -> Any:
    """An `MRTPOConfig` of `CPU_DEFAULTS` with `overrides` on top (what `mrtpo train` parses
    from the same flags)."""
    from mrtpo.trainer import MRTPOConfig

    return MRTPOConfig(**{**CPU_DEFAULTS, **overrides})


def load_train_dataset(
    task: Any, split: str = "train", data: str | None = None, max_train_examples: int | None = None
) -> Any:
    """The task's split (bundled, or the user's files at `data`), cut to `max_train_examples`."""
    if data is not None and not Path(data).exists():
        raise FileNotFoundError(f"data path {data!r} does not exist")
    dataset = task.load(split, path=data)
    if max_train_examples is not None:
        if max_train_examples < 1:
            raise ValueError(f"max_train_examples must be >= 1, got {max_train_examples}")
        dataset = dataset.select(range(min(max_train_examples, len(dataset))))
    if len(dataset) == 0:
        raise ValueError(f"split {split!r} of task {task.name!r} has no examples")
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
    """One line per training log: step, each reward's mean, the share of groups whose rewards
    vary (0%: nothing to learn from), beta, replay share, step time."""
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
    if "mrtpo/varying_groups" in logs and logs["mrtpo/varying_groups"] is not None:
        parts.append(f"varying groups {_number(100 * logs['mrtpo/varying_groups'], 0)}%")
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


class _ProgressBarHandler(logging.Handler):
    """Writes log records as lines above tqdm's progress bar (`tqdm.write`), not through it."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm.auto import tqdm

        try:
            tqdm.write(f"{record.levelname.lower()}: {self.format(record)}")
        except Exception:  # noqa: BLE001 -- logging's own contract: report, never raise
            self.handleError(record)


@contextlib.contextmanager
def console_warnings() -> Iterator[None]:
    """While training: mrtpo's warnings (a run that cannot learn, a fallback) on the console as
    lines of their own above the progress bar, where no logging is configured (Python's last
    resort would write them to stderr across the bar). A program that configured logging keeps
    its own handlers and gets nothing more."""
    package = logging.getLogger("mrtpo")
    if package.hasHandlers():
        yield
        return
    handler = _ProgressBarHandler(logging.WARNING)
    package.addHandler(handler)
    try:
        yield
    finally:
        package.removeHandler(handler)


def run_training(
    task: str,
    model_name_or_path: str,
    config: Any,
    data: str | None = None,
    split: str = "train",
    max_train_examples: int | None = None,
    dtype: str = "float32",
    callbacks: Sequence[Any] = (),
) -> Path:
    """All of `mrtpo train` (keywords named as its arguments; `config` an `MRTPOConfig`): train
    on the task's split, resuming if the config says so, and save the model and tokenizer into
    `config.output_dir`, which it returns. `callbacks`: more `TrainerCallback`s for the trainer
    (a benchmark keeping a step's policy, for example)."""
    from transformers.trainer_callback import ProgressCallback

    from mrtpo import tasks
    from mrtpo.models import load_model, resolve_model_path
    from mrtpo.trainer import MRTPOTrainer

    # Cheap checks first, so bad input fails before a model is loaded.
    task_object = tasks.get(task)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if model_name_or_path not in EMBEDDED_MODELS:  # converted by load_model below
        resolve_model_path(model_name_or_path)
    dataset = load_train_dataset(task_object, split, data, max_train_examples)
    verifiers = task_object.verifiers_for(dataset)  # every reward of the longest row
    check_reward_weights(verifiers, config.reward_weights)
    checkpoint = resume_path(config)

    model, tokenizer = load_model(model_name_or_path, dtype=DTYPES[dtype])
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
    for callback in callbacks:
        trainer.add_callback(callback)

    started = time.perf_counter()
    with console_warnings():
        trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(config.output_dir)
    tokenizer.save_pretrained(config.output_dir)
    minutes = (time.perf_counter() - started) / 60
    output = Path(config.output_dir)
    if trainer.is_world_process_zero():
        print(
            f"trained {task_object.name} with {config.advantage_estimator} for "
            f"{trainer.state.global_step} steps in {minutes:.1f} min; model in {output}, "
            f"curves in {output / 'curves.png'}"
        )
    return output
