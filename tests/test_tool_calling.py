"""Tool-calling verifiers on hand-made cases in BFCL's format, and on hostile text."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrtpo.tasks.tool_calling import TASK, ToolCallCorrectness, ToolCallFormat
from mrtpo.tasks.tool_calling.data import bfcl_row

LIST_ITEMS = {
    "name": "list_items",
    "description": "List the items of a category.",
    "parameters": {
        "type": "dict",
        "properties": {
            "category": {"type": "string", "description": "Category name."},
            "offset": {"type": "integer", "description": "Items to skip."},
            "limit": {"type": "integer", "description": "Most items to return."},
        },
        "required": ["category", "offset"],
    },
}
MEASURE = {
    "name": "measure",
    "description": "Record measurements.",
    "parameters": {
        "type": "dict",
        "properties": {
            "length": {"type": "float", "description": "A length."},
            "samples": {"type": "array", "items": {"type": "float"}, "description": "Samples."},
            "box": {
                "type": "dict",
                "properties": {"width": {"type": "float"}, "label": {"type": "string"}},
                "description": "A box.",
            },
            "city": {"type": "string", "description": "Where."},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags."},
            "exact": {"type": "boolean", "description": "Exact?"},
        },
        "required": ["length"],
    },
}


def make_row(functions, ground_truth, question="Do it."):
    question_row = {
        "id": "case_0",
        "question": [[{"role": "user", "content": question}]],
        "function": functions,
    }
    return bfcl_row(question_row, ground_truth)


LIST_ROW = make_row(
    [LIST_ITEMS], [{"list_items": {"category": ["books"], "offset": [3], "limit": [10, ""]}}]
)
FORMAT, CORRECTNESS = ToolCallFormat(), ToolCallCorrectness()


def call(name, arguments, newlines=True):
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>" if newlines else f"<tool_call>{body}</tool_call>"


def scores(completion, row=LIST_ROW):
    return FORMAT.verify(completion, row).score, CORRECTNESS.verify(completion, row).score


def test_exact_call_scores_one_on_both():
    completion = call("list_items", {"category": "books", "offset": 3, "limit": 10})
    assert scores(completion) == (1.0, 1.0)


def test_wrong_argument_value_lowers_correctness_but_not_format():
    completion = call("list_items", {"category": "books", "offset": 2})
    format_score, correctness = scores(completion)
    assert format_score == 1.0
    assert correctness == pytest.approx(3 / 4)  # name, category, limit (omitted, allowed) right


def test_missing_required_argument_is_wrong():
    assert scores(call("list_items", {"offset": 3}))[1] == pytest.approx(3 / 4)


def test_required_parameter_outside_the_answer_still_counts():
    row = make_row([LIST_ITEMS], [{"list_items": {"category": ["books"]}}])
    # "offset" is required by the schema but absent from the answer: BFCL rejects both.
    assert scores(call("list_items", {"category": "books"}), row)[1] == pytest.approx(2 / 3)
    assert scores(call("list_items", {"category": "books", "offset": 1}), row)[1] == pytest.approx(
        2 / 3
    )


def test_extra_argument_is_a_wrong_unit():
    completion = call("list_items", {"category": "books", "offset": 3, "sort": "asc"})
    assert scores(completion) == (1.0, pytest.approx(4 / 5))


def test_wrong_function_name():
    other = dict(LIST_ITEMS, name="list_users")
    row = make_row([LIST_ITEMS, other], [{"list_items": {"category": ["books"], "offset": [3]}}])
    assert scores(call("list_users", {"category": "books", "offset": 3}), row) == (1.0, 0.0)
    assert scores(call("list_things", {"category": "books", "offset": 3}), row) == (0.0, 0.0)


def test_optional_parameter_may_be_omitted_only_where_empty_is_allowed():
    assert scores(call("list_items", {"category": "books", "offset": 3})) == (1.0, 1.0)
    strict = make_row(
        [LIST_ITEMS], [{"list_items": {"category": ["books"], "offset": [3], "limit": [10]}}]
    )
    assert scores(call("list_items", {"category": "books", "offset": 3}), strict)[
        1
    ] == pytest.approx(3 / 4)


MEASURE_ROW = make_row(
    [MEASURE],
    [
        {
            "measure": {
                "length": [5.0],
                "samples": [[1.0, 2.5]],
                "box": [{"width": [2.0], "label": ["Big Box"]}],
                "city": ["Paris, France", "Paris"],
                "tags": [["a", "b"]],
                "exact": [True],
            }
        }
    ],
)
MEASURE_CALL = {
    "length": 5.0,
    "samples": [1.0, 2.5],
    "box": {"width": 2.0, "label": "Big Box"},
    "city": "Paris, France",
    "tags": ["a", "b"],
    "exact": True,
}


def measure_score(**changes):
    return scores(call("measure", {**MEASURE_CALL, **changes}), MEASURE_ROW)[1]


def test_int_for_float_top_level_and_in_dicts_but_not_in_lists():
    assert measure_score() == 1.0
    assert measure_score(length=5) == 1.0
    assert measure_score(box={"width": 2, "label": "Big Box"}) == 1.0
    assert measure_score(samples=[1, 2.5]) == pytest.approx(6 / 7)


def test_strings_compare_like_bfcl():
    assert measure_score(city="Paris") == 1.0  # another allowed value
    assert measure_score(city="paris france") == 1.0  # case, spaces and commas ignored
    assert measure_score(city="Paris!") == pytest.approx(6 / 7)
    assert measure_score(box={"width": 2.0, "label": "big-box"}) == 1.0  # also inside dicts
    assert measure_score(tags=["A", "b"]) == 1.0  # and inside lists


def test_list_order_and_types_matter():
    assert measure_score(tags=["b", "a"]) == pytest.approx(6 / 7)
    assert measure_score(exact=1) == pytest.approx(6 / 7)  # an int is not a boolean
    assert measure_score(length="5.0") == pytest.approx(6 / 7)
    assert measure_score(box={"width": 2.0}) == pytest.approx(6 / 7)  # missing non-optional key


WEATHER = {
    "name": "get_weather",
    "description": "Weather.",
    "parameters": {
        "type": "dict",
        "properties": {"city": {"type": "string", "description": "City."}},
        "required": ["city"],
    },
}
TIME = {
    "name": "get_time",
    "description": "Time.",
    "parameters": {
        "type": "dict",
        "properties": {"zone": {"type": "string", "description": "Zone."}},
        "required": ["zone"],
    },
}
PARALLEL_ROW = make_row(
    [WEATHER, TIME],
    [
        {"get_weather": {"city": ["Paris"]}},
        {"get_weather": {"city": ["Tokyo"]}},
        {"get_time": {"zone": ["UTC"]}},
    ],
)


def test_parallel_calls_in_another_order():
    calls = [call("get_time", {"zone": "UTC"}), call("get_weather", {"city": "Tokyo"}), call("get_weather", {"city": "Paris"})]  # fmt: skip
    assert scores("\n".join(calls), PARALLEL_ROW) == (1.0, 1.0)
    assert scores("".join(calls[:2]), PARALLEL_ROW)[1] == pytest.approx(4 / 6)  # Paris missing
    assert scores("\n".join(calls + calls[:1]), PARALLEL_ROW)[1] == pytest.approx(
        6 / 7
    )  # one surplus


def test_parallel_matching_is_greedy_like_bfcl():
    # Reference 1 accepts Paris or Tokyo, reference 2 only Paris. BFCL gives reference 1 the
    # first call it accepts (Paris), so Tokyo is left for reference 2: not valid, although
    # the other assignment would be.
    row = make_row(
        [WEATHER],
        [{"get_weather": {"city": ["Paris", "Tokyo"]}}, {"get_weather": {"city": ["Paris"]}}],
    )
    paris_first = call("get_weather", {"city": "Paris"}) + call("get_weather", {"city": "Tokyo"})
    tokyo_first = call("get_weather", {"city": "Tokyo"}) + call("get_weather", {"city": "Paris"})
    assert scores(tokyo_first, row)[1] == 1.0
    assert scores(paris_first, row)[1] == pytest.approx(3 / 4)


def test_malformed_json_scores_zero_on_both():
    assert scores(
        '<tool_call>{"name": "list_items", "arguments": {"category": "books",}}</tool_call>'
    ) == (0.0, 0.0)
    assert scores("<tool_call>list_items(category='books', offset=3)</tool_call>") == (0.0, 0.0)
    assert scores('{"name": "list_items", "arguments": {"category": "books", "offset": 3}}') == (
        0.0,
        0.0,
    )


def test_text_outside_the_blocks_breaks_only_the_format():
    exact = call("list_items", {"category": "books", "offset": 3})
    assert scores("Sure! " + exact) == (0.0, 1.0)
    assert scores(exact + " Done.") == (0.0, 1.0)
    assert scores(exact + "</tool_call>")[0] == 0.0
    assert scores("<tool_call>" + exact)[0] == 0.0  # an unclosed extra tag


def test_think_block_and_white_space_are_allowed():
    exact = call("list_items", {"category": "books", "offset": 3}, newlines=False)
    assert scores(f"  <think>the user wants books</think>\n\n{exact}\n") == (1.0, 1.0)
    assert scores(exact.replace("<tool_call>", "<tool_call>\n\n  ")) == (1.0, 1.0)
    assert scores(f"{exact} <think>late</think>")[0] == 0.0
    assert scores(f"<think>{exact}") == (0.0, 0.0)  # unclosed think: everything is thinking


def test_format_needs_exactly_name_and_arguments_objects():
    assert scores('<tool_call>{"name": "list_items"}</tool_call>')[0] == 0.0
    assert scores('<tool_call>{"name": "list_items", "arguments": "{}"}</tool_call>')[0] == 0.0
    assert (
        scores('<tool_call>{"name": "list_items", "arguments": {}, "id": 1}</tool_call>')[0] == 0.0
    )
    assert scores("<tool_call>[1, 2]</tool_call>") == (0.0, 0.0)
    assert scores("") == (0.0, 0.0)


def test_duplicate_keys_make_the_block_malformed():
    duplicated = '<tool_call>{"name": "list_items", "arguments": {"category": "books", "offset": 2, "offset": 3}}</tool_call>'  # fmt: skip
    assert scores(duplicated) == (0.0, 0.0)
    verdict = FORMAT.verify(duplicated, LIST_ROW)
    assert "duplicate key 'offset'" in verdict.info


def test_deeply_nested_json_is_refused_without_recursion():
    deep = '<tool_call>{"name": "list_items", "arguments": {"category": ' + "[" * 100_000 + "]" * 100_000 + "}}</tool_call>"  # fmt: skip
    assert scores(deep) == (0.0, 0.0)
    unbalanced = "<tool_call>" + "[{" * 50_000 + "</tool_call>"
    assert scores(unbalanced) == (0.0, 0.0)


def test_huge_numbers():
    row = make_row([MEASURE], [{"measure": {"length": [5.0]}}])
    huge_int = "1" + "0" * 400  # fits an int, overflows a float
    assert scores(f'<tool_call>{{"name": "measure", "arguments": {{"length": {huge_int}}}}}</tool_call>', row) == (1.0, 0.5)  # fmt: skip
    too_many_digits = "1" * 5000  # beyond Python's int-from-text limit
    assert scores(f'<tool_call>{{"name": "measure", "arguments": {{"length": {too_many_digits}}}}}</tool_call>', row) == (0.0, 0.0)  # fmt: skip
    assert scores(
        '<tool_call>{"name": "measure", "arguments": {"length": 1e999}}</tool_call>', row
    ) == (0.0, 0.0)
    assert scores(
        '<tool_call>{"name": "measure", "arguments": {"length": NaN}}</tool_call>', row
    ) == (0.0, 0.0)


def test_one_megabyte_string_argument():
    completion = call("list_items", {"category": "b" * 1_000_000, "offset": 3})
    start = time.perf_counter()
    assert scores(completion) == (1.0, pytest.approx(3 / 4))
    assert time.perf_counter() - start < 5.0
    hostile = "<tool_call>" + '"\\' * 500_000 + "</tool_call>"  # 1 MB of quote-backslash pairs
    start = time.perf_counter()
    assert scores(hostile) == (0.0, 0.0)
    assert time.perf_counter() - start < 5.0


def test_spans_point_at_tags_punctuation_and_arguments():
    completion = call("list_items", {"category": "books", "offset": 3}, newlines=False)
    covered = {i for a, b in FORMAT.verify(completion, LIST_ROW).spans for i in range(a, b)}
    body_start, body_end = len("<tool_call>"), len(completion) - len("</tool_call>")
    tags = set(range(body_start)) | set(range(body_end, len(completion)))
    punctuation = {i for i in range(body_start, body_end) if completion[i] in '{}[]:,"'}
    assert covered == tags | punctuation
    correctness_spans = CORRECTNESS.verify(completion, LIST_ROW).spans
    assert [completion[a:b] for a, b in correctness_spans] == [
        '"list_items"',
        '"category"',
        '"books"',
        '"offset"',
        "3",
    ]


def test_info_names_the_functions_and_the_reference():
    format_verdict = FORMAT.verify("nonsense", LIST_ROW)
    assert "Offered functions: list_items." in format_verdict.info
    assert "text outside the <tool_call> blocks" in format_verdict.info
    assert (
        '{"list_items": {"category": ["books"], "offset": [3], "limit": [10, ""]}}'
        in CORRECTNESS.verify("x", LIST_ROW).info
    )


def test_verifiers_work_as_trl_reward_functions():
    completions = [
        [{"role": "assistant", "content": call("list_items", {"category": "books", "offset": 3})}],
        [{"role": "assistant", "content": "no call"}],
    ]
    columns = {key: [LIST_ROW[key]] * 2 for key in ("tools", "ground_truth", "id")}
    prompts = [LIST_ROW["prompt"]] * 2
    assert FORMAT(prompts, completions, **columns) == [1.0, 0.0]
    assert CORRECTNESS(prompts, completions, **columns) == [1.0, 0.0]
    assert FORMAT.__name__ == "tool_format" and CORRECTNESS.__name__ == "tool_correctness"


def test_missing_column_is_a_clear_error():
    with pytest.raises(ValueError, match="'ground_truth'"):
        CORRECTNESS.verify("x", {"tools": LIST_ROW["tools"]})


FRAGMENTS = st.sampled_from(
    ["<tool_call>", "</tool_call>", "<think>", "</think>", "{", "}", "[", "]", '"', ":", ",", "\\",
     '"name"', '"arguments"', '"list_items"', '"category"', '"offset"', '"books"', "3", "2.5", "-1e5",
     "true", "null", "NaN", " ", "\n", "\u00e9", "\ud800"]
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=300), st.lists(FRAGMENTS, max_size=60).map("".join)))
def test_any_text_scores_in_range_and_never_raises(text):
    for row in (LIST_ROW, PARALLEL_ROW, MEASURE_ROW):
        for verifier in (FORMAT, CORRECTNESS):
            verdict = verifier.verify(text, row)
            assert 0.0 <= verdict.score <= 1.0
            assert all(0 <= a <= b <= len(text) for a, b in verdict.spans)


def test_task_contract():
    assert TASK.name == "tool_calling" and TASK.headline_name == "call accuracy"
    assert [v.name for v in TASK.verifiers()] == ["tool_format", "tool_correctness"]
    reference = TASK.reference_completion(MEASURE_ROW)
    assert reference.startswith("<tool_call>\n") and reference.endswith("\n</tool_call>")
    assert json.loads(reference[len("<tool_call>\n") : -len("\n</tool_call>")]) == {"name": "measure", "arguments": MEASURE_CALL}  # fmt: skip
    good = [FORMAT.verify(reference, MEASURE_ROW), CORRECTNESS.verify(reference, MEASURE_ROW)]
    bad = [FORMAT.verify("x", MEASURE_ROW), CORRECTNESS.verify("x", MEASURE_ROW)]
    partial = [
        FORMAT.verify(reference, MEASURE_ROW),
        CORRECTNESS.verify(call("measure", {"length": 5}), MEASURE_ROW),
    ]
    assert TASK.headline([good, bad, partial, good]) == {
        "call accuracy": 0.5,
        "format accuracy": 0.75,
    }
