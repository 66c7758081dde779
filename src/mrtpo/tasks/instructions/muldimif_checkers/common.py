"""What every MulDimIF reader shares: instruction ids, number words, the shape of a response
(the official "each ..." checkers read elements by it) and `Rule`."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mrtpo.tasks.instructions.registry import Outcome

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
