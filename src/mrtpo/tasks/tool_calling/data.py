"""Reading BFCL's question and answer files (v3/v4) into the task's dataset rows.

BFCL files are JSON *lines* despite their `.json` suffix. A question row is
`{"id", "question": [[{"role", "content"}, ...]], "function": [{"name", "description",
"parameters": {"type": "dict", "properties", "required"}}]}`; an answer row (in
`possible_answer/<same file name>`) is `{"id", "ground_truth": [{name: {param: [allowed]}}]}`.
Categories simple, multiple, parallel and parallel_multiple share this shape. The bundled data
is written in the same format, so one reader serves both.

Rows: `prompt` (system message with the instructions and the offered functions, then the
question's messages), `tools` (the offered functions as chat-template tools, JSON text),
`ground_truth` (BFCL's possible answer, JSON text), `id`.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from datasets import Dataset

from mrtpo.tasks.tool_calling.prompt import SYSTEM_PROMPT, function_tool, system_message

BUNDLED_DIR = Path(__file__).resolve().parents[2] / "data" / "tool_calling"
BFCL_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")


def bfcl_data_dir() -> Path | None:
    """The `data/` folder of the installed bfcl-eval wheel (found without importing it), or None."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    return folder if folder.is_dir() else None


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON Lines file (blank lines skipped)."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number} is not a JSON line: {error}") from None
            if not isinstance(row, dict) or "id" not in row:
                raise ValueError(f"{path}:{number} must be a JSON object with an 'id'")
            rows.append(row)
    return rows


def _check_ground_truth(ground_truth: Any, where: str) -> list[dict[str, dict[str, list[Any]]]]:
    """BFCL's possible-answer shape: a non-empty list of {name: {param: [allowed values]}}."""
    if not isinstance(ground_truth, list) or not ground_truth:
        raise ValueError(f"{where}: ground_truth must be a non-empty list of calls")
    for call in ground_truth:
        if not (isinstance(call, dict) and len(call) == 1):
            raise ValueError(
                f"{where}: each ground_truth call must be {{name: {{param: [values]}}}}"
            )
        ((name, params),) = call.items()
        if not isinstance(params, dict) or not all(isinstance(v, list) for v in params.values()):
            raise ValueError(
                f"{where}: the parameters of {name!r} must map names to lists of allowed values"
            )
    return ground_truth


def _question_messages(question: Any, where: str) -> list[dict[str, str]]:
    """The question's turns flattened into one list of messages."""
    if not isinstance(question, list) or not all(isinstance(turn, list) for turn in question):
        raise ValueError(f"{where}: question must be a list of turns, each a list of messages")
    messages = [message for turn in question for message in turn]
    for message in messages:
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise ValueError(f"{where}: each message needs a string 'role' and 'content'")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def bfcl_row(
    question_row: dict[str, Any], ground_truth: Any, system_prompt: str = SYSTEM_PROMPT
) -> dict[str, Any]:
    """One dataset row from a BFCL question row and its ground truth."""
    where = f"id {question_row['id']!r}"
    functions = question_row.get("function")
    if not isinstance(functions, list) or not all(
        isinstance(f, dict) and "name" in f for f in functions
    ):
        raise ValueError(f"{where}: function must be a list of function descriptions with a 'name'")
    tools = [function_tool(function) for function in functions]
    messages = _question_messages(question_row.get("question"), where)
    if messages and messages[0]["role"] == "system":  # one system message: ours, then theirs
        system_prompt = system_prompt + "\n\n" + messages.pop(0)["content"]
    return {
        "prompt": [system_message(tools, system_prompt), *messages],
        "tools": json.dumps(tools, ensure_ascii=False),
        "ground_truth": json.dumps(_check_ground_truth(ground_truth, where), ensure_ascii=False),
        "id": str(question_row["id"]),
    }


def load_bfcl(
    questions_path: str | Path,
    answers_path: str | Path | None = None,
    system_prompt: str = SYSTEM_PROMPT,
) -> Dataset:
    """A dataset from BFCL question and answer files (JSON Lines).

    answers_path defaults to `possible_answer/<same file name>` beside the questions.
    Raises ValueError naming the first question id that has no answer.
    """
    questions_path = Path(questions_path)
    if not questions_path.is_file():
        raise ValueError(f"questions_path {questions_path} is not a file")
    answers_path = (
        Path(answers_path)
        if answers_path
        else questions_path.parent / "possible_answer" / questions_path.name
    )
    if not answers_path.is_file():
        raise ValueError(f"answers_path {answers_path} is not a file")
    answers = {row["id"]: row.get("ground_truth") for row in read_json_lines(answers_path)}
    questions = read_json_lines(questions_path)
    missing = [row["id"] for row in questions if row["id"] not in answers]
    if missing:
        raise ValueError(
            f"answers_path {answers_path} has no answer for id {missing[0]!r}"
            + (f" (nor for {len(missing) - 1} more ids)" if len(missing) > 1 else "")
        )
    rows = [bfcl_row(row, answers[row["id"]], system_prompt) for row in questions]
    if not rows:
        raise ValueError(f"questions_path {questions_path} holds no questions")
    return Dataset.from_list(rows)
