"""Tool calling (BFCL-style): two rewards, the call's format and its arguments' correctness.

- `task`: `ToolCallFormat`, `ToolCallCorrectness`, `ToolCallingTask` and `TASK`;
- `response`: parsing a response into calls, with the character span of every part;
- `json_spans`: a JSON parser that records where each value sits in the text;
- `bfcl`: BFCL's AST-checker semantics (types, optional arguments, partial credit);
- `prompt`: the system prompt and how tools are shown to a chat template;
- `data`: the bundled data and BFCL v3/v4 loaders.
"""

from mrtpo.tasks.tool_calling.data import load_bfcl
from mrtpo.tasks.tool_calling.prompt import render_prompt
from mrtpo.tasks.tool_calling.task import (
    TASK,
    ToolCallCorrectness,
    ToolCallFormat,
    ToolCallingTask,
    reference_calls_text,
)

__all__ = [
    "TASK",
    "ToolCallCorrectness",
    "ToolCallFormat",
    "ToolCallingTask",
    "load_bfcl",
    "reference_calls_text",
    "render_prompt",
]
