"""IFBench's `ratio:*` and `sentence:*` instructions (sentence types, lengths, overlaps).

Sentences are IFBench's rule-based ones (`ifbench_text.sentences_with_spans`). Where IFBench's
reference checker raises instead of answering (a response without words, or a sentence
without words where one is read) the verdict here is "not followed".
"""

from __future__ import annotations

from mrtpo.tasks.instructions import ifbench_text as measure
from mrtpo.tasks.instructions import text
from mrtpo.tasks.instructions.ifbench_text import checker, percentage, positive_count, whole
from mrtpo.tasks.instructions.registry import Outcome, _count, _raw_phrase


def _ending_counts(response: str) -> tuple[int, int, int]:
    """How many sentences end with ".", "?" and "!"."""
    ends = [sentence[-1:] for sentence in measure.split_sentences(response)]
    return ends.count("."), ends.count("?"), ends.count("!")


@checker("ratio:sentence_type", "Maintain a 2:1 ratio of declarative to interrogative sentences.")
def _sentence_type(response: str) -> Outcome:
    declarative, interrogative, _ = _ending_counts(response)
    reason = f"{declarative} sentences end with a period, {interrogative} with a question mark"
    return Outcome(declarative == 2 * interrogative, reason, whole(response))


@checker(
    "ratio:sentence_balance",
    "Ensure that the ratio of sentence types (declarative, interrogative, exclamatory) is "
    "balanced.",
)
def _sentence_balance(response: str) -> Outcome:
    counts = _ending_counts(response)
    reason = "{} sentences end with a period, {} with a question mark, {} with an exclamation mark"
    return Outcome(len(set(counts)) == 1, reason.format(*counts), whole(response))


@checker(
    "ratio:sentence_words",
    "Respond with three sentences, all containing the same number of characters but using all "
    "different words.",
)
def _sentence_words(response: str) -> Outcome:
    # IFBench checks the number of sentences and their lengths, not the words.
    found = measure.sentences_with_spans(response)
    spans = tuple(span for _, span in found)
    if len(found) != 3:
        return Outcome(False, f"the response has {len(found)} sentences", spans)
    lengths = [len(sentence) for sentence, _ in found]
    reason = f"the sentences have {', '.join(map(str, lengths))} characters"
    return Outcome(len(set(lengths)) == 1, reason, spans)


@checker(
    "ratio:stop_words",
    "Ensure that stop words constitute no more than {percentage}% of the total words in your "
    "response.",
    percentage=percentage,
)
def _stop_words(response: str, percentage: float) -> Outcome:
    words = text.words(response)
    if not words:  # IFBench divides by zero
        return Outcome(False, "the response has no words", whole(response))
    stopwords = measure.english_stopwords()
    share = (sum(word.lower() in stopwords for word in words) / len(words)) * 100
    return Outcome(
        share <= percentage, f"{share:.1f}% of the words are stop words", whole(response)
    )


@checker(
    "ratio:overlap",
    "Maintain a trigram overlap of {percentage}% (±2%) with the provided reference text.",
    reference_text=_raw_phrase,
    percentage=percentage,
)
def _overlap(response: str, reference_text: str, percentage: float) -> Outcome:
    # Trigrams of characters: the share of the response's distinct ones found in the reference.
    trigrams = {response[i : i + 3] for i in range(len(response) - 2)}
    if not trigrams:  # IFBench divides by zero
        return Outcome(False, "the response is shorter than three characters", whole(response))
    reference = {reference_text[i : i + 3] for i in range(len(reference_text) - 2)}
    overlap = len(trigrams & reference) / len(trigrams)
    reason = f"the trigram overlap is {overlap * 100:.1f}%"
    return Outcome(percentage - 2 <= overlap * 100 <= percentage + 2, reason, whole(response))


@checker(
    "sentence:alliteration_increment",
    "Each sentence must have a longer sequence of consecutive alliterative words than the "
    "previous one.",
)
def _alliteration_increment(response: str) -> Outcome:
    previous = -1
    for sentence, span in measure.sentences_with_spans(response):
        words = [word.lstrip(measure.PUNCTUATION + " ") for word in sentence.lower().split()]
        initials = [word[0] for word in words if word]
        # Each pair of neighbours with the same initial adds 2 when it starts a run, else 1:
        # the total number of words in runs.
        score = 0
        in_run = False
        for first, second in zip(initials, initials[1:], strict=False):
            same = first == second
            score += (1 if in_run else 2) if same else 0
            in_run = same
        if score <= previous:
            reason = f"a sentence scores {score} alliterative words after {previous}"
            return Outcome(False, reason, (span,))
        previous = score
    return Outcome(True, "", whole(response))


@checker(
    "sentence:increment",
    "Each sentence must contain exactly {small_n} more words than the previous one.",
    small_n=_count,
)
def _increment(response: str, small_n: int) -> Outcome:
    found = measure.sentences_with_spans(response)
    if not found:  # IFBench reads the first sentence of none
        return Outcome(False, "the response has no sentences", whole(response))
    counts = [len(measure.without_punctuation(sentence).split()) for sentence, _ in found]
    for index in range(1, len(counts)):
        if counts[index] != counts[index - 1] + small_n:
            reason = f"a sentence of {counts[index]} words follows one of {counts[index - 1]}"
            return Outcome(False, reason, (found[index - 1][1], found[index][1]))
    return Outcome(True, "", whole(response))


@checker(
    "sentence:keyword",
    'The response must include keyword "{word}" in the {N}-th sentence.',
    word=_raw_phrase,
    N=positive_count,
)
def _keyword(response: str, word: str, N: int) -> Outcome:  # noqa: N803
    found = measure.sentences_with_spans(response)
    if len(found) < N:
        return Outcome(False, f"the response has {len(found)} sentences", whole(response))
    sentence, span = found[N - 1]
    reason = f'sentence {N} lacks "{word}"'
    return Outcome(word.lower() in sentence.lower(), reason, (span,))
