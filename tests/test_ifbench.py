"""IFBench in the instructions task: its file loads, its ids verify as slots, its arguments are
checked, its benchmark (strict and loose, per id) is what `mrtpo eval` and `mrtpo score` report."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ifbench_agreement import CASES

from mrtpo import cli
from mrtpo.evaluation import score_responses
from mrtpo.tasks.instructions import (
    INSTRUCTION_LEVEL,
    INSTRUCTION_LEVEL_LOOSE,
    PROMPT_LEVEL,
    PROMPT_LEVEL_LOOSE,
    TASK,
    ConstraintSlot,
    build_constraint,
    load_ifbench,
    load_ifeval,
)
from mrtpo.tasks.instructions.loader import encode_kwargs


@pytest.fixture(scope="module")
def ifbench_path(shared_benchmarks):
    return shared_benchmarks / "ifbench" / "IFBench_test.jsonl"


def test_ifbenchs_file_loads_and_every_instruction_checks(ifbench_path):
    dataset = load_ifbench(ifbench_path)
    assert len(dataset) == 300
    assert dataset.to_list() == load_ifeval(ifbench_path).to_list()
    assert dataset.to_list() == TASK.load(path=str(ifbench_path)).to_list()
    counts = Counter(i for ids in dataset["instruction_id_list"] for i in ids)
    assert len(counts) == 58 and sum(counts.values()) == 344
    slots = TASK.verifiers(max_constraints=2)
    for row in dataset:
        verdicts = [slot.verify("A short answer, in English.", row) for slot in slots]
        assert [v.score is None for v in verdicts] == [
            k >= len(row["instruction_id_list"]) for k in range(2)
        ]


def test_a_slot_verifies_an_ifbench_constraint():
    row = {
        "instruction_id_list": ["punctuation:no_comma", "count:numbers"],
        "kwargs": encode_kwargs([{}, {"N": 2.0}]),
    }
    slot = ConstraintSlot(1)
    assert slot.verify("Take 3 apples and 4 pears.", row).score == 1.0
    verdict = slot.verify("Take 1,000 apples.", row)
    assert verdict.score == 0.0
    assert verdict.info == (
        "Constraint: Include exactly 2 numbers in the response.\n"
        "Verdict: not satisfied: the response has 1 numbers."
    )
    assert verdict.spans == ((5, 10),)


def test_bad_ifbench_arguments_name_the_instruction_and_the_argument(tmp_path):
    with pytest.raises(ValueError, match="count:numbers: missing kwarg 'N'"):
        build_constraint("count:numbers", {})
    with pytest.raises(ValueError, match="count:numbers: kwarg 'N': must be a whole number"):
        build_constraint("count:numbers", {"N": "3"})
    with pytest.raises(ValueError, match="count:words_japanese: kwarg 'N': must be >= 1"):
        build_constraint("count:words_japanese", {"N": 0})
    with pytest.raises(ValueError, match="ratio:stop_words: kwarg 'percentage': must be a number"):
        build_constraint("ratio:stop_words", {"percentage": 140})
    with pytest.raises(ValueError, match=r"format:emoji: unexpected kwargs \['N'\]"):
        build_constraint("format:emoji", {"N": 1})
    row = {
        "key": "x",
        "prompt": "P",
        "instruction_id_list": ["sentence:keyword"],
        "kwargs": [{"word": "cat", "N": -2.0}],
    }
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match="row key='x': sentence:keyword: kwarg 'N'"):
        load_ifbench(path)
    row["instruction_id_list"] = ["count:nothing"]
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=r"1 unknown instruction ids: count:nothing \(1\)"):
        load_ifbench(path)


def test_statements_are_ifbenchs_instructions_with_their_arguments():
    assert build_constraint("count:words_japanese", {"N": 2.0}).statement == (
        "Every 2nd word of your response must be in Japanese."
    )
    assert build_constraint(
        "count:word_count_range", {"min_words": 5, "max_words": 9}
    ).statement == ("The response must contain between 5 and 9 words.")
    assert "{and braces}" in build_constraint("format:parentheses", {}).statement


def test_repeat_span_from_index_0_starts_at_the_first_word():
    # IFBench's checker treats an n_start of 0 as missing and draws one at random (a
    # deliberate difference: here 0 is the first word, as the instruction says).
    span = build_constraint(
        "repeat:repeat_span",
        {"prompt_to_repeat": "The walls are solid but cold.", "n_start": 0, "n_end": 3},
    )
    assert span.check("the walls are").score == 1.0
    assert span.check("walls are solid").score == 0.0


LOOSE_ONLY = "Sure, here it is:\nNo commas at all"  # a comma only in the first line
ROWS = (
    (["punctuation:no_comma", "count:numbers"], [{}, {"N": 1}]),
    (["punctuation:no_comma"], [{}]),
    (["format:no_whitespace"], [{}]),
)


HAND_MADE = ["No commas and 1 number", LOOSE_ONLY, "**bold** text"]


@pytest.fixture
def rows_path(tmp_path):
    path = tmp_path / "ifbench.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {"key": str(n), "prompt": "Say hi.", "instruction_id_list": ids, "kwargs": k}
            )
            + "\n"
            for n, (ids, k) in enumerate(ROWS)
        )
    )
    return path


def four_numbers(benchmark_report):
    return {row["name"]: row["accuracy"] for row in benchmark_report["summary"]}


def per_id(benchmark_report):
    return {
        group["name"]: {
            "count": group["examples"],
            "strict": group["accuracy"],
            "loose": group["loose_accuracy"],
        }
        for group in benchmark_report["groups"]
    }


def test_the_benchmark_counts_prompts_and_instructions_strict_and_loose(rows_path):
    benchmark = TASK.benchmark(str(rows_path))
    assert (
        benchmark.title == f"IFEval/IFBench: {rows_path}" and benchmark.group_by == "instruction id"
    )
    assert benchmark.dataset["id"] == ["0", "1", "2"]
    report = score_responses(TASK, benchmark.dataset.to_list(), HAND_MADE, benchmark=benchmark)
    assert four_numbers(report["benchmark"]) == {
        PROMPT_LEVEL: 1 / 3,
        INSTRUCTION_LEVEL: 2 / 4,
        PROMPT_LEVEL_LOOSE: 2 / 3,
        INSTRUCTION_LEVEL_LOOSE: 3 / 4,
    }
    assert per_id(report["benchmark"]) == {
        "count:numbers": {"count": 1, "strict": 1.0, "loose": 1.0},
        "format:no_whitespace": {"count": 1, "strict": 0.0, "loose": 0.0},
        "punctuation:no_comma": {"count": 2, "strict": 0.5, "loose": 1.0},
    }
    verdicts = report["examples"][1]["verdicts"]
    assert verdicts["prompt_strict"] == {
        "score": 0.0,
        "info": "strict: not followed: punctuation:no_comma",
    }
    assert verdicts["prompt_loose"]["score"] == 1.0
    assert verdicts["instruction_1_strict"]["score"] is None  # the row has one instruction
    assert TASK.benchmark(str(rows_path), max_examples=2).dataset["id"] == ["0", "1"]
    assert TASK.benchmark(str(rows_path.parent)) is None  # a folder is not an IFEval file
    with pytest.raises(ValueError, match="IFEval and IFBench have none, got \\['simple'\\]"):
        TASK.benchmark(str(rows_path), categories=["simple"])


def test_score_gives_the_four_numbers_of_hand_made_responses(rows_path, tmp_path, capsys):
    answers = tmp_path / "answers.jsonl"
    answers.write_text(
        "".join(
            json.dumps({"id": str(n), "response": text}) + "\n" for n, text in enumerate(HAND_MADE)
        )
    )
    out = tmp_path / "score"
    argv = ["score", "--task", "instructions", "--data", str(rows_path)]
    argv += ["--responses", str(answers), "--output_dir", str(out)]
    assert cli.main(argv) == 0
    report = json.loads((out / "eval.json").read_text())
    assert four_numbers(report["benchmark"]) == {
        PROMPT_LEVEL: 1 / 3,
        INSTRUCTION_LEVEL: 2 / 4,
        PROMPT_LEVEL_LOOSE: 2 / 3,
        INSTRUCTION_LEVEL_LOOSE: 3 / 4,
    }
    assert per_id(report["benchmark"])["punctuation:no_comma"]["loose"] == 1.0
    printed = capsys.readouterr().out
    assert f"IFEval/IFBench: {rows_path}" in printed
    assert "prompt-level loose accuracy" in printed and "66.67" in printed


def test_eval_on_an_ifbench_file_reports_loose_and_per_id(
    rows_path, tiny_model_dir, tmp_path, capsys
):
    out = tmp_path / "eval"
    argv = ["eval", "--task", "instructions", "--data", str(rows_path), "--output_dir", str(out)]
    argv += ["--model_name_or_path", str(tiny_model_dir), "--max_new_tokens", "4"]
    assert cli.main(argv) == 0
    report = json.loads((out / "eval.json").read_text())
    numbers = four_numbers(report["benchmark"])
    assert set(numbers) == {
        PROMPT_LEVEL,
        INSTRUCTION_LEVEL,
        PROMPT_LEVEL_LOOSE,
        INSTRUCTION_LEVEL_LOOSE,
    }
    assert numbers[PROMPT_LEVEL] <= numbers[PROMPT_LEVEL_LOOSE]
    assert {i: v["count"] for i, v in per_id(report["benchmark"]).items()} == {
        "count:numbers": 1,
        "format:no_whitespace": 1,
        "punctuation:no_comma": 2,
    }
    assert "prompt-level loose accuracy" in capsys.readouterr().out


IFBENCH_CONSTRAINTS = [build_constraint(i, CASES[i][0][0]) for i in sorted(CASES)]
PIECES = [
    *"*-#<>\"\n\t .,!?;:()[]{}'",
    "Question 1.",
    "A) x",
    "Mr.",
    "Inc. He",
    "😀",
    "日本",
    "a",
    "B",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(IFBENCH_CONSTRAINTS),
    st.one_of(st.text(max_size=200), st.lists(st.sampled_from(PIECES), max_size=60).map("".join)),
)
def test_any_text_gets_a_verdict_with_spans_inside_it(constraint, response):
    verdict = constraint.check(response)
    assert verdict.score in (0.0, 1.0)
    assert verdict.info.startswith(f"Constraint: {constraint.statement}\nVerdict: ")
    assert all(0 <= start <= end <= len(response) for start, end in verdict.spans)
    assert constraint.follows_loose(response) >= (verdict.score == 1.0)
