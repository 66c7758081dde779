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

`load_bfcl_categories` reads BFCL v4's single-turn categories (a data folder, or one
category's file) with three more columns: `category`, `language` and `functions` (BFCL's own
function descriptions, which its checker reads; the prompt shows them prepared per language
as BFCL's prompts do).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from collections.abc import Sequence
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
    """One dataset row from a BFCL question row and its ground truth (None: the category has
    no answers, as irrelevance, where the right answer calls nothing; stored as [])."""
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
        "ground_truth": json.dumps(
            [] if ground_truth is None else _check_ground_truth(ground_truth, where),
            ensure_ascii=False,
        ),
        "id": str(question_row["id"]),
    }


def _answered_questions(
    questions_path: Path, answers_path: Path | None, limit: int | None = None
) -> list[tuple[dict[str, Any], Any]]:
    """(question row, its ground truth) for the first `limit` questions (all when None);
    answers_path None: the questions have no answers (ground truth None)."""
    if not questions_path.is_file():
        raise ValueError(f"questions_path {questions_path} is not a file")
    questions = read_json_lines(questions_path)[:limit]
    if not questions:
        raise ValueError(f"questions_path {questions_path} holds no questions")
    if answers_path is None:
        return [(row, None) for row in questions]
    if not answers_path.is_file():
        raise ValueError(f"answers_path {answers_path} is not a file")
    answers = {row["id"]: row.get("ground_truth") for row in read_json_lines(answers_path)}
    missing = [row["id"] for row in questions if row["id"] not in answers]
    if missing:
        raise ValueError(
            f"answers_path {answers_path} has no answer for id {missing[0]!r}"
            + (f" (nor for {len(missing) - 1} more ids)" if len(missing) > 1 else "")
        )
    return [(row, answers[row["id"]]) for row in questions]


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
    answers_path = (
        Path(answers_path)
        if answers_path
        else questions_path.parent / "possible_answer" / questions_path.name
    )
    pairs = _answered_questions(questions_path, answers_path)
    return Dataset.from_list([bfcl_row(row, answer, system_prompt) for row, answer in pairs])


# -- BFCL v4's single-turn categories ------------------------------------------------------

# In BFCL's leaderboard order.
SINGLE_TURN_CATEGORIES = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_irrelevance",
    "live_relevance",
)
# Categories without answers: the rule is about whether the response calls at all.
CALL_RULES = {"irrelevance": "none", "live_irrelevance": "none", "live_relevance": "some"}
CATEGORY_LANGUAGES = {"simple_java": "java", "simple_javascript": "javascript"}
# BFCL v3's file names of the categories v4 renamed.
V3_NAMES = {"simple": "simple_python", "java": "simple_java", "javascript": "simple_javascript"}
_FILE_NAME = re.compile(r"BFCL_v(\d+)_(\w+)\.json")

LANGUAGE_NOTES = {
    "python": "The function is written in Python 3 syntax.",
    "java": "The function is written in Java 8 SDK syntax.",
    "javascript": "The function is written in JavaScript syntax.",
}
LANGUAGE_NAMES = {"java": "Java", "javascript": "JavaScript"}


def bfcl_category(path: Path) -> tuple[int, str] | None:
    """(BFCL version, single-turn category) named by a file name such as
    `BFCL_v4_simple_python.json` (v3's simple/java/javascript read as v4's names), or None."""
    match = _FILE_NAME.fullmatch(path.name)
    if match is None:
        return None
    name = V3_NAMES.get(match.group(2), match.group(2)) if match.group(1) == "3" else match.group(2)
    return (int(match.group(1)), name) if name in SINGLE_TURN_CATEGORIES else None


def bfcl_category_files(folder: Path) -> dict[str, Path]:
    """{category: question file} of the single-turn categories in a BFCL data folder (the
    newest version where several are present), in leaderboard order."""
    found: dict[str, tuple[int, Path]] = {}
    for path in folder.glob("BFCL_v*.json"):
        named = bfcl_category(path)
        if named is not None and named[0] >= found.get(named[1], (-1, path))[0]:
            found[named[1]] = (named[0], path)
    return {name: found[name][1] for name in SINGLE_TURN_CATEGORIES if name in found}


def language_hinted(functions: list[dict[str, Any]], language: str) -> list[dict[str, Any]]:
    """The function descriptions as the prompt shows them, the way BFCL prepares them: each
    description says the language; in Java and JavaScript every parameter becomes a string
    holding the value's literal, its description naming the declared type (and the element
    type of arrays, the entries of JavaScript dicts), as BFCL's checker expects."""
    hinted = copy.deepcopy(functions)
    for function in hinted:
        function["description"] = f"{function.get('description', '')} {LANGUAGE_NOTES[language]}"
        if language == "python":
            continue
        properties = (function.get("parameters") or {}).get("properties") or {}
        name = LANGUAGE_NAMES[language]
        for schema in properties.values():
            declared = schema.get("type")
            note = (
                f"Any {name} object, given as a string holding its {name} representation."
                if declared == "any"
                else f"A {name} {declared}, given as a string holding its {name} literal."
            )
            items = schema.pop("items", None)
            if isinstance(items, dict) and "type" in items:
                note += f" Its elements are of type {items['type']}."
            entries = schema.pop("properties", None) if declared == "dict" else None
            if entries:
                note += f" Its entries: {json.dumps(entries, ensure_ascii=False)}."
            schema["description"] = f"{schema.get('description', '')} {note}".strip()
            schema["type"] = "string"
    return hinted


def bfcl_category_row(
    question_row: dict[str, Any], ground_truth: Any, category: str, system_prompt: str
) -> dict[str, Any]:
    """A BFCL row with the benchmark's columns: the prompt offers the functions as BFCL's
    prompts do (`language_hinted`); `functions` keeps BFCL's own descriptions (JSON text), the
    ones its checker reads, with `category` and `language`."""
    language = CATEGORY_LANGUAGES.get(category, "python")
    functions = question_row.get("function")
    hinted = dict(question_row)
    if isinstance(functions, list) and all(isinstance(f, dict) for f in functions):
        hinted["function"] = language_hinted(functions, language)
    row = bfcl_row(hinted, ground_truth, system_prompt)
    row.update(
        category=category,
        language=language,
        functions=json.dumps(functions, ensure_ascii=False),
    )
    return row


def load_bfcl_categories(
    path: str | Path,
    categories: Sequence[str] | None = None,
    max_examples: int | None = None,
    system_prompt: str = SYSTEM_PROMPT,
) -> Dataset | None:
    """BFCL's single-turn categories at `path`: a data folder (the `categories` present, by
    default all of `SINGLE_TURN_CATEGORIES` there) or one category's question file; the
    first `max_examples` questions of each. None when `path` is a file whose name is not a
    BFCL category's. Answers are read from `possible_answer/<same file name>`, except for the
    categories of `CALL_RULES`, which have none."""
    path = Path(path)
    if path.is_dir():
        files = bfcl_category_files(path)
        if not files:
            raise ValueError(f"{path} holds no BFCL single-turn file (BFCL_v4_<category>.json)")
    else:
        named = bfcl_category(path)
        if named is None:
            return None
        files = {named[1]: path}
    if categories:
        unknown = [name for name in categories if name not in files]
        if unknown:
            raise ValueError(
                f"categories {', '.join(unknown)} are not in {path} "
                f"(it has {', '.join(files) or 'none'})"
            )
        files = {name: file for name, file in files.items() if name in categories}
    rows = []
    for category, questions_path in files.items():
        answers_path = (
            None
            if category in CALL_RULES
            else questions_path.parent / "possible_answer" / questions_path.name
        )
        for question, answer in _answered_questions(questions_path, answers_path, max_examples):
            rows.append(bfcl_category_row(question, answer, category, system_prompt))
    return Dataset.from_list(rows)
