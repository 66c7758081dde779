"""Text-to-SQL data: the bundled set, the Spider and BIRD loaders, the real Spider dev set."""

from __future__ import annotations

import json
import sqlite3
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest
from build_data import sql as build

from mrtpo.tasks.sql import TASK
from mrtpo.tasks.sql.data import BUNDLED_DIR, SYSTEM_PROMPT, load_bird, load_path, load_spider
from mrtpo.tasks.sql.sandbox import SqlSandbox
from mrtpo.tasks.sql.verifiers import QueryRunner

SKILLS = {
    "filter",
    "comparison",
    "between",
    "join",
    "aggregate",
    "group_by",
    "having",
    "order_limit",
    "nested",
    "set_operation",
}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# -- bundled data --------------------------------------------------------------------------


def test_bundled_pairs_cover_the_skills_with_a_fixed_split():
    train, test = read_jsonl(BUNDLED_DIR / "train.jsonl"), read_jsonl(BUNDLED_DIR / "test.jsonl")
    assert len(train) + len(test) >= 300
    assert 0.15 < len(test) / (len(train) + len(test)) < 0.25
    assert (
        set(Counter(p["skill"] for p in train)) == SKILLS == set(Counter(p["skill"] for p in test))
    )
    assert not {p["question"] for p in train} & {p["question"] for p in test}
    assert len({p["id"] for p in train + test}) == len(train) + len(test)
    queries = " ".join(p["query"] for p in train + test)
    for needle in (" > ", " >= ", " < ", " <= ", " BETWEEN ", " JOIN ", " GROUP BY ", " HAVING ", " ORDER BY ", " LIMIT ", "AVG(", "SUM(", "MAX(", "MIN(", "COUNT(", " NOT IN (SELECT", " UNION ", " INTERSECT ", " EXCEPT "):  # fmt: skip
        assert needle in queries, needle


def test_every_bundled_reference_runs_and_returns_rows():
    sandbox = SqlSandbox(isolation="thread")
    db = BUNDLED_DIR / "shop.sqlite"
    for split in ("train", "test"):
        for pair in read_jsonl(BUNDLED_DIR / f"{split}.jsonl"):
            result = sandbox.run(db, pair["query"])
            assert result.ok, (pair["query"], result.error)
            assert build.has_answer(list(result.rows)), pair["query"]


def test_bundled_database_shape():
    conn = sqlite3.connect(f"file:{BUNDLED_DIR / 'shop.sqlite'}?mode=ro", uri=True)
    try:
        counts = {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in build.TABLES}
        foreign = sum(
            len(conn.execute(f"PRAGMA foreign_key_list({t})").fetchall()) for t in build.TABLES
        )
    finally:
        conn.close()
    assert 3_000 <= sum(counts.values()) <= 10_000 and min(counts.values()) >= 20
    assert foreign >= 6
    assert (BUNDLED_DIR / "shop.sqlite").stat().st_size < 2_000_000


def test_the_build_is_deterministic_and_matches_the_committed_files(tmp_path):
    paths = build.build(tmp_path)
    assert build.table_digest(paths["db"]) == build.table_digest(BUNDLED_DIR / "shop.sqlite")
    for split in ("train", "test"):
        assert paths[split].read_bytes() == (BUNDLED_DIR / f"{split}.jsonl").read_bytes()
    other = build.build(tmp_path / "seed1", seed=1)
    assert build.table_digest(other["db"]) != build.table_digest(paths["db"])


def test_bundled_dataset_columns_and_prompt():
    dataset = TASK.load("test")
    assert len(dataset) == len(read_jsonl(BUNDLED_DIR / "test.jsonl"))
    assert {"prompt", "db_path", "reference_sql", "db_id", "question", "skill", "id"} <= set(
        dataset.column_names
    )
    row = dataset[0]
    system, user = row["prompt"]
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert user["role"] == "user" and row["question"] in user["content"]
    assert "CREATE TABLE order_items (" in user["content"]
    assert len(user["content"]) < 1_500  # a few hundred tokens for a 2048-token model
    assert Path(row["db_path"]) == BUNDLED_DIR / "shop.sqlite"
    with pytest.raises(ValueError, match="split"):
        TASK.load("validation")


def test_reference_completions_score_one_everywhere():
    dataset = TASK.load("test")
    verifiers = TASK.verifiers(runner=QueryRunner(SqlSandbox(isolation="thread")))
    completions = [TASK.reference_completion(row) for row in dataset]
    columns = {"db_path": dataset["db_path"], "reference_sql": dataset["reference_sql"]}
    for verifier in verifiers:
        assert verifier(dataset["prompt"], completions, **columns) == [1.0] * len(dataset), (
            verifier.name
        )


# -- loaders on small folders -------------------------------------------------------------


def make_db(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE pet (id INTEGER PRIMARY KEY, name TEXT, age INTEGER);"
        "INSERT INTO pet VALUES (1, 'Rex', 3), (2, 'Tom', 5), (3, 'Kit', 1);"
    )
    conn.commit()
    conn.close()


@pytest.fixture()
def spider_root(tmp_path: Path) -> Path:
    root = tmp_path / "spider"
    make_db(root / "database" / "zoo" / "zoo.sqlite")
    (root / "tables.json").write_text(json.dumps([{"db_id": "zoo"}, {"db_id": "farm"}]))
    examples = [
        {"db_id": "zoo", "question": "How many pets?", "query": "SELECT count(*) FROM pet", "sql": {"select": [False, [[3, [0, [0, 0, False], None]]]]}, "query_toks": ["SELECT", "count"]},
        {"db_id": "zoo", "question": "Names of pets older than 2?", "query": "SELECT name FROM pet WHERE age > 2", "sql": {"where": []}, "query_toks": ["SELECT"]},
        {"db_id": "farm", "question": "Cows?", "query": "SELECT 1", "sql": {}, "query_toks": []},
    ]  # fmt: skip
    (root / "dev.json").write_text(json.dumps(examples))
    (root / "train_spider.json").write_text(json.dumps(examples[:2]))
    return root


def test_load_spider(spider_root):
    with pytest.raises(ValueError, match=r"farm/farm\.sqlite \(1 examples\)"):
        load_spider(spider_root)
    with pytest.warns(UserWarning, match="skipped 1 examples"):
        dataset = load_spider(spider_root, skip_missing=True)
    assert len(dataset) == 2
    row = dataset[1]
    assert row["reference_sql"] == row["query"] == "SELECT name FROM pet WHERE age > 2"
    assert (
        row["db_id"] == "zoo"
        and Path(row["db_path"]) == spider_root / "database" / "zoo" / "zoo.sqlite"
    )
    assert (
        "CREATE TABLE pet (id INTEGER PRIMARY KEY, name TEXT, age INTEGER);"
        in row["prompt"][1]["content"]
    )
    assert "Question: Names of pets older than 2?" in row["prompt"][1]["content"]
    assert json.loads(dataset[0]["sql"]) == {"select": [False, [[3, [0, [0, 0, False], None]]]]}
    assert row["query_toks"] == ["SELECT"]
    assert len(load_spider(spider_root, split="train")) == 2
    with pytest.warns(UserWarning, match="skipped 1 examples"):
        assert len(TASK.load("dev", path=str(spider_root), skip_missing=True)) == 2


def test_spider_errors_name_the_path(spider_root):
    with pytest.raises(ValueError, match="split"):
        load_spider(spider_root, split="validation")
    (spider_root / "train_spider.json").unlink()
    with pytest.raises(ValueError, match=r"missing file: .*train_spider\.json"):
        load_spider(spider_root, split="train")
    (spider_root / "tables.json").write_text(json.dumps([{"db_id": "zoo"}]))
    with pytest.raises(ValueError, match=r"not described in .*tables\.json: farm"):
        load_spider(spider_root)
    (spider_root / "tables.json").unlink()
    with pytest.raises(ValueError, match=r"missing file: .*tables\.json"):
        load_spider(spider_root)


@pytest.mark.parametrize("nested", [True, False])
def test_load_bird(tmp_path, nested):
    root = tmp_path / "bird"
    folder = root / "dev" if nested else root
    make_db(folder / "dev_databases" / "zoo" / "zoo.sqlite")
    examples = [
        {"question_id": 0, "db_id": "zoo", "question": "Oldest pet?", "evidence": "oldest refers to MAX(age)", "SQL": "SELECT name FROM pet ORDER BY age DESC LIMIT 1", "difficulty": "simple"},
        {"question_id": 1, "db_id": "zoo", "question": "Young pets?", "evidence": "", "SQL": "SELECT name FROM pet WHERE age < 2", "difficulty": "moderate"},
    ]  # fmt: skip
    (folder / "dev.json").write_text(json.dumps(examples))
    dataset = load_bird(root)
    assert len(dataset) == 2
    first = dataset[0]
    assert (
        first["reference_sql"] == first["SQL"]
        and first["difficulty"] == "simple"
        and first["question_id"] == 0
    )
    assert (
        "Evidence: oldest refers to MAX(age)\nQuestion: Oldest pet?"
        in first["prompt"][1]["content"]
    )
    assert "Evidence" not in dataset[1]["prompt"][1]["content"]
    assert len(load_path(root, "dev")) == 2 and len(TASK.load("test", path=str(root))) == 2
    examples.append({**examples[1], "db_id": "ghost"})
    (folder / "dev.json").write_text(json.dumps(examples))
    with pytest.raises(ValueError, match=r"dev_databases/ghost/ghost\.sqlite"):
        load_bird(root)


def test_load_path_needs_a_known_layout(tmp_path):
    with pytest.raises(ValueError, match="neither Spider"):
        load_path(tmp_path)
    with pytest.raises(ValueError, match="not a folder"):
        load_path(tmp_path / "absent")


# -- the real Spider dev set -------------------------------------------------------------


def test_spider_dev_gold_queries_score_one(shared_benchmarks):
    root = shared_benchmarks / "spider"
    missing = root / "database" / "wta_1" / "wta_1.sqlite"
    with pytest.raises(ValueError) as error:
        load_spider(root)
    assert f"{missing} (62 examples)" in str(error.value) and "skip_missing=True" in str(
        error.value
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = load_spider(root, skip_missing=True)
    assert len(dataset) == 1034 - 62
    assert any(
        "skipped 62 examples" in str(w.message) and str(missing) in str(w.message) for w in caught
    )
    assert len(set(dataset["db_id"])) == 19

    start = time.monotonic()
    runner = QueryRunner(SqlSandbox())  # the default sandbox: process isolation
    verifiers = TASK.verifiers(runner=runner)
    completions = [TASK.reference_completion(row) for row in dataset]
    columns = {"db_path": dataset["db_path"], "reference_sql": dataset["reference_sql"]}
    for verifier in verifiers:
        scores = verifier(dataset["prompt"], completions, **columns)
        failed = [dataset[i]["reference_sql"] for i, s in enumerate(scores) if s != 1.0]
        assert not failed, (verifier.name, failed[:5])
    distinct = {
        (row["db_path"], row["reference_sql"].strip().rstrip(";").strip()) for row in dataset
    }
    assert runner.executions == len(distinct)  # each gold query ran once for both verifiers
    assert time.monotonic() - start < 30
    runner.sandbox.close()
