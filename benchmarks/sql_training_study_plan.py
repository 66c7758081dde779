"""The SQL training study's design (issue #47): its numbers, the prediction and the sizing, the
plan stored in `plan.json` before the first pilot run (refused once changed), the pilot's
learning-rate rule, and where each stage's results live. Pure: no training, no report.

`sql_training_study.py` runs the study (the command); `sql_training_study_report.py` writes
its report from the results files.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import convergence_powered  # noqa: E402  (Holm, paired differences)
import convergence_report  # noqa: E402
import convergence_runs  # noqa: E402
from paired_stats import paired_power  # noqa: E402  (the statistics, one place)

RESULTS = Path("benchmarks/results/sql-training-study")
POWERED_STUDY = HERE / "results" / "convergence-powered"  # the sizing's noise source
PLAN_FILE = "plan.json"
TASK = "sql"
MODEL = "qwen2.5-coder-0.5b-instruct"
RECIPE = Path("recipes/sql-qwen2.5-coder-0.5b.yaml")

# ----------------------------------------------------------------------------- the design

STEPS, PILOT_STEPS = 20, 10
SEEDS = (0, 1, 2, 3, 4)
PILOT_SEED = 100  # not a study seed
LEARNING_RATES = (1e-6, 3e-6, 1e-5)
PROMPTS, GENERATIONS, MICRO_BATCH, MAX_COMPLETION_LENGTH = 4, 4, 4, 128
SAVE_STEPS = 2  # a checkpoint is ~7.5 GB with AdamW's moments; one is kept
EVAL_BATCH = 16
# The recipe's settings that MRTPOConfig's CPU defaults do not already give (a test checks
# them against the recipe file), in both arms so that the arms differ only by the estimator.
RECIPE_SETTINGS: dict[str, Any] = {
    "temperature": 1.0,
    "mrtpo_warmup_steps": 5,
    "replay_mode": "leave_one_out",
    "lr_scheduler_type": "constant",
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "share_prompt": True,
}
ARMS: dict[str, dict[str, Any]] = {
    "gdpo": {"advantage_estimator": "gdpo", **RECIPE_SETTINGS},
    "mrtpo": {"advantage_estimator": "mrtpo", "mrtpo_beta": 1.0, **RECIPE_SETTINGS},
}
BASELINE, PROPOSED = "gdpo", "mrtpo"
EXECUTION, SUMMED = "rewards/sql_execution/mean", "reward"
ENDPOINTS = {EXECUTION: "execution reward", SUMMED: "summed reward"}
ALPHA = 0.05
LEVEL, WINDOW = 2.0, 3  # steps to a summed training reward of 2.0, rolling mean of 3 steps
NOT_REACHED = STEPS + 1
COLLAPSE_LENGTH = 5.0  # tokens: a mean completion shorter than this is a collapse
EARLY, LATE = range(1, 6), range(6, 11)  # the pilot's two halves (steps, 1-based)
CHECK_AFTER_SEEDS = 3
# The item 2: the step measured again at this run's policy after this many steps
# (kept by the run as it passes that step: `convergence_runs.kept_policy_dir`).
KEPT_RUN, KEPT_STEP = (BASELINE, 0), 10
# Per block of 5 steps (convergence_powered.diagnostics_table; its STEPS is this study's 20).
DIAGNOSTICS = (
    ("completions/clipped_ratio", "capped share"),
    ("grad_norm", "gradient norm"),
    ("mrtpo/reallocation_ratio", "reallocation ratio"),
    ("completions/mean_length", "mean length"),
)

# The update-quality benchmark's Qwen SQL main sample (9 mini-batches, 128 new tokens;
# docs/results/update-quality.md): mean cosine of each estimator's step with the policy
# gradient of the summed reward. Every gradient norm was above the clip, so the first-order
# gain of the clipped step is the cosine times the reference's norm: gains in the ratio of
# the cosines (beta 1: 0.580 / 0.374 = +55%).
MEASURED_COSINES = {0.0: 0.374, 0.25: 0.497, 0.5: 0.545, 1.0: 0.580}
# The share of the first-order gain assumed to reach the reward curve (AdamW's per-coordinate
# rescaling, which the step measure ignores, and a saturating format reward): the central
# value; the range runs from none of it to all of it.
TRANSFER_CENTRAL, TRANSFER_RANGE = 0.5, (0.0, 1.0)


def beta_schedule(steps: int = STEPS) -> list[float]:
    """MRTPO's beta at steps 1..steps (the trainer's smoothstep warm-up from step 0)."""
    from mrtpo.advantages import beta_at

    overrides = ARMS[PROPOSED]
    return [
        beta_at(step - 1, overrides["mrtpo_beta"], overrides["mrtpo_warmup_steps"])
        for step in range(1, steps + 1)
    ]


def prediction() -> dict[str, Any]:
    """The predicted AUC difference mrtpo - gdpo as a share r of gdpo's learned area (its AUC
    minus its step-1 value).

    Model: GDPO's reward rises by b per update; MRTPO's update at step s rises by
    b (1 + a g(beta_s)), g the measured relative gain at that beta (interpolated linearly
    between the measured betas), a the transfer share. Step t's reward holds the updates
    1..t-1, so update s counts in the AUC over STEPS steps with weight STEPS - s, and
    r = a * sum_s (STEPS - s) g(beta_s) / sum_s (STEPS - s)."""
    betas = beta_schedule()
    measured = sorted(MEASURED_COSINES)
    gains = [MEASURED_COSINES[b] / MEASURED_COSINES[0.0] - 1 for b in measured]
    weights = [STEPS - s for s in range(1, STEPS)]
    per_update = [float(np.interp(betas[s - 1], measured, gains)) for s in range(1, STEPS)]
    full = float(np.dot(weights, per_update) / sum(weights))
    return {
        "betas": betas,
        "gain_at_beta_1": gains[-1],
        "warmup_weighted_gain": full,
        "transfer_central": TRANSFER_CENTRAL,
        "transfer_range": list(TRANSFER_RANGE),
        "share_central": TRANSFER_CENTRAL * full,
        "share_range": [TRANSFER_RANGE[0] * full, TRANSFER_RANGE[1] * full],
    }


def learned_area(
    records: Sequence[Mapping[str, Any]], key: str, steps: int = STEPS
) -> float | None:
    """A run's AUC minus its step-1 value: what its training added (None until complete)."""
    value = area(records, key, steps)
    first = convergence_report.curve(records, key, steps)[0]
    return None if value is None else value - float(first)


def sizing(powered_study: Path = POWERED_STUDY) -> dict[str, Any]:
    """The noise assumption and the power of the plan.

    Qwen's seed-to-seed noise is unmeasured. Assumed: the SD of a paired AUC difference, as a
    share of gdpo's learned area, is the largest of the powered SmolLM2 study's two endpoints
    (its files: 6 paired seeds, 20 steps). Power of the paired t-test (5 seeds) at alpha and at
    Holm's first threshold alpha / 2, for the central prediction and its upper end."""
    data = convergence_report.load_results(powered_study)
    runs = data["runs"]
    shares = {}
    for name in convergence_powered.ENDPOINTS:
        key = f"rewards/{name}/mean"
        rise = float(np.mean([learned_area(run["records"], key) for run in runs["gdpo"].values()]))
        differences = convergence_powered.paired_differences(
            runs, "mrtpo", "gdpo", lambda run, key=key: area(run["records"], key)
        )
        sd = float(np.std(list(differences.values()), ddof=1))
        shares[name] = {"gdpo_learned_area": rise, "difference_sd": sd, "sd_share": sd / rise}
    assumed = max(part["sd_share"] for part in shares.values())
    expected = prediction()
    power = {}
    for label, effect in (("central", expected["share_central"]), ("upper", expected["share_range"][1])):  # fmt: skip
        for seeds in (CHECK_AFTER_SEEDS, len(SEEDS)):
            for alpha_label, alpha in (("0.05", ALPHA), ("0.025", ALPHA / 2)):
                power[f"{label}, {seeds} seeds, alpha {alpha_label}"] = paired_power(
                    effect, assumed, seeds, alpha
                )
    return {
        "source": "benchmarks/results/convergence-powered",
        "smollm2": shares,
        "assumed_sd_share": assumed,
        "power": power,
    }


def fmt_rate(rate: float) -> str:
    return f"{rate:g}"


PLAN = f"""\
Written and committed before the first pilot run, stored in `plan.json` ("text"; the numbers
below it are computed by `prediction()` and `sizing()` and stored beside it); a run under a
changed plan is refused.

**Question.** The update-quality benchmark measured, on Qwen2.5-Coder-0.5B-Instruct on the
bundled SQL task at 128 new tokens, MRTPO's step at beta 1 pointing further uphill than GDPO's
(mean cosine with the policy gradient +0.580 against +0.374; first-order gain of the clipped
step +55%). Does that make training learn faster?

**Design.** Qwen2.5-Coder-0.5B-Instruct as installed (`{MODEL}`), no cold start; the bundled
SQL train split (362 rows); the recipe `{RECIPE}`'s settings: {PROMPTS} prompts x {GENERATIONS}
completions per step (micro-batches of {MICRO_BATCH}, {PROMPTS} accumulated), {MAX_COMPLETION_LENGTH}
new tokens, temperature 1, the prompt shared (`share_prompt`), constant learning rate, AdamW
(0.9, 0.999), float32 on CPU; {STEPS} optimizer steps. Arms: `gdpo`, and `mrtpo` at beta 1 with
the recipe's 5-step smoothstep warm-up (beta 0, 0.104, 0.352, 0.648, 0.896, then 1 from step
6), the same in every seed; every other setting is shared (`ARMS`). Seeds {", ".join(map(str, SEEDS))},
paired: a seed fixes the prompt order and the sampling seeds (seed + 1,000,003 x step), shared
by the two arms, so step 1 is the same sample in both. Each run is evaluated with its own
seed (1000 + its training seed, `convergence.evaluation_seed`). A checkpoint every {SAVE_STEPS}
steps; an interrupted run resumes from it (its `run.json` lists each start).

**Learning rate, chosen before the study by GDPO alone.** Pilot: `gdpo`, seed {PILOT_SEED} (not
a study seed), {PILOT_STEPS} steps at each of {", ".join(map(fmt_rate, LEARNING_RATES))}, otherwise
the study's settings, no evaluation; all three are run (largest first). For each rate:
- it *rises* when the mean of the summed training reward (`reward`, the sum of the three
  rewards' step means, 0-3) over steps 6-10 is strictly above its mean over steps 1-5;
- it *collapses* when any step logs a loss or a gradient norm that is NaN or infinite, or a
  mean completion length (`completions/mean_length`, the per-step length statistic the trainer
  logs) under {COLLAPSE_LENGTH:g} tokens.
The study's rate is the largest rate that rises and does not collapse; if none does, the
smallest rate, {fmt_rate(LEARNING_RATES[0])} (the recipe's). `--study` reads it from the pilot's
files and refuses to start before the pilot is complete.

**Primary endpoints.** Per run, the area under the training curve (AUC: the mean over steps
1-{STEPS} of the step's value) of the execution reward (`rewards/sql_execution/mean`, 16
responses a step) and of the summed reward (`reward`). Contrast mrtpo - gdpo paired by seed;
two-sided paired t-test over the seeds, Holm's step-down correction over the two endpoints,
family-wise alpha {ALPHA}; estimates: the mean difference with its 95% t interval (uncorrected).
A seed enters once both its runs have all {STEPS} steps; no run is dropped or replaced.

**Secondary** (reported with paired 95% t intervals, not corrected): execution accuracy of the
final policy on the bundled test split, every one of its 85 prompts, one sample each at
temperature 1 drawn with the run's evaluation seed, and greedy (also its format and executable
rates); steps to a summed training reward of {LEVEL:g} (rolling mean of {WINDOW} steps; not
reached counts as {NOT_REACHED}); per block of 5 steps, the share of completions capped at
{MAX_COMPLETION_LENGTH} tokens (`completions/clipped_ratio`), the gradient norm before clipping
(`grad_norm`) and MRTPO's `mrtpo/reallocation_ratio`.

**Prediction.** Write r for the AUC difference mrtpo - gdpo as a share of gdpo's learned area
(gdpo's AUC minus its step-1 value, the mean over seeds). Model: each GDPO update raises the
reward by the same amount, an MRTPO update by (1 + a g(beta)) times it, g the measured
first-order gain at that update's beta (interpolated between the measured betas 0, 0.25, 0.5,
1), a the share of the first-order gain that reaches the reward curve. The update of step s
counts in the AUC with weight {STEPS} - s (it lifts steps s+1..{STEPS}), so with the warm-up the
full first-order gain gives r = a x 0.434 (`prediction()`). Assumptions:
1. AdamW rescales each coordinate by its running RMS, which the step measure (plain gradient
   ascent's view, a cosine with the policy gradient) ignores: part of a better direction
   survives the rescaling, not all, and early Adam steps are close to sign steps;
2. the format reward may saturate within a few steps, after which its share of the gain no
   longer lifts the curve;
3. a first-order gain turns into reward only over a few steps (the policy and the samples
   move, the measured gain is at the untrained state only).
Central a = {TRANSFER_CENTRAL:g}, range {TRANSFER_RANGE[0]:g} to {TRANSFER_RANGE[1]:g}: **r = +0.22
(range 0 to +0.43)** for both endpoints, positive sign: MRTPO above GDPO. In reward units the
prediction is r times gdpo's learned area as the study measures it (the report prints both).
If gdpo's learned area is not positive, the prediction is no difference.

**Reading, fixed in advance.** Per endpoint: significant after Holm and positive: MRTPO learns
faster on this state; significant and negative: slower; not significant: no difference shown,
the 95% t interval bounds it. Prediction against outcome per endpoint: the predicted value
(0.22 x gdpo's learned area) inside the 95% t interval: consistent with the prediction; the
interval entirely below it: smaller than predicted; entirely above: larger.

**Sizing.** Qwen's seed noise is unmeasured; assumed: the SD of a paired AUC difference is
0.22 of gdpo's learned area, the larger of the powered SmolLM2 study's two endpoints
(`sizing()`, from its files). Then 5 seeds give power 0.39 at alpha 0.05 (0.25 at Holm's first
0.025) for the central prediction, and 0.90 (0.77) for its upper end (the first-order gain
carried over whole); 3 seeds 0.18 and 0.46. The budget allows 5 (a Qwen step is about
5-6 CPU-minutes): the study is powered for the first-order effect, not for the central
prediction, and the report says so. **After {CHECK_AFTER_SEEDS} seeds** the report compares the
measured SD of the paired AUC difference (as a share of gdpo's learned area so far) with the
assumed 0.22 and prints the power of the 5-seed plan under the measured SD; all 5 seeds are
run regardless.

**Cost.** Training: about 330 CPU s a step (the recipe's 3-step run: 302-330 s with one
thread), {STEPS} steps about 1.8 CPU-hours a run, 10 runs about 18 CPU-hours; the pilot 30 steps,
about 2.8. Evaluation on every test prompt: 85 sampled and 85 greedy completions of up to
{MAX_COMPLETION_LENGTH} tokens, in batches of {EVAL_BATCH} prompts: from the update-quality benchmark's
sampling (104 CPU s for 16 completions at 128 tokens) and Spider dev's greedy evaluation (17.6
CPU s a completion at 256 tokens), about 1,100-1,500 CPU s a run (18-25 CPU-minutes), 3-4
CPU-hours for the 10 runs (the first run's `eval_cpu_seconds` replaces this estimate). In all
about 24 CPU-hours; one Qwen trainer at a time (about 15 GB peak), two threads.

**Not in this study.** The placebo at beta 1 (the update-quality page proposed it as a third
arm, because the placebo's step is not distinguishable from MRTPO's): issue #47 fixes two arms,
so a training difference here is MRTPO's replay against none, not the verifier's information
against another row's.
"""


def design() -> dict[str, Any]:
    """The design's numbers as stored in the plan."""
    return {
        "model": MODEL,
        "task": TASK,
        "steps": STEPS,
        "seeds": list(SEEDS),
        "pilot_seed": PILOT_SEED,
        "pilot_steps": PILOT_STEPS,
        "learning_rates": list(LEARNING_RATES),
        "prompts": PROMPTS,
        "generations": GENERATIONS,
        "micro_batch": MICRO_BATCH,
        "max_completion_length": MAX_COMPLETION_LENGTH,
        "save_steps": SAVE_STEPS,
        "arms": ARMS,
        "endpoints": list(ENDPOINTS),
        "alpha": ALPHA,
        "level": LEVEL,
        "window": WINDOW,
        "collapse_length": COLLAPSE_LENGTH,
    }


def current_plan() -> dict[str, Any]:
    return {"text": PLAN, "design": design(), "prediction": prediction(), "sizing": sizing()}


def store_plan(results: Path) -> dict[str, Any]:
    """Write `plan.json` if absent; return the stored plan; refuse (SystemExit, naming what
    changed) when the current plan differs from the stored one."""
    path = Path(results) / PLAN_FILE
    plan = json.loads(json.dumps(current_plan()))  # as JSON stores it (tuples become lists)
    stored = convergence_runs._read_json(path)
    if stored is None:
        convergence_runs._write_json(path, plan)
        return plan
    changed = sorted(key for key in plan.keys() | stored.keys() if plan.get(key) != stored.get(key))
    if changed:
        raise SystemExit(
            f"{path} holds another plan ({', '.join(changed)} changed): a pre-registered plan is "
            "not changed once stored; use another --results folder"
        )
    return stored


def plan_digest(results: Path) -> str:
    return hashlib.sha256((Path(results) / PLAN_FILE).read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- the pilot rule


def area(records: Sequence[Mapping[str, Any]], key: str, steps: int = STEPS) -> float | None:
    """The mean of `key` over steps 1..steps; None until every step is logged."""
    values = convergence_report.curve(records, key, steps)
    return None if np.isnan(values).any() else float(values.mean())


def collapse(records: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a run collapsed (the first step with a non-finite loss or gradient norm, or a mean
    completion under COLLAPSE_LENGTH tokens); None when it did not."""
    for record in records:
        for key in ("loss", "grad_norm"):
            value = record.get(key)
            if value is not None and not math.isfinite(value):
                return f"step {record['step']}: {key} {value}"
        length = record.get("completions/mean_length")
        if length is not None and length < COLLAPSE_LENGTH:
            return f"step {record['step']}: mean completion {length:g} tokens"
    return None


def pilot_rule(pilot: Mapping[float, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """The plan's learning-rate rule on each rate's pilot records: per rate the summed reward's
    means over steps 1-5 and 6-10, whether it rises and why it collapsed; "chosen": the largest
    rate that rises without collapsing, else the smallest rate; None until every rate has all
    PILOT_STEPS steps."""
    rates = {}
    for rate in LEARNING_RATES:
        records = pilot.get(rate, [])
        curve = convergence_report.curve(records, SUMMED, PILOT_STEPS)
        done = int(np.sum(~np.isnan(curve)))
        early = float(np.mean(curve[EARLY.start - 1 : EARLY.stop - 1]))
        late = float(np.mean(curve[LATE.start - 1 : LATE.stop - 1]))
        reason = collapse(records)
        rates[rate] = {
            "steps": done,
            "early": None if math.isnan(early) else early,
            "late": None if math.isnan(late) else late,
            "rises": done == PILOT_STEPS and late > early,
            "collapse": reason,
        }
    complete = all(part["steps"] == PILOT_STEPS for part in rates.values())
    chosen = None
    if complete:
        good = [rate for rate, part in rates.items() if part["rises"] and part["collapse"] is None]
        chosen = max(good) if good else min(LEARNING_RATES)
    return {"rates": rates, "complete": complete, "chosen": chosen}


def pilot_results(results: Path, rate: float) -> Path:
    return Path(results) / "pilot" / f"lr{fmt_rate(rate)}"


def study_results(results: Path) -> Path:
    return Path(results) / "study"


def chosen_rate(results: Path) -> float:
    """The study's learning rate by the plan's rule; SystemExit before the pilot is complete."""
    rule = pilot_rule(load_pilot(results))
    if not rule["complete"]:
        steps = {fmt_rate(rate): part["steps"] for rate, part in rule["rates"].items()}
        raise SystemExit(
            f"the pilot is not complete (steps per rate: {steps}, {PILOT_STEPS} each needed): "
            "run --pilot first"
        )
    return rule["chosen"]


def load_pilot_runs(results: Path) -> dict[float, dict[str, Any]]:
    """Each rate's pilot run: its records (empty before its first step) and run.json (None)."""
    pilot = {}
    for rate in LEARNING_RATES:
        folder = pilot_results(results, rate) / TASK / BASELINE / f"seed{PILOT_SEED}"
        pilot[rate] = {
            "records": convergence_runs.read_metrics(folder / convergence_runs.METRICS_FILE),
            "run": convergence_runs._read_json(folder / convergence_runs.RUN_FILE),
        }
    return pilot


def load_pilot(results: Path) -> dict[float, list[dict[str, Any]]]:
    """Each rate's pilot records (empty where the run has not logged a step)."""
    return {rate: run["records"] for rate, run in load_pilot_runs(results).items()}
