"""The instruction-following task: `InstructionsTask` and `TASK`, one reward per constraint.

The package docstring (`mrtpo.tasks.instructions`) describes the data and the columns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from datasets import Dataset

from mrtpo.tasks.base import Benchmark, Task
from mrtpo.tasks.instructions.loader import SYSTEM_PROMPT, load_ifeval
from mrtpo.tasks.instructions.metrics import (
    INSTRUCTION_LEVEL,
    PROMPT_LEVEL,
    load_following_benchmark,
)
from mrtpo.tasks.instructions.muldimif import is_muldimif_file, load_muldimif
from mrtpo.tasks.instructions.muldimif_metrics import load_muldimif_benchmark
from mrtpo.tasks.instructions.slots import ConstraintSlot
from mrtpo.verifiers import Verdict

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "instructions"
# The most constraints a bundled prompt has: the default number of reward slots.
MAX_BUNDLED_CONSTRAINTS = 6


class InstructionsTask(Task):
    name = "instructions"
    system_prompt = SYSTEM_PROMPT
    headline_name = PROMPT_LEVEL

    def load(
        self,
        split: str = "train",
        path: str | None = None,
        skip_unknown: bool = False,
        **kwargs: Any,
    ) -> Dataset:
        """The bundled split ("train" or "test"), or the file at `path`: IFEval's or IFBench's
        JSONL (the same layout; the instruction ids of both are known) or MulDimIF's JSON list
        (`load_muldimif`, recognized by its layout)."""
        if kwargs:
            raise ValueError(f"unexpected arguments {sorted(kwargs)} for the instructions task")
        if path is not None and is_muldimif_file(path):
            return load_muldimif(path, system_prompt=self.system_prompt)
        if path is not None:
            return load_ifeval(path, skip_unknown=skip_unknown, system_prompt=self.system_prompt)
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        return load_ifeval(DATA_DIR / f"{split}.jsonl", system_prompt=self.system_prompt)

    def verifiers(
        self, max_constraints: int = MAX_BUNDLED_CONSTRAINTS, **kwargs: Any
    ) -> list[ConstraintSlot]:
        """`max_constraints` slots: slot k scores the k-th constraint of each row."""
        if kwargs:
            raise ValueError(f"unexpected arguments {sorted(kwargs)} for the instructions task")
        if (
            isinstance(max_constraints, bool)
            or not isinstance(max_constraints, int)
            or max_constraints < 1
        ):
            raise ValueError(f"max_constraints must be an int >= 1, got {max_constraints!r}")
        return [ConstraintSlot(k) for k in range(max_constraints)]

    def verifiers_for(self, rows: Iterable[Mapping[str, Any]]) -> list[ConstraintSlot]:
        """One slot per constraint of the longest row of `rows`, at least
        `MAX_BUNDLED_CONSTRAINTS` (so the bundled data's rewards keep their names and number):
        a row with more constraints than slots would have its last ones neither rewarded nor
        counted (MulDimIF has rows of 7)."""
        longest = max((len(row["instruction_id_list"]) for row in rows), default=0)
        return self.verifiers(max(MAX_BUNDLED_CONSTRAINTS, longest))

    def reference_completion(self, example: Mapping[str, Any]) -> str | None:
        """None: instruction-following data has no reference responses (no cold start)."""
        return None

    def headline(self, verdicts: Sequence[Sequence[Verdict]]) -> dict[str, float]:
        """IFEval's strict accuracies: prompt-level (share of rows whose applicable constraints
        all score 1) and instruction-level (mean of all applicable constraint scores)."""
        scores = [[v.score for v in row if v.score is not None] for row in verdicts]
        all_scores = [s for row in scores for s in row]
        prompt_level = (
            sum(all(s >= 1.0 for s in row) for row in scores) / len(scores) if scores else 0.0
        )
        instruction_level = sum(all_scores) / len(all_scores) if all_scores else 0.0
        return {PROMPT_LEVEL: prompt_level, INSTRUCTION_LEVEL: instruction_level}

    def benchmark(
        self,
        path: str,
        split: str = "test",
        categories: Sequence[str] | None = None,
        max_examples: int | None = None,
    ) -> Benchmark | None:
        """The IFEval or IFBench JSONL file at `path`: the four accuracies IFEval and IFBench
        report (prompt- and instruction-level, strict and loose) and per-id accuracy over every
        instruction of each row, not only the first `max_constraints` (`metrics`); a MulDimIF
        file: sample and constraint accuracy by pattern, level, category and type
        (`muldimif_metrics`); None for a folder."""
        if not Path(path).is_file():
            return None
        if categories:
            # (MulDimIF has none either; the message is the one users and tests know)
            raise ValueError(
                f"categories are BFCL's; IFEval and IFBench have none, got {list(categories)}"
            )
        if is_muldimif_file(path):
            return load_muldimif_benchmark(path, max_examples, self.system_prompt)
        return load_following_benchmark(path, max_examples, self.system_prompt)


TASK = InstructionsTask()
