"""MulDimIF's Format readers: Markdown headings, tables, JSON nesting, XML attributes and the
other format rules."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mrtpo.tasks.instructions.muldimif_checkers.common import (
    NUMBER_WORDS,
    ONE_TO_TEN,
    TENS,
    UNITS,
    Rule,
    _alternatives,
    _shown,
    some_line_starts,
)
from mrtpo.tasks.instructions.muldimif_checkers.length import _bounds_text, _within

# -- Format / Markdown ----------------------------------------------------------------------------
_TEN = r"(\b(?:one|two|three|four|five|six|seven|eight|nine|ten|\d+)\b)"
_MARKDOWN_VERBS = (
    r"include|includes|included|including|use|using|used|uses|formatted|presented|organized"
    r"|structured|feature|should be|incorporate"
)


def _level(token: str) -> int | None:
    token = token.strip().lower()
    return int(token) if token.isdigit() else ONE_TO_TEN.get(token)


@dataclass(frozen=True)
class HeadingRule:
    kind: str  # levels | exact | count | max | first | questions | only
    levels: frozenset[int | None] = frozenset()
    level: int | str | None = None
    content: str = ""
    relation: str = ""
    count: int = 0

    def describe(self) -> str:
        return {
            "levels": f"headings at levels {sorted(self.levels, key=str)}",
            "exact": f"a level-{self.level} heading {self.content!r}",
            "count": f"{self.relation} {self.count} heading levels",
            "max": f"no heading deeper than level {self.level}",
            "first": f"the first heading at level {self.level}",
            "questions": "question headings at level 2",
            "only": f"exactly one level-{self.level} heading",
            "any": "at least one heading"
            if self.level == "any_level"
            else f"a heading at level {self.level}",
        }[self.kind]

    def holds(self, headings: list[tuple[int, str]]) -> bool:
        if self.kind == "count":
            present = len({level for level, _ in headings})
            return {"at least": present >= self.count, "at most": present <= self.count,
                    "exactly": present == self.count}.get(self.relation, False)  # fmt: skip
        if not headings:
            return False
        if self.kind == "any":
            return any(self.level == "any_level" or level == self.level for level, _ in headings)
        if self.kind == "exact":
            return any(level == self.level and text == self.content for level, text in headings)
        if self.kind == "max":
            return all(level <= self.level for level, _ in headings)  # type: ignore[operator]
        if self.kind == "first":
            return headings[0][0] == self.level
        if self.kind == "levels":
            return self.levels <= {level for level, _ in headings}
        if self.kind == "questions":
            return all(level == 2 for level, text in headings if "?" in text)
        if self.kind == "only":
            return sum(1 for level, _ in headings if level == self.level) == 1
        return False


def _heading_rules(words: str) -> list[HeadingRule]:
    lowered_all = words.lower()
    rules: list[HeadingRule] = []
    for clause in re.split(r"\b(?:,)\b", words, flags=re.IGNORECASE):
        if ("include headings at two levels: main and subheadings" in lowered_all
                or "be structured with a main heading and subheadings" in lowered_all):  # fmt: skip
            rules.append(HeadingRule("levels", frozenset({1, 2})))
            continue
        if words == "Questions must be organized under a level 2 heading.":
            rules.append(HeadingRule("questions"))
            continue
        if "include a single level 1 heading" in lowered_all:
            rules.append(HeadingRule("only", level=1))
            continue
        if ("be structured using a minimum of two heading levels" in lowered_all
                or "include headings at two levels" in lowered_all):  # fmt: skip
            rules.append(HeadingRule("count", relation="at least", count=2))
            continue
        if words == ("format the response using Markdown, employing '##' for main points and "
                     "'###' for subpoints to clearly organize the information"):  # fmt: skip
            rules.append(HeadingRule("levels", frozenset({2, 3})))
            continue
        pair = re.search(rf"(?i)use heading levels {_TEN} and {_TEN}", clause) or re.search(
            rf"(?i)use heading levels.*?level\s*{_TEN}.*?level\s*{_TEN}", clause
        )
        if pair:
            first, second = _level(pair[1]), _level(pair[2])
            if first is not None and second is not None:
                rules.append(HeadingRule("levels", frozenset({first, second})))
            continue
        listed = (
            re.findall(rf"(?i)a heading level {_TEN}", clause)
            or re.findall(r"(?i)H(\d+)", clause)
            or re.findall(rf"(?i)Level {_TEN} for", clause)
        )
        if listed and ("must include" in clause or "should" in clause):
            rules.append(HeadingRule("levels", frozenset(_level(token) for token in listed)))
            continue
        if "titled" in clause:
            stripped = clause.strip().rstrip(".")
            titled = re.search(
                rf"(?i)level {_TEN} heading titled [\"'](.*?)[\"']", stripped
            ) or re.search(
                rf"(?i)(?:a|at least one|two|three|four|five|six|seven|eight|nine|ten|\d+) level "
                rf"{_TEN} heading with the text [\"'](.*?)[\"']",
                stripped,
            )
            if titled:
                if (level := _level(titled[1])) is not None:
                    rules.append(HeadingRule("exact", level=level, content=titled[2]))
                continue
        clause = clause.strip().lower().rstrip(".")
        if re.search(_MARKDOWN_VERBS, clause, re.I):
            single = (
                re.search(rf"(?i)(?:a|at least \d+) heading level {_TEN}", clause)
                or re.search(
                    rf"(?i)(?:a|at least one|two|three|four|five|six|seven|eight|nine|ten|\d+) "
                    rf"level {_TEN} heading",
                    clause,
                )
                or re.search(r"(?i)must use a heading level of H(\d+)", clause)
            )
            if single:
                if (level := _level(single[1])) is not None:
                    rules.append(HeadingRule("any", level=level))
                continue
            counted = re.search(
                rf"(?i)(at least|at most|exactly|up to|a maximum of|under) {_TEN} heading levels?",
                clause,
            ) or re.search(
                rf"(?i)(at least|at most|exactly|up to|a maximum of|under) {_TEN} levels?", clause
            )
            if counted:
                relation = counted[1].lower()
                relation = "at most" if relation in ("up to", "a maximum of", "under") else relation
                if (count := _level(counted[2])) is not None:
                    rules.append(HeadingRule("count", relation=relation, count=count))
                continue
        deepest = re.search(
            rf"(?i)(?:heading levels)? must (?:not exceed|be limited to)\s+(?:level\s+)?{_TEN}",
            clause,
        )
        if deepest:
            if (level := _level(deepest[1])) is not None:
                rules.append(HeadingRule("max", level=level))
            continue
        if begins := re.search(rf"(?i)must begin with a level {_TEN} heading", clause):
            if (level := _level(begins[1])) is not None:
                rules.append(HeadingRule("first", level=level))
            continue
        if used := re.search(rf"(?i)use heading level {_TEN}", clause):
            if (level := _level(used[1])) is not None:
                rules.append(HeadingRule("any", level=level))
            continue
        if any(phrase in lowered_all for phrase in (
            "include headings", "includes headings", "use heading levels", "using heading levels",
            "presented under a separate heading", "separated with headings", "with headings",
        )):  # fmt: skip
            rules.append(HeadingRule("any", level="any_level"))
    return rules


def markdown_headings(text: str) -> list[tuple[int, str]]:
    """(level, text) of each line that is `#`s, a space and a title."""
    headings = []
    for line in text.split("\n"):
        # the line is stripped, so the title is all after the #s and spaces
        if found := re.match(r"(#+)\s+(.*)", line.strip()):
            headings.append((len(found[1]), found[2].strip()))
    return headings


def read_markdown(words: str) -> Rule:
    lowered = words.lower()
    rules = _heading_rules(words)
    each = "each" in lowered or "any" in lowered
    quotes = "block quotes" in lowered
    if quotes and "at least" in lowered:
        found = re.search(rf"(?i){_TEN} block quotes", words)
        if not found or _level(found[1]) is None:
            raise ValueError(f"cannot read the number of block quotes in {words!r}")
        quote_need: int | str = _level(found[1])  # type: ignore[assignment]
    elif quotes and any(phrase in lowered for phrase in (
        "use block quotes", "using block quotes", "include a block quote",
        "using markdown block quotes", "employ block quotes", "present the headline as a block quote",
    )):  # fmt: skip
        quote_need = 1
    else:
        quote_need = "every line"

    def judge(text: str) -> tuple[bool, str]:
        if quotes:
            lines = text.split("\n")
            quoted = sum(1 for line in lines if line.strip().startswith(">"))
            if quote_need == "every line":
                if quoted != len(lines):
                    return False, f"{quoted} of {len(lines)} lines are block quotes"
            elif quoted < quote_need:  # type: ignore[operator]
                return False, f"{quoted} block-quote lines"
        if "bold" in lowered and not re.search(r"(\*\*.*?\*\*|__.*?__)", text):
            return False, "no bold text"
        if "bullet points" in lowered and not any(
            re.search(r"^\s*[-\*\+]\s", line) for line in text.split("\n")
        ):
            return False, "no bullet point"
        headings = markdown_headings(text)
        found = (
            f"headings at levels {[level for level, _ in headings]}" if headings else "no heading"
        )
        if each:
            if not headings:
                return False, found
            return all(rule.holds([heading]) for heading in headings for rule in rules), found
        return all(rule.holds(headings) for rule in rules), found

    reading = "; ".join(rule.describe() for rule in rules) or "no heading rule"
    if quotes:
        reading += f"; block quotes: {quote_need}"
    return Rule(words, "markdown", judge, reading + ("; for each heading" if each else ""))


# -- Format / Table -------------------------------------------------------------------------------
_TABLE_NUMBERS = {**{word: NUMBER_WORDS[word] for word in UNITS[1:]}, **TENS, "hundred": 100}
_T = r"(\d+|\b(?:" + _alternatives(_TABLE_NUMBERS) + r")\b)"
_ROW_PATTERNS = tuple(
    (pattern.replace("N", _T), kind)
    for pattern, kind in (
        (r"exactly\s+N\s+rows?", "exact"), (r"no\s+more\s+than\s+N\s+rows?", "max"),
        (r"not\s+have\s+more\s+than\s+N\s+rows?", "max"), (r"must\s+not\s+exceed\s+N\s+rows?", "max"),
        (r"not\s+exceed\s+N\s+rows?", "max"), (r"not\s+exceeding\s+N\s+rows?", "max"),
        (r"should\s+not\s+exceed\s+N\s+rows?", "max"), (r"row\s+limit\s+of\s+N", "max"),
        (r"N\s+rows?\s+must\s+be\s+included", "exact"), (r"exactly\s+.+and N\s+rows?", "exact"),
        (r"not exceed\s+.+and N\s+rows?", "max"), (r"a maximum of\s+N\s+rows", "max"),
        (r"limited to a maximum of\s+N\s+rows", "max"), (r"limited to\s+N\s+rows", "max"),
        (r"a row limit of\s+N", "max"), (r"a maximum of\s+.+and N\s+rows?", "max"),
        (r"limit the number of rows to\s+N", "max"), (r"limit it to\s+N\s+rows", "max"),
        (r"limit the table to\s+N\s+rows", "max"),
        (r"the number of rows in each table does not exceed\s+N", "max"),
    )
)  # fmt: skip
_COLUMN_PATTERNS = tuple(
    (pattern.replace("N", _T), kind)
    for pattern, kind in (
        (r"exactly\s+N\s+columns?", "exact"), (r"no\s+more\s+than\s+N\s+columns?", "max"),
        (r"not\s+have\s+more\s+than\s+N\s+columns?", "max"),
        (r"must\s+not\s+exceed\s+N\s+columns?", "max"), (r"not\s+exceed\s+N\s+columns?", "max"),
        (r"not\s+exceeding\s+N\s+columns?", "max"), (r"should\s+not\s+exceed\s+N\s+columns?", "max"),
        (r"column\s+limit\s+of\s+N", "max"), (r"must\s+have\s+exactly\s+N\s+columns?", "exact"),
        (r"exactly\s+.+and N\s+columns?", "exact"), (r"in\s+N\s+columns", "exact"),
        (r"not exceed\s+.+and N\s+columns?", "max"), (r"maximum of\s+N\s+columns", "max"),
        (r"maximum\s+N\s+columns", "max"), (r"at most\s+N\s+columns", "max"),
        (r"limited to a maximum of\s+N\s+columns", "max"), (r"limited to\s+N\s+columns", "max"),
        (r"a column limit of\s+N", "max"), (r"a maximum of\s+.+and N\s+columns?", "max"),
        (r"limit the number of columns to\s+N", "max"), (r"limit it to\s+N\s+columns", "max"),
        (r"limit the table to\s+N\s+columns", "max"),
        (r"the number of columns in each table does not exceed\s+N", "max"),
        (r"(a|each) (single) column", "single"), (r"presented in (a|one) single column", "single"),
        (r"title must not exceed N\s+words", "title"),
    )
)  # fmt: skip
_CONTENT_PATTERNS = (
    (r"columns?\s+should\s+be\s+([\w\s,]+)", "keyword"),
    (r"columns:\s+([\w\s,']+)", "keyword"),
    (r'must include columns for\s+"([^"]+)"', "keyword"),
    (r"must include the\s+([\w\s,]+)", "content"),
    (r"each (entry|row|item|game|series) must include (?:the\s+)?([\w\s,]+(?:\s+and\s+(?:its|their)\s+[\w\s,]+)?)", "content"),
    (r'table must include columns (for|named)\s+[""]([^""]+)[""]', "keyword"),
    (r"each (entry|row|item|game|series) should (?:be )?(present|include|contain|show)(?:ed)? (?:in|with)?\s+([\w\s,]+)", "content"),
)  # fmt: skip
_OPTIONAL_TABLE = (
    r"if you (include|use|utilize|incorporate|present) (a |any )?(tables?|tabular data)",
    r"if you (decide|choose|opt) to (use|include|incorporate|present|utilize) (a |any )?(tables?|tabular data)",
    r"if (a |any )?(tables?|tabular data|table format) (is|are) (used|included|utilized|incorporated|presented|chosen)",
    r"if there (is|are) (a |any )?(tables?|tabular data|table format) (used|included|utilized|incorporated|presented|chosen)",
    # two official patterns run together (a missing comma), kept as the one pattern they make
    r"if you (decide|choose|opt) to (use|include|incorporate|present|utilize) (your )?information in a table"
    r"if presented in a table",
)  # fmt: skip


def _table_number(token: str) -> int:
    return _TABLE_NUMBERS[token] if token in _TABLE_NUMBERS else int(token)


@dataclass
class TableRule:
    rows: tuple[str, int] | None = None
    columns: tuple[str, int] | None = None
    title_words: int | None = None
    markdown: bool = False
    headers: list[str] = field(default_factory=list)
    contents: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = []
        if self.rows:
            parts.append(
                f"{'exactly' if self.rows[0] == 'exact' else 'at most'} {self.rows[1]} rows"
            )
        if self.columns:
            parts.append(
                f"{'exactly' if self.columns[0] == 'exact' else 'at most'} {self.columns[1]} columns"
            )
        if self.title_words is not None:
            parts.append(f"a first line of at most {self.title_words} words")
        if self.headers:
            parts.append(f"headers containing {_shown(self.headers, 4)}")
        if self.contents:
            parts.append(f"content {_shown(self.contents, 4)}")
        return "; ".join(parts) or "a table"


def _table_rule(words: str) -> TableRule:
    lowered = words.lower()
    rule = TableRule(markdown="markdown" in lowered)
    for pattern, kind in _ROW_PATTERNS:
        if found := re.search(pattern, lowered):
            rule.rows = (kind, _table_number(found[1]))
            break
    for pattern, kind in _COLUMN_PATTERNS:
        if found := re.search(pattern, lowered):
            if kind == "single":
                rule.columns = ("exact", 1)
            elif kind == "title":
                rule.title_words = _table_number(found[1])
            else:
                rule.columns = (kind, _table_number(found[1]))
            break
    if "series must include" in lowered and "title" in lowered and "author" in lowered:
        rule.contents = ["title", "author", "year", "publication"]
    if "film title" in lowered and "release year" in lowered:
        rule.contents = ["film title", "release year"]
    if "columns for" in lowered and '"' in lowered:
        named = [name.strip().rstrip(",").strip() for name in re.findall(r'"([^"]+)"', lowered)]
        if named := [name for name in named if name]:
            rule.headers = named
            return rule
    for pattern, kind in _CONTENT_PATTERNS:
        if not (found := re.search(pattern, lowered)):
            continue
        if kind == "keyword":
            if found[1]:
                # the official split is on any of these characters, letters a, n, d included
                parts = [part.strip("'\" ") for part in re.split(r"[,、，和and]", found[1])]
                rule.headers += [part for part in parts if part]
        elif len(found.groups()) > 1:
            wanted = found.groups()[-1]
            if " and " in wanted:
                left, right = wanted.split(" and ")[:2]
                rule.contents += (
                    [item.strip() for item in left.split(",")] if "," in left else [left.strip()]
                )
                rule.contents.append(
                    right[4:].strip() if right.startswith("its ") else right.strip()
                )
            else:
                rule.contents += [
                    part.strip() for part in re.split(r"[,、，]", wanted) if part.strip()
                ]
    if found := re.search(r'include columns for\s+(?:"([^"]+)",?\s*)+', lowered):
        rule.headers += [
            name.strip() for name in re.findall(r'"([^"]+)"', found[0]) if name.strip()
        ]
    quoted = re.findall(r'[""]([^""]+)[""]', lowered)
    if quoted and not rule.headers:
        rule.headers += [
            name.strip().rstrip(",").strip() for name in quoted if name.strip().rstrip(",").strip()
        ]
    if found := re.search(
        r"each\s+\w+\s+must\s+include\s+(?:the\s+)?([\w\s]+\s+and\s+its\s+[\w\s]+)", lowered
    ):
        rule.contents += [
            part.strip() for part in re.split(r"\s+and\s+its\s+", found[1]) if part.strip()
        ]
    if "single column" in lowered:
        rule.columns = ("exact", 1)
    if found := re.search(rf"title\s+must\s+not\s+exceed\s+{_T}\s+words", lowered):
        rule.title_words = _table_number(found[1])
    if rule.contents:
        rule.contents = [item for item in dict.fromkeys(rule.contents) if item]
    return rule


def table_lines(text: str) -> list[str]:
    """The non-blank lines from the response's first `|` to its last `|`, stripped: what the
    official checker counts rows and columns in."""
    start, end = text.find("|"), text.rfind("|")
    if start < 0 or start == end:
        return []
    return [line.strip() for line in text[start : end + 1].split("\n") if line.strip()]


def _table_headers(lines: list[str]) -> list[str]:
    return [header.strip().lower() for header in lines[0].split("|")[1:-1]] if lines else []


def read_table(words: str) -> Rule:
    lowered = words.lower()
    rule = _table_rule(words)
    optional = any(re.search(pattern, lowered, re.DOTALL) for pattern in _OPTIONAL_TABLE)

    def judge(text: str) -> tuple[bool, str]:
        if "|" not in text:
            if "table" not in lowered or optional:
                return True, "no table (none is required)"
            return False, "no table"
        lines = table_lines(text)
        if rule.markdown and not any(re.match(r"^\s*\|", line) for line in lines):
            return False, "no line starts with |"
        rows = len(lines) - (2 if len(lines) > 1 and "---" in lines[1] else 1)
        columns = len(lines[0].split("|")) - 2 if lines else 0
        found = f"{rows} rows, {columns} columns"
        if rule.rows:
            kind, limit = rule.rows
            if (kind == "exact" and rows != limit) or (kind == "max" and rows > limit):
                return False, found
        if rule.columns:
            kind, limit = rule.columns
            if not lines:
                return False, "no table line"
            if (kind == "exact" and columns != limit) or (kind == "max" and columns > limit):
                return False, found
        if rule.title_words is not None:
            if not lines:
                return False, "no table line"
            title = len(lines[0].strip("|").strip().split())
            if title > rule.title_words:
                return False, f"a first line of {title} words"
        headers = _table_headers(lines)
        if "series must include" in lowered and all(
            w in lowered for w in ("title", "author", "year")
        ):
            passed = all(
                any(w in header for header in headers) for w in ("title", "author", "year")
            )
            return passed, f"headers {headers}"
        if "columns for" in lowered and rule.headers:
            if not lines:
                return False, "no table line"
            missing = [name for name in rule.headers
                       if not any(name.lower() in h or h in name.lower() for h in headers)]  # fmt: skip
            return not missing, f"headers {headers}" + (f" lack {missing[0]!r}" if missing else "")
        if rule.headers:
            if not lines:
                return False, "no table line"
            missing = [name for name in rule.headers if not any(name.lower() in h for h in headers)]
            if missing:
                return False, f"headers {headers} lack {missing[0]!r}"
        if "film title" in lowered and "release year" in lowered:
            passed = any("film" in h or "title" in h for h in headers) and any(
                "release" in h or "year" in h for h in headers
            )
            return passed, f"headers {headers}"
        if rule.contents:
            content = " ".join(" ".join(line.split("|")) for line in lines).lower()
            for wanted in rule.contents:
                wanted = wanted.lower()
                aliases = {"film title": ("film", "title"), "release year": ("release", "year"),
                           "title": ("title",), "author": ("author",), "year": ("year",),
                           "year of publication": ("year",)}  # fmt: skip
                if wanted in aliases and any(a in h for a in aliases[wanted] for h in headers):
                    continue
                if wanted == "publication" or wanted in content:
                    continue
                if any(any(part in h for part in wanted.split()) for h in headers):
                    continue
                return False, f"{found}; {wanted!r} not in the table"
        return True, found

    reading = rule.describe() + (" (only if a table is used)" if optional else "")
    return Rule(words, "table", judge, reading)


# -- Format / Json --------------------------------------------------------------------------------
_J = "(\\d+|two|three)"
_JSON_EXACT = (
    rf"exactly {_J} levels? of nesting", rf"structured as a json object with a nesting level of {_J}",
    rf"json example with exactly {_J} levels?", rf"object nesting levels must be {_J}",
    rf"answer must include a json example with exactly {_J} levels?", rf"nesting level of {_J}",
    rf"be limited to {_J} levels of nesting",
)  # fmt: skip
_JSON_MAX = (
    rf"must not exceed {_J} levels? of nesting", rf"no more than {_J} levels?",
    rf"maximum of {_J} nesting levels", rf"maximum of {_J} object nesting levels",
    rf"maximum of {_J} levels", rf"not exceed {_J} levels", rf"levels not exceeding {_J}",
    rf"with the structure not exceeding {_J} levels",
    rf"object nesting levels must not exceed {_J} levels", rf"object nesting levels must not exceed {_J}",
    rf"json must have a maximum of {_J} nesting levels", rf"response must not exceed {_J} levels? of nesting",
    rf"and at most {_J}",
)  # fmt: skip
_JSON_MIN = (
    rf"at least {_J} levels? of nesting", rf"at least {_J} levels? deep",
    rf"must include a json object with at least {_J} levels?",
    rf"answer must include a json object with at least {_J} levels?", rf"and at least {_J}",
)  # fmt: skip


def json_depth(value: Any) -> int:
    """Nesting depth as MulDimIF counts it: a scalar or an empty container 0, a container one
    more than its deepest member."""
    if isinstance(value, dict | list) and value:
        members = value.values() if isinstance(value, dict) else value
        return 1 + max(json_depth(member) for member in members)
    return 0


def read_json(words: str) -> Rule:
    plain = re.sub(r"[^\w\s]", "", words.lower())
    number = {"two": 2, "three": 3}
    exact = low = high = None
    for pattern in _JSON_EXACT:
        if found := re.search(pattern, plain):
            exact = int(found[1]) if found[1].isdigit() else number[found[1]]
            break
    if exact is None:
        for pattern in _JSON_MAX:
            for token in re.findall(pattern, plain):
                value = int(token) if token.isdigit() else number[token]
                high = value if high is None else min(high, value)
        for pattern in _JSON_MIN:
            for token in re.findall(pattern, plain):
                value = int(token) if token.isdigit() else number[token]
                low = value if low is None else max(low, value)
    else:
        low = high = exact
    readable = exact is not None or low is not None or high is not None

    def judge(text: str) -> tuple[bool, str]:
        fenced = re.search(r"```json(.*?)```", text, re.DOTALL)
        try:
            value = json.loads(fenced[1].strip() if fenced else text)
        except (json.JSONDecodeError, RecursionError):
            return False, "no JSON (the whole response, or its ```json block, does not parse)"
        try:
            depth = json_depth(value)
        except RecursionError:
            return False, "JSON nested too deep to measure"
        if not readable:
            return False, f"depth {depth}, no level limit read"
        return _within(depth, low, high), f"JSON nesting depth {depth}"

    reading = (
        _bounds_text(low, high, "nesting levels")
        if readable
        else "no level limit the official checker reads: never satisfied"
    )
    return Rule(words, "json", judge, reading)


# -- Format / Others (XML attributes, bullets, block quotes, table rows, references, lengths) ----
# A tag: name, attributes each after a space, optional /, >. (The official pattern puts a
# second `\s*` before the attributes, the same tags in time quadratic in a run of spaces.)
_XML_TAG = re.compile(r"<\s*([a-zA-Z_:][\w:.-]*)(?:\s+[a-zA-Z_:][\w:.-]*=['\"][^'\"]*['\"])*\s*/?>")
_XML_ATTRIBUTE = re.compile(r"(\w+)=[\"'][^\"']*[\"']")


def xml_attribute_counts(text: str) -> list[int] | None:
    """Attributes per XML tag (of the ```xml block when the text has one; None when that
    block is not closed)."""
    if "```xml" in text:
        block = re.search(r"```xml(.*?)```", text, re.DOTALL)
        if not block:
            return None
        text = block[1]
    return [len(_XML_ATTRIBUTE.findall(tag[0])) for tag in _XML_TAG.finditer(text)]


def _attributes(low: int | None, high: int | None) -> Callable[[str], tuple[bool, str]]:
    def judge(text: str) -> tuple[bool, str]:
        counts = xml_attribute_counts(text)
        if counts is None:
            return False, "an unclosed ```xml block"
        passed = all(_within(count, low, high) for count in counts)
        return passed, f"tags with {counts} attributes" if counts else "no XML tag"

    return judge


def _table_rows_judge(limit: int) -> Callable[[str], tuple[bool, str]]:
    def judge(text: str) -> tuple[bool, str]:
        lines = re.findall(r"^\|.*\|$", text, flags=re.MULTILINE)
        rows = [line for line in lines if not re.match(r"^\|(\s*-+\s*\|)+$", line)]
        html = text.lower().count("<tr>")
        return len(
            rows
        ) <= limit and html <= limit, f"{len(rows)} |-rows (header included), {html} <tr>"

    return judge


def _found(pattern: str, flags: int = re.MULTILINE) -> Callable[[str], bool]:
    return lambda text: bool(re.search(pattern, text, flags))


_CITATION = re.compile(r"(\[\d+\]|\([A-Za-z]+, \d{4}\))")


def _references_judge(least: int) -> Callable[[str], tuple[bool, str]]:
    def judge(text: str) -> tuple[bool, str]:
        found = len(_CITATION.findall(text))
        return found >= least, f"{found} citations"

    return judge


_TEN_WORD = "(\\d+|one|two|three|four|five|six|seven|eight|nine|ten)"


def _others_rules() -> list[
    tuple[str, Callable[..., tuple[str, Callable[[str], tuple[bool, str]]]]]
]:
    """(pattern, maker): the first pattern found in the words (any case) makes the rule."""

    def number(token: str) -> int:
        return int(token) if token.isdigit() else ONE_TO_TEN[token.lower()]

    def test(what: str, predicate: Callable[[str], bool], yes: str, no: str) -> Any:
        return lambda *_: (what, lambda text: (predicate(text), yes if predicate(text) else no))

    return [
        (rf"no more than {_TEN_WORD} attributes?", lambda n: (f"at most {number(n)} attributes per XML tag", _attributes(None, number(n)))),
        (rf"must not exceed {_TEN_WORD}(?:.*)?attributes?", lambda n: (f"at most {number(n)} attributes per XML tag", _attributes(None, number(n)))),
        (r"Limit the number of attributes to two", lambda: ("exactly 2 attributes per XML tag", _attributes(2, 2))),
        (rf"Number of attributes must be exactly {_TEN_WORD}", lambda n: (f"exactly {number(n)} attributes per XML tag", _attributes(number(n), number(n)))),
        (rf"must have exactly {_TEN_WORD} attributes?", lambda n: (f"exactly {number(n)} attributes per XML tag", _attributes(number(n), number(n)))),
        (rf"must include exactly {_TEN_WORD} attributes?", lambda n: (f"exactly {number(n)} attributes per XML tag", _attributes(number(n), number(n)))),
        (rf"at least {_TEN_WORD} attributes?", lambda n: (f"at least {number(n)} attributes per XML tag", _attributes(number(n), None))),
        (r"Must include '(.*?)'", lambda phrase: (f"contains {phrase!r}", lambda text: (bool(re.search(r"\b" + re.escape(phrase) + r"\b", text, re.I)), "searched"))),
        (r"Must be in APA format", test("an (Author, year) citation", _found(r"\(\s*\w+,\s*\d{4}\s*\)", 0), "found one", "none")),
        (r"must be provided in APA format", test("an (Author, year) citation", _found(r"\(\s*\w+,\s*\d{4}\s*\)", 0), "found one", "none")),
        (r"No bullet points", test("no line starting with - or *", lambda t: not some_line_starts(r"\s*[-*]", t), "none", "a line starts with - or *")),
        (r"Must be listed as bullet points", test("a line starting with - or *", lambda t: some_line_starts(r"\s*[-*]", t), "found", "none")),
        (r"is structured as bullet points", test("a line starting with - or *", lambda t: some_line_starts(r"\s*[-*]", t), "found", "none")),
        (r"block quotes format", test("a > line or <blockquote>", lambda t: bool(re.search(r"^>", t, re.M)) or "<blockquote>" in t.lower(), "found", "none")),
        (r"be formatted in block quotes", test("a > line or <blockquote>", lambda t: bool(re.search(r"^>", t, re.M)) or "<blockquote>" in t.lower(), "found", "none")),
        (rf"no more than {_TEN_WORD} rows", lambda n: (f"at most {number(n)} table lines", _table_rows_judge(number(n)))),
        (rf"table with no more than {_TEN_WORD} rows", lambda n: (f"at most {number(n)} table lines", _table_rows_judge(number(n)))),
        (rf"a table, which is limited to a maximum of {_TEN_WORD} rows", lambda n: (f"at most {number(n)} table lines (header included)", _table_rows_judge(number(n)))),
        (r"full sentences", test("full sentences (always satisfied)", lambda t: True, "any text", "")),
        (r"short blurb", lambda: ("at most 200 characters", lambda text: (len(text) <= 200, f"{len(text)} characters"))),
        (rf"The answer must include at least {_TEN_WORD} references?", lambda n: (f"at least {number(n)} [n] or (Author, year) citations", _references_judge(number(n)))),
        (r"No lists", test("no numbered line", lambda t: not some_line_starts(r"\s*(\d+\.)\s", t), "none", "a numbered line")),
        (r"No number points", test("no numbered line", lambda t: not some_line_starts(r"\s*\d+\.", t), "none", "a numbered line")),
        (r"Response must be written at medium length", lambda: ("201 to 400 characters", lambda text: (200 < len(text) <= 400, f"{len(text)} characters"))),
    ]  # fmt: skip


def read_others_format(words: str) -> Rule:
    for pattern, make in _others_rules():
        if found := re.search(pattern, words, re.I):
            reading, judge = make(*found.groups())
            return Rule(words, "others_format", judge, reading)
    return Rule(words, "others_format", lambda text: (False, "no rule read"),
                "no rule the official checker reads: never satisfied")  # fmt: skip
