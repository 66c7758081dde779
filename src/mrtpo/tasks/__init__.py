"""The task registry: `mrtpo.tasks.get(name)` returns a `Task`.

Each task package defines a module-level `TASK`. The packages are imported on first use, so
that asking for one task never pulls in another's dependencies (sqlglot, NLTK, BFCL's data).
"""

from __future__ import annotations

from collections.abc import Callable

from mrtpo.tasks.base import Task


def _sql() -> Task:
    from mrtpo.tasks.sql import TASK

    return TASK


def _tool_calling() -> Task:
    from mrtpo.tasks.tool_calling import TASK

    return TASK


def _instructions() -> Task:
    from mrtpo.tasks.instructions import TASK

    return TASK


TASKS: dict[str, Callable[[], Task]] = {
    "sql": _sql,
    "tool_calling": _tool_calling,
    "instructions": _instructions,
}


def names() -> list[str]:
    """The registered task names."""
    return list(TASKS)


def get(name: str) -> Task:
    """The task registered under `name` ("sql", "tool_calling" or "instructions")."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[name]()


__all__ = ["Task", "get", "names"]
