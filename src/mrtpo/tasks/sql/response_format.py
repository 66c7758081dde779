"""The text-to-SQL response format: where the query is, and whether the format is kept.

Default format: optional reasoning in `<think>...</think>`, then the query in
`<answer>...</answer>` (a ```sql fence inside the answer is accepted), nothing after it.
The tag names are configurable through `ResponseFormat`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import sqlglot
from sqlglot import exp

Span = tuple[int, int]

MAX_QUERY_CHARS = 20_000  # longer queries are not parsed (the sandbox refuses them too)
_FENCE = re.compile(
    r"\A```[ \t]*(?:sql|sqlite)?[ \t]*\n?(.*?)\n?[ \t]*```\Z", re.DOTALL | re.IGNORECASE
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class ResponseFormat:
    """Tag names of the response format."""

    think_tag: str = "think"
    answer_tag: str = "answer"

    def __post_init__(self) -> None:
        for name in ("think_tag", "answer_tag"):
            tag = getattr(self, name)
            if not re.fullmatch(r"[A-Za-z][\w-]*", tag):
                raise ValueError(f"{name} must be a plain tag name like 'answer', got {tag!r}")
        if self.think_tag == self.answer_tag:
            raise ValueError("think_tag and answer_tag must differ")

    @property
    def rule(self) -> str:
        """The format rule in words (the format verifier's information)."""
        t, a = self.think_tag, self.answer_tag
        return (
            f"Format rule: optionally reason inside <{t}>...</{t}>, then give exactly one SQL "
            f"read query (SELECT, or WITH ... SELECT) inside <{a}>...</{a}>, optionally in a "
            f"```sql fence; no other text outside the tags and nothing after </{a}>."
        )

    def wrap(self, query: str) -> str:
        """A response in this format holding `query` (for supervised cold start)."""
        return f"<{self.answer_tag}>\n{query.strip()}\n</{self.answer_tag}>"


DEFAULT_FORMAT = ResponseFormat()


@dataclass(frozen=True)
class ParsedResponse:
    """What a response holds, with character spans into its text.

    query: the query of the last complete answer block (inside its fence if any), or None.
    query_span: where `query` is in the text.
    answer_spans: every complete answer block, tags included.
    tag_spans: every think/answer tag.
    stray_spans: non-blank text outside the think and answer blocks.
    problems: format problems found without parsing the SQL (empty: the layout is right).
    """

    query: str | None
    query_span: Span | None
    answer_spans: tuple[Span, ...]
    tag_spans: tuple[Span, ...]
    stray_spans: tuple[Span, ...]
    problems: tuple[str, ...]


def _blocks(text: str, tag: str) -> tuple[list[Span], list[Span]]:
    """(complete blocks, their inner spans) of `<tag>...</tag>`, left to right; a block's
    inside holds no other opening tag, so a stray `<tag>` never swallows the next block."""
    blocks, inners = [], []
    pattern = rf"<{tag}>((?:(?!<{tag}>).)*?)</{tag}>"
    for match in re.finditer(pattern, text, re.DOTALL):
        blocks.append(match.span())
        inners.append(match.span(1))
    return blocks, inners


def _tag_problem(text: str, tag: str, blocks: list[Span], required: bool) -> str | None:
    opened, closed = text.count(f"<{tag}>"), text.count(f"</{tag}>")
    if not blocks and required:
        return f"no <{tag}>...</{tag}> block"
    if opened != len(blocks) or closed != len(blocks):
        return f"an unmatched <{tag}> or </{tag}> tag"
    if len(blocks) > 1:
        return f"more than one <{tag}> block"
    return None


def parse_response(text: str, fmt: ResponseFormat = DEFAULT_FORMAT) -> ParsedResponse:
    """Locate the query and check the layout of `text` (the SQL itself is checked apart)."""
    t, a = fmt.think_tag, fmt.answer_tag
    tags = [m.span() for m in re.finditer(rf"</?(?:{t}|{a})>", text)]
    answers, answer_inners = _blocks(text, a)
    thinks, _ = _blocks(text, t)

    problems = [
        problem
        for problem in (
            _tag_problem(text, a, answers, required=True),
            _tag_problem(text, t, thinks, required=False),
        )
        if problem
    ]
    if answers and thinks and thinks[0][0] > answers[-1][0]:
        problems.append(f"the <{t}> block comes after the answer")

    # Text outside every block: before the blocks it is stray, after the answer it is
    # "nothing after the block".
    covered = sorted(thinks + answers)
    stray, cursor = [], 0
    for start, end in covered + [(len(text), len(text))]:
        if start > cursor and text[cursor:start].strip():
            stray.append((cursor, start))
        cursor = max(cursor, end)
    if stray:
        after = answers and stray[-1][0] >= answers[-1][1]
        problems.append(
            f"text after </{a}>" if after else f"text outside the <{t}> and <{a}> blocks"
        )

    query, query_span = None, None
    if answers:
        start, end = answer_inners[-1]
        body = text[start:end]
        fence = _FENCE.search(body.strip())
        if fence:
            offset = start + (len(body) - len(body.lstrip())) + fence.start(1)
            start, end = offset, offset + len(fence.group(1))
            body = fence.group(1)
        elif "```" in body:
            problems.append("a ``` fence with text around it inside the answer")
        # Trim blanks so the span covers the query's own characters.
        lead = len(body) - len(body.lstrip())
        query = body.strip()
        query_span = (start + lead, start + lead + len(query))
    return ParsedResponse(
        query, query_span, tuple(answers), tuple(tags), tuple(stray), tuple(problems)
    )


CACHED_QUERY_CHARS = 4_000  # longer texts are parsed every time (bounds the cache's memory)


def read_query_problem(query: str) -> str | None:
    """Why `query` is not exactly one SQL read statement (sqlglot, SQLite dialect), or None."""
    if len(query) <= CACHED_QUERY_CHARS:
        return _cached_read_query_problem(query)
    return _read_query_problem(query)


@lru_cache(maxsize=4096)
def _cached_read_query_problem(query: str) -> str | None:
    return _read_query_problem(query)


def _read_query_problem(query: str) -> str | None:
    if not query.strip():
        return "the answer is empty"
    if len(query) > MAX_QUERY_CHARS:
        return f"the query is longer than {MAX_QUERY_CHARS:,} characters"
    try:
        trees = [tree for tree in sqlglot.parse(query, read="sqlite") if tree is not None]
    except Exception as error:  # sqlglot raises several types; any of them means "no parse"
        message = _ANSI.sub("", str(error)).strip().splitlines()
        return f"the query does not parse: {message[0] if message else type(error).__name__}"
    if not trees:
        return "the answer holds no statement"
    if len(trees) > 1:
        return f"the answer holds {len(trees)} statements; exactly one is allowed"
    if not isinstance(trees[0], exp.Query):
        return f"the statement is a {trees[0].key.upper()}, not a read query (SELECT)"
    return None


@lru_cache(maxsize=8192)
def has_top_level_order_by(query: str) -> bool:
    """Whether the rows of `query`'s result come in a defined order (a top-level ORDER BY)."""
    try:
        trees = [tree for tree in sqlglot.parse(query, read="sqlite") if tree is not None]
    except Exception:
        return re.search(r"\border\s+by\b", query, re.IGNORECASE) is not None
    if len(trees) != 1:
        return False
    tree = trees[0]
    while isinstance(tree, exp.Subquery):  # "(SELECT ... ORDER BY ...)"
        tree = tree.this
    return tree.args.get("order") is not None
