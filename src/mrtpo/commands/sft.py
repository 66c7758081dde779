"""`mrtpo sft`: a short supervised cold start on a task's reference responses.

A small model may never produce the task's output format, so every binary format reward is 0,
no group has variance and RL learns nothing. A few optimizer steps of supervised fine-tuning on
correct responses fix that. We use TRL's `SFTTrainer` on a prompt-completion dataset:
`prompt` is the task's chat messages (the very column `mrtpo train` generates from, rendered by
the same chat template with the generation prompt) and `completion` is one assistant message
holding the task's reference response, so TRL puts the loss on the completion only.

`mrtpo sft --config recipes/X.yaml` reads the recipe's `task`, `model_name_or_path`, `data`
and its `sft_*` keys (the recorded cold-start budget, e.g. `sft_max_steps`).
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
class SFTArguments:
    task: str = field(
        default="tool_calling", metadata={"help": "sql or tool_calling (tasks with references)."}
    )
    model_name_or_path: str = field(
        default=DEFAULT_MODEL,
        metadata={"help": "The embedded model's name, a local model folder, or a hub id."},
    )
    data: str | None = field(
        default=None, metadata={"help": "The user's training files for the task's loader."}
    )
    split: str = field(default="train", metadata={"help": "Which split holds the references."})
    max_train_examples: int | None = field(
        default=64, metadata={"help": "Number of demonstrations (the first N after shuffling)."}
    )


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

# Recipe keys `mrtpo sft --config` takes (the rest belong to `mrtpo train`).
RECIPE_KEYS = ("task", "model_name_or_path", "data")


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


def recipe_defaults(config_path: str) -> dict[str, Any]:
    """The `mrtpo sft` settings a training recipe records: task, model, data and `sft_*` keys."""
    import yaml

    if not Path(config_path).is_file():
        raise FileNotFoundError(f"config {config_path!r} does not exist")
    recipe = yaml.safe_load(Path(config_path).read_text()) or {}
    if not isinstance(recipe, dict):
        raise ValueError(f"config {config_path!r} must hold a YAML mapping")
    defaults = {key: recipe[key] for key in RECIPE_KEYS if key in recipe}
    defaults.update({key[4:]: value for key, value in recipe.items() if key.startswith("sft_")})
    return defaults


def parse_args(argv: list[str]) -> tuple[SFTArguments, Any]:
    from trl import SFTConfig, TrlParser

    argv = list(argv)
    parser = TrlParser((SFTArguments, SFTConfig), prog="mrtpo sft")
    parser.set_defaults_with_config(**SFT_DEFAULTS)
    if "--config" in argv:
        at = argv.index("--config")
        if at + 1 >= len(argv):
            raise ValueError("--config needs a YAML path")
        unknown = parser.set_defaults_with_config(**recipe_defaults(argv[at + 1]))
        if unknown:
            raise ValueError(f"unknown sft_ keys in {argv[at + 1]}: {unknown[::2]}")
        del argv[at : at + 2]
    script_args, config = parser.parse_args_into_dataclasses(args=argv)
    if "--output_dir" not in argv and not config.output_dir.startswith("outputs/"):
        config.output_dir = f"outputs/sft-{script_args.task}"
    return script_args, config


def build_trainer(script_args: SFTArguments, config: Any) -> Any:
    """TRL's SFTTrainer on the task's references, with the model and tokenizer loaded."""
    from trl import SFTTrainer

    from mrtpo import tasks
    from mrtpo.models import load_model

    task = tasks.get(script_args.task)
    if script_args.data is not None and not Path(script_args.data).exists():
        raise FileNotFoundError(f"data path {script_args.data!r} does not exist")
    dataset = cold_start_dataset(
        task, script_args.split, script_args.data, script_args.max_train_examples, config.seed
    )
    model, tokenizer = load_model(script_args.model_name_or_path)
    return SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)


def main(argv: list[str]) -> int:
    script_args, config = parse_args(argv)
    started = time.perf_counter()
    trainer = build_trainer(script_args, config)
    result = trainer.train()
    trainer.save_model(config.output_dir)
    trainer.processing_class.save_pretrained(config.output_dir)
    seconds = time.perf_counter() - started
    print(
        f"sft: {trainer.state.global_step} steps on {len(trainer.train_dataset)} {script_args.task} "
        f"demonstrations, loss {result.training_loss:.4f}, {seconds:.0f} s -> {config.output_dir}",
        file=sys.stdout,
    )
    return 0
