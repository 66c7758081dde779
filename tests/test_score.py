"""`mrtpo score`: the scoring of `mrtpo eval` on answers made elsewhere, with no model.

`mrtpo eval` is generation followed by the same scoring: its own completions, scored again by
`mrtpo score`, give the same verdicts and numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

from mrtpo import cli
from mrtpo.tasks.tool_calling import TASK


def run_cli(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_answers(path: Path, answers: dict[str, str]) -> Path:
    path.write_text("\n".join(json.dumps({"id": k, "response": v}) for k, v in answers.items()))
    return path


def test_score_reference_answers_on_the_bundled_split(tmp_path, capsys):
    rows = TASK.load("test").to_list()
    answers = write_answers(
        tmp_path / "answers.jsonl", {row["id"]: TASK.reference_completion(row) for row in rows}
    )
    out = tmp_path / "out"
    code, stdout, _ = run_cli(["score", "--task", "tool_calling", "--responses", str(answers),
                               "--output_dir", str(out)], capsys)  # fmt: skip
    assert code == 0
    report = json.loads((out / "eval.json").read_text())
    assert report["headline"] == {"call accuracy": 1.0, "format accuracy": 1.0}
    assert report["num_examples"] == len(rows) and "benchmark" not in report
    assert "tool_calling test (bundled)" in stdout and "call accuracy" in stdout


def test_score_is_evals_scoring(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "eval"
    code, _, _ = run_cli(["eval", "--task", "tool_calling", "--model_name_or_path",
        str(tiny_model_dir), "--max_examples", "3", "--max_new_tokens", "12",
        "--output_dir", str(out)], capsys)  # fmt: skip
    assert code == 0
    evaluated = json.loads((out / "eval.json").read_text())
    answers = write_answers(
        tmp_path / "answers.jsonl", {e["id"]: e["completion"] for e in evaluated["examples"]}
    )
    scored_dir = tmp_path / "score"
    code, _, _ = run_cli(["score", "--task", "tool_calling", "--responses", str(answers),
        "--max_examples", "3", "--output_dir", str(scored_dir)], capsys)  # fmt: skip
    assert code == 0
    scored = json.loads((scored_dir / "eval.json").read_text())
    assert scored["verifiers"] == evaluated["verifiers"]
    assert scored["headline"] == evaluated["headline"]
    assert [e["verdicts"] for e in scored["examples"]] == [
        e["verdicts"] for e in evaluated["examples"]
    ]


def test_score_needs_an_answer_for_every_example_unless_partial(tmp_path, capsys):
    rows = TASK.load("test").to_list()
    answers = {row["id"]: TASK.reference_completion(row) for row in rows[:2]}
    answers["not-an-example"] = "hello"
    path = write_answers(tmp_path / "answers.jsonl", answers)
    argv = ["score", "--task", "tool_calling", "--responses", str(path),
            "--output_dir", str(tmp_path / "out")]  # fmt: skip
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and f"no answer for {len(rows) - 2} of the {len(rows)} examples" in err
    code, _, _ = run_cli([*argv, "--partial"], capsys)
    report = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert code == 0 and report["num_examples"] == 2 and report["unmatched_answers"] == 1
    assert report["headline"]["call accuracy"] == 1.0


def test_score_errors_are_one_line(tmp_path, capsys):
    base = ["score", "--task", "tool_calling", "--output_dir", str(tmp_path / "out")]
    code, _, err = run_cli(base, capsys)
    assert code == 2 and "--responses is required" in err
    code, _, err = run_cli([*base, "--responses", str(tmp_path / "absent.jsonl")], capsys)
    assert code == 2 and "does not exist" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "simple_4", "response": "x"}\nnot json\n')
    code, _, err = run_cli([*base, "--responses", str(bad)], capsys)
    assert code == 2 and "bad.jsonl:2 is not a JSON line" in err
    bad.write_text('{"id": "simple_4", "text": "x"}\n')
    code, _, err = run_cli([*base, "--responses", str(bad)], capsys)
    assert code == 2 and 'needs a "response" string' in err
    code, _, err = run_cli(
        [*base, "--responses", str(bad), "--categories", "simple_python"], capsys
    )
    assert code == 2 and "categories ['simple_python'] apply to a benchmark folder" in err
