"""Evaluation: generate on a task's split, then score the responses with the task's verifiers.

The two steps are separate: `mrtpo.generation` makes the responses, `score_responses` scores
responses given as text with the dataset rows they answer (nothing of the model), so responses
made elsewhere are scored the same way. `evaluate` runs one after the other; `run_eval` is all of
`mrtpo eval` (load, evaluate, write `eval.json`, print the table).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mrtpo.generation import decoding, generate, render_prompt_ids
from mrtpo.verifiers import Verdict


def load_eval_dataset(
    task: Any, split: str, data: str | None = None, max_examples: int | None = None
) -> Any:
    """The task's split (bundled, or the user's files at `data`), cut to its first
    `max_examples` rows; a split without rows raises ValueError."""
    if data is not None and not Path(data).exists():
        raise FileNotFoundError(f"data path {data!r} does not exist")
    if max_examples is not None and max_examples < 1:
        raise ValueError(f"max_examples must be >= 1, got {max_examples}")
    dataset = task.load(split, path=data)
    if max_examples is not None:
        dataset = dataset.select(range(min(max_examples, len(dataset))))
    if len(dataset) == 0:
        raise ValueError(f"split {split!r} of task {task.name!r} has no examples")
    return dataset


def mean_applicable(scores: Sequence[float | None]) -> float | None:
    """Mean over rows the verifier applies to (None is skipped); None when none applies."""
    applicable = [s for s in scores if s is not None]
    return sum(applicable) / len(applicable) if applicable else None


def score_responses(
    task: Any,
    rows: Sequence[Mapping[str, Any]],
    completions: Sequence[str],
    completion_tokens: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Score each response with the task's verifiers: {"verifiers": {name: mean over applicable
    rows}, "headline": {...}, "examples": [{"prompt", "completion", "verdicts"}, ...]}.

    `rows[i]` is the dataset row response `completions[i]` answers: its `prompt` and the columns
    the verifiers read (a row sampled several times appears once per sample).
    `completion_tokens[i]`, when given, is recorded with each example.
    """
    if not rows or len(rows) != len(completions):
        raise ValueError(
            f"rows and completions must be non-empty and of the same length, got {len(rows)} "
            f"and {len(completions)}"
        )
    if completion_tokens is not None and len(completion_tokens) != len(completions):
        raise ValueError(
            f"completion_tokens has {len(completion_tokens)} entries for {len(completions)} "
            "completions"
        )
    prompts = [row["prompt"] for row in rows]
    columns = {name: [row[name] for row in rows] for name in rows[0] if name != "prompt"}
    # TRL hands conversational prompts' completions to reward functions as messages.
    conversational = not isinstance(prompts[0], str)
    messages = (
        [[{"role": "assistant", "content": text}] for text in completions]
        if conversational
        else list(completions)
    )

    verifiers = task.verifiers()
    verdicts_by_verifier = [v.verify_batch(prompts, messages, **columns) for v in verifiers]
    verdicts_by_example: list[list[Verdict]] = [
        list(row) for row in zip(*verdicts_by_verifier, strict=True)
    ]
    summary = {
        verifier.name: mean_applicable([v.score for v in verdicts])
        for verifier, verdicts in zip(verifiers, verdicts_by_verifier, strict=True)
    }
    examples = []
    for i, (prompt, text, line) in enumerate(
        zip(prompts, completions, verdicts_by_example, strict=True)
    ):
        example: dict[str, Any] = {"prompt": prompt, "completion": text}
        if completion_tokens is not None:
            example["completion_tokens"] = completion_tokens[i]
        example["verdicts"] = {
            verifier.name: {"score": verdict.score, "info": verdict.info}
            for verifier, verdict in zip(verifiers, line, strict=True)
        }
        examples.append(example)
    report: dict[str, Any] = {
        "verifiers": summary,
        "headline": task.headline(verdicts_by_example),
        "examples": examples,
    }
    # Instruction following also reports IFEval's/IFBench's loose mode and per-id accuracy.
    following_report = getattr(task, "following_report", None)
    if following_report is not None:
        following = following_report(list(completions), columns)
        report["headline"] = {**report["headline"], **following["headline"]}
        report["per_instruction"] = following["per_instruction"]
    return report


def evaluate(
    model: Any,
    tokenizer: Any,
    task: Any,
    dataset: Any,
    batch_size: int = 8,
    max_new_tokens: int = 256,
    chat_template_kwargs: dict | None = None,
    temperature: float = 0.0,
    num_samples: int = 1,
    seed: int = 0,
) -> dict[str, Any]:
    """Generate on every row of `dataset` (``num_samples`` per row), then `score_responses`."""
    rows = dataset.to_list()
    prompt_ids = render_prompt_ids(tokenizer, [row["prompt"] for row in rows], chat_template_kwargs)
    completion_ids = generate(
        model,
        tokenizer,
        prompt_ids,
        max_new_tokens,
        batch_size,
        temperature=temperature,
        num_samples=num_samples,
        seed=seed,
    )
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    # Each row repeated for its samples (verifiers and headlines see every sample).
    sampled_rows = [row for row in rows for _ in range(num_samples)]
    return score_responses(task, sampled_rows, texts, [len(ids) for ids in completion_ids])


def metric_names(columns: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every verifier and headline name of the results, in first-seen order."""
    names: list[str] = []
    for result in columns.values():
        for name in [*result["verifiers"], *result["headline"]]:
            if name not in names:
                names.append(name)
    return names


def metric_value(result: Mapping[str, Any], name: str) -> float | None:
    """A verifier's mean or a headline number of one result (None when it has neither)."""
    return result["verifiers"].get(name, result["headline"].get(name))


def summary_table(title: str | None, columns: Mapping[str, Mapping[str, Any]]) -> Any:
    """A rich table: one row per metric, one column per result (e.g. before / after)."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    for name in columns:
        table.add_column(name, justify="right")
    for metric in metric_names(columns):
        cells = []
        for result in columns.values():
            value = metric_value(result, metric)
            cells.append("-" if value is None or math.isnan(value) else f"{value:.3f}")
        table.add_row(metric, *cells)
    return table


def run_eval(
    task: str,
    model_name_or_path: str,
    split: str = "test",
    data: str | None = None,
    max_examples: int | None = None,
    output_dir: str | None = None,
    batch_size: int = 8,
    max_new_tokens: int = 256,
    chat_template_kwargs: dict | None = None,
    temperature: float = 0.0,
    num_samples: int = 1,
    seed: int = 0,
) -> dict[str, Any]:
    """All of `mrtpo eval` (keywords named as its arguments): evaluate `model_name_or_path` on
    the task's split, write `eval.json` into `output_dir` (default `outputs/eval-<task>`), print
    the table; returns the report written."""
    from rich.console import Console

    from mrtpo import tasks
    from mrtpo.models import load_model

    task_object = tasks.get(task)
    dataset = load_eval_dataset(task_object, split, data, max_examples)
    model, tokenizer = load_model(model_name_or_path)

    started = time.perf_counter()
    result = evaluate(
        model,
        tokenizer,
        task_object,
        dataset,
        batch_size,
        max_new_tokens,
        chat_template_kwargs,
        temperature=temperature,
        num_samples=num_samples,
        seed=seed,
    )
    seconds = time.perf_counter() - started

    output = Path(output_dir or f"outputs/eval-{task}")
    output.mkdir(parents=True, exist_ok=True)
    report = {
        "model_name_or_path": model_name_or_path,
        "task": task,
        "split": split,
        "data": data,
        "num_examples": len(dataset),
        "max_new_tokens": max_new_tokens,
        "decoding": decoding(temperature, num_samples),
        "seconds": round(seconds, 1),
        **result,
    }
    (output / "eval.json").write_text(json.dumps(report, indent=2, default=str))
    print(
        f"{model_name_or_path} on {task} {split} ({len(dataset)} examples, "
        f"{decoding(temperature, num_samples)})"
    )
    Console().print(summary_table(None, {"mean": result}))
    print(f"wrote {output / 'eval.json'} in {seconds:.0f} s")
    return report
