"""A griffe extension for the API reference (mkdocs.yml: mkdocstrings' `extensions`).

The package's docstrings list fields as `name: what it is`, continued on indented lines, after a
blank line. Google-style parsing reads the first such line of a list as an admonition titled by
the rest of the line; here its name is set in code (a phrase in bold) first, so that the list
renders as written. Section headers (`Args:`, `Returns:`, ...) are left alone.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

SECTIONS = {
    "args", "arguments", "params", "parameters", "keyword args", "keyword arguments",
    "other args", "other arguments", "other params", "other parameters", "type args",
    "type arguments", "type params", "type parameters", "raises", "exceptions", "returns",
    "yields", "receives", "examples", "attributes", "functions", "methods", "classes",
    "type aliases", "modules", "warns", "warnings",
}  # fmt: skip
FIELD = re.compile(r"^(?P<indent>\s*)(?P<name>[A-Za-z_][\w\s-]*):(?P<rest>\s+\S.*)$")
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def guard_field_lists(text: str) -> str:
    """`text` with each line griffe would take for an admonition title made plain prose."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        match = FIELD.match(line)
        if not match or match["name"].strip().lower() in SECTIONS:
            continue
        blank_above = i == 0 or not lines[i - 1].strip()
        below = next((later for later in lines[i + 1 : i + 3] if later.strip()), "")
        if not (blank_above and below.startswith(match["indent"] + " ")):
            continue
        name = match["name"].strip()
        shown = f"`{name}`" if IDENTIFIER.fullmatch(name) else f"**{name}**"
        lines[i] = f"{match['indent']}{shown}:{match['rest']}"
    return "\n".join(lines)


class FieldLists(Extension):
    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = guard_field_lists(obj.docstring.value)
