"""How often MRTPO's bounded normalization engages on the bundled tasks' first steps.

For each task, the first `--batches` generation batches of the training split (in order) of
`--prompts` prompts x `--samples` samples each (temperature 1, as training samples) are scored by
the task's verifiers; each batch's share of rows the bound changes
(`mrtpo.advantages.bounded_rows`, the trainer's `mrtpo/bounded_rows_share`) is printed with the
batch's std_batch S and per-reward scale. It depends on the rewards only, so no replay runs.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bounded_share.py [--batches 4]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from mrtpo import advantages, tasks
from mrtpo.generation import generate, render_prompt_ids
from mrtpo.models import DEFAULT_MODEL, load_model

EPS = 1e-4
MAX_NEW_TOKENS = {"sql": 128, "tool_calling": 96, "instructions": 128}


def batch_rewards(
    task, model, tokenizer, rows: list[dict], samples: int, seed: int
) -> torch.Tensor:
    """(prompts * samples, K) rewards of one generation batch, NaN where a verifier gave None."""
    prompts = [row["prompt"] for row in rows]
    ids = render_prompt_ids(tokenizer, prompts)
    completions = generate(
        model,
        tokenizer,
        ids,
        MAX_NEW_TOKENS.get(task.name, 128),
        batch_size=16,
        temperature=1.0,
        num_samples=samples,
        seed=seed,
    )
    texts = [
        [{"role": "assistant", "content": tokenizer.decode(c, skip_special_tokens=True)}]
        for c in completions
    ]
    expanded = [row for row in rows for _ in range(samples)]
    columns = {key: [row[key] for row in expanded] for key in expanded[0] if key != "prompt"}
    scores = []
    for verifier in task.verifiers():
        verdicts = verifier.verify_batch([r["prompt"] for r in expanded], texts, **columns)
        scores.append([float("nan") if v.score is None else v.score for v in verdicts])
    return torch.tensor(scores).T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=tasks.names())
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--model_name_or_path", default=DEFAULT_MODEL)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model_name_or_path)
    summary = {}
    for name in args.tasks:
        task = tasks.get(name)
        data = task.load("train")
        shares = []
        for b in range(args.batches):
            rows = [data[i] for i in range(b * args.prompts, (b + 1) * args.prompts)]
            rewards = batch_rewards(task, model, tokenizer, rows, args.samples, seed=b)
            normalized = advantages.per_reward(rewards, args.samples, EPS)
            summed = normalized.nansum(1)[~torch.isnan(rewards).all(1)]
            share = advantages.bounded_rows(rewards, args.samples).float().mean().item()
            scale = advantages.reallocation_scale(rewards, args.samples).item()
            moving = (torch.nan_to_num(normalized) != 0).any(1).float().mean().item()
            shares.append(share)
            print(
                json.dumps(
                    {
                        "task": name,
                        "batch": b,
                        "bounded_rows_share": round(share, 4),
                        "rows_with_some_advantage": round(moving, 4),
                        "std_batch_S": round(summed.std().item(), 4),
                        "per_reward_scale": round(scale, 4),
                    }
                ),
                flush=True,
            )
        summary[name] = {
            "mean_bounded_rows_share": statistics.mean(shares),
            "batches_bounded": sum(s > 0 for s in shares),
            "batches": len(shares),
        }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
