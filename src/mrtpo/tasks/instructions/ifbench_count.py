"""IFBench's `count:*` instructions (counting words, names, numbers, keywords, punctuation).

Each check follows IFBench's reference checker exactly, quirks included (noted where they
decide a verdict); `ifbench_text` has the shared measurements.
"""

from __future__ import annotations

import re

from mrtpo.tasks.instructions import ifbench_text as measure
from mrtpo.tasks.instructions import text
from mrtpo.tasks.instructions.ifbench_text import checker, positive_count, whole
from mrtpo.tasks.instructions.registry import Outcome, _count, _phrase


@checker(
    "count:word_count_range",
    "The response must contain between {min_words} and {max_words} words.",
    min_words=_count,
    max_words=_count,
)
def _word_count_range(response: str, min_words: int, max_words: int) -> Outcome:
    count = text.count_words(response)
    return Outcome(
        min_words <= count <= max_words, f"the response has {count} words", whole(response)
    )


@checker("count:unique_word_count", "Use at least {N} unique words in the response.", N=_count)
def _unique_word_count(response: str, N: int) -> Outcome:  # noqa: N803 (IFBench's name)
    # Words are whitespace-separated, lowercased, stripped of punctuation; a word of
    # punctuation alone leaves "" and counts once too.
    unique = {measure.strip_punctuation(word) for word in response.lower().split()}
    return Outcome(
        len(unique) >= N, f"the response has {len(unique)} unique words", whole(response)
    )


CONJUNCTIONS = ("and", "but", "for", "nor", "or", "so", "yet")


@checker(
    "count:conjunctions",
    "Use at least {small_n} different coordinating conjunctions in the response.",
    small_n=_count,
)
def _conjunctions(response: str, small_n: int) -> Outcome:
    # IFBench collects the words as written: "and", "And" and "and," are three different ones.
    used = set()
    spans = []
    for match in re.finditer(r"\S+", response):
        if measure.strip_punctuation(match.group()).lower() in CONJUNCTIONS:
            used.add(match.group())
            spans.append(match.span())
    reason = f"the response uses {len(used)} different conjunction words"
    return Outcome(len(used) >= small_n, reason, tuple(spans) or whole(response))


PERSON_NAMES = (
    "Emma", "Liam", "Sophia", "Jackson", "Olivia", "Noah", "Ava", "Lucas", "Isabella", "Mason",
    "Mia", "Ethan", "Charlotte", "Alexander", "Amelia", "Benjamin", "Harper", "Leo", "Zoe",
    "Daniel", "Chloe", "Samuel", "Lily", "Matthew", "Grace", "Owen", "Abigail", "Gabriel", "Ella",
    "Jacob", "Scarlett", "Nathan", "Victoria", "Elijah", "Layla", "Nicholas", "Audrey", "David",
    "Hannah", "Christopher", "Penelope", "Thomas", "Nora", "Andrew", "Aria", "Joseph", "Claire",
    "Ryan", "Stella", "Jonathan",
)  # fmt: skip


@checker(
    "count:person_names",
    "Mention at least {N} different person names in the response, from this list of person "
    "names: " + ", ".join(PERSON_NAMES) + " .",
    N=_count,
)
def _person_names(response: str, N: int) -> Outcome:  # noqa: N803
    # A name counts wherever it appears, inside a longer word too ("Leo" in "Leonard").
    spans = []
    for name in PERSON_NAMES:
        start = response.find(name)
        if start >= 0:
            spans.append((start, start + len(name)))
    reason = f"the response mentions {len(spans)} of the names"
    return Outcome(len(spans) >= N, reason, tuple(sorted(spans)) or whole(response))


# A run of digits once punctuation is deleted: digits joined by punctuation only ("1,000").
_NUMBER = re.compile(r"\d(?:[" + re.escape(measure.PUNCTUATION) + r"]*\d)*")


@checker("count:numbers", "Include exactly {N} numbers in the response.", N=_count)
def _numbers(response: str, N: int) -> Outcome:  # noqa: N803
    count = len(re.findall(r"\d+", measure.without_punctuation(response)))
    spans = tuple(match.span() for match in _NUMBER.finditer(response))
    return Outcome(count == N, f"the response has {count} numbers", spans or whole(response))


PRONOUNS = frozenset(
    "i me my mine myself we us our ours ourselves you your yours yourself yourselves he him his "
    "himself she her hers herself it its itself they them their theirs themselves".split()
)


@checker("count:pronouns", "The response should include at least {N} pronouns.", N=_count)
def _pronouns(response: str, N: int) -> Outcome:  # noqa: N803
    # "/" separates words ("she/her"); other punctuation is deleted ("it's" is "its").
    words = measure.without_punctuation(response.replace("/", " ").lower()).split()
    count = sum(word in PRONOUNS for word in words)
    return Outcome(count >= N, f"the response has {count} pronouns", whole(response))


_INTERROBANGS = ("?!", "!?", "‽")


@checker(
    "count:punctuation",
    "Use every standard punctuation mark at least once, including semicolons, colons, and the "
    "interrobang (?!).",
)
def _punctuation(response: str) -> Outcome:
    if not any(mark in response for mark in _INTERROBANGS):
        return Outcome(False, "no interrobang (?!, !? or ‽)", whole(response))
    # One interrobang's characters do not count as its own ? and !: the first "?!" is removed,
    # or when there is none the first "!?".
    rest = response.replace("?!", "", 1)
    if len(rest) == len(response):
        rest = response.replace("!?", "", 1)
    missing = [mark for mark in ".,!?;:" if mark not in rest]
    reason = f"missing {' '.join(missing)}"
    return Outcome(not missing, reason, whole(response))


_JAPANESE = re.compile("[\u3040-\u30ff\u4e00-\u9fff]")


def _japanese_statement(N: int) -> str:  # noqa: N803
    suffix = "th" if 10 <= N % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(N % 10, "th")
    return f"Every {N}{suffix} word of your response must be in Japanese."


@checker("count:words_japanese", _japanese_statement, N=positive_count)
def _words_japanese(response: str, N: int) -> Outcome:  # noqa: N803
    # Words are whitespace-separated; every Nth one that is more than punctuation and not all
    # digits needs a Hiragana, Katakana or Kanji character.
    for index, match in enumerate(re.finditer(r"\S+", response), start=1):
        word = measure.strip_punctuation(match.group())
        if index % N == 0 and word and not word.isdigit() and not _JAPANESE.search(word):
            return Outcome(False, f'word {index}, "{word}", is not Japanese', (match.span(),))
    return Outcome(True, "", whole(response))


_KEYWORD_TIMES = (1, 2, 3, 5, 7)


@checker(
    "count:keywords_multiple",
    "Include keyword {keyword1} once in your response, keyword {keyword2} twice in your "
    "response, keyword {keyword3} three times in your response, keyword {keyword4} five times "
    "in your response, and keyword {keyword5} seven times in your response.",
    keyword1=_phrase,
    keyword2=_phrase,
    keyword3=_phrase,
    keyword4=_phrase,
    keyword5=_phrase,
)
def _keywords_multiple(
    response: str, keyword1: str, keyword2: str, keyword3: str, keyword4: str, keyword5: str
) -> Outcome:
    # Counted case-insensitively as substrings, without overlaps (str.count).
    lowered = response.lower()
    keywords = (keyword1, keyword2, keyword3, keyword4, keyword5)
    wrong = []
    spans = []
    for keyword, times in zip(keywords, _KEYWORD_TIMES, strict=True):
        count = lowered.count(keyword.lower())
        if count != times:
            wrong.append(f'"{keyword}" {count} times instead of {times}')
        if len(lowered) == len(response):
            spans += [m.span() for m in re.finditer(re.escape(keyword.lower()), lowered)]
    return Outcome(not wrong, "; ".join(wrong), tuple(sorted(spans)) or whole(response))
