"""What IFEval's and IFBench's evaluations report, as a `Benchmark` (`load_following_benchmark`).

- prompt-level accuracy: the share of responses that follow every instruction of their row;
- instruction-level accuracy: the share of all instructions followed;
- each in strict mode (the response as it is; an empty one follows nothing) and loose mode (the
  response or one of its variants, `registry.loose_variants`: without the first line, the last
  line or both, and without asterisks);
- per instruction id: how many there were and the share followed, strict and loose.

`mrtpo eval --task instructions --data FILE` and `mrtpo score` print these as the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrtpo.tasks.base import Benchmark, accuracy_by_group
from mrtpo.tasks.instructions.loader import SYSTEM_PROMPT, load_ifeval
from mrtpo.tasks.instructions.registry import CHECKERS, IFBENCH_CHECKERS, Constraint
from mrtpo.tasks.instructions.slots import ConstraintSlot, row_constraint
from mrtpo.verifiers import Verdict, Verifier

PROMPT_LEVEL = "prompt-level strict accuracy"
INSTRUCTION_LEVEL = "instruction-level strict accuracy"
PROMPT_LEVEL_LOOSE = "prompt-level loose accuracy"
INSTRUCTION_LEVEL_LOOSE = "instruction-level loose accuracy"
MODES = ("strict", "loose")


def follows(constraint: Constraint, response: str, mode: str) -> Verdict:
    """Whether `response` follows `constraint` in `mode` ("strict" or "loose"): 1.0 or 0.0."""
    if mode == "strict":
        return constraint.check(response)
    followed = constraint.follows_loose(response)
    verdict = "satisfied" if followed else "not satisfied"
    return Verdict(float(followed), f"Constraint: {constraint.statement}\nLoose: {verdict}.")


class InstructionFollowed(ConstraintSlot):
    """Whether the response follows instruction `index` of its row in `mode`: 1.0, 0.0, or None
    (the row has fewer instructions)."""

    def __init__(self, index: int, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        super().__init__(index)
        self.mode = mode
        self.name = f"instruction_{index}_{mode}"

    def judge(self, constraint: Constraint, completion: str) -> Verdict:
        return follows(constraint, completion, self.mode)


class PromptFollowed(Verifier):
    """Prompt-level verdict in `mode`: 1.0 when the response follows every instruction of its
    row, else 0.0; the info names the instructions not followed."""

    def __init__(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.name = f"prompt_{mode}"

    def verify(self, completion: str, example: Mapping[str, Any]) -> Verdict:
        ids = example["instruction_id_list"]
        missed = [
            instruction_id
            for index, instruction_id in enumerate(ids)
            if follows(row_constraint(example, index), completion, self.mode).score != 1.0
        ]
        if missed:
            return Verdict(0.0, f"{self.mode}: not followed: {', '.join(missed)}")
        return Verdict(1.0, f"{self.mode}: all {len(ids)} instructions followed")


def _summary_row(name: str, scores: Sequence[float | None], formula: str) -> dict[str, Any]:
    (row,) = accuracy_by_group([name] * len(scores), scores)
    return {**row, "formula": formula}


@dataclass
class InstructionFollowingBenchmark(Benchmark):
    """An IFEval or IFBench file: the four accuracies as summary rows, per-id accuracy as groups
    (strict; loose in each group's `loose_correct` and `loose_accuracy`).

    max_instructions: the most instructions a row has (the number of per-instruction slots).
    """

    group_by: str = "instruction id"
    max_instructions: int = 1

    def verifiers(self) -> list[Verifier]:
        """The prompt-level verdicts (strict, loose), then one slot per instruction index
        (strict ones, then loose ones)."""
        slots = [
            InstructionFollowed(index, mode)
            for mode in MODES
            for index in range(self.max_instructions)
        ]
        return [PromptFollowed("strict"), PromptFollowed("loose"), *slots]

    def summarize(
        self, rows: Sequence[Mapping[str, Any]], verdicts: Sequence[Sequence[Verdict]]
    ) -> dict[str, Any]:
        slots = self.max_instructions
        ids: list[str] = []
        followed: dict[str, list[float | None]] = {mode: [] for mode in MODES}
        for row, line in zip(rows, verdicts, strict=True):
            count = len(row["instruction_id_list"])
            ids += row["instruction_id_list"]
            for offset, mode in enumerate(MODES):
                start = 2 + offset * slots
                followed[mode] += [verdict.score for verdict in line[start : start + count]]
        strict_groups = accuracy_by_group(ids, followed["strict"])
        loose_groups = {group["name"]: group for group in accuracy_by_group(ids, followed["loose"])}
        groups = [
            {
                **group,
                "loose_correct": loose_groups[group["name"]]["correct"],
                "loose_accuracy": loose_groups[group["name"]]["accuracy"],
            }
            for group in sorted(strict_groups, key=lambda group: group["name"])
        ]
        summary = [
            _summary_row(PROMPT_LEVEL, [line[0].score for line in verdicts], "prompts, strict"),
            _summary_row(INSTRUCTION_LEVEL, followed["strict"], "instructions, strict"),
            _summary_row(
                PROMPT_LEVEL_LOOSE, [line[1].score for line in verdicts], "prompts, loose"
            ),
            _summary_row(INSTRUCTION_LEVEL_LOOSE, followed["loose"], "instructions, loose"),
        ]
        return {"groups": groups, "summary": summary}


def benchmark_name(instruction_ids: Sequence[str]) -> str:
    """The table's name for a file with these ids: IFEval or IFBench when every id is that
    benchmark's, else IFEval/IFBench."""
    if all(i in IFBENCH_CHECKERS for i in instruction_ids):
        return "IFBench"
    if all(i in CHECKERS for i in instruction_ids):
        return "IFEval"
    return "IFEval/IFBench"


def load_following_benchmark(
    path: str | Path, max_examples: int | None = None, system_prompt: str = SYSTEM_PROMPT
) -> InstructionFollowingBenchmark:
    """The IFEval or IFBench JSONL file at `path` (`load_ifeval`) as a benchmark, cut to its
    first `max_examples` rows; each row's `id` is its `key`, as text (what `mrtpo score`'s
    answers name)."""
    dataset = load_ifeval(path, system_prompt=system_prompt)
    if max_examples is not None:
        dataset = dataset.select(range(min(max_examples, len(dataset))))
    dataset = dataset.add_column("id", [str(key) for key in dataset["key"]])
    ids = [i for row_ids in dataset["instruction_id_list"] for i in row_ids]
    title = f"{benchmark_name(ids)}: {path}"
    if max_examples is not None:
        title += f" (first {max_examples} examples)"
    longest = max((len(row_ids) for row_ids in dataset["instruction_id_list"]), default=1)
    return InstructionFollowingBenchmark(title=title, dataset=dataset, max_instructions=longest)
