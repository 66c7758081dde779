"""`mrtpo score`: `mrtpo eval`'s scoring on answers made elsewhere (vLLM, an API, a
colleague's run); no model is loaded.

`--responses` is a JSON Lines file (or a folder of them) of `{"id": ..., "response": "<the
response text>"}`, the id being the example's `id` column (its position from 0 when the data
has none). Benchmarks also read their own layouts: BFCL's result files (`{"id", "result"}`,
the result a model's text or a function-calling model's `[{name: arguments}]`, a whole
`result/<model>/` folder at once); for Spider and BIRD `{"id", "sql"}` records, Spider's
prediction file (one query per line, `.txt`/`.sql`) and BIRD's `predict_dev.json`.
Rows without an answer are an error unless `--partial`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mrtpo.cli_options import BenchmarkArguments, DataArguments


@dataclass
class ScoreArguments(DataArguments, BenchmarkArguments):
    responses: str = field(
        default="", metadata={"help": "The answers: a JSON Lines file or folder (see above)."}
    )
    split: str = field(default="test", metadata={"help": "Which split the answers answer."})
    output_dir: str | None = field(
        default=None, metadata={"help": "Where eval.json goes (default outputs/score-<task>)."}
    )
    partial: bool = field(
        default=False,
        metadata={"help": "Score the answered examples only (others are an error without it)."},
    )


def parse_args(argv: list[str]) -> ScoreArguments:
    from trl import TrlParser

    (args,) = TrlParser(ScoreArguments, prog="mrtpo score").parse_args_and_config(argv)
    if not args.responses:
        raise ValueError("--responses is required: the answers file or folder to score")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from mrtpo.evaluation import run_score

    run_score(
        task=args.task,
        responses=args.responses,
        split=args.split,
        data=args.data,
        max_examples=args.max_examples,
        output_dir=args.output_dir,
        categories=args.category_list(),
        partial=args.partial,
    )
    return 0
