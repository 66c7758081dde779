"""IFEval's instruction checkers: hand-written responses with their expected verdicts and spans,
IFEval's edge cases, and property tests (any text gives a verdict in range, never an error)."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrtpo.tasks.instructions import CHECKERS, build_constraint, checkers, registry, text
from mrtpo.tasks.instructions.text import sentence_tokenizer

IFEVAL_IDS = {
    "keywords:existence", "keywords:frequency", "keywords:forbidden_words",
    "keywords:letter_frequency", "language:response_language",
    "length_constraints:number_sentences", "length_constraints:number_paragraphs",
    "length_constraints:number_words", "length_constraints:nth_paragraph_first_word",
    "detectable_content:number_placeholders", "detectable_content:postscript",
    "detectable_format:number_bullet_lists", "detectable_format:constrained_response",
    "detectable_format:number_highlighted_sections", "detectable_format:multiple_sections",
    "detectable_format:json_format", "detectable_format:title", "combination:two_responses",
    "combination:repeat_prompt", "startend:end_checker", "change_case:capital_word_frequency",
    "change_case:english_capital", "change_case:english_lowercase", "punctuation:no_comma",
    "startend:quotation",
}  # fmt: skip

KEYWORDS = {"keywords": ["river", "Lantern"]}
HOME_AT_LEAST_2 = {"keyword": "home", "frequency": 2, "relation": "at least"}
HOME_LESS_THAN_2 = {"keyword": "home", "frequency": 2, "relation": "less than"}
FORBIDDEN = {"forbidden_words": ["very", "nice"]}
Z_LESS_THAN_2 = {"letter": "z", "let_frequency": 2, "let_relation": "less than"}
A_AT_LEAST_3 = {"letter": "a", "let_frequency": 3, "let_relation": "at least"}
SENTENCES_LESS_THAN_3 = {"num_sentences": 3, "relation": "less than"}
SENTENCES_AT_LEAST_3 = {"num_sentences": 3, "relation": "at least"}
WORDS_LESS_THAN_5 = {"num_words": 5, "relation": "less than"}
WORDS_AT_LEAST_5 = {"num_words": 5, "relation": "at least"}
SECOND_STARTS_TODAY = {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "today"}
SECTIONS = {"section_spliter": "Section", "num_sections": 2}
CAPITALS_AT_LEAST_2 = {"capital_frequency": 2, "capital_relation": "at least"}
CAPITALS_LESS_THAN_2 = {"capital_frequency": 2, "capital_relation": "less than"}
END = {"end_phrase": "Any other questions?"}

# (instruction id, kwargs, response, expected score, expected spans or None)
CASES = [
    ("keywords:existence", KEYWORDS, "A lantern by the River.", 1.0, ((2, 9), (17, 22))),
    ("keywords:existence", KEYWORDS, "A lamp by the river.", 0.0, None),
    ("keywords:frequency", HOME_AT_LEAST_2, "Home is where the home is.", 1.0, ((0, 4), (18, 22))),
    ("keywords:frequency", HOME_AT_LEAST_2, "Home sweet house.", 0.0, None),
    ("keywords:frequency", HOME_LESS_THAN_2, "Home sweet house.", 1.0, ((0, 4),)),
    ("keywords:frequency", HOME_LESS_THAN_2, "home, home", 0.0, None),
    ("keywords:forbidden_words", FORBIDDEN, "Everything was lovely.", 1.0, ((0, 22),)),
    ("keywords:forbidden_words", FORBIDDEN, "It went nicely.", 1.0, None),  # \b: "nicely" is fine
    ("keywords:forbidden_words", FORBIDDEN, "It was Very good.", 0.0, ((7, 11),)),
    ("keywords:letter_frequency", Z_LESS_THAN_2, "Zoo", 1.0, ((0, 1),)),
    ("keywords:letter_frequency", Z_LESS_THAN_2, "Jazz", 0.0, ((2, 3), (3, 4))),
    ("keywords:letter_frequency", A_AT_LEAST_3, "A banana", 1.0, None),
    ("keywords:letter_frequency", A_AT_LEAST_3, "A cat", 0.0, None),
    (
        "language:response_language",
        {"language": "fr"},
        "Bonjour, je m'appelle Marie et j'habite à Paris depuis dix ans.",
        1.0,
        ((0, 63),),
    ),
    (
        "language:response_language",
        {"language": "fr"},
        "Hello, my name is Marie and I have lived in Paris for ten years.",
        0.0,
        None,
    ),
    ("language:response_language", {"language": "fr"}, "12345 678", 1.0, None),  # nothing to detect
    (
        "length_constraints:number_sentences",
        SENTENCES_LESS_THAN_3,
        "Dr. Smith arrived. He sat down.",
        1.0,
        None,
    ),
    (
        "length_constraints:number_sentences",
        SENTENCES_LESS_THAN_3,
        "I came. I saw. I left.",
        0.0,
        ((0, 22),),
    ),
    (
        "length_constraints:number_sentences",
        SENTENCES_AT_LEAST_3,
        "I came. I saw. I left.",
        1.0,
        None,
    ),
    ("length_constraints:number_sentences", SENTENCES_AT_LEAST_3, "I came. I saw.", 0.0, None),
    (
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 3},
        "First part.\n***\nSecond part.\n***\nThird part.",
        1.0,
        ((11, 16), (28, 33)),
    ),
    (
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 3},
        "***\nA\n***\nB\n***\nC",
        1.0,
        None,
    ),
    (
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 2},
        "One.\n***\n\n***\nTwo.",
        0.0,
        None,
    ),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}, "A\n\nB\n\nC", 0.0, None),
    ("length_constraints:number_words", WORDS_LESS_THAN_5, "Four words are here.", 1.0, ((0, 20),)),
    (
        "length_constraints:number_words",
        WORDS_LESS_THAN_5,
        "This has exactly five words.",
        0.0,
        None,
    ),
    (
        "length_constraints:number_words",
        WORDS_AT_LEAST_5,
        "This has exactly five words.",
        1.0,
        None,
    ),
    ("length_constraints:number_words", WORDS_AT_LEAST_5, "I don't know.", 0.0, None),  # 4: don, t
    (
        "length_constraints:nth_paragraph_first_word",
        SECOND_STARTS_TODAY,
        'Hello there.\n\n"Today, we rest."',
        1.0,
        ((12, 14), (14, 21)),
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        SECOND_STARTS_TODAY,
        "Hello there.\n\nTomorrow we rest.",
        0.0,
        None,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        SECOND_STARTS_TODAY,
        "Hi.\n\nToday.\n\nBye.",
        0.0,
        None,
    ),
    (
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        "Dear [name], see you at [place].",
        1.0,
        ((5, 11), (24, 31)),
    ),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name].", 0.0, None),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        "Thanks for reading.\n\nP.S. See you soon.",
        1.0,
        ((21, 39),),
    ),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        "Thanks. PS see you.",
        0.0,
        None,
    ),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.P.S"},
        "Bye.\nP.P.S. One more thing",
        1.0,
        None,
    ),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.P.S"},
        "Bye.\np. p. s call me",
        1.0,
        None,
    ),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.P.S"},
        "Bye.\nP.S. call me",
        0.0,
        None,
    ),
    (
        "detectable_format:number_bullet_lists",
        {"num_bullets": 2},
        "Items:\n* apples\n- pears",
        1.0,
        ((7, 15), (16, 23)),
    ),
    (
        "detectable_format:number_bullet_lists",
        {"num_bullets": 2},
        "**Fruit**\n* one\n* two",
        1.0,
        None,
    ),
    (
        "detectable_format:number_bullet_lists",
        {"num_bullets": 2},
        "* one\n* two\n* three",
        0.0,
        None,
    ),
    ("detectable_format:constrained_response", {}, "My answer is yes.", 1.0, ((0, 17),)),
    (
        "detectable_format:constrained_response",
        {},
        "Well. My answer is maybe. It depends.",
        1.0,
        ((6, 25),),
    ),
    ("detectable_format:constrained_response", {}, "Yes, I think so.", 0.0, None),
    (
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
        "*one* and **two**",
        1.0,
        ((0, 5), (10, 17)),
    ),
    (
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
        "*one* and ** **",
        0.0,
        None,
    ),
    (
        "detectable_format:multiple_sections",
        SECTIONS,
        "Section 1\nIntro.\nSection 2\nBody.",
        1.0,
        ((0, 10), (16, 27)),
    ),
    (
        "detectable_format:multiple_sections",
        SECTIONS,
        "SECTION 1\nIntro.\nSECTION 2\nBody.",
        0.0,
        None,
    ),
    ("detectable_format:json_format", {}, '```json\n{"a": [1, 2]}\n```', 1.0, ((0, 25),)),
    ("detectable_format:json_format", {}, '```JSON\n{"a": 1}\n```', 1.0, None),
    ("detectable_format:json_format", {}, "{'a': 1}", 0.0, None),
    ("detectable_format:json_format", {}, 'Here it is: {"a": 1}', 0.0, None),
    ("detectable_format:title", {}, "<<My Day>>\nIt was fine.", 1.0, ((0, 10),)),
    ("detectable_format:title", {}, "<<   >> It was fine.", 0.0, None),
    ("detectable_format:title", {}, "<My Day> It was fine.", 0.0, None),
    ("combination:two_responses", {}, "Answer one.\n******\nAnswer two.", 1.0, ((0, 30),)),
    ("combination:two_responses", {}, "Same.\n******\nSame.", 0.0, None),
    ("combination:two_responses", {}, "A\n******\n******\nB", 0.0, None),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a poem."},
        "write a poem. Roses.",
        1.0,
        ((0, 13),),
    ),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a poem."},
        "  Write a poem.\nok",
        1.0,
        ((2, 15),),
    ),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a poem."},
        "Sure! Write a poem.",
        0.0,
        None,
    ),
    ("startend:end_checker", END, "Here you go. Any other questions?", 1.0, ((13, 33),)),
    ("startend:end_checker", END, '"Done. any other questions?"\n', 1.0, ((7, 27),)),
    ("startend:end_checker", END, "Any other questions? Bye.", 0.0, None),
    (
        "change_case:capital_word_frequency",
        CAPITALS_AT_LEAST_2,
        "The USA and the UK agreed.",
        1.0,
        ((4, 7), (16, 18)),
    ),
    (
        "change_case:capital_word_frequency",
        CAPITALS_LESS_THAN_2,
        "The USA and the UK agreed.",
        0.0,
        None,
    ),
    ("change_case:capital_word_frequency", CAPITALS_AT_LEAST_2, "The USA agreed.", 0.0, None),
    (
        "change_case:english_capital",
        {},
        "THIS IS A SHORT NOTE ABOUT THE WEATHER TODAY.",
        1.0,
        ((0, 45),),
    ),
    ("change_case:english_capital", {}, "THIS IS A Short note.", 0.0, None),
    (
        "change_case:english_lowercase",
        {},
        "this is a short note about the weather today.",
        1.0,
        ((0, 45),),
    ),
    ("change_case:english_lowercase", {}, "This is a short note.", 0.0, None),
    (
        "change_case:english_lowercase",
        {},
        "ceci est une petite note sur le temps qu'il fait aujourd'hui.",
        0.0,
        None,
    ),
    ("punctuation:no_comma", {}, "No commas here.", 1.0, ((0, 15),)),
    ("punctuation:no_comma", {}, "One, two", 0.0, ((3, 4),)),
    ("startend:quotation", {}, '"Hello world."', 1.0, ((0, 1), (13, 14))),
    ("startend:quotation", {}, 'Hello "world"', 0.0, None),
    ("startend:quotation", {}, '"', 0.0, None),
]


def test_the_registry_has_exactly_ifevals_instruction_ids():
    assert set(CHECKERS) == IFEVAL_IDS


def test_every_instruction_id_has_a_passing_and_a_failing_case_with_spans():
    scores: dict[str, set[float]] = {}
    with_spans = set()
    for instruction_id, _, _, score, spans in CASES:
        scores.setdefault(instruction_id, set()).add(score)
        if spans is not None:
            with_spans.add(instruction_id)
    assert {i for i, s in scores.items() if s == {0.0, 1.0}} == IFEVAL_IDS
    assert with_spans == IFEVAL_IDS


@pytest.mark.parametrize(("instruction_id", "kwargs", "response", "score", "spans"), CASES)
def test_hand_written_responses(instruction_id, kwargs, response, score, spans):
    constraint = build_constraint(instruction_id, kwargs)
    verdict = constraint.check(response)
    assert verdict.score == score, verdict.info
    assert verdict.info.startswith(f"Constraint: {constraint.statement}\nVerdict: ")
    assert ("not satisfied" in verdict.info) == (score == 0.0)
    if spans is not None:
        assert verdict.spans == spans
    assert all(0 <= start <= end <= len(response) for start, end in verdict.spans)


def test_statements_show_the_arguments():
    assert build_constraint("length_constraints:number_words", WORDS_LESS_THAN_5).statement == (
        "Answer with less than 5 words."
    )
    assert build_constraint("keywords:existence", KEYWORDS).statement == (
        'Include the keywords "river", "Lantern" in the response.'
    )
    assert "French" in build_constraint("language:response_language", {"language": "fr"}).statement


def test_failure_info_gives_the_reason():
    verdict = build_constraint("length_constraints:number_words", WORDS_LESS_THAN_5).check(
        "one two three four five"
    )
    assert verdict.info == (
        "Constraint: Answer with less than 5 words.\nVerdict: not satisfied: the response has 5 words."
    )


@pytest.mark.parametrize("response", ["", "   \n\t"])
def test_strict_mode_an_empty_response_follows_nothing(response):
    for instruction_id in (
        "punctuation:no_comma",
        "keywords:forbidden_words",
        "language:response_language",
    ):
        kwargs = {
            "keywords:forbidden_words": FORBIDDEN,
            "language:response_language": {"language": "en"},
        }
        verdict = build_constraint(instruction_id, kwargs.get(instruction_id, {})).check(response)
        assert verdict.score == 0.0
        assert verdict.info.endswith("not satisfied: the response is empty.")


# -- IFEval's edge cases ---------------------------------------------------------------------


def test_relation_less_than_is_strict_and_at_least_is_inclusive():
    five_words = "one two three four five"
    for relation, expected in (("less than", 0.0), ("at least", 1.0)):
        kwargs = {"num_words": 5, "relation": relation}
        assert (
            build_constraint("length_constraints:number_words", kwargs).check(five_words).score
            == expected
        )
    for relation, expected in (("less than", 1.0), ("at least", 0.0)):
        kwargs = {"num_words": 6, "relation": relation}
        assert (
            build_constraint("length_constraints:number_words", kwargs).check(five_words).score
            == expected
        )


def test_keywords_match_case_insensitively_and_inside_words():
    existence = build_constraint("keywords:existence", {"keywords": ["HARBOR"]})
    assert existence.check("The harbor was calm.").score == 1.0
    assert existence.check("Harbors everywhere.").score == 1.0  # re.search: no word boundary
    frequency = build_constraint(
        "keywords:frequency", {"keyword": "Sea", "frequency": 3, "relation": "at least"}
    )
    assert frequency.check("SEA sea Sea").score == 1.0


def test_markdown_bullets_with_star_and_dash():
    bullets = build_constraint("detectable_format:number_bullet_lists", {"num_bullets": 4})
    response = (
        "Intro:\n* star one\n  *star two\n- dash one\n   -dash two\nAn inline * star and - dash."
    )
    verdict = bullets.check(response)
    assert verdict.score == 1.0
    assert [response[a:b] for a, b in verdict.spans] == [
        "* star one",
        "*star two",
        "- dash one",
        "-dash two",
    ]


def test_triple_star_paragraph_separators():
    paragraphs = build_constraint("length_constraints:number_paragraphs", {"num_paragraphs": 2})
    assert paragraphs.check("Alpha\n***\nBeta").score == 1.0
    assert paragraphs.check("Alpha *** Beta").score == 1.0  # spaces around *** are optional
    assert (
        paragraphs.check("Alpha\n***\nBeta\n***\n").score == 1.0
    )  # a trailing divider adds nothing
    assert paragraphs.check("Alpha\n\nBeta").score == 0.0  # blank lines do not separate here


def test_json_fenced_in_markdown():
    json_format = build_constraint("detectable_format:json_format", {})
    assert json_format.check('```json\n{"name": "x"}\n```').score == 1.0
    assert json_format.check('```Json\n["a"]\n```').score == 1.0
    assert json_format.check('```\n{"name": "x"}\n```').score == 1.0
    assert json_format.check('```python\n{"name": "x"}\n```').score == 0.0
    assert json_format.check("[" * 100_000).score == 0.0  # too deep for the parser: no crash


def test_titles_in_double_angular_brackets():
    title = build_constraint("detectable_format:title", {})
    verdict = title.check("Intro line\n<<The Quiet Harbor>>\nText")
    assert verdict.score == 1.0 and verdict.spans == ((11, 31),)
    assert title.check("<<\n>>").score == 0.0  # a title may not span lines


def test_postscript_markers():
    ps = build_constraint("detectable_content:postscript", {"postscript_marker": "P.S."})
    pps = build_constraint("detectable_content:postscript", {"postscript_marker": "P.P.S"})
    assert ps.check("Body. p.s. lower case counts").score == 1.0  # not only at a line start
    assert ps.check("Body.\nP. S. spaced").score == 1.0
    assert pps.check("Body.\nP.S. only").score == 0.0
    assert pps.check("Body.\nP.P.S. more").score == 1.0
    custom = build_constraint("detectable_content:postscript", {"postscript_marker": "PS:"})
    assert custom.check("Body.\nP.S. nope").score == 0.0
    assert custom.check("Body.\nps: yes").score == 1.0


def test_bold_counts_as_a_highlight_like_italic():
    highlights = build_constraint(
        "detectable_format:number_highlighted_sections", {"num_highlights": 1}
    )
    for response in ("a **bold** word", "an *italic* word"):
        assert highlights.check(response).score == 1.0
    three = build_constraint("detectable_format:number_highlighted_sections", {"num_highlights": 3})
    assert three.check("*one* and *two* and **three**").score == 1.0
    assert three.check("*one* and **two**").score == 0.0
    assert highlights.check("* not closed\n* still not").score == 0.0


# -- arguments ------------------------------------------------------------------------------


def test_bad_arguments_raise_value_errors_naming_them():
    with pytest.raises(ValueError, match="unknown instruction_id 'nope:nothing'"):
        build_constraint("nope:nothing", {})
    with pytest.raises(ValueError, match="missing kwarg 'relation'"):
        build_constraint("length_constraints:number_words", {"num_words": 5})
    with pytest.raises(ValueError, match="kwarg 'relation'"):
        build_constraint("length_constraints:number_words", {"num_words": 5, "relation": "at most"})
    with pytest.raises(ValueError, match="unexpected kwargs \\['extra'\\]"):
        build_constraint("punctuation:no_comma", {"extra": 1})
    with pytest.raises(ValueError, match="nth_paragraph must be in 1..num_paragraphs=2"):
        build_constraint(
            "length_constraints:nth_paragraph_first_word",
            {**SECOND_STARTS_TODAY, "nth_paragraph": 3},
        )
    with pytest.raises(ValueError, match="kwarg 'letter'"):
        build_constraint("keywords:letter_frequency", {**A_AT_LEAST_3, "letter": "ab"})


def test_null_kwargs_are_dropped_like_the_hugging_face_copy_needs():
    hf_layout = {"num_words": 5, "relation": "less than", "keywords": None, "language": None}
    assert build_constraint("length_constraints:number_words", hf_layout).args == WORDS_LESS_THAN_5


def test_a_keyword_that_is_not_a_valid_regex_is_matched_literally():
    existence = build_constraint("keywords:existence", {"keywords": ["c++("]})
    assert existence.check("I write c++( daily").score == 1.0
    assert existence.check("I write c daily").score == 0.0


def test_missing_punkt_data_says_to_run_make_install(tmp_path):
    with pytest.raises(FileNotFoundError, match="make install"):
        sentence_tokenizer(tmp_path)


# -- properties ------------------------------------------------------------------------------

ONE_KWARGS_PER_ID = {}
for _instruction_id, _kwargs, *_ in CASES:
    ONE_KWARGS_PER_ID.setdefault(_instruction_id, _kwargs)
CONSTRAINTS = [build_constraint(i, k) for i, k in sorted(ONE_KWARGS_PER_ID.items())]
PIECES = [
    *'*-#<>"\n\t P.S.psaAzZ,[]{}:0123456789`',
    "******",
    "***",
    "\n\n",
    "```json",
    "<<",
    ">>",
    "Section 1",
]
MARKDOWNISH = st.lists(st.sampled_from(PIECES), max_size=60).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CONSTRAINTS), st.one_of(st.text(max_size=200), MARKDOWNISH))
def test_any_text_gives_a_verdict_in_range(constraint, response):
    verdict = constraint.check(response)
    assert verdict.score in (0.0, 1.0)
    assert verdict.info.startswith("Constraint: ")
    assert all(0 <= start <= end <= len(response) for start, end in verdict.spans)


# -- linear-time scans give IFEval's regex answers ---------------------------------------------

SCAN_PIECES = [*"[]<>*-\n \tpPsS.:x", "\n\n", "<<", ">>", "**", "p.s.", "P.P.S", "  * ", "- "]
SCANNABLE = st.lists(st.sampled_from(SCAN_PIECES), max_size=80).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SCANNABLE)
def test_linear_scans_find_what_ifevals_regexes_find(response):
    assert checkers._bracketed(response) == [m.span() for m in re.finditer(r"\[.*?\]", response)]
    assert checkers._double_angled(response) == [
        m.span() for m in re.finditer(r"<<[^\n]+>>", response)
    ]
    for marker, pattern in (("*", r"^\s*\*[^\*].*$"), ("-", r"^\s*-.*$")):
        expected = [
            checkers._stripped_span(response, *m.span())
            for m in re.finditer(pattern, response, re.MULTILINE)
        ]
        assert checkers._line_items(response, marker) == expected
    lowered = response.lower()
    for marker, pattern in (
        ("P.S.", r"\s*p\.\s?s\..*$"),
        ("P.P.S", r"\s*p\.\s?p\.\s?s.*$"),
        ("Ps:", r"\s*ps:.*$"),
    ):
        expected = bool(re.search(pattern, lowered, re.MULTILINE))
        ps = build_constraint("detectable_content:postscript", {"postscript_marker": marker})
        assert (ps.check(response).score == 1.0) == (expected and bool(response.strip()))


TOKEN_PIECES = [*"[](){}<>*.,:;'\"`!? \n-", "a", "B", "wanna", "cannot", "don't", "...", "''"]
TOKENIZABLE = st.lists(st.sampled_from([*TOKEN_PIECES, "``", "Mr.", "x.", "1.5", "«", "”"]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TOKENIZABLE.map("".join))
def test_leading_word_tokens_are_the_first_word_tokens(monkeypatch_margin, response):
    # Tiny sentences and margins, so that the prefix cut is taken on short texts.
    assert text.leading_word_tokens(response, 3) == text.word_tokens(response)[:3]


@pytest.fixture(scope="module")
def monkeypatch_margin():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(text, "_SHORT_SENTENCE", 40)
        patch.setattr(text, "_CUT_MARGIN", 12)
        yield


def test_token_spans_place_rewritten_quotes_and_skip_far_tokens():
    response = 'He said "hi" ok'
    tokens = text.word_tokens(response)
    assert tokens == ["He", "said", "``", "hi", "''", "ok"]
    spans = text.token_spans(response, tokens)
    assert [response[a:b] for a, b in spans] == ["He", "said", '"', "hi", '"', "ok"]
    assert text.token_spans("a" + " " * 1000 + "b", ["a", "b"]) == [(0, 1), None]


def test_loose_variants_drop_the_first_and_last_lines_and_asterisks():
    assert registry.loose_variants("Sure:\n*x*\nBye") == [
        "Sure:\n*x*\nBye",
        "*x*\nBye",
        "Sure:\n*x*",
        "*x*",
        "Sure:\nx\nBye",
        "x\nBye",
        "Sure:\nx",
        "x",
    ]
    no_comma = build_constraint("punctuation:no_comma", {})
    assert no_comma.check("Well, here:\nNo commas here").score == 0.0
    assert no_comma.follows_loose("Well, here:\nNo commas here")  # without the first line
    assert no_comma.follows_loose("Sure\nNo commas\nBye, then")
    assert not no_comma.follows_loose("a, b\nc, d")
