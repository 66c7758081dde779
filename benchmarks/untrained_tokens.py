"""Benchmark: which tokens of a task's references has a model never trained, and can it write them?

A released model may ship embedding rows its training never touched (Qwen2.5-Coder-0.5B-
Instruct's `<tool_call>` and `</tool_call>`): such a row is all zeros or the very vector a dozen
other unused tokens share, and the model gives the token almost no probability where the
references write it, so a short cold start cannot teach it (docs/results/embedded-models.md).

For the first `--model`: the reference tokens (the cold start's demonstrations) whose input or
output row is untrained (`mrtpo.models.untrained_token_ids`), each with its row norm beside the
matrix's median and the other ids that share its exact rows. For every `--model` (the model as
released, then cold starts built from it): at each place where `--rows` test references (the
first after the cold start's seeded shuffle, seed 0) write such a token, its log-probability
and rank, and the model's top choices there (teacher-forced after the very prompt `mrtpo
train` generates from). Writes
`untrained_tokens.md` and `untrained_tokens.json` into `--out`.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/untrained_tokens.py \
        --model qwen2.5-coder-0.5b-instruct outputs/sft-tool_calling-qwen-fit --out /tmp/untrained
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


def describe_rows(model: Any, token_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """Per token and embedding matrix: row norm, the matrix's median row norm, exact twins."""
    from mrtpo.models import twin_rows

    matrices = {"input": model.get_input_embeddings().weight.detach()}
    output = model.get_output_embeddings().weight.detach()
    if output.data_ptr() != matrices["input"].data_ptr():
        matrices["output"] = output
    described: dict[int, dict[str, Any]] = {}
    for name, weight in matrices.items():
        median = float(weight.norm(dim=1).median())
        for token_id in token_ids:
            described.setdefault(token_id, {})[name] = {
                "norm": float(weight[token_id].norm()),
                "median_norm": median,
                "twins": twin_rows(weight, token_id),
            }
    return described


@torch.no_grad()
def where_written(
    model: Any, tokenizer: Any, examples: Sequence[dict], token_ids: Sequence[int], top: int = 3
) -> list[dict[str, Any]]:
    """At each completion position whose next token is one of `token_ids`: log p, rank and the
    model's `top` choices."""
    from mrtpo.generation import render_prompt_ids

    found = []
    for row, example in enumerate(examples):
        prompt = render_prompt_ids(tokenizer, [example["prompt"]])[0]
        content = example["completion"][0]["content"]
        completion = tokenizer(content, add_special_tokens=False)["input_ids"]
        full = torch.tensor([prompt + completion])
        log_p = torch.log_softmax(model(full).logits[0].float(), dim=-1)
        for offset, token_id in enumerate(completion):
            if token_id not in token_ids:
                continue
            at = log_p[len(prompt) + offset - 1]
            best = at.topk(top)
            found.append(
                {
                    "row": row,
                    "token": tokenizer.convert_ids_to_tokens(token_id),
                    "token_id": token_id,
                    "position": offset,
                    "log_p": float(at[token_id]),
                    "rank": int((at > at[token_id]).sum()) + 1,
                    "top": [
                        [tokenizer.decode([int(i)]), float(v)]
                        for v, i in zip(best.values, best.indices, strict=True)
                    ],
                }
            )
    return found


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Untrained embedding rows the references use",
        "",
        f"    {result['command']}",
        "",
        f"Task `{result['task']}`; the first model `{result['models'][0]}`.",
        "",
        "| token | id | matrix | row norm | median row norm | other ids with the exact row (all in the .json) |",
        "|---|---:|---|---:|---:|---|",
    ]
    for token_id, matrices in result["rows"].items():
        token = result["names"][str(token_id)]
        for name, row in matrices.items():
            first = ", ".join(map(str, row["twins"][:8]))
            more = f" and {len(row['twins']) - 8} more" if len(row["twins"]) > 8 else ""
            shared = f"{len(row['twins'])}: {first}{more}" if row["twins"] else "none"
            lines.append(
                f"| `{token}` | {token_id} | {name} | {row['norm']:.3f} | "
                f"{row['median_norm']:.3f} | {shared} |"
            )
    lines += [
        "",
        "Where the test references write them (teacher-forced):",
        "",
        "| model | row | token | log p | rank | top choices (log p) |",
        "|---|---:|---|---:|---:|---|",
    ]
    for model, places in result["where_written"].items():
        for place in places:
            choices = ", ".join(f"{json.dumps(text)} ({value:.2f})" for text, value in place["top"])
            lines.append(
                f"| `{model}` | {place['row']} | `{place['token']}` | {place['log_p']:.2f} | "
                f"{place['rank']:,} | {choices} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", nargs="+", required=True, help="embedded name or folder")
    parser.add_argument("--task", default="tool_calling")
    parser.add_argument("--references", type=int, default=64, help="cold-start demonstrations")
    parser.add_argument("--rows", type=int, default=2, help="test references to probe")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)

    from mrtpo import tasks
    from mrtpo.cold_start import cold_start_dataset, untrained_reference_tokens
    from mrtpo.models import load_model

    task = tasks.get(args.task)
    # The cold start's own demonstrations (its default seed), and the first test references.
    references = cold_start_dataset(task, "train", max_examples=args.references, seed=42)
    tests = list(cold_start_dataset(task, "test", max_examples=args.rows, seed=0))
    model, tokenizer = load_model(args.model[0])
    untrained = untrained_reference_tokens(model, tokenizer, references, warn=False)
    result: dict[str, Any] = {
        "command": shlex.join(["python", "benchmarks/untrained_tokens.py", *sys.argv[1:]]),
        "task": args.task,
        "models": args.model,
        "untrained": untrained,
        "names": {str(i): tokenizer.convert_ids_to_tokens(i) for i in untrained},
        "rows": describe_rows(model, untrained),
        "where_written": {},
    }
    for name in args.model:
        if name != args.model[0]:
            model, tokenizer = load_model(name)
        model.eval()
        result["where_written"][name] = where_written(model, tokenizer, tests, untrained)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "untrained_tokens.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "untrained_tokens.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
