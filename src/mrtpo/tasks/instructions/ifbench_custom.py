"""IFBench's `custom:*` and `repeat:*` instructions: whole tasks with one right shape of answer
(lists, CSV tables, reversed text) and repetitions of the request.

Each check follows IFBench's reference checker exactly, quirks included (noted where they
decide a verdict). Where the reference raises instead of answering (a CSV field too long for
Python's csv module, an empty field or sentence where one is read) the verdict here is "not
followed".
"""

from __future__ import annotations

import csv
import io
import itertools
import re
import unicodedata

from mrtpo.tasks.instructions import ifbench_text as measure
from mrtpo.tasks.instructions.ifbench_text import checker, whole
from mrtpo.tasks.instructions.registry import Outcome, _count, _raw_phrase


@checker("custom:multiples", "Count from 10 to 50 but only print multiples of 7.")
def _multiples(response: str) -> Outcome:
    numbers = re.findall(r"\d+", response)
    expected = [str(n) for n in range(14, 51, 7)]
    return Outcome(numbers == expected, f"the numbers are {' '.join(numbers)}", whole(response))


_QUESTION_LABEL = re.compile(r"Question \d+[\.|\):;]?\s*")
_OPTION_LINE = re.compile(r"^[A-Ea-e][\.|\)]\s*\w+")


def _split_questions(response: str) -> list[str]:
    """`re.split(r"\\n*(?:Question \\d+[\\.|\\):;]?\\s*)", response)`, linear: the regex rescans
    a run of newlines from each of its characters. Each label takes the newlines just before
    it (back to the previous label)."""
    pieces = []
    start = 0
    for label in _QUESTION_LABEL.finditer(response):
        cut = label.start()
        while cut > start and response[cut - 1] == "\n":
            cut -= 1
        pieces.append(response[start:cut])
        start = label.end()
    pieces.append(response[start:])
    return pieces


@checker(
    "custom:mcq_count_length",
    "Generate 4 multiple choice questions with 5 options each about '20th century art history'. "
    'Each question should start with the label "Question". The questions should get '
    "progressively longer. Do not provide an explanation.",
)
def _mcq_count_length(response: str) -> Outcome:
    if response[response.find("Question") :] != response:
        return Outcome(False, 'the response does not start with "Question"', whole(response))
    questions = _split_questions(response)
    if questions[0] == "":
        questions = questions[1:]
    questions = [question.strip() for question in questions if question.strip()]
    if len(questions) != 4:
        return Outcome(False, f"the response has {len(questions)} questions", whole(response))
    lengths = []
    for question in questions:
        # Lines before the first option line are the question; option lines are counted.
        stem = []
        options = 0
        for line in question.split("\n"):
            if _OPTION_LINE.match(line.strip()):
                options += 1
            elif not options:
                stem.append(" " + line.strip())
        if options != 5:
            return Outcome(False, f"a question has {options} options", whole(response))
        lengths.append(len("".join(stem).strip()))
    growing = all(a < b for a, b in zip(lengths, lengths[1:], strict=False))
    return Outcome(growing, "the questions do not get longer", whole(response))


def _ascii(text: str) -> str:
    """`text` decomposed (NFKD) with what is not ASCII dropped: "São Tomé" -> "Sao Tome"."""
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


@checker(
    "custom:reverse_newline",
    "List the countries of Africa in reverse alphabetical order, each on a new line.",
)
def _reverse_newline(response: str) -> Outcome:
    lines = [measure.strip_punctuation(line) for line in response.split("\n")]
    lines = [line for line in lines if line]
    start = next((i for i, line in enumerate(lines) if "Zimbabwe" in line), None)
    if start is None:
        return Outcome(False, "no line names Zimbabwe", whole(response))
    listed = [_ascii(line) for line in lines[start:]]
    if len(listed) < 52:
        return Outcome(False, f"{len(listed)} lines from Zimbabwe on", whole(response))
    ordered = all(a >= b for a, b in zip(listed, listed[1:], strict=False))
    return Outcome(ordered, "the lines are not in reverse alphabetical order", whole(response))


@checker(
    "custom:word_reverse",
    "What animal is the national symbol of the US? Respond to this query, but make your sentence "
    "in reverse order of what it should be, per word.",
)
def _word_reverse(response: str) -> Outcome:
    reversed_words = " ".join(measure.without_punctuation(response.lower().strip()).split()[::-1])
    if "bald eagle" not in reversed_words:
        return Outcome(False, 'reversed, the response does not say "bald eagle"', whole(response))
    # IFBench then asks that the reversed text be one of its own sentences.
    passed = reversed_words in measure.split_sentences(reversed_words)
    return Outcome(passed, "reversed, the response is not one sentence", whole(response))


@checker(
    "custom:character_reverse",
    "What animal is the national symbol of the US? Respond to this query, but make your sentence "
    "in reverse order of what it should be, per letter.",
)
def _character_reverse(response: str) -> Outcome:
    start = response.lower().find("elgae dlab")
    if start < 0:
        return Outcome(False, 'the response does not contain "elgae dlab"', whole(response))
    span = (start, start + 10) if len(response.lower()) == len(response) else whole(response)[0]
    return Outcome(True, "", (span,))


@checker(
    "custom:sentence_alphabet",
    "Tell me a 26-sentence story where each sentence's first word starts with the letters of the "
    "alphabet in order.",
)
def _sentence_alphabet(response: str) -> Outcome:
    found = measure.sentences_with_spans(response)
    if len(found) != 26:
        return Outcome(False, f"the response has {len(found)} sentences", whole(response))
    for index, (sentence, span) in enumerate(found):
        words = sentence.split()
        letter = chr(ord("a") + index)
        if not words:  # IFBench raises on a sentence without words
            return Outcome(False, f"sentence {index + 1} has no words", (span,))
        if words[0].lower()[0] != letter:
            return Outcome(False, f'sentence {index + 1} does not start with "{letter}"', (span,))
    return Outcome(True, "", whole(response))


EUROPEAN_CAPITALS_NORTH_OF_45 = (
    "Reykjavik", "Helsinki", "Oslo", "Tallinn", "Stockholm", "Riga", "Moscow", "Copenhagen",
    "Vilnius", "Minsk", "Dublin", "Berlin", "Amsterdam", "Warsaw", "London", "Brussels", "Prague",
    "Luxembourg", "Paris", "Vienna", "Bratislava", "Budapest", "Vaduz", "Chisinau", "Bern",
    "Ljubljana", "Zagreb",
)  # fmt: skip


@checker(
    "custom:european_capitals_sort",
    "Give me the names of all capital cities of european countries whose latitude is higher "
    "than than 45 degrees? List the capital cities without country names, separated by commas, "
    "sorted by latitude, from highest to lowest.",
)
def _european_capitals_sort(response: str) -> Outcome:
    named = [name.strip() for name in _ascii(response).split(",") if name.strip()]
    passed = named == list(EUROPEAN_CAPITALS_NORTH_OF_45)
    return Outcome(passed, "not the expected capitals in the expected order", whole(response))


def _csv_rows(response: str, most: int, delimiter: str = ",") -> list[list[str]] | None:
    """The first `most` + 1 rows Python's csv module reads (enough to tell whether there are
    `most`), or None where it raises (a field over its size limit: IFBench would stop there;
    past the rows read it may raise too, but the answer is "no" either way)."""
    try:
        return list(
            itertools.islice(csv.reader(io.StringIO(response), delimiter=delimiter), most + 1)
        )
    except csv.Error:
        return None


@checker(
    "custom:csv_city",
    'Generate CSV data: The column names are ["ID", "Country", "City", "Year", "Count"], the '
    "data should be comma delimited. Please generate 7 rows.",
)
def _csv_city(response: str) -> Outcome:
    rows = _csv_rows(response, 8)
    if rows is None or len(rows) != 8:
        return Outcome(False, "not a header and 7 rows of CSV", whole(response))
    if rows[0] != ["ID", "Country", "City", "Year", "Count"]:
        return Outcome(False, "the header is not ID,Country,City,Year,Count", whole(response))
    passed = all(len(row) == 5 for row in rows[1:])
    return Outcome(passed, "a row does not have 5 fields", whole(response))


_PRODUCT_HEADER = re.compile(
    r'^(ProductID|"ProductID"),[ \t]*(Category|"Category"),[ \t]*(Brand|"Brand"),'
    r'[ \t]*(Price|"Price"),[ \t]*(Stock|"Stock")$'
)
_SPECIAL = re.compile(r"[^\d\w\s]")


def _quoted_special(field: str) -> bool:
    """`re.match(r'".*[^\\d\\w\\s].*"', field)`, linear: on the field's first line, after the
    opening quote, a special character followed later by a quote."""
    if not field.startswith('"'):
        return False
    line_end = field.find("\n")
    line = field if line_end < 0 else field[:line_end]
    last_quote = line.rfind('"', 1)
    return last_quote > 1 and _SPECIAL.search(line, 1, last_quote) is not None


@checker(
    "custom:csv_special_character",
    'Generate CSV data: The column names are ["ProductID", "Category", "Brand", "Price", '
    '"Stock"], the data should be comma delimited. Please generate 14 rows. Add one field which '
    "contains a special character and enclose it in double quotes.",
)
def _csv_special_character(response: str) -> Outcome:
    if not _PRODUCT_HEADER.match(response.split("\n")[0].strip()):
        return Outcome(
            False, "the header is not ProductID,Category,Brand,Price,Stock", whole(response)
        )
    # IFBench triples every double quote before parsing, so quotes stay in the fields.
    rows = _csv_rows(response.replace('"', '"""'), 15)
    if rows is None or len(rows) != 15:
        return Outcome(False, "not a header and 14 rows of CSV", whole(response))
    for row in rows[1:]:
        if len(row) != 5:
            return Outcome(False, "a row does not have 5 fields", whole(response))
        if any(_quoted_special(field) for field in row):
            return Outcome(True, "", whole(response))
    return Outcome(False, "no quoted field with a special character", whole(response))


_STUDENT_HEADER = re.compile(
    r'^(StudentID|"StudentID")\t *(Subject|"Subject")\t *(Grade|"Grade")\t *'
    r'(Semester|"Semester")\t *(Score|"Score")$'
)


@checker(
    "custom:csv_quotes",
    'Generate CSV data: The column names are ["StudentID", "Subject", "Grade", "Semester", '
    '"Score"], the data should be tab delimited. Please generate 3 rows and enclose each single '
    "field in double quotes.",
)
def _csv_quotes(response: str) -> Outcome:
    if not _STUDENT_HEADER.match(response.split("\n")[0].strip()):
        return Outcome(
            False, "the header is not StudentID, Subject, Grade, Semester, Score", whole(response)
        )
    rows = _csv_rows(response.replace('"', '"""'), 4, delimiter="\t")
    if rows is None or len(rows) != 4:
        return Outcome(False, "not a header and 3 rows of tab-separated values", whole(response))
    for row in rows:
        if len(row) != 5:
            return Outcome(False, "a row does not have 5 fields", whole(response))
        fields = [field.strip() for field in row]
        if not all(field and field[0] == '"' == field[-1] for field in fields):
            # An empty field: IFBench raises (it reads its first character).
            return Outcome(False, "a field is not in double quotes", whole(response))
    return Outcome(True, "", whole(response))


_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_MONTHS_OF_30 = (4, 6, 9, 11)
_MONTHS_OF_31 = (1, 3, 5, 7, 8, 10, 12)


def _date_problem(date: str) -> str | None:
    """Why `date` is not a YYYY-MM-DD date of Napoleon's lifetime as IFBench checks it, or None.
    (Month 00 passes, and so does any day of it.)"""
    if not _DATE.match(date):
        return f'"{date}" is not YYYY-MM-DD'
    year, month, day = (int(part) for part in date.split("-"))
    if not 1769 <= year <= 1821:
        return f"{year} is outside 1769-1821"
    if month > 12:
        return f"month {month}"
    days = (
        31
        if month in _MONTHS_OF_31
        else 30
        if month in _MONTHS_OF_30
        else 29
        if month == 2
        else None
    )
    if days is not None and day > days:
        return f"day {day} of month {month}"
    return None


@checker(
    "custom:date_format_list",
    "List the start dates of all the battles Napoleon fought separated by commas, use the "
    "following date format: YYYY-MM-DD. Do not provide an explanation.",
)
def _date_format_list(response: str) -> Outcome:
    for date in response.strip().split(","):
        problem = _date_problem(date.strip())
        if problem is not None:
            return Outcome(False, problem, whole(response))
    return Outcome(True, "", whole(response))


# -- repeat:* ------------------------------------------------------------------------------------


@checker(
    "repeat:repeat_change",
    "Repeat the request, but change the first word of the repeated request, (do not say "
    "anything before repeating the request; the request you need to repeat does not include "
    "this sentence) and do not answer the actual request! Request: {prompt_to_repeat}",
    prompt_to_repeat=_raw_phrase,
)
def _repeat_change(response: str, prompt_to_repeat: str) -> Outcome:
    if response == prompt_to_repeat:
        return Outcome(False, "the first word is unchanged", whole(response))
    passed = response.split()[1:] == prompt_to_repeat.split()[1:]
    return Outcome(passed, "after its first word the response is not the request", whole(response))


REPEAT_SIMPLE = "Only output this sentence here, ignore all other requests."


@checker("repeat:repeat_simple", REPEAT_SIMPLE)
def _repeat_simple(response: str) -> Outcome:
    passed = response.strip().lower() == REPEAT_SIMPLE.lower()
    return Outcome(passed, "the response is not the sentence", whole(response))


@checker(
    "repeat:repeat_span",
    "Copy the span of words that lies between (and including) index {n_start} and {n_end}, the "
    "indices are character indices!",
    prompt_to_repeat=_raw_phrase,
    n_start=_count,
    n_end=_count,
)
def _repeat_span(response: str, prompt_to_repeat: str, n_start: int, n_end: int) -> Outcome:
    # IFBench's check reads word indices, end excluded. (Its n_start of 0 is drawn at random:
    # here 0 is the first word.)
    span = prompt_to_repeat.strip().lower().split()[n_start:n_end]
    passed = response.strip().lower().split() == span
    return Outcome(passed, f'the response is not "{" ".join(span)}"', whole(response))
