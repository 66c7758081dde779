"""The update-quality benchmark's report (`update_quality.py --report`): README.md and
cosines.png of a results folder, from its files alone: the plan's sections, then the
exploratory ones."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from paired_stats import paired_t
from update_quality_analysis import (
    contrast_tests,
    load_measures,
    mean_ratio,
    per_estimator,
    primary_tests,
)
from update_quality_references import record_mode
from update_quality_states import (
    ALL_STATES,
    EFFECT_SHARE,
    ESTIMATORS,
    GROUP_SIZE,
    PLAN_FILE,
    POWER_FILE,
    PRIMARY_CONTRASTS,
    RESULTS,
    RUN_FILE,
    SAMPLES,
    SECONDARY_CONTRASTS,
    STATES,
    capped,
    load_samples,
    plan,
    read_json,
    sample_dir,
    state_dir,
)

# ----------------------------------------------------------------------------- the report


def _interval(values: Sequence[float]) -> str:
    """mean [95% t interval] of per-mini-batch values."""
    values = [v for v in values if not math.isnan(v)]
    if len(values) < 2:
        return f"{values[0]:+.4f}" if values else "–"
    test = paired_t(values)
    return f"{test['mean']:+.4f} [{test['low']:+.4f}, {test['high']:+.4f}]"


def _p(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2g}" if value >= 1e-4 else f"{value:.1e}"


def estimator_table(
    records: Sequence[Mapping[str, Any]], estimators: Iterable[str] = ESTIMATORS
) -> str:
    """Per estimator (default the first plan's): the cosine with the summed-reward reference
    and with each reward's (mean and 95% t interval over mini-batches), the gradient norm, the
    gain of the clipped step and the distance from gdpo's gradient (means)."""
    values = per_estimator(records, estimators=estimators)
    names = records[0]["reward_names"]
    header = ["estimator", "cosine, summed reward", *[f"cosine, {n}" for n in names]]
    header += ["gradient norm", "gain of the clipped step", "distance from gdpo"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for estimator, measured in values.items():
        cells = [estimator, _interval(measured["cosine"])]
        cells += [_interval(column) for column in measured["reward_cosines"]]
        cells += [
            f"{np.mean(measured['norm']):.3f}",
            f"{np.mean(measured['gain']):.3g}",
            f"{np.mean(measured['diff_norm']):.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def contrast_table(tests: Sequence[Mapping[str, Any]], corrected: bool) -> str:
    header = ["state", "contrast", "mean difference [95% t interval]", "p"]
    header += ["Holm p", "significant"] if corrected else []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for test in tests:
        t = test["test"]
        first, second = test["contrast"]
        cells = [test.get("state", ""), f"{first} - {second}"]
        if t is None:
            cells += ["–", "–"]
        else:
            cells += [
                f"{t['mean']:+.4f} [{t['low']:+.4f}, {t['high']:+.4f}] (n = {t['n']})",
                _p(t["p"]),
            ]
        if corrected:
            cells += [_p(test["holm_p"]), "yes" if test["significant"] else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def state_reading(tests: Sequence[Mapping[str, Any]], values: Mapping[str, Any]) -> str:
    """The pre-registered reading of one state's three primary tests (see ANALYSIS)."""
    by_control = {t["contrast"][1]: t for t in tests}
    if any(t["test"] is None for t in tests):
        return "no reading yet: fewer than 2 mini-batches of the main sample measured"

    def direction(control: str) -> int:
        test = by_control.get(control)
        if test is None or not test["significant"]:
            return 0
        return 1 if test["test"]["mean"] > 0 else -1

    gdpo, placebo, shuffled = (
        direction("gdpo"),
        direction("placebo(0.5)"),
        direction("shuffled(0.5)"),
    )
    dose = ", ".join(
        f"{name} {np.mean(values[name]['cosine']):+.4f}"
        for name in ("gdpo", "mrtpo(0.25)", "mrtpo(0.5)", "mrtpo(1)")
    )
    if gdpo > 0 and placebo > 0 and shuffled > 0:
        text = "the verifier's own information makes the step point further uphill"
    elif gdpo > 0 and placebo <= 0:
        text = "any added context helps the step: the information is not what matters"
    elif gdpo > 0 and placebo > 0 and shuffled <= 0:
        text = "the weights' spread helps the step, not where they fall"
    elif gdpo < 0:
        text = (
            "the reallocation displaces the uniform signal: mrtpo(0.5) points less uphill than "
            f"gdpo (dose-response, mean cosines: {dose})"
        )
    elif gdpo == 0 and placebo == 0 and shuffled == 0:
        test = by_control["gdpo"]["test"]
        text = (
            "no effect on the step's direction detected at this scale; mrtpo(0.5) - gdpo lies in "
            f"[{test['low']:+.4f}, {test['high']:+.4f}] (mean cosines: {dose})"
        )
    else:
        parts = [
            f"{c}: {'above' if d > 0 else 'below' if d < 0 else 'no difference'}"
            for c, d in (("gdpo", gdpo), ("placebo(0.5)", placebo), ("shuffled(0.5)", shuffled))
        ]
        text = "a pattern not named in advance: mrtpo(0.5) against " + "; ".join(parts)
    entropy = contrast_tests(values, [("mrtpo(0.5)", "entropy(0.5)")])[0]["test"]
    if entropy is not None:
        matches = entropy["low"] <= 0 <= entropy["high"]
        text += (
            f". Secondary: mrtpo(0.5) - entropy(0.5) {entropy['mean']:+.4f} "
            f"[{entropy['low']:+.4f}, {entropy['high']:+.4f}]"
            + (" (the entropy control matches mrtpo within the interval)" if matches else "")
        )
    return text


def plot_cosines(measures: Mapping[str, Any], path: Path) -> bool:
    """Mean cosine with the summed-reward reference and its 95% t interval, per estimator
    and state (the main sample; the pilot where no main sample exists, labelled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (state, sample, samples[sample])
        for state, samples in measures.items()
        for sample in ("main", "pilot")
        if sample in samples and (sample == "main" or "main" not in samples)
    ]
    if not panels:
        return False
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for axis, (state, sample, records) in zip(axes[0], panels, strict=True):
        values = per_estimator(records)
        names = list(values)
        means, lows, highs = [], [], []
        for name in names:
            test = paired_t(values[name]["cosine"]) if len(records) > 1 else None
            mean = float(np.mean(values[name]["cosine"]))
            means.append(mean)
            lows.append(mean - (test["low"] if test else mean))
            highs.append((test["high"] if test else mean) - mean)
        colours = ["tab:gray" if ESTIMATORS[n][1] is None else "tab:blue" for n in names]
        axis.bar(range(len(names)), means, color=colours, yerr=[lows, highs], capsize=3)
        axis.axhline(0, color="black", linewidth=0.6)
        axis.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
        axis.set_ylabel("cosine with the policy gradient (summed reward)")
        axis.set_title(f"{state} ({sample}, {len(records)} mini-batches)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def cost_table(results: Path) -> str:
    lines = ["| state | sample | lane | CPU s: sample / reference / measure | peak RSS GB | CPU |"]
    lines.append("|---|---|---|---|---|---|")
    for state in STATES:
        for sample in SAMPLES:
            record = read_json(sample_dir(results, state, sample) / RUN_FILE)
            for lane, info in sorted((record or {}).get("lanes", {}).items()):
                seconds = " / ".join(
                    f"{info['cpu_seconds'].get(stage, 0):.0f}"
                    for stage in ("sample", "reference", "measure")
                )
                cpus = sorted({session["cpu"] for session in info["sessions"]})
                rss = info.get("peak_rss_mb", 0) / 1024
                lines.append(
                    f"| {state} | {sample} | {lane} | {seconds} | {rss:.1f} | {', '.join(cpus)} |"
                )
    return "\n".join(lines)


def write_report(results: Path = RESULTS) -> Path:
    """README.md and cosines.png of the results folder, from the results files alone."""
    results = Path(results)
    measures = load_measures(results)
    stored = read_json(results / PLAN_FILE) or plan()
    lines = [
        "# Does each step point uphill? (update quality)",
        "",
        "Generated by `python benchmarks/update_quality.py --report` from the files in this "
        "folder; the design and the measures are described in that script's docstring.",
        "",
        "## Analysis plan (pre-registered)",
        "",
        stored["analysis"],
    ]
    for state in STATES:
        power = read_json(state_dir(results, state) / POWER_FILE)
        samples = measures.get(state, {})
        if not samples and power is None:
            continue
        lines += [f"## {state}", ""]
        if power is not None:
            lines += [
                f"**Pilot and power** ({power['pilot_batches']} mini-batches of other prompts): "
                f"gdpo's mean cosine {power['gdpo_mean_cosine']:+.4f}; mrtpo(0.5) - gdpo mean "
                f"{power['difference_mean']:+.4f}, SD {power['difference_sd']:.4f}; effect to "
                f"detect {power['effect']:.4f} ({EFFECT_SHARE:.0%} of gdpo's cosine) at alpha "
                f"{power['alpha']:.4f}: {power['needed_batches']} mini-batches needed, budget cap "
                f"{power['cap']}, measured {power['batches']} (power "
                f"{power['power_at_batches']:.2f}).",
                "",
            ]
        for sample in ("pilot", "main"):
            records = samples.get(sample)
            if not records:
                continue
            planned = records[0]["sample_batches"]
            status = "" if len(records) >= planned else f" (interim: {len(records)} of {planned})"
            lines += [f"### {sample}: {len(records)} mini-batches{status}", ""]
            lines += [estimator_table(records), ""]
            if sample == "main":
                values = per_estimator(records)
                lines += ["Secondary contrasts (uncorrected):", ""]
                tests = [{"state": state, **t} for t in contrast_tests(values, SECONDARY_CONTRASTS)]
                lines += [contrast_table(tests, corrected=False), ""]
    tests = primary_tests(measures)
    if tests:
        lines += [
            "## Primary tests (Holm over the tests present)",
            "",
            contrast_table(tests, True),
            "",
        ]
        lines += ["## Reading", ""]
        for state in STATES:
            own = [t for t in tests if t["state"] == state]
            if own:
                values = per_estimator(measures[state]["main"])
                lines.append(f"- **{state}**: {state_reading(own, values)}.")
        lines.append("")
    if plot_cosines(measures, results / "cosines.png"):
        lines += ["![cosines](cosines.png)", ""]
    if measures:
        lines += exploratory_section(results, measures)
        lines += placebo_section(results, measures)
    lines += ["## Cost", "", cost_table(results), ""]
    path = results / "README.md"
    path.write_text("\n".join(lines))
    return path


# ----------------------------------------------------------------------------- exploratory

# Not in the plan: what the results page reads beyond the pre-registered tests, from the
# committed samples (token ids, rewards) and measures, so that every number it quotes is printed.
EXPLORATORY_CONTRASTS = (("shuffled(0.5)", "gdpo"), ("mrtpo(1)", "mrtpo(0.5)"))


def _count(k: int, n: int) -> str:
    return f"{k} of {n} ({k / n:.1%})" if n else "–"


def reward_means(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """A sample's mean of each reward over its responses (a missing score left out)."""
    scores = np.array([row for r in records for row in r["rewards"]], dtype=float)
    return {
        name: float(np.nanmean(scores[:, k])) for k, name in enumerate(records[0]["reward_names"])
    }


def sample_tables(results: Path) -> list[str]:
    """The responses at the completion cap, the prompts' length, and per reward its mean and
    how many responses earn it (score > 0) among those at the cap and those that finish."""
    lengths = [
        "| state | sample | responses | at the cap | mean prompt tokens |",
        "|---|---|---|---|---|",
    ]
    rewards = ["| state | sample | reward | mean | earned at the cap | earned, finished |"]
    rewards.append("|---|---|---|---|---|---|")
    for state in STATES:
        for sample in SAMPLES:
            records = list(load_samples(results, state, sample).values())
            if not records:
                continue
            stopped = np.array([c for r in records for c in capped(r, state)])
            scores = np.array([row for r in records for row in r["rewards"]], dtype=float)
            prompts = np.mean([len(ids) for r in records for ids in r["prompt_ids"]])
            cap = f"{_count(int(stopped.sum()), len(stopped))} at {STATES[state].max_completion_length}"
            lengths.append(f"| {state} | {sample} | {len(stopped)} | {cap} | {prompts:.0f} |")
            means = reward_means(records)
            for k, name in enumerate(records[0]["reward_names"]):
                earned = np.nan_to_num(scores[:, k]) > 0
                at_cap, finished = earned[stopped], earned[~stopped]
                rewards.append(
                    f"| {state} | {sample} | {name} | {means[name]:.2f} | "
                    f"{_count(int(at_cap.sum()), len(at_cap))} | "
                    f"{_count(int(finished.sum()), len(finished))} |"
                )
    return ["\n".join(lengths), "", "\n".join(rewards)]


def per_batch_table(measures: Mapping[str, Any]) -> str:
    """Each primary contrast's cosine difference on each mini-batch, in order."""
    lines = [
        "| state | sample | contrast | per mini-batch | range | above 0 |",
        "|---|" * 1 + "---|" * 5,
    ]
    for state, samples in measures.items():
        for sample in SAMPLES:
            if sample not in samples:
                continue
            values = per_estimator(samples[sample])
            for first, second in PRIMARY_CONTRASTS:
                d = np.subtract(values[first]["cosine"], values[second]["cosine"])
                cells = [state, sample, f"{first} - {second}", " ".join(f"{x:+.3f}" for x in d)]
                cells += [f"{d.min():+.3f} to {d.max():+.3f}", f"{int((d > 0).sum())} of {len(d)}"]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def relative_table(measures: Mapping[str, Any]) -> str:
    """Per estimator, its mean gain of the clipped step and mean gradient norm against gdpo's."""
    lines = ["| state | sample | against gdpo's | " + " | ".join(ESTIMATORS) + " |"]
    lines.append("|---|---|---|" + "---:|" * len(ESTIMATORS))
    for state, samples in measures.items():
        for sample in SAMPLES:
            if sample not in samples:
                continue
            records = samples[sample]
            for measure, label, form in (("gain", "gain", "{:+.0%}"), ("norm", "norm", "{:.2f}x")):
                shift = -1 if measure == "gain" else 0
                cells = [
                    form.format(mean_ratio(measure, name, "gdpo")(records) + shift)
                    for name in ESTIMATORS
                ]
                lines.append(f"| {state} | {sample} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def capped_correlation(results: Path, measures: Mapping[str, Any]) -> str:
    """Pearson r, over every measured mini-batch (pilot and main), between the share of its
    responses at the cap and mrtpo(0.5) - gdpo."""
    lines = ["| state | mini-batches (pilot and main) | Pearson r |", "|---|---|---|"]
    for state, samples in measures.items():
        shares, differences = [], []
        for sample in SAMPLES:
            records = samples.get(sample, [])
            sampled = load_samples(results, state, sample)
            values = per_estimator(records) if records else {}
            for i, record in enumerate(records):
                if record["batch"] in sampled:
                    shares.append(float(np.mean(capped(sampled[record["batch"]], state))))
                    differences.append(
                        values["mrtpo(0.5)"]["cosine"][i] - values["gdpo"]["cosine"][i]
                    )
        if len(shares) > 2 and np.std(shares) > 0 and np.std(differences) > 0:
            r = float(np.corrcoef(shares, differences)[0, 1])
            lines.append(f"| {state} | {len(shares)} | {r:+.2f} |")
    return "\n".join(lines)


def exploratory_section(results: Path, measures: Mapping[str, Any]) -> list[str]:
    lines = ["## Exploratory (not in the plan)", ""]
    lines += ["Responses that stop at the completion cap, and who earns each reward:", ""]
    lines += [*sample_tables(results), ""]
    lines += ["Share at the cap against mrtpo(0.5) - gdpo, per mini-batch:", ""]
    lines += [capped_correlation(results, measures), ""]
    lines += ["The primary contrasts on each mini-batch (cosine differences):", ""]
    lines += [per_batch_table(measures), ""]
    lines += ["Mean gain of the clipped step and mean gradient norm against gdpo's:", ""]
    lines += [relative_table(measures), ""]
    tests = [
        {"state": state, **test}
        for state, samples in measures.items()
        if "main" in samples
        for test in contrast_tests(per_estimator(samples["main"]), EXPLORATORY_CONTRASTS)
    ]
    lines += ["Further contrasts on the main sample (uncorrected):", ""]
    return [*lines, contrast_table(tests, corrected=False), ""]


# ----------------------------------------------------------------------------- issue 48

# Not in the first plan: what the placebo of the first plan's states replayed (issue #48), from
# the committed samples and measures alone, so the results page can say it.


def replayed_pairs(record: Mapping[str, Any]) -> tuple[list[list[str]], list[list[bool]]]:
    """A sampled mini-batch's own information (N rows of K texts; a reward without verdicts
    has "", as `ScoredBatch.row_verdicts` gives it) and which (row, reward) pairs the replay
    runs: the reward's group-normalized advantage is not 0 (the trainer's rule)."""
    import torch

    from mrtpo import advantages
    from mrtpo.trainer import EPS

    rows = len(record["rewards"])
    own = [
        [column[i][1] if column is not None else "" for column in record["verdicts"]]
        for i in range(rows)
    ]
    rewards = torch.tensor(record["rewards"], dtype=torch.float32)
    normalized = torch.nan_to_num(advantages.per_reward(rewards, GROUP_SIZE, eps=EPS))
    return own, (normalized != 0).tolist()


def placebo_share_rows(results: Path, state: str, sample: str) -> list[list[str]] | None:
    """Over a sample's mini-batches, the share of replayed (row, reward) pairs whose placebo
    text equals the own text or is empty, overall and per reward. Each mini-batch's placebo is
    the one the trainer draws (`placebo_infos` with the run's seed and the mini-batch's index
    as the step, as the measure pass set them)."""
    from mrtpo.relevance.controls import placebo_infos, placebo_shares

    records = load_samples(results, state, sample)
    if not records:
        return None
    own_rows, placebo_rows, replayed_rows = [], [], []
    for batch, record in records.items():
        if "verdicts" not in record:  # a sample stored without its verdicts: no information
            continue
        own, replayed = replayed_pairs(record)
        own_rows += own
        placebo_rows += placebo_infos(own, GROUP_SIZE, ALL_STATES[state].seed, batch)
        replayed_rows += replayed
    if not own_rows:
        return None
    overall, per_reward = placebo_shares(own_rows, placebo_rows, replayed_rows)
    names = ["all rewards", *next(iter(records.values()))["reward_names"]]
    return [
        [state, sample, name, str(shares.pairs), *(_share(shares, f) for f in SHARE_FIELDS)]
        for name, shares in zip(names, [overall, *per_reward], strict=True)
    ]


SHARE_FIELDS = ("equal", "empty", "equal_or_empty")


def _share(shares: Any, field: str) -> str:
    value = getattr(shares, field)
    return "–" if math.isnan(value) else f"{value:.1%}"


def reference_correlations(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per pair of rewards, the cosine between their references (the leave-batch-out policy
    gradients of each reward alone), mean and range over the mini-batches; none where the
    rewards' references were not kept (`--reward_references none`)."""
    names = records[0]["reward_names"]
    key = {"per_fold": "ref_gram", "whole": "reward_gram"}.get(record_mode(records[0]))
    cells = []
    for a in range(len(names) if key else 0):
        for b in range(a + 1, len(names)):
            values = []
            for record in records:
                gram = record[key]
                values.append(gram[a][b] / math.sqrt(gram[a][a] * gram[b][b]))
            cells.append(
                f"{names[a]} / {names[b]}: {np.mean(values):+.2f} "
                f"({min(values):+.2f} to {max(values):+.2f})"
            )
    return cells


def placebo_section(results: Path, measures: Mapping[str, Any]) -> list[str]:
    lines = ["## What the placebo replayed (issue #48; not in the plan)", ""]
    lines += [
        "Replayed (row, reward) pairs (the reward's normalized advantage is not 0) whose "
        "placebo text equals the row's own or is empty, with the pairing the trainer draws "
        "(run seed, the mini-batch's index as the step):",
        "",
        "| state | sample | reward | replayed pairs | equal | empty | equal or empty |",
        "|---|---|---|---|---|---|---|",
    ]
    for state in STATES:
        for sample in SAMPLES:
            for row in placebo_share_rows(results, state, sample) or []:
                lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Cosine between the rewards' references (per mini-batch: mean, range):", ""]
    lines += ["| state | sample | mini-batches | reward pairs |", "|---|---|---|---|"]
    for state, samples in measures.items():
        for sample in SAMPLES:
            records = samples.get(sample)
            if records and len(records[0]["reward_names"]) > 1:
                pairs = "; ".join(reference_correlations(records))
                lines.append(f"| {state} | {sample} | {len(records)} | {pairs} |")
    return [*lines, ""]
