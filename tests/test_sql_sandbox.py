"""The SQLite sandbox: hostile queries never change the database and end inside the budget."""

from __future__ import annotations

import gc
import hashlib
import os
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrtpo.tasks.sql.data import BUNDLED_DIR
from mrtpo.tasks.sql.sandbox import SandboxLimits, SqlSandbox, _authorize, _Connections
from mrtpo.tasks.sql.verifiers import QueryRunner, SqlExecutable, SqlExecution, SqlFormat

BUDGET_S = 0.4
GRACE_S = 0.4
SLACK_S = 1.5  # scheduling noise on a loaded 2-core machine

CROSS_JOIN_ALL = "SELECT COUNT(*) FROM suppliers, products, customers, orders, order_items, reviews"
HOSTILE = {
    "drop": "DROP TABLE customers",
    "delete": "DELETE FROM orders",
    "update": "UPDATE products SET price = 0",
    "insert": "INSERT INTO suppliers VALUES (99, 'x', 'y')",
    "attach": "ATTACH DATABASE '/tmp/x' AS x",
    "writable_schema": "PRAGMA writable_schema = 1",
    "query_only_off": "PRAGMA query_only = 0",
    "load_extension": "SELECT load_extension('/tmp/evil.so')",
    "endless_cte": "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r",
    "randomblob": "SELECT length(randomblob(2000000000))",
    "cross_join": CROSS_JOIN_ALL,
    "many_statements": "; ".join(["SELECT 1", "DROP TABLE orders"] * 200),
    "printf_loop": "SELECT printf('%.*c', 2000000000, 'x')",  # one endless VM instruction
    "vacuum": "VACUUM",
    "begin": "BEGIN IMMEDIATE",
    "create_temp": "CREATE TEMP TABLE t AS SELECT * FROM customers",
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def shop_copy(tmp_path: Path) -> Path:
    """A private copy of the bundled database (a failure could never damage the real one)."""
    path = tmp_path / "shop.sqlite"
    shutil.copy(BUNDLED_DIR / "shop.sqlite", path)
    return path


@pytest.fixture(scope="module")
def process_sandbox():
    sandbox = SqlSandbox(time_budget_s=BUDGET_S, kill_grace_s=GRACE_S)
    yield sandbox
    sandbox.close()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_queries_fail_fast_and_leave_the_file_unchanged(name, shop_copy, process_sandbox):
    before, mtime = sha256(shop_copy), shop_copy.stat().st_mtime_ns
    runner = QueryRunner(process_sandbox)
    executable, execution = SqlExecutable(runner=runner), SqlExecution(runner=runner)
    example = {"db_path": str(shop_copy), "reference_sql": "SELECT COUNT(*) FROM customers"}
    completion = f"<answer>{HOSTILE[name]}</answer>"
    start = time.monotonic()
    verdicts = [executable.verify(completion, example), execution.verify(completion, example)]
    elapsed = time.monotonic() - start
    assert [v.score for v in verdicts] == [0.0, 0.0]
    assert elapsed < BUDGET_S + GRACE_S + SLACK_S, f"{name} took {elapsed:.2f} s"
    assert sha256(shop_copy) == before and shop_copy.stat().st_mtime_ns == mtime
    assert not list(shop_copy.parent.glob("*-journal")) and not list(shop_copy.parent.glob("*-wal"))
    # The sandbox still answers afterwards (a killed child is replaced).
    assert process_sandbox.run(shop_copy, "SELECT COUNT(*) FROM suppliers").rows == ((24,),)


def test_each_hostile_query_fails_for_the_right_reason(shop_copy, process_sandbox):
    kinds = {name: process_sandbox.run(shop_copy, query) for name, query in HOSTILE.items()}
    for name in (
        "drop",
        "delete",
        "update",
        "insert",
        "attach",
        "writable_schema",
        "query_only_off",
        "vacuum",
        "begin",
        "create_temp",
    ):
        assert kinds[name].kind == "denied", (name, kinds[name])
    assert (
        "load_extension" in kinds["load_extension"].error
        and kinds["load_extension"].kind == "denied"
    )
    assert kinds["endless_cte"].kind == "timeout" and kinds["cross_join"].kind == "timeout"
    assert kinds["printf_loop"].kind == "timeout"
    assert kinds["randomblob"].error == "string or blob too big"
    assert kinds["many_statements"].kind == "multiple_statements"
    assert "only a single query" in kinds["many_statements"].error


def test_one_megabyte_of_text_is_refused_before_sqlite(shop_copy, process_sandbox):
    text = "SELECT 1 " + "x" * 1_000_000
    start = time.monotonic()
    result = process_sandbox.run(shop_copy, text)
    assert result.kind == "too_long" and "1,000,009" in result.error
    verdicts = [
        v.verify(
            f"<answer>{text}</answer>", {"db_path": str(shop_copy), "reference_sql": "SELECT 1"}
        )
        for v in (SqlFormat(), SqlExecutable(runner=QueryRunner(process_sandbox)))
    ]
    assert [v.score for v in verdicts] == [0.0, 0.0]
    assert "longer than 20,000" in verdicts[0].info
    assert time.monotonic() - start < 2.0


def test_every_lock_holds_alone(shop_copy):
    """Read-only URI without the authorizer and query_only still refuses writes; the
    authorizer denies writes by itself."""
    connections = _Connections(SandboxLimits())
    conn, _ = connections.get(str(shop_copy))
    conn.set_authorizer(None)
    conn.execute("PRAGMA query_only = OFF")
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        conn.execute("DELETE FROM orders")
    connections.close()
    for action in (
        sqlite3.SQLITE_DELETE,
        sqlite3.SQLITE_INSERT,
        sqlite3.SQLITE_UPDATE,
        sqlite3.SQLITE_ATTACH,
        sqlite3.SQLITE_DROP_TABLE,
        sqlite3.SQLITE_TRANSACTION,
    ):
        assert _authorize(action, "orders", None, "main", None) == sqlite3.SQLITE_DENY
    assert (
        _authorize(sqlite3.SQLITE_PRAGMA, "writable_schema", "1", None, None) == sqlite3.SQLITE_DENY
    )
    assert (
        _authorize(sqlite3.SQLITE_PRAGMA, "table_info", "orders", None, None) == sqlite3.SQLITE_OK
    )
    assert (
        _authorize(sqlite3.SQLITE_FUNCTION, None, "load_extension", None, None)
        == sqlite3.SQLITE_DENY
    )
    assert _authorize(sqlite3.SQLITE_FUNCTION, None, "count", None, None) == sqlite3.SQLITE_OK
    assert _authorize(sqlite3.SQLITE_READ, "orders", "status", "main", None) == sqlite3.SQLITE_OK


def test_caps_and_malformed_text(shop_copy):
    sandbox = SqlSandbox(
        isolation="thread", max_rows=100, max_result_bytes=50_000, max_query_chars=500
    )
    rows = sandbox.run(shop_copy, "SELECT * FROM customers")
    assert rows.kind == "row_cap" and "100 rows" in rows.error
    assert sandbox.run(shop_copy, "SELECT * FROM customers LIMIT 100").ok
    big = sandbox.run(shop_copy, "SELECT hex(zeroblob(20000)) FROM customers LIMIT 3")
    assert big.kind == "byte_cap"
    assert sandbox.run(shop_copy, "x" * 501).kind == "too_long"
    assert sandbox.run(shop_copy, "   ").kind == "empty"
    assert sandbox.run(shop_copy, "SELECT 1\x00; DROP TABLE orders").kind == "error"
    assert sandbox.run(shop_copy, "SELECT '\ud800'").kind == "error"  # not encodable text
    assert sandbox.run(shop_copy, "SELEC name FROM customers").error == 'near "SELEC": syntax error'
    missing = sandbox.run(shop_copy.parent / "nope.sqlite", "SELECT 1")
    assert missing.kind == "unavailable" and "nope.sqlite" in missing.error
    assert not (shop_copy.parent / "nope.sqlite").exists()  # read-only mode never creates it


def test_results_and_the_time_budget_in_thread_mode(shop_copy):
    sandbox = SqlSandbox(isolation="thread", time_budget_s=0.3)
    result = sandbox.run(
        shop_copy, "SELECT name, price FROM products WHERE product_id <= 2 ORDER BY product_id"
    )
    assert result.ok and result.columns == ("name", "price") and len(result.rows) == 2
    assert isinstance(result.rows[0][1], float)
    start = time.monotonic()
    assert sandbox.run(shop_copy, CROSS_JOIN_ALL).kind == "timeout"
    assert time.monotonic() - start < 0.3 + SLACK_S
    assert sandbox.run(shop_copy, "SELECT COUNT(*) FROM reviews").rows == ((700,),)  # still usable


def test_one_connection_per_database_per_worker(shop_copy, tmp_path):
    other = tmp_path / "other.sqlite"
    shutil.copy(shop_copy, other)
    sandbox = SqlSandbox(isolation="thread")
    for _ in range(3):
        sandbox.run(shop_copy, "SELECT 1")
        sandbox.run(other, "SELECT 1")
    mine = sandbox._worker()
    assert sorted(mine.open) == sorted([str(shop_copy), str(other)])
    first = mine.open[str(shop_copy)][0]
    sandbox.run(shop_copy, "SELECT 2")
    assert mine.open[str(shop_copy)][0] is first  # reused
    seen = []
    thread = threading.Thread(
        target=lambda: (sandbox.run(shop_copy, "SELECT 1"), seen.append(sandbox._worker()))
    )
    thread.start()
    thread.join()
    assert seen[0] is not mine and list(seen[0].open) == [str(shop_copy)]
    assert sandbox.executions == 8


def test_process_mode_reuses_its_child_until_a_kill(shop_copy):
    sandbox = SqlSandbox(time_budget_s=0.3, kill_grace_s=0.3)
    try:
        sandbox.run(shop_copy, "SELECT 1")
        pid = sandbox._worker().process.pid
        sandbox.run(shop_copy, "SELECT 2")
        assert sandbox._worker().process.pid == pid
        assert sandbox.run(shop_copy, HOSTILE["printf_loop"]).kind == "timeout"
        assert sandbox._worker().process is None  # killed
        assert sandbox.run(shop_copy, "SELECT 3").rows == ((3,),)
        assert sandbox._worker().process.pid != pid
    finally:
        sandbox.close()


def test_a_forked_process_gets_its_own_child(shop_copy):
    sandbox = SqlSandbox()
    try:
        assert sandbox.run(shop_copy, "SELECT 1").rows == ((1,),)
        process = sandbox._worker().process
        pid = os.fork()
        if pid == 0:  # the fork must neither reuse nor kill the parent's child
            ok = sandbox.run(shop_copy, "SELECT 2").rows == ((2,),)
            ok = ok and sandbox._worker().process.pid != process.pid
            sandbox._local.worker = None
            gc.collect()
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert status == 0
        assert process.poll() is None and sandbox._worker().process is process
        assert sandbox.run(shop_copy, "SELECT 3").rows == ((3,),)
    finally:
        sandbox.close()


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError, match="isolation"):
        SqlSandbox(isolation="docker")
    with pytest.raises(ValueError, match="time_budget_s"):
        SqlSandbox(time_budget_s=0)
    with pytest.raises(ValueError, match="max_rows"):
        SqlSandbox(max_rows=0)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(max_size=300), wrap=st.booleans())
def test_random_unicode_never_raises_nor_writes(text, wrap, shop_copy):
    before = sha256(shop_copy)
    runner = QueryRunner(SqlSandbox(isolation="thread", time_budget_s=0.5))
    example = {"db_path": str(shop_copy), "reference_sql": "SELECT COUNT(*) FROM customers"}
    completion = f"<answer>{text}</answer>" if wrap else text
    for verifier in (SqlFormat(), SqlExecutable(runner=runner), SqlExecution(runner=runner)):
        verdict = verifier.verify(completion, example)
        assert verdict.score in (0.0, 1.0)
        assert isinstance(verdict.info, str) and verdict.info
        assert all(0 <= a <= b <= len(completion) for a, b in verdict.spans)
    assert sha256(shop_copy) == before
