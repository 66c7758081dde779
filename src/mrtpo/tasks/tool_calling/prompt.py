"""How the offered functions reach the model: JSON schemas in the system message.

The text is the one Qwen2.5's chat template writes for `apply_chat_template(..., tools=...)`:
a "# Tools" section with one JSON schema per line inside `<tools></tools>`, then the
`<tool_call>` instructions. The dataset always carries it inside the system message, because
TRL's GRPOTrainer renders conversational prompts itself (without a per-row `tools=`) and
SmolLM2's template ignores `tools=` anyway. `render_prompt` renders through the template's
own tool support when the template has one, and through the system message otherwise: both
give the model the same content.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

SYSTEM_PROMPT = (
    "You are a function-calling assistant. Answer the user's request only with calls to the "
    "offered functions: call every function the request needs, give the arguments the request "
    "states, and write no other text."
)

# BFCL's type names that JSON Schema spells differently (BFCL's own OpenAPI mapping).
JSON_SCHEMA_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}

TOOLS_HEADER = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def to_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a BFCL parameter schema with JSON Schema type names ("dict" -> "object",
    "float" -> "number" with format "float", ...), converted through properties and items."""
    converted = copy.deepcopy(dict(schema))
    declared = converted.get("type")
    if isinstance(declared, str) and declared in JSON_SCHEMA_TYPES:
        converted["type"] = JSON_SCHEMA_TYPES[declared]
        if declared == "float":  # keeps the float hint BFCL's own conversion keeps
            converted.setdefault("format", "float")
    if isinstance(converted.get("properties"), Mapping):
        converted["properties"] = {
            name: to_json_schema(sub) if isinstance(sub, Mapping) else sub
            for name, sub in converted["properties"].items()
        }
    if isinstance(converted.get("items"), Mapping):
        converted["items"] = to_json_schema(converted["items"])
    return converted


def function_tool(function: Mapping[str, Any]) -> dict[str, Any]:
    """A BFCL function description as a chat-template tool: {"type": "function", "function": ...}."""
    described = {key: value for key, value in function.items() if key != "parameters"}
    described["parameters"] = to_json_schema(
        function.get("parameters") or {"type": "dict", "properties": {}}
    )
    return {"type": "function", "function": described}


def tool_functions(tools: str | Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The function descriptions of a `tools` column value (JSON text or list), unwrapped."""
    if isinstance(tools, str):
        tools = json.loads(tools)
    if not isinstance(tools, list):
        raise ValueError(f"tools must be a JSON list of functions, got {type(tools).__name__}")
    return [tool["function"] if "function" in tool else tool for tool in tools]


def tools_text(tools: Sequence[Mapping[str, Any]]) -> str:
    """The "# Tools" section Qwen2.5's template appends to the system message."""
    lines = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
    return TOOLS_HEADER + lines + TOOLS_FOOTER


def system_message(
    tools: Sequence[Mapping[str, Any]], system_prompt: str = SYSTEM_PROMPT
) -> dict[str, str]:
    """The system message of a row: the instructions, then the offered functions."""
    return {"role": "system", "content": system_prompt + tools_text(tools)}


_PROBE_MESSAGES = [{"role": "user", "content": "Hello"}]
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "probe",
            "description": "Probe.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]


def template_uses_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template writes `tools=` into the prompt.

    Rendered with and without a probe tool: templates that ignore tools (SmolLM2's) give the
    same text both times.
    """
    try:
        plain = tokenizer.apply_chat_template(
            _PROBE_MESSAGES, tokenize=False, add_generation_prompt=True
        )
        with_tools = tokenizer.apply_chat_template(
            _PROBE_MESSAGES, tools=_PROBE_TOOLS, tokenize=False, add_generation_prompt=True
        )
    except Exception:  # a template that fails on tools= does not support them
        return False
    return plain != with_tools


def render_prompt(
    tokenizer: Any,
    messages: Sequence[Mapping[str, str]],
    tools: str | Sequence[Mapping[str, Any]],
) -> str:
    """The prompt text for `messages` offering `tools`, ready for generation.

    messages: a row's `prompt` (its system message may already end with the tools section) or
    a bare conversation. tools: the row's `tools` column (JSON text or list of tools).
    Through `tools=` when the template uses them, else in the system message.
    """
    if isinstance(tools, str):
        tools = json.loads(tools)
    section = tools_text(tools)
    messages = [dict(message) for message in messages]
    has_system = bool(messages) and messages[0].get("role") == "system"
    if template_uses_tools(tokenizer):
        if has_system and messages[0]["content"].endswith(section):
            messages[0]["content"] = messages[0]["content"][: -len(section)]
        return tokenizer.apply_chat_template(
            messages, tools=list(tools), tokenize=False, add_generation_prompt=True
        )
    if not has_system:
        messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
    if not messages[0]["content"].endswith(section):
        messages[0]["content"] += section
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
