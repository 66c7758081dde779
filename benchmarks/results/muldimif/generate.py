"""Greedy answers of a model to a MulDimIF file, as `mrtpo eval` makes them, written as the
`{id, response, completion_tokens}` JSON Lines `mrtpo score` reads.

`mrtpo eval --task instructions --data FILE` generates and scores in one run; generating
apart let the answers be made while the checkers were being written, then scored by
`mrtpo score` (the same `score_responses`). The generation is `mrtpo eval`'s: the task's
system prompt, `render_prompt_ids`, prompts shortest first in left-padded batches, greedy,
completions decoded with special tokens skipped.

    OMP_NUM_THREADS=1 python benchmarks/results/muldimif/generate.py MODEL FILE OUT.jsonl \
        [--max_new_tokens 192] [--batch_size 16]
"""

import argparse
import json
import time

import torch

from mrtpo.generation import generate, render_prompt_ids
from mrtpo.models import load_model
from mrtpo.tasks.instructions.muldimif import load_muldimif


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--max_new_tokens", type=int, default=192)
    parser.add_argument("--batch_size", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dataset = load_muldimif(args.data, check=False)
    model, tokenizer = load_model(args.model)
    prompt_ids = render_prompt_ids(tokenizer, dataset["prompt"])
    order = sorted(range(len(prompt_ids)), key=lambda index: len(prompt_ids[index]))
    started = time.perf_counter()
    done = 0

    def progress(n: int) -> None:
        nonlocal done
        done += n
        print(f"{done}/{len(order)} in {time.perf_counter() - started:.0f} s", flush=True)

    sorted_ids = generate(
        model,
        tokenizer,
        [prompt_ids[index] for index in order],
        args.max_new_tokens,
        args.batch_size,
        on_batch=progress,
    )
    completion_ids = [[] for _ in order]
    for position, index in enumerate(order):
        completion_ids[index] = sorted_ids[position]
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    with open(args.out, "w", encoding="utf-8") as out:
        for key, text, ids in zip(dataset["key"], texts, completion_ids, strict=True):
            record = {"id": key, "response": text, "completion_tokens": len(ids)}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    capped = sum(len(ids) >= args.max_new_tokens for ids in completion_ids)
    print(
        f"{len(texts)} answers in {time.perf_counter() - started:.0f} s, "
        f"{capped} at the {args.max_new_tokens}-token cap -> {args.out}"
    )


if __name__ == "__main__":
    main()
