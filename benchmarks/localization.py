"""Benchmark: does each reward's replay distance land on an error injected at a known place?

Ground truth instead of pooled statistics. For each bundled task we take correct responses
(the task's reference responses; for instruction following, responses built here to satisfy
every constraint of a row, see `build_instruction_response`), inject one controlled error at a
known character span, score the result with the task's own verifiers, keep it only if exactly
the intended rewards flip, replay it with the policy (`mrtpo.relevance`, both replay modes) and
measure where each reward's distance falls.

For reward k of one response with T tokens (the eos token included, as training replays it)
and S the tokens overlapping the injected span:

    ratio_k = (sum_{t in S} q_{k,t} / sum_t q_{k,t}) / (|S| / T)      (1 = uniform)

Per task, error kind and replay mode we report, over the kept responses: the failing reward's
median ratio and the share of responses above 1; the same for the rewards the error does not
concern (those whose verdict did not change), averaged per response; the specificity (failing
reward's ratio minus the mean ratio of the unconcerned rewards, same tokens), its median; how
often the failing reward's ratio ranks first among the response's rewards; and the failing
reward's ratio after its distances are shuffled within the response
(`mrtpo.advantages.shuffle_weights`, one permutation per response: the null of the shuffle
ablation). Outputs in `--out`: `localization.md` (tables), `localization.png` (figure),
`localization.json` (every response's ratios).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/localization.py --n 12
    .venv/bin/python benchmarks/localization.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mrtpo import tasks
from mrtpo.advantages import shuffle_weights
from mrtpo.credit.map import CreditMap
from mrtpo.credit.replay import reward_types
from mrtpo.explaining import replay_rows, verify_rows
from mrtpo.models import DEFAULT_MODEL
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


# ----------------------------------------------------------------------------- metrics


def span_ratio(distance: np.ndarray, in_span: np.ndarray) -> float | None:
    """The share of `distance` on the span's tokens over their share of the response.

    distance: [T] one reward's distances over a response's tokens; in_span: [T] bool.
    None when the reward has no distance at all or the span holds no token.
    """
    total = float(distance.sum())
    if total <= 0 or not in_span.any():
        return None
    return (float(distance[in_span].sum()) / total) / (float(in_span.sum()) / len(distance))


def response_ratios(
    distance: np.ndarray, in_span: np.ndarray, names: Sequence[str], applicable: Sequence[bool]
) -> dict[str, float | None]:
    """{reward: span_ratio} over the applicable rewards. distance: [K, T]; in_span: [T]."""
    return {name: span_ratio(distance[k], in_span) for k, name in enumerate(names) if applicable[k]}


def shuffled_distance(distance: np.ndarray, seed: int) -> np.ndarray:
    """[K, T] each reward's distances permuted among the response's tokens (seeded): the
    shuffle ablation's null (`mrtpo.advantages.shuffle_weights`, one permutation per reward)."""
    generator = torch.Generator().manual_seed(seed)
    tensor = torch.as_tensor(distance, dtype=torch.float64)[None]
    mask = torch.ones(1, tensor.shape[-1])
    return shuffle_weights(tensor, mask, generator)[0].numpy()


def measure(
    injected: Injected, distance: np.ndarray, in_span: np.ndarray, seed: int
) -> dict[str, Any]:
    """One response's record: its ratios, the shuffled ratios, and which rewards it concerns.

    distance: [K, T] the replay distances; in_span: [T] the injected span's tokens.
    """
    applicable = [verdict.score is not None for verdict in injected.verdicts]
    candidate = injected.candidate
    return {
        "task": injected.task,
        "kind": injected.kind,
        "target": candidate.target,
        "drops": list(candidate.drops),
        "unconcerned": [
            name
            for name, keep in zip(injected.names, applicable, strict=True)
            if keep and name not in candidate.drops
        ],
        "types": {
            name: kind
            for name, kind, keep in zip(injected.names, injected.types, applicable, strict=True)
            if keep
        },
        "tokens": int(len(in_span)),
        "span_tokens": int(in_span.sum()),
        "ratios": response_ratios(distance, in_span, injected.names, applicable),
        "shuffled": response_ratios(
            shuffled_distance(distance, seed), in_span, injected.names, applicable
        ),
    }


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def _above_one(values: Sequence[float]) -> float | None:
    return sum(value > 1 for value in values) / len(values) if values else None


def _quartiles(values: Sequence[float]) -> tuple[float, float] | None:
    return (float(np.percentile(values, 25)), float(np.percentile(values, 75))) if values else None


def summarize(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (task, kind, mode) in first-seen order: n, the failing reward's median ratio,
    quartiles and share above 1; the unconcerned rewards' (mean per response) median and share
    above 1; the specificity's median; the share of responses whose failing reward ranks first;
    the shuffled failing reward's median and share above 1. A response whose failing reward
    has no distance counts in `undefined` (left out of the statistics)."""
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["task"], record["kind"], record["mode"]), []).append(record)
    rows = []
    for (task, kind, mode), group in groups.items():
        target, others, specificity, first, shuffled, placebo = [], [], [], [], [], []
        for record in group:
            ratio = record["ratios"][record["target"]]
            if ratio is None:
                continue
            target.append(ratio)
            # An unconcerned reward without any distance has no ratio: left out, not counted 0.
            rest = [
                record["ratios"][name]
                for name in record["unconcerned"]
                if record["ratios"][name] is not None
            ]
            if rest:
                others.append(float(np.mean(rest)))
                specificity.append(ratio - others[-1])
            competitors = [
                value or 0.0 for name, value in record["ratios"].items() if name != record["target"]
            ]
            first.append(all(ratio > value for value in competitors))
            if record["shuffled"][record["target"]] is not None:
                shuffled.append(record["shuffled"][record["target"]])
            if (record.get("placebo") or {}).get(record["target"]) is not None:
                placebo.append(record["placebo"][record["target"]])
        rows.append(
            {
                "task": task,
                "kind": kind,
                "mode": mode,
                "failing": group[0]["types"][group[0]["target"]],
                "n": len(target),
                "undefined": len(group) - len(target),
                "span_share": float(np.mean([r["span_tokens"] / r["tokens"] for r in group])),
                "median": _median(target),
                "quartiles": _quartiles(target),
                "above_one": _above_one(target),
                "unconcerned_median": _median(others),
                "unconcerned_above_one": _above_one(others),
                "specificity_median": _median(specificity),
                "ranks_first": sum(first) / len(first) if first else None,
                "shuffled_median": _median(shuffled),
                "shuffled_above_one": _above_one(shuffled),
                "placebo_median": _median(placebo),
                "placebo_above_one": _above_one(placebo),
            }
        )
    return rows


def per_reward_rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (task, kind, mode, reward type): its role (failing, also failing,
    unconcerned), n, median ratio and share above 1. Types, not names: an instruction slot
    checks a different constraint on each row."""
    groups: dict[tuple[str, str, str, str], list[float]] = {}
    roles: dict[tuple[str, str, str, str], str] = {}
    for record in records:
        for name, ratio in record["ratios"].items():
            key = (record["task"], record["kind"], record["mode"], record["types"][name])
            groups.setdefault(key, [])
            if ratio is not None:
                groups[key].append(ratio)
            roles[key] = (
                "failing"
                if name == record["target"]
                else "also failing"
                if name in record["drops"]
                else "unconcerned"
            )
    order = {key[:3]: index for index, key in reversed(list(enumerate(groups)))}
    ranks = {"failing": 0, "also failing": 1, "unconcerned": 2}
    keys = sorted(groups, key=lambda key: (order[key[:3]], ranks[roles[key]], key[3]))
    return [
        {
            "task": task,
            "kind": kind,
            "mode": mode,
            "reward": reward,
            "role": roles[(task, kind, mode, reward)],
            "n": len(values),
            "median": _median(values),
            "above_one": _above_one(values),
        }
        for task, kind, mode, reward in keys
        for values in [groups[(task, kind, mode, reward)]]
    ]


# ----------------------------------------------------------------------------- outputs


def _number(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _share(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{100 * value:.{digits}f}%"


def summary_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The summary table (one row per task, kind and mode) as Markdown."""
    lines = [
        "| task | error | mode | failing reward | n | span tokens | ratio (median) | > 1 "
        "| unconcerned ratio | specificity | ranks first | shuffled ratio | shuffled > 1 "
        "| placebo ratio | placebo > 1 |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['task']} | {row['kind']} | {row['mode']} | {row['failing']} | {row['n']} "
            f"| {_share(row['span_share'], 1)} | {_number(row['median'])} | {_share(row['above_one'])} "
            f"| {_number(row['unconcerned_median'])} | {_number(row['specificity_median'])} "
            f"| {_share(row['ranks_first'])} | {_number(row['shuffled_median'])} "
            f"| {_share(row['shuffled_above_one'])} "
            f"| {_number(row.get('placebo_median'))} | {_share(row.get('placebo_above_one'))} |"
        )
    return "\n".join(lines) + "\n"


def per_reward_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """Every reward's median ratio per task, kind and mode, as Markdown."""
    lines = [
        "| task | error | mode | reward | role | n | ratio (median) | > 1 |",
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['task']} | {row['kind']} | {row['mode']} | {row['reward']} | {row['role']} "
            f"| {row['n']} | {_number(row['median'])} | {_share(row['above_one'])} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """One panel per replay mode: per error kind, the failing reward's median ratio (with its
    quartiles), the unconcerned rewards' and the shuffled failing reward's; log scale."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    modes = list(dict.fromkeys(row["mode"] for row in rows))
    figure = Figure(figsize=(13, 4.6 * len(modes)), dpi=110)
    for index, mode in enumerate(modes):
        axes = figure.add_subplot(len(modes), 1, index + 1)
        here = [row for row in rows if row["mode"] == mode]
        x = np.arange(len(here))
        for offset, key, label, color in (
            (-0.2, "median", "failing reward", "tab:red"),
            (0.0, "unconcerned_median", "unconcerned rewards", "tab:blue"),
            (0.2, "shuffled_median", "failing reward, shuffled", "tab:gray"),
            (0.3, "placebo_median", "failing reward, placebo", "tab:olive"),
        ):
            values = [np.nan if row.get(key) is None else row[key] for row in here]
            axes.scatter(x + offset, values, color=color, label=label, zorder=3)
        for position, row in zip(x, here, strict=True):
            if row["quartiles"] is not None:
                low, high = row["quartiles"]
                axes.vlines(position - 0.2, low, high, color="tab:red", alpha=0.5)
        axes.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        axes.set_yscale("log")
        labels = [f"{row['task']}: {row['kind']}" for row in here]
        axes.set_xticks(x, labels, fontsize=7, rotation=25, ha="right")
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axes.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axes.tick_params(axis="y", which="minor", labelsize=6)
        axes.set_ylabel("distance share / token share")
        axes.set_title(f"Injected errors, replay mode {mode} (median over responses; bar: IQR)")
        axes.grid(alpha=0.3, axis="y")
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.tight_layout()
    figure.savefig(path, format="png")


# ----------------------------------------------------------------------------- main


def task_rows(task: Any, seed: int) -> list[dict[str, Any]]:
    """The test split's rows, then the train split's, each shuffled by `seed`."""
    rows = []
    for split in ("test", "train"):
        split_rows = [dict(row) for row in task.load(split)]
        random.Random(seed).shuffle(split_rows)
        rows += split_rows
    return rows


def row_id(row: Mapping[str, Any]) -> str:
    """A task row's identifier: `id` where the task has one (SQL, tools), else `key` (IFEval)."""
    return str(row.get("id", row.get("key")))


def placebo_partners(injected: Sequence[Injected], seed: int) -> list[int | None]:
    """For each injected response, the index of another one whose verifier information it is
    replayed with in the placebo: a response of another row with as many rewards, the first such
    after it in a seeded cyclic order (None when there is none)."""
    order = list(range(len(injected)))
    random.Random(seed).shuffle(order)
    partners: list[int | None] = [None] * len(injected)
    for position, index in enumerate(order):
        for step in range(1, len(order)):
            other = order[(position + step) % len(order)]
            mine, theirs = injected[index], injected[other]
            if row_id(mine.row) != row_id(theirs.row) and len(mine.verdicts) == len(
                theirs.verdicts
            ):
                partners[index] = other
                break
    return partners


def replay_injected(
    model: Any, tokenizer: Any, injected: Sequence[Injected], mode: str, seed: int
) -> list[dict[str, Any]]:
    """Replay the injected responses (their text tokenized once, plus eos) and measure each;
    then replay them again with another row's verifier information (`placebo_partners`) and
    measure the failing reward's span ratio there (the placebo control)."""
    ids = [
        list(tokenizer(item.candidate.text, add_special_tokens=False)["input_ids"])
        + [tokenizer.eos_token_id]
        for item in injected
    ]
    distances = replay_rows(
        model,
        tokenizer,
        [item.row["prompt"] for item in injected],
        ids,
        [item.verdicts for item in injected],
        mode=mode,
    )
    partners = placebo_partners(injected, seed)
    placebo_distances = replay_rows(
        model,
        tokenizer,
        [item.row["prompt"] for item in injected],
        ids,
        [
            injected[p].verdicts if p is not None else item.verdicts
            for item, p in zip(injected, partners, strict=True)
        ],  # fmt: skip
        mode=mode,
    )
    records = []
    for index, (item, row_ids, distance) in enumerate(zip(injected, ids, distances, strict=True)):
        credit_map = CreditMap.from_replay(
            tokenizer,
            row_ids,
            item.names,
            distance,
            verdicts=item.verdicts,
            text=item.candidate.text,
        )
        in_span = credit_map.tokens_in_spans([item.candidate.span])
        record = measure(item, credit_map.distance, in_span, seed + index)
        placebo = None
        if partners[index] is not None:
            # The same tokens (the credit map's cut of the replay) under another row's information.
            cut = placebo_distances[index].numpy()[:, : credit_map.distance.shape[1]]
            applicable = [verdict.score is not None for verdict in item.verdicts]
            placebo = response_ratios(cut, in_span, item.names, applicable)
        records.append({**record, "placebo": placebo, "mode": mode, "row_id": row_id(item.row)})
    return records


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model_name_or_path", default=DEFAULT_MODEL)
    parser.add_argument("--n", type=int, default=12, help="responses per error kind")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/localization"))
    parser.add_argument("--tasks", nargs="+", default=list(dict.fromkeys(k.task for k in ERROR_KINDS)))  # fmt: skip
    parser.add_argument("--modes", nargs="+", default=list(REPLAY_MODES), choices=REPLAY_MODES)
    parser.add_argument("--seed", type=int, default=0, help="row order and shuffles")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--report", action="store_true", help="only rewrite the tables and figure from --out's JSON"
    )
    args = parser.parse_args(argv)
    if args.n < 1:
        raise SystemExit(f"--n must be >= 1, got {args.n}")
    return args


def run(args: argparse.Namespace, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """The whole benchmark; the loaded model may be given (tests pass the tiny one)."""
    if model is None:
        from mrtpo.models import load_model

        model, tokenizer = load_model(args.model_name_or_path)
        device = (
            args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
        )
        model = model.to(device)
    started = time.perf_counter()
    injected: list[Injected] = []
    counts: dict[str, dict[str, int]] = {}
    for task_name in args.tasks:
        task = tasks.get(task_name)
        rows = task_rows(task, args.seed)
        for kind in (kind for kind in ERROR_KINDS if kind.task == task_name):
            kept, counted = collect_injections(kind, task, rows, args.n)
            injected += kept
            counts[f"{task_name}/{kind.name}"] = {**counted, "kept": len(kept)}
    records = []
    for mode in args.modes:
        for task_name in args.tasks:
            batch = [item for item in injected if item.task == task_name]
            if batch:
                began = time.perf_counter()
                records += replay_injected(model, tokenizer, batch, mode, args.seed)
                seconds = time.perf_counter() - began
                print(f"{mode}, {task_name}: {len(batch)} responses in {seconds:.0f} s", flush=True)
    return {
        "command": "",
        "model": args.model_name_or_path,
        "seconds": round(time.perf_counter() - started, 1),
        "counts": counts,
        "kinds": {f"{k.task}/{k.name}": k.description for k in ERROR_KINDS},
        "summary": summarize(records),
        "per_reward": per_reward_rows(records),
        "records": records,
    }


LEGEND = """Medians over the responses of each error kind. *ratio*: the share of the failing
reward's replay distance on the injected span's tokens over the span's share of the response's
tokens (1 = uniform; *> 1*: the share of responses above 1). *unconcerned*: the same for the
rewards whose verdict the error does not change (mean per response). *specificity*: failing
minus unconcerned, per response. *ranks first*: the failing reward's ratio is the largest of
the response's rewards. *shuffled*: the failing reward's distances permuted within the response
(one permutation: the shuffle ablation's null). *placebo*: the failing reward's ratio when the
response is replayed with the verifier information of another row's response (as
`replay_information="placebo"` trains). "–": no reward the error leaves alone (or, for the
placebo, a response with no partner).
"""


def write_outputs(result: dict[str, Any], out: Path) -> None:
    """`localization.json`, `localization.md` and `localization.png` into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "localization.json").write_text(json.dumps(result, indent=1))
    counts = "\n".join(
        f"- {name}: {result['kinds'][name]} {count['kept']} kept of {count['rows']} rows tried "
        f"({count['not_applicable']} not applicable, {count['no_reference']} without a "
        f"reference, {count['no_intended_flip']} without the intended verdict change)."
        for name, count in result["counts"].items()
    )
    (out / "localization.md").write_text(
        f"# Localization of injected errors\n\n    {result['command']}\n\n"
        f"Model: {result['model']}; {result['seconds']:.0f} s.\n\n"
        + LEGEND
        + "\n"
        + summary_markdown(result["summary"])
        + "\n## Every reward\n\n"
        + per_reward_markdown(result["per_reward"])
        + "\n## Injections\n\n"
        + counts
        + "\n\nInstruction following has no reference responses: one is built per row whose "
        "constraints are all of the kinds the builder knows and can meet together "
        "(`build_instruction_response`); the other rows count as without a reference." + "\n"
    )
    plot(result["summary"], out / "localization.png")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.report:  # the tables and the figure again, from the records alone
        result = json.loads((args.out / "localization.json").read_text())
        result.update(summary=summarize(result["records"]), per_reward=per_reward_rows(result["records"]))  # fmt: skip
        write_outputs(result, args.out)
        print(
            f"wrote {args.out / 'localization.md'} and .png from {args.out / 'localization.json'}"
        )
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args)
    result["command"] = shlex.join(["python", "benchmarks/localization.py", *sys.argv[1:]])
    write_outputs(result, args.out)
    print(summary_markdown(result["summary"]))
    print(f"wrote {args.out / 'localization.md'}, .png and .json in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
