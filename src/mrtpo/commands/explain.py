"""`mrtpo explain`: the credit map of one response, where each reward's advantage lands.

    mrtpo explain --task T [--model_name_or_path M] [--example N | --prompt-file P
        --response-file R] [--split test] [--beta 0.5] [--num-samples 4] [--out DIR]

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
`--out` and prints the map on the terminal.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mrtpo.credit.map import CreditMap
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
    parser.add_argument(
        "--out", default=None, help="output folder (default outputs/explain-<task>)"
    )
    args = parser.parse_args(argv)
    if args.num_samples < 0:
        raise ValueError(f"--num-samples must be >= 0, got {args.num_samples}")
    if not 0.0 <= args.beta <= 1.0:
        raise ValueError(f"--beta must lie in [0, 1], got {args.beta}")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max_new_tokens must be >= 1, got {args.max_new_tokens}")
    return args


def choose_row(task: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The dataset row the verifiers read, its prompt replaced by --prompt-file if given."""
    dataset = task.load(args.split, path=args.data) if args.data else task.load(args.split)
    if not 0 <= args.example < len(dataset):
        raise ValueError(f"--example must lie in [0, {len(dataset)}), got {args.example}")
    row = dict(dataset[args.example])
    if args.prompt_file is None:
        return row
    text = Path(args.prompt_file).read_text(encoding="utf-8")
    try:
        given = json.loads(text)
    except json.JSONDecodeError:
        given = None
    if isinstance(given, dict):
        if "prompt" not in given:
            raise ValueError(f"--prompt-file {args.prompt_file}: a JSON row needs a 'prompt' key")
        row.update(given)
        if isinstance(row["prompt"], str):
            row["prompt"] = [
                {"role": "system", "content": task.system_prompt},
                {"role": "user", "content": row["prompt"]},
            ]
    else:
        row["prompt"] = [
            {"role": "system", "content": task.system_prompt},
            {"role": "user", "content": text},
        ]
    return row


def explain_response(
    model: Any,
    tokenizer: Any,
    verifiers: Sequence[Any],
    row: Mapping[str, Any],
    response_ids: Sequence[int] | None = None,
    *,
    num_samples: int = 4,
    beta: float = 0.5,
    temperature: float = 1.0,
    seed: int = 0,
    max_new_tokens: int = 256,
    mode: str = "leave_one_out",
    title: str = "",
) -> tuple[CreditMap, list[dict[str, Any]]]:
    """The credit map of one response to `row` (greedy when `response_ids` is None) within a
    group of it and `num_samples` sampled responses; and the group (completion, scores)."""
    from mrtpo import advantages
    from mrtpo.commands.eval import generate, render_prompt_ids
    from mrtpo.credit.replay import (
        last_user_message,
        replay_rows,
        reward_types,
        sample_completions,
        verify_rows,
    )

    names = [verifier.name for verifier in verifiers]
    prompt_ids = render_prompt_ids(tokenizer, [row["prompt"]])[0]
    if response_ids is None:
        response_ids = generate(model, tokenizer, [prompt_ids], max_new_tokens, 1)[0]
    group = [list(response_ids)]
    if num_samples:
        group += sample_completions(
            model, tokenizer, prompt_ids, num_samples, max_new_tokens, temperature, seed
        )
    texts = tokenizer.batch_decode(group, skip_special_tokens=True)
    verdicts = verify_rows(verifiers, texts, [row] * len(group))
    rewards = torch.tensor(
        [[math.nan if v.score is None else v.score for v in line] for line in verdicts],
        dtype=torch.float64,
    )  # [G, K]
    distance = replay_rows(model, tokenizer, [row["prompt"]], group[:1], verdicts[:1], mode)[0]
    num_tokens = distance.shape[-1]

    numbers: dict[str, Any] = {}
    if len(group) > 1:
        group_size = len(group)
        # Only row 0 is replayed: its A_t reads the other rows' rewards, never their distances.
        all_distance = torch.zeros(group_size, len(names), num_tokens, dtype=torch.float64)
        all_distance[0] = distance.double()
        all_mask = torch.zeros(group_size, num_tokens)
        all_mask[0] = 1
        numbers = {
            "weights": advantages.token_weights(all_distance[:1], all_mask[:1], beta)[0],
            "reward_advantages": torch.nan_to_num(advantages.per_reward(rewards, group_size)[0]),
            "token_advantages": advantages.mrtpo(rewards, group_size, all_distance, all_mask, beta)[
                0
            ],
            "gdpo_advantage": float(advantages.gdpo(rewards, group_size)[0]),
        }
    applicable = [k for k, verdict in enumerate(verdicts[0]) if verdict.score is not None]
    types = reward_types(verifiers, row)
    credit_map = CreditMap.from_replay(
        tokenizer,
        group[0],
        [names[k] for k in applicable],
        distance[applicable],
        weights=numbers["weights"][applicable] if numbers else None,
        reward_advantages=numbers["reward_advantages"][applicable] if numbers else None,
        token_advantages=numbers.get("token_advantages"),
        verdicts=[verdicts[0][k] for k in applicable],
        text=texts[0],
        gdpo_advantage=numbers.get("gdpo_advantage"),
        types=[types[k] for k in applicable],
        prompt=last_user_message(row["prompt"]),
        title=title
        + (f", in a group of {len(group)} (beta {beta})" if numbers else ", replay distances"),
    )
    group_record = [
        {
            "explained": i == 0,
            "completion": text,
            "scores": {name: v.score for name, v in zip(names, line, strict=True)},
        }
        for i, (text, line) in enumerate(zip(texts, verdicts, strict=True))
    ]
    return credit_map, group_record


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from mrtpo import tasks
    from mrtpo.credit.render import to_html, to_png, to_terminal
    from mrtpo.models import load_model

    task = tasks.get(args.task)
    verifiers = task.verifiers()
    row = choose_row(task, args)
    model, tokenizer = load_model(args.model_name_or_path)
    response_ids = None
    if args.response_file is not None:
        response = Path(args.response_file).read_text(encoding="utf-8")
        response_ids = list(tokenizer(response, add_special_tokens=False)["input_ids"])
        response_ids.append(tokenizer.eos_token_id)
    credit_map, group = explain_response(
        model,
        tokenizer,
        verifiers,
        row,
        response_ids,
        num_samples=args.num_samples,
        beta=args.beta,
        temperature=args.temperature,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        mode=args.mode,
        title=f"{args.task}, example {args.example}",
    )
    out = Path(args.out or f"outputs/explain-{args.task}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "credit.html").write_text(
        to_html(credit_map, title="MRTPO credit map"), encoding="utf-8"
    )
    to_png(credit_map, out / "credit.png")
    (out / "group.json").write_text(json.dumps(group, indent=2), encoding="utf-8")
    to_terminal(credit_map)
    print(f"wrote {out / 'credit.html'}, {out / 'credit.png'} and {out / 'group.json'}")
    return 0
