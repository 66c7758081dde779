"""MulDimIF's layout: `load_muldimif(path)` and `is_muldimif_file(path)`.

MulDimIF ("A Multi-Dimensional Constraint Framework for Evaluating and Improving Instruction
Following in Large Language Models", github.com/Junjie-Ye/MulDimIF) publishes its test and
training sets as one JSON list of rows `{id, conversations, constraints, constraint_pattern,
difficulty}`: `conversations` the chat (`{role, content}`, or ShareGPT's `{from, value}`), each
constraint `[category, subtype, the constraint's own words]`, the pattern Example, Listing or
Incorporation, the difficulty "Level 1" to "Level 4".

A row becomes a dataset row of the instructions task, so that `ConstraintSlot(k)` verifies its
k-th constraint as it verifies IFEval's and IFBench's:
- `prompt`: the system prompt, then the conversation up to its last user message (a training
  row's trailing assistant answer is left out);
- `key`: the row's `id`, as text;
- `instruction_id_list`: `muldimif/<category>/<subtype>` per constraint, in the row's order;
- `kwargs`: one JSON string per constraint, `{"constraint": <its words>}`;
- `constraint_pattern` and `difficulty` as given.

The words are parsed into a rule when the row is loaded (`muldimif_checkers`): a constraint
the checkers cannot read is an error naming the row's id and the words, never a silent pass.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from datasets import Dataset, Features, Value

from mrtpo.tasks.instructions.loader import SYSTEM_PROMPT
from mrtpo.tasks.instructions.muldimif_checkers import instruction_id, parse_constraint

PATTERNS = ("Example", "Listing", "Incorporation")
LEVELS = ("Level 1", "Level 2", "Level 3", "Level 4")
ROW_FIELDS = ("id", "conversations", "constraints", "constraint_pattern", "difficulty")


def is_muldimif_file(path: str | Path) -> bool:
    """Whether `path` is a file holding a JSON list whose first row has MulDimIF's fields
    (IFEval's and IFBench's files are JSON Lines of objects, never a list)."""
    path = Path(path)
    if not path.is_file():
        return False
    with path.open(encoding="utf-8") as text:
        start = text.read(4096).lstrip()
    if not start.startswith("["):
        return False
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return False
    return (
        isinstance(rows, list)
        and bool(rows)
        and isinstance(rows[0], dict)
        and all(name in rows[0] for name in ("conversations", "constraints"))
    )


def _messages(row_id: str, conversations: Any) -> list[dict[str, str]]:
    """The conversation as `{role, content}` messages, up to its last user message."""
    if not isinstance(conversations, list) or not conversations:
        raise ValueError(f"row id={row_id!r}: conversations must be a non-empty list")
    messages = []
    for message in conversations:
        if not isinstance(message, dict):
            raise ValueError(f"row id={row_id!r}: each message must be an object, got {message!r}")
        role = message.get("role", message.get("from"))
        content = message.get("content", message.get("value"))
        role = {"human": "user", "gpt": "assistant"}.get(role, role)
        if role not in ("system", "user", "assistant") or not isinstance(content, str):
            raise ValueError(
                f"row id={row_id!r}: a message needs a role (system, user or assistant) and a "
                f"content string, got {message!r}"
            )
        messages.append({"role": role, "content": content})
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise ValueError(f"row id={row_id!r}: the conversation has no user message")
    return messages[: last_user + 1]


def _constraints(row_id: str, constraints: Any) -> list[tuple[str, str, str]]:
    if not isinstance(constraints, list) or not constraints:
        raise ValueError(f"row id={row_id!r}: constraints must be a non-empty list")
    parsed = []
    for constraint in constraints:
        if (
            not isinstance(constraint, list | tuple)
            or len(constraint) != 3
            or not all(isinstance(part, str) for part in constraint)
        ):
            raise ValueError(
                f"row id={row_id!r}: each constraint must be [category, subtype, words], got "
                f"{constraint!r}"
            )
        parsed.append((constraint[0], constraint[1], constraint[2]))
    return parsed


def read_muldimif(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a MulDimIF file (a JSON list), each checked for MulDimIF's fields."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path {str(path)!r} is not a file")
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"path {str(path)!r}: not JSON ({error})") from None
    if not isinstance(rows, list):
        raise ValueError(f"path {str(path)!r}: MulDimIF's layout is a JSON list of rows")
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"path {str(path)!r}: row {index} is not an object")
        missing = [name for name in ROW_FIELDS if name not in row]
        if missing:
            raise ValueError(
                f"path {str(path)!r}: row {index} (id={row.get('id')!r}) lacks {missing}"
            )
    return rows


def muldimif_columns(
    rows: Sequence[Mapping[str, Any]], system_prompt: str = SYSTEM_PROMPT, check: bool = True
) -> dict[str, list[Any]]:
    """The dataset columns of MulDimIF rows (module docstring); with `check`, every
    constraint's words are parsed now (ValueError naming the row id and the words)."""
    columns: dict[str, list[Any]] = {
        name: []
        for name in (
            "prompt",
            "key",
            "instruction_id_list",
            "kwargs",
            "constraint_pattern",
            "difficulty",
        )
    }
    seen: set[str] = set()
    for row in rows:
        row_id = str(row["id"])
        if row_id in seen:
            raise ValueError(f"row id={row_id!r} appears twice")
        seen.add(row_id)
        messages = _messages(row_id, row["conversations"])
        constraints = _constraints(row_id, row["constraints"])
        if check:
            for category, subtype, words in constraints:
                try:
                    parse_constraint(category, subtype, words)
                except ValueError as error:
                    raise ValueError(f"row id={row_id!r}: {error}") from None
        has_system = messages[0]["role"] == "system"
        system = [] if has_system else [{"role": "system", "content": system_prompt}]
        columns["prompt"].append(system + messages)
        columns["key"].append(row_id)
        columns["instruction_id_list"].append([instruction_id(c, s) for c, s, _ in constraints])
        columns["kwargs"].append(
            [json.dumps({"constraint": words}, ensure_ascii=False) for _, _, words in constraints]
        )
        columns["constraint_pattern"].append(str(row["constraint_pattern"]))
        columns["difficulty"].append(str(row["difficulty"]))
    return columns


MULDIMIF_FEATURES = Features(
    {
        "prompt": [{"role": Value("string"), "content": Value("string")}],
        "key": Value("string"),
        "instruction_id_list": [Value("string")],
        "kwargs": [Value("string")],
        "constraint_pattern": Value("string"),
        "difficulty": Value("string"),
    }
)


def load_muldimif(
    path: str | Path, system_prompt: str = SYSTEM_PROMPT, check: bool = True
) -> Dataset:
    """A MulDimIF file (its test or training set: a JSON list of `{id, conversations,
    constraints, constraint_pattern, difficulty}`) as a Dataset of the instructions task
    (columns in the module docstring), rows and constraints in the file's order.

    With `check` (the default) every constraint is parsed at load time: ValueError naming the
    row's id and the constraint's words when the checkers cannot read it."""
    rows = read_muldimif(path)
    try:
        columns = muldimif_columns(rows, system_prompt, check)
    except ValueError as error:
        raise ValueError(f"path {str(path)!r}: {error}") from None
    return Dataset.from_dict(columns, features=MULDIMIF_FEATURES)
