"""MulDimIF's Language readers: English case rules and Chinese scripts."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable

from mrtpo.tasks.instructions.muldimif_checkers.common import Rule

logger = logging.getLogger(__name__)


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
