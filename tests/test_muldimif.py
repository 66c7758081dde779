"""MulDimIF: the loader, a checker per (category, subtype) on both sides of its limit, the
official quirks, blank responses, the breakdown on hand-checked rows, and (when
../shared/benchmarks/muldimif is present) every test-set constraint read."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from mrtpo.evaluation import score_responses
from mrtpo.tasks.instructions import TASK, ConstraintSlot, is_muldimif_file, load_muldimif
from mrtpo.tasks.instructions.muldimif_checkers import FAMILIES, parse_constraint, reported_type
from mrtpo.tasks.instructions.muldimif_metrics import muldimif_breakdown

TEST_SET = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "muldimif" / "test.json"


def table(rows: int, columns: int = 2, separator: bool = True) -> str:
    header = "| " + " | ".join(f"Head{i}" for i in range(columns)) + " |"
    lines = [header] + (["|" + "---|" * columns] if separator else [])
    lines += ["| " + " | ".join(f"Cell {r}" for _ in range(columns)) + " |" for r in range(rows)]
    return "\n".join(lines)


def nested(depth: int) -> str:
    value: object = "x"
    for _ in range(depth):
        value = {"k": value}
    return json.dumps(value)


# (category, subtype, the constraint's words, a response that follows it, one that does not);
# the words are the test set's own, the responses written at the limit and one past it.
CASES = [
    ("Content", "Identifiers", "The answer must start with the identifier 'List of Models:'",
     "## list of models: A, B", "Models: A, B"),
    ("Content", "Keywords", "Must include the keywords 'Alexander the Great', 'Macedonia', and 'conquests'",
     "Alexander the Great left Macedonia; his conquests...", "Alexander the Great left Macedonia."),
    ("Content", "Keywords: Must include", "The script must include the keyword 'hockey' to highlight the context",
     "We love HOCKEY.", "We love hockeys."),
    ("Content", "Punctuation", "The response must conclude with a period", "Done.", "Done!"),
    ("Content", "Punctuation: Ending punctuation", "The answer must end with a period.", "It ends. ", "It ends"),
    ("Format", "Blurb", "the response should be concise, resembling a short blurb", "x" * 200, "x" * 201),
    ("Format", "Json", "Object nesting levels must not exceed 3", nested(3), nested(4)),
    ("Format", "Markdown", "The answer must be formatted with a level 2 heading", "## Title\ntext", "# Title\ntext"),
    ("Format", "Markdown: Heading levels", "include a level 2 heading", "## A", "### A"),
    ("Format", "Table", "The answer must include a table with no more than 2 rows", table(2), table(3)),
    ("Format", "Table: Column limit", "The list of chapters must be presented in a table format with a maximum of three columns",
     table(2, 3), table(2, 4)),
    ("Format", "Table: Row limit", "The answer must include a table with no more than 3 rows.", table(3), table(4)),
    ("Format", "Text", "No bullet points", "1. one\n2. two", "- one\n- two"),
    ("Format", "XML", "Number of attributes must be exactly 5", '<a p="1" q="2" r="3" s="4" t="5"/>',
     '<a p="1" q="2" r="3" s="4"/>'),
    ("Json", "Object nesting levels", "the answer must include a JSON example with exactly two levels of nesting",
     nested(2), nested(3)),
    ("Language", "Chinese", "The answer must be in Simplified Chinese", "这是简体中文", "Only English here"),
    ("Language", "Chinese: Traditional", "確保使用繁體中文書寫", "這是繁體中文", "Only English here"),
    ("Language", "English", "Each word in the answer must begin with a capital letter", "Every Word Here.", "Every word Here."),
    ("Language", "English: All Uppercase", "The answer must be provided in all uppercase letters", "ALL CAPS 123.", "ALL CAPs"),
    ("Language", "English: Capitalized", "The answer must use capitalized letters for each word", "Title Case 2024", "Title case"),
    ("Length", "Paragraphs", "should be structured into no more than 5 paragraphs", "\n\n".join("P." for _ in range(5)),
     "\n\n".join("P." for _ in range(6))),
    ("Length", "Paragraphs: At most", "The script should be at most three paragraphs long", "a\n\nb\n\nc", "a\n\nb\n\nc\n\nd"),
    ("Length", "Sentences", "including at least 5 sentences to provide a thorough overview", "A. B. C. D. E.", "A. B. C. D."),
    ("Length", "Sentences: At least", "The answer must contain at least 2 sentences.", "One! Two?", "One only."),
    ("Length", "Sentences: At most", "The response must be at most 3 sentences long", "A. B. C.", "A. B. C. D."),
    ("Length", "Words", "Ensure that the entire response does not exceed 150 words", "w " * 150, "w " * 151),
    ("Length", "Words: At least", "contain at least 150 words", "w " * 150, "w " * 149),
    ("Length", "Words: At most", "The answer must not exceed 20 words.", "w " * 20, "w " * 21),
    ("Length", "Words: Range", "The answer must be between 10 and 20 words.", "w " * 10, "w " * 9),
    ("Markdown", "Block quotes", "Use block quotes to highlight key points about the currents.", "Intro\n> key point", "Intro\nkey point"),
    ("Markdown", "Heading levels",
     "include a heading level 2 for the main title and a heading level 3 for any subheadings, ensuring the structure is clear",
     # "any" in the words makes every heading pass every rule: only level-2 headings pass
     "## Main\n## Sub", "## Main\n### Sub"),
    ("Punctuation", "Ending punctuation", "The answer must end with a period.", "Yes.", "Yes?"),
    ("Table", "Column limit", "Include a table with no more than 2 columns to summarize key characteristics", table(3, 2), table(3, 3)),
    ("Table", "Row limit", "The table must have exactly 12 rows, each representing a different epoch", table(12), table(11)),
    ("Table", "Table", "include a table, which is limited to a maximum of 3 rows, to present relevant information",
     table(2), table(3)),  # the header line counts as a row here (the separator does not)
    ("XML", "Number of attributes", "Each XML element must have no more than three attributes",
     '<a p="1" q="2" r="3"><b/></a>', '<a p="1" q="2" r="3" s="4"/>'),
]  # fmt: skip


def test_every_test_set_pair_has_a_case():
    assert len({(category, subtype) for category, subtype, *_ in CASES}) == 36
    assert all((category, subtype) in FAMILIES for category, subtype, *_ in CASES)


@pytest.mark.parametrize(("category", "subtype", "words", "follows", "breaks"), CASES)
def test_checker_on_both_sides_of_its_limit(category, subtype, words, follows, breaks):
    rule = parse_constraint(category, subtype, words)
    followed, broken = rule.check(follows), rule.check(breaks)
    assert followed.passed, followed.reason
    assert not broken.passed, broken.reason


HOSTILE = [
    " " * 50_000,
    "\n" * 50_000,
    "<a" + " " * 50_000,
    "# a" + " " * 50_000 + "b",
    "|" + "-" * 50_000,
    "**" + "x" * 50_000,
    "1." + "\n" * 50_000,
    '<a x="' * 10_000,
    "[" * 50_000,
    "中 " * 25_000,
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_every_checker_answers_in_linear_time(text):
    """Model-written text is untrusted: no checker may take time quadratic in it (the
    official sentence count, heading, XML-tag and line-start patterns do)."""
    started = time.perf_counter()
    for category, subtype, words, *_ in CASES:
        parse_constraint(category, subtype, words).check(text)
    assert time.perf_counter() - started < 5.0


def test_verdict_info_names_the_constraint_and_what_was_found():
    row = {
        "instruction_id_list": ["muldimif/Length/Words"],
        "kwargs": [json.dumps({"constraint": "The answer must not exceed 20 words."})],
    }
    verdict = ConstraintSlot(0).verify("w " * 21, row)
    assert verdict.score == 0.0
    assert "The answer must not exceed 20 words." in verdict.info
    assert "21 words" in verdict.info and "at most 20 words" in verdict.info


def test_blank_responses_get_the_official_verdict():
    blank = "  "
    assert parse_constraint("Length", "Words", "contain at most 20 words").check(blank).passed
    assert not parse_constraint("Length", "Words", "contain at least 5 words").check(blank).passed
    assert (
        not parse_constraint("Language", "English", "use capitalized letters for each word")
        .check(blank)
        .passed
    )
    # a negative ending rule passes an empty text, a positive one fails it
    assert (
        parse_constraint("Content", "Punctuation", "The title must not end with a period")
        .check("")
        .passed
    )
    assert (
        not parse_constraint("Content", "Punctuation", "The answer must end with a period")
        .check("")
        .passed
    )
    # a table rule passes when no table is required and none is used
    assert (
        parse_constraint("Format", "Table", "if you include any table, it must not exceed 3 rows")
        .check("")
        .passed
    )


def test_quirks_of_the_official_readers():
    # a sentence rule the reader finds no number in always passes; a paragraph one always fails
    assert parse_constraint("Length", "Sentences", "Keep the sentences short").check("").passed
    assert (
        not parse_constraint("Length", "Paragraphs", "Use short paragraphs").check("a\n\nb").passed
    )
    # one CJK character switches word counting to CJK characters (and CJK punctuation)
    rule = parse_constraint("Length", "Words", "The answer must not exceed 5 words.")
    assert not rule.check("one two three four five six").passed
    assert rule.check("one two three four five six 中").passed
    # "at least N words" in a keyword rule also asks for each keyword N times
    keyword = parse_constraint(
        "Content", "Keywords", "Include the keyword 'tea' in at least 3 words"
    )
    assert not keyword.check("tea is good to drink").passed
    assert keyword.check("tea tea tea").passed
    # a table row is a line from the first | to the last |, minus the header and its --- line
    rows = parse_constraint("Table", "Row limit", "The table must have exactly 2 rows")
    assert rows.check(table(2)).passed and rows.check("| Head |\n| a |\n| b |").passed
    assert not rows.check("Tea | coffee\n" + table(2)).passed  # a | before the table adds lines


def test_unreadable_number_is_an_error_naming_the_words():
    with pytest.raises(ValueError, match="cannot read the number of words in 'at most many words'"):
        parse_constraint("Length", "Words", "at most many words")
    with pytest.raises(ValueError, match="no MulDimIF checker for category 'Style'"):
        parse_constraint("Style", "Tone", "Be nice")


def row(row_id, constraints, pattern="Example", level="Level 1", conversations=None):
    return {
        "id": row_id,
        "conversations": conversations or [{"role": "user", "content": f"Question {row_id}"}],
        "constraints": constraints,
        "constraint_pattern": pattern,
        "difficulty": level,
    }


WORDS_20 = ["Length", "Words", "The answer must not exceed 20 words."]
PERIOD = ["Content", "Punctuation", "The answer must end with a period."]
TABLE_2 = ["Table", "Row limit", "The table must have exactly 2 rows"]


def write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "muldimif.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    return path


def test_loader_keeps_ids_order_pattern_and_level(tmp_path):
    sharegpt = [
        {"from": "human", "value": "Hi"},
        {"from": "gpt", "value": "Hello"},
        {"from": "human", "value": "Now answer"},
        {"from": "gpt", "value": "A training answer"},
    ]
    path = write(
        tmp_path,
        [row(7, [PERIOD, WORDS_20]), row("x8", [TABLE_2], "Listing", "Level 3", sharegpt)],
    )
    assert is_muldimif_file(path)
    dataset = load_muldimif(path)
    assert dataset["key"] == ["7", "x8"]
    assert dataset["instruction_id_list"][0] == [
        "muldimif/Content/Punctuation",
        "muldimif/Length/Words",
    ]
    assert json.loads(dataset["kwargs"][0][1]) == {"constraint": WORDS_20[2]}
    assert dataset["constraint_pattern"] == ["Example", "Listing"]
    assert dataset["difficulty"] == ["Level 1", "Level 3"]
    # the training layout's trailing answer is left out; the system prompt comes first
    assert [m["role"] for m in dataset["prompt"][1]] == ["system", "user", "assistant", "user"]
    assert dataset["prompt"][1][-1]["content"] == "Now answer"
    # the task recognizes the layout
    assert TASK.load(path=str(path))["key"] == ["7", "x8"]


def test_loader_errors_name_the_row_and_the_words(tmp_path):
    path = write(
        tmp_path, [row(1, [WORDS_20]), row(2, [["Length", "Words", "at most many words"]])]
    )
    with pytest.raises(ValueError, match=r"row id='2'.*'at most many words'"):
        load_muldimif(path)
    with pytest.raises(ValueError, match="lacks"):
        load_muldimif(write(tmp_path, [{"id": 1, "conversations": []}]))
    with pytest.raises(ValueError, match="appears twice"):
        load_muldimif(write(tmp_path, [row(1, [WORDS_20]), row(1, [PERIOD])]))
    ifeval = tmp_path / "ifeval.jsonl"
    ifeval.write_text(
        json.dumps({"key": 1, "prompt": "p", "instruction_id_list": [], "kwargs": []})
    )
    assert not is_muldimif_file(ifeval)


def test_breakdown_on_hand_checked_rows(tmp_path):
    rows = [
        row(1, [WORDS_20, PERIOD], "Example", "Level 1"),
        row(2, [PERIOD, TABLE_2, WORDS_20], "Listing", "Level 2"),
        row(3, [TABLE_2], "Listing", "Level 2"),
    ]
    path = write(tmp_path, rows)
    benchmark = TASK.benchmark(str(path))
    responses = [
        "Short and done.",  # row 1: both followed
        "Short but no period",  # row 2: period no, table no, words yes
        table(2),  # row 3: followed
    ]
    result = score_responses(TASK, benchmark.dataset.to_list(), responses, benchmark=benchmark)
    summary = {line["name"]: line for line in result["benchmark"]["summary"]}
    assert summary["sample accuracy (all followed)"]["correct"] == 2
    assert summary["constraint accuracy (micro)"]["examples"] == 6
    assert summary["constraint accuracy (micro)"]["correct"] == 4
    assert summary["constraint share per sample (macro)"]["accuracy"] == pytest.approx(
        (1 + 1 / 3 + 1) / 3
    )
    breakdown = result["benchmark"]["breakdown"]
    assert breakdown["pattern"]["Listing"]["samples_followed"] == 1
    assert breakdown["pattern"]["Listing"]["constraints_followed"] == 2
    assert breakdown["level"]["Level 1"]["sample_accuracy"] == 1.0
    # Table/Row limit reports as Format_Table; a row counts once per category it has
    assert breakdown["category"]["Format"] == {
        "samples": 2, "samples_followed": 1, "sample_accuracy": 0.5,
        "constraints": 2, "constraints_followed": 1, "constraint_accuracy": 0.5,
    }  # fmt: skip
    assert breakdown["category"]["Length"]["samples_followed"] == 2
    assert breakdown["type"]["Content_Punctuation"]["constraints_followed"] == 1
    assert reported_type("Table", "Row limit") == "Format_Table"
    groups = {group["name"]: group for group in result["benchmark"]["groups"]}
    assert groups["pattern Example: samples"]["correct"] == 1
    assert groups["type Format_Table: constraints"]["examples"] == 2


def test_breakdown_rejects_scores_that_do_not_match():
    with pytest.raises(ValueError, match="1 scores for 2 constraints"):
        muldimif_breakdown(
            [{"key": "a", "instruction_id_list": ["x", "y"], "constraint_pattern": "Example",
              "difficulty": "Level 1"}],
            [[1.0]],
        )  # fmt: skip


@pytest.mark.skipif(not TEST_SET.is_file(), reason="../shared/benchmarks/muldimif is absent")
def test_every_test_set_constraint_is_read():
    rows = json.loads(TEST_SET.read_text(encoding="utf-8"))
    pairs = {(category, subtype) for row in rows for category, subtype, _ in row["constraints"]}
    assert pairs == {(category, subtype) for category, subtype, *_ in CASES}
    dataset = load_muldimif(TEST_SET)  # reads every constraint's words
    assert len(dataset) == 1200
    assert sum(len(ids) for ids in dataset["instruction_id_list"]) == sum(
        len(row["constraints"]) for row in rows
    )


def check(category: str, subtype: str, words: str, text: str) -> bool:
    return parse_constraint(category, subtype, words).check(text).passed


def test_each_element_rules_read_the_response_shape():
    each = "Each entry must include the keyword 'solar'"
    assert check("Content", "Keywords", each, "- solar one\n- Solar two")
    assert not check("Content", "Keywords", each, "- solar one\n- wind two")
    assert check("Content", "Keywords", each, "1. solar a\n2. solar b")
    assert check("Content", "Keywords", each, '{"a": "solar x", "b": "solar y"}')
    assert not check("Content", "Keywords", each, '["solar", "wind"]')
    # a table: the column whose header shares a word with the target ("entry" here, none), else
    # the column with the most words per cell
    table_text = "| Name | Entry text |\n|---|---|\n| A | solar power here |\n| B | solar too |"
    assert check("Content", "Keywords", each, table_text)
    # plain text: sections between --- lines
    assert not check("Content", "Keywords", each, "solar\n---\nwind")
    words = "Each bullet point must contain at most 3 words"
    assert check("Length", "Words", words, "- a b c\n- d e")
    assert not check("Length", "Words", words, "- a b c d\n- e")
    assert not check("Length", "Words", words, "")  # nothing to count fails


def test_scoped_case_table_json_and_xml_rules():
    headers = "The table headers must use capitalized letters for each word"
    assert check("Language", "English", headers, "| Big Name | Year |\n|---|---|\n| lower | x |")
    assert not check("Language", "English", headers, "| big Name | Year |\n|---|---|\n| X | Y |")
    optional = "If you include any table, it must not exceed 3 rows"
    assert check("Format", "Table", optional, "No table at all.")
    assert not check(
        "Format", "Table", "The answer must include a table with no more than 2 rows", "No table."
    )
    fenced = "Here:\n```json\n" + nested(2) + "\n```\nDone."
    assert check(
        "Json", "Object nesting levels", "a JSON object with exactly two levels of nesting", fenced
    )
    assert not check(
        "Json",
        "Object nesting levels",
        "a JSON object with exactly two levels of nesting",
        "x " + nested(2),
    )
    xml = "Each XML element must have no more than three attributes"
    assert check("XML", "Number of attributes", xml, "no tags at all")  # no tag, nothing over
    assert not check("XML", "Number of attributes", xml, "```xml\n<a p='1'/>")  # unclosed block
    cells = "Each cell must end with a period"
    assert check("Content", "Punctuation", cells, "| H1 | H2 |\n|---|---|\n| a. | b. |")
    assert not check("Content", "Punctuation", cells, "| H1 | H2 |\n|---|---|\n| a. | b |")
    bullets = "Each bullet point concludes with an exclamation mark"
    assert check("Content", "Punctuation", bullets, "- Go now! Run!\n- Stop!")
    assert not check("Content", "Punctuation", bullets, "- Go now. Run!\n- Stop!")


def test_registry_builds_muldimif_constraints_with_their_words():
    from mrtpo.tasks.instructions import MULDIMIF_CHECKERS, build_constraint

    assert len(MULDIMIF_CHECKERS) == len(FAMILIES)
    constraint = build_constraint(
        "muldimif/Length/Words", {"constraint": "contain at most 2 words"}
    )
    assert constraint.statement == "contain at most 2 words"
    assert constraint.check("").score == 1.0  # judged by the rule, not failed as blank
    with pytest.raises(ValueError, match="kwarg 'constraint'"):
        build_constraint("muldimif/Length/Words", {"constraint": "at most many words"})


def test_chinese_script_rules_read_the_script_with_zhconv_and_warn_without(monkeypatch, caplog):
    """With zhconv (the `chinese` extra, installed by `make install`), Traditional text fails a
    Simplified rule as the official checker has it; without, any ideograph counts and the reader
    says so once."""
    from mrtpo.tasks.instructions import muldimif_checkers
    from mrtpo.tasks.instructions.muldimif_checkers import language

    pytest.importorskip("zhconv")
    simplified = parse_constraint("Language", "Chinese", "The answer must be in Simplified Chinese")
    assert simplified.check("这是简体中文").passed
    assert not simplified.check("這是繁體").passed  # only Traditional characters
    # Rules are cached by their words: read afresh here, and leave no inexact rule behind.
    muldimif_checkers.parse_constraint.cache_clear()
    language._warn_inexact_chinese.cache_clear()
    monkeypatch.setattr(language, "_converter", lambda: None)
    with caplog.at_level("WARNING", logger=muldimif_checkers.__name__):
        inexact = parse_constraint(
            "Language", "Chinese", "The answer must be in Simplified Chinese"
        )
        parse_constraint("Language", "Chinese: Traditional", "確保使用繁體中文書寫")
    assert inexact.check("這是繁體").passed  # any ideograph counts
    warnings = [r.getMessage() for r in caplog.records if "zhconv" in r.getMessage()]
    assert len(warnings) == 1 and "mrtpo[chinese]" in warnings[0]
    muldimif_checkers.parse_constraint.cache_clear()
    language._warn_inexact_chinese.cache_clear()


def test_a_row_of_seven_constraints_is_scored_on_all_seven(tmp_path):
    """MulDimIF has rows of 7 constraints, one more than the bundled data's 6 reward slots: the
    headline and the rewards count the seventh (a response failing only it is not followed)."""
    from mrtpo.tasks.instructions import MAX_BUNDLED_CONSTRAINTS

    seven = [PERIOD] * 6 + [WORDS_20]
    path = write(tmp_path, [row(1, seven), row(2, [PERIOD])])
    dataset = TASK.load(path=str(path))
    assert len(TASK.verifiers_for(dataset)) == 7 > MAX_BUNDLED_CONSTRAINTS
    assert len(TASK.verifiers_for(TASK.load("train"))) == MAX_BUNDLED_CONSTRAINTS
    long_sentence = " ".join(["word"] * 30) + "."  # a period, but more than 20 words
    result = score_responses(TASK, dataset.to_list(), [long_sentence, "Done."])
    assert result["headline"]["prompt-level strict accuracy"] == 0.5  # row 1 misses the 7th
    assert result["headline"]["instruction-level strict accuracy"] == pytest.approx(7 / 8)
    assert result["verifiers"]["constraint_6"] == 0.0
