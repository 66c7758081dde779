"""The custom-task guide's worked example (docs/examples/arithmetic_task.py), run as the page
shows it: the page includes that very file, and these tests import and run it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from mrtpo import tasks
from mrtpo.evaluation import score_responses
from mrtpo.testing import tiny_model_and_tokenizer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "docs" / "examples" / "arithmetic_task.py"
GUIDE = ROOT / "docs" / "guides" / "custom-task.md"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("arithmetic_task", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_guide_shows_the_tested_file():
    assert f'--8<-- "{EXAMPLE.relative_to(ROOT).as_posix()}"' in GUIDE.read_text()


@pytest.mark.parametrize(
    "completion, format_score, correct_score",
    [
        ("12 + 30 = 42. <answer>42</answer>", 1.0, 1.0),
        ("<answer> 41 </answer>", 1.0, 0.0),
        ("The result is 42.", 0.0, 0.0),
        ("<answer>forty-two</answer>", 0.0, 0.0),
        ("<answer>1</answer> no, <answer>42</answer>", 0.0, 1.0),
    ],
)
def test_the_two_rewards(example, completion, format_score, correct_score):
    row = {"answer": 42}
    answer_format, answer_correct = example.TASK.verifiers()
    assert answer_format.verify(completion, row).score == format_score
    assert answer_correct.verify(completion, row).score == correct_score


def test_information_and_spans_say_what_was_checked(example):
    answer_format, answer_correct = example.AnswerFormat(), example.AnswerCorrect()
    text = "Since 6 * 7 = 42: <answer>42</answer>"
    verdict = answer_correct.verify(text, {"answer": 42})
    assert verdict.info == "The correct result is 42."
    assert [text[a:b] for a, b in verdict.spans] == ["42"]
    assert verdict.spans == ((26, 28),)  # the answer's digits, not the 42 of the reasoning
    verdict = answer_format.verify(text, {"answer": 42})
    assert [text[a:b] for a, b in verdict.spans] == ["<answer>42</answer>"]
    broken = answer_format.verify("<answer>4</answer><answer>2</answer>", {"answer": 42})
    assert broken.info.endswith("Here: 2 <answer> blocks.")
    assert len(broken.spans) == 2


def test_the_data_and_the_reference_responses(example, tmp_path):
    train, test = example.TASK.load("train"), example.TASK.load("test")
    assert (len(train), len(test)) == (64, 16)
    assert train[0] == example.TASK.load("train")[0]  # seeded
    for row in test:
        reference = example.TASK.reference_completion(row)
        assert [v.verify(reference, row).score for v in example.TASK.verifiers()] == [1.0, 1.0]
    user_file = tmp_path / "mine.jsonl"
    user_file.write_text(json.dumps({"question": "What is 2 + 2?", "answer": 4}) + "\n")
    (row,) = example.TASK.load(path=str(user_file)).to_list()
    assert row["prompt"][-1]["content"] == "What is 2 + 2?" and row["answer"] == 4


def test_scored_as_mrtpo_eval_scores(example):
    rows = example.TASK.load("test").to_list()[:2]
    right = example.TASK.reference_completion(rows[0])
    result = score_responses(example.TASK, rows, [right, "no idea"])
    assert result["verifiers"] == {"answer_format": 0.5, "answer_correct": 0.5}
    assert result["headline"] == {"accuracy": 0.5}


def test_register_makes_the_task_known_by_name(example, monkeypatch):
    monkeypatch.setattr(tasks, "TASKS", dict(tasks.TASKS))
    example.register()
    assert tasks.get("arithmetic") is example.TASK


@pytest.mark.slow
def test_two_mrtpo_steps_on_the_tiny_model(example, tmp_path):
    model, tokenizer = tiny_model_and_tokenizer()
    trainer = example.train(
        model, tokenizer, tmp_path, max_steps=2, max_completion_length=8,
        use_cpu=True, bf16=False, disable_tqdm=True, seed=0,
    )  # fmt: skip
    assert trainer.state.global_step == 2
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in logged if "loss" in line]
    assert [line["step"] for line in steps] == [1, 2]
    for line in steps:
        assert 0 <= line["rewards/answer_format/mean"] <= 1
        assert 0 <= line["rewards/answer_correct/mean"] <= 1
