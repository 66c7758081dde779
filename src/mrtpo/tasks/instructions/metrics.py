"""What IFEval's and IFBench's evaluations report, from responses and their rows.

- prompt-level accuracy: the share of responses that follow every instruction of their row;
- instruction-level accuracy: the share of all instructions followed;
- each in strict mode (the response as it is; an empty one follows nothing) and loose mode (the
  response or one of its variants, `checkers.loose_variants`: without the first line, the last
  line or both, and without asterisks);
- per instruction id: how many there were and the share followed, strict and loose.

`mrtpo eval --task instructions` adds these to its headline and to eval.json.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from mrtpo.tasks.instructions.slots import row_constraint

PROMPT_LEVEL = "prompt-level strict accuracy"
INSTRUCTION_LEVEL = "instruction-level strict accuracy"
PROMPT_LEVEL_LOOSE = "prompt-level loose accuracy"
INSTRUCTION_LEVEL_LOOSE = "instruction-level loose accuracy"


def _share(flags: Sequence[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


def following_report(
    completions: Sequence[str],
    instruction_id_lists: Sequence[Sequence[str]],
    kwargs: Sequence[Any],
) -> dict[str, Any]:
    """The four accuracies and the per-id ones, for response `completions[i]` of a row with
    instructions `instruction_id_lists[i]` and their `kwargs[i]` (the `kwargs` column).

    Returns {"headline": {name: accuracy}, "per_instruction": {id: {"count", "strict",
    "loose"}}}, ids sorted.
    """
    if not len(completions) == len(instruction_id_lists) == len(kwargs):
        raise ValueError(
            f"need one row per completion: {len(completions)} completions, "
            f"{len(instruction_id_lists)} instruction lists, {len(kwargs)} kwargs"
        )
    prompts = {"strict": [], "loose": []}
    instructions = {"strict": [], "loose": []}
    by_id: dict[str, dict[str, list[bool]]] = defaultdict(lambda: {"strict": [], "loose": []})
    for response, ids, row_kwargs in zip(completions, instruction_id_lists, kwargs, strict=True):
        row = {"instruction_id_list": list(ids), "kwargs": row_kwargs}
        followed = {"strict": [], "loose": []}
        for index in range(len(ids)):
            constraint = row_constraint(row, index)
            assert constraint is not None  # index < len(ids)
            followed["strict"].append(constraint.check(response).score == 1.0)
            followed["loose"].append(constraint.follows_loose(response))
        for mode in ("strict", "loose"):
            prompts[mode].append(all(followed[mode]))
            instructions[mode] += followed[mode]
            for instruction_id, flag in zip(ids, followed[mode], strict=True):
                by_id[instruction_id][mode].append(flag)
    headline = {
        PROMPT_LEVEL: _share(prompts["strict"]),
        INSTRUCTION_LEVEL: _share(instructions["strict"]),
        PROMPT_LEVEL_LOOSE: _share(prompts["loose"]),
        INSTRUCTION_LEVEL_LOOSE: _share(instructions["loose"]),
    }
    per_instruction = {
        instruction_id: {
            "count": len(flags["strict"]),
            "strict": _share(flags["strict"]),
            "loose": _share(flags["loose"]),
        }
        for instruction_id, flags in sorted(by_id.items())
    }
    return {"headline": headline, "per_instruction": per_instruction}
