"""IFBench's `words:*` instructions (letters, lengths, syllables and positions of words).

Unless a check says otherwise, words are whitespace-separated after ASCII punctuation is
deleted, as in IFBench's reference checkers. Where the reference raises instead of answering
(a sentence without words where one is read) the verdict here is "not followed".
"""

from __future__ import annotations

import re
import string
from collections import Counter

from mrtpo.tasks.instructions import ifbench_text as measure
from mrtpo.tasks.instructions import text
from mrtpo.tasks.instructions.ifbench_text import checker, positive_count, whole
from mrtpo.tasks.instructions.registry import Outcome, _count, _phrase
from mrtpo.verifiers import Span

# The Treebank tokenizer copies every token from the text but double quotes, written `` or ''.
_REWRITTEN_QUOTES = ("``", "''")


def _cannot_be_a_token(keyword: str, passage: str) -> bool:
    """True when no word token of `passage` can equal `keyword` (it is not in the passage)."""
    return keyword not in passage and keyword not in _REWRITTEN_QUOTES


@checker(
    "words:alphabet",
    "Each word must start with the next letter of the alphabet, looping back to 'A' after 'Z'.",
)
def _alphabet(response: str) -> Outcome:
    cleaned = measure.without_punctuation(response)
    words = cleaned.strip(measure.PUNCTUATION + " ").split()
    if not words:
        return Outcome(False, "the response has no words", whole(response))
    letter = words[0][0].lower()
    if letter not in string.ascii_lowercase:  # IFBench tests a substring: one letter here
        return Outcome(False, f'the first word starts with "{words[0][0]}"', whole(response))
    for word in words[1:]:
        word = measure.strip_punctuation(word).lower()
        if not word:
            continue
        letter = string.ascii_lowercase[(string.ascii_lowercase.index(letter) + 1) % 26]
        if word[0] != letter:
            return Outcome(False, f'"{word}" does not start with "{letter}"', whole(response))
    return Outcome(True, "", whole(response))


@checker("words:vowel", "Write a paragraph using words that contain only three types of vowels.")
def _vowel(response: str) -> Outcome:
    if "\n" in response.strip():
        return Outcome(False, "the response has more than one line", whole(response))
    vowels = set(response.lower()) & set("aeiou")
    reason = f"the response uses the vowels {''.join(sorted(vowels))}"
    return Outcome(len(vowels) <= 3, reason, whole(response))


_CONSONANTS = frozenset("bcdfghjklmnpqrstvwxyz")


@checker(
    "words:consonants",
    "Ensure each word in your response has at least one consonant cluster (two or more "
    "consonants together).",
)
def _consonants(response: str) -> Outcome:
    # Words are whitespace-separated, punctuation kept; lowercase ASCII consonants only.
    lowered = response.lower()
    for match in re.finditer(r"\S+", lowered):
        word = match.group()
        if not any(
            a in _CONSONANTS and b in _CONSONANTS for a, b in zip(word, word[1:], strict=False)
        ):
            span = (match.span(),) if len(lowered) == len(response) else whole(response)
            return Outcome(False, f'"{word}" has no two consonants together', span)
    return Outcome(True, "", whole(response))


@checker(
    "words:palindrome",
    "Include at least 10 single-word palindromes, each at least 5 characters long.",
)
def _palindrome(response: str) -> Outcome:
    words = measure.without_punctuation(response).lower().split()
    count = sum(len(word) >= 5 and word == word[::-1] for word in words)
    return Outcome(count >= 10, f"the response has {count} palindromes", whole(response))


# IFBench's list stops at 97: a longer word never passes.
_PRIMES = frozenset(
    (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97)
)


@checker("words:prime_lengths", "Use only words with lengths that are prime numbers.")
def _prime_lengths(response: str) -> Outcome:
    for word in measure.without_punctuation(response).split():
        if len(word) not in _PRIMES:
            return Outcome(False, f'"{word}" has {len(word)} characters', whole(response))
    return Outcome(True, "", whole(response))


@checker(
    "words:repeats",
    "The response should not repeat any word more than {small_n} times.",
    small_n=_count,
)
def _repeats(response: str, small_n: int) -> Outcome:
    counts = Counter(measure.without_punctuation(response.lower()).split())
    word, count = max(counts.items(), key=lambda item: item[1], default=("", 0))
    return Outcome(count <= small_n, f'"{word}" appears {count} times', whole(response))


@checker("words:no_consecutive", "No two consecutive words can share the same first letter.")
def _no_consecutive(response: str) -> Outcome:
    words = measure.without_punctuation(response.lower()).split()
    for first, second in zip(words, words[1:], strict=False):
        if first[0] == second[0]:
            return Outcome(False, f'"{first} {second}" share a first letter', whole(response))
    return Outcome(True, "", whole(response))


@checker(
    "words:odd_even_syllables", "Alternate between words with odd and even numbers of syllables."
)
def _odd_even_syllables(response: str) -> Outcome:
    words = measure.without_punctuation(response).lower().split()
    parities = [measure.syllable_count(word) % 2 for word in words]
    for index in range(1, len(parities)):
        if parities[index] == parities[index - 1]:
            pair = f'"{words[index - 1]} {words[index]}"'
            return Outcome(
                False, f"{pair} have syllable counts of the same parity", whole(response)
            )
    return Outcome(True, "", whole(response))


@checker(
    "words:last_first",
    "The last word of each sentence must become the first word of the next sentence.",
)
def _last_first(response: str) -> Outcome:
    found = measure.sentences_with_spans(response)
    for (sentence, span), (following, next_span) in zip(found, found[1:], strict=False):
        last = sentence.rstrip(measure.PUNCTUATION + " ").split()[-1:]
        first = following.lstrip(measure.PUNCTUATION + " ").split()[:1]
        if not last or not first:  # IFBench raises on a sentence without words
            return Outcome(False, "a sentence has no words", (span, next_span))
        if last[0].lower() != first[0].lower():
            reason = f'a sentence ends with "{last[0]}" and the next starts with "{first[0]}"'
            return Outcome(False, reason, (span, next_span))
    return Outcome(True, "", whole(response))


@checker(
    "words:paragraph_last_first",
    "Each paragraph must end with the same word it started with, separate paragraphs with a "
    "newline.",
)
def _paragraph_last_first(response: str) -> Outcome:
    start = 0
    for line in response.split("\n"):
        paragraph = line.strip().lower()
        words = paragraph.strip(measure.PUNCTUATION + " ").split()
        if paragraph and (not words or words[0] != words[-1]):
            reason = "a paragraph does not end with the word it starts with"
            return Outcome(False, reason, ((start, start + len(line)),))
        start += len(line) + 1
    return Outcome(True, "", whole(response))


def _token_span(response: str, tokens: list[str], index: int) -> tuple[Span, ...]:
    span = text.token_spans(response, tokens[: index + 1])[index]
    return (span,) if span is not None else whole(response)


@checker("words:start_verb", "The response must start with a verb.")
def _start_verb(response: str) -> Outcome:
    tokens = text.leading_word_tokens(response, 3)
    if not tokens:
        return Outcome(False, "the response has no words", whole(response))
    tag = measure.first_tag(tokens)
    return Outcome("VB" in tag, f'"{tokens[0]}" is tagged {tag}', _token_span(response, tokens, 0))


@checker(
    "words:keywords_specific_position",
    "Include keyword {keyword} in the {n}-th sentence, as the {m}-th word of that sentence.",
    keyword=_phrase,
    n=positive_count,
    m=positive_count,
)
def _keywords_specific_position(response: str, keyword: str, n: int, m: int) -> Outcome:
    found = measure.sentences_with_spans(response)
    if len(found) < n:
        return Outcome(False, f"the response has {len(found)} sentences", whole(response))
    sentence, span = found[n - 1]
    reason = f'word {m} of sentence {n} is not "{keyword}"'
    if _cannot_be_a_token(keyword, sentence):
        return Outcome(False, reason, (span,))
    tokens = text.leading_word_tokens(sentence, m)
    return Outcome(len(tokens) >= m and tokens[m - 1] == keyword, reason, (span,))


@checker(
    "words:words_position",
    "The second word in your response and the second to last word in your response should be "
    "the word {keyword}.",
    keyword=_phrase,
)
def _words_position(response: str, keyword: str) -> Outcome:
    reason = f'the second and the second to last words are not both "{keyword}"'
    if _cannot_be_a_token(keyword, response):
        return Outcome(False, reason, whole(response))
    tokens = text.word_tokens(response)
    passed = len(tokens) >= 2 and tokens[1] == tokens[-2] == keyword
    return Outcome(passed, reason, whole(response))
