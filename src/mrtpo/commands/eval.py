"""`mrtpo eval`: generation on a task's split, each verifier's mean and the headline.

Prompts are rendered exactly as `mrtpo train` renders them (the chat template with the
generation prompt and the same `chat_template_kwargs`; completions decoded with special tokens
skipped), generated in left-padded batches (greedily by default; `--temperature T
--num_samples N` samples N completions per prompt as training does, seeded), and scored with the
task's verifiers: `mrtpo.generation`, then `mrtpo.evaluation.score_responses`.

Writes `eval.json` (per-example prompt, completion and verdicts, plus the summary) into
`output_dir` and prints a table.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from mrtpo.commands.common import TaskArguments


@dataclass
class EvalArguments(TaskArguments):
    split: str = field(default="test", metadata={"help": "Which split to evaluate."})
    max_examples: int | None = field(
        default=None, metadata={"help": "Evaluate the first N examples only."}
    )
    output_dir: str | None = field(
        default=None, metadata={"help": "Where eval.json goes (default outputs/eval-<task>)."}
    )
    batch_size: int = field(default=8, metadata={"help": "Prompts generated at once."})
    max_new_tokens: int = field(
        default=256, metadata={"help": "Generation length limit (train's max_completion_length)."}
    )
    chat_template_kwargs: str | None = field(
        default=None,
        metadata={"help": "JSON dict passed to the chat template, as in `mrtpo train`."},
    )
    temperature: float = field(
        default=0.0,
        metadata={
            "help": "0: greedy. Above 0: sample (no top-k/top-p cut, as `mrtpo train` samples)."
        },
    )
    num_samples: int = field(
        default=1, metadata={"help": "Completions per prompt (more than 1 needs a temperature)."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the sampling."})


def parse_args(argv: list[str]) -> EvalArguments:
    from trl import TrlParser

    (args,) = TrlParser(EvalArguments, prog="mrtpo eval").parse_args_and_config(argv)
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from mrtpo.evaluation import run_eval

    chat_template_kwargs = (
        json.loads(args.chat_template_kwargs) if args.chat_template_kwargs else None
    )
    run_eval(**{**asdict(args), "chat_template_kwargs": chat_template_kwargs})
    return 0
