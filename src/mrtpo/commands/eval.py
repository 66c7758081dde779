"""`mrtpo eval`: generation on a task's split or a benchmark, then `mrtpo score`'s scoring.

Prompts are rendered exactly as `mrtpo train` renders them (the chat template with the
generation prompt and the same `chat_template_kwargs`; completions decoded with special tokens
skipped), generated in left-padded batches, shortest prompts first (greedily by default;
`--temperature T --num_samples N` samples N completions per prompt as training does, seeded),
and scored with the task's verifiers: `mrtpo.generation`, then
`mrtpo.evaluation.score_responses`, the code `mrtpo score` runs on answers made elsewhere.

`--data` may be a benchmark the task knows: BFCL v4's data folder (or one category's file) for
tool_calling, with `--categories`; Spider's or BIRD's folder for sql; an IFEval or IFBench JSONL
file or MulDimIF's JSON file for instructions. The table then has one row per category,
database, instruction id, or MulDimIF pattern, level, category and type, and the benchmark's
summary rows, computed as its official
evaluation computes them. Writes `eval.json` (every number, and each response with its
verdicts) into `output_dir` and prints the table and the time taken.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from mrtpo.cli_options import BenchmarkArguments, TaskArguments


@dataclass
class EvalArguments(TaskArguments, BenchmarkArguments):
    split: str = field(default="test", metadata={"help": "Which split to evaluate."})
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
    options = {**asdict(args), "chat_template_kwargs": chat_template_kwargs}
    run_eval(**{**options, "categories": args.category_list()})
    return 0
