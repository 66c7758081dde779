"""`mrtpo analyze`: where the replay distance falls, over the responses of a split.

    mrtpo analyze --task T [--model_name_or_path M] [--n 200] [--split test] [--out DIR]
        [--max_new_tokens N]

Generates the greedy response to each of the first n rows of the split (all rows if the split
is smaller), verifies it, replays it (leave-one-out by default) and writes into `--out`:
- `localization.md` / `.json`: the paper's Table 4 (see `mrtpo.credit.analysis`);
- `concentration.md` / `.json` / `.png`: the paper's Figure 6;
- `maps.html`: the first `--maps` responses' credit maps, shaded by replay distance;
- `responses.json`: every response with its scores.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

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
    parser.add_argument(
        "--out", default=None, help="output folder (default outputs/analyze-<task>)"
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
    from mrtpo import tasks
    from mrtpo.credit.analysis import (
        concentration,
        concentration_markdown,
        concentration_png,
        localization_markdown,
        localization_table,
        write_json,
    )
    from mrtpo.credit.render import to_html
    from mrtpo.credit.replay import distance_maps, replay_rows, reward_types, verify_rows
    from mrtpo.generation import generate, render_prompt_ids
    from mrtpo.models import load_model

    command = "mrtpo analyze " + shlex.join(argv)
    task = tasks.get(args.task)
    verifiers = task.verifiers()
    names = [verifier.name for verifier in verifiers]
    dataset = task.load(args.split, path=args.data) if args.data else task.load(args.split)
    n = min(args.n, len(dataset))
    if n < args.n:
        print(f"the {args.split} split has {len(dataset)} rows: analyzing all {n}", file=sys.stderr)
    rows = [dict(dataset[i]) for i in range(n)]
    prompts = [row["prompt"] for row in rows]
    model, tokenizer = load_model(args.model_name_or_path)

    started = time.perf_counter()
    prompt_ids = render_prompt_ids(tokenizer, prompts)
    completion_ids = generate(model, tokenizer, prompt_ids, args.max_new_tokens, args.batch_size)
    generated = time.perf_counter()
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    verdicts = verify_rows(verifiers, texts, rows)
    distances = replay_rows(
        model, tokenizer, prompts, completion_ids, verdicts, args.mode, args.batch_size
    )
    replayed = time.perf_counter()
    types = [reward_types(verifiers, row) for row in rows]
    maps = distance_maps(
        tokenizer, prompts, completion_ids, texts, names, verdicts, distances, types
    )

    table = localization_table(maps, satisfied_at=args.satisfied_at)
    shares = concentration(maps)
    seconds = {"generate": generated - started, "replay": replayed - generated}
    about = {
        "command": command,
        "task": args.task,
        "model": str(args.model_name_or_path),
        "split": args.split,
        "responses": n,
        "mean_response_tokens": sum(len(ids) for ids in completion_ids) / max(n, 1),
        "replay_mode": args.mode,
        "satisfied_at": args.satisfied_at,
        "seconds": seconds,
    }
    out = Path(args.out or f"outputs/analyze-{args.task}")
    out.mkdir(parents=True, exist_ok=True)
    heading = (
        f"Command: `{command}` ({n} greedy responses of the {args.split} split, "
        f"{args.mode} replay, model {args.model_name_or_path}).\n\n"
    )
    aggregation = (
        "Dist.: % of a reward's replay distance on the tokens its checker read; Tok.: those tokens' "
        "% of the response; both averaged over instances, Ratio = Dist. / Tok. (1 = uniform). "
        "'–': fewer than 5 instances. Left out (column excl.): instances without spans, with "
        "spans covering the whole text (the checker read everything) or with zero distance.\n\n"
    )
    (out / "localization.md").write_text(
        "# Localization (Table 4)\n\n" + heading + aggregation + localization_markdown(table),
        encoding="utf-8",
    )
    write_json({**about, "rows": table}, out / "localization.json")
    (out / "concentration.md").write_text(
        "# Concentration (Figure 6)\n\n" + heading + concentration_markdown(shares),
        encoding="utf-8",
    )
    write_json({**about, **shares}, out / "concentration.json")
    concentration_png(shares, out / "concentration.png")
    if args.maps:
        (out / "maps.html").write_text(
            to_html(maps[: args.maps], title=f"Replay distances, {args.task}"), encoding="utf-8"
        )
    responses = [
        {
            "prompt": m.prompt,
            "completion": m.text,
            "scores": {k: v.score for k, v in zip(names, m.verdicts, strict=True)},
        }
        for m in maps
    ]
    write_json(responses, out / "responses.json")

    pooled = [row for row in table if row["type"] == "all"]
    print(localization_markdown(pooled), end="")
    print(f"generation {seconds['generate']:.0f} s, replay {seconds['replay']:.0f} s; wrote {out}/")
    return 0
