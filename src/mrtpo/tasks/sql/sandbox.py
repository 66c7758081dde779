"""A read-only SQLite sandbox for model-written queries.

Model output is untrusted, so a query runs behind independent locks:
1. the database is opened read-only (`mode=ro` URI) and with `PRAGMA query_only`;
2. an authorizer allows only reads: writes, schema changes, ATTACH/DETACH, transactions,
   PRAGMAs other than a few schema reads, and extension loading are denied;
3. a progress handler aborts the query once its time budget (default 2 s) is spent;
4. size limits: query text length, string/blob length (so `randomblob(2000000000)` fails at
   once), LIKE pattern length, fetched rows and result bytes;
5. isolation="process" (default): the query runs in a child process (one per worker thread,
   kept alive and reused) that is killed if it overruns the budget by `kill_grace_s`. The
   progress handler only runs between virtual-machine instructions, and a few SQLite
   functions loop for a long time inside one instruction (`printf('%.*c', 2000000000, 'x')`,
   `trim`/`instr`/`LIKE` on long strings): only a kill bounds those. The child also caps its
   address space (`max_memory_bytes`).

Table-valued functions (`json_each`, `pragma_table_info`, ...) are refused: SQLite asks the
authorizer for a schema update when it sets them up, and the authorizer allows no writes.

Every outcome (rows, database error, denial, timeout, cap, malformed text) is a `QueryResult`;
`SqlSandbox.run` never raises. One connection per database per worker is opened on first use
and reused.
"""

from __future__ import annotations

import json
import marshal
import os
import sqlite3
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

# Authorizer action codes that a read query needs.
_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE}
# PRAGMAs that only read the schema, whatever their argument.
_HARMLESS_PRAGMAS = {
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "collation_list",
}
# Functions that touch the file system or the process: never callable from a query.
_DENIED_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"}

ISOLATIONS = ("process", "thread")
_START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class QueryResult:
    """The outcome of one query.

    ok: the query ran to completion within every limit.
    columns: result column names (empty on failure).
    rows: result rows as tuples (empty on failure).
    error: why it failed, in words (None when ok).
    kind: "ok", "error" (the database refused or failed it), "denied" (the authorizer),
        "timeout", "row_cap", "byte_cap", "too_long", "multiple_statements", "empty" or
        "unavailable" (the database file cannot be opened).
    n_bytes: approximate size of the rows (used for cache accounting).
    """

    ok: bool
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[Any, ...], ...] = ()
    error: str | None = None
    kind: str = "ok"
    n_bytes: int = 0


@dataclass(frozen=True)
class SandboxLimits:
    """Every limit of the sandbox (see `SqlSandbox`)."""

    time_budget_s: float = 2.0
    max_rows: int = 10_000
    max_result_bytes: int = 10_000_000
    max_query_chars: int = 20_000
    max_value_bytes: int = 1_000_000
    max_like_pattern_chars: int = 1_000
    max_memory_bytes: int = 2 << 30

    def __post_init__(self) -> None:
        if not self.time_budget_s > 0:
            raise ValueError(f"time_budget_s must be > 0, got {self.time_budget_s!r}")
        for name in (
            "max_rows",
            "max_result_bytes",
            "max_query_chars",
            "max_value_bytes",
            "max_like_pattern_chars",
            "max_memory_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")


def _value_bytes(value: Any) -> int:
    """Approximate memory a fetched value stands for (numbers count as 8 bytes)."""
    if isinstance(value, str | bytes):
        return len(value)
    return 8


def _decode_text(raw: bytes) -> str:
    # Some public databases hold text that is not valid UTF-8; never fail a query on it.
    return raw.decode("utf-8", errors="replace")


def _authorize(
    action: int, arg1: str | None, arg2: str | None, db_name: str | None, source: str | None
) -> int:
    """SQLite authorizer: allow reads only (see the module docstring)."""
    if action in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_FUNCTION:  # arg2: the function's name
        return (
            sqlite3.SQLITE_DENY if (arg2 or "").lower() in _DENIED_FUNCTIONS else sqlite3.SQLITE_OK
        )
    if action == sqlite3.SQLITE_PRAGMA:  # arg1: the pragma's name, arg2: its argument
        return (
            sqlite3.SQLITE_OK if (arg1 or "").lower() in _HARMLESS_PRAGMAS else sqlite3.SQLITE_DENY
        )
    return sqlite3.SQLITE_DENY


def compact_create(sql: str) -> str:
    """A CREATE statement with blank lines and repeated spaces removed (newlines are kept:
    Spider schemas hold `--` comments that would swallow the rest of a joined line)."""
    lines = (" ".join(line.split()) for line in sql.strip().rstrip(";").splitlines())
    return "\n".join(line for line in lines if line)


def read_schema(db_path: str | os.PathLike[str]) -> str:
    """The CREATE TABLE statements of a database file, one per table (ValueError if unreadable).

    A fixed query of ours on the user's file, so it runs outside the sandbox.
    """
    path = Path(db_path)
    if not path.is_file():
        raise ValueError(f"database file not found: {path}")
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            statements = conn.execute(
                "SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL "
                "AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
            ).fetchall()
        finally:
            conn.close()
    except sqlite3.Error as error:
        raise ValueError(f"cannot read the schema of {path}: {error}") from error
    return "\n".join(compact_create(sql) + ";" for (sql,) in statements)


class _Deadline:
    """The progress handler's state: abort once `monotonic() > at`."""

    def __init__(self) -> None:
        self.at = float("inf")

    def __call__(self) -> int:
        return 1 if time.monotonic() > self.at else 0


class _Connections:
    """The locked-down connections of one worker (thread or child process), by database path."""

    def __init__(self, limits: SandboxLimits) -> None:
        self.limits = limits
        self.open: dict[str, tuple[sqlite3.Connection, _Deadline]] = {}

    def get(self, db_path: str) -> tuple[sqlite3.Connection, _Deadline]:
        """The connection to `db_path`, opened on first use; raises sqlite3.Error if it cannot be."""
        if db_path in self.open:
            return self.open[db_path]
        path = Path(db_path)
        if not path.is_file():
            raise sqlite3.OperationalError(f"database file not found: {path}")
        # Read-only URI: SQLite itself refuses every write to the file.
        uri = path.resolve().as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        try:
            conn.text_factory = _decode_text
            conn.execute("PRAGMA query_only = ON")
            limits = self.limits
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
            conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, limits.max_query_chars * 4 + 16)
            conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, limits.max_like_pattern_chars)
            conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
            conn.set_authorizer(_authorize)
            deadline = _Deadline()
            conn.set_progress_handler(deadline, 1000)  # checked every 1000 VM instructions
        except BaseException:
            conn.close()
            raise
        self.open[db_path] = (conn, deadline)
        return conn, deadline

    def run(self, db_path: str, query: str) -> QueryResult:
        try:
            conn, deadline = self.get(db_path)
        except (sqlite3.Error, OSError, ValueError) as error:
            return QueryResult(
                False, error=f"cannot open the database: {error}", kind="unavailable"
            )
        deadline.at = time.monotonic() + self.limits.time_budget_s
        cursor = None
        try:
            cursor = conn.execute(query)
            return self._fetch(cursor, deadline)
        except sqlite3.ProgrammingError as error:
            if "one statement at a time" in str(error):
                return QueryResult(
                    False,
                    error="more than one statement: only a single query is run",
                    kind="multiple_statements",
                )
            return QueryResult(False, error=str(error), kind="error")
        except sqlite3.Error as error:
            return self._failure(str(error), deadline)
        except (MemoryError, OverflowError, ValueError) as error:  # huge integers, bad text
            return QueryResult(False, error=f"{type(error).__name__}: {error}", kind="error")
        finally:
            deadline.at = float("inf")
            if cursor is not None:
                try:
                    cursor.close()
                except sqlite3.Error:
                    pass

    def _fetch(self, cursor: sqlite3.Cursor, deadline: _Deadline) -> QueryResult:
        limits = self.limits
        columns = tuple(str(d[0]) for d in cursor.description or ())
        rows: list[tuple[Any, ...]] = []
        n_bytes = 0
        while chunk := cursor.fetchmany(256):
            n_bytes += sum(_value_bytes(v) for row in chunk for v in row)
            rows.extend(chunk)
            if len(rows) > limits.max_rows:
                return QueryResult(
                    False,
                    error=f"the result has more than {limits.max_rows:,} rows",
                    kind="row_cap",
                )
            if n_bytes > limits.max_result_bytes:
                return QueryResult(
                    False,
                    error=f"the result is larger than {limits.max_result_bytes:,} bytes",
                    kind="byte_cap",
                )
            if time.monotonic() > deadline.at:  # converting rows to Python counts too
                return timeout_result(limits.time_budget_s)
        return QueryResult(True, columns=columns, rows=tuple(rows), n_bytes=n_bytes)

    def _failure(self, message: str, deadline: _Deadline) -> QueryResult:
        if message == "interrupted" and time.monotonic() > deadline.at:
            return timeout_result(self.limits.time_budget_s)
        if message.startswith("not authorized") or message == "authorization denied":
            return QueryResult(
                False, error=f"{message} (only read queries are allowed)", kind="denied"
            )
        return QueryResult(False, error=message, kind="error")

    def close(self) -> None:
        for conn, _ in self.open.values():
            conn.close()
        self.open.clear()


def timeout_result(budget_s: float) -> QueryResult:
    return QueryResult(
        False, error=f"the query ran longer than the {budget_s:g} s budget", kind="timeout"
    )


def _encode_result(result: QueryResult) -> bytes:
    # marshal, not pickle: the parent never unpickles what the child sends.
    return marshal.dumps(
        (result.ok, result.columns, result.rows, result.error, result.kind, result.n_bytes)
    )


def _decode_result(data: bytes) -> QueryResult:
    ok, columns, rows, error, kind, n_bytes = marshal.loads(data)
    return QueryResult(bool(ok), tuple(columns), tuple(rows), error, str(kind), int(n_bytes))


def _child_main(limits: SandboxLimits) -> None:
    """The child process (`python -I sandbox.py LIMITS_JSON`): reads (db_path, query)
    requests from stdin, answers each with a marshalled `QueryResult` on stdout."""
    requests = Connection(os.dup(0), writable=False)
    answers = Connection(os.dup(1), readable=False)
    sys.stdout = sys.stderr  # nothing else may write into the answer pipe
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limits.max_memory_bytes, limits.max_memory_bytes))
    except (ImportError, ValueError, OSError):
        pass  # no address-space cap on this platform; the time kill still applies
    connections = _Connections(limits)
    answers.send_bytes(marshal.dumps("ready"))
    while True:
        try:
            db_path, query = marshal.loads(requests.recv_bytes())
        except (EOFError, OSError, ValueError, KeyboardInterrupt):
            return
        answers.send_bytes(_encode_result(connections.run(db_path, query)))


class _Child:
    """One worker's child process and its pipes; restarted after a kill or a crash.

    A plain `python -I .../sandbox.py` subprocess (not multiprocessing): it never re-imports the
    user's main script.
    """

    def __init__(self, limits: SandboxLimits) -> None:
        self.limits = limits
        self.process: subprocess.Popen[bytes] | None = None
        self.requests: Connection | None = None
        self.answers: Connection | None = None
        self._finalizer: weakref.finalize | None = None

    def start(self) -> None:
        """Start the child and wait until it is up (raises OSError if it does not start)."""
        # Run by path in isolated mode (-I): importing the package `mrtpo.tasks.sql` would load
        # sqlglot and datasets into every child; this file needs the standard library only.
        command = [sys.executable, "-I", __file__, json.dumps(asdict(self.limits))]
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert process.stdin is not None and process.stdout is not None
        self.requests = Connection(os.dup(process.stdin.fileno()), readable=False)
        self.answers = Connection(os.dup(process.stdout.fileno()), writable=False)
        process.stdin.close()
        process.stdout.close()
        self.process = process
        # Kill the child when this worker is dropped or the interpreter exits.
        self._finalizer = weakref.finalize(
            self, _kill, os.getpid(), process, self.requests, self.answers
        )
        # Wait for the child to be up, so its start-up time never eats a query's budget.
        try:
            ready = (
                self.answers.poll(_START_TIMEOUT_S)
                and marshal.loads(self.answers.recv_bytes()) == "ready"
            )
        except (EOFError, OSError, ValueError):
            ready = False
        if not ready:
            self.stop()
            raise OSError("the SQL sandbox process did not start")

    def call(self, request: tuple[str, str], wait_s: float) -> QueryResult | None:
        """The child's answer to `request`; None if it overran `wait_s` (then it is killed and
        the next call starts a fresh one). Raises OSError if no child can be started."""
        if self.process is None or self.process.poll() is not None:
            self.stop()
            self.start()
        assert self.requests is not None and self.answers is not None
        try:
            self.requests.send_bytes(marshal.dumps(request))
            if not self.answers.poll(wait_s):
                self.stop()
                return None
            return _decode_result(self.answers.recv_bytes())
        except (EOFError, OSError, ValueError, TypeError) as error:
            self.stop()
            return QueryResult(
                False, error=f"the sandbox process failed ({type(error).__name__})", kind="error"
            )

    def stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # kills the child and closes the pipes, once
        self._finalizer = None
        self.process = self.requests = self.answers = None


def _kill(owner_pid: int, process: subprocess.Popen[bytes], *channels: Connection | None) -> None:
    # A forked copy of the owner drops its copy of the worker: the child is not its to kill.
    if os.getpid() == owner_pid:
        process.kill()
        process.wait()
    for channel in channels:
        if channel is not None:
            channel.close()


class SqlSandbox:
    """Runs one read query at a time on a SQLite database file, safely (module docstring).

    time_budget_s: wall-clock budget of one query (execution and fetching).
    max_rows: more rows than this is a failure ("row_cap").
    max_result_bytes: larger results (approximate) are a failure ("byte_cap").
    max_query_chars: longer query texts are refused before reaching SQLite.
    max_value_bytes: SQLITE_LIMIT_LENGTH, the largest string or blob a query may read or build.
    max_like_pattern_chars: SQLITE_LIMIT_LIKE_PATTERN_LENGTH.
    max_memory_bytes: address-space cap of the child process (isolation="process").
    isolation: "process" (a killable child per worker thread) or "thread" (in this process,
        faster to start, but a single long SQLite function call cannot be stopped).
    kill_grace_s: how long past the budget a child may take before it is killed.
    """

    def __init__(
        self,
        time_budget_s: float = 2.0,
        max_rows: int = 10_000,
        max_result_bytes: int = 10_000_000,
        max_query_chars: int = 20_000,
        max_value_bytes: int = 1_000_000,
        max_like_pattern_chars: int = 1_000,
        max_memory_bytes: int = 2 << 30,
        isolation: str = "process",
        kill_grace_s: float = 0.5,
    ) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
        if not kill_grace_s > 0:
            raise ValueError(f"kill_grace_s must be > 0, got {kill_grace_s!r}")
        self.limits = SandboxLimits(
            time_budget_s=time_budget_s,
            max_rows=max_rows,
            max_result_bytes=max_result_bytes,
            max_query_chars=max_query_chars,
            max_value_bytes=max_value_bytes,
            max_like_pattern_chars=max_like_pattern_chars,
            max_memory_bytes=max_memory_bytes,
        )
        self.isolation = isolation
        self.kill_grace_s = kill_grace_s
        self._local = threading.local()
        self._count_lock = threading.Lock()
        self.executions = 0  # queries handed to SQLite so far, all workers together

    def _worker(self) -> Any:
        """This thread's `_Child` or `_Connections`; a forked process starts with its own."""
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.pid = os.getpid()
            local.worker = (
                _Child(self.limits) if self.isolation == "process" else _Connections(self.limits)
            )
        return local.worker

    def _refusal(self, query: Any) -> QueryResult | None:
        """Texts refused before reaching SQLite."""
        if not isinstance(query, str):
            return QueryResult(
                False, error=f"the query must be text, got {type(query).__name__}", kind="error"
            )
        if len(query) > self.limits.max_query_chars:
            return QueryResult(
                False,
                error=f"the query is {len(query):,} characters long; the limit is {self.limits.max_query_chars:,}",
                kind="too_long",
            )
        if not query.strip():
            return QueryResult(False, error="the query is empty", kind="empty")
        if "\x00" in query:
            return QueryResult(False, error="the query contains a NUL character", kind="error")
        return None

    def run(self, db_path: str | os.PathLike[str], query: str) -> QueryResult:
        """Run `query` on `db_path`; every outcome is a `QueryResult`, nothing raises."""
        refusal = self._refusal(query)
        if refusal is not None:
            return refusal
        with self._count_lock:
            self.executions += 1
        worker = self._worker()
        if isinstance(worker, _Connections):
            return worker.run(str(db_path), query)
        try:
            answer = worker.call(
                (str(db_path), query), self.limits.time_budget_s + self.kill_grace_s
            )
        except OSError as error:
            return QueryResult(False, error=str(error), kind="unavailable")
        return timeout_result(self.limits.time_budget_s) if answer is None else answer

    def close(self) -> None:
        """Close this thread's connections (and stop its child process)."""
        worker = self._worker()
        if isinstance(worker, _Child):
            worker.stop()
        else:
            worker.close()


if __name__ == "__main__":
    _child_main(SandboxLimits(**json.loads(sys.argv[1])))
