"""BFCL v4 single-turn evaluation: each category's rule, Java and JavaScript typing, the
leaderboard's summary formulas, and `mrtpo score`/`mrtpo eval` on a BFCL folder.

Most tests use a small BFCL folder written here (every single-turn category, one or two
questions each); the last ones score BFCL's own files from the installed bfcl-eval wheel."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from mrtpo import cli
from mrtpo.tasks.tool_calling import TASK
from mrtpo.tasks.tool_calling.bfcl import argument_is_valid
from mrtpo.tasks.tool_calling.bfcl_categories import (
    category_verdict,
    load_benchmark,
    reference_response,
    summary_rows,
)
from mrtpo.tasks.tool_calling.data import SINGLE_TURN_CATEGORIES, bfcl_data_dir

# Entries of BFCL v4's own data that no response can pass (its checker rejects every writing
# of the reference answer). Found by the gold-answer test below; listed so a change shows.
BROKEN_ENTRIES = {
    # The answer names a parameter the function's schema lacks (unexpected if given,
    # missing if not).
    "parallel_multiple_12": "answer parameter 'permeability' not in the schema",
    "parallel_multiple_26": "answer parameter 'type' not in the schema",
    "live_multiple_862-181-3": "answer parameter 'journey_start_time' not in the schema",
    "live_multiple_964-207-0": "answer parameter 'question' not in the schema",
    # Required parameters whose list of allowed values is empty.
    "live_simple_106-63-0": "required parameters with no allowed value",
    "live_simple_112-68-0": "required parameters with no allowed value",
    # ArrayList<any>: BFCL turns every element into a string, the answer holds numbers/booleans.
    "simple_java_36": "ArrayList<any> answer with non-string elements",
    "simple_java_65": "ArrayList<any> answer with non-string elements",
    # The dict key's allowed values are a string, which BFCL compares character by character.
    "simple_java_64": "HashMap answer {'format': 'epoch_millis'} is not a list of values",
}

INT, STR = {"type": "integer"}, {"type": "string"}


def function(name: str, properties: dict, required: list[str] | None = None) -> dict:
    return {
        "name": name,
        "description": f"{name}.",
        "parameters": {"type": "dict", "properties": properties, "required": required or []},
    }


AREA = function("area", {"base": INT, "height": INT, "unit": STR}, ["base", "height"])
WEATHER = function("weather", {"city": STR}, ["city"])
JAVA = function(
    "Cache.put",
    {
        "key": {"type": "String"},
        "ttl": {"type": "long"},
        "enabled": {"type": "boolean"},
        "ids": {"type": "ArrayList", "items": {"type": "String"}},
        "names": {"type": "Array", "items": {"type": "String"}},
        "options": {"type": "HashMap"},
        "ratio": {"type": "float"},
        "owner": {"type": "any"},
    },
    ["key", "ttl"],
)
JAVA_ANSWER = {"key": ["user"], "ttl": [60], "enabled": [True], "ids": [["a", "b"]],
               "names": [["x", "y"]], "options": [{"mode": ["fast"]}], "ratio": [0.5],
               "owner": ["session"]}  # fmt: skip
JAVASCRIPT = function(
    "render",
    {
        "id": {"type": "String"},
        "scale": {"type": "float"},
        "tags": {"type": "array", "items": {"type": "String"}},
        "options": {"type": "dict", "properties": {"theme": {"type": "String"}}},
        "visible": {"type": "Boolean"},
        "count": {"type": "integer"},
    },
    ["id"],
)
JAVASCRIPT_ANSWER = {"id": ["chart"], "scale": [2.0], "tags": [["a", "b"]],
                     "options": [{"theme": ["dark"]}], "visible": [False], "count": [3]}  # fmt: skip

# category -> [(id suffix, functions, answer or None)]
QUESTIONS = {
    "simple_python": [("0", [AREA], [{"area": {"base": [10], "height": [5], "unit": ["", "cm"]}}])],
    "simple_java": [("0", [JAVA], [{"Cache.put": JAVA_ANSWER}])],
    "simple_javascript": [("0", [JAVASCRIPT], [{"render": JAVASCRIPT_ANSWER}])],
    "multiple": [("0", [AREA, WEATHER], [{"weather": {"city": ["Paris"]}}])],
    "parallel": [("0", [WEATHER], [{"weather": {"city": ["Paris"]}}, {"weather": {"city": ["Rome"]}}])],
    "parallel_multiple": [("0", [AREA, WEATHER], [{"weather": {"city": ["Oslo"]}},
                                                  {"area": {"base": [2], "height": [3]}}])],
    "irrelevance": [("0", [AREA], None), ("1", [WEATHER], None)],
    "live_simple": [("0-0-0", [WEATHER], [{"weather": {"city": ["Lima"]}}])],
    "live_multiple": [("0-0-0", [AREA, WEATHER], [{"area": {"base": [1], "height": [1]}}]),
                      ("1-0-1", [WEATHER], [{"weather": {"city": ["Kyiv"]}}])],
    "live_parallel": [("0-0-0", [WEATHER], [{"weather": {"city": ["A"]}}, {"weather": {"city": ["B"]}}])],
    "live_parallel_multiple": [("0-0-0", [AREA, WEATHER], [{"weather": {"city": ["C"]}},
                                                           {"area": {"base": [4], "height": [4]}}])],
    "live_irrelevance": [("0-0-0", [WEATHER], None)],
    "live_relevance": [("0-0-0", [WEATHER], None)],
}  # fmt: skip


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")


@pytest.fixture()
def bfcl_folder(tmp_path: Path) -> Path:
    """A BFCL v4 data folder with every single-turn category (plus a multi-turn file that
    must be ignored)."""
    folder = tmp_path / "bfcl"
    for category, questions in QUESTIONS.items():
        name = f"BFCL_v4_{category}.json"
        write_jsonl(folder / name, [
            {"id": f"{category}_{suffix}", "question": [[{"role": "user", "content": "Go."}]],
             "function": functions}
            for suffix, functions, _ in questions
        ])  # fmt: skip
        if questions[0][2] is not None:
            write_jsonl(folder / "possible_answer" / name, [
                {"id": f"{category}_{suffix}", "ground_truth": answer}
                for suffix, _, answer in questions
            ])  # fmt: skip
    write_jsonl(folder / "BFCL_v4_multi_turn_base.json", [{"id": "multi_turn_base_0"}])
    return folder


def calls(*pairs: tuple[str, dict]) -> str:
    return "\n".join(
        f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"
        for name, arguments in pairs
    )


def rows_by_id(folder: Path, **options) -> dict[str, dict]:
    return {row["id"]: row for row in load_benchmark(folder, **options).dataset.to_list()}


# -- loading -----------------------------------------------------------------------------


def test_categories_are_found_selected_and_cut(bfcl_folder, tmp_path):
    benchmark = TASK.benchmark(str(bfcl_folder))
    rows = benchmark.dataset.to_list()
    assert list(dict.fromkeys(row["category"] for row in rows)) == list(SINGLE_TURN_CATEGORIES)
    assert benchmark.title == f"BFCL v4 single-turn: {bfcl_folder}"
    assert [row["ground_truth"] for row in rows if row["category"] == "irrelevance"] == ["[]"] * 2
    cut = load_benchmark(bfcl_folder, categories=["irrelevance", "live_multiple"], max_examples=1)
    assert [row["id"] for row in cut.dataset] == ["irrelevance_0", "live_multiple_0-0-0"]
    assert cut.title.endswith("(first 1 per category)")
    with pytest.raises(
        ValueError, match="categories simple_rust are not in .*it has simple_python"
    ):
        load_benchmark(bfcl_folder, categories=["simple_rust"])
    # One category's file; a file not named as a BFCL category is no benchmark.
    single = load_benchmark(bfcl_folder / "BFCL_v4_parallel.json")
    assert [row["category"] for row in single.dataset] == ["parallel"]
    plain = tmp_path / "mine.jsonl"
    plain.write_text((bfcl_folder / "BFCL_v4_parallel.json").read_text())
    assert TASK.benchmark(str(plain)) is None
    # BFCL v3's names of the renamed categories.
    v3 = tmp_path / "v3"
    v3.mkdir()
    for old, new in (("simple", "simple_python"), ("java", "simple_java")):
        (v3 / f"BFCL_v3_{old}.json").write_text((bfcl_folder / f"BFCL_v4_{new}.json").read_text())
        (v3 / "possible_answer").mkdir(exist_ok=True)
        (v3 / "possible_answer" / f"BFCL_v3_{old}.json").write_text(
            (bfcl_folder / "possible_answer" / f"BFCL_v4_{new}.json").read_text()
        )
    assert [row["category"] for row in load_benchmark(v3).dataset] == [
        "simple_python",
        "simple_java",
    ]


def test_prompts_show_java_and_javascript_values_as_strings(bfcl_folder):
    rows = rows_by_id(bfcl_folder)
    java = rows["simple_java_0"]
    tools = json.loads(java["tools"])[0]["function"]
    assert {schema["type"] for schema in tools["parameters"]["properties"].values()} == {"string"}
    assert "Java long" in tools["parameters"]["properties"]["ttl"]["description"]
    assert "Java 8 SDK" in tools["description"] and "Java 8 SDK" in java["prompt"][0]["content"]
    # The checker reads BFCL's own descriptions, kept beside the prompt's.
    assert json.loads(java["functions"])[0]["parameters"]["properties"]["ttl"]["type"] == "long"
    assert java["language"] == "java" and rows["simple_javascript_0"]["language"] == "javascript"
    python = json.loads(rows["simple_python_0"]["tools"])[0]["function"]
    assert "Python 3" in python["description"]
    assert python["parameters"]["properties"]["base"]["type"] == "integer"


# -- each category's rule ----------------------------------------------------------------------


def score(rows: dict[str, dict], row_id: str, response: str) -> float | None:
    return category_verdict(response, rows[row_id]).score


def test_each_category_rule(bfcl_folder):
    rows = rows_by_id(bfcl_folder)
    paris, rome = ("weather", {"city": "Paris"}), ("weather", {"city": "Rome"})
    cases = [
        # simple: exactly one call, optional "unit" may be left out.
        ("simple_python_0", calls(("area", {"base": 10, "height": 5})), 1.0),
        ("simple_python_0", calls(("area", {"base": 10, "height": 5, "unit": "CM"})), 1.0),
        ("simple_python_0", calls(("area", {"base": 10, "height": 5}), ("area", {"base": 10, "height": 5})), 0.0),
        ("simple_python_0", calls(("area", {"base": 10})), 0.0),
        # multiple: the right function among those offered.
        ("multiple_0", calls(paris), 1.0),
        ("multiple_0", calls(("area", {"base": 1, "height": 1})), 0.0),
        # parallel: every call, in any order, nothing more.
        ("parallel_0", calls(rome, paris), 1.0),
        ("parallel_0", calls(paris), 0.0),
        ("parallel_0", calls(paris, rome, rome), 0.0),
        ("parallel_multiple_0", calls(("area", {"base": 2, "height": 3}), ("weather", {"city": "oslo"})), 1.0),
        ("live_parallel_multiple_0-0-0", calls(("weather", {"city": "C"})), 0.0),
        # A block that is not JSON is dropped; a parsed block of the wrong shape voids them all.
        ("live_simple_0-0-0", "<tool_call>{oops</tool_call>" + calls(("weather", {"city": "Lima"})), 1.0),
        ("live_simple_0-0-0", calls(("weather", {"city": "Lima"})) + '<tool_call>{"name": 1}</tool_call>', 0.0),
        # irrelevance: right when nothing is called (text, nothing, or undecodable calls).
        ("irrelevance_0", "I cannot compute that.", 1.0),
        ("irrelevance_0", "", 1.0),
        ("irrelevance_0", '<tool_call>{"function": "area"}</tool_call>', 1.0),
        ("irrelevance_0", calls(("area", {})), 0.0),
        # Blocks are read by json.loads, as BFCL reads them: a repeated key keeps its last value.
        ("irrelevance_0", '<tool_call>{"name": "area", "arguments": {"base": 1, "base": 2}}</tool_call>', 0.0),
        ("live_irrelevance_0-0-0", calls(("weather", {"city": "X"})), 0.0),
        # relevance: right when something is called, whatever the arguments.
        ("live_relevance_0-0-0", calls(("weather", {"wrong": 1})), 1.0),
        ("live_relevance_0-0-0", "Sure.", 0.0),
    ]  # fmt: skip
    for row_id, response, expected in cases:
        assert score(rows, row_id, response) == expected, (row_id, response)


def test_java_values_are_typed_strings(bfcl_folder):
    rows = rows_by_id(bfcl_folder)
    right = {
        "key": "user",
        "ttl": "60L",
        "enabled": "true",
        "ids": 'new ArrayList<>(Arrays.asList("a", "b"))',
        "names": "new String[]{x, y}",
        "options": 'new HashMap<String, String>() {{ put("mode", "fast"); }}',
        "ratio": "0.5f",
        "owner": "session",
    }
    assert score(rows, "simple_java_0", calls(("Cache.put", right))) == 1.0
    assert reference_response(rows["simple_java_0"]).count("Cache.put") == 1
    assert score(rows, "simple_java_0", reference_response(rows["simple_java_0"])) == 1.0
    wrong = {
        "ttl": "60",  # a long needs its L
        "enabled": True,  # not a string
        "ratio": "0.5",  # a float needs its f
        "names": 'new String[]{"x", "y"}',  # Array elements are taken as written, quotes kept
        "ids": "new ArrayList<>(Arrays.asList(a, b))",  # ArrayList<String> elements lose 2 chars
        "options": "{mode: fast}",  # not a HashMap literal
        "key": "users",
    }
    for param, value in wrong.items():
        response = calls(("Cache.put", {**right, param: value}))
        assert score(rows, "simple_java_0", response) == 0.0, param
    schema = {"type": "ArrayList", "items": {"type": "integer"}}
    assert argument_is_valid(
        "new ArrayList<Integer>() {{ add(1); add(2); }}", [[1, 2]], schema, "java"
    )
    assert argument_is_valid("new ArrayList<>()", [[]], schema, "java")
    assert argument_is_valid("3.5", [3.5], {"type": "double"}, "java")
    assert not argument_is_valid("3.5f", [3.5], {"type": "double"}, "java")


def test_javascript_values_are_typed_strings(bfcl_folder):
    rows = rows_by_id(bfcl_folder)
    right = {"id": "'chart'", "scale": "2", "tags": "['a', 'b']", "options": "{theme: 'dark'}",
             "visible": "false", "count": "3"}  # fmt: skip
    assert score(rows, "simple_javascript_0", calls(("render", right))) == 1.0
    assert (
        score(rows, "simple_javascript_0", reference_response(rows["simple_javascript_0"])) == 1.0
    )
    also_right = {"id": "chart", "scale": "2.0", "tags": 'new Array("a", "b")'}
    for param, value in also_right.items():
        assert score(rows, "simple_javascript_0", calls(("render", {**right, param: value}))) == 1.0
    wrong = {"count": 3, "visible": "False", "scale": "2.0f", "tags": "['a']", "count ": "3"}
    for param, value in wrong.items():
        response = calls(("render", {**right, param: value}))
        assert score(rows, "simple_javascript_0", response) == 0.0, param
    # dict values are read after their quotes are stripped: '5' is the number 5.
    assert argument_is_valid("{n: '5'}", [{"n": [5]}], {"type": "dict"}, "javascript")
    assert argument_is_valid("12n", [12], {"type": "Bigint"}, "javascript")


def test_the_training_correctness_reads_java_rows_as_java(bfcl_folder):
    rows = rows_by_id(bfcl_folder)
    correctness = TASK.verifiers()[1]
    row = rows["simple_java_0"]
    assert correctness.verify(TASK.reference_completion(row), row).score == 1.0
    assert correctness.verify(reference_response(row), row).score == 1.0


# -- summary formulas --------------------------------------------------------------------------


def group(name: str, correct: int, examples: int) -> dict:
    return {"name": name, "examples": examples, "correct": correct, "accuracy": correct / examples}


def test_summary_rows_follow_bfcl_formulas():
    groups = [
        group("simple_python", 4, 4), group("simple_java", 1, 2), group("simple_javascript", 0, 1),
        group("multiple", 1, 1), group("parallel", 1, 2), group("parallel_multiple", 0, 3),
        group("irrelevance", 2, 2), group("live_irrelevance", 1, 2), group("live_relevance", 1, 4),
        group("live_simple", 1, 2), group("live_multiple", 3, 4), group("live_parallel", 0, 1),
        group("live_parallel_multiple", 1, 1),
    ]  # fmt: skip
    summary = {row["name"]: row for row in summary_rows(groups)}
    # Simple: unweighted over the three languages (1 + 0.5 + 0) / 3, not 5/7.
    assert summary["Non-live simple AST"]["accuracy"] == pytest.approx(0.5)
    assert summary["Non-live simple AST"]["examples"] == 7
    # Non-live: unweighted over simple, multiple, parallel, parallel_multiple.
    assert summary["Non-live AST summary"]["accuracy"] == pytest.approx((0.5 + 1 + 0.5 + 0) / 4)
    # Live: weighted by examples, (1 + 3 + 0 + 1) / 8, not the unweighted 0.5625.
    assert summary["Live AST summary"]["accuracy"] == pytest.approx(5 / 8)
    assert summary["Irrelevance detection"]["accuracy"] == pytest.approx((1 + 0.5) / 2)
    assert summary["Relevance detection"]["accuracy"] == pytest.approx(0.25)
    # A category not evaluated makes its rows N/A (None), as BFCL's table shows them.
    partial = {row["name"]: row for row in summary_rows(groups[1:])}
    assert partial["Non-live simple AST"]["accuracy"] is None
    assert partial["Non-live AST summary"]["accuracy"] is None
    assert partial["Live AST summary"]["accuracy"] == pytest.approx(5 / 8)


# -- mrtpo score and mrtpo eval ------------------------------------------------------------------


def run_cli(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def score_report(folder: Path, answers: dict[str, str], out: Path, capsys, *extra: str) -> dict:
    responses = out.with_suffix(".jsonl")
    write_jsonl(responses, [{"id": key, "response": text} for key, text in answers.items()])
    code, stdout, err = run_cli(["score", "--task", "tool_calling", "--data", str(folder),
        "--responses", str(responses), "--output_dir", str(out), *extra], capsys)  # fmt: skip
    assert code == 0, err
    assert "BFCL v4 single-turn" in stdout and "Live AST summary" in stdout
    return json.loads((out / "eval.json").read_text())


def accuracies(report: dict) -> dict[str, float]:
    table = report["benchmark"]
    return {row["name"]: row["accuracy"] for row in [*table["groups"], *table["summary"]]}


def test_score_gold_and_never_calling_on_the_fixture(bfcl_folder, tmp_path, capsys):
    rows = load_benchmark(bfcl_folder).dataset.to_list()
    gold = score_report(bfcl_folder, {r["id"]: reference_response(r) for r in rows},
                        tmp_path / "gold", capsys)  # fmt: skip
    assert set(accuracies(gold).values()) == {1.0}
    assert gold["examples"][0]["verdicts"]["bfcl_accuracy"]["score"] == 1.0
    never = score_report(bfcl_folder, {r["id"]: "No." for r in rows}, tmp_path / "never", capsys)
    for name, value in accuracies(never).items():
        expected = (
            1.0 if name in ("irrelevance", "live_irrelevance", "Irrelevance detection") else 0.0
        )
        assert value == expected, name


def test_score_reads_bfcl_result_files_and_needs_every_answer(bfcl_folder, tmp_path, capsys):
    results = tmp_path / "result" / "my-model"
    write_jsonl(results / "non_live" / "BFCL_v4_parallel_result.json", [
        {"id": "parallel_0", "result": [{"weather": '{"city": "Rome"}'}, {"weather": {"city": "Paris"}}]},
    ])  # fmt: skip
    write_jsonl(results / "live" / "BFCL_v4_live_relevance_result.json", [
        {"id": "live_relevance_0-0-0", "result": "I will not call anything."},
    ])  # fmt: skip
    out = tmp_path / "out"
    argv = ["score", "--task", "tool_calling", "--data", str(bfcl_folder), "--responses",
            str(results.parent), "--output_dir", str(out)]  # fmt: skip
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "no answer for 13 of the 15 examples" in err and "--partial" in err
    code, stdout, _ = run_cli([*argv, "--partial"], capsys)
    assert code == 0 and "13 without an answer left out" in stdout
    report = json.loads((out / "eval.json").read_text())
    assert accuracies(report)["parallel"] == 1.0 and accuracies(report)["live_relevance"] == 0.0
    assert report["unanswered"] == 13 and report["num_examples"] == 2
    code, _, _ = run_cli([*argv, "--categories", "parallel,live_relevance"], capsys)
    assert code == 0
    report = json.loads((out / "eval.json").read_text())
    assert report["categories"] == ["parallel", "live_relevance"] and report["unanswered"] == 0


def test_eval_on_a_bfcl_folder(bfcl_folder, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "eval"
    code, stdout, _ = run_cli(["eval", "--task", "tool_calling", "--model_name_or_path",
        str(tiny_model_dir), "--data", str(bfcl_folder), "--categories", "simple_java,irrelevance",
        "--max_examples", "1", "--max_new_tokens", "3", "--output_dir", str(out)], capsys)  # fmt: skip
    assert code == 0
    report = json.loads((out / "eval.json").read_text())
    assert [row["name"] for row in report["benchmark"]["groups"]] == ["simple_java", "irrelevance"]
    assert [e["id"] for e in report["examples"]] == ["simple_java_0", "irrelevance_0"]
    assert set(report["examples"][0]["verdicts"]) == {
        "tool_format",
        "tool_correctness",
        "bfcl_accuracy",
    }
    assert "BFCL v4 single-turn" in stdout and "Non-live AST summary" in stdout
    # The tiny model writes no call in 3 tokens: irrelevance is right, simple_java wrong.
    assert accuracies(report)["irrelevance"] == 1.0 and accuracies(report)["simple_java"] == 0.0
    assert "wrote" in stdout and report["seconds"] >= 0


# -- BFCL's own files ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shipped_rows() -> tuple[Path, list[dict]]:
    folder = bfcl_data_dir()
    if folder is None:
        pytest.skip("bfcl-eval is not installed")
    return folder, load_benchmark(folder).dataset.to_list()


def test_score_gold_answers_on_bfcl_v4(shipped_rows, tmp_path, capsys):
    """Every single-turn category scores 100% on its reference answers, apart from BFCL's own
    broken entries; a model that never calls gets irrelevance right and nothing else."""
    folder, rows = shipped_rows
    counts = {
        category: sum(r["category"] == category for r in rows)
        for category in SINGLE_TURN_CATEGORIES
    }
    assert counts == {"simple_python": 400, "simple_java": 100, "simple_javascript": 50,
        "multiple": 200, "parallel": 200, "parallel_multiple": 200, "irrelevance": 240,
        "live_simple": 258, "live_multiple": 1053, "live_parallel": 16,
        "live_parallel_multiple": 24, "live_irrelevance": 884, "live_relevance": 16}  # fmt: skip
    gold = score_report(
        folder, {r["id"]: reference_response(r) for r in rows}, tmp_path / "gold", capsys
    )
    wrong = {e["id"] for e in gold["examples"] if e["verdicts"]["bfcl_accuracy"]["score"] != 1.0}
    print("\nBFCL entries no response can pass:", sorted(wrong))
    assert wrong == set(BROKEN_ENTRIES)
    category_of = {row["id"]: row["category"] for row in rows}
    broken = Counter(category_of[key] for key in BROKEN_ENTRIES)
    for group in gold["benchmark"]["groups"]:
        assert group["examples"] - group["correct"] == broken[group["name"]], group
    never = score_report(
        folder, {r["id"]: "I cannot help." for r in rows}, tmp_path / "never", capsys
    )
    for name, value in accuracies(never).items():
        expected = (
            1.0 if name in ("irrelevance", "live_irrelevance", "Irrelevance detection") else 0.0
        )
        assert value == expected, name
