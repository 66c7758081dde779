"""The text-to-SQL task: `TASK` (registered as "sql").

The response holds optional reasoning in <think>...</think> and one query in
<answer>...</answer>; three binary rewards judge it: format (`SqlFormat`), executability
(`SqlExecutable`) and execution match with the reference (`SqlExecution`). Queries run in a
read-only sandbox (`sandbox`). Data: the bundled shop database (`load()`), or a Spider or BIRD
folder (`load(split, path=...)`); the bundled data is built by `scripts/build_data/sql.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from datasets import Dataset

from mrtpo.tasks.base import Benchmark, Task
from mrtpo.tasks.sql.data import (
    SYSTEM_PROMPT,
    benchmark_name,
    load_bundled,
    load_path,
)
from mrtpo.tasks.sql.exec_accuracy import load_benchmark
from mrtpo.tasks.sql.response_format import DEFAULT_FORMAT, ResponseFormat
from mrtpo.tasks.sql.sandbox import SqlSandbox
from mrtpo.tasks.sql.verifiers import QueryRunner, SqlExecutable, SqlExecution, SqlFormat
from mrtpo.verifiers import Verdict, Verifier


class SqlTask(Task):
    name = "sql"
    system_prompt = SYSTEM_PROMPT
    # The training reward's rule, not Spider's or BIRD's: on their folders `mrtpo eval` also
    # reports their official execution accuracy (`exec_accuracy`), which can differ.
    headline_name = "result match rate"

    def load(self, split: str = "train", path: str | None = None, **kwargs: Any) -> Dataset:
        """The bundled split ("train"/"test"), or the Spider/BIRD folder at `path` (split
        "dev"/"train"; "test" reads dev). kwargs: `skip_missing` for Spider/BIRD."""
        if path is None:
            if kwargs:
                raise ValueError(f"the bundled data takes no options, got {sorted(kwargs)}")
            return load_bundled(split, system_prompt=self.system_prompt)
        return load_path(path, split, system_prompt=self.system_prompt, **kwargs)

    def verifiers(
        self,
        response_format: ResponseFormat = DEFAULT_FORMAT,
        runner: QueryRunner | None = None,
        schema_in_info: str = "unless_in_prompt",
        **sandbox_options: Any,
    ) -> list[Verifier]:
        """[SqlFormat, SqlExecutable, SqlExecution]. The two execution verifiers share one
        `QueryRunner` (the process-wide one unless `runner` or sandbox options such as
        `time_budget_s=1.0` are given), so each query runs once. `schema_in_info`: see
        `SqlExecutable`."""
        if runner is None and sandbox_options:
            runner = QueryRunner(SqlSandbox(**sandbox_options))
        elif sandbox_options:
            raise ValueError("give either runner or sandbox options, not both")
        return [
            SqlFormat(response_format),
            SqlExecutable(response_format, runner, schema_in_info),
            SqlExecution(response_format, runner),
        ]

    def benchmark(
        self,
        path: str,
        split: str = "test",
        categories: Sequence[str] | None = None,
        max_examples: int | None = None,
    ) -> Benchmark | None:
        """Spider or BIRD at `path`: execution accuracy as their official evaluations define
        it, per database and overall (`exec_accuracy`); None for other folders."""
        if benchmark_name(Path(path)) is None:
            return None
        if categories:
            raise ValueError(
                f"categories are BFCL's; Spider and BIRD have none, got {list(categories)}"
            )
        return load_benchmark(path, split, max_examples, self.system_prompt)

    def reference_completion(self, example: Mapping[str, Any]) -> str | None:
        reference = example.get("reference_sql")
        return DEFAULT_FORMAT.wrap(reference) if reference else None

    def headline(self, verdicts: Sequence[Sequence[Verdict]]) -> dict[str, float]:
        """The result match rate: the mean sql_execution score (rows whose reference cannot
        run are left out), plus the format and executability rates."""
        means = {}
        for index, key in ((2, self.headline_name), (0, "format rate"), (1, "executable rate")):
            scores = [
                row[index].score
                for row in verdicts
                if len(row) > index and row[index].score is not None
            ]
            means[key] = sum(scores) / len(scores) if scores else 0.0
        return means


TASK = SqlTask()
