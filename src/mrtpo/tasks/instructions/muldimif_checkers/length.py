"""MulDimIF's Length readers: words, sentences and paragraphs, counted as the official code counts."""

from __future__ import annotations

import json
import re
from typing import Any

from mrtpo.tasks.instructions.muldimif_checkers.common import (
    _BULLET_LINE,
    _NUMBERED_LINE,
    CJK_NUMERALS,
    NUMBER_WORDS,
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
