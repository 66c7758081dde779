"""The localization benchmark's injected errors (`benchmarks/localization.py`): for each
bundled task, correct responses (the task's references; for instruction following, responses
built to satisfy every constraint of a row: `build_instruction_response`), the error kinds that
change one known character span, and `collect_injections`, which keeps an injected response
only when the task's own verifiers flip exactly the intended rewards.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mrtpo.credit.replay import reward_types
from mrtpo.explaining import verify_rows
from mrtpo.verifiers import Verdict

Span = tuple[int, int]
REPLAY_MODES = ("leave_one_out", "add_one")
SPAN_MARKER = "@@INJECTED@@"  # stands for a JSON value or key while its position is found


# ----------------------------------------------------------------------------- injections


@dataclass(frozen=True)
class Reference:
    """A correct response to a row: its text and named character spans (`anchors`) where the
    instruction-following injections act; `case` is the case the whole text was put in."""

    text: str
    anchors: Mapping[str, Span] = field(default_factory=dict)
    case: str = ""  # "", "upper" or "lower"


@dataclass(frozen=True)
class Candidate:
    """One injected error: the new text, the span of it that changed, the reward the error is
    about (`target`) and every reward whose verdict it must flip (`drops`, target first)."""

    text: str
    span: Span
    target: str
    drops: tuple[str, ...]


def replace_span(text: str, start: int, end: int, new: str) -> tuple[str, Span]:
    """`text` with `text[start:end]` replaced by `new`, and where `new` now sits."""
    if not 0 <= start <= end <= len(text):
        raise ValueError(f"span ({start}, {end}) is outside a text of {len(text)} characters")
    return text[:start] + new + text[end:], (start, start + len(new))


def _candidate(text: str, start: int, end: int, new: str, drops: Sequence[str]) -> Candidate:
    changed, span = replace_span(text, start, end, new)
    return Candidate(changed, span, drops[0], tuple(drops))


# --- SQL: the reference query wrapped in <answer> tags.

_STRING = re.compile(r"'(?:[^']|'')*'")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")
_COMPARATOR = re.compile(r">=|<=|!=|<>|=|>|<")
_COMPARATOR_SWAP = {">=": "<", "<=": ">", "!=": "=", "<>": "=", "=": "!=", ">": "<", "<": ">"}
_TABLE = re.compile(r"\b(?:FROM|JOIN)\s+([A-Za-z_]\w*)", re.IGNORECASE)
_ANSWER_CLOSE = "</answer>"


def _outside_strings(text: str, pattern: re.Pattern[str]) -> Iterator[re.Match[str]]:
    strings = [m.span() for m in _STRING.finditer(text)]
    for match in pattern.finditer(text):
        if not any(start <= match.start() < end for start, end in strings):
            yield match


def sql_wrong_value(row: Mapping[str, Any], reference: Reference) -> Iterator[Candidate]:
    """A wrong comparator (`!=` for `=`, `<` for `>`, ...), else a wrong number or string
    literal: the query still runs, its result is wrong."""
    text, drops = reference.text, ("sql_execution",)
    for match in _outside_strings(text, _COMPARATOR):
        yield _candidate(text, *match.span(), _COMPARATOR_SWAP[match.group()], drops)
    for match in _outside_strings(text, _NUMBER):
        wrong = str(float(match.group()) + 7).rstrip("0").rstrip(".")
        yield _candidate(text, *match.span(), wrong, drops)
    for match in _STRING.finditer(text):
        inner = match.group()[1:-1]
        yield _candidate(text, *match.span(), f"'{inner[::-1] if len(inner) > 1 else 'x'}z'", drops)


def sql_misspelled_name(row: Mapping[str, Any], reference: Reference) -> Iterator[Candidate]:
    """A table name with one letter dropped: the query no longer runs."""
    for match in _outside_strings(reference.text, _TABLE):
        name = match.group(1)
        if len(name) < 3:
            continue
        middle = len(name) // 2
        misspelled = name[:middle] + name[middle + 1 :]
        yield _candidate(
            reference.text, *match.span(1), misspelled, ("sql_executable", "sql_execution")
        )


def sql_broken_tag(row: Mapping[str, Any], reference: Reference) -> Iterator[Candidate]:
    """`</answer>` misspelled: the format fails, and with it the query cannot be read."""
    at = reference.text.rfind(_ANSWER_CLOSE)
    if at >= 0:
        drops = ("sql_format", "sql_executable", "sql_execution")
        yield _candidate(reference.text, at, at + len(_ANSWER_CLOSE), "</answr>", drops)


def sql_extra_tag(row: Mapping[str, Any], reference: Reference) -> Iterator[Candidate]:
    """A second, unmatched `</answer>`: the format fails, the query still runs and is right."""
    at = reference.text.rfind(_ANSWER_CLOSE)
    if at >= 0:
        end = at + len(_ANSWER_CLOSE)
        yield _candidate(reference.text, end, end, _ANSWER_CLOSE, ("sql_format",))


# --- tool calling: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks.

_CALL_OPEN, _CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"


def _first_call(text: str) -> tuple[Span, dict[str, Any]] | None:
    """Where the first block's JSON is, and the call object it holds."""
    start = text.find(_CALL_OPEN)
    end = text.find(_CALL_CLOSE, start + 1)
    if start < 0 or end < 0:
        return None
    start += len(_CALL_OPEN)
    call = json.loads(text[start:end])
    if not isinstance(call, dict) or not isinstance(call.get("arguments"), dict):
        return None
    return (start, end), call


def _call_candidate(
    text: str, where: Span, call: Mapping[str, Any], new: str, drops: Sequence[str]
) -> Candidate:
    """The reference with its first call re-serialized as the reference was (`json.dumps`)
    around one replaced piece: `call` holds `SPAN_MARKER` where the piece goes (a JSON string
    value or key), `new` is the piece's text."""
    dumped = json.dumps(call, ensure_ascii=False)
    marker = json.dumps(SPAN_MARKER)
    at = dumped.index(marker)
    prefix = text[: where[0]] + dumped[:at]
    changed = prefix + new + dumped[at + len(marker) :] + text[where[1] :]
    return Candidate(changed, (len(prefix), len(prefix) + len(new)), drops[0], tuple(drops))


def _other_value(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 7
    if isinstance(value, str):
        return "nowhere" if value.lower() != "nowhere" else "somewhere"
    return None


def _call_changes(
    reference: Reference, changes: Callable[[dict[str, Any]], Iterator[tuple[dict[str, Any], Any]]]
) -> Iterator[Candidate]:
    """Candidates from `changes(call)` of the reference's first call: each (the call with
    `SPAN_MARKER` where a piece goes, the piece's new value); the correctness reward fails."""
    found = _first_call(reference.text)
    if found is None:
        return
    where, call = found
    for changed, value in changes(call):
        new = json.dumps(value, ensure_ascii=False)
        yield _call_candidate(reference.text, where, changed, new, ("tool_correctness",))


def _value_changes(call: dict[str, Any]) -> Iterator[tuple[dict[str, Any], Any]]:
    for name, value in call["arguments"].items():
        wrong = _other_value(value)
        if wrong is not None:
            yield {**call, "arguments": {**call["arguments"], name: SPAN_MARKER}}, wrong


def _argument_name_changes(call: dict[str, Any]) -> Iterator[tuple[dict[str, Any], Any]]:
    for name in call["arguments"]:
        if len(name) >= 3:
            arguments = {
                (SPAN_MARKER if key == name else key): value
                for key, value in call["arguments"].items()
            }
            yield (
                {**call, "arguments": arguments},
                name[: len(name) // 2] + name[len(name) // 2 + 1 :],
            )


def tool_wrong_value(row: Mapping[str, Any], reference: Reference) -> Iterator[Candidate]:
    """An argument's value changed (a string, number or boolean): still a well-formed call."""
    return _call_changes(reference, _value_changes)


def tool_wrong_argument_name(row: Mapping[str, Any], reference: Reference) -> Iterator[Candidate]:
    """An argument's name with one letter dropped: a parameter the function does not have."""
    return _call_changes(reference, _argument_name_changes)


def tool_wrong_function(row: Mapping[str, Any], reference: Reference) -> Iterator[Candidate]:
    """Another offered function called (rows offering several): well formed, wrong call."""
    from mrtpo.tasks.tool_calling.task import offered_functions

    names = [function.get("name") for function in offered_functions(row)]

    def function_changes(call: dict[str, Any]) -> Iterator[tuple[dict[str, Any], Any]]:
        for name in names:
            if isinstance(name, str) and name != call.get("name"):
                yield {**call, "name": SPAN_MARKER}, name

    return _call_changes(reference, function_changes)


def tool_broken_json(row: Mapping[str, Any], reference: Reference) -> Iterator[Candidate]:
    """The colon after `"arguments"` replaced by `=`: the block is no longer JSON, so the
    format fails and no call can be read."""
    at = reference.text.find('"arguments": ')
    if at >= 0:
        colon = at + len('"arguments"')
        drops = ("tool_format", "tool_correctness")
        yield _candidate(reference.text, colon, colon + 1, "=", drops)


# --- instruction following: built responses (see `build_instruction_response`).

FILLER = (
    "The morning light moved slowly across the quiet garden.",
    "A small boat drifted near the old wooden pier.",
    "Our neighbors planted tomatoes along the back fence last spring.",
    "The library stays open late on most weekdays.",
    "Fresh bread from the corner shop smells wonderful at dawn.",
    "Children played a long game of tag in the park.",
    "The river runs clear after a week without rain.",
    "Many travelers stop here to rest before the long climb.",
    "The old clock in the hall still keeps good time.",
    "We walked along the shore and counted the passing ships.",
    "The market fills with color when the farmers arrive.",
    "A gentle wind carried the scent of pine through the valley.",
    "The kitchen was warm and full of laughter that evening.",
    "Most of the town gathers in the square for the summer fair.",
    "The path through the forest is easy to follow in daylight.",
    "Our teacher read a short story aloud before the bell rang.",
    "The cat slept on the windowsill for most of the afternoon.",
    "Snow covered the hills and the roads were quiet for days.",
    "The bakery down the street opens before sunrise every day.",
    "The museum shows paintings from many different centuries.",
)
FILLER_COUNTS = (6, 4, 3, 2, 1, 9, 12, 16, 20, 26, 32, 40, 50, 60)  # tried in this order
INSTRUCTION_KINDS = {
    "forbidden_word": "keywords:forbidden_words",
    "keyword_removed": "keywords:existence",
    "comma_inserted": "punctuation:no_comma",
    "wrong_ending": "startend:end_checker",
}
SUPPORTED_INSTRUCTIONS = frozenset(
    {
        *INSTRUCTION_KINDS.values(),
        "keywords:frequency",
        "keywords:letter_frequency",
        "change_case:english_capital",
        "change_case:english_lowercase",
        "change_case:capital_word_frequency",
        "length_constraints:number_words",
        "length_constraints:number_sentences",
        "length_constraints:number_paragraphs",
        "length_constraints:nth_paragraph_first_word",
        "detectable_content:number_placeholders",
        "detectable_content:postscript",
        "detectable_format:number_highlighted_sections",
        "detectable_format:number_bullet_lists",
        "detectable_format:title",
        "startend:quotation",
    }
)


def row_constraints(row: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(instruction id, parsed arguments) of each constraint of an instruction row."""
    from mrtpo.tasks.instructions.slots import row_constraint

    return [
        (instruction_id, dict(row_constraint(row, index).args))
        for index, instruction_id in enumerate(row["instruction_id_list"])
    ]


def _has_word(sentence: str, words: Sequence[str]) -> bool:
    return any(re.search(rf"\b{re.escape(word)}\b", sentence, re.IGNORECASE) for word in words)


Segments = list[tuple[str, str]]  # (text, anchor name or "")


def _instruction_pieces(
    constraints: Sequence[tuple[str, Mapping[str, Any]]], filler_count: int
) -> Segments:
    """The response as (text, anchor name or "") segments, before any case change."""
    args = {instruction_id: kwargs for instruction_id, kwargs in constraints}
    avoided = list(args.get("keywords:forbidden_words", {}).get("forbidden_words", []))
    frequency = args.get("keywords:frequency")
    if frequency and frequency["relation"] == "less than":
        avoided.append(frequency["keyword"])
    pool = [sentence for sentence in FILLER if not _has_word(sentence, avoided)] or ["Yes."]
    body: list[Segments] = [[(pool[i % len(pool)], f"filler:{i}")] for i in range(filler_count)]
    extra: list[Segments] = []
    for index, keyword in enumerate(args.get("keywords:existence", {}).get("keywords", [])):
        extra.append([("We kept ", ""), (keyword, f"keyword:{index}"), (" in mind.", "")])
    if frequency and frequency["relation"] == "at least":
        extra += [[(f"The word {frequency['keyword']} came up again.", "")]] * frequency[
            "frequency"
        ]
    capitals = args.get("change_case:capital_word_frequency")
    if capitals and capitals["capital_relation"] == "at least":
        extra.append([(" ".join(["NOTE"] * capitals["capital_frequency"]) + " this down.", "")])
    highlights = args.get("detectable_format:number_highlighted_sections", {})
    extra += [[("We keep *this part* in view.", "")]] * highlights.get("num_highlights", 0)
    placeholders = args.get("detectable_content:number_placeholders", {})
    if placeholders:
        fields = " ".join(f"[field{i + 1}]" for i in range(placeholders["num_placeholders"]))
        extra.append([(f"Fill in {fields} later.", "")])
    # Keyword and format sentences go between the filler, in the middle of the body.
    body = body[: len(body) // 2] + extra + body[len(body) // 2 :]

    nth = args.get("length_constraints:nth_paragraph_first_word")
    count = args.get("length_constraints:number_paragraphs", nth or {}).get("num_paragraphs", 1)
    divider = "\n\n***\n\n" if "length_constraints:number_paragraphs" in args else "\n\n"
    per_paragraph = max(1, -(-len(body) // max(count, 1)))
    paragraphs = [body[i : i + per_paragraph] for i in range(0, len(body), per_paragraph)]
    paragraphs += [[[(pool[0], "")]] for _ in range(count - len(paragraphs))]
    if nth and nth["nth_paragraph"] <= len(paragraphs):
        paragraphs[nth["nth_paragraph"] - 1].insert(0, [(nth["first_word"].capitalize(), "")])
    pieces: Segments = []
    if "detectable_format:title" in args:
        pieces.append(("<<A Short Note>>\n", ""))
    for number, paragraph in enumerate(paragraphs):
        if number:
            pieces.append((divider, ""))
        for position, sentence in enumerate(paragraph):
            if position:
                pieces.append((" ", ""))
            pieces += sentence
    for index in range(args.get("detectable_format:number_bullet_lists", {}).get("num_bullets", 0)):
        pieces.append((f"\n* Point number {index + 1} of the list.", ""))
    if "detectable_content:postscript" in args:
        marker = args["detectable_content:postscript"]["postscript_marker"]
        pieces.append((f"\n{marker} Thanks for reading.", ""))
    if "startend:end_checker" in args:
        pieces += [("\n", ""), (args["startend:end_checker"]["end_phrase"], "end_phrase")]
    if "startend:quotation" in args:
        pieces = [('"', ""), *pieces, ('"', "")]
    return pieces


def _join(pieces: Segments, case: str) -> Reference:
    text, anchors = "", {}
    for piece, name in pieces:
        piece = apply_case(piece, case)
        if name:
            anchors[name] = (len(text), len(text) + len(piece))
        text += piece
    return Reference(text, anchors, case)


def apply_case(text: str, case: str) -> str:
    """`text` in the response's case ("upper", "lower" or "" as written); ASCII keeps length."""
    return text.upper() if case == "upper" else text.lower() if case == "lower" else text


def all_pass(verdicts: Sequence[Verdict]) -> bool:
    """Every applicable verdict scores 1."""
    return all(v.score is None or v.score >= 1.0 for v in verdicts)


def build_instruction_response(row: Mapping[str, Any]) -> Reference | None:
    """A response that satisfies every constraint of an instruction row, or None.

    Only rows whose every constraint is in `SUPPORTED_INSTRUCTIONS` are tried. The response is
    plain filler sentences (no commas, no all-capital words) with what the constraints ask put
    in: keyword sentences, highlights, placeholders, a title, paragraphs, bullets, a
    postscript, the end phrase, quotation marks, the case. Filler lengths are tried in the
    order `FILLER_COUNTS` until the task's own checkers pass every constraint; None if none
    does (e.g. constraints that contradict these sentences).
    """
    from mrtpo.tasks.instructions import TASK

    constraints = row_constraints(row)
    if not {instruction_id for instruction_id, _ in constraints} <= SUPPORTED_INSTRUCTIONS:
        return None
    ids = {instruction_id for instruction_id, _ in constraints}
    case = (
        "upper"
        if "change_case:english_capital" in ids
        else "lower"
        if "change_case:english_lowercase" in ids
        else ""
    )
    verifiers = TASK.verifiers()
    for filler_count in FILLER_COUNTS:
        reference = _join(_instruction_pieces(constraints, filler_count), case)
        if all_pass([verifier.verify(reference.text, row) for verifier in verifiers]):
            return reference
    return None


def _slot_of(row: Mapping[str, Any], instruction_id: str) -> str | None:
    """The reward slot of the row's constraint `instruction_id`; None if the row lacks it or
    has no other constraint (specificity needs a reward the error does not concern)."""
    ids = list(row["instruction_id_list"])
    if instruction_id not in ids or len(ids) < 2:
        return None
    return f"constraint_{ids.index(instruction_id)}"


def _middle_filler(reference: Reference) -> Span | None:
    fillers = sorted(span for name, span in reference.anchors.items() if name.startswith("filler:"))
    return fillers[len(fillers) // 2] if fillers else None


def _insert_after_word(
    row: Mapping[str, Any], reference: Reference, instruction_id: str, nth: int, lead: str, new: str
) -> Iterator[Candidate]:
    """`lead + new` inserted after the `nth` word of the middle filler sentence; the span is
    `new`'s; the row's constraint `instruction_id` is to fail."""
    slot, sentence = _slot_of(row, instruction_id), _middle_filler(reference)
    if slot is None or sentence is None:
        return
    spaces = [m.start() for m in re.finditer(" ", reference.text[sentence[0] : sentence[1]])]
    if len(spaces) >= nth:
        at = sentence[0] + spaces[nth - 1]
        changed, (start, end) = replace_span(reference.text, at, at, lead + new)
        yield Candidate(changed, (start + len(lead), end), slot, (slot,))


def instructions_forbidden_word(
    row: Mapping[str, Any], reference: Reference
) -> Iterator[Candidate]:
    """A forbidden word inserted after the first word of the middle filler sentence."""
    forbidden = dict(row_constraints(row)).get("keywords:forbidden_words")
    if forbidden:
        word = apply_case(forbidden["forbidden_words"][0], reference.case)
        yield from _insert_after_word(row, reference, "keywords:forbidden_words", 1, " ", word)


def instructions_keyword_removed(
    row: Mapping[str, Any], reference: Reference
) -> Iterator[Candidate]:
    """The first required keyword replaced by another word where it was put in."""
    slot, span = _slot_of(row, "keywords:existence"), reference.anchors.get("keyword:0")
    if slot is not None and span is not None:
        yield _candidate(reference.text, *span, apply_case("something", reference.case), (slot,))


def instructions_comma_inserted(
    row: Mapping[str, Any], reference: Reference
) -> Iterator[Candidate]:
    """A comma after the third word of the middle filler sentence."""
    return _insert_after_word(row, reference, "punctuation:no_comma", 3, "", ",")


def instructions_wrong_ending(row: Mapping[str, Any], reference: Reference) -> Iterator[Candidate]:
    """The last word of the required end phrase replaced by another word."""
    slot, span = _slot_of(row, "startend:end_checker"), reference.anchors.get("end_phrase")
    if slot is None or span is None:
        return
    words = list(re.finditer(r"[A-Za-z]+", reference.text[span[0] : span[1]]))
    if words:
        last = words[-1]
        new = "today" if last.group().lower() != "today" else "tonight"
        start, end = span[0] + last.start(), span[0] + last.end()
        yield _candidate(reference.text, start, end, apply_case(new, reference.case), (slot,))


@dataclass(frozen=True)
class ErrorKind:
    """One kind of injected error: its task, name, what it does, and its injector."""

    task: str
    name: str
    inject: Callable[[Mapping[str, Any], Reference], Iterator[Candidate]]

    @property
    def description(self) -> str:
        return " ".join((self.inject.__doc__ or "").split("\n\n")[0].split())


# Each task's injectors; an error kind is named after its injector, less the task prefix.
INJECTORS = {
    "sql": (sql_wrong_value, sql_misspelled_name, sql_broken_tag, sql_extra_tag),
    "tool_calling": (
        tool_wrong_value,
        tool_wrong_argument_name,
        tool_wrong_function,
        tool_broken_json,
    ),
    "instructions": (
        instructions_forbidden_word,
        instructions_keyword_removed,
        instructions_comma_inserted,
        instructions_wrong_ending,
    ),
}
ERROR_KINDS = tuple(
    ErrorKind(task, inject.__name__.split("_", 1)[1], inject)
    for task, injectors in INJECTORS.items()
    for inject in injectors
)


def reference_response(task: Any, row: Mapping[str, Any]) -> Reference | None:
    """The task's reference response to `row`, or for instruction following a built one."""
    if task.name == "instructions":
        return build_instruction_response(row)
    text = task.reference_completion(row)
    return None if text is None else Reference(text)


def flips_as_intended(
    candidate: Candidate,
    names: Sequence[str],
    before: Sequence[Verdict],
    after: Sequence[Verdict],
) -> bool:
    """Every reward in `candidate.drops` scores lower after the injection and every other
    applicable reward scores the same (the reference passing every check)."""
    if not all_pass(before):
        return False
    for name, old, new in zip(names, before, after, strict=True):
        if old.score is None:
            continue
        if new.score is None:
            return False
        if (name in candidate.drops) != (new.score < old.score) or (
            name not in candidate.drops and new.score != old.score
        ):
            return False
    return True


@dataclass
class Injected:
    """An injected response kept for the replay, with its verdicts."""

    task: str
    kind: str
    row: dict[str, Any]
    candidate: Candidate
    names: list[str]
    verdicts: list[Verdict]
    # What each reward checks on this row (`mrtpo.credit.replay.reward_types`): the names, but
    # for instruction following the constraint of each slot ("punctuation:no_comma").
    types: list[str] | None = None

    def __post_init__(self) -> None:
        if self.types is None:
            self.types = list(self.names)


def collect_injections(
    kind: ErrorKind, task: Any, rows: Sequence[Mapping[str, Any]], n: int
) -> tuple[list[Injected], dict[str, int]]:
    """Up to `n` injections of `kind`, one per row in `rows`' order: the first candidate of a
    row whose verdicts flip as intended. Also counts rows tried, without a reference, without a
    candidate and with no candidate that flips as intended."""
    verifiers = task.verifiers()
    names = [verifier.name for verifier in verifiers]
    kept: list[Injected] = []
    counts = {"rows": 0, "no_reference": 0, "not_applicable": 0, "no_intended_flip": 0}
    for row in rows:
        if len(kept) >= n:
            break
        counts["rows"] += 1
        reference = reference_response(task, row)
        if reference is None:
            counts["no_reference"] += 1
            continue
        before = verify_rows(verifiers, [reference.text], [row])[0]
        candidates = list(kind.inject(row, reference))
        if not candidates:
            counts["not_applicable"] += 1
            continue
        for candidate in candidates:
            after = verify_rows(verifiers, [candidate.text], [row])[0]
            if flips_as_intended(candidate, names, before, after):
                types = reward_types(verifiers, row)
                item = Injected(task.name, kind.name, dict(row), candidate, names, after, types)
                kept.append(item)
                break
        else:
            counts["no_intended_flip"] += 1
    return kept, counts
