"""The three text-to-SQL verifiers and the execution cache they share.

- `SqlFormat` ("sql_format"): the response keeps the format and its answer is one read query.
- `SqlExecutable` ("sql_executable"): the query runs on the example's database (sandboxed).
- `SqlExecution` ("sql_execution"): its result equals the reference query's result.

The two execution verifiers read the same query: a `QueryRunner` (shared by default) caches
results by (database, query text), so a batch runs each distinct query once, and each
reference query once for all the batches.
"""

from __future__ import annotations

import math
import os
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from mrtpo.tasks.sql.response_format import (
    DEFAULT_FORMAT,
    ResponseFormat,
    has_top_level_order_by,
    parse_response,
    read_query_problem,
)
from mrtpo.tasks.sql.sandbox import QueryResult, SqlSandbox, read_schema
from mrtpo.verifiers import Verdict, Verifier, completion_text

PREVIEW_ROWS = 5  # reference rows shown in the execution verifier's information
PREVIEW_VALUE_CHARS = 40


def normalize_query(query: str) -> str:
    """The text that is run and cached: blanks and trailing semicolons trimmed (nothing inside
    the query changes, so string literals keep their spaces)."""
    return query.strip().rstrip(";").strip()


class _LruCache:
    """A thread-safe LRU of QueryResults bounded in entries and in result bytes."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError(
                f"max_entries and max_bytes must be >= 1, got {max_entries}, {max_bytes}"
            )
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str], QueryResult] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> QueryResult | None:
        with self._lock:
            result = self._items.get(key)
            if result is not None:
                self._items.move_to_end(key)
            return result

    def put(self, key: tuple[str, str], result: QueryResult) -> None:
        with self._lock:
            if key in self._items:
                self._bytes -= self._items.pop(key).n_bytes
            self._items[key] = result
            self._bytes += result.n_bytes
            while len(self._items) > self.max_entries or (
                self._bytes > self.max_bytes and len(self._items) > 1
            ):
                _, evicted = self._items.popitem(last=False)
                self._bytes -= evicted.n_bytes

    def __len__(self) -> int:
        return len(self._items)


class QueryRunner:
    """A sandbox plus the caches: query results by (db_path, query text), reference results by
    (db_path, reference text), schemas by db_path.

    sandbox: the `SqlSandbox` that runs queries (default: default limits, process isolation).
    max_cached_results / max_cached_bytes: bounds of the query-result cache (the reference
    cache gets the same bounds).
    """

    def __init__(
        self,
        sandbox: SqlSandbox | None = None,
        max_cached_results: int = 4096,
        max_cached_bytes: int = 256_000_000,
    ) -> None:
        self.sandbox = sandbox if sandbox is not None else SqlSandbox()
        self._results = _LruCache(max_cached_results, max_cached_bytes)
        self._references = _LruCache(max_cached_results, max_cached_bytes)
        self._schemas: dict[str, str] = {}

    @property
    def executions(self) -> int:
        """Queries the sandbox has run so far (cache hits do not count)."""
        return self.sandbox.executions

    def run(self, db_path: str, query: str) -> QueryResult:
        """The result of a candidate `query`, run at most once while it stays cached."""
        key = (str(db_path), normalize_query(query))
        result = self._results.get(key) or self._references.get(key)
        if result is None:
            result = self.sandbox.run(key[0], key[1])
            self._results.put(key, result)
        return result

    def reference(self, db_path: str, reference_sql: str) -> QueryResult:
        """The result of a reference query (kept in its own cache: references recur every epoch)."""
        key = (str(db_path), normalize_query(reference_sql))
        result = self._references.get(key) or self._results.get(key)
        if result is None:
            result = self.sandbox.run(key[0], key[1])
        self._references.put(key, result)
        return result

    def schema(self, db_path: str) -> str:
        """The database's CREATE statements (ValueError if the file cannot be read)."""
        key = str(db_path)
        if key not in self._schemas:
            self._schemas[key] = read_schema(key)
        return self._schemas[key]


_shared_runner: QueryRunner | None = None
_shared_lock = threading.Lock()


def shared_runner() -> QueryRunner:
    """The process-wide runner the verifiers use unless given one (created on first use)."""
    global _shared_runner
    with _shared_lock:
        if _shared_runner is None:
            _shared_runner = QueryRunner()
        return _shared_runner


# -- result comparison -----------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _values_close(a: Any, b: Any, rel_tol: float, abs_tol: float) -> bool:
    if _is_number(a) and _is_number(b):
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
    return type(a) is type(b) and a == b


def _rows_close(a: Sequence[Any], b: Sequence[Any], rel_tol: float, abs_tol: float) -> bool:
    return all(_values_close(x, y, rel_tol, abs_tol) for x, y in zip(a, b, strict=True))


def _sort_key(row: Sequence[Any]) -> tuple[tuple[int, Any], ...]:
    """A total order on rows of mixed types; numbers rounded so near-equal ones sort together."""
    key = []
    for value in row:
        if value is None:
            key.append((0, 0))
        elif _is_number(value):
            key.append((1, float(f"{float(value):.6g}")))
        elif isinstance(value, str):
            key.append((2, value))
        else:
            key.append((3, bytes(value)))
    return tuple(key)


def _show(row: Sequence[Any]) -> str:
    shown = []
    for value in row:
        text = repr(value)
        shown.append(
            text if len(text) <= PREVIEW_VALUE_CHARS else text[: PREVIEW_VALUE_CHARS - 3] + "..."
        )
    return "(" + ", ".join(shown) + ")"


def compare_results(
    expected: QueryResult,
    got: QueryResult,
    ordered: bool,
    rel_tol: float = 1e-6,
    abs_tol: float = 1e-9,
) -> tuple[bool, str]:
    """(equal, why): rows as multisets (as lists when `ordered`), columns by position,
    numbers within `rel_tol`/`abs_tol`; column names are not compared."""
    if len(expected.columns) != len(got.columns):
        return False, f"{len(expected.columns)} columns expected, got {len(got.columns)}"
    if len(expected.rows) != len(got.rows):
        return False, f"{len(expected.rows)} rows expected, got {len(got.rows)}"
    if ordered:
        for i, (want, have) in enumerate(zip(expected.rows, got.rows, strict=True)):
            if not _rows_close(want, have, rel_tol, abs_tol):
                return (
                    False,
                    f"row {i + 1} differs (rows must come in the reference's order): expected {_show(want)}, got {_show(have)}",
                )
        return True, "same rows in the same order"
    if Counter(expected.rows) == Counter(got.rows):
        return True, "same rows"
    # Numbers may differ within the tolerance: compare the rows sorted.
    for want, have in zip(
        sorted(expected.rows, key=_sort_key), sorted(got.rows, key=_sort_key), strict=True
    ):
        if not _rows_close(want, have, rel_tol, abs_tol):
            return False, f"the rows differ: e.g. expected {_show(want)}, got {_show(have)}"
    return True, "same rows (numbers within tolerance)"


# -- verifiers ---------------------------------------------------------------------------


def _column(example: Mapping[str, Any], name: str) -> str:
    """A column the verifiers need (a dataset error, not a response's, if it is missing)."""
    value = example.get(name)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise ValueError(f"the example has no {name!r} column (text); the SQL verifiers need it")
    return value


class SqlFormat(Verifier):
    """1 if the response keeps the format and its answer is exactly one read query, else 0.

    Info: the format rule and the verdict. Spans: the tags, the answer block(s) and any stray
    text (the whole response when it has none of these).
    """

    name = "sql_format"

    def __init__(self, response_format: ResponseFormat = DEFAULT_FORMAT) -> None:
        self.response_format = response_format

    def verify(self, completion: str, example: Mapping[str, Any]) -> Verdict:
        parsed = parse_response(completion, self.response_format)
        problems = list(parsed.problems)
        if parsed.query is not None and not problems:
            sql_problem = read_query_problem(parsed.query)
            if sql_problem:
                problems.append(sql_problem)
        spans = sorted(set(parsed.tag_spans + parsed.answer_spans + parsed.stray_spans))
        if not spans and completion:
            spans = [(0, len(completion))]
        verdict = (
            "Verdict: the format is kept."
            if not problems
            else "Verdict: " + "; ".join(problems) + "."
        )
        return Verdict(
            0.0 if problems else 1.0, f"{self.response_format.rule}\n{verdict}", tuple(spans)
        )


class _ExecutingVerifier(Verifier):
    """Shared by the two execution verifiers: extract the query, run it through the runner."""

    def __init__(
        self, response_format: ResponseFormat = DEFAULT_FORMAT, runner: QueryRunner | None = None
    ) -> None:
        self.response_format = response_format
        self._runner = runner

    @property
    def runner(self) -> QueryRunner:
        return self._runner if self._runner is not None else shared_runner()

    def _query(self, completion: str) -> tuple[str | None, tuple[tuple[int, int], ...]]:
        parsed = parse_response(completion, self.response_format)
        if parsed.query is None or parsed.query_span is None:
            return None, ()
        return parsed.query, (parsed.query_span,)

    def _no_query(self) -> str:
        a = self.response_format.answer_tag
        return f"Verdict: no query inside <{a}>...</{a}>, nothing was run."


SCHEMA_IN_INFO = ("unless_in_prompt", "always")


class SqlExecutable(_ExecutingVerifier):
    """1 if the answer's query runs without error on the example's database, else 0
    (None when the database itself cannot be opened: not the response's fault).

    Info: the schema (CREATE statements) and, on failure, the database's error. With
    ``schema_in_info="unless_in_prompt"`` (the default) a schema that the prompt already shows
    verbatim is referred to instead of repeated: a second copy tells the policy nothing new,
    so the replay's difference for this reward is then the verdict itself, and the contexts
    are about 270 tokens shorter on the bundled database. ``"always"`` repeats it.
    Spans: the query.
    """

    name = "sql_executable"

    def __init__(
        self,
        response_format: ResponseFormat = DEFAULT_FORMAT,
        runner: QueryRunner | None = None,
        schema_in_info: str = "unless_in_prompt",
    ) -> None:
        super().__init__(response_format, runner)
        if schema_in_info not in SCHEMA_IN_INFO:
            raise ValueError(
                f"schema_in_info must be one of {SCHEMA_IN_INFO}, got {schema_in_info!r}"
            )
        self.schema_in_info = schema_in_info

    def _schema_info(self, db_path: str, example: Mapping[str, Any]) -> str:
        schema = self.runner.schema(db_path)
        # A prompt is text or chat messages, like a completion: the same reading.
        if self.schema_in_info == "unless_in_prompt" and schema in completion_text(
            example.get("prompt") or ""
        ):
            return "Database schema: the one in the prompt."
        return "Database schema:\n" + schema

    def verify(self, completion: str, example: Mapping[str, Any]) -> Verdict:
        db_path = _column(example, "db_path")
        try:
            schema = self._schema_info(db_path, example)
        except ValueError as error:
            return Verdict(None, f"Database unavailable: {error}")
        query, spans = self._query(completion)
        if query is None:
            return Verdict(0.0, f"{schema}\n{self._no_query()}", spans)
        result = self.runner.run(db_path, query)
        if result.kind == "unavailable":
            return Verdict(None, f"{schema}\nDatabase unavailable: {result.error}", spans)
        if not result.ok:
            return Verdict(0.0, f"{schema}\nDatabase error: {result.error}", spans)
        return Verdict(1.0, f"{schema}\nVerdict: the query runs.", spans)


class SqlExecution(_ExecutingVerifier):
    """1 if the answer's result equals the reference query's result, else 0 (None when the
    reference itself cannot run).

    Rows are compared as multisets, as ordered lists when the reference has a top-level ORDER
    BY; columns by position; numbers within `rel_tol`/`abs_tol`.
    Info: the reference query and the first rows of its result. Spans: the query.
    """

    name = "sql_execution"

    def __init__(
        self,
        response_format: ResponseFormat = DEFAULT_FORMAT,
        runner: QueryRunner | None = None,
        rel_tol: float = 1e-6,
        abs_tol: float = 1e-9,
    ) -> None:
        super().__init__(response_format, runner)
        if rel_tol < 0 or abs_tol < 0:
            raise ValueError(f"rel_tol and abs_tol must be >= 0, got {rel_tol}, {abs_tol}")
        self.rel_tol = rel_tol
        self.abs_tol = abs_tol

    def verify(self, completion: str, example: Mapping[str, Any]) -> Verdict:
        db_path = _column(example, "db_path")
        reference_sql = _column(example, "reference_sql")
        reference = self.runner.reference(db_path, reference_sql)
        if not reference.ok:
            return Verdict(
                None,
                f"Reference query: {reference_sql}\nThe reference query fails: {reference.error}",
            )
        info = self._reference_info(reference_sql, reference)
        query, spans = self._query(completion)
        if query is None:
            return Verdict(0.0, f"{info}\n{self._no_query()}", spans)
        result = self.runner.run(db_path, query)
        if not result.ok:
            return Verdict(0.0, f"{info}\nVerdict: the query did not run: {result.error}", spans)
        ordered = has_top_level_order_by(reference_sql)
        equal, why = compare_results(reference, result, ordered, self.rel_tol, self.abs_tol)
        return Verdict(1.0 if equal else 0.0, f"{info}\nVerdict: {why}.", spans)

    @staticmethod
    def _reference_info(reference_sql: str, reference: QueryResult) -> str:
        n = len(reference.rows)
        lines = [
            f"Reference query: {normalize_query(reference_sql)}",
            f"Reference result: {n} row{'s' if n != 1 else ''}, columns ({', '.join(reference.columns)})"
            + (f"; the first {PREVIEW_ROWS}:" if n > PREVIEW_ROWS else ":"),
        ]
        lines += [_show(row) for row in reference.rows[:PREVIEW_ROWS]]
        return "\n".join(lines)
