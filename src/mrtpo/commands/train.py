"""`mrtpo train`: MRTPO (or GDPO, GRPO) on a task with TRL, configured like TRL's own scripts.

`TrlParser` reads a YAML `--config` (a recipe) and then flags, over three dataclasses: what to
train (`TrainArguments`), the cold-start budget a recipe records for `mrtpo sft`
(`ColdStartArguments`, ignored here) and every `MRTPOConfig` field. Precedence: flag > recipe >
the CPU defaults (`mrtpo.training.CPU_DEFAULTS`) > TRL's defaults.

With no arguments it trains the embedded SmolLM2-135M-Instruct on the bundled tool-calling task
with MRTPO, sized to finish in about 10 minutes on 2 CPU cores, with a progress bar and one
summary line per step (`mrtpo.training.run_training`). Outputs in `output_dir` (default
`outputs/<task>-<estimator>`): TRL checkpoints, `metrics.jsonl`, `curves.png` and the final
model folder (model + tokenizer), which `mrtpo eval --model_name_or_path` takes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mrtpo.cli_options import TaskArguments
from mrtpo.training import CPU_DEFAULTS, run_training


@dataclass
class TrainArguments(TaskArguments):
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


def build_parser() -> Any:
    from trl import TrlParser

    from mrtpo.config import parse_beta
    from mrtpo.trainer import MRTPOConfig

    parser = TrlParser((TrainArguments, ColdStartArguments, MRTPOConfig), prog="mrtpo train")
    # `mrtpo_beta: float | str` gets the parser's float type, which refuses "auto".
    for action in parser._actions:
        if action.dest == "mrtpo_beta":
            action.type = parse_beta
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


def main(argv: list[str]) -> int:
    script_args, _cold_start, config = parse_args(argv)
    run_training(config=config, **asdict(script_args))
    return 0
