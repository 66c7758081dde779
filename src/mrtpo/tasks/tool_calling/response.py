"""Splitting a model's response into its think block, `<tool_call>` blocks and stray text.

The response format (Hermes / Qwen2.5 style): an optional `<think>...</think>` first, then one
or more `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, white space allowed
between and inside them, and nothing else. Blocks pair each `<tool_call>` with the next
`</tool_call>` (like the usual `<tool_call>(.*?)</tool_call>` parsers, so a `</tool_call>`
inside a JSON string ends the block), found in one linear pass over the tags.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mrtpo.tasks.tool_calling.json_spans import JsonError, ParsedJson, Span, parse_json

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_TAGS = re.compile(r"</?tool_call>")
_NON_SPACE = re.compile(r"\S")


@dataclass(frozen=True)
class Block:
    """One `<tool_call>...</tool_call>` block: tag spans, and its JSON or why it failed."""

    open_tag: Span
    close_tag: Span
    parsed: ParsedJson | None
    error: str | None

    @property
    def call(self) -> tuple[Any, Any]:
        """(name, arguments) as written; (None, None) when the block is not a JSON object."""
        if self.parsed is None or not isinstance(self.parsed.value, dict):
            return None, None
        return self.parsed.value.get("name"), self.parsed.value.get("arguments")


@dataclass(frozen=True)
class Response:
    """A parsed response.

    think_tags: the spans of `<think>` and `</think>` when the response opens with a think block.
    blocks: the tool-call blocks after the think block, in order.
    stray: spans of text other than white space outside the think block and the blocks.
    """

    think_tags: tuple[Span, ...]
    blocks: tuple[Block, ...]
    stray: tuple[Span, ...]

    @property
    def calls(self) -> list[tuple[Any, Any]]:
        return [block.call for block in self.blocks]


def _stray(text: str, start: int, end: int) -> list[Span]:
    """The span from the first to the last non-space character of text[start:end], if any."""
    first = _NON_SPACE.search(text, start, end)
    if first is None:
        return []
    last = end
    while text[last - 1].isspace():
        last -= 1
    return [(first.start(), last)]


def parse_response(text: str) -> Response:
    """Split `text` into think block, tool-call blocks and stray text (never raises)."""
    think_tags: list[Span] = []
    position = len(text) - len(text.lstrip())
    if text.startswith(THINK_OPEN, position):
        close = text.find(THINK_CLOSE, position + len(THINK_OPEN))
        if close < 0:  # unclosed: everything left is thinking, so there is no call
            return Response(
                think_tags=(), blocks=(), stray=tuple(_stray(text, position, len(text)))
            )
        think_tags = [(position, position + len(THINK_OPEN)), (close, close + len(THINK_CLOSE))]
        position = close + len(THINK_CLOSE)

    blocks: list[Block] = []
    stray: list[Span] = []
    cursor = position  # end of the last block
    open_tag: Span | None = None
    for match in _TAGS.finditer(text, position):
        if match.group() == OPEN_TAG:
            if open_tag is None:
                open_tag = match.span()
            continue
        if open_tag is None:  # a closing tag with no opening one: stray text
            continue
        stray += _stray(text, cursor, open_tag[0])
        blocks.append(_block(text, open_tag, match.span()))
        cursor, open_tag = match.end(), None
    stray += _stray(text, cursor, len(text))
    return Response(think_tags=tuple(think_tags), blocks=tuple(blocks), stray=tuple(stray))


def _block(text: str, open_tag: Span, close_tag: Span) -> Block:
    try:
        parsed = parse_json(text[open_tag[1] : close_tag[0]], offset=open_tag[1])
    except JsonError as error:
        return Block(open_tag=open_tag, close_tag=close_tag, parsed=None, error=str(error))
    return Block(open_tag=open_tag, close_tag=close_tag, parsed=parsed, error=None)
