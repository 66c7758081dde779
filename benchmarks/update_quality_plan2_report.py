"""The second plan's report (`update_quality.py --report`): `plan-2-report.md` of a results
folder, from its files alone, beside the first plan's README.md. Whatever is not measured yet
says so: the state's pilot and power, its main sample, and the first plan's two states measured
again with folds, which live in the folder's `folds/` (a results folder of its own: the first
plan's committed samples and power.json copied there, then measured as usual with
`--results <folder>/folds`), so that the first plan's measures stay as they are.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from paired_stats import holm
from update_quality_analysis import (
    batch_measures,
    load_measures,
    per_estimator,
    primary_tests,
    reference_agreement,
)
from update_quality_cap import cap_effect, capped_share, slot_instructions
from update_quality_plan2 import ESTIMATORS_2, FOLDS_RESULTS, PLAN_2_STATES, deviations_2
from update_quality_plan2_analysis import (
    READINGS,
    pattern,
    plan_2_tests,
    reward_cosine_test,
    stored_plan_2,
)
from update_quality_references import record_mode
from update_quality_report import (
    _p,
    estimator_table,
    placebo_share_rows,
    reference_correlations,
)
from update_quality_states import (
    ALL_STATES,
    CAP_FILE,
    ESTIMATORS,
    POWER_FILE,
    PRIMARY_CONTRASTS,
    SAMPLES,
    STATES,
    load_samples,
    main_sample_size,
    read_json,
    state_dir,
)
from update_quality_weights import weight_summary

REPORT_2 = "plan-2-report.md"
NOT_YET = "not measured yet"
NO_MEMORY = (
    "not measured (memory): the rewards' own references were not kept (`--reward_references none`)"
)
# The second plan's estimators on the first plan's states (plan-2.json's "Secondary").
FIRST_STATES_NEW = (
    ("mrtpo(0.5)", "generic(0.5)"),
    ("generic(0.5)", "gdpo"),
    ("contrastive(0.5)", "mrtpo(0.5)"),
)


def _test_cell(test: Mapping[str, Any] | None) -> str:
    if test is None:
        return "–"
    return f"{test['mean']:+.4f} [{test['low']:+.4f}, {test['high']:+.4f}] (n = {test['n']})"


def _needed(batches: int | None) -> str:
    return "more than 10000" if batches is None else str(batches)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [_row(header), "|" + "---|" * len(header), *(_row(r) for r in rows)]


def tests_table(tests: Sequence[Mapping[str, Any]], corrected: bool) -> list[str]:
    """`plan_2_tests` as a table: the fold jackknife's estimate, interval (n: folds) and p,
    Holm's p where `corrected`, and the paired t over mini-batches beside them."""
    header = ["contrast", "estimate [fold-jackknife 95% interval]", "p"]
    header += ["Holm p", "significant"] if corrected else []
    header += ["paired t [95% interval], not counting the shared reference"]
    rows = []
    for test in tests:
        first, second = test["contrast"]
        if not test["measured"]:
            rows.append([f"{first} - {second}", NOT_YET, *["–"] * (len(header) - 2)])
            continue
        cells = [f"{first} - {second}", _test_cell(test["test"])]
        cells.append(_p(test["test"]["p"]) if test["test"] else "–")
        if corrected:
            cells += [_p(test["holm_p"]), "yes" if test["significant"] else "no"]
        rows.append([*cells, _test_cell(test["paired"])])
    return _table(header, rows)


# ----------------------------------------------------------------------------- the new state


def power_lines(power: Mapping[str, Any] | None) -> list[str]:
    """The pilot and the main sample's size, from power.json."""
    if power is None:
        return [f"Pilot and power: {NOT_YET}.", ""]
    lines = [
        f"**Pilot and power** ({power['pilot_batches']} mini-batches of other prompts, "
        f"{power['folds']} folds): gdpo's mean cosine {power['gdpo_mean_cosine']:+.4f}; effect "
        f"to detect {power['effect']:.4f} at alpha {power['alpha']:.4f} (two-sided, the fold "
        f"jackknife's t, the pilot's standard error scaled to n mini-batches), power "
        f"{power['power']}:",
        "",
    ]
    header = ["contrast", "pilot mean difference", "fold-jackknife SE"]
    header += ["mini-batches for the effect", "for the pilot's difference"]
    header += [f"power at {power['batches']}"]
    rows = [
        [
            name,
            f"{c['difference_mean']:+.4f}",
            f"{c['jackknife_se']:.4f}",
            _needed(c["needed_batches"]),
            _needed(c["needed_batches_at_pilot_difference"]),
            f"{c['power_at_batches']:.2f}",
        ]
        for name, c in power["contrasts"].items()
    ]
    lines += [*_table(header, rows), ""]
    cost, caps = power["cost"], power["caps"]
    if cost is None:
        spent = "the pilot's cost not recorded (no budget cap)"
    else:
        stages = " / ".join(f"{stage} {s:.0f}" for stage, s in cost["cpu_seconds"].items())
        spent = (
            f"the pilot's {cost['per_batch']:.0f} CPU seconds per mini-batch (of "
            f"{cost['total_cpu_seconds']:.0f} in all: {stages}), "
            f"so the budget of {power['budget_cpu_hours']:g} CPU-hours allows {caps['budget']}"
        )
    named = ", ".join(f"{k} {v}" for k, v in caps.items() if v is not None) or "none"
    hours = power["main_cpu_hours"]
    lines += [
        f"Size: {spent}; caps: {named}. By {power['sizing_contrast']}: "
        f"{_needed(power['needed_batches'])} mini-batches needed; the main sample's size "
        f"{power['batches']} (power {power['power_at_batches']:.2f}"
        + (f", about {hours:.1f} CPU-hours" if hours is not None else "")
        + ").",
        "",
    ]
    return lines


def cap_lines(results: Path, state: str, plan: Mapping[str, Any]) -> list[str]:
    """The share of responses at the new-token cap: each pilot sampled (one per candidate cap
    the rule reached) and the main sample; then the decision stored in cap.json."""
    decision = read_json(state_dir(results, state) / CAP_FILE)
    rule = plan["cap_rule"]
    rows = []
    pilots = {cap: load_samples(results, state, "pilot", cap) for cap in rule["candidates"]}
    for cap, samples in pilots.items():
        share = capped_share(samples, state)
        if share is not None or cap == rule["candidates"][0]:
            rows.append([f"pilot at {cap}", *_share_cells(share)])
    main = decision["cap"] if decision else ALL_STATES[state].max_completion_length
    samples, size = load_samples(results, state, "main"), main_sample_size(results, state)
    share = capped_share(samples, state)
    label = f"main at {main}"
    if samples and size is None:
        label += f" ({len(samples)} mini-batches sampled ahead of the power step)"
    rows.append([label, *_share_cells(share)])
    lines = [*_table(["sample", "responses", "at the cap"], rows), ""]
    if share is not None and share["share"] > rule["max_capped_share"]:
        lines += [
            f"The main sample has more than the rule's {rule['max_capped_share']:.0%} at the cap: "
            "the rule is applied to the pilot alone, and the main sample keeps the decided cap "
            "(the plan); its share is reported as it is.",
            "",
        ]
    sampled = [cap for cap, samples in pilots.items() if samples]
    for short, long in itertools.pairwise(sampled):
        lines += cut_lines(
            cap_effect(pilots[short], pilots[long], (short, long), slot_instructions(state)),
            short,
            long,
        )
    if decision is None:
        how = f"not decided yet (no `{state}/{CAP_FILE}`: `--decide_cap` once the pilot is sampled)"
    elif decision["decided_by"] == "hand":
        how = f"**{decision['cap']}** new tokens, decided by hand: {decision['reason']}"
    else:
        how = (
            f"**{decision['cap']}** new tokens, by the plan's rule (the first of "
            f"{', '.join(map(str, rule['candidates']))} whose pilot has at most "
            f"{rule['max_capped_share']:.0%} of its responses at the cap; the last if none)"
        )
    return [*lines, f"The cap ({state}/{CAP_FILE}): {how}.", ""]


def cut_lines(effect: Mapping[str, Any], short: int, long: int) -> list[str]:
    """What the cap at `short` did to the verdicts (`update_quality_cap.cap_effect`): the cut
    responses that end within `long`, each constraint's verdict on the cut text against the
    whole response's, per instruction id."""
    rows = [
        [name, str(c["pairs"]), str(c["kept"]), str(c["lost"]), str(c["gained"])]
        for name, c in effect["by_instruction"].items()
    ]
    total = {
        key: sum(c[key] for c in effect["by_instruction"].values())
        for key in ("pairs", "kept", "lost", "gained")
    }
    head = (
        f"What the cap at {short} does to a verdict (the pilot at {long}: the same prompts and "
        f"seeds): of the {effect['cut']} responses cut at {short}, {effect['ended']} end within "
        f"{long} with the cut text as their start ({effect['cut_again']} are cut again, "
        f"{effect['prefix_differs']} start otherwise). Their {total['pairs']} (response, "
        f"constraint) verdicts on the cut text against the whole response: {total['kept']} "
        f"the same, {total['lost']} failed on the cut text and satisfied by the whole, "
        f"{total['gained']} the reverse."
    )
    header = ["instruction", "verdicts", "the same", "lost to the cut", "gained by the cut"]
    return [head, "", *(_table(header, rows) if rows else []), ""]


def _share_cells(share: Mapping[str, Any] | None) -> list[str]:
    if share is None:
        return [NOT_YET, "–"]
    return [str(share["responses"]), f"{share['capped']} ({share['share']:.1%})"]


def reading_lines(
    tests: Sequence[Mapping[str, Any]],
    generic: Mapping[str, Any] | None,
    power: Mapping[str, Any] | None,
    values: Mapping[str, Any],
    shares: str,
    measured: tuple[int, int] | None = None,
) -> list[str]:
    """The readings the plan fixed, the one each contrast's outcome selects. measured: the
    main sample's (mini-batches measured, planned); the plan reads the whole sample only."""
    if any(t["test"] is None for t in tests):
        return [f"No reading yet: the main sample's primary tests are {NOT_YET}.", ""]
    if measured is not None and measured[0] < measured[1]:
        return [
            f"No reading yet: the main sample is measured in part ({measured[0]} of "
            f"{measured[1]} mini-batches); the plan's reading is applied to the whole sample only.",
            "",
        ]
    effect = None if power is None else power["effect"]
    chosen = pattern(tests, generic, effect)
    dose = ", ".join(
        f"{name} {np.mean(values[name]['cosine']):+.4f}"
        for name in ("gdpo", "mrtpo(0.5)", "mrtpo(1)")
    )
    lines = []
    for test, role in zip(tests, ("gdpo", "placebo", "contrastive"), strict=True):
        first, second = test["contrast"]
        t = test["test"]
        sign = {"above": "above", "below": "below", "none": "not different from"}.get(
            chosen[role], "not above"
        )
        if chosen[role] == "not above" and t["mean"] < 0 and test["significant"]:
            sign = "below"
        reading = READINGS[role, chosen[role]].format(dose=dose, shares=shares)
        lines.append(
            f"- {first} {sign} {second} ({t['mean']:+.4f} [{t['low']:+.4f}, {t['high']:+.4f}], "
            f"Holm p {_p(test['holm_p'])}): {reading}."
        )
    if "generic" in chosen:
        g = generic
        lines.append(
            f"- Secondary: mrtpo(0.5) - generic(0.5) {g['mean']:+.4f} [{g['low']:+.4f}, "
            f"{g['high']:+.4f}], width {g['high'] - g['low']:.4f} against the effect "
            f"{effect:.4f}: {READINGS['generic', chosen['generic']]}."
        )
    else:
        lines.append(f"- Secondary: mrtpo(0.5) - generic(0.5) {NOT_YET} (or no power.json).")
    return [*lines, ""]


def reward_cosine_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per estimator and reward: the mean cosine with that reward's reference and its interval:
    the fold jackknife's (n: folds; "–" where a reward's reference is not defined on every
    deletion), or, where the rewards' references were kept whole, the paired t's over
    mini-batches; not measured where they were not kept."""
    if not records:
        return ["Cosine with each reward's reference (main sample):", "", NOT_YET, ""]
    mode = record_mode(records[0])
    if mode == "none":
        return [f"Cosine with each reward's reference (main sample): {NO_MEMORY}.", ""]
    interval = {
        "per_fold": "fold-jackknife intervals",
        "whole": "paired t intervals over mini-batches, which do not count the shared "
        "reference: the rewards' references were kept whole (`--reward_references whole`)",
    }[mode]
    names = records[0]["reward_names"]
    rows = [
        [name, *(_test_cell(reward_cosine_test(records, name, k)) for k in range(len(names)))]
        for name in ESTIMATORS_2
    ]
    intro = f"Cosine with each reward's reference (main sample; {interval}):"
    return [intro, "", *_table(["estimator", *names], rows), ""]


def placebo_lines(results: Path, state: str, samples: Mapping[str, Any]) -> list[str]:
    """What the placebo replayed (shares equal or empty) and the rewards' references' cosines."""
    header = ["sample", "reward", "replayed pairs", "equal", "empty", "equal or empty"]
    rows = [
        row[1:] for sample in SAMPLES for row in placebo_share_rows(results, state, sample) or []
    ]
    lines = ["Replayed (row, reward) pairs whose placebo text equals the own or is empty:", ""]
    lines += [*(_table(header, rows) if rows else [NOT_YET]), ""]
    lines += ["Cosine between the rewards' references (per mini-batch: mean, range):", ""]
    references = [
        [sample, str(len(records)), "; ".join(reference_correlations(records)) or NO_MEMORY]
        for sample in SAMPLES
        if (records := samples.get(sample)) and len(records[0]["reward_names"]) > 1
    ]
    table = _table(["sample", "mini-batches", "reward pairs"], references)
    return [*lines, *(table if references else [NOT_YET]), ""]


def shares_text(results: Path, state: str) -> str:
    """The main sample's share of replayed pairs whose placebo is no other information."""
    rows = placebo_share_rows(results, state, "main")
    if not rows:
        return "the placebo's shares not measured yet"
    overall = rows[0]
    return f"the placebo equals the own text or is empty in {overall[6]} of {overall[3]} pairs"


def state_lines(results: Path, state: str, plan: Mapping[str, Any]) -> list[str]:
    """The second plan's state: power, cap, samples, primary and secondary tests, reading."""
    power = read_json(state_dir(results, state) / POWER_FILE)
    samples = load_measures(results, [state]).get(state, {})
    lines = [f"## {state}", "", *power_lines(power), "### The new-token cap", ""]
    lines += cap_lines(results, state, plan)
    for sample in SAMPLES:
        records = samples.get(sample)
        if not records:
            lines += [f"### {sample}: {NOT_YET}", ""]
            continue
        planned = records[0]["sample_batches"]
        status = "" if len(records) >= planned else f" (interim: {len(records)} of {planned})"
        lines += [f"### {sample}: {len(records)} mini-batches{status}", ""]
        lines += [estimator_table(records, ESTIMATORS_2), ""]
    records = samples.get("main", [])
    primary = plan_2_tests(records, plan["primary_contrasts"], plan["alpha"])
    secondary = plan_2_tests(records, plan["secondary_contrasts"])
    family = f"Holm over the {len(primary)}, family-wise alpha {plan['alpha']}"
    lines += [f"### Primary contrasts ({family}; the main sample)", ""]
    lines += [*tests_table(primary, corrected=True), "", "### Reading (fixed in advance)", ""]
    values = per_estimator(records, estimators=ESTIMATORS_2) if records else {}
    generic = next(t["test"] for t in secondary if t["contrast"] == ("mrtpo(0.5)", "generic(0.5)"))
    measured = (len(records), records[0]["sample_batches"]) if records else None
    shares = shares_text(results, state)
    lines += reading_lines(primary, generic, power, values, shares, measured)
    lines += ["### Secondary contrasts (uncorrected; the main sample)", ""]
    lines += [*tests_table(secondary, corrected=False), ""]
    lines += reward_cosine_lines(records)
    lines += ["### What the placebo replayed", "", *placebo_lines(results, state, samples)]
    return [*lines, "### The weights (main sample)", "", *weight_lines(records)]


def weight_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The weight statistics (`update_quality_weights`) per variant and reward: mean over the
    mini-batches [min, max], at beta 1."""
    if not any("weights" in r for r in records):
        return [f"The weights' effective share of tokens and their entropy overlap: {NOT_YET}.", ""]
    names = records[0]["reward_names"]
    lines = []
    for statistic, title in (
        ("effective_share", "Effective share of tokens, (sum w)^2 / (T sum w^2)"),
        (
            "entropy_overlap",
            "Share of the top-fifth weighted tokens among the top-fifth entropy ones",
        ),
    ):
        summary = weight_summary(records, statistic)
        rows = [
            [variant, *(_range_cell(cell) for cell in cells)] for variant, cells in summary.items()
        ]
        lines += [f"{title} (mean over mini-batches [range], beta 1):", ""]
        lines += [*_table(["variant", *names], rows), ""]
    return lines


def _range_cell(cell: tuple[float, float, float, int] | None) -> str:
    return "–" if cell is None else f"{cell[0]:.2f} [{cell[1]:.2f}, {cell[2]:.2f}]"


# ----------------------------------------------------------------------------- first plan


def first_plan_lines(results: Path) -> list[str]:
    """The first plan's primary contrasts: the pre-registered tests (paired t, Holm over the
    6) beside the fold jackknife's on the same states measured again with folds
    (`FOLDS_RESULTS`), and the second plan's estimators there."""
    measured_first = load_measures(results)
    measured = primary_tests(measured_first)
    again = load_measures(Path(results) / FOLDS_RESULTS)
    header = [
        "state",
        "contrast",
        "pre-registered: mean [95% paired t]",
        "Holm p (the first plan's tests)",
    ]
    header += [
        "measured again: fold jackknife [95% interval] (n: folds)",
        "p",
        "Holm p (fold jackknife)",
    ]
    rows, new, weights, progress, reproduced = [], [], [], [], []
    jackknife_p = {}  # row: the fold jackknife's p, for Holm over the same tests as the first plan
    for state in STATES:
        records = again.get(state, {}).get("main", [])
        progress.append(_progress(state, records))
        first = measured_first.get(state, {}).get("main", [])
        reproduced.append(_reproduction(state, first, records))
        folded = plan_2_tests(records, PRIMARY_CONTRASTS)
        for contrast, test in zip(PRIMARY_CONTRASTS, folded, strict=True):
            pre = next(
                (t for t in measured if t["state"] == state and t["contrast"] == contrast), None
            )
            cells = [state, " - ".join(contrast)]
            cells += [_test_cell(pre["test"]), _p(pre["holm_p"])] if pre else [NOT_YET, "–"]
            jack = test["test"]
            cells += [_test_cell(jack), _p(jack["p"])] if jack else [NOT_YET, "–"]
            if jack:
                jackknife_p[len(rows)] = jack["p"]
            rows.append(cells)
        for test in plan_2_tests(records, FIRST_STATES_NEW):
            jack = test["test"]
            cells = [state, " - ".join(test["contrast"])]
            new.append(
                [*cells, _test_cell(jack), _p(jack["p"])] if jack else [*cells, NOT_YET, "–"]
            )
        weights += [f"{state} (main sample):", "", *weight_lines(records)]
    adjusted = holm(jackknife_p)
    for row, cells in enumerate(rows):
        cells.append(_p(adjusted[row]) if row in adjusted else "–")
    return [
        "## The first plan's states, measured again with folds",
        "",
        "The first plan's primary contrasts with the intervals it pre-registered (which stay as "
        "they were) and, beside them, with fold-jackknife intervals from the same committed "
        f"samples measured again with folds (`{FOLDS_RESULTS}/`):",
        "",
        f"Measured again so far: {'; '.join(progress)}.",
        "",
        "How closely the same samples measured again reproduce the first plan's cosines (the "
        "largest absolute difference over each of its estimators on each mini-batch measured "
        f"in both): {'; '.join(reproduced)}.",
        "",
        "The last column: Holm's correction over the fold-jackknife tests of the first plan's "
        f"six measured so far ({len(jackknife_p)}), as the first plan's over its own.",
        "",
        *_table(header, rows),
        "",
        "The second plan's estimators on them (fold jackknife, uncorrected):",
        "",
        *_table(["state", "contrast", "fold jackknife [95% interval] (n: folds)", "p"], new),
        "",
        "The weights there:",
        "",
        *weights,
    ]


def _count(records: Sequence[Mapping[str, Any]]) -> str:
    """A sample's mini-batches measured, and of how many where it is not complete."""
    planned = records[0]["sample_batches"]
    return f"{len(records)}" if len(records) >= planned else f"{len(records)} of {planned}"


def agreement_lines(results: Path) -> list[str]:
    """Exploratory, added after the plan: per state and sample measured with folds, how much
    its reference agrees with itself across folds (`reference_agreement`), beside gdpo's mean
    cosine with it."""
    sources = [(results, PLAN_2_STATES, "")]
    sources.append((Path(results) / FOLDS_RESULTS, STATES, f" (`{FOLDS_RESULTS}/`)"))
    rows = []
    for folder, states, where in sources:
        for state in states:
            for sample, records in load_measures(folder, [state]).get(state, {}).items():
                agreement = reference_agreement(records)
                if agreement is None:
                    continue
                gdpo = np.mean(per_estimator(records, estimators=["gdpo"])["gdpo"]["cosine"])
                rows.append(
                    [
                        f"{state}{where}",
                        f"{sample} ({_count(records)})",
                        str(agreement["pairs"]),
                        f"{agreement['mean']:+.3f} (sd {agreement['sd']:.3f}; "
                        f"{agreement['min']:+.3f} to {agreement['max']:+.3f})",
                        f"{agreement['ceiling']:.2f}",
                        f"{gdpo:+.3f}",
                    ]
                )
    header = ["state", "sample (mini-batches)", "fold pairs", "mean cosine between two folds' "
              "parts (sd; range)", "ceiling", "gdpo's mean cosine"]  # fmt: skip
    return [
        "## How much each state's reference agrees with itself (exploratory)",
        "",
        "Added after the plan (2026-12-07), not one of its tests. Each mini-batch's reference "
        "is kept in folds of other mini-batches; the cosine between two folds' parts says how "
        "much of the summed reward's policy gradient one group of prompts shares with another. "
        "Near 0, every estimator's cosine with the reference is near 0 whatever the estimator, "
        "and the endpoint cannot tell estimators apart. Ceiling: the cosine with the whole "
        "reference of a direction that is exactly what the folds share (sqrt(F c / (1 + "
        "(F - 1) c)) at the mean agreement c, the folds taken as equal).",
        "",
        *(_table(header, rows) if rows else [f"No state measured with folds: {NOT_YET}."]),
        "",
    ]


def _reproduction(
    state: str, first: Sequence[Mapping[str, Any]], again: Sequence[Mapping[str, Any]]
) -> str:
    """The largest difference between the first plan's cosine and the re-measurement's, over
    the first plan's estimators and the mini-batches measured in both (the same samples: they
    differ by the rounding of the machine that rebuilt the policy)."""
    by_batch = {r["batch"]: r for r in first}
    pairs = [(by_batch[r["batch"]], r) for r in again if r["batch"] in by_batch]
    if not pairs:
        return f"{state} {NOT_YET}"
    names = [e for e in ESTIMATORS if all(ESTIMATORS[e][0] in a["directions"] for a, _ in pairs)]
    largest = max(
        abs(
            batch_measures(a, name, a["sample_batches"])["cosine"]
            - batch_measures(b, name, b["sample_batches"])["cosine"]
        )
        for a, b in pairs
        for name in names
    )
    return (
        f"{state} largest difference {largest:.1e} over {len(pairs)} mini-batches x "
        f"{len(names)} estimators"
    )


def _progress(state: str, records: Sequence[Mapping[str, Any]]) -> str:
    """How much of a re-measured state's main sample is in: interim numbers say so."""
    if not records:
        return f"{state} {NOT_YET}"
    planned = records[0]["sample_batches"]
    done = f"{state} {len(records)} of {planned} mini-batches"
    return done if len(records) >= planned else f"{done} (interim numbers below)"


def write_plan_2_report(results: Path) -> Path:
    """`plan-2-report.md` of the results folder, from the results files alone."""
    results = Path(results)
    plan = stored_plan_2(results)
    lines = [
        "# Whose information moves the step? (update quality, the second plan)",
        "",
        "Generated by `python benchmarks/update_quality.py --report` from the files in this "
        f"folder: `plan-2.json` (its text `plan-2.md`), the second plan's state, and `{FOLDS_RESULTS}/` "
        "(the first plan's states measured again with folds). The first plan's report is "
        "`README.md`.",
        "",
        *deviations_2(),
    ]
    for state in PLAN_2_STATES:
        lines += state_lines(results, state, plan)
    lines += first_plan_lines(results)
    lines += agreement_lines(results)
    path = results / REPORT_2
    path.write_text("\n".join(lines))
    return path
