"""One reward per constraint: `ConstraintSlot(k)` checks the k-th constraint of each row.

Prompts carry different numbers of constraints while a trainer has a fixed list of reward
functions, so the task offers K slots. A row with fewer than k + 1 constraints gets score None
from slot k ("not applicable"), which the advantage code ignores.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from mrtpo.tasks.instructions.loader import decode_kwargs
from mrtpo.tasks.instructions.registry import Constraint, build_constraint
from mrtpo.verifiers import Verdict, Verifier


@functools.lru_cache(maxsize=8192)
def _constraint(instruction_id: str, kwargs_json: str) -> Constraint:
    return build_constraint(instruction_id, json.loads(kwargs_json))


def row_constraint(example: Mapping[str, Any], index: int) -> Constraint | None:
    """The `index`-th constraint of a dataset row, or None if the row has fewer."""
    ids = example.get("instruction_id_list")
    if not isinstance(ids, list | tuple):
        raise ValueError(f"example needs an instruction_id_list column, got {ids!r}")
    if index >= len(ids):
        return None
    kwargs = decode_kwargs(example.get("kwargs"), len(ids))[index]
    return _constraint(ids[index], json.dumps(kwargs, sort_keys=True))


class ConstraintSlot(Verifier):
    """Checks constraint `index` of each row (IFEval's or IFBench's, strict mode): 1.0, 0.0, or
    None."""

    def __init__(self, index: int) -> None:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"index must be an int >= 0, got {index!r}")
        self.index = index
        self.name = f"constraint_{index}"

    def verify(self, completion: str, example: Mapping[str, Any]) -> Verdict:
        constraint = row_constraint(example, self.index)
        if constraint is None:
            return Verdict(None, "")
        return self.judge(constraint, completion)

    def judge(self, constraint: Constraint, completion: str) -> Verdict:
        """The verdict on a row's constraint (strict mode; a subclass may judge otherwise)."""
        return constraint.check(completion)
