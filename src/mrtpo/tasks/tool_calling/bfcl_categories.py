"""BFCL v4 single-turn accuracy, category by category, and the leaderboard's summary rows.

A response's calls are read the way BFCL reads a Hermes-style (`<tool_call>` JSON) model's
output: every `<tool_call>` block whose text `json.loads` reads, in order (a block that is not
valid JSON is dropped); if a parsed block is not `{"name": <text>, "arguments": {...}}` the response has
no decodable calls at all. Then, per category (BFCL's `eval_runner.py`):

- AST categories (simple_*, multiple, parallel, parallel_multiple and their live_*
  versions): the calls must pass BFCL's AST checker (`bfcl.score_calls(...).valid`: as many
  calls as references, each reference matched greedily by a valid call; simple and multiple
  have one reference). Values are read in the category's language: simple_java and
  simple_javascript take typed strings (`bfcl_languages`);
- irrelevance, live_irrelevance: right when the response makes no call;
- live_relevance: right when it makes at least one call.

Summary rows, as BFCL's leaderboard computes them (`eval_runner_helper.py`, BFCL v4):

- Non-live simple AST: unweighted mean of simple_python, simple_java, simple_javascript;
- Non-live AST summary: unweighted mean of that simple, multiple, parallel, parallel_multiple;
- Live AST summary: the four live AST categories weighted by their example counts;
- Irrelevance detection: unweighted mean of irrelevance and live_irrelevance;
- Relevance detection: live_relevance.

A summary row is None (shown "-") when one of its categories was not evaluated (BFCL shows
"N/A"). With `--max_examples N` the counts are the first N of each category, so the live
weights are those counts.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrtpo.tasks.base import Benchmark, accuracy_by_group
from mrtpo.tasks.tool_calling.bfcl import reference_calls_text, score_calls
from mrtpo.tasks.tool_calling.data import (
    CALL_RULES,
    SINGLE_TURN_CATEGORIES,
    load_bfcl_categories,
)
from mrtpo.tasks.tool_calling.prompt import SYSTEM_PROMPT, tool_functions
from mrtpo.tasks.tool_calling.response import parse_response
from mrtpo.verifiers import Verdict, Verifier

# (summary row, its categories, how they are combined), in BFCL's order.
SUMMARY_ROWS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "Non-live simple AST",
        ("simple_python", "simple_java", "simple_javascript"),
        "unweighted mean",
    ),
    (
        "Non-live AST summary",
        ("Non-live simple AST", "multiple", "parallel", "parallel_multiple"),
        "unweighted mean",
    ),
    (
        "Live AST summary",
        ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"),
        "weighted by examples",
    ),
    ("Irrelevance detection", ("irrelevance", "live_irrelevance"), "unweighted mean"),
    ("Relevance detection", ("live_relevance",), "unweighted mean"),
)


def decoded_calls(text: str) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
    """(calls, why none could be decoded): the response's calls as BFCL decodes a Hermes-style
    model's output (module docstring): each block's text through Python's `json.loads`, as
    BFCL's decoder reads it (so a repeated key keeps its last value); the reason is None when
    decoding succeeded."""
    calls = []
    for number, block in enumerate(parse_response(text).blocks, start=1):
        try:
            value = json.loads(text[block.open_tag[1] : block.close_tag[0]])
        except ValueError:
            continue  # not JSON: dropped, as BFCL's decoder drops it
        if not (
            isinstance(value, dict)
            and isinstance(value.get("name"), str)
            and isinstance(value.get("arguments"), dict)
        ):
            return [], f'block {number} is not {{"name": <text>, "arguments": {{...}}}}'
        calls.append((value["name"], value["arguments"]))
    return calls, None


def _json_column(example: Mapping[str, Any], column: str) -> Any:
    if column not in example:
        raise ValueError(f"example has no {column!r} column; BFCL's accuracy needs it")
    value = example[column]
    return json.loads(value) if isinstance(value, str) else value


@functools.lru_cache(maxsize=4096)
def _functions(text: str) -> tuple[Mapping[str, Any], ...]:
    """Function descriptions from a `functions` or `tools` column's JSON text (parsed once)."""
    return tuple(tool_functions(text))


def checked_functions(example: Mapping[str, Any]) -> tuple[Sequence[Mapping[str, Any]], str]:
    """(function descriptions, language) BFCL checks a row's calls against: BFCL's own
    descriptions (`functions`) and the row's `language` when it has them, else the offered
    tools read as Python."""
    column = "functions" if example.get("functions") else "tools"
    if column not in example:
        raise ValueError("example has no 'tools' column; the tool-calling verifiers need it")
    value = example[column]
    functions = _functions(value) if isinstance(value, str) else tuple(tool_functions(value))
    language = str(example.get("language") or "python") if column == "functions" else "python"
    return functions, language


def category_verdict(text: str, example: Mapping[str, Any]) -> Verdict:
    """1.0 when the response is right by its category's BFCL rule (module docstring), else 0.0;
    the info says the rule and, when wrong, why."""
    category = str(example.get("category") or "")
    calls, problem = decoded_calls(text)
    described = f"{len(calls)} decoded call{'s' if len(calls) != 1 else ''}" + (
        f" ({problem})" if problem else ""
    )
    rule = CALL_RULES.get(category)
    if rule == "none":
        return Verdict(float(not calls), f"{category}: right when nothing is called; {described}.")
    if rule == "some":
        return Verdict(float(bool(calls)), f"{category}: right when a call is made; {described}.")
    functions, language = checked_functions(example)
    ground_truth = _json_column(example, "ground_truth")
    result = score_calls(functions, calls, ground_truth, language)
    verdict = "valid" if result.valid else f"invalid ({result.right}/{result.total} units right)"
    reference = " ".join(json.dumps(call, ensure_ascii=False) for call in ground_truth)
    return Verdict(
        float(result.valid),
        f"{category or 'BFCL'} ({language}): {described}, {verdict} by BFCL's AST checker. "
        f"Reference: {reference}",
    )


class BfclAccuracy(Verifier):
    """BFCL's per-category rule (`category_verdict`): 1 right, 0 wrong."""

    name = "bfcl_accuracy"

    def verify(self, completion: str, example: Mapping[str, Any]) -> Verdict:
        return category_verdict(completion, example)


def summary_rows(groups: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """BFCL's summary rows (`SUMMARY_ROWS`) from per-category rows {"name", "examples",
    "accuracy"}: each {"name", "examples", "accuracy" (None when an input is missing),
    "formula"}."""
    known = {row["name"]: row for row in groups if row.get("accuracy") is not None}
    summary = []
    for name, inputs, combine in SUMMARY_ROWS:
        parts = [known.get(part) for part in inputs]
        examples = sum(part["examples"] for part in parts if part)
        if any(part is None for part in parts):
            accuracy = None
        elif combine == "weighted by examples":
            accuracy = sum(p["accuracy"] * p["examples"] for p in parts) / examples  # type: ignore[index]
        else:
            accuracy = sum(p["accuracy"] for p in parts) / len(parts)  # type: ignore[index]
        row = {
            "name": name,
            "examples": examples,
            "accuracy": accuracy,
            "formula": f"{combine} of {', '.join(inputs)}",
        }
        summary.append(row)
        if accuracy is not None:
            known[name] = row
    return summary


def reference_response(example: Mapping[str, Any]) -> str:
    """A response BFCL counts right on this row, when one exists: the reference calls written
    in the row's language; for irrelevance a sentence without calls; for relevance a call of
    the first offered function (any call counts)."""
    rule = CALL_RULES.get(str(example.get("category") or ""))
    if rule == "none":
        return "None of the offered functions fits this request."
    functions, language = checked_functions(example)
    if rule == "some":
        call = {"name": functions[0]["name"], "arguments": {}}
        return f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"
    return reference_calls_text(_json_column(example, "ground_truth"), functions, language)


def _structured_calls_text(calls: Sequence[Any], where: str) -> str:
    """BFCL's result list of a function-calling model, [{name: arguments}, ...] with the
    arguments as JSON text or an object, written as `<tool_call>` blocks."""
    blocks = []
    for call in calls:
        if not (isinstance(call, dict) and len(call) == 1):
            raise ValueError(f"{where}: each call of a result list must be {{name: arguments}}")
        ((name, arguments),) = call.items()
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                blocks.append(f"<tool_call>\n{arguments}\n</tool_call>")  # stays undecodable
                continue
        call_json = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        blocks.append(f"<tool_call>\n{call_json}\n</tool_call>")
    return "\n".join(blocks)


@dataclass
class BfclBenchmark(Benchmark):
    """BFCL v4's single-turn categories: per-category accuracy and the summary rows."""

    group_by: str = "category"

    def verifiers(self) -> list[Verifier]:
        return [BfclAccuracy()]

    def summarize(
        self, rows: Sequence[Mapping[str, Any]], verdicts: Sequence[Sequence[Verdict]]
    ) -> dict[str, Any]:
        groups = accuracy_by_group(
            [str(row["category"]) for row in rows], [line[0].score for line in verdicts]
        )
        order = {name: index for index, name in enumerate(SINGLE_TURN_CATEGORIES)}
        groups.sort(key=lambda group: order.get(group["name"], len(order)))
        return {"groups": groups, "summary": summary_rows(groups)}

    def response_text(self, record: Mapping[str, Any]) -> str:
        """A record's "response" text, or BFCL's "result": the text a prompting model wrote,
        or a function-calling model's list of {name: arguments} (written as `<tool_call>`
        blocks)."""
        if "response" in record or "result" not in record:
            return super().response_text(record)
        result = record["result"]
        if isinstance(result, str):
            return result
        if isinstance(result, list):
            return _structured_calls_text(result, f"answer {record.get('id')!r}")
        raise ValueError(
            f'answer {record.get("id")!r}: "result" must be text or a list of calls, '
            f"got {type(result).__name__}"
        )


def load_benchmark(
    path: str | Path,
    categories: Sequence[str] | None = None,
    max_examples: int | None = None,
    system_prompt: str = SYSTEM_PROMPT,
) -> BfclBenchmark | None:
    """BFCL's single-turn categories at `path` (a data folder or one category's file) as a
    benchmark, or None when `path` is a file not named as a BFCL category."""
    dataset = load_bfcl_categories(path, categories, max_examples, system_prompt)
    if dataset is None:
        return None
    title = f"BFCL v4 single-turn: {path}"
    if max_examples is not None:
        title += f" (first {max_examples} per category)"
    return BfclBenchmark(title=title, dataset=dataset)
