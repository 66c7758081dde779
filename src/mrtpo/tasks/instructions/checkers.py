"""IFEval's 25 instruction checkers, with its keyword arguments and its strict-mode semantics.

One small function per instruction id, registered in `CHECKERS` (see `registry`, which also
builds the `Constraint`s) with the statement of the constraint (a format string over its
arguments) and a parser per argument. A check returns an `Outcome`: whether
the response follows the instruction, why not, and the character spans it read (keyword
occurrences, the title, the postscript, the bullets, ...; the whole response where it reads
everything).

Every check runs in time linear in the response. Where IFEval's regular expressions backtrack
quadratically (a lazy `\\[.*?\\]` or a leading `\\s*` rescanned from each character of a run),
the same matches are found in one pass (`_bracketed`, `_line_items`, `_double_angled`, the
postscript patterns without `\\s*`).

Matching IFEval exactly, including its quirks:
- keywords, forbidden words, the section splitter and a custom postscript marker are used as
  regular expressions (case-insensitive for keywords); a pattern that does not compile is
  matched literally instead (IFEval would crash);
- language detection that finds nothing counts as followed (IFEval's `LangDetectException`
  branch);
- `**bold**` counts as one highlight, like `*italic*`; bullets are lines starting with `*`
  (not `**`) or `-`.

One deliberate difference: IFEval's data has two `letter_frequency` rows whose letter is not a
letter ("#", "!"). Google's reference counts that character, as we do; lm-eval's copy replaces
it with a random letter, which no deterministic checker can match.
"""

from __future__ import annotations

import functools
import json
import re

from mrtpo.tasks.instructions import text as measure
from mrtpo.tasks.instructions.registry import (
    Outcome,
    _count,
    _letter,
    _lower_phrase,
    _phrase,
    _raw_phrase,
    _relation,
    _show,
    _words,
    checker,
)
from mrtpo.verifiers import Span

CONSTRAINED_RESPONSE_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")

# Names for the ISO 639-1 codes IFEval uses (others are shown as their code).
LANGUAGE_NAMES = {
    "en": "English", "es": "Spanish", "pt": "Portuguese", "ar": "Arabic", "hi": "Hindi",
    "fr": "French", "ru": "Russian", "de": "German", "ja": "Japanese", "it": "Italian",
    "bn": "Bengali", "uk": "Ukrainian", "th": "Thai", "ur": "Urdu", "ta": "Tamil",
    "te": "Telugu", "bg": "Bulgarian", "ko": "Korean", "pl": "Polish", "he": "Hebrew",
    "fa": "Persian", "vi": "Vietnamese", "ne": "Nepali", "sw": "Swahili", "kn": "Kannada",
    "mr": "Marathi", "gu": "Gujarati", "pa": "Punjabi", "ml": "Malayalam", "fi": "Finnish",
    "nl": "Dutch", "sv": "Swedish", "tr": "Turkish", "zh-cn": "Chinese",
}  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Helpers


def _whole(text: str) -> tuple[Span, ...]:
    return ((0, len(text)),)


def _holds(actual: int, relation: str, threshold: int) -> bool:
    return actual < threshold if relation == "less than" else actual >= threshold


@functools.lru_cache(maxsize=4096)
def _pattern(piece: str, before: str = "", after: str = "", flags: int = 0) -> re.Pattern[str]:
    """`before + piece + after` as IFEval builds it (`piece` from the data, used as a regular
    expression), or with `piece` taken literally if that does not compile."""
    try:
        return re.compile(before + piece + after, flags)
    except re.error:
        return re.compile(before + re.escape(piece) + after, flags)


def _lowered(text: str) -> tuple[str, bool]:
    """`text.lower()`, and whether its character offsets still match `text`'s."""
    lowered = text.lower()
    return lowered, len(lowered) == len(text)


def _stripped_span(text: str, start: int, end: int) -> Span:
    """(start, end) without the leading whitespace a `^\\s*` pattern swallowed."""
    piece = text[start:end]
    return (start + len(piece) - len(piece.lstrip()), end)


# ----------------------------------------------------------------------------------------------
# keywords:*


@checker("keywords:existence", "Include the keywords {keywords} in the response.", keywords=_words)
def _keywords_existence(text: str, keywords: list[str]) -> Outcome:
    spans, missing = [], []
    for keyword in keywords:
        found = [m.span() for m in _pattern(keyword, flags=re.IGNORECASE).finditer(text)]
        spans += found
        if not found:
            missing.append(keyword)
    reason = f"missing {_show(missing)}" if missing else "all keywords present"
    return Outcome(not missing, reason, tuple(sorted(spans)) or _whole(text))


@checker(
    "keywords:frequency",
    'In your response, the word "{keyword}" should appear {relation} {frequency} times.',
    keyword=_phrase,
    frequency=_count,
    relation=_relation,
)
def _keywords_frequency(text: str, keyword: str, frequency: int, relation: str) -> Outcome:
    spans = tuple(m.span() for m in _pattern(keyword, flags=re.IGNORECASE).finditer(text))
    reason = f'"{keyword}" appears {len(spans)} times'
    return Outcome(_holds(len(spans), relation, frequency), reason, spans or _whole(text))


@checker(
    "keywords:forbidden_words",
    "Do not include the words {forbidden_words} in the response.",
    forbidden_words=_words,
)
def _forbidden_words(text: str, forbidden_words: list[str]) -> Outcome:
    spans, used = [], []
    for word in forbidden_words:
        found = [m.span() for m in _pattern(word, r"\b", r"\b", re.IGNORECASE).finditer(text)]
        spans += found
        if found:
            used.append(word)
    # A clean response was read in full; a failing one is pinned on the forbidden words.
    return Outcome(not used, f"uses {_show(used)}", tuple(sorted(spans)) or _whole(text))


@checker(
    "keywords:letter_frequency",
    'In your response, the letter "{letter}" should appear {let_relation} {let_frequency} times.',
    letter=_letter,
    let_frequency=_count,
    let_relation=_relation,
)
def _letter_frequency(text: str, letter: str, let_frequency: int, let_relation: str) -> Outcome:
    lowered, aligned = _lowered(text)
    count = lowered.count(letter) if len(letter) == 1 else 0
    spans = tuple((i, i + 1) for i, char in enumerate(lowered) if char == letter) if aligned else ()
    reason = f'the letter "{letter}" appears {count} times'
    return Outcome(_holds(count, let_relation, let_frequency), reason, spans or _whole(text))


# ----------------------------------------------------------------------------------------------
# language:*, change_case:*


def _language_statement(language: str) -> str:
    name = LANGUAGE_NAMES.get(language, language)
    return f"Your ENTIRE response should be in {name} language (code {language}), no other language is allowed."


@checker("language:response_language", _language_statement, language=_phrase)
def _response_language(text: str, language: str) -> Outcome:
    detected = measure.detect_language(text)
    if detected is None:
        return Outcome(True, "no language could be detected", _whole(text))
    return Outcome(detected == language, f"the detected language is {detected}", _whole(text))


@checker(
    "change_case:english_capital",
    "Your entire response should be in English, and in all capital letters.",
)
def _english_capital(text: str) -> Outcome:
    if not text.isupper():
        return Outcome(False, "not every cased letter is a capital", _whole(text))
    detected = measure.detect_language(text)
    return Outcome(detected in (None, "en"), f"the detected language is {detected}", _whole(text))


@checker(
    "change_case:english_lowercase",
    "Your entire response should be in English, and in all lowercase letters. No capital letters are allowed.",
)
def _english_lowercase(text: str) -> Outcome:
    if not text.islower():
        return Outcome(False, "not every cased letter is lowercase", _whole(text))
    detected = measure.detect_language(text)
    return Outcome(detected in (None, "en"), f"the detected language is {detected}", _whole(text))


@checker(
    "change_case:capital_word_frequency",
    "In your response, words with all capital letters should appear {capital_relation} {capital_frequency} times.",
    capital_frequency=_count,
    capital_relation=_relation,
)
def _capital_word_frequency(text: str, capital_frequency: int, capital_relation: str) -> Outcome:
    # Only a sentence with an uppercase character can hold an all-capitals token: the others
    # are not tokenized (NLTK's tokenizer is slow on long texts).
    spans: list[Span | None] = []
    for start, end in measure.sentence_spans(text):
        sentence = text[start:end]
        if not any(map(str.isupper, sentence)):
            continue
        tokens = measure.sentence_word_tokens(sentence)
        for token, span in zip(tokens, measure.token_spans(sentence, tokens), strict=True):
            if token.isupper():
                spans.append(None if span is None else (start + span[0], start + span[1]))
    found = tuple(span for span in spans if span is not None)
    reason = f"{len(spans)} words are in all capital letters"
    return Outcome(
        _holds(len(spans), capital_relation, capital_frequency), reason, found or _whole(text)
    )


# ----------------------------------------------------------------------------------------------
# length_constraints:*


@checker(
    "length_constraints:number_sentences",
    "Your response should contain {relation} {num_sentences} sentences.",
    num_sentences=_count,
    relation=_relation,
)
def _number_sentences(text: str, num_sentences: int, relation: str) -> Outcome:
    count = len(measure.sentences(text))
    return Outcome(
        _holds(count, relation, num_sentences), f"the response has {count} sentences", _whole(text)
    )


@checker(
    "length_constraints:number_words",
    "Answer with {relation} {num_words} words.",
    num_words=_count,
    relation=_relation,
)
def _number_words(text: str, num_words: int, relation: str) -> Outcome:
    count = measure.count_words(text)
    return Outcome(
        _holds(count, relation, num_words), f"the response has {count} words", _whole(text)
    )


_DIVIDER = re.compile(r"\s?\*\*\*\s?")


@checker(
    "length_constraints:number_paragraphs",
    "There should be exactly {num_paragraphs} paragraphs, separated from each other by the markdown divider ***.",
    num_paragraphs=_count,
)
def _number_paragraphs(text: str, num_paragraphs: int) -> Outcome:
    spans = tuple(m.span() for m in _DIVIDER.finditer(text)) or _whole(text)
    paragraphs = _DIVIDER.split(text)
    count = len(paragraphs)
    for index, paragraph in enumerate(paragraphs):
        if not paragraph.strip():
            if index in (0, len(paragraphs) - 1):
                count -= 1  # a divider at the very start or end makes no empty paragraph
            else:
                return Outcome(False, "two *** dividers enclose an empty paragraph", spans)
    return Outcome(count == num_paragraphs, f"the response has {count} paragraphs", spans)


def _nth_within_count(num_paragraphs: int, nth_paragraph: int, first_word: str) -> None:
    if not 1 <= nth_paragraph <= num_paragraphs:
        raise ValueError(
            f"nth_paragraph must be in 1..num_paragraphs={num_paragraphs}, got {nth_paragraph}"
        )


@checker(
    "length_constraints:nth_paragraph_first_word",
    "There should be exactly {num_paragraphs} paragraphs, separated from each other by two new lines. "
    'Paragraph {nth_paragraph} must start with the word "{first_word}".',
    validate=_nth_within_count,
    num_paragraphs=_count,
    nth_paragraph=_count,
    first_word=_lower_phrase,
)
def _nth_paragraph_first_word(
    text: str, num_paragraphs: int, nth_paragraph: int, first_word: str
) -> Outcome:
    paragraphs = text.split("\n\n")
    separators = tuple((m.start(), m.end()) for m in re.finditer("\n\n", text))
    count = sum(1 for paragraph in paragraphs if paragraph.strip())
    # IFEval indexes the raw split (blank pieces included) after counting non-blank ones.
    if not 1 <= nth_paragraph <= count or not paragraphs[nth_paragraph - 1].strip():
        return Outcome(
            False,
            f"the response has {count} paragraphs, no paragraph {nth_paragraph}",
            _whole(text),
        )
    start = sum(len(p) + 2 for p in paragraphs[: nth_paragraph - 1])
    paragraph = paragraphs[nth_paragraph - 1]
    raw_word = paragraph.split()[0]
    word_start = start + paragraph.index(raw_word)
    word = ""
    for char in raw_word.strip().lstrip("'").lstrip('"'):
        if char in ".,?!'\"":
            break
        word += char.lower()
    spans = tuple(sorted(((word_start, word_start + len(raw_word)), *separators)))
    if count != num_paragraphs:
        return Outcome(False, f"the response has {count} paragraphs", spans)
    return Outcome(word == first_word, f'paragraph {nth_paragraph} starts with "{word}"', spans)


# ----------------------------------------------------------------------------------------------
# detectable_content:*, detectable_format:*


@checker(
    "detectable_content:number_placeholders",
    "The response must contain at least {num_placeholders} placeholders represented by square brackets, such as [address].",
    num_placeholders=_count,
)
def _number_placeholders(text: str, num_placeholders: int) -> Outcome:
    spans = tuple(_bracketed(text))
    reason = f"the response has {len(spans)} placeholders"
    return Outcome(len(spans) >= num_placeholders, reason, spans or _whole(text))


def _bracketed(text: str) -> list[Span]:
    """The matches of IFEval's `\\[.*?\\]` in one pass: each `[` closes at the next `]` of its
    line. The regex rescans the rest of the line from every `[` that has none (quadratic);
    here a line without a `]` after its `[` is skipped at once."""
    spans = []
    start = text.find("[")
    while start >= 0:
        close = text.find("]", start + 1)
        newline = text.find("\n", start + 1)
        if close >= 0 and (newline < 0 or close < newline):
            spans.append((start, close + 1))
            start = text.find("[", close + 1)
        elif newline >= 0:
            start = text.find("[", newline + 1)
        else:
            break
    return spans


@checker(
    "detectable_content:postscript",
    "At the end of your response, please explicitly add a postscript starting with {postscript_marker}",
    postscript_marker=_phrase,
)
def _postscript(text: str, postscript_marker: str) -> Outcome:
    lowered, aligned = _lowered(text)
    # IFEval's patterns start with `\\s*`, which the regex engine rescans from every character of a
    # whitespace run (quadratic). A marker that cannot start with whitespace is found by the
    # rest of the pattern alone, at the same places once the leading whitespace is dropped
    # (which is what the spans drop anyway).
    if postscript_marker == "P.P.S":
        pattern = _pattern(r"p\.\s?p\.\s?s.*$", flags=re.MULTILINE)
    elif postscript_marker == "P.S.":
        pattern = _pattern(r"p\.\s?s\..*$", flags=re.MULTILINE)
    elif _PLAIN_MARKER.fullmatch(postscript_marker.lower()):
        pattern = _pattern(postscript_marker.lower(), "", r".*$", re.MULTILINE)
    else:
        pattern = _pattern(postscript_marker.lower(), r"\s*", r".*$", re.MULTILINE)
    found = [m.span() for m in pattern.finditer(lowered)]
    spans = tuple(_stripped_span(text, *span) for span in found) if aligned else ()
    reason = f"no line starting with {postscript_marker}"
    return Outcome(bool(found), reason, spans or _whole(text))


# A marker starting with a letter or digit and holding no regex syntax but `.`: as a pattern
# it can only match from that character.
_PLAIN_MARKER = re.compile(r"[a-z0-9][a-z0-9 .:]*")


def _line_items(text: str, marker: str) -> list[Span]:
    """IFEval's bullets `^\\s*\\*[^\\*].*$` (marker "*") and `^\\s*-.*$` (marker "-"), in one
    pass: from each line start, skip whitespace (newlines too, as `\\s*` does), find the marker
    (a `*` must be followed by a character that is not `*`, possibly a newline) and take the
    rest of that line. Spans start at the marker. The regexes rescan a whitespace run from each
    of its line starts (quadratic); here the run's end is remembered."""
    spans: list[Span] = []
    first_visible = -1  # the first non-whitespace position at or after the last line start
    line_start = 0
    while line_start <= len(text):
        if line_start > first_visible:
            found = _VISIBLE.search(text, line_start)
            first_visible = found.start() if found else len(text)
        item = first_visible
        rest = item + 1 if marker == "-" else item + 2
        matched = text.startswith(marker, item) and (
            marker == "-" or (rest <= len(text) and text[item + 1] != "*")
        )
        if matched:
            end = text.find("\n", rest)
            end = len(text) if end < 0 else end
            spans.append((item, end))
            line_start = end + 1
        else:
            newline = text.find("\n", line_start)
            if newline < 0:
                break
            line_start = newline + 1
    return spans


_VISIBLE = re.compile(r"\S")


@checker(
    "detectable_format:number_bullet_lists",
    "Your answer must contain exactly {num_bullets} bullet points. Use the markdown bullet points such as:\n"
    "* This is point 1.\n* This is point 2",
    num_bullets=_count,
)
def _number_bullet_lists(text: str, num_bullets: int) -> Outcome:
    bullets = [*_line_items(text, "*"), *_line_items(text, "-")]
    spans = tuple(sorted(bullets))
    reason = f"the response has {len(bullets)} bullet points"
    return Outcome(len(bullets) == num_bullets, reason, spans or _whole(text))


@checker(
    "detectable_format:constrained_response",
    "Answer with one of the following options: "
    + ", ".join(f'"{o}"' for o in CONSTRAINED_RESPONSE_OPTIONS),
)
def _constrained_response(text: str) -> Outcome:
    for option in CONSTRAINED_RESPONSE_OPTIONS:
        start = text.find(option)
        if start >= 0:
            return Outcome(True, f'contains "{option}"', ((start, start + len(option)),))
    return Outcome(False, "none of the options appears", _whole(text))


_SINGLE_HIGHLIGHT = re.compile(r"\*[^\n\*]*\*")
_DOUBLE_HIGHLIGHT = re.compile(r"\*\*[^\n\*]*\*\*")


@checker(
    "detectable_format:number_highlighted_sections",
    "Highlight at least {num_highlights} sections in your answer with markdown, i.e. *highlighted section*.",
    num_highlights=_count,
)
def _number_highlighted_sections(text: str, num_highlights: int) -> Outcome:
    # The two patterns are searched independently, as in IFEval: "**bold**" gives no
    # non-empty *...* match, and one **...** match.
    spans = [m.span() for m in _SINGLE_HIGHLIGHT.finditer(text) if m.group().strip("*").strip()]
    spans += [m.span() for m in _DOUBLE_HIGHLIGHT.finditer(text) if m.group()[2:-2].strip()]
    reason = f"the response has {len(spans)} highlighted sections"
    return Outcome(len(spans) >= num_highlights, reason, tuple(sorted(spans)) or _whole(text))


@checker(
    "detectable_format:multiple_sections",
    "Your response must have {num_sections} sections. Mark the beginning of each section with "
    "{section_spliter} X, such as: {section_spliter} 1",
    section_spliter=_phrase,
    num_sections=_count,
)
def _multiple_sections(text: str, section_spliter: str, num_sections: int) -> Outcome:
    # IFEval counts the pieces of re.split(...) minus one: the number of splitter matches.
    markers = tuple(
        m.span() for m in _pattern(section_spliter, r"\s?", r"\s?\d+\s?").finditer(text)
    )
    reason = f"the response has {len(markers)} section markers"
    return Outcome(len(markers) >= num_sections, reason, markers or _whole(text))


@checker(
    "detectable_format:json_format",
    "Entire output should be wrapped in JSON format. You can use markdown ticks such as ```.",
)
def _json_format(text: str) -> Outcome:
    body = text.strip()
    for fence in ("```json", "```Json", "```JSON", "```"):
        body = body.removeprefix(fence)
    body = body.removesuffix("```").strip()
    try:
        json.loads(body)  # parsed, never evaluated
    except (ValueError, RecursionError) as error:
        return Outcome(False, f"not valid JSON ({type(error).__name__})", _whole(text))
    return Outcome(True, "valid JSON", _whole(text))


@checker(
    "detectable_format:title",
    "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>.",
)
def _title(text: str) -> Outcome:
    titles = [(a, b) for a, b in _double_angled(text) if text[a:b].lstrip("<").rstrip(">").strip()]
    return Outcome(
        bool(titles), "no title in <<double angular brackets>>", tuple(titles) or _whole(text)
    )


def _double_angled(text: str) -> list[Span]:
    """The matches of IFEval's greedy `<<[^\\n]+>>`, line by line: the first `<<` of a line runs
    to the line's last `>>` (at least one character between). The regex retries every later
    `<` of a line that has no closing `>>` (quadratic); no later start can succeed there."""
    spans = []
    line_start = 0
    while line_start < len(text):
        line_end = text.find("\n", line_start)
        line_end = len(text) if line_end < 0 else line_end
        opening = text.find("<<", line_start, line_end)
        closing = text.rfind(">>", opening + 3, line_end) if opening >= 0 else -1
        if closing >= 0:
            spans.append((opening, closing + 2))
        line_start = line_end + 1
    return spans


# ----------------------------------------------------------------------------------------------
# combination:*, startend:*, punctuation:*


@checker(
    "combination:two_responses",
    "Give two different responses. Responses and only responses should be separated by 6 asterisk symbols: ******.",
)
def _two_responses(text: str) -> Outcome:
    responses = text.split("******")
    kept = []
    for index, response in enumerate(responses):
        if response.strip():
            kept.append(response.strip())
        elif index not in (0, len(responses) - 1):
            return Outcome(False, "an empty response between two ****** separators", _whole(text))
    if len(kept) != 2:
        return Outcome(False, f"{len(kept)} responses separated by ******", _whole(text))
    return Outcome(kept[0] != kept[1], "the two responses are identical", _whole(text))


@checker(
    "combination:repeat_prompt",
    'First repeat the request word for word without change, then give your answer. The request: "{prompt_to_repeat}"',
    prompt_to_repeat=_raw_phrase,
)
def _repeat_prompt(text: str, prompt_to_repeat: str) -> Outcome:
    request = prompt_to_repeat.strip()
    start = len(text) - len(text.lstrip())
    span = ((start, min(len(text), start + len(request))),)
    passed = text.strip().lower().startswith(request.lower())
    return Outcome(passed, "the response does not start with the request", span)


@checker(
    "startend:end_checker",
    'Finish your response with this exact phrase "{end_phrase}". No other words should follow this phrase.',
    end_phrase=_phrase,
)
def _end_checker(text: str, end_phrase: str) -> Outcome:
    stripped = text.strip()
    core = stripped.strip('"')
    start = (len(text) - len(text.lstrip())) + (len(stripped) - len(stripped.lstrip('"')))
    end = start + len(core)
    span = ((max(0, end - len(end_phrase)), end),)
    passed = core.lower().endswith(end_phrase.lower())
    return Outcome(passed, f'the response ends with "{core[-len(end_phrase) :]}"', span)


@checker("punctuation:no_comma", "In your entire response, refrain from the use of any commas.")
def _no_comma(text: str) -> Outcome:
    commas = tuple((m.start(), m.end()) for m in re.finditer(",", text))
    return Outcome(not commas, f"the response has {len(commas)} commas", commas or _whole(text))


@checker("startend:quotation", "Wrap your entire response with double quotation marks.")
def _quotation(text: str) -> Outcome:
    start = len(text) - len(text.lstrip())
    end = len(text.rstrip())
    core = text[start:end]
    passed = len(core) > 1 and core[0] == '"' and core[-1] == '"'
    return Outcome(
        passed,
        "the response does not start and end with a double quotation mark",
        ((start, start + 1), (end - 1, end)),
    )
