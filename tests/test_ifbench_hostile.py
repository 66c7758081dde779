"""Every constraint checker, IFEval's and IFBench's, answers hostile responses of 200,000
characters (brackets, newlines, commas, asterisks, nested JSON) in under a second: the checks
run in time linear in the response (a lazy `\\[.*?\\]` rescanned from every bracket took
112 s on 200,000 `[`)."""

from __future__ import annotations

import time

import pytest
from test_ifbench_agreement import CASES
from test_instructions_checkers import ONE_KWARGS_PER_ID

from mrtpo.tasks.instructions import (
    CHECKERS,
    IFBENCH_CHECKERS,
    build_constraint,
    ifbench_text,
    text,
)

LENGTH = 200_000
SECONDS = 1.0


def nested_json(length: int) -> str:
    depth = length // 7
    return ('{"a": ' * depth + "1" + "}" * depth)[:length]


HOSTILE = {
    "[": "[" * LENGTH,
    "(": "(" * LENGTH,
    "{": "{" * LENGTH,
    "<": "<" * LENGTH,
    "newlines": "\n" * LENGTH,
    "newlines between words": "x" + "\n" * (LENGTH - 2) + "x",
    ",": "," * LENGTH,
    "*": "*" * LENGTH,
    "nested JSON": nested_json(LENGTH),
    "[ then a newline": "[" * (LENGTH // 2) + "\n" + "]" * (LENGTH // 2 - 1),
}
KWARGS = {
    **ONE_KWARGS_PER_ID,
    **{instruction_id: cases[0][0] for instruction_id, cases in CASES.items()},
}


def test_every_checker_is_timed():
    assert set(KWARGS) == set(CHECKERS) | set(IFBENCH_CHECKERS)


@pytest.fixture(scope="module", autouse=True)
def loaded_models():
    """Models load once, on first use; they are not what is timed."""
    text.detect_language("a few words of English")
    ifbench_text.pos_tagger()
    ifbench_text.english_stopwords()


@pytest.mark.parametrize("instruction_id", sorted(KWARGS))
def test_hostile_responses_get_a_verdict_in_under_a_second(instruction_id):
    constraint = build_constraint(instruction_id, KWARGS[instruction_id])
    for name, response in HOSTILE.items():
        # CPU time of this process: other jobs on a shared machine do not count against it.
        started = time.process_time()
        verdict = constraint.check(response)
        seconds = time.process_time() - started
        assert verdict.score in (0.0, 1.0)
        assert seconds < SECONDS, f"{name}: {seconds:.2f} s"
