"""The instructions task: constraint slots, the registry entry, the headline metric, the
IFEval/IFBench loader and the bundled prompts (rebuilt here byte for byte)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from build_data import instructions as build
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mrtpo.tasks
from mrtpo.tasks.instructions import (
    DATA_DIR,
    MAX_BUNDLED_CONSTRAINTS,
    TASK,
    ConstraintSlot,
    build_constraint,
    load_ifeval,
)
from mrtpo.tasks.instructions.loader import decode_kwargs
from mrtpo.verifiers import Verdict

TWO_CONSTRAINTS = {
    "prompt": [{"role": "user", "content": "Write a line."}],
    "instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"],
    "kwargs": ["{}", '{"num_words": 3, "relation": "less than"}'],
}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# -- slots ---------------------------------------------------------------------------------


def test_a_row_with_two_constraints_scores_slots_0_and_1_and_none_for_slot_2():
    slots = [ConstraintSlot(k) for k in range(3)]
    verdicts = [slot.verify("one, two", TWO_CONSTRAINTS) for slot in slots]
    assert [v.score for v in verdicts] == [0.0, 1.0, None]
    assert verdicts[0].spans == ((3, 4),)
    assert verdicts[2] == Verdict(None, "")
    assert [slot.name for slot in slots] == ["constraint_0", "constraint_1", "constraint_2"]


def test_slots_are_trl_reward_functions_over_dataset_columns():
    columns = {key: [value, value] for key, value in TWO_CONSTRAINTS.items() if key != "prompt"}
    prompts = [TWO_CONSTRAINTS["prompt"]] * 2
    completions = [
        [{"role": "assistant", "content": "one two"}],
        [{"role": "assistant", "content": "a, b, c, d"}],
    ]
    assert ConstraintSlot(0)(prompts, completions, **columns) == [1.0, 0.0]
    assert ConstraintSlot(1)(prompts, completions, **columns) == [1.0, 0.0]
    assert ConstraintSlot(2)(prompts, completions, **columns) == [None, None]
    assert ConstraintSlot(1).__name__ == "constraint_1"


def test_slots_read_every_kwargs_layout():
    as_dicts = {
        **TWO_CONSTRAINTS,
        "kwargs": [{}, {"num_words": 3, "relation": "less than", "language": None}],
    }
    as_one_string = {
        **TWO_CONSTRAINTS,
        "kwargs": json.dumps([{}, {"num_words": 3, "relation": "less than"}]),
    }
    for example in (TWO_CONSTRAINTS, as_dicts, as_one_string):
        assert ConstraintSlot(1).verify("a b c", example).score == 0.0
        assert ConstraintSlot(1).verify("a b", example).score == 1.0
    with pytest.raises(ValueError, match="kwargs must hold 2 entries"):
        decode_kwargs(["{}"], 2)


def test_slot_index_must_be_a_non_negative_int():
    for bad in (-1, 1.0, True):
        with pytest.raises(ValueError, match="index must be an int >= 0"):
            ConstraintSlot(bad)


# -- task -------------------------------------------------------------------------------------


def test_registry_entry():
    task = mrtpo.tasks.get("instructions")
    assert task is TASK
    assert task.name == "instructions"
    assert task.headline_name == "prompt-level strict accuracy"
    assert [v.name for v in task.verifiers()] == [
        f"constraint_{k}" for k in range(MAX_BUNDLED_CONSTRAINTS)
    ]
    assert [v.name for v in task.verifiers(max_constraints=2)] == ["constraint_0", "constraint_1"]
    with pytest.raises(ValueError, match="max_constraints"):
        task.verifiers(max_constraints=0)
    assert task.reference_completion({"prompt": "anything"}) is None


def test_headline_gives_prompt_and_instruction_level_strict_accuracy():
    rows = [
        [Verdict(1.0, ""), Verdict(1.0, ""), Verdict(None, "")],  # all followed
        [Verdict(1.0, ""), Verdict(0.0, ""), Verdict(None, "")],  # one of two
        [Verdict(0.0, ""), Verdict(None, ""), Verdict(None, "")],  # none
        [Verdict(1.0, ""), Verdict(1.0, ""), Verdict(1.0, "")],  # all three
    ]
    assert TASK.headline(rows) == {
        "prompt-level strict accuracy": 2 / 4,
        "instruction-level strict accuracy": 6 / 8,
    }


def test_bundled_splits_load_with_the_task_columns():
    train, test = TASK.load("train"), TASK.load("test")
    assert (len(train), len(test)) == (320, 80)
    assert train.column_names == ["prompt", "key", "instruction_id_list", "kwargs"]
    assert not set(train["key"]) & set(test["key"])
    row = test[0]
    assert row["prompt"][0] == {"role": "system", "content": TASK.system_prompt}
    assert row["prompt"][1]["role"] == "user"
    assert len(row["kwargs"]) == len(row["instruction_id_list"])
    assert all(isinstance(json.loads(entry), dict) for entry in row["kwargs"])
    with pytest.raises(ValueError, match="split must be"):
        TASK.load("validation")


# -- bundled data -------------------------------------------------------------------------


def bundled_rows():
    return [
        json.loads(line)
        for name in ("train", "test")
        for line in (DATA_DIR / f"{name}.jsonl").open()
    ]


def test_bundled_prompts_have_1_to_6_compatible_constraints():
    rows = bundled_rows()
    assert len(rows) >= 300
    sizes = Counter(len(row["instruction_id_list"]) for row in rows)
    assert set(sizes) == set(range(1, MAX_BUNDLED_CONSTRAINTS + 1))
    used = Counter(i for row in rows for i in row["instruction_id_list"])
    assert len(used) == 25  # every IFEval instruction appears
    for row in rows:
        constraints = list(zip(row["instruction_id_list"], row["kwargs"], strict=True))
        assert len(set(row["instruction_id_list"])) == len(constraints)
        for a, (a_id, a_args) in enumerate(constraints):
            build_constraint(a_id, a_args)
            for b_id, b_args in constraints[a + 1 :]:
                assert b_id not in build.CONFLICTS[a_id], (row["key"], a_id, b_id)
                assert not build.arguments_conflict((a_id, a_args), (b_id, b_args)), row["key"]
        if "combination:repeat_prompt" in row["instruction_id_list"]:
            kwargs = row["kwargs"][row["instruction_id_list"].index("combination:repeat_prompt")]
            assert row["prompt"].startswith(
                kwargs["prompt_to_repeat"] + " First repeat the request"
            )
        assert len(row["prompt"]) < 800


def test_the_conflict_table_holds_the_obvious_contradictions():
    pairs = [
        ("change_case:english_lowercase", "change_case:capital_word_frequency"),
        ("change_case:english_lowercase", "change_case:english_capital"),
        ("detectable_format:json_format", "detectable_format:number_bullet_lists"),
        ("detectable_format:json_format", "detectable_format:title"),
        ("language:response_language", "keywords:existence"),
        ("combination:two_responses", "combination:repeat_prompt"),
        ("startend:quotation", "detectable_format:json_format"),
    ]
    for a, b in pairs:
        assert b in build.CONFLICTS[a] and a in build.CONFLICTS[b]
    words = ("length_constraints:number_words", {"num_words": 40, "relation": "less than"})
    many_sentences = (
        "length_constraints:number_sentences",
        {"num_sentences": 6, "relation": "at least"},
    )
    few_sentences = (
        "length_constraints:number_sentences",
        {"num_sentences": 3, "relation": "at least"},
    )
    assert build.arguments_conflict(words, many_sentences)
    assert build.arguments_conflict(many_sentences, words)
    assert not build.arguments_conflict(words, few_sentences)
    few_z = (
        "keywords:letter_frequency",
        {"letter": "z", "let_frequency": 2, "let_relation": "less than"},
    )
    assert build.arguments_conflict(few_z, ("keywords:existence", {"keywords": ["zebra"]}))
    assert not build.arguments_conflict(few_z, ("keywords:existence", {"keywords": ["river"]}))


def test_the_build_script_reproduces_the_bundled_files(tmp_path):
    build.main(["--out", str(tmp_path)])
    for name in ("train.jsonl", "test.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA_DIR / name).read_bytes()


# -- loader -----------------------------------------------------------------------------------

GOOGLE_ROW = {
    "key": 7,
    "prompt": "Write a haiku. Do not use commas. Answer with less than 20 words.",
    "instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"],
    "kwargs": [{}, {"num_words": 20, "relation": "less than"}],
}
HF_NULLS = {
    "num_words": None,
    "relation": None,
    "keywords": None,
    "language": None,
    "end_phrase": None,
}


def test_google_and_hugging_face_kwargs_layouts_load_the_same(tmp_path):
    hf_row = {
        **GOOGLE_ROW,
        "kwargs": [dict(HF_NULLS), {**HF_NULLS, "num_words": 20, "relation": "less than"}],
    }
    google = load_ifeval(write_jsonl(tmp_path / "google.jsonl", [GOOGLE_ROW]))
    hugging_face = load_ifeval(write_jsonl(tmp_path / "hf.jsonl", [hf_row]))
    assert google.to_list() == hugging_face.to_list()
    row = google[0]
    assert row["key"] == 7
    assert row["prompt"][1] == {"role": "user", "content": GOOGLE_ROW["prompt"]}
    assert row["kwargs"] == ["{}", '{"num_words": 20, "relation": "less than"}']


def test_files_with_unknown_ids_fail_or_are_skipped(tmp_path):
    rows = [
        {
            "key": "a",
            "prompt": "P1",
            "instruction_id_list": ["count:nothing"],
            "kwargs": [{**HF_NULLS, "N": 3}],
        },
        {
            "key": "b",
            "prompt": "P2",
            "instruction_id_list": ["format:nothing", "punctuation:no_comma"],
            "kwargs": [dict(HF_NULLS), dict(HF_NULLS)],
        },
    ]
    path = write_jsonl(tmp_path / "ifbench.jsonl", rows)
    with pytest.raises(
        ValueError, match=r"2 unknown instruction ids: count:nothing \(1\), format:nothing \(1\)"
    ):
        load_ifeval(path)
    with pytest.warns(
        UserWarning, match="skipped 2 instructions with unknown ids.*kept 1 of 2 rows"
    ):
        dataset = load_ifeval(path, skip_unknown=True)
    assert dataset["key"] == ["b"]
    assert dataset["instruction_id_list"] == [["punctuation:no_comma"]]
    assert dataset["kwargs"] == [["{}"]]


def test_bad_rows_name_the_row(tmp_path):
    bad = {**GOOGLE_ROW, "kwargs": [{}, {"num_words": 20, "relation": "roughly"}]}
    with pytest.raises(
        ValueError, match="row key=7: length_constraints:number_words: kwarg 'relation'"
    ):
        load_ifeval(write_jsonl(tmp_path / "bad.jsonl", [bad]))
    short = {**GOOGLE_ROW, "kwargs": [{}]}
    with pytest.raises(ValueError, match="row key=7: kwargs must hold 2 entries"):
        load_ifeval(write_jsonl(tmp_path / "short.jsonl", [short]))
    with pytest.raises(ValueError, match="is not a file"):
        load_ifeval(tmp_path / "missing.jsonl")


def test_the_real_ifeval_file_loads_and_every_instruction_checks(shared_benchmarks):
    dataset = TASK.load(path=str(shared_benchmarks / "ifeval" / "input_data.jsonl"))
    assert len(dataset) == 541
    assert dataset.column_names == ["prompt", "key", "instruction_id_list", "kwargs"]
    counts = Counter(i for ids in dataset["instruction_id_list"] for i in ids)
    assert len(counts) == 25 and sum(counts.values()) == 834
    slots = TASK.verifiers(max_constraints=3)
    for row in dataset:
        scores = [slot.verify("A short answer, in English.", row).score for slot in slots]
        assert scores[: len(row["instruction_id_list"])].count(None) == 0
        assert scores[len(row["instruction_id_list"]) :] == [None] * (
            3 - len(row["instruction_id_list"])
        )


def test_the_real_ifbench_file_loads(shared_benchmarks):
    # IFBench's ids are known since its checkers were added (tests/test_ifbench.py checks more).
    path = shared_benchmarks / "ifbench" / "IFBench_test.jsonl"
    assert len(TASK.load(path=str(path))) == 300


BUNDLED_TEST_ROWS = TASK.load("test").to_list()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(BUNDLED_TEST_ROWS), st.text(max_size=300))
def test_every_slot_of_a_bundled_row_scores_any_text_in_range(row, response):
    n_constraints = len(row["instruction_id_list"])
    for slot in TASK.verifiers():
        verdict = slot.verify(response, row)
        if slot.index < n_constraints:
            assert verdict.score in (0.0, 1.0)
        else:
            assert verdict == Verdict(None, "")
