"""The task registry: `mrtpo.tasks.get(name)` returns a `Task`.

Each task module defines a module-level `TASK` object; modules are imported lazily so that
importing one task never pulls in another's dependencies.
"""

from __future__ import annotations

import importlib

from mrtpo.tasks.base import Task

TASK_MODULES = {
    "sql": "mrtpo.tasks.sql",
    "tool_calling": "mrtpo.tasks.tool_calling",
    "instructions": "mrtpo.tasks.instructions",
}


def names() -> list[str]:
    """The registered task names."""
    return list(TASK_MODULES)


def get(name: str) -> Task:
    """The task registered under `name` ("sql", "tool_calling" or "instructions")."""
    if name not in TASK_MODULES:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASK_MODULES)}")
    return importlib.import_module(TASK_MODULES[name]).TASK


__all__ = ["Task", "get", "names"]
