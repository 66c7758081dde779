"""A new task with two rewards, trained with MRTPO: arithmetic answered inside <answer> tags.

The worked example of docs/guides/custom-task.md, which shows this file as it is;
tests/test_docs_example.py imports and runs it. Run it on the embedded model:

    python docs/examples/arithmetic_task.py --max_steps 8 --output_dir outputs/arithmetic
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from datasets import Dataset

from mrtpo import tasks
from mrtpo.tasks import Task
from mrtpo.verifiers import Verdict, Verifier

SYSTEM_PROMPT = (
    "You solve arithmetic problems. Think briefly, then give the result as an integer "
    "inside <answer>...</answer>."
)
FORMAT_RULE = (
    "The response must end with exactly one <answer>...</answer> block holding an integer."
)
ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
INTEGER = re.compile(r"\s*(-?\d+)\s*")


# --- the two rewards ---------------------------------------------------------------------
# A verifier returns a Verdict: the score (the reward), the information MRTPO's replay adds to
# the prompt for this reward (what the check compares the response against), and the character
# spans of the response the check read (for credit maps and the localization analysis).


class AnswerFormat(Verifier):
    """1 when the response holds exactly one <answer> block and it holds an integer."""

    name = "answer_format"

    def verify(self, completion: str, example: Mapping[str, Any]) -> Verdict:
        blocks = list(ANSWER_BLOCK.finditer(completion))
        if len(blocks) == 1 and INTEGER.fullmatch(blocks[0].group(1)):
            return Verdict(1.0, FORMAT_RULE, (blocks[0].span(),))
        if not blocks:
            return Verdict(0.0, f"{FORMAT_RULE} Here: no <answer> block.", ((0, len(completion)),))
        why = f"{len(blocks)} <answer> blocks" if len(blocks) > 1 else "no integer inside it"
        return Verdict(0.0, f"{FORMAT_RULE} Here: {why}.", tuple(b.span() for b in blocks))


class AnswerCorrect(Verifier):
    """1 when the last <answer> block holds the right integer; 0 otherwise (a missing answer
    included). Its information is the right result, which the replay shows the policy."""

    name = "answer_correct"

    def verify(self, completion: str, example: Mapping[str, Any]) -> Verdict:
        expected = int(example["answer"])
        info = f"The correct result is {expected}."
        blocks = list(ANSWER_BLOCK.finditer(completion))
        number = INTEGER.fullmatch(blocks[-1].group(1)) if blocks else None
        if number is None:
            return Verdict(0.0, info)
        start = blocks[-1].start(1) + number.start(1)
        return Verdict(
            float(int(number.group(1)) == expected), info, ((start, start + len(number.group(1))),)
        )


# --- the task: data, verifiers, a reference response for the cold start --------------------


def problem(question: str, answer: int, key: str) -> dict[str, Any]:
    """One dataset row: the chat prompt TRL generates from, and the columns the verifiers read."""
    return {
        "id": key,
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ],
        "answer": answer,
    }


class ArithmeticTask(Task):
    name = "arithmetic"
    system_prompt = SYSTEM_PROMPT
    headline_name = "accuracy"  # the share of rows where every reward is 1

    def load(self, split: str = "train", path: str | None = None, **kwargs: Any) -> Dataset:
        """Seeded generated problems (64 train, 16 test), or the user's JSON Lines file of
        {"question", "answer"} records at `path`."""
        if path is not None:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
            records = [json.loads(line) for line in lines if line.strip()]
            return Dataset.from_list(
                [problem(r["question"], int(r["answer"]), str(i)) for i, r in enumerate(records)]
            )
        sizes = {"train": 64, "test": 16}
        if split not in sizes:
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        rng = random.Random(f"arithmetic-{split}")
        rows = []
        for i in range(sizes[split]):
            a, b = rng.randint(2, 49), rng.randint(2, 49)
            op = rng.choice("+-*")
            answer = {"+": a + b, "-": a - b, "*": a * b}[op]
            rows.append(problem(f"What is {a} {op} {b}?", answer, f"{split}-{i}"))
        return Dataset.from_list(rows)

    def verifiers(self, **kwargs: Any) -> list[Verifier]:
        return [AnswerFormat(), AnswerCorrect()]

    def reference_completion(self, example: Mapping[str, Any]) -> str | None:
        return f"<answer>{example['answer']}</answer>"


TASK = ArithmeticTask()


def register() -> None:
    """Make the task known by name to mrtpo's library calls in this process
    (`mrtpo.training.run_training("arithmetic", ...)`, `mrtpo.evaluation.run_eval`, ...)."""
    tasks.TASKS[TASK.name] = lambda: TASK


# --- training, the TRL way ---------------------------------------------------------------


def train(model: Any, tokenizer: Any, output_dir: str | Path, **overrides: Any) -> Any:
    """Train `model` with MRTPO on the task's train split; `overrides` are MRTPOConfig fields."""
    from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

    settings = {
        "advantage_estimator": "mrtpo",
        "mrtpo_beta": 0.5,
        "num_generations": 4,  # G: responses per prompt, the group
        "per_device_train_batch_size": 8,  # 2 prompts x 4 responses a step
        "max_completion_length": 48,
        "learning_rate": 1e-5,
        "max_steps": 8,
        "report_to": "none",
        "save_strategy": "no",
        **overrides,
    }
    trainer = MRTPOTrainer(
        model=model,
        reward_funcs=TASK.verifiers(),
        args=MRTPOConfig(output_dir=str(output_dir), **settings),
        train_dataset=TASK.load("train"),
        processing_class=tokenizer,
    )
    trainer.train()
    return trainer


def main() -> None:
    from mrtpo.models import load_model

    parser = argparse.ArgumentParser(description="MRTPO on the arithmetic task")
    parser.add_argument("--model_name_or_path", default="smollm2-135m-instruct")
    parser.add_argument("--max_steps", type=int, default=8)
    parser.add_argument("--output_dir", default="outputs/arithmetic")
    args = parser.parse_args()
    model, tokenizer = load_model(args.model_name_or_path)
    trainer = train(model, tokenizer, args.output_dir, max_steps=args.max_steps)
    print(f"trained {trainer.state.global_step} steps; metrics in {args.output_dir}/metrics.jsonl")


if __name__ == "__main__":
    main()
