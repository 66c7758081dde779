"""The arguments `mrtpo train`, `mrtpo sft`, `mrtpo eval` and `mrtpo score` share, outside
`mrtpo.commands` so that the commands never import one another.

Each command's dataclass extends `TaskArguments` (`DataArguments` for `mrtpo score`, which
loads no model); one that reads another split by default redeclares `split` with its own
default (a dataclass keeps the field where it was first named).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mrtpo.models import DEFAULT_MODEL


@dataclass
class DataArguments:
    """Which task, on which of its data."""

    task: str = field(
        default="tool_calling", metadata={"help": "sql, tool_calling or instructions."}
    )
    data: str | None = field(
        default=None,
        metadata={
            "help": "The user's files (Spider/BIRD/BFCL/IFEval) for the task's loader; "
            "default: the bundled data."
        },
    )
    split: str = field(default="train", metadata={"help": "Which split of the task to read."})


@dataclass
class TaskArguments(DataArguments):
    """Which task, on which of its data, with which model."""

    model_name_or_path: str = field(
        default=DEFAULT_MODEL,
        metadata={
            "help": "An embedded model's name (smollm2-135m-instruct, the default, or "
            "qwen2.5-coder-0.5b-instruct), a local model folder (e.g. from `mrtpo sft` or "
            "`mrtpo train`), or a hub id."
        },
    )


@dataclass
class BenchmarkArguments:
    """Which part of the data `mrtpo eval` and `mrtpo score` read."""

    max_examples: int | None = field(
        default=None,
        metadata={"help": "The first N examples only (of each category, on BFCL's data)."},
    )
    categories: str | None = field(
        default=None,
        metadata={
            "help": "BFCL categories, comma-separated (default: every single-turn category "
            "present in --data)."
        },
    )

    def category_list(self) -> list[str] | None:
        """`categories` as a list (None when not given)."""
        if not self.categories:
            return None
        return [name.strip() for name in self.categories.split(",") if name.strip()]
