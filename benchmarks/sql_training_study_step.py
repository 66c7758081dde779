"""The SQL training study's item 2 (issue #47): the step measured again at one of the study's
own policies, gdpo seed 0 after 10 steps, with the update-quality benchmark (its checkpoint
state `qwen_sql_gdpo_seed0_step10`: 9 mini-batches drawn fresh from that policy on the first
plan's qwen_sql main sample's prompts, grpo, gdpo and mrtpo at beta 0.25, 0.5 and 1, the summed
reward's reference in 3 folds), results in the study's `step-at-10/`. Does MRTPO's advantage in
the step persist once the format is partly learned?

Its section of the study's report (`sql_training_study_report.write_report`), from the files
alone: per estimator the mean cosine with the policy gradient of the summed reward (95%
fold-jackknife interval), mrtpo(0.5) - gdpo and mrtpo(1) - gdpo (fold jackknife, the paired t
over mini-batches beside it), the first-order gain of mrtpo's clipped step over gdpo's, the
share of responses at the cap and the mean rewards of the fresh samples; beside each, the first
plan's committed qwen_sql main sample at the untrained policy (`benchmarks/results/
update-quality/`: measured without folds, so its intervals are the paired t's over
mini-batches). Every statistic is the benchmark's (`update_quality_analysis`,
`update_quality_plan2_analysis.plan_2_tests`); this file only reads and lays them out.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import convergence_runs  # noqa: E402
from paired_stats import paired_t  # noqa: E402
from update_quality_analysis import (  # noqa: E402
    fold_interval,
    load_measures,
    mean_cosine,
    mean_ratio,
    per_estimator,
)
from update_quality_cap import capped_share  # noqa: E402
from update_quality_plan2_analysis import plan_2_tests, sample_cost  # noqa: E402
from update_quality_plan2_report import _row, _test_cell  # noqa: E402
from update_quality_report import _p, reward_means  # noqa: E402
from update_quality_states import (  # noqa: E402
    CHECKPOINT_STATES,
    RUN_FILE,
    load_samples,
    read_json,
    sample_dir,
    state_estimators,
)

STEP_STATE = "qwen_sql_gdpo_seed0_step10"  # update_quality.py --state
STEP_RESULTS = "step-at-10"  # update_quality.py --results: in the study's results folder
UNTRAINED_STATE = "qwen_sql"  # the first plan's, at the untrained policy
UPDATE_QUALITY = HERE / "results" / "update-quality"  # the first plan's committed results
CONTRASTS = (("mrtpo(0.5)", "gdpo"), ("mrtpo(1)", "gdpo"))
NOT_YET = "not measured yet"
COMMAND = "benchmarks/README.md, section 'SQL training study'"


def step_results(results: Path) -> Path:
    """Where item 2's measurement lives in the study's results folder."""
    return Path(results) / STEP_RESULTS


def measured(results: Path, state: str) -> tuple[list[dict[str, Any]], dict[int, Any]]:
    """A state's main sample in a results folder: (its measures, by mini-batch; its samples)."""
    records = load_measures(results, [state]).get(state, {}).get("main", [])
    return records, load_samples(results, state, "main")


# ----------------------------------------------------------------------------- the tables


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A table, its first column left and the others right (numbers)."""
    return [_row(header), "|---|" + "---:|" * (len(header) - 1), *(_row(r) for r in rows)]


def sample_row(label: str, samples: Mapping[int, Any], state: str, rewards: int) -> list[str]:
    """A sample's size, its responses at the cap and its mean rewards (each of `rewards`, and
    summed)."""
    share = capped_share(samples, state)
    if share is None:
        return [label, NOT_YET, *["–"] * (rewards + 2)]
    means = reward_means(list(samples.values()))
    capped = f"{share['capped']} of {share['responses']} ({share['share']:.1%})"
    return [
        label,
        str(share["mini_batches"]),
        capped,
        *(f"{value:.3f}" for value in means.values()),
        f"{sum(means.values()):.3f}",
    ]


def cosine_rows(
    step: Sequence[Mapping[str, Any]], untrained: Sequence[Mapping[str, Any]]
) -> list[list[str]]:
    """Per estimator: the mean cosine after 10 steps (fold jackknife) and untrained (paired t
    over its mini-batches: measured without folds)."""
    rows = []
    for name in state_estimators(STEP_STATE):
        cosine = mean_cosine(name)
        interval = fold_interval(step, cosine) if step else None
        values = per_estimator(untrained, estimators=[name])[name]["cosine"] if untrained else []
        rows.append(
            [
                name,
                _test_cell(interval) if interval else f"{cosine(step):+.4f}" if step else "–",
                _test_cell(paired_t(values)) if len(values) > 1 else "–",
            ]
        )
    return rows


def contrast_rows(
    after: Sequence[Mapping[str, Any]], before: Sequence[Mapping[str, Any]]
) -> list[list[str]]:
    """mrtpo(beta) - gdpo (`plan_2_tests` of CONTRASTS): after 10 steps the fold jackknife and
    the paired t beside it; untrained (`before`) the paired t."""
    rows = []
    for test, old in zip(after, before, strict=True):
        first, second = test["contrast"]
        jackknife = test["test"]
        rows.append(
            [
                f"{first} - {second}",
                _test_cell(jackknife),
                _p(jackknife["p"]) if jackknife else "–",
                _test_cell(test["paired"]),
                _test_cell(old["paired"]),
                _p(old["paired"]["p"]) if old["paired"] else "–",
            ]
        )
    return rows


def gain_rows(
    step: Sequence[Mapping[str, Any]], untrained: Sequence[Mapping[str, Any]]
) -> list[list[str]]:
    """Each mrtpo's mean first-order gain of the clipped step over gdpo's: after 10 steps with
    its fold-jackknife interval, untrained the point (`mean_ratio`)."""
    rows = []
    for name, (variant, _) in state_estimators(STEP_STATE).items():
        if variant != "mrtpo":
            continue
        ratio = mean_ratio("gain", name, "gdpo")
        interval = fold_interval(step, ratio) if step else None
        rows.append(
            [
                f"{name} / gdpo",
                _ratio_cell(interval) if interval else f"{ratio(step):.3f}" if step else "–",
                f"{ratio(untrained):.3f}" if untrained else "–",
            ]
        )
    return rows


def _ratio_cell(test: Mapping[str, Any]) -> str:
    return f"{test['mean']:.3f} [{test['low']:.3f}, {test['high']:.3f}] (n = {test['n']})"


def reading(after: Sequence[Mapping[str, Any]], before: Sequence[Mapping[str, Any]]) -> str:
    """Per contrast (`contrast_rows`' tests), where its fold-jackknife interval after 10 steps
    lies against 0, beside the untrained mean (descriptive: item 2 names no test in advance)."""
    lines = []
    for test, old in zip(after, before, strict=True):
        first, second = test["contrast"]
        jackknife = test["test"]
        if jackknife is None:
            continue
        if jackknife["low"] > 0:
            where = "above 0: the advantage persists"
        elif jackknife["high"] < 0:
            where = "below 0: the advantage is reversed"
        else:
            where = "not distinguished from 0"
        before = f"; untrained {old['paired']['mean']:+.4f}" if old["paired"] else ""
        lines.append(
            f"- {first} - {second} after 10 steps: {jackknife['mean']:+.4f}, its fold-jackknife "
            f"interval {where}{before}."
        )
    return "\n".join(lines)


def provenance(results: Path) -> str:
    """The measurement's policy digest and cost, from its run.json (`sample_cost`), and how
    the policy came to the measuring machine (`rebuilt`); `results`: the study's folder."""
    run = read_json(sample_dir(step_results(results), STEP_STATE, "main") / RUN_FILE)
    cost = sample_cost(run, CHECKPOINT_STATES[STEP_STATE].batches)
    if cost is None:
        return ""
    stages = cost["cpu_seconds"]
    spent = " / ".join(f"{stages.get(stage, 0.0):.0f}" for stage in ("sample", "reference", "measure"))  # fmt: skip
    sessions = [session for info in run["lanes"].values() for session in info["sessions"]]
    commits = sorted({(session.get("commit") or "?")[:10] for session in sessions})
    peak = max(info.get("peak_rss_mb", 0.0) for info in run["lanes"].values()) / 1024
    return (
        f"Policy sha256 `{(run.get('policy_sha256') or 'not recorded')[:16]}`; CPU s sample / "
        f"reference / measure {spent} ({cost['total_cpu_seconds'] / 3600:.2f} CPU-hours); peak "
        f"RSS {peak:.1f} GB; commit(s) {', '.join(commits)}.{rebuilt(results)}"
    )


def rebuilt(results: Path) -> str:
    """How the policy came to the measuring machine where it was trained again
    (`sql_training_study.py --rebuild_kept_policy`, its record `rebuild.json`), else ""."""
    record = read_json(step_results(results) / "rebuild.json")
    if not record:
        return ""
    said = f" The policy was trained again on the measuring machine ({record['run']}, stopped after step {record['step']}, {record['threads']} thread(s)):"  # fmt: skip
    first = record.get("first_difference")
    if first is None and record.get("identical_steps") == record["step"]:
        return f"{said} every value its steps 1-{record['step']} logged equals the study run's (the step time aside)."  # fmt: skip
    if first is None:
        return f"{said} it logged {record['steps_logged']} of {record['step']} steps."
    rounding = rounding_only(results, record)
    if rounding:
        return (
            f"{said} its logged values first differ at step {first['step']} ({first['key']}: "
            f"{first['run']!r} in the study run, {first['rebuilt']!r} rebuilt), by rounding only: "
            f"{rounding}, so it drew the same responses and is the study run's policy up to "
            "rounding."
        )
    return (
        f"{said} it is not the study run's policy: its logged values first differ at step "
        f"{first['step']} ({first['key']}: {first['run']!r} in the study run, {first['rebuilt']!r} "
        "rebuilt), so the measurement is of a GDPO policy after 10 steps of the same data."
    )


# Two CPUs' rounding of one run's 10 steps moved a logged float by at most 2.3e-6 of itself (the
# gradient norm, AMD against Intel); a policy that drew other responses differs in a reward.
ROUNDING = 1e-5
EXACT = ("completions/", "num_tokens")  # counts: equal, or another sample


def exact(key: str) -> bool:
    """A logged value that rounding cannot move: a reward's mean over a step's responses (a
    sum of 0/1 checks), a length or a token count."""
    return key == "reward" or key.startswith(EXACT) or (key.startswith("rewards/") and key.endswith("/mean"))  # fmt: skip


def rounding_only(results: Path, record: Mapping[str, Any]) -> str:
    """Where the rebuild's logged steps (its scratch run's metrics.jsonl) differ from the study
    run's by rounding only: every reward's mean, length and token count equal at every step and every
    other value (a spread, an entropy, a gradient norm) within `ROUNDING` of itself, the
    largest named; else ""."""
    method, _, seed = record["run"].partition(" seed ")
    where = Path("sql") / method / f"seed{seed}" / convergence_runs.METRICS_FILE
    study, rebuilt = (convergence_runs.read_metrics(folder / where) for folder in (Path(results) / "study", step_results(results) / "rebuild"))  # fmt: skip
    if len(study) < record["step"] or len(rebuilt) < record["step"]:
        return ""
    largest, named = 0.0, ""
    for theirs, mine in zip(study[: record["step"]], rebuilt[: record["step"]], strict=True):
        for key in sorted(set(theirs) | set(mine)):
            a, b = theirs.get(key), mine.get(key)
            if key == "step_time" or a == b:
                continue
            if exact(key) or not isinstance(a, float) or not isinstance(b, float):
                return ""
            relative = abs(a - b) / max(abs(a), abs(b))
            if not relative <= ROUNDING:  # a NaN on either side is not rounding
                return ""
            if relative > largest:
                largest, named = relative, key
    return (
        f"over steps 1-{record['step']} every reward's mean, length and token count equals the study "
        f"run's and no other value differs by more than {largest:.1e} of itself ({named})"
    )


def step_section(results: Path, untrained_results: Path = UPDATE_QUALITY) -> str:
    """The report's section on item 2 (the module's docstring), from the files alone."""
    state = CHECKPOINT_STATES[STEP_STATE]
    step, step_samples = measured(step_results(results), STEP_STATE)
    untrained, untrained_samples = measured(untrained_results, UNTRAINED_STATE)
    if not step:
        status = f"**After 10 steps: {NOT_YET}** (the command: {COMMAND})."
    elif len(step) < state.batches:
        status = f"**After 10 steps: interim, {len(step)} of {state.batches} mini-batches measured.**"  # fmt: skip
    else:
        status = f"After 10 steps: {len(step)} mini-batches measured, in {step[0]['folds']} folds."
    after, before = plan_2_tests(step, CONTRASTS), plan_2_tests(untrained, CONTRASTS)
    names = (next(iter(untrained_samples.values()), None) or {}).get("reward_names", [])
    rewards = [f"mean {name}" for name in names]
    samples = _table(
        [
            "policy",
            "mini-batches",
            f"at the {state.max_completion_length}-token cap",
            *rewards,
            "mean summed reward",
        ],
        [
            sample_row(
                "untrained (the first plan's qwen_sql)",
                untrained_samples,
                UNTRAINED_STATE,
                len(names),
            ),  # fmt: skip
            sample_row("gdpo seed 0 after 10 steps", step_samples, STEP_STATE, len(names)),
        ],
    )
    cosines = _table(
        [
            "estimator",
            "after 10 steps [95% fold-jackknife interval] (n: folds)",
            "untrained [95% t interval] (n: mini-batches)",
        ],
        cosine_rows(step, untrained),
    )
    contrasts = _table(
        [
            "contrast",
            "after 10 steps: fold jackknife [95%] (n: folds)",
            "p",
            "paired t [95%], not counting the shared reference",
            "untrained: paired t [95%]",
            "p",
        ],
        contrast_rows(after, before),
    )
    gains = _table(
        [
            "first-order gain of the clipped step",
            "after 10 steps [95% fold-jackknife interval]",
            "untrained",
        ],
        gain_rows(step, untrained),
    )
    blocks = [
        "The update-quality benchmark's step measurement (`benchmarks/update_quality.py --state "
        f"{STEP_STATE}`, results in `{STEP_RESULTS}/`) at the study's gdpo seed 0 policy after 10 "
        f"steps: {state.batches} mini-batches of 4 prompts x 4 responses drawn fresh from it (the "
        "first plan's qwen_sql main sample's prompts and sampling seeds), the cosine of each "
        "estimator's step with the policy gradient of the summed reward (leave-batch-out, its "
        f"reference in {state.folds} folds). Beside it, the first plan's qwen_sql at the "
        "untrained policy (`benchmarks/results/update-quality/`, measured without folds: paired "
        "t intervals over mini-batches, which do not count the shared reference).",
        status,
        "How far the format is learned (the fresh samples):",
        "\n".join(samples),
        "Cosine with the policy gradient of the summed reward:",
        "\n".join(cosines),
        "MRTPO against GDPO, paired by mini-batch:",
        "\n".join(contrasts),
        "Mean first-order gain of the clipped step over gdpo's:",
        "\n".join(gains),
        reading(after, before),
        provenance(results),
    ]
    return "\n\n".join(block for block in blocks if block) + "\n"
