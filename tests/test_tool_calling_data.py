"""The BFCL loader on small files, the bundled data, and prompt rendering."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from build_data import tool_calling as build

from mrtpo.tasks import get
from mrtpo.tasks.tool_calling import TASK, load_bfcl, render_prompt
from mrtpo.tasks.tool_calling.data import BUNDLED_DIR
from mrtpo.tasks.tool_calling.prompt import SYSTEM_PROMPT, template_uses_tools, tools_text

FUNCTION = {
    "name": "book_table",
    "description": "Book a table.",
    "parameters": {
        "type": "dict",
        "properties": {
            "party": {
                "type": "dict",
                "properties": {"adults": {"type": "integer"}, "budget": {"type": "float"}},
                "description": "Who.",
            },
            "times": {"type": "array", "items": {"type": "float"}, "description": "Times."},
        },
        "required": ["party"],
    },
}


def write_lines(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def question(row_id, content="Book it."):
    return {
        "id": row_id,
        "question": [[{"role": "user", "content": content}]],
        "function": [FUNCTION],
    }


def answer(row_id):
    return {
        "id": row_id,
        "ground_truth": [{"book_table": {"party": [{"adults": [2]}], "times": [[19.5], ""]}}],
    }


def test_load_bfcl_reads_questions_and_default_answers(tmp_path):
    questions_path = tmp_path / "BFCL_v4_simple_python.json"
    write_lines(
        questions_path, [question("simple_python_0"), question("simple_python_1", "Two, please.")]
    )
    write_lines(tmp_path / "possible_answer" / questions_path.name, [answer("simple_python_1"), answer("simple_python_0")])  # fmt: skip
    rows = load_bfcl(questions_path)
    assert rows.column_names == ["prompt", "tools", "ground_truth", "id"]
    assert rows["id"] == ["simple_python_0", "simple_python_1"]
    system, user = rows[1]["prompt"]
    assert user == {"role": "user", "content": "Two, please."}
    assert system["role"] == "system" and system["content"].startswith(SYSTEM_PROMPT)
    tools = json.loads(rows[0]["tools"])
    assert system["content"] == SYSTEM_PROMPT + tools_text(tools)
    parameters = tools[0]["function"]["parameters"]
    assert tools[0]["type"] == "function" and parameters["type"] == "object"
    assert parameters["properties"]["party"]["type"] == "object"
    assert parameters["properties"]["party"]["properties"]["budget"] == {
        "type": "number",
        "format": "float",
    }
    assert parameters["properties"]["times"]["items"] == {"type": "number", "format": "float"}
    assert json.loads(rows[0]["ground_truth"]) == answer("simple_python_0")["ground_truth"]
    assert TASK.load(path=str(questions_path))["id"] == rows["id"]


def test_missing_answer_is_one_error_naming_the_id(tmp_path):
    questions_path, answers_path = tmp_path / "q.json", tmp_path / "a.json"
    write_lines(
        questions_path, [question("multiple_0"), question("multiple_1"), question("multiple_2")]
    )
    write_lines(answers_path, [answer("multiple_0")])
    with pytest.raises(ValueError, match=r"no answer for id 'multiple_1' \(nor for 1 more ids\)"):
        load_bfcl(questions_path, answers_path)


def test_malformed_files_are_clear_errors(tmp_path):
    questions_path, answers_path = tmp_path / "q.json", tmp_path / "a.json"
    questions_path.write_text(json.dumps(question("x_0")) + "\n{not json\n")
    write_lines(answers_path, [answer("x_0")])
    with pytest.raises(ValueError, match=r"q.json:2 is not a JSON line"):
        load_bfcl(questions_path, answers_path)
    write_lines(questions_path, [question("x_0")])
    write_lines(answers_path, [{"id": "x_0", "ground_truth": [{"book_table": {"party": 2}}]}])
    with pytest.raises(ValueError, match="lists of allowed values"):
        load_bfcl(questions_path, answers_path)
    with pytest.raises(ValueError, match="answers_path"):
        load_bfcl(questions_path, tmp_path / "absent.json")


def test_registry_and_bundled_splits():
    assert get("tool_calling") is TASK
    train, test = TASK.load("train"), TASK.load("test")
    assert (len(train), len(test)) == (336, 84)
    assert not set(train["id"]) & set(test["id"])
    categories = Counter(
        row_id.rsplit("_", 1)[0] for row_id in list(train["id"]) + list(test["id"])
    )
    assert categories == {"simple": 140, "multiple": 120, "parallel": 80, "parallel_multiple": 80}
    offered = Counter(
        len(json.loads(tools)) for tools in list(train["tools"]) + list(test["tools"])
    )
    assert set(offered) <= {1, 2, 3, 4}
    with pytest.raises(ValueError, match="split"):
        TASK.load("validation")


def test_bundled_functions_cover_the_required_kinds():
    assert len(build.FUNCTIONS) >= 20
    kinds = Counter()
    for function in build.FUNCTIONS:
        parameters = function["parameters"]
        kinds["optional"] += len(parameters["properties"]) > len(parameters["required"])
        for schema in parameters["properties"].values():
            kinds[schema["type"]] += 1
            kinds["enum"] += "enum" in schema or "enum" in schema.get("items", {})
            kinds["list of dicts"] += schema.get("items", {}).get("type") == "dict"
    assert all(
        kinds[kind] >= 2
        for kind in ("string", "integer", "float", "boolean", "array", "dict", "enum")
    )
    assert kinds["list of dicts"] >= 1 and kinds["optional"] >= 15


def test_every_bundled_reference_scores_one():
    format_verifier, correctness = TASK.verifiers()
    for split in ("train", "test"):
        for row in TASK.load(split):
            reference = TASK.reference_completion(row)
            assert format_verifier.verify(reference, row).score == 1.0, row["id"]
            assert correctness.verify(reference, row).score == 1.0, row["id"]


def test_generation_is_reproducible(tmp_path):
    written = build.write(tmp_path)
    assert len(written) == 4
    for path in written:
        committed = BUNDLED_DIR / path.relative_to(tmp_path)
        assert path.read_bytes() == committed.read_bytes(), (
            f"{committed} differs from a fresh build"
        )


TOOLS_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
    "{% if loop.first and tools %}[TOOLS]{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}"
    "\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_render_prompt_uses_the_system_message_when_the_template_ignores_tools(tiny):
    _, tokenizer = tiny
    row = TASK.load("test")[0]
    assert not template_uses_tools(tokenizer)
    text = render_prompt(tokenizer, row["prompt"], row["tools"])
    assert text == tokenizer.apply_chat_template(
        row["prompt"], tokenize=False, add_generation_prompt=True
    )
    assert text.count(tools_text(json.loads(row["tools"]))) == 1
    bare = [{"role": "user", "content": row["prompt"][1]["content"]}]
    assert render_prompt(tokenizer, bare, row["tools"]) == text


def test_render_prompt_goes_through_tools_when_the_template_uses_them(tiny):
    _, tokenizer = tiny
    saved = tokenizer.chat_template
    try:
        tokenizer.chat_template = TOOLS_TEMPLATE
        assert template_uses_tools(tokenizer)
        row = TASK.load("test")[0]
        text = render_prompt(tokenizer, row["prompt"], row["tools"])
        assert "<tools>" not in text and text.count("[TOOLS]") == 1
        assert text.startswith(f"<|system|>{SYSTEM_PROMPT}[TOOLS]")
        assert json.dumps(json.loads(row["tools"])[0], ensure_ascii=False) in text
    finally:
        tokenizer.chat_template = saved
