"""MulDimIF's Content readers: keywords, punctuation, identifiers and the other content rules."""

from __future__ import annotations

import functools
import json
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mrtpo.tasks.instructions.muldimif_checkers.common import (
    _BULLET_LINE,
    _NUMBERED_LINE,
    ONE_TO_TEN,
    Rule,
    _after_first_space,
    _alternatives,
    _count_keyword,
    _need_number,
    _shown,
    compound_number,
    response_shape,
)


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
