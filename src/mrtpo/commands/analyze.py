"""`mrtpo analyze`: where the replay distance falls, over the responses of a split.

    mrtpo analyze --task T [--model_name_or_path M] [--n 200] [--split test] [--output_dir DIR]
        [--max_new_tokens N]

Generates the greedy response to each of the first n rows of the split (all rows if the split
is smaller), verifies it, replays it (leave-one-out by default) and writes into `--output_dir`:
- `localization.md` / `.json`: the paper's Table 4 (see `mrtpo.credit.analysis`);
- `concentration.md` / `.json` / `.png`: the paper's Figure 6;
- `maps.html`: the first `--maps` responses' credit maps, shaded by replay distance;
- `responses.json`: every response with its scores.

All of it is `mrtpo.explaining.run_analyze`.
"""

from __future__ import annotations

import argparse
import shlex

from mrtpo.models import DEFAULT_MODEL


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mrtpo analyze", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True, help="sql, tool_calling or instructions")
    parser.add_argument("--model_name_or_path", "--model-name-or-path", default=DEFAULT_MODEL)
    parser.add_argument("--n", type=int, default=200, help="responses to analyze (first n rows)")
    parser.add_argument("--split", default="test")
    parser.add_argument(
        "--data", default=None, help="the user's benchmark files for the task's loader"
    )
    parser.add_argument(
        "--max_new_tokens", "--max-new-tokens", dest="max_new_tokens", type=int, default=256
    )
    parser.add_argument("--batch_size", "--batch-size", dest="batch_size", type=int, default=8)
    parser.add_argument(
        "--mode", default="leave_one_out", help="replay mode: leave_one_out or add_one"
    )
    parser.add_argument(
        "--satisfied_at",
        "--satisfied-at",
        dest="satisfied_at",
        type=float,
        default=1.0,
        help="a score >= this counts as satisfied",
    )
    parser.add_argument("--maps", type=int, default=5, help="credit maps written to maps.html")
    # --output_dir, as every other command spells it; --out, this command's first spelling.
    parser.add_argument(
        "--output_dir",
        "--output-dir",
        "--out",
        dest="output_dir",
        default=None,
        help="output folder (default outputs/analyze-<task>)",
    )
    args = parser.parse_args(argv)
    for name in ("n", "max_new_tokens", "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.maps < 0:
        raise ValueError(f"--maps must be >= 0, got {args.maps}")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from mrtpo.explaining import run_analyze

    run_analyze(
        args.task,
        args.model_name_or_path,
        args.output_dir,
        n=args.n,
        split=args.split,
        data=args.data,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        mode=args.mode,
        satisfied_at=args.satisfied_at,
        maps=args.maps,
        command="mrtpo analyze " + shlex.join(argv),
    )
    return 0
