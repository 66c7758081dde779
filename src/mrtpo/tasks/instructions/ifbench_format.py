"""IFBench's `format:*` instructions (layout, brackets, quotes, bullets, fixed answers).

Each check follows IFBench's reference checker exactly, quirks included (noted where they
decide a verdict). Where the reference raises instead of answering the verdict here is "not
followed".
"""

from __future__ import annotations

import collections
import re
import string

from mrtpo.tasks.instructions import ifbench_text as measure
from mrtpo.tasks.instructions import text
from mrtpo.tasks.instructions.ifbench_text import checker, whole
from mrtpo.tasks.instructions.registry import Outcome, _raw_phrase
from mrtpo.verifiers import Span


def _is_emoji_end(sentence: str) -> bool | None:
    """Whether one of the last two characters of `sentence` without punctuation is an emoji
    (an emoji with a variation selector is two); None when nothing is left."""
    bare = measure.without_punctuation(sentence).strip()
    if not bare:
        return None
    return measure.is_emoji(bare[-1]) or measure.is_emoji(bare[-2:-1] or bare[-1])


@checker("format:emoji", "Please use an emoji at the end of every sentence.")
def _emoji(response: str) -> Outcome:
    found = measure.sentences_with_spans(response)
    for index, (sentence, span) in enumerate(found):
        ends_with_emoji = _is_emoji_end(sentence)
        if ends_with_emoji is None:
            return Outcome(False, "a sentence is only punctuation", (span,))
        if ends_with_emoji:
            continue
        # The emoji may open the next sentence (the splitter cut before it).
        following = found[index + 1][0] if index + 1 < len(found) else ""
        bare = measure.without_punctuation(following).strip()
        if not (bare and measure.is_emoji(bare[0])):
            return Outcome(False, "a sentence does not end with an emoji", (span,))
    return Outcome(True, "", whole(response))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _lines_left(lines: list[str]) -> list[str]:
    """What IFBench's `for line in lines: if not line.strip(): lines.remove(line)` leaves.

    Removing while iterating skips the line after each removed one, and `remove` drops the
    first equal line, which may be an earlier blank line the loop skipped. Replayed in one
    pass: a visited blank line deletes the first undeleted copy of itself, and the loop then
    moves two lines on."""
    copies: dict[str, collections.deque[int]] = collections.defaultdict(collections.deque)
    for index, line in enumerate(lines):
        if not line.strip():
            copies[line].append(index)
    deleted = set()
    index = 0
    while index < len(lines):
        if lines[index].strip():
            index += 1
        else:
            deleted.add(copies[lines[index]].popleft())
            index += 2
    return [line for index, line in enumerate(lines) if index not in deleted]


@checker("format:line_indent", "Create stairs by incrementally indenting each new line.")
def _line_indent(response: str) -> Outcome:
    lines = _lines_left(response.split("\n"))
    for upper, lower in zip(lines, lines[1:], strict=False):
        if _indent(lower) <= _indent(upper):
            reason = f"a line indented by {_indent(lower)} follows one indented by {_indent(upper)}"
            return Outcome(False, reason, whole(response))
    return Outcome(True, "", whole(response))


@checker(
    "format:list",
    "Answer with a list of items, instead of bullet points use {sep}.",
    sep=_raw_phrase,
)
def _list(response: str, sep: str) -> Outcome:
    # IFBench counts the marker anywhere, not only at line starts.
    spans = tuple(m.span() for m in re.finditer(re.escape(sep), response))
    return Outcome(len(spans) >= 2, f'"{sep}" appears {len(spans)} times', spans or whole(response))


@checker("format:newline", "Write each word on a new line.")
def _newline(response: str) -> Outcome:
    bare = measure.without_punctuation(response).strip()
    lines = [line for line in bare.split("\n") if line != ""]  # lines of spaces stay
    words = bare.split()
    reason = f"{len(words)} words on {len(lines)} lines"
    return Outcome(len(lines) == len(words), reason, whole(response))


@checker(
    "format:no_bullets_bullets",
    "Your answer must contain at least two sentences ending in a period followed by at least two "
    "bullet points denoted by *.",
)
def _no_bullets_bullets(response: str) -> Outcome:
    # Lines of sentences, then lines starting with *. IFBench counts the sentences of each line;
    # after a line with none (a blank one) another line of sentences is refused.
    sentences_open = True
    sentence_count = 0
    bullet_count = 0
    for line in response.split("\n"):
        if line.strip().startswith("*"):
            sentences_open = False
            if sentence_count < 2:
                reason = f"a bullet point follows {sentence_count} sentences"
                return Outcome(False, reason, whole(response))
            bullet_count += 1
        elif sentences_open:
            line_sentences = measure.split_sentences(line.strip())
            sentence_count += len(line_sentences)
            sentences_open = bool(line_sentences)
        else:
            return Outcome(False, "text follows the bullet points", whole(response))
    reason = f"the response has {bullet_count} bullet points"
    return Outcome(bullet_count >= 2, reason, whole(response))


@checker("format:no_whitespace", "The output should not contain any whitespace.")
def _no_whitespace(response: str) -> Outcome:
    found = re.search(r"\s", response)
    if found:
        return Outcome(False, "the response has whitespace", (found.span(),))
    return Outcome(True, "", whole(response))


_TEMPLATE_LABELS = ("My Answer:", "My Conclusion:", "Future Outlook:")


@checker(
    "format:output_template",
    "Use this exact template for your response: My Answer: [answer] My Conclusion: [conclusion] "
    "Future Outlook: [outlook]",
)
def _output_template(response: str) -> Outcome:
    missing = [label for label in _TEMPLATE_LABELS if label not in response]
    spans = []
    for label in _TEMPLATE_LABELS:
        start = response.find(label)
        if start >= 0:
            spans.append((start, start + len(label)))
    return Outcome(
        not missing, f"missing {', '.join(missing)}", tuple(sorted(spans)) or whole(response)
    )


def _options_of(options: str) -> tuple[list[str], bool]:
    """IFBench's reading of an options string: the options (split on "/", else on "or", else on
    ","; stripped) and whether they are letters a, b, c..., which must be answered exactly."""
    letters = re.match(r"\W*[aA]\W*[bB]\W*[cC]\W*", options) is not None
    separator = "/" if "/" in options else "or" if "or" in options else ","
    return [option.strip() for option in options.split(separator)], letters


@checker(
    "format:options",
    "Answer with one of the following options: {options}. Do not give any explanation.",
    options=_raw_phrase,
)
def _options(response: str, options: str) -> Outcome:
    choices, letters = _options_of(options)
    reason = "the response is not one of the options"
    if letters:
        return Outcome(response in choices, reason, whole(response))
    answer = measure.strip_punctuation(response).lower()
    passed = any(measure.strip_punctuation(choice).lower() == answer for choice in choices)
    return Outcome(passed, reason, whole(response))


_CLOSING = {")": "(", "]": "[", "}": "{"}


@checker(
    "format:parentheses", "Nest parentheses (and [brackets {{and braces}}]) at least 5 levels deep."
)
def _parentheses(response: str) -> Outcome:
    # A closing bracket that does not match the innermost open one empties the stack and the
    # depth reached; the first match closed at depth 5 or more (reached since) passes.
    open_at: list[int] = []
    deepest = 0
    for index, character in enumerate(response):
        if character in "([{":
            open_at.append(index)
            deepest = max(deepest, len(open_at))
        elif character in _CLOSING:
            if open_at and response[open_at[-1]] == _CLOSING[character]:
                start = open_at.pop()
                if deepest >= 5:
                    return Outcome(True, "", ((start, index + 1),))
            else:
                open_at = []
                deepest = 0
    return Outcome(False, "no brackets nested 5 levels deep", whole(response))


@checker(
    "format:quotes",
    "Include quotes within quotes within quotes, at least 3 levels deep, alternating between "
    "double quotes and single quotes.",
)
def _quotes(response: str) -> Outcome:
    # A quote closes the innermost open one if it is the same character, else opens a new one;
    # passes once a closing leaves the depth 3 below the deepest reached.
    open_at: list[int] = []
    deepest = 0
    for index, character in enumerate(response):
        if open_at and character == response[open_at[-1]]:
            start = open_at.pop()
            if deepest - len(open_at) >= 3:
                return Outcome(True, "", ((start, index + 1),))
        elif character in "\"'":
            open_at.append(index)
            deepest = max(deepest, len(open_at))
    return Outcome(False, "no quotes nested 3 levels deep", whole(response))


_NOT_FINAL = string.digits + string.punctuation.replace('"', "")


@checker("format:quote_unquote", "Every quoted phrase must be followed by an unquoted explanation.")
def _quote_unquote(response: str) -> Outcome:
    squeezed = response.replace("“", '"').replace("”", '"').replace("'\"'", "")
    squeezed = "".join(squeezed.split())
    if '""' in squeezed:
        return Outcome(False, "two quotes meet with nothing between", whole(response))
    core = squeezed.strip(_NOT_FINAL)
    if not core:  # IFBench reads the last character of an empty string
        return Outcome(False, "the response has no text", whole(response))
    return Outcome(core[-1] != '"', "the response ends with a quote", whole(response))


@checker(
    "format:sub-bullets",
    "Your response must include bullet points denoted by * and at least one sub-bullet point "
    "denoted by - for each bullet point.",
)
def _sub_bullets(response: str) -> Outcome:
    # IFBench splits at every *, not only at line starts; each piece after one needs a -.
    start = response.find("*")
    while start >= 0:
        end = response.find("*", start + 1)
        end = len(response) if end < 0 else end
        if "-" not in response[start + 1 : end]:
            return Outcome(False, "a * is not followed by a - before the next *", ((start, end),))
        start = response.find("*", start + 1)
    return Outcome(True, "", whole(response))


@checker(
    "format:thesis",
    "Each section must begin with a thesis statement in italics, use HTML to indicate the italics.",
)
def _thesis(response: str) -> Outcome:
    # From the first <i> (else <em>) to the next </i> (else </em>); IFBench cuts the thesis
    # and the rest with the lengths of <i> and </i> whichever tags it found.
    start = response.find("<i>")
    start = response.find("<em>") if start < 0 else start
    if start < 0:
        return Outcome(False, "no <i> or <em>", whole(response))
    rest = response[start:]
    end = rest.find("</i>")
    end = rest.find("</em>") if end < 0 else end
    if end < 0:
        return Outcome(False, "no </i> or </em> after the opening tag", whole(response))
    span: Span = (start, start + end + 4)
    if not rest[3:end].strip():
        return Outcome(False, "the italic thesis is empty", (span,))
    return Outcome(bool(rest[end + 4 :].strip()), "no text follows the thesis", (span,))


def _could_break_title_case(chunk: str) -> bool:
    """Whether a whitespace-free chunk holds a lowercase character followed by a cased one:
    a token that breaks title case (lowercase first, then all lower- or all uppercase) is a
    piece of one chunk that does."""
    for index, character in enumerate(chunk):
        if character.islower():
            return any(c.islower() or c.isupper() for c in chunk[index + 1 :])
    return False


@checker(
    "format:title_case",
    "Write the entire response in title case (capitalize the first letter of every major word).",
)
def _title_case(response: str) -> Outcome:
    # Only sentences that could break title case are tokenized (NLTK's tokenizer is slow).
    for start, end in text.sentence_spans(response):
        sentence = response[start:end]
        if not any(_could_break_title_case(chunk) for chunk in sentence.split()):
            continue
        for token in text.sentence_word_tokens(sentence):
            rest = token[1:]
            if token[0].islower() and (rest.isupper() or rest.islower()):
                return Outcome(False, f'"{token}" is not capitalized', ((start, end),))
    return Outcome(True, "", whole(response))
