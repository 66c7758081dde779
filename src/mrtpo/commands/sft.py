"""`mrtpo sft`: a short supervised cold start on a task's reference responses.

A small model may never produce the task's output format, so every binary format reward is 0,
no group has variance and RL learns nothing. A few optimizer steps of TRL's `SFTTrainer` on
correct responses fix that (`mrtpo.cold_start`: the loss is on the reference completion only,
after the very prompt `mrtpo train` generates from). Defaults: `mrtpo.cold_start.SFT_DEFAULTS`.

`mrtpo sft --config recipes/X.yaml` reads the recipe's `task`, `model_name_or_path`, `data`
and its `sft_*` keys (the recorded cold-start budget, e.g. `sft_max_steps`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mrtpo.cli_options import TaskArguments
from mrtpo.cold_start import SFT_DEFAULTS, UNTRAINED_TOKEN_CHOICES, build_sft_trainer, run_sft


@dataclass
class SFTArguments(TaskArguments):
    task: str = field(
        default="tool_calling", metadata={"help": "sql or tool_calling (tasks with references)."}
    )
    split: str = field(default="train", metadata={"help": "Which split holds the references."})
    max_train_examples: int | None = field(
        default=64, metadata={"help": "Number of demonstrations (the first N after shuffling)."}
    )
    untrained_tokens: str = field(
        default="fit",
        metadata={
            "help": "Embedding rows the model never trained that the references use (e.g. "
            "Qwen2.5-Coder-0.5B's <tool_call>): 'fit' the output row to the references, 'mean' "
            "(each row from the mean of the rows of the pieces its text splits into), or 'keep' them "
            "and only warn.",
            "choices": UNTRAINED_TOKEN_CHOICES,
        },
    )


# Recipe keys `mrtpo sft --config` takes (the rest belong to `mrtpo train`).
RECIPE_KEYS = ("task", "model_name_or_path", "data")


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
    """TRL's SFTTrainer for the parsed arguments (`mrtpo.cold_start.build_sft_trainer`)."""
    return build_sft_trainer(config=config, **asdict(script_args))


def main(argv: list[str]) -> int:
    script_args, config = parse_args(argv)
    run_sft(build_trainer(script_args, config), script_args.task)
    return 0
