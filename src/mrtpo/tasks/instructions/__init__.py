"""Multi-constraint instruction following (IFEval's, IFBench's and MulDimIF's constraints), one reward per
constraint.

- `task`: `InstructionsTask` and `TASK`, what `mrtpo.tasks.get("instructions")` returns;
- `registry`: the constraint registry (`CHECKERS`, `IFBENCH_CHECKERS`, the `checker`
  decorator, argument parsers), `build_constraint` and `Constraint` (its `check` returns a
  `Verdict`), and the loose mode's response variants;
- `checkers`: IFEval's 25 instruction checkers, registered in `CHECKERS`;
- `ifbench_count`, `ifbench_sentences`, `ifbench_words`, `ifbench_format`, `ifbench_custom`:
  IFBench's 58 (`IFBENCH_CHECKERS`), with `ifbench_text`'s measurements;
- `muldimif`, `muldimif_checkers`: MulDimIF's layout (`load_muldimif(path)`) and its checkers
  (`MULDIMIF_CHECKERS`, one per (category, subtype), reading each constraint's words as the
  official evaluation reads them); `muldimif_metrics`: its accuracies by pattern, category and
  level;
- `slots`: `ConstraintSlot(k)`, the verifier for the k-th constraint of a row;
- `loader`: `load_ifeval(path)` and `load_ifbench(path)` for IFEval/IFBench-shaped JSONL (the
  bundled data too);
- `metrics`: what IFEval and IFBench report (prompt- and instruction-level accuracy, strict
  and loose, and per instruction id), as the benchmark `InstructionsTask.benchmark` gives;
- bundled prompts: `src/mrtpo/data/instructions/{train,test}.jsonl`, made by
  `python scripts/build_data/instructions.py`.

Dataset columns: `prompt` (system + user messages), `key`, `instruction_id_list`, and `kwargs`
as a list of JSON strings, one per instruction: the kwargs dicts of different instructions have
different keys, which Arrow would merge into one struct and fill with nulls (see `loader`).

The data has no reference responses, so `reference_completion` is None and a supervised cold
start has nothing to train on for this task.
"""

# Importing the checker modules registers their checkers.
from mrtpo.tasks.instructions import (  # noqa: F401
    checkers,
    ifbench_count,
    ifbench_custom,
    ifbench_format,
    ifbench_sentences,
    ifbench_words,
    muldimif_checkers,
)
from mrtpo.tasks.instructions.loader import load_ifbench, load_ifeval
from mrtpo.tasks.instructions.metrics import (
    INSTRUCTION_LEVEL_LOOSE,
    PROMPT_LEVEL_LOOSE,
    InstructionFollowingBenchmark,
    load_following_benchmark,
)
from mrtpo.tasks.instructions.muldimif import is_muldimif_file, load_muldimif
from mrtpo.tasks.instructions.registry import (
    CHECKERS,
    IFBENCH_CHECKERS,
    MULDIMIF_CHECKERS,
    Constraint,
    build_constraint,
)
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
    "IFBENCH_CHECKERS",
    "MULDIMIF_CHECKERS",
    "INSTRUCTION_LEVEL",
    "INSTRUCTION_LEVEL_LOOSE",
    "MAX_BUNDLED_CONSTRAINTS",
    "PROMPT_LEVEL",
    "PROMPT_LEVEL_LOOSE",
    "TASK",
    "Constraint",
    "ConstraintSlot",
    "InstructionFollowingBenchmark",
    "InstructionsTask",
    "build_constraint",
    "load_ifbench",
    "load_following_benchmark",
    "load_ifeval",
    "is_muldimif_file",
    "load_muldimif",
]
