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

The readers, one module per official category: `content` (keywords, punctuation, identifiers),
`length` (words, sentences, paragraphs), `language` (English case, Chinese scripts), `formats`
(Markdown, tables, JSON, XML and the rest); what they share in `common`. This module holds the
dispatch (`FAMILIES`) and `parse_constraint`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from mrtpo.tasks.instructions import registry
from mrtpo.tasks.instructions.muldimif_checkers.common import (
    ID_PREFIX,
    Rule,
    instruction_id,
    split_instruction_id,
)
from mrtpo.tasks.instructions.muldimif_checkers.content import (
    read_keywords,
    read_others_content,
    read_punctuation,
)
from mrtpo.tasks.instructions.muldimif_checkers.formats import (
    read_json,
    read_markdown,
    read_others_format,
    read_table,
)
from mrtpo.tasks.instructions.muldimif_checkers.language import read_chinese, read_english
from mrtpo.tasks.instructions.muldimif_checkers.length import (
    read_paragraphs,
    read_sentences,
    read_words,
)
from mrtpo.tasks.instructions.registry import Outcome

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

__all__ = [
    "FAMILIES",
    "ID_PREFIX",
    "READERS",
    "Rule",
    "instruction_id",
    "parse_constraint",
    "reported_type",
    "split_instruction_id",
]
