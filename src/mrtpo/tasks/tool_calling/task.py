"""The tool-calling task: a binary format reward and a continuous correctness reward.

The model answers a request with Hermes / Qwen2.5-style calls,
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (an optional `<think>` block first),
choosing among the functions its system message offers. Correctness follows BFCL's AST
checker (see `bfcl`), so a response scores 1.0 exactly when BFCL would accept it. The other
modules of the package are listed in its docstring.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from datasets import Dataset

from mrtpo.tasks.base import Benchmark, Task
from mrtpo.tasks.tool_calling.bfcl import reference_calls_text, score_calls
from mrtpo.tasks.tool_calling.bfcl_categories import checked_functions, load_benchmark
from mrtpo.tasks.tool_calling.data import BUNDLED_DIR, load_bfcl
from mrtpo.tasks.tool_calling.json_spans import Span, merge_spans
from mrtpo.tasks.tool_calling.prompt import SYSTEM_PROMPT, tool_functions
from mrtpo.tasks.tool_calling.response import Response, parse_response
from mrtpo.verifiers import Verdict, Verifier

CALL_SYNTAX = (
    'Reply with one or more <tool_call>{"name": <function-name>, "arguments": <args-json-object>}'
    "</tool_call> blocks and nothing else (a <think>...</think> block may come first)."
)


def _column(example: Mapping[str, Any], column: str) -> Any:
    if column not in example:
        raise ValueError(f"example has no {column!r} column; the tool-calling verifiers need it")
    return example[column]


@functools.lru_cache(maxsize=4096)
def _functions(tools_json: str) -> tuple[Mapping[str, Any], ...]:
    return tuple(tool_functions(tools_json))


def offered_functions(example: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    """The function descriptions offered in a row (its `tools` column)."""
    tools = _column(example, "tools")
    return _functions(tools if isinstance(tools, str) else json.dumps(tools))


def ground_truth_calls(example: Mapping[str, Any]) -> list[dict[str, dict[str, list[Any]]]]:
    """A row's reference calls in BFCL's possible-answer format."""
    ground_truth = _column(example, "ground_truth")
    return json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth


def _format_problem(response: Response, text: str, offered: set[str]) -> str | None:
    """Why the response breaks the format, or None if it follows it."""
    if response.stray:
        start, end = response.stray[0]
        return f"text outside the <tool_call> blocks: {text[start : min(end, start + 60)]!r}"
    if not response.blocks:
        return "no <tool_call> block"
    for number, block in enumerate(response.blocks, start=1):
        if block.parsed is None:
            return f"block {number} is not valid JSON ({block.error})"
        value = block.parsed.value
        if not isinstance(value, dict) or set(value) != {"name", "arguments"}:
            return (
                f'block {number} must be a JSON object with exactly the keys "name" and "arguments"'
            )
        if not isinstance(value["name"], str) or value["name"] not in offered:
            return f"block {number} calls {str(value['name'])[:60]!r}, which is not an offered function"
        if not isinstance(value["arguments"], dict):
            return f'block {number}: "arguments" must be a JSON object'
    return None


class ToolCallFormat(Verifier):
    """1.0 when the response is only well-formed calls of offered functions, else 0.0.

    Info: the call syntax and the offered function names (and the problem, if any).
    Spans: the tags and the JSON punctuation of the blocks.
    """

    name = "tool_format"

    def verify(self, completion: str, example: Mapping[str, Any]) -> Verdict:
        offered = [function.get("name") for function in offered_functions(example)]
        response = parse_response(completion)
        problem = _format_problem(response, completion, set(offered))
        info = f"{CALL_SYNTAX} Offered functions: {', '.join(map(str, offered))}."
        if problem:
            info += f" Problem: {problem}."
        spans: list[Span] = list(response.think_tags)
        for block in response.blocks:
            spans += [block.open_tag, block.close_tag]
            if block.parsed is not None:
                spans += block.parsed.punctuation
        return Verdict(score=0.0 if problem else 1.0, info=info, spans=merge_spans(spans))


def _argument_spans(response: Response) -> list[Span]:
    """Each call's function name value, argument names and argument values."""
    spans: list[Span] = []
    for block in response.blocks:
        if block.parsed is None or block.parsed.root.kind != "object":
            continue
        name = block.parsed.root.member("name")
        if name is not None:
            spans.append((name.start, name.end))
        arguments = block.parsed.root.member("arguments")
        if arguments is not None and arguments.kind == "object":
            for _, key_span, value in arguments.members:
                spans += [key_span, (value.start, value.end)]
    return sorted(spans)


class ToolCallCorrectness(Verifier):
    """Share of the reference's units (function names and parameters) the calls get right,
    by BFCL's rules; 1.0 exactly when BFCL's AST checker accepts the calls.

    Info: the reference call(s) with their allowed values. Spans: each call's function name,
    argument names and argument values.
    """

    name = "tool_correctness"

    def verify(self, completion: str, example: Mapping[str, Any]) -> Verdict:
        reference = ground_truth_calls(example)
        info = (
            'Reference call(s), in any order, each argument with its allowed values ("" means it '
            "may be left out): "
            + " ".join(json.dumps(call, ensure_ascii=False) for call in reference)
        )
        response = parse_response(completion)
        if not response.blocks:
            return Verdict(score=0.0, info=info, spans=())
        # BFCL's own descriptions and language where the row has them (simple_java, ...).
        functions, language = checked_functions(example)
        result = score_calls(functions, response.calls, reference, language)
        return Verdict(score=result.score, info=info, spans=tuple(_argument_spans(response)))


class ToolCallingTask(Task):
    """Tool calling: bundled requests (or BFCL's files), format + BFCL correctness rewards."""

    name = "tool_calling"
    system_prompt = SYSTEM_PROMPT
    headline_name = "call accuracy"

    def load(
        self,
        split: str = "train",
        path: str | Path | None = None,
        answers_path: str | Path | None = None,
        **kwargs: Any,
    ) -> Dataset:
        """The bundled split ("train" or "test"), or BFCL-format files at `path` (answers at
        `answers_path`, default `possible_answer/<same name>` beside them)."""
        if path is not None:
            return load_bfcl(path, answers_path, self.system_prompt)
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        return load_bfcl(BUNDLED_DIR / f"{split}.jsonl", None, self.system_prompt)

    def verifiers(self, **kwargs: Any) -> list[Verifier]:
        return [ToolCallFormat(), ToolCallCorrectness()]

    def reference_completion(self, example: Mapping[str, Any]) -> str | None:
        return reference_calls_text(ground_truth_calls(example), *checked_functions(example))

    def benchmark(
        self,
        path: str,
        split: str = "test",
        categories: Sequence[str] | None = None,
        max_examples: int | None = None,
    ) -> Benchmark | None:
        """BFCL v4's single-turn categories at `path` (its data folder, or one category's
        file): per-category accuracy and the leaderboard's summary rows (`bfcl_categories`)."""
        return load_benchmark(path, categories, max_examples, self.system_prompt)

    def headline(self, verdicts: Sequence[Sequence[Verdict]]) -> dict[str, float]:
        """call accuracy: share of rows whose calls are fully correct (tool_correctness == 1);
        format accuracy: share with tool_format == 1."""
        if not verdicts:
            return {self.headline_name: 0.0, "format accuracy": 0.0}
        correct = sum(row[1].score == 1.0 for row in verdicts)
        formatted = sum(row[0].score == 1.0 for row in verdicts)
        return {
            self.headline_name: correct / len(verdicts),
            "format accuracy": formatted / len(verdicts),
        }


TASK = ToolCallingTask()
