"""Evaluation: generate on a task's split, then score the responses; or score responses made
elsewhere. One scoring path serves both.

`mrtpo.generation` makes the responses; `score_responses` scores responses given as text with
the dataset rows they answer (nothing of the model). `evaluate` runs one after the other;
`run_eval` is all of `mrtpo eval` (load, evaluate, write `eval.json`, print the table) and
`run_score` all of `mrtpo score` (load, read the answers, score, write, print).

Benchmark data: when `--data` is a benchmark the task knows (`Task.benchmark`: BFCL's folder for
tool calling, Spider's or BIRD's for SQL, an IFEval, IFBench or MulDimIF file for
instructions), the rows come from the benchmark, its own verifiers judge every response beside
the task's, and its `summarize` gives the table (per category, database, instruction id or
MulDimIF pattern/level/category/type, and the summary rows).
Otherwise the table holds each verifier's mean and the task's headline.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mrtpo.generation import decoding, generate, render_prompt_ids
from mrtpo.verifiers import Verdict

SCORING_CHUNK = 32  # rows verified between two progress updates


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


def load_eval_data(
    task: Any,
    split: str,
    data: str | None = None,
    max_examples: int | None = None,
    categories: Sequence[str] | None = None,
) -> tuple[Any, Any]:
    """(benchmark or None, dataset): the benchmark at `data` when the task knows its layout
    (`max_examples` then applies per category), else `load_eval_dataset`."""
    if data is not None and not Path(data).exists():
        raise FileNotFoundError(f"data path {data!r} does not exist")
    if max_examples is not None and max_examples < 1:
        raise ValueError(f"max_examples must be >= 1, got {max_examples}")
    benchmark = task.benchmark(data, split, categories, max_examples) if data is not None else None
    if benchmark is not None:
        return benchmark, benchmark.dataset
    if categories:
        raise ValueError(
            f"categories {list(categories)} apply to a benchmark folder (BFCL's), but data "
            f"{data!r} is not one the task {task.name!r} knows"
        )
    return None, load_eval_dataset(task, split, data, max_examples)


def mean_applicable(scores: Sequence[float | None]) -> float | None:
    """Mean over rows the verifier applies to (None is skipped); None when none applies."""
    applicable = [s for s in scores if s is not None]
    return sum(applicable) / len(applicable) if applicable else None


def _verify_in_chunks(
    verifiers: Sequence[Any],
    prompts: list[Any],
    messages: list[Any],
    columns: Mapping[str, list[Any]],
    on_scored: Callable[[int], None] | None,
) -> list[list[Verdict]]:
    """Each verifier's verdicts on every row (one list per verifier), verified
    `SCORING_CHUNK` rows at a time so that a progress bar can follow."""
    verdicts: list[list[Verdict]] = [[] for _ in verifiers]
    if on_scored is not None:
        on_scored(0)
    for start in range(0, len(prompts), SCORING_CHUNK):
        part = slice(start, start + SCORING_CHUNK)
        chunk_columns = {name: values[part] for name, values in columns.items()}
        for index, verifier in enumerate(verifiers):
            verdicts[index] += verifier.verify_batch(prompts[part], messages[part], **chunk_columns)
        if on_scored is not None:
            on_scored(len(prompts[part]))
    return verdicts


def score_responses(
    task: Any,
    rows: Sequence[Mapping[str, Any]],
    completions: Sequence[str],
    completion_tokens: Sequence[int] | None = None,
    benchmark: Any = None,
    on_scored: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Score each response with the task's verifiers (and the benchmark's, when given):
    {"verifiers": {name: mean over applicable rows}, "headline": {...}, "examples": [{"id"
    (when rows have one), "prompt", "completion", "verdicts"}, ...], "benchmark": {"title",
    "group_by", "groups", "summary", "skipped"} (with a benchmark)}.

    `rows[i]` is the dataset row response `completions[i]` answers: its `prompt` and the columns
    the verifiers read (a row sampled several times appears once per sample).
    `completion_tokens[i]`, when given, is recorded with each example. `on_scored(n)` is called
    with 0 when scoring begins, then with each number of rows scored (a progress bar's hook).
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

    task_verifiers = task.verifiers_for(rows)
    benchmark_verifiers = benchmark.verifiers() if benchmark is not None else []
    verifiers = [*task_verifiers, *benchmark_verifiers]
    verdicts_by_verifier = _verify_in_chunks(verifiers, prompts, messages, columns, on_scored)
    verdicts_by_example: list[list[Verdict]] = [
        list(row) for row in zip(*verdicts_by_verifier, strict=True)
    ]
    n_task = len(task_verifiers)  # the benchmark's verdicts come after the task's
    summary = {
        verifier.name: mean_applicable([v.score for v in verdicts])
        for verifier, verdicts in zip(task_verifiers, verdicts_by_verifier[:n_task], strict=True)
    }
    examples = []
    for i, (row, text, line) in enumerate(zip(rows, completions, verdicts_by_example, strict=True)):
        example: dict[str, Any] = {"id": row["id"]} if "id" in row else {}
        example.update(prompt=row["prompt"], completion=text)
        if completion_tokens is not None:
            example["completion_tokens"] = completion_tokens[i]
        example["verdicts"] = {
            verifier.name: {"score": verdict.score, "info": verdict.info}
            for verifier, verdict in zip(verifiers, line, strict=True)
        }
        examples.append(example)
    result: dict[str, Any] = {
        "verifiers": summary,
        "headline": task.headline([line[:n_task] for line in verdicts_by_example]),
    }
    if benchmark is not None:
        result["benchmark"] = {
            "title": benchmark.title,
            "group_by": benchmark.group_by,
            **benchmark.summarize(rows, [line[n_task:] for line in verdicts_by_example]),
            "skipped": dict(benchmark.skipped),
        }
    result["examples"] = examples
    return result


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
    benchmark: Any = None,
    on_generated: Callable[[int], None] | None = None,
    on_scored: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Generate on every row of `dataset` (``num_samples`` per row), then `score_responses`.

    Prompts are generated shortest first, so that a batch holds prompts of similar lengths (less
    padding); the results come back in the dataset's order. `on_generated(n)` and
    `on_scored(n)` follow the progress (each called with 0 when its phase begins).
    """
    rows = dataset.to_list()
    prompt_ids = render_prompt_ids(tokenizer, [row["prompt"] for row in rows], chat_template_kwargs)
    order = sorted(range(len(rows)), key=lambda index: len(prompt_ids[index]))
    if on_generated is not None:
        on_generated(0)
    sorted_ids = generate(
        model,
        tokenizer,
        [prompt_ids[index] for index in order],
        max_new_tokens,
        batch_size,
        temperature=temperature,
        num_samples=num_samples,
        seed=seed,
        on_batch=on_generated,
    )
    completion_ids: list[list[int]] = [[] for _ in range(len(rows) * num_samples)]
    for position, index in enumerate(order):
        for sample in range(num_samples):
            completion_ids[index * num_samples + sample] = sorted_ids[
                position * num_samples + sample
            ]
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    # Each row repeated for its samples (verifiers and headlines see every sample).
    sampled_rows = [row for row in rows for _ in range(num_samples)]
    return score_responses(
        task,
        sampled_rows,
        texts,
        [len(ids) for ids in completion_ids],
        benchmark=benchmark,
        on_scored=on_scored,
    )


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


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def benchmark_table(benchmark: Mapping[str, Any]) -> Any:
    """A rich table of a benchmark's result (`score_responses`' "benchmark"): one row per
    group, then the summary rows, then what was skipped."""
    from rich.table import Table

    table = Table(title=benchmark["title"])
    table.add_column(str(benchmark["group_by"]))
    for name in ("examples", "correct", "accuracy (%)"):
        table.add_column(name, justify="right")
    for group in benchmark["groups"]:
        table.add_row(
            group["name"],
            str(group["examples"]),
            str(group["correct"]),
            _percent(group["accuracy"]),
        )
    table.add_section()
    for row in benchmark["summary"]:
        correct = str(row["correct"]) if "correct" in row else ""
        table.add_row(row["name"], str(row["examples"]), correct, _percent(row["accuracy"]))
    if benchmark["skipped"]:
        table.add_section()
        for reason, count in benchmark["skipped"].items():
            table.add_row(f"skipped: {reason}", str(count), "", "")
    return table


@contextmanager
def progress_bars() -> Iterator[Callable[[str, int], Callable[[int], None]]]:
    """A rich progress display on stderr; yields `bar(description, total)`, which adds a bar
    and returns its `advance(n)` (its first call, `advance(0)` when a phase begins, starts the
    bar's clock)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    ) as progress:

        def bar(description: str, total: int) -> Callable[[int], None]:
            task_id = progress.add_task(description, total=total, start=False)
            started = False

            def advance(n: int) -> None:
                nonlocal started
                if not started:  # the clock starts with the phase, not when the bar is set up
                    progress.start_task(task_id)
                    started = True
                progress.advance(task_id, n)

            return advance

        yield bar


def _write_report(report: dict[str, Any], output: Path, title: str, seconds: float) -> None:
    """Write `eval.json` into `output` and print the table (the benchmark's, else the means)."""
    from rich.console import Console

    output.mkdir(parents=True, exist_ok=True)
    (output / "eval.json").write_text(json.dumps(report, indent=2, default=str))
    console = Console()
    if "benchmark" in report:
        console.print(benchmark_table(report["benchmark"]))
    else:
        console.print(summary_table(title, {"mean": report}))
    print(f"wrote {output / 'eval.json'} in {seconds:.0f} s")


def _data_title(task: str, split: str, data: str | None, benchmark: Any) -> str:
    """What was read: the benchmark's title, the user's files or the bundled split."""
    if benchmark is not None:
        return benchmark.title
    return f"{task}: {data}" if data is not None else f"{task} {split} (bundled)"


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
    categories: Sequence[str] | None = None,
) -> dict[str, Any]:
    """All of `mrtpo eval` (keywords named as its arguments): evaluate `model_name_or_path` on
    the task's split or the benchmark at `data`, write `eval.json` into `output_dir` (default
    `outputs/eval-<task>`), print the table; returns the report written."""
    from mrtpo import tasks
    from mrtpo.models import load_model

    task_object = tasks.get(task)
    benchmark, dataset = load_eval_data(task_object, split, data, max_examples, categories)
    model, tokenizer = load_model(model_name_or_path)

    started = time.perf_counter()
    with progress_bars() as bar:
        total = len(dataset) * num_samples
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
            benchmark=benchmark,
            on_generated=bar("generating", total),
            on_scored=bar("scoring", total),
        )
    seconds = time.perf_counter() - started

    report = {
        "model_name_or_path": model_name_or_path,
        "task": task,
        "split": split,
        "data": data,
        "categories": list(categories) if categories else None,
        "num_examples": len(dataset),
        "max_new_tokens": max_new_tokens,
        "decoding": decoding(temperature, num_samples),
        "seconds": round(seconds, 1),
        **result,
    }
    title = _data_title(task, split, data, benchmark)
    print(
        f"{model_name_or_path} on {title} ({len(dataset)} examples, "
        f"{decoding(temperature, num_samples)})"
    )
    _write_report(report, Path(output_dir or f"outputs/eval-{task}"), title, seconds)
    return report


def run_score(
    task: str,
    responses: str,
    split: str = "test",
    data: str | None = None,
    max_examples: int | None = None,
    output_dir: str | None = None,
    categories: Sequence[str] | None = None,
    partial: bool = False,
) -> dict[str, Any]:
    """All of `mrtpo score`: score the answers at `responses` (ids matched to the rows of the
    task's split or of the benchmark at `data`; a row without an id is matched by its
    position, from 0) exactly as `mrtpo eval` scores its own; rows without an answer are an
    error unless `partial`. Writes `eval.json` (default `outputs/score-<task>`), prints the
    table, returns the report."""
    from mrtpo import tasks
    from mrtpo.tasks.base import read_answers

    path = Path(responses)
    if not path.exists():
        raise FileNotFoundError(f"responses path {responses!r} does not exist")
    task_object = tasks.get(task)
    benchmark, dataset = load_eval_data(task_object, split, data, max_examples, categories)
    answers = benchmark.read_answers(path) if benchmark is not None else read_answers(path)
    rows = dataset.to_list()
    ids = [str(row.get("id", index)) for index, row in enumerate(rows)]
    unanswered = [row_id for row_id in ids if row_id not in answers]
    if unanswered and not partial:
        raise ValueError(
            f"responses {responses!r} hold no answer for {len(unanswered)} of the {len(ids)} "
            f"examples (first: id {unanswered[0]!r}); pass --partial to score the answered ones"
        )
    kept = [index for index, row_id in enumerate(ids) if row_id in answers]
    if not kept:
        raise ValueError(f"no answer in {responses!r} has the id of an example")

    started = time.perf_counter()
    with progress_bars() as bar:
        result = score_responses(
            task_object,
            [rows[index] for index in kept],
            [answers[ids[index]] for index in kept],
            benchmark=benchmark,
            on_scored=bar("scoring", len(kept)),
        )
    seconds = time.perf_counter() - started

    report = {
        "responses": responses,
        "task": task,
        "split": split,
        "data": data,
        "categories": list(categories) if categories else None,
        "num_examples": len(kept),
        "unanswered": len(unanswered),
        "unmatched_answers": len(set(answers) - set(ids)),
        "seconds": round(seconds, 1),
        **result,
    }
    title = _data_title(task, split, data, benchmark)
    print(
        f"{responses} on {title} ({len(kept)} examples"
        + (f", {len(unanswered)} without an answer left out" if unanswered else "")
        + ")"
    )
    _write_report(report, Path(output_dir or f"outputs/score-{task}"), title, seconds)
    return report
