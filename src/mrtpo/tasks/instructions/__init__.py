"""Multi-constraint instruction following (IFEval's constraint set), one reward per constraint.

- `task`: `InstructionsTask` and `TASK`, what `mrtpo.tasks.get("instructions")` returns;
- `checkers`: IFEval's 25 instruction checkers (strict mode), each returning a `Verdict`;
- `slots`: `ConstraintSlot(k)`, the verifier for the k-th constraint of a row;
- `loader`: `load_ifeval(path)` for IFEval/IFBench-shaped JSONL (the bundled data too);
- bundled prompts: `src/mrtpo/data/instructions/{train,test}.jsonl`, made by
  `python scripts/build_data/instructions.py`.

Dataset columns: `prompt` (system + user messages), `key`, `instruction_id_list`, and `kwargs`
as a list of JSON strings, one per instruction: the kwargs dicts of different instructions have
different keys, which Arrow would merge into one struct and fill with nulls (see `loader`).

The data has no reference responses, so `reference_completion` is None and a supervised cold
start has nothing to train on for this task.
"""

from mrtpo.tasks.instructions.checkers import CHECKERS, Constraint, build_constraint
from mrtpo.tasks.instructions.loader import load_ifeval
from mrtpo.tasks.instructions.slots import ConstraintSlot
from mrtpo.tasks.instructions.task import (
    DATA_DIR,
    INSTRUCTION_LEVEL,
    MAX_BUNDLED_CONSTRAINTS,
    PROMPT_LEVEL,
    TASK,
    InstructionsTask,
)

__all__ = [
    "CHECKERS",
    "DATA_DIR",
    "INSTRUCTION_LEVEL",
    "MAX_BUNDLED_CONSTRAINTS",
    "PROMPT_LEVEL",
    "TASK",
    "Constraint",
    "ConstraintSlot",
    "InstructionsTask",
    "build_constraint",
    "load_ifeval",
]
