"""The second plan's new-token cap (plan-2.json's `cap_rule`), decided after the pilot and stored
in `<state>/cap.json` beside the plan, which stays as it was stored (its state keeps the first
candidate, 256, as `max_completion_length`). Every later step reads the decision from cap.json.

1. The pilot's samples at the first candidate: `update_quality.py --state qwen_instructions
   --sample pilot --sample_only` (into `<state>/pilot/`: the pilot's prompts and seeds; no
   pass runs, so nothing is measured at a cap that may be dropped).
2. `--decide_cap --state qwen_instructions`: by the rule, the first candidate whose pilot has at
   most 20% of its responses at the cap. Where the last pilot sampled has more and a longer
   candidate is left, nothing is decided: the pilot is sampled again at that cap into its own
   folder (`--sample pilot --cap 384 --sample_only`: `<state>/pilot-cap384/`, the same prompts
   and seeds at the longer cap), then `--decide_cap` again (512 if every pilot has more). By
   hand instead: `--decide_cap --cap N --reason TEXT`, the reason stored with it.
3. The pilot is measured at the decided cap (`--sample pilot`: its samples are already in its
   folder), then `--power`, then the main sample at the same cap (`<state>/main/`).

A sample's `run.json` keeps the cap it was sampled at, and each sample file its own, so a
folder never mixes caps.

What a cut does to a verdict is measured, not assumed (`cap_effect`): a pilot sampled again at
a longer cap draws the same prompts with the same seeds, so a response cut at the shorter cap
has the same first tokens at the longer one; where it ends within the longer cap, each of its
constraints' verdict on the cut text is paired with the verdict on the whole response.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from update_quality_states import (
    ALL_STATES,
    CAP_FILE,
    PILOT_BATCHES,
    PLAN_2_STATES,
    capped,
    decided_cap,
    load_samples,
    read_json,
    sample_dir,
    state_dir,
    write_json,
)


def capped_share(samples: Mapping[int, Mapping[str, Any]], state: str) -> dict[str, Any] | None:
    """A sample's responses at their cap: {"mini_batches", "responses", "capped", "share"};
    None where nothing is sampled."""
    flags = [flag for record in samples.values() for flag in capped(record, state)]
    if not flags:
        return None
    count = sum(flags)
    return {
        "mini_batches": len(samples),
        "responses": len(flags),
        "capped": count,
        "share": count / len(flags),
    }


def _sampling(state: str, cap: int) -> str:
    return (
        f"update_quality.py --state {state} --sample pilot"
        + ("" if cap == ALL_STATES[state].max_completion_length else f" --cap {cap}")
        + " --sample_only"
    )


def pilot_shares(results: Path, state: str, rule: Mapping[str, Any]) -> dict[int, Any]:
    """Each candidate cap's pilot (sampled completely, at that cap): its `capped_share`."""
    shares = {}
    for cap in rule["candidates"]:
        samples = load_samples(results, state, "pilot", cap)
        if not samples:
            continue
        folder = sample_dir(results, state, "pilot", cap)
        if len(samples) < PILOT_BATCHES:
            raise SystemExit(
                f"{folder}: {len(samples)} of the pilot's {PILOT_BATCHES} mini-batches sampled: "
                f"finish it ({_sampling(state, cap)})"
            )
        other = {r.get("max_completion_length", cap) for r in samples.values()} - {cap}
        if other:
            raise SystemExit(f"{folder}: sampled at {sorted(other)} new tokens, not {cap}")
        shares[cap] = capped_share(samples, state)
    return shares


def decide_cap(
    results: Path,
    state: str,
    plan: Mapping[str, Any],
    cap: int | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """The cap by the plan's rule from the pilots sampled (the module's docstring), or `cap` by
    hand with its `reason`, written to `<state>/cap.json` and returned. Refused (SystemExit,
    with the command to run) where the rule needs a pilot not sampled yet, and where cap.json
    already holds another cap."""
    if state not in PLAN_2_STATES:
        raise SystemExit(
            f"{state}: its cap is stored in plan.json; --decide_cap is the second plan's"
        )
    rule = plan["cap_rule"]
    shares = pilot_shares(results, state, rule)
    if cap is not None:
        if not reason:
            raise SystemExit("--decide_cap --cap N is a decision by hand: give its --reason")
        decision: dict[str, Any] = {"cap": cap, "decided_by": "hand", "reason": reason}
    else:
        chosen = None
        for candidate in rule["candidates"]:
            share = shares.get(candidate)
            if share is None:
                raise SystemExit(
                    f"{state}: the rule needs the pilot at {candidate} new tokens: sample it "
                    f"({_sampling(state, candidate)}), then --decide_cap again"
                )
            if share["share"] <= rule["max_capped_share"]:
                chosen = candidate
                break
        decision = {
            "cap": chosen if chosen is not None else rule["candidates"][-1],
            "decided_by": "the plan's rule",
            "reason": None,
        }
    stored = read_json(state_dir(results, state) / CAP_FILE)
    if stored is not None and stored["cap"] != decision["cap"]:
        raise SystemExit(
            f"{state_dir(results, state) / CAP_FILE} holds cap {stored['cap']} "
            f"({stored['decided_by']}): every later step reads it; delete it to decide again, "
            "before the main sample is measured"
        )
    decision.update(state=state, rule=dict(rule), pilots={str(c): v for c, v in shares.items()})
    write_json(state_dir(results, state) / CAP_FILE, decision)
    return decision


def lane_cap(
    results: Path, state: str, sample: str, cap: int | None, sample_only: bool
) -> int | None:
    """The cap a run samples and measures at: the first plan's states their stored one (None);
    the second plan's pilot sampled alone at `cap` (default the stored first candidate); any
    measurement, and the main sample, at the decided one (cap.json), which `cap` may only
    repeat."""
    if state not in PLAN_2_STATES:
        if cap is not None:
            raise SystemExit(f"--cap is the second plan's: {state}'s cap is stored in plan.json")
        return None
    if sample_only and sample == "pilot":
        return cap if cap is not None else ALL_STATES[state].max_completion_length
    decided = decided_cap(results, state)
    if decided is None:
        raise SystemExit(
            f"{state}: the cap is not decided yet: sample the pilot ({_sampling(state, ALL_STATES[state].max_completion_length)}), "
            "then --decide_cap (update_quality_cap.py)"
        )
    if cap is not None and cap != decided:
        raise SystemExit(f"{state}: cap.json decided {decided} new tokens, not --cap {cap}")
    return decided


def slot_instructions(state: str) -> dict[str, list[str]]:
    """{a training row's user prompt: its constraint slots' instruction ids, slot k's k-th}, of
    the state's task data (reward `constraint_k` is slot k's verdict)."""
    from mrtpo import tasks

    spec = ALL_STATES[state]
    dataset = tasks.get(spec.task).load("train", path=spec.data)
    return {row["prompt"][-1]["content"]: list(row["instruction_id_list"]) for row in dataset}


def cap_effect(
    short: Mapping[int, Mapping[str, Any]],
    long: Mapping[int, Mapping[str, Any]],
    caps: tuple[int, int],
    instructions: Mapping[str, Sequence[str]],
) -> dict[str, Any]:
    """What the shorter cap does to each constraint's verdict: the responses of `short` (a
    pilot's samples, {mini-batch: record}) cut at its cap, paired with the same prompt and seed
    in `long` (the pilot sampled again at a longer cap); `caps`: (short's, long's). A pair
    counts where the longer response starts with the cut one's tokens (else "prefix_differs")
    and ends within its cap (else "cut_again"); each of its constraints (a slot with a verdict
    in both) is then kept, lost (the whole response satisfies it, the cut text does not) or
    gained (the reverse).
    Returns {"cut", "prefix_differs", "cut_again", "ended", "by_instruction": {id: {"pairs",
    "kept", "lost", "gained"}}}, instruction ids from `instructions` (`slot_instructions`)."""
    counts = {"cut": 0, "prefix_differs": 0, "cut_again": 0, "ended": 0}
    by_instruction: dict[str, dict[str, int]] = {}
    cap, longer = caps
    for batch, record in sorted(short.items()):
        other = long.get(batch)
        if other is None:
            continue
        for i, ids in enumerate(record["completion_ids"]):
            if len(ids) < cap:
                continue
            counts["cut"] += 1
            whole = other["completion_ids"][i]
            if list(whole[:cap]) != list(ids):
                counts["prefix_differs"] += 1
                continue
            if len(whole) >= longer:
                counts["cut_again"] += 1
                continue
            counts["ended"] += 1
            slots = instructions[record["prompts"][i][-1]["content"]]
            for k, instruction in enumerate(slots):
                cut_verdict, whole_verdict = record["rewards"][i][k], other["rewards"][i][k]
                if cut_verdict is None or whole_verdict is None:
                    continue
                if math.isnan(cut_verdict) or math.isnan(whole_verdict):
                    continue
                row = by_instruction.setdefault(
                    instruction, {"pairs": 0, "kept": 0, "lost": 0, "gained": 0}
                )
                row["pairs"] += 1
                if cut_verdict == whole_verdict:
                    row["kept"] += 1
                elif whole_verdict > cut_verdict:
                    row["lost"] += 1
                else:
                    row["gained"] += 1
    return {**counts, "by_instruction": dict(sorted(by_instruction.items()))}
