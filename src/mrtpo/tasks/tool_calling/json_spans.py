"""JSON parsing that also says where every piece sits in the text.

The tool-calling verifiers need two things from a `<tool_call>` block: its value, and the
character ranges of its punctuation, argument names and argument values (their spans). The
value comes from `json.loads` (never eval), made strict about what a model's JSON may be:

- nesting deeper than `MAX_DEPTH` is refused before parsing (no recursion blow-up);
- duplicate keys are refused: parsers disagree on which one wins, so the call is ambiguous;
- `NaN`/`Infinity` (not JSON) and numbers no float or int can hold (1e999, ints of more than
  4300 digits) are refused.

Once `json.loads` has accepted the text, a small token walk over the same text records the
positions: the text is known to be valid JSON, so the walk only has to follow brackets.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

Span = tuple[int, int]

MAX_DEPTH = 64

_SPECIAL_CHARS = re.compile(r'[\[\]{}"\\]')
# Used only on text json accepted, so every string is closed and the scan is linear.
_TOKENS = re.compile(r'\s+|"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+', re.DOTALL)


class JsonError(ValueError):
    """The text is not a JSON value this module accepts (the message says why)."""


@dataclass
class JsonNode:
    """One JSON value and where it sits: `start`/`end` are offsets into the scanned text.

    members: for an object, (key, key span including quotes, value node) in text order.
    items: for an array, the element nodes in order.
    """

    kind: str  # "object", "array" or "scalar"
    start: int
    end: int = -1
    members: list[tuple[str, Span, JsonNode]] = field(default_factory=list)
    items: list[JsonNode] = field(default_factory=list)

    def member(self, key: str) -> JsonNode | None:
        """The value node of `key` in an object (keys are unique: duplicates are refused)."""
        for member_key, _, node in self.members:
            if member_key == key:
                return node
        return None

    def key_span(self, key: str) -> Span | None:
        for member_key, span, _ in self.members:
            if member_key == key:
                return span
        return None


@dataclass(frozen=True)
class ParsedJson:
    """A parsed JSON text: its value, its node tree and its punctuation spans (merged)."""

    value: Any
    root: JsonNode
    punctuation: tuple[Span, ...]


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise JsonError(f"duplicate key {key[:40]!r}")
        result[key] = value
    return result


def _refuse_constant(name: str) -> Any:
    raise JsonError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonError(f"number {text[:40]} is out of range")
    return value


_DECODER = json.JSONDecoder(
    object_pairs_hook=_refuse_duplicates,
    parse_constant=_refuse_constant,
    parse_float=_finite_float,
)


def nesting_depth(text: str) -> int:
    """The deepest bracket nesting of `text`, brackets inside JSON strings not counted.

    One pass over the special characters only (linear even on adversarial text).
    """
    depth = deepest = 0
    in_string = False
    escaped_position = -1  # the character a backslash inside a string escapes
    for match in _SPECIAL_CHARS.finditer(text):
        position, char = match.start(), match.group()
        if in_string:
            if position == escaped_position:
                continue
            if char == "\\":
                escaped_position = position + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def parse_json(text: str, offset: int = 0) -> ParsedJson:
    """Parse `text` (one JSON value, white space around allowed) with positions.

    Spans are offsets into the enclosing text: `offset` is where `text` starts in it.
    Raises JsonError (a ValueError) when the text is not acceptable JSON.
    """
    if nesting_depth(text) > MAX_DEPTH:
        raise JsonError(f"nested deeper than {MAX_DEPTH} levels")
    try:
        value = _DECODER.decode(text)
    except JsonError:
        raise
    except (ValueError, RecursionError) as error:  # JSONDecodeError, int digit limit
        raise JsonError(str(error)[:200]) from None
    root, punctuation = _walk(text, offset)
    return ParsedJson(value=value, root=root, punctuation=punctuation)


def _walk(text: str, offset: int) -> tuple[JsonNode, tuple[Span, ...]]:
    """Positions of the values, keys and punctuation of text that json already accepted."""
    root: JsonNode | None = None
    open_nodes: list[JsonNode] = []
    expecting_key: list[bool] = []  # per open container: is the next string an object key?
    pending_key: list[tuple[str, Span]] = []
    punctuation: list[Span] = []

    def attach(node: JsonNode) -> None:
        nonlocal root
        if not open_nodes:
            root = node
        elif open_nodes[-1].kind == "object":
            key, key_span = pending_key.pop()
            open_nodes[-1].members.append((key, key_span, node))
        else:
            open_nodes[-1].items.append(node)

    for match in _TOKENS.finditer(text):
        token = match.group()
        start, end = match.start() + offset, match.end() + offset
        if token[0].isspace():
            continue
        if token in ("{", "["):
            punctuation.append((start, end))
            node = JsonNode(kind="object" if token == "{" else "array", start=start)
            attach(node)
            open_nodes.append(node)
            expecting_key.append(token == "{")
        elif token in ("}", "]"):
            punctuation.append((start, end))
            node = open_nodes.pop()
            node.end = end
            expecting_key.pop()
        elif token in (":", ","):
            punctuation.append((start, end))
            if token == "," and open_nodes[-1].kind == "object":
                expecting_key[-1] = True
        elif token[0] == '"':
            punctuation.extend([(start, start + 1), (end - 1, end)])  # the quotes
            if expecting_key and expecting_key[-1]:
                pending_key.append((json.loads(token), (start, end)))
                expecting_key[-1] = False
            else:
                attach(JsonNode(kind="scalar", start=start, end=end))
        else:  # number, true, false, null
            attach(JsonNode(kind="scalar", start=start, end=end))
    if root is None:  # unreachable for text json accepted; kept as a clear failure
        raise JsonError("no JSON value")
    return root, merge_spans(punctuation)


def merge_spans(spans: list[Span]) -> tuple[Span, ...]:
    """Sort spans and join the ones that touch or overlap."""
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return tuple((start, end) for start, end in merged)
