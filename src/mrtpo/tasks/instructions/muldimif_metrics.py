"""What MulDimIF's evaluation reports, as a `Benchmark` (`load_muldimif_benchmark`).

Every constraint of a row is judged (`ConstraintSlot`, MulDimIF's checkers; a row has up to 7):
- sample accuracy: the share of rows whose constraints are all followed (the paper's number,
  the official "Overall");
- constraint accuracy: the share of all constraints followed (micro), and the mean share per
  row (macro), as the official script computes them;
- by pattern (Example, Listing, Incorporation) and by level (Level 1-4): sample and constraint
  accuracy of the rows of each;
- by category (Content, Format, Language, Length, after the official mapping of each
  (category, subtype) to its four categories and twelve types): the official per-category
  accuracy (a row counts once per category it has, right when all of that category's
  constraints are followed) and the constraint accuracy;
- by type (`Content_Keywords`, `Format_Table`, ...): the constraint accuracy.

`mrtpo eval --task instructions --data test.json` and `mrtpo score` print these rows; the
JSON's "breakdown" holds the same numbers by dimension.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrtpo.tasks.base import Benchmark
from mrtpo.tasks.instructions.loader import SYSTEM_PROMPT
from mrtpo.tasks.instructions.muldimif import LEVELS, PATTERNS, load_muldimif
from mrtpo.tasks.instructions.muldimif_checkers import reported_type, split_instruction_id
from mrtpo.tasks.instructions.slots import ConstraintSlot
from mrtpo.verifiers import Verifier

SAMPLE_ACCURACY = "sample accuracy (all followed)"
CONSTRAINT_ACCURACY = "constraint accuracy (micro)"
CONSTRAINT_MEAN = "constraint share per sample (macro)"


class MulDimIFConstraint(ConstraintSlot):
    """Constraint `index` of a MulDimIF row (1.0, 0.0, or None past the row's last)."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.name = f"muldimif_constraint_{index}"


def _share(correct: float, total: int) -> float | None:
    return correct / total if total else None


def _group(name: str, examples: int, correct: int) -> dict[str, Any]:
    return {
        "name": name,
        "examples": examples,
        "correct": correct,
        "accuracy": _share(correct, examples),
    }


@dataclass
class _Tally:
    samples: int = 0
    samples_followed: int = 0
    constraints: int = 0
    constraints_followed: int = 0

    def add_sample(self, scores: Sequence[float]) -> None:
        self.samples += 1
        self.samples_followed += all(score >= 1.0 for score in scores)
        self.add_constraints(scores)

    def add_constraints(self, scores: Sequence[float]) -> None:
        self.constraints += len(scores)
        self.constraints_followed += sum(score >= 1.0 for score in scores)

    def as_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "samples_followed": self.samples_followed,
            "sample_accuracy": _share(self.samples_followed, self.samples),
            "constraints": self.constraints,
            "constraints_followed": self.constraints_followed,
            "constraint_accuracy": _share(self.constraints_followed, self.constraints),
        }


def _ordered(tallies: dict[str, _Tally], order: Sequence[str]) -> dict[str, _Tally]:
    known = [name for name in order if name in tallies]
    return {name: tallies[name] for name in [*known, *sorted(set(tallies) - set(known))]}


def muldimif_breakdown(
    rows: Sequence[Mapping[str, Any]], scores: Sequence[Sequence[float]]
) -> dict[str, Any]:
    """The numbers of the module docstring from each row's constraint scores (1.0 or 0.0, in
    the row's order): {"overall", "pattern", "level", "category", "type"}, each a tally
    {samples, samples_followed, sample_accuracy, constraints, constraints_followed,
    constraint_accuracy} (per category, "samples" are the official row-category pairs)."""
    overall = _Tally()
    macro = 0.0
    by: dict[str, dict[str, _Tally]] = {"pattern": {}, "level": {}, "category": {}, "type": {}}
    for row, row_scores in zip(rows, scores, strict=True):
        ids = row["instruction_id_list"]
        if len(row_scores) != len(ids):
            raise ValueError(
                f"row {row.get('key')!r}: {len(row_scores)} scores for {len(ids)} constraints"
            )
        overall.add_sample(row_scores)
        macro += sum(score >= 1.0 for score in row_scores) / len(row_scores) if row_scores else 0.0
        by["pattern"].setdefault(row["constraint_pattern"], _Tally()).add_sample(row_scores)
        by["level"].setdefault(row["difficulty"], _Tally()).add_sample(row_scores)
        per_category: dict[str, list[float]] = {}
        for constraint_id, score in zip(ids, row_scores, strict=True):
            kind = reported_type(*split_instruction_id(constraint_id))
            per_category.setdefault(kind.split("_", 1)[0], []).append(score)
            by["type"].setdefault(kind, _Tally()).add_constraints([score])
        for category, category_scores in per_category.items():
            by["category"].setdefault(category, _Tally()).add_sample(category_scores)
    result: dict[str, Any] = {
        "overall": {
            **overall.as_dict(),
            "constraint_share_per_sample": _share(macro, overall.samples),
        }
    }
    orders = {"pattern": PATTERNS, "level": LEVELS, "category": (), "type": ()}
    for dimension, tallies in by.items():
        ordered = _ordered(tallies, orders[dimension])
        result[dimension] = {name: tally.as_dict() for name, tally in ordered.items()}
    return result


@dataclass
class MulDimIFBenchmark(Benchmark):
    """A MulDimIF file: sample and constraint accuracy overall (summary rows) and by pattern,
    level, category and type (groups; the JSON's "breakdown" has them by dimension).

    max_constraints: the most constraints a row has (the number of slots)."""

    group_by: str = "pattern / level / category / type"
    max_constraints: int = 1

    def verifiers(self) -> list[Verifier]:
        """One slot per constraint index."""
        return [MulDimIFConstraint(index) for index in range(self.max_constraints)]

    def summarize(
        self, rows: Sequence[Mapping[str, Any]], verdicts: Sequence[Sequence[Any]]
    ) -> dict[str, Any]:
        scores = []
        for row, line in zip(rows, verdicts, strict=True):
            count = len(row["instruction_id_list"])
            scores.append([float(verdict.score) for verdict in line[:count]])
        breakdown = muldimif_breakdown(rows, scores)
        groups = []
        for dimension in ("pattern", "level"):
            for name, tally in breakdown[dimension].items():
                groups.append(
                    _group(
                        f"{dimension} {name}: samples", tally["samples"], tally["samples_followed"]
                    )
                )
                groups.append(
                    _group(
                        f"{dimension} {name}: constraints",
                        tally["constraints"],
                        tally["constraints_followed"],
                    )
                )
        for name, tally in breakdown["category"].items():
            groups.append(
                _group(f"category {name}: samples", tally["samples"], tally["samples_followed"])
            )
            groups.append(
                _group(
                    f"category {name}: constraints",
                    tally["constraints"],
                    tally["constraints_followed"],
                )
            )
        for name, tally in breakdown["type"].items():
            groups.append(
                _group(
                    f"type {name}: constraints", tally["constraints"], tally["constraints_followed"]
                )
            )
        overall = breakdown["overall"]
        summary = [
            {
                **_group(SAMPLE_ACCURACY, overall["samples"], overall["samples_followed"]),
                "formula": "samples",
            },
            {
                **_group(
                    CONSTRAINT_ACCURACY, overall["constraints"], overall["constraints_followed"]
                ),
                "formula": "constraints",
            },
            {
                "name": CONSTRAINT_MEAN,
                "examples": overall["samples"],
                "accuracy": overall["constraint_share_per_sample"],
                "formula": "mean over samples of the share followed",
            },
        ]
        return {"groups": groups, "summary": summary, "breakdown": breakdown}


def load_muldimif_benchmark(
    path: str | Path, max_examples: int | None = None, system_prompt: str = SYSTEM_PROMPT
) -> MulDimIFBenchmark:
    """The MulDimIF file at `path` (`load_muldimif`) as a benchmark, cut to its first
    `max_examples` rows; each row's `id` is its `key`."""
    dataset = load_muldimif(path, system_prompt=system_prompt)
    if max_examples is not None:
        dataset = dataset.select(range(min(max_examples, len(dataset))))
    dataset = dataset.add_column("id", list(dataset["key"]))
    title = f"MulDimIF: {path}"
    if max_examples is not None:
        title += f" (first {max_examples} examples)"
    longest = max((len(ids) for ids in dataset["instruction_id_list"]), default=1)
    return MulDimIFBenchmark(title=title, dataset=dataset, max_constraints=longest)
