"""The three SQL verifiers on hand-written responses against the bundled database."""

from __future__ import annotations

import sqlite3

import pytest

import mrtpo.tasks
from mrtpo.tasks.sql import TASK, SqlTask
from mrtpo.tasks.sql.data import BUNDLED_DIR, SYSTEM_PROMPT
from mrtpo.tasks.sql.response_format import ResponseFormat, has_top_level_order_by, parse_response
from mrtpo.tasks.sql.sandbox import QueryResult, SqlSandbox
from mrtpo.tasks.sql.verifiers import (
    QueryRunner,
    SqlExecutable,
    SqlExecution,
    SqlFormat,
    compare_results,
    shared_runner,
)
from mrtpo.verifiers import Verdict

DB = str(BUNDLED_DIR / "shop.sqlite")


@pytest.fixture()
def runner() -> QueryRunner:
    return QueryRunner(SqlSandbox(isolation="thread"))


def scores(
    reference: str, completion: str, runner: QueryRunner
) -> tuple[list[float | None], list[Verdict]]:
    example = {"db_path": DB, "reference_sql": reference}
    verifiers = [SqlFormat(), SqlExecutable(runner=runner), SqlExecution(runner=runner)]
    verdicts = [v.verify(completion, example) for v in verifiers]
    return [v.score for v in verdicts], verdicts


def answer(query: str) -> str:
    return f"<think>The question asks for rows of the shop database.</think>\n<answer>\n{query}\n</answer>"


def one_value(sql: str):
    conn = sqlite3.connect(f"file:{DB}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchone()[0]
    finally:
        conn.close()


def test_correct_queries_score_one_on_all_three(runner):
    cases = [
        "SELECT name FROM customers WHERE city = 'Paris'",
        "SELECT category, COUNT(*) FROM products WHERE price > 100 GROUP BY category",
        "SELECT name FROM products WHERE category = 'toys' ORDER BY price DESC LIMIT 3",
        "SELECT country FROM customers EXCEPT SELECT country FROM suppliers",
    ]
    for query in cases:
        assert scores(query, answer(query), runner)[0] == [1.0, 1.0, 1.0], query
        assert scores(query, f"<answer>```sql\n{query};\n```</answer>", runner)[0] == [
            1.0,
            1.0,
            1.0,
        ]


def test_greater_or_equal_for_greater_scores_1_1_0(runner):
    price = one_value("SELECT price FROM products ORDER BY product_id LIMIT 1")
    assert (
        one_value(f"SELECT COUNT(*) FROM products WHERE price = {price}") == 1
    )  # the boundary row exists
    reference = f"SELECT name FROM products WHERE price > {price}"
    got, verdicts = scores(
        reference, answer(f"SELECT name FROM products WHERE price >= {price}"), runner
    )
    assert got == [1.0, 1.0, 0.0]
    expected_rows = one_value(f"SELECT COUNT(*) FROM products WHERE price > {price}")
    assert f"{expected_rows} rows expected, got {expected_rows + 1}" in verdicts[2].info
    assert f"Reference query: {reference}" in verdicts[2].info


def test_wrong_table_scores_1_0_0_with_the_database_error(runner):
    completion = answer("SELECT name FROM customer WHERE city = 'Paris'")
    got, verdicts = scores("SELECT name FROM customers WHERE city = 'Paris'", completion, runner)
    assert got == [1.0, 0.0, 0.0]
    assert "no such table: customer" in verdicts[1].info
    assert "CREATE TABLE customers (" in verdicts[1].info  # the schema is the information
    start = completion.index("SELECT")
    assert verdicts[1].spans == (
        (start, start + len("SELECT name FROM customer WHERE city = 'Paris'")),
    )
    assert verdicts[2].spans == verdicts[1].spans


def test_executable_info_refers_to_a_schema_the_prompt_already_shows(runner):
    """The bundled prompts hold the schema: the information says so instead of repeating it;
    a prompt without the schema (or schema_in_info="always") gets the CREATE statements."""
    from mrtpo.tasks import get

    example = get("sql").load("test")[0]
    completion = answer("SELECT name FROM customer")
    shown = SqlExecutable(runner=runner).verify(completion, example)
    assert shown.score == 0.0
    assert shown.info == (
        "Database schema: the one in the prompt.\nDatabase error: no such table: customer"
    )
    repeated = SqlExecutable(runner=runner, schema_in_info="always").verify(completion, example)
    assert repeated.info.startswith("Database schema:\nCREATE TABLE")
    assert repeated.info.endswith("no such table: customer") and repeated.score == 0.0
    bare = {**example, "prompt": [{"role": "user", "content": "Question: the customers?"}]}
    assert SqlExecutable(runner=runner).verify(completion, bare).info == repeated.info
    with pytest.raises(ValueError, match="schema_in_info"):
        SqlExecutable(schema_in_info="never")


def test_query_outside_the_tags_scores_format_zero(runner):
    query = "SELECT name FROM customers WHERE city = 'Paris'"
    for completion in [
        query,
        f"Here it is: <answer>{query}</answer>",
        f"<answer>{query}</answer> I hope this helps",
        f"<answer>{query}</answer><answer>{query}</answer>",
        f"<answer>{query}",
        f"<think>unfinished <answer>{query}</answer>",
        f"<answer>{query}; SELECT 1</answer>",
        "<answer>DELETE FROM customers</answer>",
        "<answer>SELEC name FROM customers</answer>",
        "<answer></answer>",
        f"<answer>{query}</answer><think>late</think>",
    ]:
        got, verdicts = scores(query, completion, runner)
        assert got[0] == 0.0, completion
        assert verdicts[0].info.startswith("Format rule:") and "Verdict:" in verdicts[0].info
    # Without an answer block nothing is run: the other two are 0 as well.
    assert scores(query, query, runner)[0] == [0.0, 0.0, 0.0]
    # Text after the block breaks the format only; the query itself is still judged.
    assert scores(query, f"<answer>{query}</answer> done", runner)[0] == [0.0, 1.0, 1.0]


def test_format_spans_cover_the_tags_and_the_answer_block():
    completion = "<think>why</think>\n<answer>SELECT 1</answer>"
    verdict = SqlFormat().verify(completion, {})
    assert verdict.score == 1.0
    think_end = completion.index("</think>") + len("</think>")
    answer_start = completion.index("<answer>")
    assert (0, len("<think>")) in verdict.spans
    assert (answer_start, len(completion)) in verdict.spans  # the whole answer block
    assert (completion.index("</think>"), think_end) in verdict.spans
    plain = SqlFormat().verify("SELECT 1", {})
    assert plain.score == 0.0 and plain.spans == ((0, 8),)


def test_equivalent_rewrites_score_execution_one(runner):
    reference = (
        "SELECT T1.name FROM products AS T1 JOIN suppliers AS T2 ON T1.supplier_id = T2.supplier_id "
        "WHERE T2.country = 'Italy'"
    )
    rewrites = [
        # other aliases and the join the other way round
        "SELECT p.name FROM suppliers s JOIN products p ON p.supplier_id = s.supplier_id WHERE s.country = 'Italy'",
        # rows in another order: the reference has no ORDER BY
        "SELECT products.name FROM products, suppliers WHERE products.supplier_id = suppliers.supplier_id "
        "AND suppliers.country = 'Italy' ORDER BY products.name DESC",
        # a nested query instead of the join
        "SELECT name AS product FROM products WHERE supplier_id IN (SELECT supplier_id FROM suppliers WHERE country = 'Italy')",
    ]
    for query in rewrites:
        assert scores(reference, answer(query), runner)[0] == [1.0, 1.0, 1.0], query
    # numbers within the tolerance: AVG against SUM / COUNT
    avg = "SELECT AVG(price) FROM products WHERE category = 'books'"
    same = "SELECT SUM(price) / COUNT(*) FROM products WHERE category = 'books'"
    assert scores(avg, answer(same), runner)[0] == [1.0, 1.0, 1.0]
    rounded = "SELECT ROUND(AVG(price), 1) FROM products WHERE category = 'books'"
    assert scores(avg, answer(rounded), runner)[0] == [1.0, 1.0, 0.0]


def test_order_columns_and_duplicates_matter(runner):
    ordered = "SELECT name FROM products WHERE category = 'toys' ORDER BY price DESC"
    reversed_order = "SELECT name FROM products WHERE category = 'toys' ORDER BY price ASC"
    got, verdicts = scores(ordered, answer(reversed_order), runner)
    assert got == [1.0, 1.0, 0.0] and "row 1 differs" in verdicts[2].info
    swapped = "SELECT COUNT(*), category FROM products GROUP BY category"
    assert scores(
        "SELECT category, COUNT(*) FROM products GROUP BY category", answer(swapped), runner
    )[0] == [1.0, 1.0, 0.0]
    assert one_value("SELECT COUNT(*) - COUNT(DISTINCT city) FROM customers") > 0
    distinct = "SELECT DISTINCT city FROM customers"
    assert scores("SELECT city FROM customers", answer(distinct), runner)[0] == [1.0, 1.0, 0.0]


def test_compare_results_tolerance_and_types():
    def result(*rows):
        return QueryResult(True, columns=("a", "b"), rows=tuple(rows))

    assert compare_results(result((1, 2.0)), result((1.0, 2)), ordered=True)[0]
    assert compare_results(result((1, 0.30000001)), result((1, 0.3)), ordered=False)[0]
    assert not compare_results(result((1, 0.31)), result((1, 0.3)), ordered=False)[0]
    assert not compare_results(result((1, "2")), result((1, 2)), ordered=False)[0]
    assert compare_results(
        result((None, 1.5), ("x", 2.0)), result(("x", 2.0000000001), (None, 1.5)), ordered=False
    )[0]
    assert not compare_results(
        result((1, 1), (1, 1), (2, 2)), result((1, 1), (2, 2), (2, 2)), ordered=False
    )[0]
    assert compare_results(
        QueryResult(True, ("a",), ()), QueryResult(True, ("b",), ()), ordered=False
    )[0]


def test_top_level_order_by_detection():
    assert has_top_level_order_by("SELECT a FROM t ORDER BY a")
    assert has_top_level_order_by("SELECT a FROM t UNION SELECT a FROM u ORDER BY 1")
    assert not has_top_level_order_by("SELECT a FROM (SELECT a FROM t ORDER BY a LIMIT 3)")
    assert not has_top_level_order_by(
        "SELECT a FROM t WHERE b IN (SELECT b FROM u ORDER BY b LIMIT 1)"
    )


def test_parse_response_locates_the_query():
    text = "<think>x</think> <answer>\n```sql\n  SELECT 1;\n```\n</answer>\n"
    parsed = parse_response(text)
    assert parsed.problems == ()
    assert parsed.query == "SELECT 1;"
    assert text[parsed.query_span[0] : parsed.query_span[1]] == "SELECT 1;"
    stray = parse_response("<think>I will use <answer> later</think><answer>SELECT 3</answer>")
    assert stray.query == "SELECT 3"  # a stray opening tag does not swallow the real block
    assert stray.problems == ("an unmatched <answer> or </answer> tag",)
    custom = ResponseFormat(think_tag="reasoning", answer_tag="sql")
    assert parse_response("<reasoning>r</reasoning><sql>SELECT 2</sql>", custom).query == "SELECT 2"
    assert SqlFormat(custom).verify("<sql>SELECT 2</sql>", {}).score == 1.0
    assert SqlFormat(custom).verify("<answer>SELECT 2</answer>", {}).score == 0.0
    with pytest.raises(ValueError, match="answer_tag"):
        ResponseFormat(answer_tag="a b")


def test_each_query_runs_once_per_batch(runner):
    """TRL calls the three reward functions one after the other on the same batch: the two
    execution verifiers share the runner's cache, so each distinct query runs once."""
    references = [
        "SELECT name FROM customers WHERE city = 'Paris'",
        "SELECT COUNT(*) FROM orders WHERE status = 'pending'",
    ]
    queries = [
        "SELECT name FROM customers WHERE city = 'Paris'",
        "SELECT name FROM customers WHERE city = 'Paris';",  # same query once normalized
        "  SELECT name FROM customers WHERE city = 'Paris'  ",
        "SELECT name FROM customers WHERE city = 'Lyon'",
        "SELECT COUNT(*) FROM orders WHERE status = 'pending'",  # equals the 2nd reference
        "SELECT COUNT(*) FROM order WHERE status = 'pending'",  # an error is cached too
        "SELECT COUNT(*) FROM orders WHERE status = 'pending'",
    ]
    completions = [[{"role": "assistant", "content": answer(q)}] for q in queries]
    completions.append([{"role": "assistant", "content": "no tags, nothing to run"}])
    refs = [references[0]] * 4 + [references[1]] * 4
    prompts = [[{"role": "user", "content": "q"}]] * len(completions)
    columns = {"db_path": [DB] * len(completions), "reference_sql": refs}
    verifiers = TASK.verifiers(runner=runner)
    rewards = [verifier(prompts, completions, **columns) for verifier in verifiers]
    assert rewards[2] == [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    distinct = {q.strip().rstrip(";") for q in queries} | set(references)
    assert len(distinct) == 4
    assert runner.executions == len(distinct)
    again = [verifier(prompts, completions, **columns) for verifier in verifiers]
    assert again == rewards and runner.executions == len(distinct)  # all cached now


def test_the_cache_is_bounded():
    runner = QueryRunner(SqlSandbox(isolation="thread"), max_cached_results=3)
    for i in range(10):
        runner.run(DB, f"SELECT {i}")
    assert len(runner._results) == 3
    runner.run(DB, "SELECT 9")
    assert runner.executions == 10  # still cached
    runner.run(DB, "SELECT 0")
    assert runner.executions == 11  # evicted, run again


def test_unrunnable_reference_or_database_gives_no_score(runner, tmp_path):
    got, verdicts = scores("SELECT nope FROM customers", answer("SELECT 1"), runner)
    assert got == [1.0, 1.0, None] and "reference query fails" in verdicts[2].info
    example = {"db_path": str(tmp_path / "absent.sqlite"), "reference_sql": "SELECT 1"}
    verdict = SqlExecutable(runner=runner).verify(answer("SELECT 1"), example)
    assert verdict.score is None and "absent.sqlite" in verdict.info
    with pytest.raises(ValueError, match="db_path"):
        SqlExecutable(runner=runner).verify(answer("SELECT 1"), {"reference_sql": "SELECT 1"})


def test_task_contract():
    task = mrtpo.tasks.get("sql")
    assert task is TASK and isinstance(task, SqlTask)
    assert task.name == "sql" and task.headline_name == "result match rate"
    assert task.system_prompt == SYSTEM_PROMPT and "<answer>" in task.system_prompt
    verifiers = task.verifiers()
    assert [v.name for v in verifiers] == ["sql_format", "sql_executable", "sql_execution"]
    assert [type(v) for v in verifiers] == [SqlFormat, SqlExecutable, SqlExecution]
    assert verifiers[1].runner is verifiers[2].runner is shared_runner()
    custom = task.verifiers(time_budget_s=0.5)
    assert (
        custom[1].runner is custom[2].runner
        and custom[1].runner.sandbox.limits.time_budget_s == 0.5
    )
    example = {"reference_sql": "SELECT 1"}
    assert task.reference_completion(example) == "<answer>\nSELECT 1\n</answer>"
    assert SqlFormat().verify(task.reference_completion(example), example).score == 1.0


def test_headline_is_the_mean_execution_score():
    def row(fmt, exe, run):
        return [Verdict(fmt, ""), Verdict(exe, ""), Verdict(run, "")]

    verdicts = [row(1.0, 1.0, 1.0), row(1.0, 1.0, 0.0), row(0.0, 1.0, 1.0), row(1.0, 0.0, None)]
    headline = TASK.headline(verdicts)
    assert headline["result match rate"] == pytest.approx(2 / 3)
    assert headline["format rate"] == pytest.approx(3 / 4)
    assert headline["executable rate"] == pytest.approx(3 / 4)
