"""MulDimIF's checkers: each constraint's words read into a rule, the rule checked as MulDimIF's
official evaluation (`Code/evaluation/scripts`, commit efd0c02) checks it.

MulDimIF dispatches a constraint `[category, subtype, words]` to one of twelve checkers by
`category_subtype` (`FAMILIES`); the checker reads the words with its own phrase patterns.
The verdicts here are the official ones, quirks included (docs/results/instructions.md lists
them): a constraint in whose words the official reader finds no rule gets one verdict
whatever the response (a `Length/Sentences` one passes, a `Length/Paragraphs` one fails), "at least 150 words" in a
keyword constraint also asks each keyword 150 times, one CJK character in a response switches
word counting to CJK characters, and a "table row" is a line between the first and the last
`|` minus the header (and its `---` line). Where the official reader would crash (a number it
cannot read), `parse_constraint` raises ValueError naming the words: the row cannot be
scored, never passed silently.

`parse_constraint(category, subtype, words)` gives a `Rule`; `Rule.check(response)` an
`Outcome` whose reason says what was found. The package registers one checker per (category,
subtype) in `MULDIMIF_CHECKERS` (ids `muldimif/<category>/<subtype>`).
"""

from __future__ import annotations

import functools
import json
import logging
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mrtpo.tasks.instructions import registry
from mrtpo.tasks.instructions.registry import Outcome

logger = logging.getLogger(__name__)

ID_PREFIX = "muldimif/"


def instruction_id(category: str, subtype: str) -> str:
    """The instruction id of a MulDimIF constraint: `muldimif/<category>/<subtype>`."""
    return f"{ID_PREFIX}{category}/{subtype}"


def split_instruction_id(value: str) -> tuple[str, str]:
    """(category, subtype) of a `muldimif/<category>/<subtype>` id; ValueError otherwise."""
    if not value.startswith(ID_PREFIX) or "/" not in value[len(ID_PREFIX) :]:
        raise ValueError(f"instruction id {value!r} is not a MulDimIF one")
    category, subtype = value[len(ID_PREFIX) :].split("/", 1)
    return category, subtype


# -- dispatch ------------------------------------------------------------------------------------
# (category, subtype) -> the official checker family, for every pair MulDimIF's evaluation knows.
FAMILIES: dict[tuple[str, str], str] = {
    **{("Content", s): "keywords" for s in ("Keywords", "Keywords: Must include", "Mention")},
    **{
        ("Length", s): "words"
        for s in ("Words", "Words: At most", "Words: At least", "Words: Range")
    },
    ("Words", "At most"): "words",
    ("Content", "Length"): "others_content",
    **{
        ("Length", s): "sentences"
        for s in ("Sentences", "Sentences: At least", "Sentences: At most", "Sentences: Range")
    },
    ("Sentences", "At most"): "sentences",
    ("Sentences", "At least"): "sentences",
    **{
        ("Length", s): "paragraphs"
        for s in ("Paragraphs", "Paragraphs: At most", "Paragraphs: At least", "Paragraphs: Range")
    },
    ("Paragraphs", "At most"): "paragraphs",
    **{
        pair: "table"
        for pair in (
            ("Format", "Table"),
            ("Table", "Row limit"),
            ("Table", "Column limit"),
            ("Format", "Table: Row limit"),
            ("Format", "Table: Column limit"),
        )
    },
    ("Punctuation", "Ending punctuation"): "punctuation",
    ("Content", "Punctuation: Ending punctuation"): "punctuation",
    ("Content", "Punctuation"): "punctuation",
    **{
        ("Language", s): "english"
        for s in ("English", "English: Capitalized", "English: All Uppercase")
    },
    ("Format", "Markdown"): "markdown",
    ("Markdown", "Heading levels"): "markdown",
    ("Format", "Markdown: Heading levels"): "markdown",
    ("Markdown", "Block quotes"): "markdown",
    ("Json", "Object nesting levels"): "json",
    ("Format", "Json"): "json",
    ("Json", "Number of attributes"): "json",
    **{
        ("Language", s): "chinese"
        for s in ("Chinese", "Chinese: Simplified", "Chinese: Traditional")
    },
    **{("Content", s): "others_content" for s in ("Identifiers", "Quotes", "Sources")},
    ("Citations", "In-text"): "others_content",
    **{
        pair: "others_format"
        for pair in (
            ("Format", "Markdown: Block quotes"),
            ("Format", "Text"),
            ("XML", "Number of attributes"),
            ("References", "Format"),
            ("Format", "Bullet Points"),
            ("Format", "XML"),
            ("Format", "Blurb"),
            ("Table", "Table"),
            ("Format", "Length"),
        )
    },
    ("Format", "Word Count"): "words",
}

# The official report's category and type of each pair (its `constraint_mapping`): the four
# categories and twelve types MulDimIF's tables show.
REPORTED_TYPES: dict[tuple[str, str], str] = {
    **{pair: "Content_Keywords" for pair in FAMILIES if FAMILIES[pair] == "keywords"},
    **{pair: "Length_Words" for pair in FAMILIES if FAMILIES[pair] == "words"},
    **{pair: "Length_Sentences" for pair in FAMILIES if FAMILIES[pair] == "sentences"},
    **{pair: "Length_Paragraphs" for pair in FAMILIES if FAMILIES[pair] == "paragraphs"},
    **{pair: "Format_Table" for pair in FAMILIES if FAMILIES[pair] == "table"},
    **{pair: "Content_Punctuation" for pair in FAMILIES if FAMILIES[pair] == "punctuation"},
    **{pair: "Language_English" for pair in FAMILIES if FAMILIES[pair] == "english"},
    **{pair: "Format_Markdown" for pair in FAMILIES if FAMILIES[pair] == "markdown"},
    **{pair: "Format_Json" for pair in FAMILIES if FAMILIES[pair] == "json"},
    **{pair: "Language_Chinese" for pair in FAMILIES if FAMILIES[pair] == "chinese"},
    ("Content", "Identifiers"): "Content_Identifiers",
    ("Content", "Length"): "Length_Words",
    ("Citations", "In-text"): "Content_Identifiers",
    ("Content", "Quotes"): "Content_Punctuation",
    ("Content", "Sources"): "Content_Identifiers",
    ("Content", "Mention"): "Content_Keywords",
    ("Format", "Markdown: Block quotes"): "Format_Markdown",
    ("Format", "Text"): "Content_Identifiers",
    ("XML", "Number of attributes"): "Format_XML",
    ("References", "Format"): "Content_Identifiers",
    ("Format", "Bullet Points"): "Content_Identifiers",
    ("Format", "XML"): "Format_XML",
    ("Format", "Blurb"): "Length_Words",
    ("Table", "Table"): "Format_Table",
    ("Format", "Length"): "Length_Words",
}


def reported_type(category: str, subtype: str) -> str:
    """The official report's `Category_Type` of a pair (e.g. `Format_Table` for Table/Row
    limit); the pair itself, joined, for one MulDimIF does not know."""
    return REPORTED_TYPES.get((category, subtype), f"{category}_{subtype}")


# -- numbers ---------------------------------------------------------------------------------------
UNITS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
         "fifteen sixteen seventeen eighteen nineteen").split()  # fmt: skip
TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
        "eighty": 80, "ninety": 90}  # fmt: skip
NUMBER_WORDS = {**{word: value for value, word in enumerate(UNITS)}, **TENS, "hundred": 100}
ONE_TO_TEN = {word: NUMBER_WORDS[word] for word in UNITS[1:11]}
CJK_NUMERALS = {"一": 1, "二": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9,
                "十": 10, "两": 2}  # fmt: skip


def compound_number(words: str, vocabulary: dict[str, int] = NUMBER_WORDS) -> int | None:
    """A number written in words ("one hundred fifty", "twenty-five"), digits with commas,
    or None when a part is not a number word."""
    words = words.strip().replace(",", "")
    if words.isdigit():
        return int(words)
    total = pending = 0
    for part in re.split(r"[\s-]+", words.lower()):
        if part not in vocabulary:
            return None
        value = vocabulary[part]
        if value >= 100:  # "hundred" multiplies what precedes it
            total += max(pending, 1) * value
            pending = 0
        else:
            pending += value
    return total + pending


def _need_number(value: int | None, words: str, what: str) -> int:
    if value is None:
        raise ValueError(f"cannot read the number of {what} in {words!r}")
    return value


def _alternatives(names: Any) -> str:
    return "|".join(names)


def _shown(items: Any, limit: int = 3) -> str:
    items = list(items)
    head = ", ".join(repr(item if len(item) < 40 else item[:37] + "...") for item in items[:limit])
    return head + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _keyword_regex(keyword: str) -> re.Pattern[str]:
    """A keyword as the official checkers find it: as a whole token, any case; a keyword with
    a CJK ideograph anywhere, case-sensitively and inside other text."""
    if any("\u4e00" <= char <= "\u9fff" for char in keyword):
        return re.compile(re.escape(keyword))
    return re.compile(rf"(?<!\w){re.escape(keyword)}(?!\w)", re.IGNORECASE)


def _count_keyword(keyword: str, text: str) -> int:
    return len(_keyword_regex(keyword).findall(text))


# -- the shape of a response (the official "each ..." checkers read elements by it) ---------------
def some_line_starts(pattern: str, text: str) -> bool:
    """Whether `pattern` (which opens with `\\s*`) matches at the start of a line of `text`,
    each line with its newline: what `re.search("^" + pattern, text, re.M)` finds, without its
    time quadratic in a run of blank lines (its `\\s*` crosses them from every line start)."""
    lines = text.split("\n")
    last = len(lines) - 1
    return any(
        re.match(pattern, line + ("\n" if index < last else "")) for index, line in enumerate(lines)
    )


_BULLET_LINE = re.compile(r"^\s*[-*] ")
_NUMBERED_LINE = re.compile(r"^\s*\d+\.\s+")


def response_shape(text: str) -> str:
    """json (the text opens with { or [), table (a line of |...|), numbered (opens with "1. "),
    bullet (opens with "- " or "* ") or plain, in this order."""
    if re.match(r"\s*[{\[]", text):
        return "json"
    if some_line_starts(r"\s*\|.+\|", text):
        return "table"
    if _NUMBERED_LINE.match(text):
        return "numbered"
    if _BULLET_LINE.match(text):
        return "bullet"
    return "plain"


def _after_first_space(line: str) -> str:
    return line.split(" ", 1)[1].strip()


@dataclass(frozen=True)
class Rule:
    """A constraint read into a rule: `check(text)` gives the official verdict and a reason."""

    words: str
    family: str
    judge: Callable[[str], tuple[bool, str]] = field(compare=False, repr=False)
    reading: str = ""  # what the reader took from the words, for the verdict's information

    def check(self, text: str) -> Outcome:
        passed, found = self.judge(text)
        reason = found if not self.reading else f"{found} (read as: {self.reading})"
        return Outcome(passed, reason, ((0, len(text)),) if text else ())


# -- Content / Keywords ---------------------------------------------------------------------------
@dataclass(frozen=True)
class KeywordRule:
    keywords: tuple[str, ...] = ()
    min_count: int = 1
    exclude: bool = False
    any_of: bool = False
    end_period: bool = False
    capitalized: bool = False
    min_words: int = 0
    max_words: float = float("inf")

    def describe(self) -> str:
        parts = []
        if self.keywords:
            how = "none of" if self.exclude else ("any of" if self.any_of else "each of")
            times = (
                "" if self.exclude or self.min_count == 1 else f" at least {self.min_count} times"
            )
            parts.append(f"{how} {_shown(self.keywords, 5)}{times}")
        else:
            parts.append("no quoted keyword")
        if self.min_words or self.max_words != float("inf"):
            parts.append(f"{self.min_words} to {self.max_words} words")
        if self.end_period:
            parts.append("ends with a period")
        if self.capitalized:
            parts.append("every word capitalized")
        return "; ".join(parts)

    def judge(self, text: str) -> tuple[bool, str]:
        words = text.split()
        if self.capitalized:
            lower = [word for word in words if not word[0].isupper()]
            if lower:
                return False, f"the word {lower[0]!r} does not start with a capital"
        if self.end_period and not text.strip().endswith("."):
            return False, "it does not end with a period"
        if not self.min_words <= len(words) <= self.max_words:
            return False, f"{len(words)} words"
        counts = {keyword: _count_keyword(keyword, text) for keyword in self.keywords}
        if self.exclude:
            present = [keyword for keyword, n in counts.items() if n]
            if present:
                return False, f"the avoided keyword {present[0]!r} appears"
            return True, "no avoided keyword appears"
        found = ", ".join(f"{keyword!r} {n}x" for keyword, n in counts.items())
        if self.any_of:
            return any(n >= self.min_count for n in counts.values()), f"found {found or 'nothing'}"
        missing = [keyword for keyword, n in counts.items() if n < self.min_count]
        if missing:
            return False, f"found {found}"
        return True, f"found {found}" if found else "no keyword to look for"


_QUOTED_TWICE = re.compile(r'["”]{2}([^"“]+)["“]{2}')
_QUOTED = re.compile(r"[\"'「“]([^\"']+)[\"'」”]")
_COUNTS = _alternatives([*ONE_TO_TEN, "once", "twice"])
_KEYWORD_COUNT_WORDS = {**ONE_TO_TEN, "once": 1, "twice": 2}


def read_keyword_rule(words: str) -> KeywordRule:
    """The general keyword reading of the official Content_Keywords checker."""
    text = words.strip()
    while re.match(r'^"+(.*[^"])"+$', text):  # outer double quotes, however many
        text = re.sub(r'^"+(.*[^"])"+$', r"\1", text)
    settings: dict[str, Any] = {
        "end_period": bool(re.search(r"must\s+end\s+with\s+(a\s+)?period", text, re.I)),
        "capitalized": bool(
            re.search(r"must\s+use\s+capitalized\s+letters\s+for\s+each\s+word", text, re.I)
        ),
    }
    if found := re.search(r"(?:at\s+least|minimum\s+of)\s+(\S+)\s+word", text, re.I):
        settings["min_words"] = _need_number(
            compound_number(found[1], ONE_TO_TEN | {"twice": 2}), words, "words"
        )
    if found := re.search(
        r"(?:not\s+exceed|at\s+most|no\s+more\s+than|maximum\s+of)\s+(\S+)\s+word", text, re.I
    ):
        settings["max_words"] = _need_number(
            compound_number(found[1], ONE_TO_TEN | {"twice": 2}), words, "words"
        )
    if re.search(r"is\s+a\s+single\s+word", text, re.I):
        settings["min_words"] = settings["max_words"] = 1
    if re.search(r"(avoid\s+using\s+(the\s+)?term|must\s+be\s+avoided)", text, re.I):
        quoted = re.search(r"[\"']([^\"']+)[\"']", text)
        if quoted:
            return KeywordRule(keywords=(quoted[1],), exclude=True, **settings)
        return KeywordRule(**settings)
    settings["any_of"] = bool(re.search(r"\bOR\b", text, re.I))
    if found := re.search(
        rf"at least (\d+|{_COUNTS})(?:\s+times?)?\b(?!\s+words\s+long)", text, re.I
    ):
        count = found[1].lower()
        settings["min_count"] = int(count) if count.isdigit() else _KEYWORD_COUNT_WORDS[count]
    if re.search(r"must appear multiple times", text, re.I):
        settings["min_count"] = 2
    if _QUOTED_TWICE.search(text):
        keywords = [found[1] for found in _QUOTED_TWICE.finditer(text)]
    else:
        keywords = [found[1] for found in _QUOTED.finditer(text)]
    return KeywordRule(keywords=tuple(keywords), **settings)


def _keyword_table_cells(text: str, target: str) -> list[str]:
    """The cells of the column whose header best matches `target`'s words (else the column
    with the most words per cell) of the response's first |-table."""
    lines = [line.strip() for line in text.split("\n")]
    lines = [line for line in lines if line.startswith("|") and line.endswith("|")]
    if len(lines) < 3:
        return []
    headers = [cell.strip() for cell in lines[0].split("|")[1:-1]]
    if not headers:
        return []
    rows = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) == len(headers):
            rows.append(dict(zip(headers, cells, strict=True)))
    if not rows:
        return []

    def bare(word: str) -> str:
        return re.sub(r"\W", "", word).lower()

    def unheaded(cell: str) -> str:
        return re.sub(r"^#+\s*", "", cell).strip()

    wanted = {bare(word) for word in target.split() if bare(word)}
    best, best_score = None, -1
    for header in headers:
        score = sum(1 for word in header.split() if bare(word) and bare(word) in wanted)
        if score > best_score:
            best, best_score = header, score
    if best_score <= 0:
        means = {}
        for header in headers:
            cells = [unheaded(row[header]) for row in rows if header in row]
            if cells:
                means[header] = sum(len(cell.split()) for cell in cells) / len(cells)
        if not means:
            return []
        best = max(means, key=means.get)  # type: ignore[arg-type]
    return [unheaded(row[best]) for row in rows if best in row]


def _is_separator_line(line: str) -> bool:
    line = line.strip()
    return len(line) >= 3 and line[0] in "-*=" and line == line[0] * len(line)


def keyword_elements(text: str, target: str) -> list[str] | None:
    """What an "each X must ..." keyword constraint checks, by the response's shape."""
    shape = response_shape(text)
    if shape == "table":
        return _keyword_table_cells(text, target)
    if shape == "json":
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            return []
        if isinstance(value, dict):
            # the official checker matches keywords in Python's str() of each value
            return [str(item) for item in value.values()]
        if isinstance(value, list):
            return [str(item) for item in value]
        return None
    if shape == "numbered":
        return [
            line.split(".", 1)[1].strip() for line in text.split("\n") if _NUMBERED_LINE.match(line)
        ]
    if shape == "bullet":
        return [_after_first_space(line) for line in text.split("\n") if _BULLET_LINE.match(line)]
    sections, current = [], []
    for line in text.split("\n"):
        if _is_separator_line(line):
            if current:
                sections.append("\n".join(current).strip())
                current = []
        else:
            current.append(line)
    if current:
        sections.append("\n".join(current).strip())
    return sections or [text]


def read_keywords(words: str) -> Rule:
    if re.search(r"\b(each|every)\b", words, re.I) and "for each word" not in words:
        each = re.search(
            r"\b(each|every)\s+(.+?)\s+(must|should|needs to|has to)\s+(.*)", words, re.I
        )
        if not each:
            return Rule(words, "keywords", lambda text: (False, "no element to check"),
                        "an 'each' constraint the official checker cannot split: never satisfied")  # fmt: skip
        target, rule = each[2].lower(), read_keyword_rule(each[4])

        def judge_each(text: str) -> tuple[bool, str]:
            elements = keyword_elements(text, target)
            if not elements:
                return False, f"no {target} found in the response"
            for element in elements:
                passed, found = rule.judge(element)
                if not passed:
                    return False, f"the {target} {_shown([element], 1)}: {found}"
            return True, f"all {len(elements)} {target} elements pass"

        return Rule(words, "keywords", judge_each, f"each {target}: {rule.describe()}")
    include = re.search(r"includes?\s+the\s+keyword\s+[\"']([^\"']+)[\"']", words, re.I)
    avoid = re.search(r"avoids?\s+the\s+keyword\s+[\"']([^\"']+)[\"']", words, re.I)
    if include and avoid:
        wanted, unwanted = include[1], avoid[1]

        def judge_pair(text: str) -> tuple[bool, str]:
            passed = wanted in text and unwanted not in text
            return passed, f"{wanted!r} {'in' if wanted in text else 'not in'} the text, " + (
                f"{unwanted!r} {'in' if unwanted in text else 'not in'} it"
            )

        return Rule(
            words, "keywords", judge_pair, f"contains {wanted!r}, not {unwanted!r} (exact case)"
        )
    conditions = re.findall(
        r"If discussing\s+([^,]+),\s*the summary must include the keyword\s+[\"']([^\"']+)[\"']",
        words,
        re.I,
    )
    if conditions:
        return Rule(words, "keywords", functools.partial(_judge_topics, tuple(conditions)),
                    "a keyword per topic discussed")  # fmt: skip
    rule = read_keyword_rule(words)
    return Rule(words, "keywords", rule.judge, rule.describe())


def _judge_topics(conditions: tuple[tuple[str, str], ...], text: str) -> tuple[bool, str]:
    for topic, keyword in conditions:
        if "/" in topic:
            split = re.match(r"^(.*\s)(\S+)/(\S+)(\s.*)$", topic)
            if split:
                variants = [split[1] + split[2] + split[4], split[1] + split[3] + split[4]]
            else:
                variants = [part.strip() for part in topic.split("/")]
        else:
            variants = [topic]
        if any(variant in text for variant in variants) and keyword not in text:
            return False, f"discusses {topic!r} without {keyword!r}"
    return True, "every topic discussed has its keyword"


# -- Length / Words -------------------------------------------------------------------------------
_CJK = "\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\u3000-\u303f\uff00-\uffef"
_CJK_CHAR = re.compile(f"[{_CJK}]")


def count_words_official(text: str) -> tuple[int, str]:
    """MulDimIF's word count: CJK characters (ideographs, CJK punctuation, full-width forms)
    when the text has one, else whitespace-separated words."""
    cjk = _CJK_CHAR.findall(text)
    if cjk:
        return len(cjk), "CJK characters"
    return len(text.split()), "words"


_WORD_RANGES = (
    r"between\s+([a-z0-9-– ]+?)\s+to\s+([a-z0-9-– ]+?)(?=\s*word|$|\b)",
    r"between\s+([a-z0-9-– ]+?)\s+and\s+([a-z0-9-– ]+?)(?=\s*word|$|\b)",
    r"range:?\s*([a-z0-9-– ]+?)\s+to\s+([a-z0-9-– ]+?)(?=\s*word|$|\b)",
    r"range:?\s*([a-z0-9-– ]+?)\s*[-–]\s*([a-z0-9-– ]+?)(?=\s*word|$|\b)",
    r"(\b[a-z0-9-–]+\b)\s+to\s+(\b[a-z0-9-–]+\b)(?=\s*word|$|\b)",
    r"(\b[a-z0-9-–]+\b)\s*[-–]\s*(\b[a-z0-9-–]+\b)(?=\s*word|$|\b)",
    r"([0-9]+)\s*到\s*([0-9]+)(?=\s*个|字)",
)
_WORD_MIN = r"(?:at\s+least|minimum\s+of|minimum\s+length\s+of|no\s+less\s+than)\s+(\S+)\s+word"
_WORD_MAX = (
    r"(?:not\s+exceed|not\s+exceeding|not\s+surpass|at\s+most|no\s+more\s+than|maximum\s+of"
    r"|maximum\s+length\s+of|no\s+longer\s+than|limit\s+of|within|within\s+a)\s+(\S+)\s+word"
)
_WORD_MAX_CJK = (
    r"(?:最多)([0-9]+)(?:个|字)",
    r"(?:在)([0-9]+)\s*(?:个单词以内|个字以内|字以内|单词以内|词以内|字)",
)
_SENTENCE_MIN = r"(?:at\s+least|minimum\s+of)\s+(\S+)\s+sentence"
_SENTENCE_MAX = (
    r"(?:not\s+exceed|at\s+most|no\s+more\s+than|maximum\s+of|maximum\s+length\s+of"
    r"|no\s+longer\s+than)\s+(\S+)\s+sentence"
)


def _bounds_text(low: int | None, high: int | None, unit: str) -> str:
    if low is not None and high is not None:
        return f"{low} {unit}" if low == high else f"{low} to {high} {unit}"
    if low is not None:
        return f"at least {low} {unit}"
    if high is not None:
        return f"at most {high} {unit}"
    return f"any number of {unit}"


def _within(count: int, low: int | None, high: int | None) -> bool:
    return (low is None or count >= low) and (high is None or count <= high)


def read_words(words: str) -> Rule:
    if re.search(r"\beach\b", words, re.I):
        return _read_words_each(words)
    text = re.sub(r"\s+", " ", words.lower().strip('"').strip())
    for old, new in (("-word", " word"), ("a total of ", ""), ("words", "word"),
                     ("a single", "exactly one")):  # fmt: skip
        text = text.replace(old, new)
    text = text.strip()
    exact = re.search(r"exactly\s+([a-z0-9-, ]+?)\s+(\S+)", text)
    if exact and (number := compound_number(exact[1])) is not None:

        def judge_exact(response: str) -> tuple[bool, str]:
            count, unit = count_words_official(response)
            return count == number, f"{count} {unit}"

        return Rule(words, "words", judge_exact, f"exactly {number} words")
    low = high = None
    for pattern in _WORD_RANGES:
        if found := re.search(pattern, text):
            low, high = compound_number(found[1].strip()), compound_number(found[2].strip())
            if low is not None and high is not None:
                low, high = min(low, high), max(low, high)
                break
    if low is None and (found := re.search(_WORD_MIN, text)):
        low = _need_number(compound_number(found[1]), words, "words")
    if high is None and (found := re.search(_WORD_MAX, text)):
        high = _need_number(compound_number(found[1]), words, "words")
    for pattern in _WORD_MAX_CJK:
        if high is None and (found := re.search(pattern, text)):
            high = compound_number(found[1])
    fewest_sentences = most_sentences = None
    if found := re.search(_SENTENCE_MIN, text):
        fewest_sentences = _need_number(compound_number(found[1]), words, "sentences")
    if found := re.search(_SENTENCE_MAX, text):
        most_sentences = _need_number(compound_number(found[1]), words, "sentences")
    keywords = tuple(found[1] for found in re.finditer(r"[\"']([^\']*)[\"']", text))

    def judge(response: str) -> tuple[bool, str]:
        missing = [keyword for keyword in keywords if not _count_keyword(keyword, response)]
        if missing:
            return False, f"the quoted {missing[0]!r} does not appear"
        count, unit = count_words_official(response)
        if not _within(count, low, high):
            return False, f"{count} {unit}"
        sentences = len(re.findall(r"[.!?]+", response))
        if not _within(sentences, fewest_sentences, most_sentences):
            return False, f"{sentences} sentence ends"
        return True, f"{count} {unit}"

    reading = _bounds_text(low, high, "words")
    if fewest_sentences is not None or most_sentences is not None:
        reading += ", " + _bounds_text(fewest_sentences, most_sentences, "sentence ends")
    if keywords:
        reading += f", containing {_shown(keywords)}"
    return Rule(words, "words", judge, reading)


_EACH_WORD_LIMITS = (
    (r"between (\d+) and (\d+) words", "range"),
    (r"range: (\d+)-(\d+) words", "range"),
    (r"at least (\d+) words", "min"),
    (r"a minimum of (\d+) words", "min"),
    (r"a minimum length of (\d+) words", "min"),
    (r"at most (\d+) words", "max"),
    (r"exactly (\d+) words", "exact"),
    (r"no more than (\d+) words", "max"),
    (r"not exceed (\d+) words", "max"),
    (r"a maximum of (\d+) words", "max"),
    (r"a maximum length of (\d+) words", "max"),
    (r"limit of (\d+) words", "max"),
    (r"not exceeding (\d+) words", "max"),
    (r"less than (\d+) words", "max"),
)
_EACH_NUMBER_WORDS = re.compile(rf"\b({_alternatives(NUMBER_WORDS)})\b", re.I)


def _read_words_each(words: str) -> Rule:
    if re.search(r"each word must be", words, re.I):
        found = re.search(
            r"(?i)must be (at most|at least) (\b(?:one|two|three|four|five|six|seven|eight|nine|ten"
            r"|\d+)\b) characters",
            words,
        )
        if not found or not found[2].isdigit():
            raise ValueError(f"cannot read the characters per word in {words!r}")
        limit, at_most = int(found[2]), found[1] == "at most"

        def judge_characters(text: str) -> tuple[bool, str]:
            for word in text.split(" "):
                if (len(word) > limit) if at_most else (len(word) < limit):
                    return False, f"the word {word!r} has {len(word)} characters"
            return True, "every word within the limit"

        return Rule(words, "words", judge_characters, f"{found[1]} {limit} characters per word")
    text = _EACH_NUMBER_WORDS.sub(lambda m: str(NUMBER_WORDS[m[0].lower()]), words)
    target_found = re.search(
        r"(?:each entry in the|Each entry in the|Each|each|The|the)\s+(.+?)\s+(?:is|in the table"
        r"|column|must|consists of|contains?|should|have)",
        text,
        re.I,
    )
    target = target_found[1].lower().replace('"', "").replace("'", "") if target_found else None
    for pattern, kind in _EACH_WORD_LIMITS:
        if found := re.search(pattern, text, re.I):
            low = int(found[1]) if kind in ("range", "min", "exact") else None
            high = {"range": 2, "max": 1, "exact": 1}.get(kind)
            high = int(found[high]) if high else None
            break
    else:
        return Rule(words, "words", lambda text: (False, "no word limit read"),
                    "no word limit the official checker reads: never satisfied")  # fmt: skip

    def judge(response: str) -> tuple[bool, str]:
        elements = words_elements(response, target)
        if not elements:
            return False, "no element to count"
        for element in elements:
            count = len(element.split())
            if not _within(count, low, high):
                return False, f"the element {_shown([element], 1)} has {count} words"
        return True, f"all {len(elements)} elements within the limit"

    return Rule(
        words, "words", judge, f"each {target or 'element'}: {_bounds_text(low, high, 'words')}"
    )


def words_elements(text: str, target: str | None) -> list[str]:
    """What an "each ... N words" constraint counts, by the response's shape."""
    shape = response_shape(text)
    if shape == "table":
        return _word_table_cells(text, target or "cells")
    if shape == "json":
        try:
            value = json.loads(text)
            if "entry" in target:  # type: ignore[operator]  # None raises, as officially
                return [str(item) for item in value.values()]
            return [str(value.get(target.split()[-1], ""))]  # type: ignore[union-attr]
        except Exception:  # the official checker counts any failure as no element
            return []
    if shape == "numbered":
        return [
            line.split(":", 1)[-1].split(".", 1)[-1].strip()
            for line in text.split("\n")
            if _NUMBERED_LINE.match(line)
        ]
    if shape == "bullet":
        return [_after_first_space(line) for line in text.split("\n") if _BULLET_LINE.match(line)]
    return [
        line.strip().lstrip("#").strip()
        for line in text.split("\n")
        if line.strip()
        and not line.strip().strip("*#'\"").endswith(":")
        and not re.match(r"^\|.*\|$", line.strip())
    ]


_HEADER_BREAK = "<TitleSplit>"  # stands for the |---| line among the cells, as officially


def _word_table_cells(text: str, target: str) -> list[str]:
    cells: list[str] = []
    for line in text.split("\n"):
        line = line.strip()
        if not line.startswith("|"):
            continue
        if re.match(r"^[\s|*-]+$", line):
            cells.append(_HEADER_BREAK)
        else:
            cells += [cell.strip() for cell in line[1:-1].split("|") if cell.strip()]
    if _HEADER_BREAK in cells:
        cut = cells.index(_HEADER_BREAK)
        headers, data = cells[:cut], [c for c in cells[cut + 1 :] if c != _HEADER_BREAK]
    else:
        headers, data = cells, []
    if not headers:
        return []
    rows = [
        dict(zip(headers, data[start : start + len(headers)], strict=True))
        for start in range(0, len(data), len(headers))
        if len(data[start : start + len(headers)]) == len(headers)
    ]
    chosen = [
        value
        for row in rows
        for key, value in row.items()
        if key.lower() != value.lower() and target.lower() in key.lower()
    ]
    return chosen or cells


# -- Length / Sentences and Paragraphs ------------------------------------------------------------
_SENTENCE_NUMBERS = {
    **ONE_TO_TEN, "eleven": 11, "twelve": 12, "fifteen": 15, "twenty": 20, "thirty": 30,
    "fifty": 50, "hundred": 100, "thousand": 1000, **CJK_NUMERALS,
}  # fmt: skip
_N = "(" + _alternatives([r"\d+", *_SENTENCE_NUMBERS]) + ")"
_CJK_SENTENCE = "(?:个句子|句话|句|個句子)"
_SENTENCE_PATTERNS = (
    (rf"exactly(?:[:])? {_N} (?:topic )?sentences?", "exact"),
    (rf"(?:should|must) contain {_N} sentences?", "exact"),
    (rf"must be exactly {_N} sentences?", "exact"),
    (r"(?:must|should)? be a single sentence", "single"),
    (r"consisting of (?:only )?one sentence", "single"),
    (r"(?:the response|the text|the answer) must be a single sentence", "single"),
    (r"in a single sentence", "single"),
    (rf"at least(?:[:])? {_N} sentences?", "min"),
    (rf"a minimum of {_N} sentences?", "min"),
    (rf"no fewer than {_N} sentences?", "min"),
    (rf"(?:包含)?(?:至少|最少)(?:包含)?{_N}{_CJK_SENTENCE}", "min"),
    (rf"(?:must )?contain at most {_N} sentences?", "max"),
    (rf"at most(?:[:])? {_N} sentences?", "max"),
    (rf"not exceeding {_N} sentences?", "max"),
    (rf"no (?:more|longer) than {_N} sentences?", "max"),
    (rf"limited to {_N} sentences?", "max"),
    (rf"(?:must|should)? not exceed {_N} sentences?", "max"),
    (rf"a maximum (?:length )?of {_N} sentences?", "max"),
    (rf"not to exceed {_N} sentences?", "max"),
    (rf"not surpass(?: a total of)? {_N} sentences?", "max"),
    (rf"(?:至多|最多)(?:包含)?{_N}{_CJK_SENTENCE}", "max"),
    (rf"range(?:[:])? {_N}-{_N} sentences?", "range"),
    (rf"between {_N} and {_N} sentences?", "range"),
    (rf"between {_N} to {_N} sentences?", "range"),
    (rf"into {_N} to {_N} sentences?", "range"),
    (rf"a range of {_N} to {_N} sentences?", "range"),
    (rf"be composed of {_N} to {_N} sentences?", "range"),
    (rf"consists? of {_N} to {_N} sentences?", "range"),
    (rf"consisting of {_N} to {_N} sentences?", "range"),
    (rf"{_N}到{_N}{_CJK_SENTENCE}", "range"),
    (rf"organized into at least {_N} sentences?", "min"),
    (rf"structured into at most {_N} sentences?", "max"),
)


def _small_number(token: str, vocabulary: dict[str, int]) -> int:
    """A number token as the sentence and paragraph readers take it: unknown words are 0."""
    return int(token) if token.isdigit() else vocabulary.get(token.lower(), 0)


def _read_bounds(
    text: str, patterns: Any, vocabulary: dict[str, int], flags: int = 0
) -> tuple[int | None, int | None] | None:
    for pattern, kind in patterns:
        if found := re.search(pattern, text, flags):
            if kind == "single":
                return 1, 1
            first = _small_number(found[1], vocabulary) if kind != "range_digits" else int(found[1])
            if kind == "exact":
                return first, first
            if kind == "min":
                return first, None
            if kind == "max":
                return None, first
            second = _small_number(found[2], vocabulary) if kind == "range" else int(found[2])
            return first, second
    return None


def count_sentences_official(text: str) -> int:
    """MulDimIF's sentence count: runs of text ending in . ! or ?, blank ones left out."""
    # Each run ends with its terminator, so none is blank: the count is that of . ! and ?
    # (counted directly: the run pattern takes time quadratic in a text without them).
    return sum(text.count(mark) for mark in ".!?")


def read_sentences(words: str) -> Rule:
    bounds = _read_bounds(words.lower().strip(), _SENTENCE_PATTERNS, _SENTENCE_NUMBERS)
    if bounds is None:
        return Rule(words, "sentences", lambda text: (True, "no sentence limit read"),
                    "no sentence count the official checker reads: always satisfied")  # fmt: skip
    low, high = bounds

    def judge(text: str) -> tuple[bool, str]:
        count = count_sentences_official(text)
        return _within(count, low, high), f"{count} sentences"

    return Rule(words, "sentences", judge, _bounds_text(low, high, "sentences"))


_PARAGRAPH_NUMBERS = {**ONE_TO_TEN, **CJK_NUMERALS}
_P = "(" + _alternatives([r"\d+", *ONE_TO_TEN]) + ")"
_PARAGRAPH_PATTERNS = (
    (rf"exactly {_P} paragraphs?", "exact"),
    (rf"must be exactly {_P} paragraphs?", "exact"),
    (rf"(?:should|must) contain {_P} paragraphs?", "exact"),
    (r"(?:must|should)? be a single paragraph", "single"),
    (r"(?:the response|the text|the answer) must be a single paragraph", "single"),
    (rf"at least {_P} paragraphs?", "min"),
    (rf"least: {_P} paragraphs?", "min"),
    (rf"a minimum of {_P}(?: distinct)? paragraphs?", "min"),
    (rf"at most {_P} paragraphs?", "max"),
    (rf"not exceeding {_P} paragraphs?", "max"),
    (rf"no more than {_P} paragraphs?", "max"),
    (r"最多(?:分为)?(\d+|一|两|二|三|四|五|六|七|八|九|十)个段落", "max"),
    (r"range (\d+)-(\d+) paragraphs?", "range_digits"),
    (r"range: (\d+)-(\d+)", "range_digits"),
    (r"between (\d+) and (\d+) paragraphs?", "range_digits"),
    (r"between (\d+) to (\d+) paragraphs?", "range_digits"),
    (r"(\d+) to (\d+) paragraphs?", "range_digits"),
    (r"(?:divided)? into (\d+) to (\d+) paragraphs?", "range_digits"),
    (r"a range of (\d+) to (\d+) paragraphs?", "range_digits"),
    (rf"organized into at least {_P} paragraphs?", "min"),
    (rf"structured into at most {_P} paragraphs?", "max"),
)


def read_paragraphs(words: str) -> Rule:
    bounds = _read_bounds(words.lower(), _PARAGRAPH_PATTERNS, _PARAGRAPH_NUMBERS, re.I)
    if bounds is None or bounds == (None, None):
        return Rule(words, "paragraphs", lambda text: (False, "no paragraph limit read"),
                    "no paragraph count the official checker reads: never satisfied")  # fmt: skip
    low, high = bounds

    def judge(text: str) -> tuple[bool, str]:
        count = sum(1 for piece in text.split("\n\n") if piece.strip())
        return _within(count, low, high), f"{count} paragraphs (blocks between blank lines)"

    return Rule(words, "paragraphs", judge, _bounds_text(low, high, "paragraphs"))


# -- Content / Punctuation ------------------------------------------------------------------------
_PUNCTUATION_NAMES = {
    "period": ".",
    "question mark": "?",
    "exclamation mark": "!",
    "semicolon": ";",
}


@functools.cache
def _punkt() -> Any:
    from mrtpo.tasks.instructions.text import sentence_tokenizer

    return sentence_tokenizer()


def split_sentences_punkt(text: str) -> list[str]:
    """NLTK's English punkt sentences (what the official checker's `sent_tokenize` gives)."""
    return list(_punkt().tokenize(text))


def read_punctuation(words: str) -> Rule:
    lowered = words.strip().lower().rstrip(".")
    by_line = "paragraph" in lowered or "section" in lowered
    by_sentence = any(word in lowered for word in ("each", "any", "all"))
    by_cell = "table" in lowered or "cell" in lowered
    followed = re.search(
        r"(period|question mark|exclamation mark|semicolon)\s+followed by a `([^`]+)`", lowered
    )
    negative = bool(re.search(r"\b(must not|avoid|exclude|not end with|do not use)\b", lowered))
    names = [
        name.rstrip("s")
        for name in re.findall(
            r"\b(periods?|question marks?|exclamation marks?|semicolons?|punctuation marks?)\b",
            lowered,
        )
    ]
    if any("punctuation mark" in name for name in names):
        allowed = list(string.punctuation)
    else:
        allowed = [_PUNCTUATION_NAMES[name] for name in names if name in _PUNCTUATION_NAMES]
    bullet_mark = next((mark for name, mark in _PUNCTUATION_NAMES.items() if name in lowered), None)

    def pieces(text: str) -> list[str]:
        stripped = text.strip()
        if by_line:
            parts = [line.strip() for line in stripped.split("\n") if line.strip()]
        elif by_sentence:
            parts = split_sentences_punkt(stripped)
        else:
            parts = [stripped]
        if by_cell:
            rows = stripped.split("\n")
            rows = rows[2:] if len(rows) > 1 else rows
            cells = [cell.strip() for row in rows for cell in re.split(r"\s*\|\s*", row.strip("|"))]
            parts = [cell for cell in cells if cell.strip() and cell.strip("-")]
        return parts

    def judge_bullets(text: str) -> tuple[bool, str]:
        for point in re.findall(r"^[\-\*\•]\s.*$", text.strip(), re.MULTILINE):
            for sentence in split_sentences_punkt(point):
                sentence = sentence.strip()
                ends = (
                    sentence.endswith(bullet_mark)
                    if bullet_mark
                    else sentence[-1] in string.punctuation
                )
                if not ends:
                    return False, f"the bullet sentence {_shown([sentence], 1)} ends otherwise"
        return True, "every bullet point ends as asked"

    def judge(text: str) -> tuple[bool, str]:
        parts = pieces(text)
        if any(not part for part in parts):
            return negative, "an empty piece of text"
        if followed:
            ending = _PUNCTUATION_NAMES[followed[1]] + followed[2]
            wrong = [part for part in parts if not part.endswith(ending)]
            return (
                not wrong,
                f"{_shown(wrong, 1)} does not end with {ending!r}" if wrong else "all end so",
            )
        wrong = [part for part in parts if (part[-1] in allowed) == negative]
        if wrong:
            return False, f"{_shown(wrong, 1)} ends with {wrong[0][-1]!r}"
        return True, f"all {len(parts)} pieces end as asked"

    if "bullet point" in lowered:
        return Rule(words, "punctuation", judge_bullets,
                    f"each bullet point's sentences end with {bullet_mark or 'punctuation'}")  # fmt: skip
    unit = "line" if by_line else "sentence" if by_sentence else "the response"
    unit = "table cell" if by_cell else unit
    marks = "".join(allowed) if len(allowed) < 10 else "any punctuation"
    how = "does not end" if negative else "ends"
    return Rule(words, "punctuation", judge, f"each {unit} {how} with {marks or 'nothing listed'}")


# -- Language / English ---------------------------------------------------------------------------
def _english_case(lowered: str) -> str | None:
    if (
        re.search(r"\ball[- ]?uppercase\b", lowered)
        or "in capitalized form" in lowered
        or lowered == "all uppercase"
    ):
        return "uppercase"
    title_phrases = ("capitalize the first letter of each word", "capitalized letters for each word",
                     "have each word capitalized", "each word must be capitalized", "each word in")  # fmt: skip
    if (
        any(phrase in lowered for phrase in title_phrases)
        or ("a capital letter" in lowered and "each" in lowered)
        or re.search(r"\bcapitalized\b", lowered)
        or ("capital" in lowered and "each" in lowered)
    ):
        return "title"
    if (
        "must be in lowercase" in lowered
        or "all lowercase" in lowered
        or re.search(r"\blowercase\b", lowered)
    ):
        return "lowercase"
    if "written as a short blurb" in lowered:
        return "blurb"
    return None


def _english_scope(lowered: str) -> tuple[str | None, str | None]:
    if "headings" in lowered and "table" in lowered:
        return "mixed", "all"
    if "table" in lowered:
        for word, part in (("header", "headers"), ("entries", "entries"), ("content", "content"),
                           ("headings", "headers")):  # fmt: skip
            if word in lowered:
                return "table", part
        return "table", "all"
    if "json" in lowered:
        return "json", "keys" if "keys" in lowered else "values" if "values" in lowered else "all"
    if "heading" in lowered:
        return "heading", "all"
    return None, None


def _table_text(text: str, part: str = "all") -> str:
    if "|" not in text:
        return text
    rows = [row.strip() for row in text.split("\n") if row.strip()]
    if not rows:
        return text

    def cells(lines: list[str]) -> str:
        return " ".join(cell.strip() for row in lines for cell in row.split("|") if cell.strip())

    if part == "headers":
        return cells(rows[:1])
    if part == "entries":
        return cells(rows[1:]) if len(rows) > 1 else text
    return cells(rows)


def _heading_text(text: str) -> str:
    headings = re.findall(r"^#+\s*(.+)$", text, re.MULTILINE)
    return " ".join(headings) if headings else text


def _json_text(text: str, part: str) -> str:
    if "{" not in text or "}" not in text:
        return text
    if part == "keys" and (keys := re.findall(r'"([^"]+)"\s*:', text)):
        return " ".join(keys)
    if part == "values" and (values := re.findall(r':\s*"([^"]+)"', text)):
        return " ".join(values)
    return text


def read_english(words: str) -> Rule:
    lowered = words.strip().lower()
    case = _english_case(lowered)
    scope, part = _english_scope(lowered)

    def scoped(text: str) -> str:
        if scope == "mixed":
            return _table_text(text) or _heading_text(text) or text
        if scope == "table":
            return _table_text(text, part or "all")
        if scope == "json":
            return _json_text(text, part or "all")
        if scope == "heading":
            return _heading_text(text)
        return text

    def judge(text: str) -> tuple[bool, str]:
        if not text.strip():
            return False, "the response is blank"
        checked = scoped(text)
        if case == "uppercase":
            return (
                checked == checked.upper(),
                "has lowercase letters" if checked != checked.upper() else "all uppercase",
            )
        if case == "lowercase":
            return (
                checked == checked.lower(),
                "has uppercase letters" if checked != checked.lower() else "all lowercase",
            )
        if case == "title":
            lower = [word for word in checked.split() if "a" <= word[0] <= "z"]
            return (
                not lower,
                f"the word {lower[0]!r} starts lowercase" if lower else "every word capitalized",
            )
        if case == "blurb":
            return True, "any text is a short blurb"
        return False, "no case rule read"

    where = f" in the {scope} {part}" if scope else ""
    reading = {"uppercase": "all uppercase", "lowercase": "all lowercase",
               "title": "each word starts with a capital (a-z counts as lowercase)",
               "blurb": "a short blurb (always satisfied)"}.get(case or "", "no case rule the official checker reads: never satisfied")  # fmt: skip
    return Rule(words, "english", judge, reading + where)


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


# -- Content / Identifiers and the other content rules --------------------------------------------
_EMOJI = re.compile(
    "[\U0001f600-\U0001f64f\U0001f300-\U0001f5ff\U0001f680-\U0001f6ff\U0001f700-\U0001f77f"
    "\U0001f780-\U0001f7ff\U0001f800-\U0001f8ff\U0001f900-\U0001f9ff\U0001fa00-\U0001fa6f"
    "\U0001fa70-\U0001faff\U00002702-\U000027b0\U000024c2-\U0001f251\U00010000-\U0010ffff]+"
)
_SOURCES_AT_END = re.compile(r"Sources:\s*.+$")
_BLURBS = ("Response must be written as a short blurb", "ensure that the response is written as a short blurb",
           "ensure the response is a short blurb", "The response must be short and simple")  # fmt: skip


def _starts_with(prefix: str) -> Callable[[str], tuple[bool, str]]:
    def judge(text: str) -> tuple[bool, str]:
        opening = text.lstrip(" #")
        return opening.lower().startswith(
            prefix.lower()
        ), f"it opens with {opening[: len(prefix) + 10]!r}"

    return judge


def read_others_content(words: str) -> Rule:
    def rule(reading: str, judge: Callable[[str], tuple[bool, str]]) -> Rule:
        return Rule(words, "others_content", judge, reading)

    if words == "Keep it a paragraph long":
        return rule("no line break", lambda t: ("\n" not in t, f"{t.count(chr(10))} line breaks"))
    start = re.match(r"Start identifier( must be|:)(?:.*)?\s'([^']+)'", words)
    if "Each example must start with" in words:
        if not start:
            raise ValueError(f"cannot read the identifier in {words!r}")
        marker = start[2]
        return rule(
            f"contains {marker!r} anywhere",
            lambda t: (marker in t, "found" if marker in t else "not found"),
        )
    if start:
        return rule(
            f"opens with {start[2]!r} (any case, after spaces and #)", _starts_with(start[2])
        )
    start = re.search(
        r"(?:Start|start|begin|it is essential to start) (?:with|by) the (?:identifier|phrase) '?([^']+)'?",
        words,
        re.I,
    )
    if start:
        return rule(
            f"opens with {start[1]!r} (any case, after spaces and #)", _starts_with(start[1])
        )
    if words in ("End identifier: Sources must be cited at the end of the response",
                 "make sure to conclude your response by citing your sources, as this is a crucial part of the answer"):  # fmt: skip
        return rule(
            "ends with a 'Sources: ...' line",
            lambda t: (bool(_SOURCES_AT_END.search(t.strip())), "searched"),
        )
    if showroom := re.match(
        r"The name of the showroom must start with the letter '([A-Za-z])'\.", words
    ):
        letter = showroom[1].upper()
        return rule(f"a word starting with {letter!r}",
                    lambda t: (bool(re.search(rf"\b{letter}[a-zA-Z]*\b", t)), "searched"))  # fmt: skip
    if words in _BLURBS:
        return rule("at most 200 characters", lambda t: (len(t) <= 200, f"{len(t)} characters"))
    if words == "The response should be concise, with a maximum of 50 words":
        return rule("at most 50 words", lambda t: (len(t.split()) <= 50, f"{len(t.split())} words"))
    if words == "Each sentence must include at least three emojis.":

        def judge_emoji(text: str) -> tuple[bool, str]:
            for sentence in re.split(r"(?<=[.!?])\s+(?=\S)", text):
                if sentence.strip() and len(_EMOJI.findall(sentence.strip())) < 3:
                    return (
                        False,
                        f"the sentence {_shown([sentence.strip()], 1)} has fewer than 3 emoji runs",
                    )
            return True, "every sentence has 3 emoji runs"

        return rule("three emoji runs per sentence", judge_emoji)
    if mention := re.search(r"[Mm]ust mention (.+) and the (.+)", words):
        first, second = mention[1], f"the {mention[2]}"
        return rule(f"contains {first!r} and {second!r} (exact case)",
                    lambda t: (first in t and second in t, "searched"))  # fmt: skip
    if words in ("Must include quotes from the sources", "with quotes from these sources"):
        return rule("a quotation mark", lambda t: (bool(re.search(r"[\"“”‘’']", t)), "searched"))
    if words in (
        "Must provide sources that are cited",
        "The response must include sources that are cited",
    ):
        return rule("a 'Sources:' line at the end and a [n] citation",
                    lambda t: (bool(_SOURCES_AT_END.search(t) and re.search(r"\[\d+\]", t)), "searched"))  # fmt: skip
    if words == "It must include in-text citations":
        return rule("a [n] or (Author, year) citation",
                    lambda t: (bool(re.search(r"\[\d+\]|\([A-Za-z]+, \d{4}\)", t)), "searched"))  # fmt: skip
    if "be in full sentences" in words:
        return rule("full sentences (always satisfied)", lambda t: (True, "any text"))
    return rule(
        "no rule the official checker reads: never satisfied", lambda t: (False, "no rule read")
    )


# -- Language / Chinese ---------------------------------------------------------------------------
def _converter() -> Callable[[str, str], str] | None:
    """zhconv's `convert` (what the official checker uses) when it is installed, else None.

    zhconv is an optional extra (`pip install "mrtpo[chinese]"`), not a dependency: it is
    GPL-licensed (MediaWiki's conversion tables) and only 10 of MulDimIF's 4,180 constraints need
    it."""
    try:
        from zhconv import convert  # type: ignore[import-not-found]
    except ModuleNotFoundError:
        return None
    return convert


@functools.cache
def _warn_inexact_chinese() -> None:
    """Said once per process, when a script rule is read without zhconv: the verdicts of those
    constraints can then differ from the official ones, and the accuracy with them."""
    logger.warning(
        "MulDimIF: a Simplified/Traditional Chinese constraint is read without zhconv installed: "
        "any CJK ideograph counts as the script asked, so its verdicts can differ from the "
        'official checker\'s. pip install "mrtpo[chinese]" (zhconv) for the official verdicts.'
    )


_CJK_IDEOGRAPH = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\U00020000-\U0002a6df]")


def _has_script(text: str, variant: str) -> tuple[bool, str]:
    """Whether `text` has a character that zhconv changes when converting it to the other
    script (so a character of `variant`, "zh-cn" or "zh-tw"); without zhconv, any CJK
    ideograph counts (the verdict's information says so)."""
    convert = _converter()
    if convert is None:
        found = _CJK_IDEOGRAPH.search(text)
        return bool(found), (
            "a CJK ideograph" if found else "no CJK ideograph"
        ) + " (zhconv not installed: any ideograph counts)"
    other = "zh-tw" if variant == "zh-cn" else "zh-cn"
    found = next((char for char in text if convert(char, other) != char), None)
    return found is not None, f"the character {found!r}" if found else "no character of that script"


def _entirely(text: str, variant: str) -> tuple[bool, str]:
    if re.search(r"[A-Za-z]", text):
        return False, "it has Latin letters"
    convert = _converter()
    if convert is None:
        return bool(_CJK_IDEOGRAPH.search(text)), "zhconv not installed: any ideograph counts"
    same = convert(text, variant) == text
    return same, "unchanged by conversion" if same else "conversion changes it"


def read_chinese(words: str) -> Rule:
    def rule(reading: str, judge: Callable[[str], tuple[bool, str]]) -> Rule:
        return Rule(words, "chinese", judge, reading)

    if _converter() is None:
        _warn_inexact_chinese()
    simplified = lambda t: _has_script(t, "zh-cn")  # noqa: E731
    traditional = lambda t: _has_script(t, "zh-tw")  # noqa: E731
    if phrase := re.search(r'Must include the phrase "{1,2}(.+?)"{1,2}', words, re.I):
        wanted = phrase[1]
        return rule(f"contains {wanted!r}", lambda t: (wanted in t, "searched"))
    if re.search(r'Must write the name "Shen Lim" in Simplified Chinese', words, re.I):
        return rule("contains 沈林", lambda t: ("沈林" in t, "searched"))
    if re.search(
        r"Must (?:use|convert into|be converted into) Traditional Chinese characters", words, re.I
    ):
        return rule(
            "entirely Traditional Chinese, no Latin letter", lambda t: _entirely(t, "zh-tw")
        )
    for pattern in (
        r"include .*?Traditional Chinese characters",
        r"use .*?Traditional Chinese characters",
        r"使用繁體中文",
    ):
        if re.search(pattern, words, re.I):
            return rule("a Traditional Chinese character", traditional)
    for pattern in (
        r"(The answer must ){0,1}include some content in Simplified Chinese",
        r"Use Simplified Chinese characters",
        r"(?:must be|must use|must write|must be presented|answer must be|essential|is|should be|必须|请|需要) {0,1}"
        r"(?:in|provided in|written in|to use|conducted in|用|使用|提供|书写|翻译为|将文本翻译为) {0,1}(?:Simplified Chinese|简体中文)",
        r"用中文简体描述",
        r"Names must be in Simplified Chinese",
    ):
        if re.search(pattern, words, re.I):
            return rule("a Simplified Chinese character", simplified)
    if re.search(r"Must translate the text into Simplified Chinese", words, re.I):
        return rule("entirely Simplified Chinese, no Latin letter", lambda t: _entirely(t, "zh-cn"))
    if re.search(r"Simplified", words, re.I):
        return rule("a Simplified Chinese character", simplified)
    return rule(
        "no rule the official checker reads: never satisfied", lambda t: (False, "no rule read")
    )


# -- reading and registering ----------------------------------------------------------------------
READERS: dict[str, Callable[[str], Rule]] = {
    "keywords": read_keywords,
    "words": read_words,
    "sentences": read_sentences,
    "paragraphs": read_paragraphs,
    "punctuation": read_punctuation,
    "english": read_english,
    "markdown": read_markdown,
    "table": read_table,
    "json": read_json,
    "others_format": read_others_format,
    "others_content": read_others_content,
    "chinese": read_chinese,
}


@functools.lru_cache(maxsize=16384)
def parse_constraint(category: str, subtype: str, words: str) -> Rule:
    """The rule MulDimIF's checker for (category, subtype) reads in `words`. ValueError for a
    pair MulDimIF does not know, or words its reader could not take a number from."""
    family = FAMILIES.get((category, subtype))
    if family is None:
        raise ValueError(
            f"no MulDimIF checker for category {category!r}, subtype {subtype!r} "
            f"(constraint {words!r})"
        )
    if not isinstance(words, str):
        raise ValueError(f"constraint words must be a string, got {words!r}")
    try:
        return READERS[family](words)
    except ValueError as error:
        raise ValueError(f"{category}/{subtype}: {error}") from None


def _register(category: str, subtype: str) -> None:
    def read(words: Any) -> Rule:
        return parse_constraint(category, subtype, words)

    def check(text: str, constraint: Rule) -> Outcome:
        return constraint.check(text)

    registry.checker(
        instruction_id(category, subtype),
        lambda constraint: constraint.words,
        registry=registry.MULDIMIF_CHECKERS,
        judges_blank=True,
        constraint=read,
    )(check)


for _category, _subtype in FAMILIES:
    _register(_category, _subtype)
