"""Execution accuracy on Spider and BIRD, as their official evaluations define it.

Spider: the test-suite evaluation (`exec_eval.py` of taoyds/test-suite-sql-eval, Spider's
official metric since 2020), with values predicted (no `--plug_value`):

- both queries are prepared the same way: `> =`, `< =`, `! =` closed up, `YEAR(CURDATE())`
  read as 2020, and every DISTINCT keyword removed (its default; `keep_distinct=True` keeps
  them);
- row order matters when the gold query contains "order by" (anywhere, any case);
- two results are equal when both are empty, or when they have as many rows and columns and
  some reordering of the predicted columns makes the rows equal: as lists when order matters,
  else as multisets (duplicates count);
- the queries run on every `*.sqlite` file in the example's database folder (a test suite
  holds several, Spider's own folder one) and must agree on each; a query gets 60 s.

BIRD (`evaluation.py` of the BIRD benchmark): equal when the *sets* of rows are equal (order,
duplicates and column names ignored; columns compared in order); a query gets 30 s (BIRD's
time-out covers the two queries together).

In both, a prediction that fails to run or runs out of time is wrong. A gold query that fails
counts as wrong too (BIRD's evaluation does so; Spider's stops), and the table reports how many
did. Every query runs in the project's sandbox (`sandbox.SqlSandbox`: read-only, time-capped,
in a child process), with the official time budgets and rows capped at `MAX_ROWS`.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlglot
from sqlglot.tokens import TokenType

from mrtpo.tasks.base import Benchmark, accuracy_by_group
from mrtpo.tasks.sql.data import SYSTEM_PROMPT, load_benchmark_rows
from mrtpo.tasks.sql.response_format import DEFAULT_FORMAT, ResponseFormat, parse_response
from mrtpo.tasks.sql.sandbox import QueryResult, SqlSandbox
from mrtpo.tasks.sql.verifiers import QueryRunner
from mrtpo.verifiers import Verdict, Verifier

TIME_BUDGETS_S = {"spider": 60.0, "bird": 30.0}
NAMES = {"spider": "Spider", "bird": "BIRD"}
MAX_ROWS = 1_000_000
MAX_RESULT_BYTES = 500_000_000
BIRD_SEPARATOR = "\t----- bird -----\t"  # between the query and db_id in BIRD's predictions

_SPACED_COMPARISONS = (("> =", ">="), ("< =", "<="), ("! =", "!="))
_CURRENT_YEAR = re.compile(r"YEAR\s*\(\s*CURDATE\s*\(\s*\)\s*\)\s*", re.IGNORECASE)


def without_distinct(query: str) -> str:
    """`query` with its DISTINCT keywords removed (strings and names untouched); unchanged
    when it cannot be tokenized."""
    try:
        tokens = sqlglot.tokenize(query, read="sqlite")
    except Exception:  # sqlglot's tokenizer errors have several types
        return query
    kept, cursor = [], 0
    for token in tokens:
        if token.token_type == TokenType.DISTINCT:
            kept.append(query[cursor : token.start])
            cursor = token.end + 1
    return "".join(kept) + query[cursor:]


def spider_query(query: str, keep_distinct: bool = False) -> str:
    """A query as Spider's test-suite evaluation runs it (module docstring)."""
    for spaced, closed in _SPACED_COMPARISONS:
        query = query.replace(spaced, closed)
    query = _CURRENT_YEAR.sub("2020", query)
    return query if keep_distinct else without_distinct(query)


def _column_permutations(
    gold: Sequence[Sequence[Any]], predicted: Sequence[Sequence[Any]]
) -> list[tuple[int, ...]]:
    """Orders of the predicted columns under which each column holds the same multiset of
    values as the gold column at its position (the only orders that can make the rows equal)."""
    width = len(gold[0])
    gold_columns = [Counter(row[i] for row in gold) for i in range(width)]
    predicted_columns = [Counter(row[j] for row in predicted) for j in range(width)]
    candidates = [
        [j for j in range(width) if predicted_columns[j] == gold_columns[i]] for i in range(width)
    ]
    orders: list[tuple[int, ...]] = []

    def extend(order: tuple[int, ...]) -> None:
        if len(order) == width:
            orders.append(order)
            return
        for j in candidates[len(order)]:
            if j not in order:
                extend((*order, j))

    extend(())
    return orders


def spider_results_equal(
    gold: Sequence[Sequence[Any]], predicted: Sequence[Sequence[Any]], order_matters: bool
) -> bool:
    """Spider's test-suite equality of two results (rows of values; module docstring)."""
    if not gold and not predicted:
        return True
    if len(gold) != len(predicted) or len(gold[0]) != len(predicted[0]):
        return False
    gold_rows = [tuple(row) for row in gold]
    for order in _column_permutations(gold, predicted):
        reordered = [tuple(row[j] for j in order) for row in predicted]
        if order_matters and reordered == gold_rows:
            return True
        if not order_matters and Counter(reordered) == Counter(gold_rows):
            return True
    return False


def bird_results_equal(gold: Sequence[Sequence[Any]], predicted: Sequence[Sequence[Any]]) -> bool:
    """BIRD's equality: the same set of rows."""
    return {tuple(row) for row in gold} == {tuple(row) for row in predicted}


_runners: dict[str, QueryRunner] = {}
_runners_lock = threading.Lock()


def benchmark_runner(benchmark: str) -> QueryRunner:
    """The process-wide query runner of a benchmark: the official time budget per query."""
    with _runners_lock:
        if benchmark not in _runners:
            _runners[benchmark] = QueryRunner(
                SqlSandbox(
                    time_budget_s=TIME_BUDGETS_S[benchmark],
                    max_rows=MAX_ROWS,
                    max_result_bytes=MAX_RESULT_BYTES,
                )
            )
        return _runners[benchmark]


def _failure(result: QueryResult) -> str:
    return f"{result.kind}: {result.error}"


class ExecutionAccuracy(Verifier):
    """1 when the response's query gives the gold query's result by the benchmark's official
    rule (module docstring), else 0. Reads the row's `benchmark` ("spider" or "bird"),
    `db_path` and `reference_sql`; the query is the response's last `<answer>` block.

    runner: the `QueryRunner` to use (default: the benchmark's, `benchmark_runner`).
    """

    name = "execution_accuracy"

    def __init__(
        self,
        runner: QueryRunner | None = None,
        keep_distinct: bool = False,
        response_format: ResponseFormat = DEFAULT_FORMAT,
    ) -> None:
        self.runner = runner
        self.keep_distinct = keep_distinct
        self.response_format = response_format

    def verify(self, completion: str, example: Mapping[str, Any]) -> Verdict:
        benchmark = str(example.get("benchmark") or "")
        if benchmark not in TIME_BUDGETS_S:
            raise ValueError(
                f"example has benchmark {benchmark!r}; execution accuracy needs 'spider' or 'bird'"
            )
        query = parse_response(completion, self.response_format).query
        if not query:
            tag = self.response_format.answer_tag
            return Verdict(0.0, f"no query inside <{tag}>...</{tag}>")
        runner = self.runner or benchmark_runner(benchmark)
        gold_query = str(example["reference_sql"])
        db_path = Path(str(example["db_path"]))
        if benchmark == "bird":
            databases, order_matters = [db_path], False
        else:
            query, gold_query = (
                spider_query(query, self.keep_distinct),
                spider_query(gold_query, self.keep_distinct),
            )
            databases = sorted(db_path.parent.glob("*.sqlite"))
            order_matters = "order by" in gold_query.lower()
        for database in databases:
            gold = runner.reference(str(database), gold_query)
            if not gold.ok:
                return Verdict(0.0, f"the gold query fails on {database.name} ({_failure(gold)})")
            predicted = runner.run(str(database), query)
            if not predicted.ok:
                return Verdict(0.0, f"the query fails on {database.name} ({_failure(predicted)})")
            equal = (
                bird_results_equal(gold.rows, predicted.rows)
                if benchmark == "bird"
                else spider_results_equal(gold.rows, predicted.rows, order_matters)
            )
            if not equal:
                return Verdict(0.0, f"the result differs from the gold result on {database.name}")
        return Verdict(1.0, f"same result as the gold query ({NAMES[benchmark]}'s rule)")


@dataclass
class TextToSqlBenchmark(Benchmark):
    """Spider or BIRD: execution accuracy per database, overall and (BIRD) per difficulty."""

    group_by: str = "database"
    keep_distinct: bool = False

    def verifiers(self) -> list[Verifier]:
        return [ExecutionAccuracy(keep_distinct=self.keep_distinct)]

    def summarize(
        self, rows: Sequence[Mapping[str, Any]], verdicts: Sequence[Sequence[Verdict]]
    ) -> dict[str, Any]:
        scores = [line[0].score for line in verdicts]
        groups = accuracy_by_group([str(row["db_id"]) for row in rows], scores)
        (overall,) = accuracy_by_group(["overall"] * len(rows), scores)
        summary = [{**overall, "formula": "all examples"}]
        difficulties = [str(row.get("difficulty") or "") for row in rows]
        if any(difficulties):
            for group in accuracy_by_group(difficulties, scores):
                summary.append({**group, "formula": f"examples of difficulty {group['name']}"})
        gold_failures = sum(line[0].info.startswith("the gold query fails") for line in verdicts)
        summary.append(
            {
                "name": "gold query fails",
                "examples": gold_failures,
                "accuracy": None,
                "formula": "counted wrong",
            }
        )
        return {"groups": groups, "summary": summary}

    def response_text(self, record: Mapping[str, Any]) -> str:
        """A record's "response" text, or its bare "sql" (written in the answer format)."""
        if "response" not in record and isinstance(record.get("sql"), str):
            return DEFAULT_FORMAT.wrap(record["sql"])
        return super().response_text(record)

    def read_answers(self, path: Path) -> dict[str, str]:
        """Also the official prediction files: Spider's text file (one query per line, the
        line number, from 0, being the id) and BIRD's `predict_dev.json` ({"0": "query\t-----
        bird -----\tdb_id", ...})."""
        if path.suffix in (".txt", ".sql"):
            lines = path.read_text(encoding="utf-8").splitlines()
            return {str(i): self.response_text({"sql": line}) for i, line in enumerate(lines)}
        if path.is_file() and path.suffix == ".json":
            try:
                predictions = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                predictions = None  # JSON Lines: read below
            if isinstance(predictions, dict) and "id" not in predictions:
                return {
                    str(key): self.response_text({"sql": str(value).split(BIRD_SEPARATOR)[0]})
                    for key, value in predictions.items()
                }
        return super().read_answers(path)


def load_benchmark(
    path: str | Path,
    split: str = "dev",
    max_examples: int | None = None,
    system_prompt: str = SYSTEM_PROMPT,
    keep_distinct: bool = False,
) -> TextToSqlBenchmark:
    """Spider or BIRD at `path` as a benchmark: its first `max_examples` examples of `split`
    ("test" reads dev), those whose database is missing skipped and counted."""
    name, dataset, skipped = load_benchmark_rows(path, split, max_examples, system_prompt)
    split = "dev" if split == "test" else split
    title = f"{NAMES[name]} {split}: {path}"
    if max_examples is not None:
        title += f" (first {max_examples} examples)"
    return TextToSqlBenchmark(
        title=title,
        dataset=dataset,
        skipped={f"database {db_id} missing": count for db_id, count in sorted(skipped.items())},
        keep_distinct=keep_distinct,
    )
