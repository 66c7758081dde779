"""Does the better step make faster learning? A pre-registered training study (issue #47).

Qwen2.5-Coder-0.5B-Instruct as installed (no cold start) on the bundled SQL task, the recipe
`recipes/sql-qwen2.5-coder-0.5b.yaml`'s settings, 20 optimizer steps; arms `gdpo` and `mrtpo`
at beta 1 (the recipe's 5-step warm-up), 5 paired seeds. The update-quality benchmark measured
MRTPO's step pointing further uphill than GDPO's on this state (+55% first-order gain at
beta 1); the plan (`PLAN`, with the learning-rate rule, the endpoints, the prediction and the
sizing) is stored in `plan.json` before the first pilot run, and a run under another plan is
refused.

The runs are `benchmarks/convergence.py`'s (`train_run`: resumable from the last checkpoint,
one `run.json` per run, `metrics.jsonl` as logged); this file fixes the design, picks the
learning rate from the pilot by the stored rule, evaluates each study run on every test prompt
and writes the report from the results files alone.

    python benchmarks/sql_training_study.py --plan          # store the plan (refused if changed)
    OMP_NUM_THREADS=2 python benchmarks/sql_training_study.py --pilot --threads 2 --commit
    OMP_NUM_THREADS=2 python benchmarks/sql_training_study.py --study --threads 2 --commit
    python benchmarks/sql_training_study.py --report        # README.md and figures from files

`--pilot` and `--study` resume: a finished run is skipped, an unfinished one resumes from its
last checkpoint (every `SAVE_STEPS` steps; checkpoints are git-ignored). With `--commit` each
finished run's files and the regenerated report are committed (those paths only).

Results: `benchmarks/results/sql-training-study/` (plan.json, README.md, curves.png, pilot.png;
`pilot/lr<rate>/sql/gdpo/seed100/` and `study/sql/<arm>/seed<k>/`: metrics.jsonl, run.json,
final_eval.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import convergence  # noqa: E402  (a sibling script: runs, resumption, paired t)
import convergence_powered  # noqa: E402  (Holm, paired differences)
import update_quality  # noqa: E402  (the code's commit)
from paired_stats import holm, paired_power, paired_t  # noqa: E402  (the statistics, one place)

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
# (kept by the run as it passes that step: `convergence.kept_policy_dir`).
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
    first = convergence.curve(records, key, steps)[0]
    return None if value is None else value - float(first)


def sizing(powered_study: Path = POWERED_STUDY) -> dict[str, Any]:
    """The noise assumption and the power of the plan.

    Qwen's seed-to-seed noise is unmeasured. Assumed: the SD of a paired AUC difference, as a
    share of gdpo's learned area, is the largest of the powered SmolLM2 study's two endpoints
    (its files: 6 paired seeds, 20 steps). Power of the paired t-test (5 seeds) at alpha and at
    Holm's first threshold alpha / 2, for the central prediction and its upper end."""
    data = convergence.load_results(powered_study)
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
    stored = convergence._read_json(path)
    if stored is None:
        convergence._write_json(path, plan)
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
    values = convergence.curve(records, key, steps)
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
        curve = convergence.curve(records, SUMMED, PILOT_STEPS)
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


# ----------------------------------------------------------------------------- the runs


def pilot_results(results: Path, rate: float) -> Path:
    return Path(results) / "pilot" / f"lr{fmt_rate(rate)}"


def study_results(results: Path) -> Path:
    return Path(results) / "study"


def stage_argv(stage: str, results: Path, rate: float, threads: int) -> list[str]:
    """`benchmarks/convergence.py`'s arguments for a stage's runs (the design, in one place)."""
    if stage == "pilot":
        folder, methods, seeds, steps, samples = (
            pilot_results(results, rate), [BASELINE], [PILOT_SEED], PILOT_STEPS, 0,
        )  # fmt: skip
    elif stage == "study":
        folder, methods, seeds, steps, samples = study_results(results), list(ARMS), SEEDS, STEPS, 1
    else:
        raise ValueError(f"stage must be 'pilot' or 'study', got {stage!r}")
    argv = ["--results", str(folder), "--task", TASK, "--model_name_or_path", MODEL]
    argv += ["--methods", *methods, "--seeds", *map(str, seeds)]
    for name, overrides in ARMS.items():
        argv += ["--variant", f"{name}={json.dumps(overrides, sort_keys=True)}"]
    argv += ["--steps", str(steps), "--prompts", str(PROMPTS), "--generations", str(GENERATIONS)]
    argv += ["--micro_batch", str(MICRO_BATCH), "--max_completion_length", str(MAX_COMPLETION_LENGTH)]  # fmt: skip
    argv += ["--learning_rate", repr(rate), "--save_steps", str(SAVE_STEPS)]
    argv += ["--eval_samples", str(samples), "--eval_temperature", "1", "--bfcl_examples", "0"]
    return argv + ["--eval_batch", str(EVAL_BATCH), "--device", "cpu", "--jobs", "1", "--threads", str(threads)]  # fmt: skip


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
            "records": convergence.read_metrics(folder / convergence.METRICS_FILE),
            "run": convergence._read_json(folder / convergence.RUN_FILE),
        }
    return pilot


def load_pilot(results: Path) -> dict[float, list[dict[str, Any]]]:
    """Each rate's pilot records (empty where the run has not logged a step)."""
    return {rate: run["records"] for rate, run in load_pilot_runs(results).items()}


def summarize_sql(result: Mapping[str, Any], max_tokens: int, **about: Any) -> dict[str, Any]:
    """Each verifier's mean and standard error over an evaluation's examples, the share capped
    at `max_tokens`, and each example's execution score (for paired comparisons later)."""
    examples = result["examples"]
    names = list(examples[0]["verdicts"])
    summary: dict[str, Any] = {"rows": len(examples), **about}
    for name in names:
        scores = [e["verdicts"][name]["score"] for e in examples]
        summary[name] = convergence.proportion_summary([s for s in scores if s is not None])
    capped = [float(e["completion_tokens"] >= max_tokens) for e in examples]
    summary["capped"] = convergence.proportion_summary(capped)
    summary["execution_scores"] = [e["verdicts"]["sql_execution"]["score"] for e in examples]
    return summary


def evaluate_sql(args: argparse.Namespace, model_dir: Path, seed: int) -> dict[str, Any]:
    """The final policy on every prompt of the bundled SQL test split: `--eval_samples` samples
    each at `--eval_temperature` drawn with `seed`, and greedy."""
    from mrtpo import tasks
    from mrtpo.evaluation import evaluate
    from mrtpo.models import load_model

    task = tasks.get(TASK)
    model, tokenizer = load_model(str(model_dir))
    model = model.to(convergence.device_of(args))
    test, sampled = convergence.sample_test_rows(args, task, model, tokenizer, task.load("test"), seed)  # fmt: skip
    length = args.max_completion_length
    greedy = evaluate(model, tokenizer, task, test, args.eval_batch, length)
    return {
        "sampled": summarize_sql(
            sampled,
            length,
            samples_per_row=args.eval_samples,
            temperature=args.eval_temperature,
            seed=seed,
        ),
        "greedy": summarize_sql(greedy, length, decoding="greedy"),
    }


def stage_args(stage: str, results: Path, rate: float, threads: int) -> argparse.Namespace:
    return convergence.parse_args(stage_argv(stage, results, rate, threads))


def worker(results: Path, stage: str, method: str, seed: int, rate: float, threads: int) -> None:
    """One run in this process: trained (resuming) and, in the study, evaluated."""
    import torch

    torch.set_num_threads(threads)
    args = stage_args(stage, results, rate, threads)
    with convergence.run_lock(convergence.run_dir(args, method, seed)) as held:
        if not held:
            print(f"{stage} {method} seed {seed}: another process has it; skipped", flush=True)
            return
        convergence.train_run(
            args,
            method,
            seed,
            start=MODEL,
            evaluate=evaluate_sql if stage == "study" else None,
            provenance=update_quality.engine(),
            keep_steps=[KEPT_STEP] if stage == "study" and (method, seed) == KEPT_RUN else [],
        )


def commit_files(paths: Sequence[Path], message: str, attempts: int = 60) -> bool:
    """`git add` and `git commit` of `paths` only (other staged or changed files are left as
    they are), retried while another git process holds the index; False when it fails."""
    existing = [str(path) for path in paths if Path(path).is_file()]
    if not existing:
        return False
    where = Path(existing[0]).resolve().parent
    for _ in range(attempts):
        add = subprocess.run(["git", "-C", str(where), "add", "--", *map(os.path.abspath, existing)], capture_output=True, text=True)  # fmt: skip
        commit = add.returncode == 0 and subprocess.run(
            ["git", "-C", str(where), "commit", "-q", "-m", message, "--", *map(os.path.abspath, existing)],
            capture_output=True, text=True,
        )  # fmt: skip
        if commit and commit.returncode == 0:
            return True
        error = (commit.stderr if commit else add.stderr) or ""
        if "index.lock" not in error:
            print(f"commit of {len(existing)} file(s) failed: {error.strip()}", flush=True)
            return False
        time.sleep(5)
    return False


def run_files(args: argparse.Namespace, method: str, seed: int) -> list[Path]:
    folder = convergence.run_dir(args, method, seed)
    files = (convergence.METRICS_FILE, convergence.RUN_FILE, convergence.EVAL_FILE)
    return [folder / name for name in files] + [convergence.task_root(args) / convergence.STUDY_FILE]  # fmt: skip


def run_stage(stage: str, results: Path, threads: int, commit: bool, argv: Sequence[str]) -> int:
    """Every pending run of the stage, one at a time, each in its own process; after each the
    report, and with `commit` the run's files and the report committed. Returns the failures."""
    store_plan(results)
    rates = sorted(LEARNING_RATES, reverse=True) if stage == "pilot" else [chosen_rate(results)]
    failed = 0
    command = shlex.join(["python", "benchmarks/sql_training_study.py", *argv])
    for rate in rates:
        args = stage_args(stage, results, rate, threads)
        convergence.record_study(args, {"plan_sha256": plan_digest(results)}, command=command)
        for method, seed in convergence.pending_runs(args):
            print(f"{stage} {method} seed {seed} at learning rate {fmt_rate(rate)}", flush=True)
            worker_argv = ["--results", str(results), "--threads", str(threads)]
            worker_argv += ["--worker", stage, method, str(seed), repr(rate)]
            environment = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}  # fmt: skip
            code = subprocess.run(
                [sys.executable, __file__, *worker_argv], env=environment
            ).returncode
            print(f"{stage} {method} seed {seed}: {'done' if code == 0 else f'failed ({code})'}", flush=True)  # fmt: skip
            failed += code != 0
            report = write_report(results)
            if commit and code == 0:
                files = [*run_files(args, method, seed), report, Path(results) / PLAN_FILE]
                files += [Path(results) / name for name in ("curves.png", "pilot.png")]
                message = f"#47: sql training study, {stage} {method} seed {seed} (lr {fmt_rate(rate)})"  # fmt: skip
                commit_files(files, message)
    return failed


# ----------------------------------------------------------------------------- the analysis


def load_study(results: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """The study's runs {arm: {seed: run}} (convergence.load_results), empty before it starts."""
    root = study_results(results)
    if not (root / TASK / convergence.STUDY_FILE).is_file():
        return {}
    return convergence.load_results(root, TASK)["runs"]


def complete_seeds(runs: Mapping[str, Mapping[int, Any]]) -> list[int]:
    """Seeds whose two runs both have all STEPS steps."""
    return [
        seed
        for seed in SEEDS
        if all(
            convergence._steps_done(runs.get(arm, {}).get(seed, {"records": []})) >= STEPS
            for arm in ARMS
        )
    ]


def gdpo_learned_area(runs: Mapping[str, Mapping[int, Any]], key: str, seeds: Sequence[int]) -> float | None:  # fmt: skip
    values = [learned_area(runs[BASELINE][seed]["records"], key) for seed in seeds]
    return float(np.mean(values)) if values else None


def primary_tests(runs: Mapping[str, Mapping[int, Any]]) -> list[dict[str, Any]]:
    """Per endpoint: the paired AUC differences mrtpo - gdpo by seed, their paired t-test (from
    2 seeds), Holm's adjusted p over the endpoints tested, and the prediction in reward units."""
    share = prediction()["share_central"]
    seeds = complete_seeds(runs)
    tests = []
    for key in ENDPOINTS:
        differences = convergence_powered.paired_differences(
            {arm: {s: runs[arm][s] for s in seeds} for arm in ARMS},
            PROPOSED,
            BASELINE,
            lambda run, key=key: area(run["records"], key),
        )
        rise = gdpo_learned_area(runs, key, seeds)
        tests.append(
            {
                "endpoint": key,
                "differences": differences,
                "test": paired_t(list(differences.values()))
                if len(differences) > 1
                else None,  # fmt: skip
                "gdpo_learned_area": rise,
                "predicted": None if rise is None else share * max(rise, 0.0),
            }
        )
    adjusted = holm({t["endpoint"]: t["test"]["p"] for t in tests if t["test"]})
    for test in tests:
        test["holm_p"] = adjusted.get(test["endpoint"])
        test["significant"] = test["holm_p"] is not None and test["holm_p"] <= ALPHA
    return tests


def reading(test: Mapping[str, Any]) -> str:
    """The plan's reading of one endpoint, and prediction against outcome."""
    result = test["test"]
    if result is None:
        return "not tested yet (fewer than 2 complete seeds)"
    if test["significant"]:
        text = "MRTPO learns faster" if result["mean"] > 0 else "MRTPO learns slower"
    else:
        text = f"no difference shown; the 95% t interval bounds it: [{result['low']:+.4f}, {result['high']:+.4f}]"  # fmt: skip
    predicted = test["predicted"]
    if predicted is None:
        return text
    if result["low"] <= predicted <= result["high"]:
        versus = "consistent with the prediction"
    elif result["high"] < predicted:
        versus = "smaller than predicted"
    else:
        versus = "larger than predicted"
    return f"{text}; {versus} ({predicted:+.4f})"


def noise_check(runs: Mapping[str, Mapping[int, Any]], plan: Mapping[str, Any]) -> str:
    """From CHECK_AFTER_SEEDS complete seeds: the measured SD of each endpoint's paired AUC
    difference, as a share of gdpo's learned area, against the sizing's assumption, and the
    power of the 5-seed plan for the central prediction under the measured SD."""
    seeds = complete_seeds(runs)
    assumed = plan["sizing"]["assumed_sd_share"]
    if len(seeds) < CHECK_AFTER_SEEDS:
        return f"(after {CHECK_AFTER_SEEDS} complete seeds; {len(seeds)} so far)\n"
    share = plan["prediction"]["share_central"]
    lines = [
        f"From {len(seeds)} complete seeds; assumed SD share {assumed:.3f}.",
        "",
        "| endpoint | gdpo learned area | SD of the paired difference | as a share of the area | predicted difference | power of 5 seeds, alpha 0.05 | alpha 0.025 |",  # fmt: skip
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for test in primary_tests(runs):
        values = list(test["differences"].values())
        sd = float(np.std(values, ddof=1))
        rise = test["gdpo_learned_area"]
        effect = share * max(rise, 0.0)
        powers = [paired_power(effect, sd, len(SEEDS), alpha) for alpha in (ALPHA, ALPHA / 2)]  # fmt: skip
        relative = sd / rise if rise > 0 else float("nan")
        lines.append(
            f"| {ENDPOINTS[test['endpoint']]} | {rise:+.4f} | {sd:.4f} | {relative:.3f} "
            f"| {effect:+.4f} | {powers[0]:.2f} | {powers[1]:.2f} |"
        )
    return "\n".join(lines) + "\n"


def steps_to_level(records: Sequence[Mapping[str, Any]]) -> int | None:
    """Steps to a summed training reward of LEVEL (rolling mean of WINDOW); NOT_REACHED for a
    complete run that never gets there; None for an unfinished run that has not (yet)."""
    values = convergence.curve(records, SUMMED, STEPS)
    done = values[~np.isnan(values)]
    reached = convergence.steps_to_threshold(list(done), LEVEL, WINDOW)
    if reached is not None:
        return reached
    return NOT_REACHED if len(done) == STEPS else None


# ----------------------------------------------------------------------------- the report


def _number(value: float | None, digits: int = 3, sign: bool = False) -> str:
    return convergence._cell(value, digits, sign)


def pilot_table(rule: Mapping[str, Any]) -> str:
    lines = [
        "| learning rate | steps done | summed reward, steps 1-5 | steps 6-10 | rises | collapse |",
        "|---:|---:|---:|---:|---|---|",
    ]
    for rate, part in rule["rates"].items():
        lines.append(
            f"| {fmt_rate(rate)} | {part['steps']} | {_number(part['early'])} | {_number(part['late'])} "
            f"| {'yes' if part['rises'] else 'no'} | {part['collapse'] or 'none'} |"
        )
    chosen = (
        f"**The study's learning rate: {fmt_rate(rule['chosen'])}.**"
        if rule["complete"]
        else "The pilot is not complete: no rate is chosen yet."
    )
    return "\n".join(lines) + "\n\n" + chosen + "\n"


def primary_table(tests: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "| endpoint (AUC) | "
        + " | ".join(f"seed {s}" for s in SEEDS)
        + " | n | mean | 95% t interval | p | Holm p | significant | gdpo learned area | predicted |",  # fmt: skip
        "|---|" + "---:|" * (len(SEEDS) + 5) + "---|---:|---:|",
    ]
    for test in tests:
        cells = [_number(test["differences"].get(s), 4, sign=True) for s in SEEDS]
        result = test["test"]
        summary = (
            f"{result['n']} | {result['mean']:+.4f} | [{result['low']:+.4f}, {result['high']:+.4f}] "
            f"| {result['p']:.3g} | {test['holm_p']:.3g} | {'yes' if test['significant'] else 'no'}"
            if result
            else f"{len(test['differences'])} | – | – | – | – | –"
        )
        lines.append(
            f"| {ENDPOINTS[test['endpoint']]} | " + " | ".join(cells) + f" | {summary} "
            f"| {_number(test['gdpo_learned_area'], 4, sign=True)} | {_number(test['predicted'], 4, sign=True)} |"  # fmt: skip
        )
    lines.append("")
    lines += [f"- {ENDPOINTS[t['endpoint']]}: {reading(t)}." for t in tests]
    return "\n".join(lines) + "\n"


def per_run_table(runs: Mapping[str, Mapping[int, Any]]) -> str:
    """Per arm and seed: steps done, both AUCs, the step-1 summed reward (the same sample in
    both arms of a seed), steps to the level, final test execution accuracy."""
    lines = [
        f"| arm | seed | steps done | AUC execution | AUC summed | step-1 summed | steps to {LEVEL:g} | test execution, sampled | greedy |",  # fmt: skip
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, seeds in runs.items():
        for seed, run in sorted(seeds.items()):
            first = convergence.curve(run["records"], SUMMED, STEPS)[0]
            reached = steps_to_level(run["records"])
            evaluation = run["eval"] or {}
            accuracy = [((evaluation.get(part) or {}).get("sql_execution") or {}).get("mean") for part in ("sampled", "greedy")]  # fmt: skip
            lines.append(
                f"| {arm} | {seed} | {convergence._steps_done(run)} "
                f"| {_number(area(run['records'], EXECUTION))} | {_number(area(run['records'], SUMMED))} "
                f"| {_number(None if math.isnan(first) else float(first))} "
                f"| {'–' if reached is None else reached} | {_number(accuracy[0])} | {_number(accuracy[1])} |"
            )
    return "\n".join(lines) + "\n"


def secondary_table(runs: Mapping[str, Mapping[int, Any]]) -> str:
    """Paired mrtpo - gdpo of the secondary endpoints over the complete, evaluated seeds."""

    def accuracy(part: str, name: str) -> Any:
        return lambda run: ((run["eval"] or {}).get(part) or {}).get(name, {}).get("mean")

    def steps(run: Mapping[str, Any]) -> float | None:
        value = steps_to_level(run["records"])
        return None if value is None else float(value)

    metrics = [(f"steps to a summed reward of {LEVEL:g} ({NOT_REACHED}: not reached)", steps)]
    for part in ("sampled", "greedy"):
        for name in ("sql_execution", "sql_executable", "sql_format"):
            metrics.append((f"test {name}, {part}", accuracy(part, name)))
    lines = ["| metric | n | mean mrtpo - gdpo | 95% t interval |", "|---|---:|---:|---:|"]
    for label, value in metrics:
        differences = list(convergence_powered.paired_differences(runs, PROPOSED, BASELINE, value).values())  # fmt: skip
        summary = convergence_powered.paired_cells(differences, 4)
        lines.append(f"| {label} | {len(differences)} | {summary} |")
    return "\n".join(lines) + "\n"


def cost_tables(results: Path, runs: Mapping[str, Mapping[int, Any]]) -> str:
    """Time (`convergence.time_table`: each run's median step wall time, the CPU seconds a step
    as that times the CPU share of its timed training, so a run killed and resumed is not
    undercounted) for the pilot and the study; then each run's starts of training, peak memory
    and the commit(s) it trained from."""
    pilot = {f"pilot lr {fmt_rate(rate)}": {PILOT_SEED: run} for rate, run in load_pilot_runs(results).items()}  # fmt: skip
    text = "Pilot:\n\n" + convergence.time_table({"runs": pilot})
    if runs:
        text += "\nStudy (ratios to gdpo paired by seed):\n\n" + convergence.time_table(
            {"runs": runs}
        )
    lines = [
        "| run | steps | starts of training | peak RSS GB | commit(s) |",
        "|---|---:|---:|---:|---|",
    ]
    named = [(name, seeds[PILOT_SEED]) for name, seeds in pilot.items()]
    named += [(f"{arm} seed {seed}", run) for arm, seeds in runs.items() for seed, run in sorted(seeds.items())]  # fmt: skip
    for name, run in named:
        record = run["run"]
        if not record:
            continue
        sessions = record.get("sessions", [])
        commits = sorted({(session.get("commit") or "?")[:10] for session in sessions})
        lines.append(
            f"| {name} | {len(run['records'])} | {len(sessions)} "
            f"| {_number(record.get('peak_rss_mb', 0) / 1024, 1)} | {', '.join(commits)} |"
        )
    return text + "\n" + "\n".join(lines) + "\n"


def plot_curves(runs: Mapping[str, Mapping[int, Any]], path: Path) -> None:
    """Both primary endpoints per step: a thin line per seed and the mean over seeds per arm."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.2), dpi=100)
    x = np.arange(1, STEPS + 1)
    colors = {BASELINE: "tab:blue", PROPOSED: "tab:orange"}
    for index, (key, label) in enumerate(ENDPOINTS.items()):
        axes = figure.add_subplot(1, 2, index + 1)
        for arm, seeds in runs.items():
            curves = [convergence.curve(run["records"], key, STEPS) for run in seeds.values()]
            curves = [c for c in curves if not np.isnan(c).all()]
            for values in curves:
                axes.plot(x, values, color=colors[arm], linewidth=0.7, alpha=0.4)
            if curves:
                with np.errstate(all="ignore"):
                    mean = np.nanmean(np.vstack(curves), axis=0) if len(curves) > 1 else curves[0]
                axes.plot(x, mean, color=colors[arm], linewidth=2, label=f"{arm} (mean of {len(curves)} seeds)")  # fmt: skip
        axes.set_xlabel("step")
        axes.set_ylabel(f"training {label} (mean of the step)")
        axes.set_xticks(range(0, STEPS + 1, 5))
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, format="png")


def plot_pilot(pilot: Mapping[float, Sequence[Mapping[str, Any]]], path: Path) -> None:
    """The pilot's summed training reward per step, one line per learning rate."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4), dpi=100)
    axes = figure.add_subplot(1, 1, 1)
    x = np.arange(1, PILOT_STEPS + 1)
    for rate, records in pilot.items():
        if records:
            axes.plot(x, convergence.curve(records, SUMMED, PILOT_STEPS), marker=".", label=f"lr {fmt_rate(rate)}")  # fmt: skip
    axes.set_xlabel("step")
    axes.set_ylabel("summed training reward (mean of the step)")
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, format="png")


NOT_STARTED = "(no study run yet)\n"


def write_report(results: Path = RESULTS) -> Path:
    """README.md, curves.png and pilot.png in `results`, from its files alone."""
    results = Path(results)
    plan = convergence._read_json(results / PLAN_FILE)
    if plan is None:
        raise SystemExit(f"no {results / PLAN_FILE}: store the plan first (--plan)")
    pilot = load_pilot(results)
    rule = pilot_rule(pilot)
    runs = load_study(results)
    plot_pilot(pilot, results / "pilot.png")
    plot_curves(runs, results / "curves.png")
    expected = plan["prediction"]
    seeds = complete_seeds(runs) if runs else []
    evaluated = sum(bool(run["eval"]) for seeds_ in runs.values() for run in seeds_.values())
    study = convergence._read_json(study_results(results) / TASK / convergence.STUDY_FILE)
    command = study["command"] if study else "(not started)"
    tests = primary_tests(runs) if runs else []
    text = f"""# Does the better step make faster learning? Qwen2.5-Coder-0.5B on SQL, gdpo vs mrtpo (beta 1)

Regenerated by `python benchmarks/sql_training_study.py --report` from the files in this folder
(issue #47). The study's command (resumable): `{command}`.

Progress: pilot {sum(part["steps"] for part in rule["rates"].values())} of {PILOT_STEPS * len(LEARNING_RATES)} steps; study {len(seeds)} of {len(SEEDS)} seeds complete (both arms, {STEPS} steps), {evaluated} of {len(SEEDS) * len(ARMS)} runs evaluated.

## The plan, as stored before the first pilot run

{plan["text"]}
Stored numbers: warm-up-weighted first-order gain {expected["warmup_weighted_gain"]:.3f}, predicted
share r {expected["share_central"]:+.3f} (range {expected["share_range"][0]:+.3f} to {expected["share_range"][1]:+.3f});
assumed SD share {plan["sizing"]["assumed_sd_share"]:.3f}; power: {"; ".join(f"{k} {v:.2f}" for k, v in plan["sizing"]["power"].items())}.

## The learning-rate pilot (gdpo, seed {PILOT_SEED}, {PILOT_STEPS} steps)

![pilot](pilot.png)

{pilot_table(rule)}
## Result

![training curves](curves.png)

Thin lines: one seed; thick: the mean over seeds.

### Primary: AUC differences mrtpo - gdpo, paired by seed (Holm over the two endpoints)

{primary_table(tests) if tests else NOT_STARTED}
### The noise assumption, checked after {CHECK_AFTER_SEEDS} seeds

{noise_check(runs, plan) if runs else NOT_STARTED}
### Per run

{per_run_table(runs) if runs else NOT_STARTED}
### Secondary (paired 95% t intervals, not corrected)

{secondary_table(runs) if runs else NOT_STARTED}
### Diagnostics per block of 5 steps (mean over steps and seeds)

{convergence_powered.diagnostics_table(runs, DIAGNOSTICS) if runs else NOT_STARTED}
## Cost and provenance

{cost_tables(results, runs)}"""
    path = results / "README.md"
    path.write_text(text)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--results", type=Path, default=RESULTS, help="results folder")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of a run")
    parser.add_argument("--commit", action="store_true", help="commit each finished run's files")
    stage = parser.add_mutually_exclusive_group(required=True)
    stage.add_argument("--plan", action="store_true", help="store the plan (refused if changed)")
    stage.add_argument("--pilot", action="store_true", help="the learning-rate pilot")
    stage.add_argument("--study", action="store_true", help="the study, at the pilot's rate")
    stage.add_argument("--report", action="store_true", help="only regenerate the report")
    stage.add_argument("--worker", nargs=4, metavar=("STAGE", "ARM", "SEED", "RATE"), help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args(argv)
    if args.threads < 1:
        raise SystemExit(f"--threads must be >= 1, got {args.threads}")
    if args.worker:
        name, method, seed, rate = args.worker
        worker(args.results, name, method, int(seed), float(rate), args.threads)
        return 0
    if args.plan:
        store_plan(args.results)
        print(f"plan stored in {args.results / PLAN_FILE}")
        return 0
    if args.report:
        print(f"wrote {write_report(args.results)}")
        return 0
    failed = run_stage("pilot" if args.pilot else "study", args.results, args.threads, args.commit, argv)  # fmt: skip
    print(f"{failed} run(s) failed" if failed else "all runs of the stage finished")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
