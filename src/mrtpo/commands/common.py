"""The arguments `mrtpo train`, `mrtpo sft` and `mrtpo eval` share (not a subcommand).

Each command's dataclass extends `TaskArguments`; one that reads another split by default
redeclares `split` with its own default (a dataclass keeps the field where it was first named).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mrtpo.models import DEFAULT_MODEL


@dataclass
class TaskArguments:
    """Which task, on which of its data, with which model."""

    task: str = field(
        default="tool_calling", metadata={"help": "sql, tool_calling or instructions."}
    )
    model_name_or_path: str = field(
        default=DEFAULT_MODEL,
        metadata={
            "help": "The embedded model's name, a local model folder (e.g. from `mrtpo sft` or "
            "`mrtpo train`), or a hub id."
        },
    )
    data: str | None = field(
        default=None,
        metadata={
            "help": "The user's files (Spider/BIRD/BFCL/IFEval) for the task's loader; "
            "default: the bundled data."
        },
    )
    split: str = field(default="train", metadata={"help": "Which split of the task to read."})
