"""Benchmark: verifying a batch of 256 text-to-SQL completions with the three verifiers.

The batch is built from the bundled data: 64 questions x 4 completions (correct, wrong result,
not executable, broken format; some share their query). The three verifiers are called one
after the other on the whole batch, as TRL calls reward functions, with a fresh
`QueryRunner` (empty caches) per run; the sandbox's child process is started before the clock.
Reported: completions per second (median over the runs) for the default process isolation
and for thread isolation side by side, the queries the sandbox ran per batch against the
distinct (database, query) pairs of the batch (completions' queries and references), and a
second, warm pass over the same batch (everything cached).

    .venv/bin/python benchmarks/sql_verify.py [--runs 7]
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

from mrtpo.tasks.sql import TASK
from mrtpo.tasks.sql.response_format import parse_response
from mrtpo.tasks.sql.sandbox import SqlSandbox
from mrtpo.tasks.sql.verifiers import QueryRunner, normalize_query

QUESTIONS = 64
PER_QUESTION = 4


def wrong(query: str) -> str:
    """A plausible mistake that runs: a loosened comparison, a changed LIMIT or a filter dropped."""
    for old, new in ((" > ", " >= "), (" < ", " <= "), (" >= ", " > "), (" <= ", " < ")):
        if old in query:
            return query.replace(old, new, 1)
    if " LIMIT " in query:
        return re.sub(r" LIMIT (\d+)", lambda m: f" LIMIT {int(m.group(1)) + 1}", query)
    if " WHERE " in query:
        return re.sub(
            r" WHERE .*?( GROUP BY| ORDER BY| EXCEPT| UNION| INTERSECT|$)", r"\1", query, count=1
        )
    return query.replace("SELECT ", "SELECT DISTINCT ", 1)


def make_batch() -> tuple[list, list[str], dict[str, list[str]]]:
    """(prompts, completions, columns) for 256 completions."""
    rows = TASK.load("train").select(range(QUESTIONS))
    prompts, completions, db_paths, references = [], [], [], []
    for row in rows:
        query = row["reference_sql"]
        group = [
            f"<think>Find the rows the question asks for.</think>\n<answer>\n{query}\n</answer>",
            f"<answer>\n```sql\n{wrong(query)};\n```\n</answer>",
            f"<answer>{query.replace(' FROM ', ' FROM missing_', 1)}</answer>",
            f"Sure! The query is: <answer>{query}</answer> Hope it helps.",  # format 0, runs
        ]
        for completion in group:
            prompts.append(row["prompt"])
            completions.append(completion)
            db_paths.append(row["db_path"])
            references.append(query)
    return prompts, completions, {"db_path": db_paths, "reference_sql": references}


def distinct_queries(completions: list[str], columns: dict[str, list[str]]) -> int:
    pairs = set()
    for completion, db_path, reference in zip(
        completions, columns["db_path"], columns["reference_sql"], strict=True
    ):
        query = parse_response(completion).query
        if query is not None:
            pairs.add((db_path, normalize_query(query)))
        pairs.add((db_path, normalize_query(reference)))
    return len(pairs)


def one_run(setting: str, prompts, completions, columns) -> dict[str, float]:
    isolation, shared = setting.split(", ")
    runner = QueryRunner(SqlSandbox(isolation=isolation))
    runner.sandbox.run(columns["db_path"][0], "SELECT 1")  # start the worker (child process)
    verifiers = TASK.verifiers(runner=runner)
    if shared == "unshared":  # the two execution verifiers with separate caches, one sandbox
        verifiers[2] = TASK.verifiers(runner=QueryRunner(runner.sandbox))[2]
    executions_before = runner.executions
    start = time.perf_counter()
    rewards = [verifier(prompts, completions, **columns) for verifier in verifiers]
    cold = time.perf_counter() - start
    executions = runner.executions - executions_before
    start = time.perf_counter()
    again = [verifier(prompts, completions, **columns) for verifier in verifiers]
    warm = time.perf_counter() - start
    assert again == rewards
    warm_executions = runner.executions - executions_before - executions
    runner.sandbox.close()
    means = [sum(r) / len(r) for r in rewards]
    return {
        "cold": cold,
        "warm": warm,
        "executions": executions,
        "warm_executions": warm_executions,
        "means": means,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    prompts, completions, columns = make_batch()
    n = len(completions)
    distinct = distinct_queries(completions, columns)
    settings = ("process, shared", "thread, shared", "process, unshared")
    results: dict[str, list[dict]] = {setting: [] for setting in settings}
    for _ in range(args.runs):  # alternate, so all see the same machine load
        for setting in settings:
            results[setting].append(one_run(setting, prompts, completions, columns))

    print(f"batch: {n} completions, 3 verifiers, {distinct} distinct (database, query) pairs")
    means = results["process, shared"][0]["means"]
    print(
        f"mean rewards: format {means[0]:.3f}, executable {means[1]:.3f}, execution {means[2]:.3f}"
    )
    print()
    print(
        "| isolation, execution cache | completions/s (cold cache) | ms per batch "
        "| queries run per batch | completions/s (warm cache) | queries run (warm) |"
    )
    print("|---|---|---|---|---|---|")
    for setting, runs in results.items():
        cold = statistics.median(r["cold"] for r in runs)
        warm = statistics.median(r["warm"] for r in runs)
        executions = sorted({r["executions"] for r in runs})
        warm_executions = sorted({r["warm_executions"] for r in runs})
        if setting.endswith(", shared"):
            assert executions == [distinct], (setting, executions, distinct)
        label = " (= distinct pairs)" if executions == [distinct] else ""
        print(
            f"| {setting} | {n / cold:,.0f} | {1000 * cold:.0f} | {executions[0]}{label} "
            f"| {n / warm:,.0f} | {warm_executions[0]} |"
        )
    print(f"\nmedian of {args.runs} runs each, alternating")


if __name__ == "__main__":
    main()
