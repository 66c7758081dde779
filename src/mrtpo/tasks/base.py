"""What every task offers the trainer, the CLI and the credit analysis."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import Dataset

from mrtpo.verifiers import Verdict, Verifier


def accuracy_by_group(
    groups: Sequence[str], scores: Sequence[float | None]
) -> list[dict[str, Any]]:
    """One row per group, in first-seen order: {"name", "examples" (scored ones), "correct"
    (score 1), "accuracy" (None without scored examples)}; a None score is not counted."""
    counts: dict[str, list[int]] = {}
    for group, score in zip(groups, scores, strict=True):
        count = counts.setdefault(group, [0, 0])
        if score is not None:
            count[0] += 1
            count[1] += score >= 1.0
    return [
        {
            "name": group,
            "examples": examples,
            "correct": correct,
            "accuracy": correct / examples if examples else None,
        }
        for group, (examples, correct) in counts.items()
    ]


@dataclass
class Benchmark:
    """A benchmark's data with its own scoring rules, as its official evaluation scores it.

    `Task.benchmark` makes one from a benchmark's folder (BFCL's, Spider's, ...). `mrtpo eval`
    generates an answer for every row of `dataset`; `mrtpo score` reads answers made elsewhere
    (`read_answers`). Both then score them the same way: each of `verifiers()` judges each
    response (1 right, 0 wrong, None not counted), and `summarize` turns the verdicts into the
    benchmark's table.

    title: names the data read (the table's title).
    dataset: the examples to answer, each with an `id` and a `prompt`.
    group_by: what one row of the table is ("category", "database", ...).
    skipped: examples left out of `dataset`, by reason ({"database wta_1 missing": 62}).
    """

    title: str
    dataset: Dataset
    group_by: str = "group"
    skipped: dict[str, int] = field(default_factory=dict)

    def verifiers(self) -> list[Verifier]:
        """The verifiers whose verdicts `summarize` reads, in its order."""
        raise NotImplementedError

    def summarize(
        self, rows: Sequence[Mapping[str, Any]], verdicts: Sequence[Sequence[Verdict]]
    ) -> dict[str, Any]:
        """The table from one list of verdicts per row (in `verifiers()` order):
        {"groups": [{"name", "examples", "correct", "accuracy"}, ...] (see
        `accuracy_by_group`), "summary": [{"name", "examples", "accuracy", "formula"}, ...]}
        (summary accuracies None where an input is missing)."""
        raise NotImplementedError

    def response_text(self, record: Mapping[str, Any]) -> str:
        """The response of one record of an answers file (default: `response_text`)."""
        return response_text(record)

    def read_answers(self, path: Path) -> dict[str, str]:
        """{id: response} from an answers file or folder (default: `read_answers`)."""
        return read_answers(path, self.response_text)


def response_text(record: Mapping[str, Any]) -> str:
    """The response of one record of an answers file: its "response" text."""
    response = record.get("response")
    if not isinstance(response, str):
        raise ValueError(
            f'answer {record.get("id")!r} needs a "response" string, got keys {sorted(record)}'
        )
    return response


def read_answers(
    path: Path, text_of: Callable[[Mapping[str, Any]], str] = response_text
) -> dict[str, str]:
    """{id: text_of(record)} from JSON Lines of {"id", "response"} records: a file, or every
    `*.json`/`*.jsonl` file under a folder (as BFCL's result folders hold them)."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in (".json", ".jsonl"))
    else:
        files = [path]
    answers: dict[str, str] = {}
    for file in files:
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{file}:{number} is not a JSON line: {error}") from None
            if not isinstance(record, dict) or "id" not in record:
                raise ValueError(f'{file}:{number} must be a JSON object with an "id"')
            answers[str(record["id"])] = text_of(record)
    return answers


class Task:
    """A task: bundled data, its verifiers, and how to judge a model on it.

    Subclasses set `name` and `system_prompt` and implement `load` and `verifiers`.
    Dataset rows have a `prompt` column of chat messages (system prompt first), ready for
    TRL's `GRPOTrainer`/`SFTTrainer`, plus the columns the verifiers read.
    """

    name: str = "task"
    system_prompt: str = ""
    # The headline metric `mrtpo eval` reports, e.g. "result match rate".
    headline_name: str = "accuracy"

    def load(self, split: str = "train", path: str | None = None, **kwargs: Any) -> Dataset:
        """The bundled split ("train" or "test"), or the user's files at `path`."""
        raise NotImplementedError

    def verifiers(self, **kwargs: Any) -> list[Verifier]:
        """The task's verifiers, in a fixed order (one reward each)."""
        raise NotImplementedError

    def verifiers_for(self, rows: Iterable[Mapping[str, Any]]) -> list[Verifier]:
        """The verifiers that score every reward of `rows` (dataset rows). Default: `verifiers()`;
        a task whose rows carry a varying number of rewards sizes its set to the longest row."""
        return self.verifiers()

    def reference_completion(self, example: Mapping[str, Any]) -> str | None:
        """A correct response for supervised cold start, or None if the data has none."""
        return None

    def headline(self, verdicts: Sequence[Sequence[Verdict]]) -> dict[str, float]:
        """Headline metric(s) from per-example verdicts (one list of verdicts per example,
        in `verifiers()` order). Default: share of examples where every applicable score is 1."""
        if not verdicts:
            return {self.headline_name: 0.0}
        passed = [all(v.score is None or v.score >= 1.0 for v in row) for row in verdicts]
        return {self.headline_name: sum(passed) / len(passed)}

    def benchmark(
        self,
        path: str,
        split: str = "test",
        categories: Sequence[str] | None = None,
        max_examples: int | None = None,
    ) -> Benchmark | None:
        """The benchmark stored at `path` when the task knows its layout, else None (the data
        is then scored by the verifiers' means and the headline).

        categories: which of the benchmark's categories (None: its default set);
        max_examples: the first N examples of each category (all when None).
        This is the hook `mrtpo eval` and `mrtpo score` use for benchmark-grade numbers.
        """
        return None
