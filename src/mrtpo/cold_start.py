"""The supervised cold start: a few optimizer steps of TRL's `SFTTrainer` on a task's reference
responses, so that a small model produces the task's output format before RL.

A model that never writes the format gets 0 from every binary format reward, no group has
variance and RL learns nothing. The dataset is prompt-completion: `prompt` is the task's chat
messages (the very column `mrtpo train` generates from, rendered by the same chat template with
the generation prompt) and `completion` is one assistant message holding the task's reference
response, so TRL puts the loss on the completion only. `mrtpo sft` and the demo call
`build_sft_trainer` and `run_sft`.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import torch

# The measured cold-start budget for the embedded model (see recipes/tool_calling.yaml):
# 64 demonstrations, batch 8 (2 per micro-batch x 4 accumulated: a micro-batch of 8 tool-calling
# examples peaks at ~17 GB of activations on CPU, 2 at ~6 GB), lr 5e-5.
SFT_DEFAULTS: dict[str, Any] = {
    "max_steps": 3,
    "learning_rate": 5e-5,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 4,
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "max_length": None,  # never cut a prompt: the completion would lose its context
    "completion_only_loss": True,
    "activation_checkpointing": False,
    "bf16": torch.cuda.is_available(),
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "dataloader_pin_memory": torch.cuda.is_available(),
}


def sft_config(**overrides: Any) -> Any:
    """TRL's `SFTConfig` of `SFT_DEFAULTS` with `overrides` on top (what `mrtpo sft` parses from
    the same flags)."""
    from trl import SFTConfig

    return SFTConfig(**{**SFT_DEFAULTS, **overrides})


def cold_start_dataset(
    task: Any,
    split: str = "train",
    path: str | None = None,
    max_examples: int | None = None,
    seed: int = 0,
) -> Any:
    """Prompt-completion rows from the task's references: prompt = the task's chat messages,
    completion = [{"role": "assistant", "content": reference}]. Rows without a reference are
    skipped; a task with none raises ValueError."""
    from datasets import Dataset

    data = task.load(split, path=path).shuffle(seed=seed)
    rows = []
    for example in data:
        reference = task.reference_completion(example)
        if reference is None:
            continue
        rows.append(
            {
                "prompt": example["prompt"],
                "completion": [{"role": "assistant", "content": reference}],
            }
        )
        if max_examples is not None and len(rows) >= max_examples:
            break
    if not rows:
        raise ValueError(
            f"task {task.name!r} has no reference responses in its {split!r} split, so there is "
            "nothing to fine-tune on: pass --data with reference responses, or train with RL directly"
        )
    return Dataset.from_list(rows)


def build_sft_trainer(
    task: str,
    model_name_or_path: str,
    config: Any,
    data: str | None = None,
    split: str = "train",
    max_train_examples: int | None = 64,
) -> Any:
    """TRL's SFTTrainer on the task's references (keywords named as `mrtpo sft`'s arguments;
    `config` an `SFTConfig`), with the model and tokenizer loaded."""
    from trl import SFTTrainer

    from mrtpo import tasks
    from mrtpo.models import load_model

    task_object = tasks.get(task)
    if data is not None and not Path(data).exists():
        raise FileNotFoundError(f"data path {data!r} does not exist")
    dataset = cold_start_dataset(task_object, split, data, max_train_examples, config.seed)
    model, tokenizer = load_model(model_name_or_path)
    warn_untrained_tokens(model, tokenizer, dataset)
    return SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)


def warn_untrained_tokens(model: Any, tokenizer: Any, dataset: Any) -> list[int]:
    """Warn when the references use tokens whose embedding rows were never trained (a model
    that cannot write them; `mrtpo.models.untrained_token_ids`); returns those ids."""
    from mrtpo.models import untrained_token_ids

    used = {
        token_id
        for row in dataset
        for token_id in tokenizer(row["completion"][0]["content"], add_special_tokens=False)[
            "input_ids"
        ]
    }
    untrained = untrained_token_ids(model, used)
    if untrained:
        names = ", ".join(f"{tokenizer.convert_ids_to_tokens(i)!r} ({i})" for i in untrained)
        warnings.warn(
            f"the references use tokens whose embedding rows this model never trained: {names}. "
            "The model gives them almost no probability, and a few fine-tuning steps at a small "
            "learning rate do not teach it to write them (docs/results/embedded-models.md)",
            stacklevel=2,
        )
    return untrained


def run_sft(trainer: Any, task: str) -> Path:
    """Train `trainer` (from `build_sft_trainer` on `task`), save the model and tokenizer into
    its output_dir and print one line; returns that folder."""
    started = time.perf_counter()
    result = trainer.train()
    output = Path(trainer.args.output_dir)
    trainer.save_model(str(output))
    trainer.processing_class.save_pretrained(str(output))
    seconds = time.perf_counter() - started
    print(
        f"sft: {trainer.state.global_step} steps on {len(trainer.train_dataset)} {task} "
        f"demonstrations, loss {result.training_loss:.4f}, {seconds:.0f} s -> {output}"
    )
    return output
