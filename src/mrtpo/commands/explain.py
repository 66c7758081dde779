"""`mrtpo explain`: the credit map of one response, where each reward's advantage lands.

    mrtpo explain --task T [--model_name_or_path M] [--example N | --prompt-file P
        --response-file R] [--split test] [--beta 0.5] [--num-samples 4] [--output_dir DIR]

The response is the model's greedy answer to row N of the split, or the text of
`--response-file` (tokenized once, plus the eos token, then never re-tokenized). The prompt is
row N's, or `--prompt-file`: a text file (the user message, after the task's system prompt) or
a JSON object (a dataset row: `prompt` and the columns the verifiers read). The verifiers always
read row N's columns unless the JSON row brings its own.

Advantages need a group: the response is put in a group with `--num-samples` responses sampled
from the same prompt (temperature 1, seed `--seed`: deterministic on a given machine), and the
per-reward advantages Ã_k, GDPO's advantage and MRTPO's per-token advantages A_t are those of
the group (the batch is the group). Only the explained response is replayed: A_t of a row
depends on the other rows only through their rewards. With `--num-samples 0` there is no group,
and the map shows replay distances instead of advantages. Rewards that do not apply to the row
(score None) are left off the map.

Writes `credit.html`, `credit.png` and `group.json` (the group's responses and scores) into
`--output_dir`, prints the map on the terminal and the command that opens the page
(`mrtpo.explaining.run_explain`).
"""

from __future__ import annotations

import argparse

from mrtpo.models import DEFAULT_MODEL


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mrtpo explain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True, help="sql, tool_calling or instructions")
    parser.add_argument("--model_name_or_path", "--model-name-or-path", default=DEFAULT_MODEL)
    parser.add_argument(
        "--split", default="test", help="the split --example indexes (default test)"
    )
    parser.add_argument(
        "--data", default=None, help="the user's benchmark files for the task's loader"
    )
    parser.add_argument("--example", type=int, default=0, help="row of the split (default 0)")
    parser.add_argument("--prompt-file", "--prompt_file", dest="prompt_file", default=None)
    parser.add_argument("--response-file", "--response_file", dest="response_file", default=None)
    parser.add_argument("--beta", type=float, default=0.5, help="MRTPO's allocation strength")
    parser.add_argument("--num-samples", "--num_samples", dest="num_samples", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0, help="for the sampled group")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max_new_tokens", "--max-new-tokens", dest="max_new_tokens", type=int, default=256
    )
    parser.add_argument(
        "--mode", default="leave_one_out", help="replay mode: leave_one_out or add_one"
    )
    # --output_dir, as every other command spells it; --out, this command's first spelling.
    parser.add_argument(
        "--output_dir",
        "--output-dir",
        "--out",
        dest="output_dir",
        default=None,
        help="output folder (default outputs/explain-<task>)",
    )
    args = parser.parse_args(argv)
    if args.num_samples < 0:
        raise ValueError(f"--num-samples must be >= 0, got {args.num_samples}")
    if not 0.0 <= args.beta <= 1.0:
        raise ValueError(f"--beta must lie in [0, 1], got {args.beta}")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max_new_tokens must be >= 1, got {args.max_new_tokens}")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from mrtpo.explaining import run_explain

    run_explain(
        args.task,
        args.model_name_or_path,
        args.output_dir,
        split=args.split,
        example=args.example,
        data=args.data,
        prompt_file=args.prompt_file,
        response_file=args.response_file,
        num_samples=args.num_samples,
        beta=args.beta,
        temperature=args.temperature,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        mode=args.mode,
    )
    return 0
