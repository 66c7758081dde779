"""The injected-error benchmark's machinery (`benchmarks/localization.py`): each injection
changes only its span and flips exactly the intended verdicts; the ratios on hand-made
distances; one end-to-end run on the tiny model."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from mrtpo import tasks
from mrtpo.verifiers import Verdict

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import localization  # noqa: E402
import localization_errors as errors  # noqa: E402

SQL_REWARDS = ("sql_format", "sql_executable", "sql_execution")
# (task, kind) -> (the failing reward, every reward whose verdict the error changes);
# instruction kinds: the slot of the row's constraint of that id.
EXPECTED = {
    ("sql", "wrong_value"): ("sql_execution", {"sql_execution"}),
    ("sql", "misspelled_name"): ("sql_executable", {"sql_executable", "sql_execution"}),
    ("sql", "broken_tag"): ("sql_format", set(SQL_REWARDS)),
    ("sql", "extra_tag"): ("sql_format", {"sql_format"}),
    ("tool_calling", "wrong_value"): ("tool_correctness", {"tool_correctness"}),
    ("tool_calling", "wrong_argument_name"): ("tool_correctness", {"tool_correctness"}),
    ("tool_calling", "wrong_function"): ("tool_correctness", {"tool_correctness"}),
    ("tool_calling", "broken_json"): ("tool_format", {"tool_format", "tool_correctness"}),
    ("instructions", "forbidden_word"): ("keywords:forbidden_words", None),
    ("instructions", "keyword_removed"): ("keywords:existence", None),
    ("instructions", "comma_inserted"): ("punctuation:no_comma", None),
    ("instructions", "wrong_ending"): ("startend:end_checker", None),
}


@pytest.fixture(scope="module")
def rows_of():
    cache = {}

    def rows(task):
        if task.name not in cache:
            cache[task.name] = localization.task_rows(task, seed=0)
        return cache[task.name]

    return rows


def test_every_error_kind_has_an_expectation():
    assert {(kind.task, kind.name) for kind in errors.ERROR_KINDS} == set(EXPECTED)


@pytest.mark.parametrize("kind", errors.ERROR_KINDS, ids=lambda k: f"{k.task}-{k.name}")
def test_injection_changes_its_span_only_and_flips_the_intended_verdicts(kind, rows_of):
    task = tasks.get(kind.task)
    kept, counts = errors.collect_injections(kind, task, rows_of(task), n=2)
    assert len(kept) == 2, counts
    verifiers = task.verifiers()
    names = [verifier.name for verifier in verifiers]
    for injected in kept:
        reference = errors.reference_response(task, injected.row).text
        text, (start, end) = injected.candidate.text, injected.candidate.span
        kept_tail = len(text) - end
        # Outside the span the text is the reference's; inside, something changed.
        assert text[:start] == reference[:start]
        assert text[end:] == reference[len(reference) - kept_tail :]
        assert text[start:end] != reference[start : len(reference) - kept_tail]
        assert end > start

        before = [verifier.verify(reference, injected.row) for verifier in verifiers]
        after = [verifier.verify(text, injected.row) for verifier in verifiers]
        assert all(v.score is None or v.score == 1.0 for v in before)
        changed = {name for name, old, new in zip(names, before, after, strict=True) if new.score != old.score}  # fmt: skip
        assert all(new.score < old.score for old, new in zip(before, after, strict=True) if new.score != old.score)  # fmt: skip
        target, drops = EXPECTED[(kind.task, kind.name)]
        if kind.task == "instructions":
            slot = f"constraint_{list(injected.row['instruction_id_list']).index(target)}"
            target, drops = slot, {slot}
            assert sum(v.score is not None for v in before) >= 2  # a reward it does not concern
        assert injected.candidate.target == target
        assert changed == drops
        assert [v.score for v in injected.verdicts] == [v.score for v in after]


def test_built_instruction_responses_satisfy_every_constraint(rows_of):
    task = tasks.get("instructions")
    verifiers = task.verifiers()
    built = 0
    for row in rows_of(task)[:60]:
        reference = errors.build_instruction_response(row)
        supported = set(row["instruction_id_list"]) <= errors.SUPPORTED_INSTRUCTIONS
        if not supported:
            assert reference is None
            continue
        if reference is not None:
            built += 1
            assert errors.all_pass([v.verify(reference.text, row) for v in verifiers])
            for start, end in reference.anchors.values():
                assert 0 <= start < end <= len(reference.text)
    assert built >= 5


def test_replace_span_reports_where_the_new_text_is():
    assert errors.replace_span("abcdef", 2, 4, "XYZ") == ("abXYZef", (2, 5))
    assert errors.replace_span("abc", 3, 3, "!") == ("abc!", (3, 4))
    with pytest.raises(ValueError, match="outside"):
        errors.replace_span("abc", 2, 5, "x")


def test_span_ratio_on_hand_made_distances():
    in_span = np.zeros(10, dtype=bool)
    in_span[[2, 3]] = True  # 20% of the tokens
    concentrated = np.zeros(10)
    concentrated[[2, 3]] = 0.5
    assert localization.span_ratio(concentrated, in_span) == pytest.approx(5.0)
    assert localization.span_ratio(np.full(10, 0.3), in_span) == pytest.approx(1.0)
    half = np.ones(10)
    half[[2, 3]] = 4.0  # 8 of 16
    assert localization.span_ratio(half, in_span) == pytest.approx(0.5 / 0.2)
    assert localization.span_ratio(np.zeros(10), in_span) is None
    assert localization.span_ratio(np.ones(10), np.zeros(10, dtype=bool)) is None


def hand_made(target_on_span: float) -> tuple[errors.Injected, np.ndarray, np.ndarray]:
    """Four rewards over 10 tokens, the span on tokens 2-3: `a` fails (share
    `target_on_span` of its distance on the span), `b` is uniform, `c` has nothing there,
    `d` does not apply."""
    names = ["a", "b", "c", "d"]
    verdicts = [Verdict(0.0, "a"), Verdict(1.0, "b"), Verdict(1.0, "c"), Verdict(None, "")]
    candidate = errors.Candidate("x" * 10, (2, 4), "a", ("a",))
    types = [f"check:{name}" for name in names]  # what each reward checks on this row
    injected = errors.Injected("toy", "kind", {"prompt": "p"}, candidate, names, verdicts, types)
    in_span = np.zeros(10, dtype=bool)
    in_span[[2, 3]] = True
    distance = np.zeros((4, 10))
    distance[0, in_span] = target_on_span / 2
    distance[0, ~in_span] = (1 - target_on_span) / 8
    distance[1] = 0.1
    distance[2, ~in_span] = 0.2
    return injected, distance, in_span


def test_measure_and_summary_on_hand_made_distances():
    records = []
    for share in (1.0, 0.6, 0.1):  # ratios 5, 3, 0.5
        injected, distance, in_span = hand_made(share)
        records.append({**localization.measure(injected, distance, in_span, seed=0), "mode": "m"})
    first = records[0]
    assert first["unconcerned"] == ["b", "c"]
    assert set(first["ratios"]) == {"a", "b", "c"}  # d does not apply
    assert first["ratios"]["a"] == pytest.approx(5.0)
    assert first["ratios"]["b"] == pytest.approx(1.0)
    assert first["ratios"]["c"] == pytest.approx(0.0)
    assert (first["tokens"], first["span_tokens"]) == (10, 2)

    (row,) = localization.summarize(records)
    assert (row["task"], row["kind"], row["mode"], row["failing"], row["n"]) == ("toy", "kind", "m", "check:a", 3)  # fmt: skip
    assert row["median"] == pytest.approx(3.0)
    assert row["above_one"] == pytest.approx(2 / 3)
    assert row["unconcerned_median"] == pytest.approx(0.5)  # mean of b (1) and c (0)
    assert row["specificity_median"] == pytest.approx(2.5)
    assert row["ranks_first"] == pytest.approx(2 / 3)  # 0.5 < b's 1 in the third
    assert row["span_share"] == pytest.approx(0.2)

    roles = {r["reward"]: r["role"] for r in localization.per_reward_rows(records)}
    assert roles == {"check:a": "failing", "check:b": "unconcerned", "check:c": "unconcerned"}
    markdown = localization.summary_markdown([row])
    assert "| toy | kind | m | check:a | 3 | 20.0% | 3.00 | 67% | 0.50 | 2.50 | 67% |" in markdown


def test_shuffled_distance_permutes_each_reward_within_the_response():
    distance = np.arange(30, dtype=float).reshape(3, 10)
    shuffled = localization.shuffled_distance(distance, seed=1)
    assert np.array_equal(np.sort(shuffled, axis=1), distance)
    assert not np.array_equal(shuffled, distance)
    assert np.array_equal(shuffled, localization.shuffled_distance(distance, seed=1))


def test_placebo_partners_are_other_rows_with_as_many_rewards():
    from types import SimpleNamespace

    def item(row_id, rewards):
        return SimpleNamespace(row={"id": row_id}, verdicts=[None] * rewards)

    # Rows a and b each twice (two error kinds), c once, d with another number of rewards.
    injected = [item("a", 3), item("a", 3), item("b", 3), item("b", 3), item("c", 3), item("d", 2)]
    for seed in range(5):
        partners = localization.placebo_partners(injected, seed)
        assert partners == localization.placebo_partners(injected, seed)  # seeded
        for index, partner in enumerate(partners[:5]):
            assert partner is not None
            assert injected[partner].row["id"] != injected[index].row["id"]
            assert len(injected[partner].verdicts) == 3
        assert partners[5] is None  # no other row with 2 rewards
    assert localization.placebo_partners(injected, 0) != localization.placebo_partners(injected, 3)
    assert localization.placebo_partners([item("a", 3), item("a", 3)], 0) == [None, None]


def test_benchmark_runs_end_to_end_on_the_tiny_model(tiny, tmp_path, one_torch_thread):
    model, tokenizer = tiny
    # Two rows per kind, so that each response has another row's information for the placebo.
    args = localization.parse_args(["--n", "2", "--tasks", "sql", "--out", str(tmp_path)])
    result = localization.run(args, model, tokenizer)
    localization.write_outputs(result, tmp_path)
    assert len(result["records"]) == 4 * 2 * 2  # four SQL kinds, two rows, two replay modes
    moved = 0
    for record in result["records"]:
        assert set(record["ratios"]) == set(SQL_REWARDS)
        assert record["span_tokens"] >= 1
        # The placebo: the same response under another row's information, other distances.
        assert set(record["placebo"]) == set(record["ratios"])
        moved += any(
            record["placebo"][name] is not None
            and abs(record["placebo"][name] - (record["ratios"][name] or 0.0)) > 1e-6
            for name in record["ratios"]
        )
    assert moved >= 4
    assert all(row["placebo_median"] is not None for row in result["summary"])
    assert [(row["kind"], row["mode"]) for row in result["summary"]][:2] == [
        ("wrong_value", "leave_one_out"),
        ("misspelled_name", "leave_one_out"),
    ]
    for name in ("localization.md", "localization.png", "localization.json"):
        assert (tmp_path / name).stat().st_size > 0
    markdown = (tmp_path / "localization.md").read_text()
    assert "| sql | extra_tag | add_one | sql_format | 2 |" in markdown
    assert "| placebo ratio | placebo > 1 |" in markdown
    localization.main(["--report", "--out", str(tmp_path)])  # from the JSON alone
    assert (tmp_path / "localization.md").read_text() == markdown
