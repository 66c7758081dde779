"""Spider and BIRD execution accuracy on tiny SQLite databases made here: each official rule
(row multisets, order only under the gold's ORDER BY, column reordering, DISTINCT removed,
BIRD's sets, time-outs), per-database and overall numbers, skipped databases, and `mrtpo
score` on the official prediction files."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from mrtpo import cli
from mrtpo.tasks.sql import TASK
from mrtpo.tasks.sql.exec_accuracy import (
    ExecutionAccuracy,
    bird_results_equal,
    spider_query,
    spider_results_equal,
    without_distinct,
)
from mrtpo.tasks.sql.response_format import DEFAULT_FORMAT
from mrtpo.tasks.sql.sandbox import SqlSandbox
from mrtpo.tasks.sql.verifiers import QueryRunner

PETS = "CREATE TABLE pet (id INTEGER PRIMARY KEY, name TEXT, age INTEGER, kind TEXT);"


def make_db(path: Path, rows: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(PETS + f"INSERT INTO pet VALUES {rows};")
    conn.commit()
    conn.close()


ZOO_ROWS = "(1, 'Rex', 3, 'dog'), (2, 'Tom', 5, 'cat'), (3, 'Kit', 1, 'cat'), (4, 'Ada', 3, 'dog')"


@pytest.fixture()
def spider_root(tmp_path: Path) -> Path:
    root = tmp_path / "spider"
    make_db(root / "database" / "zoo" / "zoo.sqlite", ZOO_ROWS)
    make_db(root / "database" / "farm" / "farm.sqlite", "(1, 'Bo', 2, 'cow')")
    (root / "tables.json").write_text(json.dumps([{"db_id": d} for d in ("zoo", "farm", "sea")]))
    examples = [
        ("zoo", "SELECT name FROM pet ORDER BY age, name"),
        ("zoo", "SELECT kind FROM pet"),
        ("zoo", "SELECT DISTINCT kind FROM pet"),
        ("sea", "SELECT 1"),
        ("farm", "SELECT count(*) FROM pet"),
    ]
    (root / "dev.json").write_text(
        json.dumps([{"db_id": db, "question": "?", "query": query} for db, query in examples])
    )
    return root


@pytest.fixture()
def bird_root(tmp_path: Path) -> Path:
    root = tmp_path / "bird"
    make_db(root / "dev" / "dev_databases" / "zoo" / "zoo.sqlite", ZOO_ROWS)
    examples = [
        ("SELECT name FROM pet WHERE kind = 'cat' ORDER BY age", "simple"),
        ("SELECT kind FROM pet", "moderate"),
        ("SELECT nothing FROM pet", "challenging"),
    ]
    (root / "dev" / "dev.json").write_text(
        json.dumps(
            [
                {
                    "question_id": i,
                    "db_id": "zoo",
                    "question": "?",
                    "evidence": "",
                    "SQL": sql,
                    "difficulty": difficulty,
                }
                for i, (sql, difficulty) in enumerate(examples)
            ]
        )  # fmt: skip
    )
    return root


def verdict(row: dict, query: str, **options) -> float | None:
    return ExecutionAccuracy(**options).verify(DEFAULT_FORMAT.wrap(query), row).score


# -- result equality ---------------------------------------------------------------------


def test_spider_equality_reorders_columns_and_counts_duplicates():
    gold = [(1, "a"), (2, "b"), (2, "b")]
    assert spider_results_equal(gold, [("b", 2), ("a", 1), ("b", 2)], order_matters=False)
    assert not spider_results_equal(gold, [("a", 1), ("b", 2), ("a", 1)], order_matters=False)
    assert not spider_results_equal(gold, [(1, "a"), (2, "b")], order_matters=False)
    # Order: the rows as lists, columns still reorderable.
    assert spider_results_equal(gold, [("a", 1), ("b", 2), ("b", 2)], order_matters=True)
    assert not spider_results_equal(gold, [("b", 2), ("a", 1), ("b", 2)], order_matters=True)
    assert not spider_results_equal(gold, [(1, "a", 0)] * 3, order_matters=False)
    assert spider_results_equal([], [], order_matters=True)
    assert not spider_results_equal([(1,)], [], order_matters=False)
    assert spider_results_equal([(1, 2.0)], [(1.0, 2)], order_matters=False)  # 1 == 1.0
    # Same column multisets, but no column order makes the rows equal.
    assert not spider_results_equal([(1, 2), (2, 1)], [(1, 1), (2, 2)], order_matters=False)


def test_bird_equality_is_of_sets():
    assert bird_results_equal([(1, "a"), (2, "b")], [(2, "b"), (1, "a"), (1, "a")])
    assert not bird_results_equal([(1, "a")], [("a", 1)])  # columns in order
    assert bird_results_equal([], [])


def test_spider_query_preparation():
    assert without_distinct(
        "SELECT DISTINCT name, count(distinct kind) FROM t WHERE x = 'distinct'"
    ) == ("SELECT  name, count( kind) FROM t WHERE x = 'distinct'")
    assert without_distinct("SELECT 'unterminated") == "SELECT 'unterminated"
    assert spider_query("SELECT a FROM t WHERE b > = 1 AND c ! = YEAR(CURDATE()) ") == (
        "SELECT a FROM t WHERE b >= 1 AND c != 2020"
    )
    assert (
        spider_query("SELECT DISTINCT a FROM t", keep_distinct=True) == "SELECT DISTINCT a FROM t"
    )


# -- Spider --------------------------------------------------------------------------------


def test_spider_rules_on_a_folder(spider_root):
    benchmark = TASK.benchmark(str(spider_root), "test")
    assert benchmark.title == f"Spider dev: {spider_root}"
    assert benchmark.skipped == {"database sea missing": 1}
    rows = benchmark.dataset.to_list()
    assert [row["id"] for row in rows] == ["0", "1", "2", "4"]
    ordered, kinds, distinct, count = rows
    # The gold orders: the same rows in another order are wrong.
    assert verdict(ordered, "SELECT name FROM pet ORDER BY age, name") == 1.0
    assert verdict(ordered, "SELECT name FROM pet ORDER BY name") == 0.0
    # No ORDER BY in the gold: any order, but duplicates count.
    assert verdict(kinds, "SELECT kind FROM pet ORDER BY kind DESC") == 1.0
    assert verdict(kinds, "SELECT kind FROM pet GROUP BY kind") == 0.0
    # DISTINCT is removed from both queries, unless kept.
    assert verdict(distinct, "SELECT kind FROM pet") == 1.0
    assert verdict(distinct, "SELECT kind FROM pet", keep_distinct=True) == 0.0
    # Column order does not matter; a failing query or no answer is wrong.
    assert verdict(count, "SELECT count(*) FROM pet") == 1.0
    assert verdict(kinds, "SELECT kind, kind FROM pet") == 0.0
    assert verdict(count, "SELECT count(*) FROM nothing") == 0.0
    assert ExecutionAccuracy().verify("no tags", count).score == 0.0


def test_spider_queries_must_agree_on_every_database_of_the_folder(spider_root):
    """A test suite: every .sqlite file in the database's folder is checked."""
    benchmark = TASK.benchmark(str(spider_root), "dev")
    row = benchmark.dataset.to_list()[1]  # SELECT kind FROM pet
    query = "SELECT kind FROM pet WHERE id < 5"
    assert verdict(row, query) == 1.0
    make_db(
        spider_root / "database" / "zoo" / "zoo_suite1.sqlite", ZOO_ROWS + ", (5, 'Zed', 9, 'owl')"
    )
    result = ExecutionAccuracy().verify(DEFAULT_FORMAT.wrap(query), row)
    assert result.score == 0.0 and "zoo_suite1.sqlite" in result.info


def test_a_slow_query_runs_out_of_time(spider_root):
    row = TASK.benchmark(str(spider_root), "dev").dataset.to_list()[3]
    slow = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
    runner = QueryRunner(SqlSandbox(time_budget_s=0.3))
    result = ExecutionAccuracy(runner=runner).verify(DEFAULT_FORMAT.wrap(slow), row)
    assert result.score == 0.0 and "timeout" in result.info


def test_spider_summary_per_database(spider_root):
    benchmark = TASK.benchmark(str(spider_root), "dev", max_examples=3)
    assert benchmark.title.endswith("(first 3 examples)") and benchmark.skipped == {}
    rows = benchmark.dataset.to_list()
    verdicts = [[ExecutionAccuracy().verify(DEFAULT_FORMAT.wrap(q), row)] for row, q in zip(
        rows, ["SELECT name FROM pet ORDER BY age, name", "SELECT 1", "SELECT kind FROM pet"], strict=True
    )]  # fmt: skip
    table = benchmark.summarize(rows, verdicts)
    assert table["groups"] == [{"name": "zoo", "examples": 3, "correct": 2, "accuracy": 2 / 3}]
    assert table["summary"][0] == {
        "name": "overall", "examples": 3, "correct": 2, "accuracy": 2 / 3, "formula": "all examples"
    }  # fmt: skip
    with pytest.raises(ValueError, match="categories are BFCL's"):
        TASK.benchmark(str(spider_root), "dev", categories=["zoo"])


# -- BIRD ----------------------------------------------------------------------------------


def test_bird_rules_and_difficulty_rows(bird_root):
    benchmark = TASK.benchmark(str(bird_root), "dev")
    assert benchmark.title == f"BIRD dev: {bird_root}"
    rows = benchmark.dataset.to_list()
    # Sets: order and duplicates ignored, even under the gold's ORDER BY.
    assert verdict(rows[0], "SELECT name FROM pet WHERE kind = 'cat' ORDER BY age DESC") == 1.0
    assert verdict(rows[1], "SELECT DISTINCT kind FROM pet") == 1.0
    assert verdict(rows[1], "SELECT kind, id FROM pet") == 0.0
    failing = ExecutionAccuracy().verify(DEFAULT_FORMAT.wrap("SELECT 1"), rows[2])
    assert failing.score == 0.0 and failing.info.startswith("the gold query fails")
    table = benchmark.summarize(rows, [[ExecutionAccuracy().verify(DEFAULT_FORMAT.wrap(q), row)]
        for row, q in zip(rows, ["SELECT name FROM pet WHERE kind = 'cat'", "SELECT 1", "SELECT 1"], strict=True)])  # fmt: skip
    names = {row["name"]: row for row in table["summary"]}
    assert names["overall"]["accuracy"] == pytest.approx(1 / 3)
    assert names["simple"]["accuracy"] == 1.0 and names["moderate"]["accuracy"] == 0.0
    assert names["gold query fails"]["examples"] == 1


# -- mrtpo score -----------------------------------------------------------------------------


def run_cli(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_score_reads_spider_and_bird_prediction_files(spider_root, bird_root, tmp_path, capsys):
    predictions = tmp_path / "predict.txt"
    predictions.write_text(
        "SELECT name FROM pet ORDER BY age, name\nSELECT 1\nSELECT kind FROM pet\n"
        "SELECT 1\nSELECT count(*) FROM pet\n"
    )
    out = tmp_path / "spider-out"
    code, stdout, _ = run_cli(["score", "--task", "sql", "--data", str(spider_root),
        "--responses", str(predictions), "--output_dir", str(out)], capsys)  # fmt: skip
    assert code == 0
    report = json.loads((out / "eval.json").read_text())
    groups = {group["name"]: group for group in report["benchmark"]["groups"]}
    assert groups["zoo"]["correct"] == 2 and groups["farm"]["correct"] == 1
    assert report["benchmark"]["summary"][0]["accuracy"] == 0.75
    assert report["benchmark"]["skipped"] == {"database sea missing": 1}
    assert "skipped: database sea missing" in stdout and "Spider dev" in stdout
    example = report["examples"][0]
    assert example["id"] == "0" and example["verdicts"]["execution_accuracy"]["score"] == 1.0

    bird_predictions = tmp_path / "predict_dev.json"
    separator = "\t----- bird -----\t"
    bird_predictions.write_text(json.dumps({
        "0": f"SELECT name FROM pet WHERE kind = 'cat'{separator}zoo",
        "1": f"SELECT kind FROM pet{separator}zoo",
        "2": f"SELECT 1{separator}zoo",
    }))  # fmt: skip
    out = tmp_path / "bird-out"
    code, _, _ = run_cli(["score", "--task", "sql", "--data", str(bird_root),
        "--responses", str(bird_predictions), "--output_dir", str(out)], capsys)  # fmt: skip
    assert code == 0
    summary = json.loads((out / "eval.json").read_text())["benchmark"]["summary"]
    assert summary[0]["accuracy"] == pytest.approx(2 / 3)

    records = tmp_path / "answers.jsonl"
    records.write_text("\n".join(json.dumps({"id": str(i), "sql": "SELECT kind FROM pet"})
                                 for i in range(3)))  # fmt: skip
    code, _, _ = run_cli(["score", "--task", "sql", "--data", str(bird_root),
        "--responses", str(records), "--output_dir", str(out)], capsys)  # fmt: skip
    report = json.loads((out / "eval.json").read_text())
    assert code == 0 and report["benchmark"]["summary"][0]["correct"] == 1


def test_the_headline_is_the_training_reward_and_the_table_spiders_rule(
    spider_root, tmp_path, capsys
):
    """On a Spider folder `eval.json` holds two numbers that can differ: the task's headline
    (the sql_execution reward: DISTINCT kept, columns by position) and Spider's execution
    accuracy (DISTINCT removed from both queries, columns reordered)."""
    predictions = tmp_path / "predict.txt"
    predictions.write_text(  # right, right by both, Spider only (DISTINCT), wrong
        "SELECT name FROM pet ORDER BY age, name\nSELECT kind FROM pet\nSELECT kind FROM pet\n"
        "SELECT 1\nSELECT count(*) + 1 FROM pet\n"
    )
    out = tmp_path / "out"
    code, _, _ = run_cli(["score", "--task", "sql", "--data", str(spider_root),
        "--responses", str(predictions), "--output_dir", str(out)], capsys)  # fmt: skip
    report = json.loads((out / "eval.json").read_text())
    assert code == 0
    assert report["headline"]["result match rate"] == pytest.approx(2 / 4)
    assert report["benchmark"]["summary"][0]["accuracy"] == pytest.approx(3 / 4)
    distinct = report["examples"][2]["verdicts"]
    assert distinct["sql_execution"]["score"] == 0.0
    assert distinct["execution_accuracy"]["score"] == 1.0
