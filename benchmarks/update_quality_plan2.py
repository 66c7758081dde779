"""The update-quality benchmark's second plan (issue #48: whose information moves the step?),
written before its first measurement and stored in `plan-2.json` (and its text in `plan-2.md`)
beside the first plan's `plan.json`, which stays as it was; a run under another second plan is
refused (`update_quality_states.record_plan`).

    .venv/bin/python benchmarks/update_quality_plan2.py   # store it, or check the stored one
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from update_quality_states import (  # noqa: E402
    ALPHA,
    EFFECT_SHARE,
    GROUP_SIZE,
    MAX_GRAD_NORM,
    PILOT_BATCHES,
    PLAN_2_STATES,
    POWER,
    PROMPTS_PER_BATCH,
    RESULTS,
    TOKEN_VARIANTS,
    record_plan,
)

PLAN_2_FILE, PLAN_2_TEXT = "plan-2.json", "plan-2.md"
# The first plan's variants, and the new ones: the generic context and contrastive relevance
# (the trainer's switches that make each, at beta 1; beta 0.5 is blended as in the first plan).
TOKEN_VARIANTS_2: dict[str, dict[str, Any]] = {
    **TOKEN_VARIANTS,
    "generic": {"replay_information": "generic", "shuffle_token_weights": False, "token_relevance": "replay"},
    "contrastive": {"replay_information": "own", "shuffle_token_weights": False, "token_relevance": "contrastive"},
}  # fmt: skip
ESTIMATORS_2: dict[str, tuple[str, float | None]] = {
    "gdpo": ("gdpo", None),
    "mrtpo(0.5)": ("mrtpo", 0.5),
    "mrtpo(1)": ("mrtpo", 1.0),
    "placebo(0.5)": ("placebo", 0.5),
    "generic(0.5)": ("generic", 0.5),
    "entropy(0.5)": ("entropy", 0.5),
    "contrastive(0.5)": ("contrastive", 0.5),
    "contrastive(1)": ("contrastive", 1.0),
}
PRIMARY_CONTRASTS_2 = (
    ("mrtpo(0.5)", "gdpo"),
    ("mrtpo(0.5)", "placebo(0.5)"),
    ("contrastive(0.5)", "mrtpo(0.5)"),
)
SECONDARY_CONTRASTS_2 = (
    ("mrtpo(0.5)", "generic(0.5)"),
    ("generic(0.5)", "gdpo"),
    ("mrtpo(0.5)", "entropy(0.5)"),
    ("mrtpo(1)", "gdpo"),
    ("contrastive(1)", "mrtpo(1)"),
    ("placebo(0.5)", "gdpo"),
)
FOLDS = 4  # the references' folds (`update_quality.py --folds`): the jackknife's F
# The first plan's states measured again with folds: a results folder of its own, whose first
# plan states get the second plan's variants too (`update_quality_passes.variants_of`).
FOLDS_RESULTS = "folds"
CAP_CANDIDATES = (256, 384, 512)
CAP_SHARE = 0.2
BUDGET_CPU_HOURS = 10.0

CAP_RULE = f"""\
The new-token cap: the pilot is sampled at {CAP_CANDIDATES[0]} new tokens; if more than
{CAP_SHARE:.0%} of its responses stop at the cap, it is sampled again at the next of
{", ".join(map(str, CAP_CANDIDATES[1:]))} (the first at which at most {CAP_SHARE:.0%} do; {CAP_CANDIDATES[-1]} if
none), into a fresh folder, and the main sample uses the same cap. The share at the cap is
reported. A capped response is scored as it stands: a constraint on the whole text (length,
ending, format) is judged on the cut text, usually failed; a constraint met early (a keyword,
a language) keeps its verdict."""

ANALYSIS_2 = f"""\
Written before the first measurement of the second plan and stored in `plan-2.json`; the first
plan (`plan.json`) and its results stay as they were, and the page says which plan each number
comes from. A run with another second plan is refused.

- **State**: qwen_instructions, Qwen2.5-Coder-0.5B-Instruct as installed on the bundled
  multi-constraint instruction-following task (one reward per constraint slot, 1-6 per prompt).
  The placebo gives each replayed (row, reward) another prompt's constraint that exists
  (`mrtpo.relevance.controls.placebo_infos`: the partner's slot, else another of its slots or
  of the next prompts'), so that a placebo is a placebo; the shares of replayed pairs whose
  placebo equals the own text or is empty are reported.
- **Cap**: {CAP_RULE}
- **Estimators**: gdpo; mrtpo at beta 0.5 and 1; placebo(0.5); generic(0.5) (every reward
  replayed with one fixed reward-agnostic text of the own text's token length); entropy(0.5);
  contrastive(0.5) and contrastive(1) (each token's distance under the own information minus
  its distance under the placebo's, clamped at 0).
- **Primary endpoint**: as the first plan's: per mini-batch (4 prompts x 4 responses), the
  cosine between an estimator's update and the leave-batch-out policy gradient of the summed
  reward.
- **Primary contrasts**: mrtpo(0.5) - gdpo, mrtpo(0.5) - placebo(0.5),
  contrastive(0.5) - mrtpo(0.5); Holm's step-down correction over the three, family-wise
  alpha = {ALPHA}. **Intervals**: the fold jackknife ({FOLDS} folds of mini-batches, b % {FOLDS}; the
  reference of each mini-batch kept per fold, fold f left out of the mean and of every
  reference, t with {FOLDS - 1} degrees of freedom; `paired_stats.fold_jackknife`), which counts the
  reference's noise shared by every mini-batch; the paired t over mini-batches is printed
  beside it, marked as not counting it.
- **Sample size**: by the first plan's rule: a pilot of {PILOT_BATCHES} mini-batches of other
  prompts; the number of mini-batches for power {POWER} to detect {EFFECT_SHARE:.0%} of gdpo's
  mean pilot cosine in mrtpo(0.5) - gdpo at alpha {ALPHA}/3 (Holm's first step), with the
  pilot's fold-jackknife standard error scaled to n mini-batches; capped by the budget, about
  {BUDGET_CPU_HOURS:g} CPU-hours for the state's main sample (the pilot's cost apart; Qwen SQL's
  mini-batch cost 0.6 CPU-hours with 3 rewards and 6 directions), and the power then reached
  stated. No mini-batch is dropped or replaced.
- **Secondary** (uncorrected, fold-jackknife intervals): the generic context (mrtpo(0.5) -
  generic(0.5), generic(0.5) - gdpo), the entropy control, beta = 1 (mrtpo(1) - gdpo,
  contrastive(1) - mrtpo(1)), placebo(0.5) - gdpo, the per-reward cosines, the cosines between
  the rewards' references, the weights' effective share of tokens and their overlap with the
  top-20% entropy tokens; on the first plan's two states (SmolLM2 tool calling, Qwen SQL),
  measured again from their committed samples with folds: gdpo, mrtpo(0.5), generic(0.5) and
  contrastive(0.5), and the first plan's primary contrasts with fold-jackknife intervals beside
  the pre-registered ones (which stay as they were).
- **Reading**, fixed in advance ("differs" = significant after Holm):
  - mrtpo(0.5) above the placebo: the information matters (the replay's weights depend on
    what the verifier says, not only on a context being there);
  - mrtpo(0.5) not above the placebo, with the placebo a placebo (its shares reported): the
    information is not what moves the step at this scale, the interval bounding it;
  - generic(0.5) equal to mrtpo(0.5) (secondary: the interval of their difference holds 0 and
    is narrower than the primary effect): the replay finds uncertain tokens, not relevant ones;
  - contrastive(0.5) above mrtpo(0.5): the contrast is worth its replay (1.6-2.0x the plain
    replay's cost); not above: the plain replay stays the default;
  - mrtpo(0.5) above gdpo: the reallocation points the step further uphill on this task;
    below: it displaces the uniform signal (the dose-response mrtpo(0.5), mrtpo(1) says how);
  - any other pattern is reported as it is, with its direction.
"""


def plan_2(states: dict[str, Any] | None = None) -> dict[str, Any]:
    """The second plan: what a run of its state compares against the stored `plan-2.json`."""
    states = PLAN_2_STATES if states is None else states
    return {
        "analysis": ANALYSIS_2,
        "states": {name: vars(state) for name, state in states.items()},
        "cap_rule": {"candidates": list(CAP_CANDIDATES), "max_capped_share": CAP_SHARE},
        "group_size": GROUP_SIZE,
        "prompts_per_batch": PROMPTS_PER_BATCH,
        "pilot_batches": PILOT_BATCHES,
        "folds": FOLDS,
        "estimators": {name: list(spec) for name, spec in ESTIMATORS_2.items()},
        "token_variants": TOKEN_VARIANTS_2,
        "primary_contrasts": [list(c) for c in PRIMARY_CONTRASTS_2],
        "secondary_contrasts": [list(c) for c in SECONDARY_CONTRASTS_2],
        "alpha": ALPHA,
        "holm_family": len(PRIMARY_CONTRASTS_2),
        "power": POWER,
        "effect_share": EFFECT_SHARE,
        "budget_cpu_hours": BUDGET_CPU_HOURS,
        "max_grad_norm": MAX_GRAD_NORM,
    }


# ----------------------------------------------------------------------------- deviations

DEVIATIONS_DATE = "2026-12-05"
# The installed Qwen2.5-Coder-0.5B-Instruct's trainable parameters (its input and output
# embeddings untied: 494M with them tied), counted from its config
# (`update_quality_references.config_parameters`).
QWEN_PARAMETERS = 630_167_424


def deviations_2() -> list[str]:
    """The deviations from the stored plan, decided before any measurement of its state, with
    their reasons (the report's section; plan-2.json and plan-2.md stay as stored)."""
    from update_quality_references import estimate

    def memory(mode: str, rewards: int) -> Any:
        return estimate(QWEN_PARAMETERS, rewards, mode, FOLDS, 16, store_dtype="bfloat16")

    planned, whole, none = (memory(mode, 6) for mode in ("per_fold", "whole", "none"))
    sql_whole, sql_none = memory("whole", 3), memory("none", 3)
    return [
        f"## Deviations from the stored plan (decided {DEVIATIONS_DATE}, before any measurement "
        "of its state)",
        "",
        "`plan-2.json` and `plan-2.md` stay as stored. Four things the stored plan asks could "
        "not run as written or had no place to be kept; each was decided before the first "
        "sample of `qwen_instructions`:",
        "",
        "1. **The rewards' references: per fold for the summed reward only.** The plan keeps "
        f"each reward's reference per fold: {planned.vectors} vectors (6 rewards x {FOLDS} folds) "
        f"of the installed Qwen2.5-Coder-0.5B-Instruct's {QWEN_PARAMETERS:,} trainable "
        f"parameters (its embeddings untied), {planned.reference_gb:.1f} GB in float32 in the "
        f"reference pass, {planned.measure_gb:.1f} GB in bfloat16 in the measure pass, up to "
        f"{planned.disk_gb:.0f} GB of checkpoints; the machines have 25 GB of memory. The "
        "primary endpoint and its fold jackknife need the summed reward's reference per fold "
        f"alone ({none.vectors} vectors). `--reward_references` sets what is kept of the "
        "rewards' own: `per_fold` (as planned, the default), `whole` (one sum per reward: the "
        "per-reward cosines then get paired-t intervals over mini-batches, which do not count "
        "the shared reference), `none` (the per-reward cosines and the cosines between the "
        "rewards' references are not measured: 'not measured (memory)'). Each run estimates "
        "its references' memory before any pass and is refused where they do not fit, naming "
        "the setting that does (`update_quality_references.py`). qwen_instructions runs with "
        f"`none` ({none.reference_gb:.1f} GB in the reference pass, {none.measure_gb:.1f} GB in "
        f"the measure pass; `whole`: {whole.reference_gb:.1f} GB), and so does Qwen SQL's "
        f"re-measurement (`whole`: {sql_whole.reference_gb:.1f} GB, `none`: "
        f"{sql_none.reference_gb:.1f} GB); SmolLM2's keeps `per_fold`.",
        "2. **The cap, decided after the pilot in a file of its own.** The stored state keeps "
        f"{CAP_CANDIDATES[0]} new tokens; the rule's decision is written after the pilot's "
        "samples to `qwen_instructions/cap.json` (`--decide_cap`: by the rule, or by hand "
        "with its reason recorded), which the pilot's measurement, the power step and the main "
        "sample read. The pilot is sampled alone first (`--sample_only`), so no pass runs at a "
        "cap the rule then drops; a pilot sampled again at a longer cap has its own folder "
        f"(`pilot-cap{CAP_CANDIDATES[1]}/`, `pilot-cap{CAP_CANDIDATES[2]}/`: the same prompts "
        "and seeds).",
        "3. **One set of variants for the re-measured first-plan states.** Measured again into "
        f"`{FOLDS_RESULTS}/`, SmolLM2 tool calling and Qwen SQL get the first plan's variants "
        "and `generic` and `contrastive`, so that the second plan's controls and variant are "
        "measured on all three states; the first plan's committed measures stay as they are.",
        "4. **The weight statistics, stored by the measure pass.** Per mini-batch, for each "
        "token-level variant but `shuffled` (mrtpo's weights permuted within the row: the same "
        "share, an overlap of 1/5 in expectation) and each reward: the effective share of "
        "tokens (sum w)^2 / (T sum w^2) over the response's trained tokens (the end token "
        "included), averaged over the replayed (row, reward) pairs, and the overlap of the "
        "top-fifth weighted tokens with the policy's top-fifth entropy tokens (the entropy "
        "control's forward; ties share their places), at beta 1 (`update_quality_weights.py`); "
        "the report gives their mean over the mini-batches and the range.",
        "",
    ]


def store(results: Path = RESULTS) -> Path:
    """Store the second plan (or check the stored one) and its text beside it."""
    record_plan(results, plan_2(), PLAN_2_FILE)
    text = Path(results) / PLAN_2_TEXT
    text.write_text("# Update quality: the second plan (issue #48)\n\n" + ANALYSIS_2)
    return text


if __name__ == "__main__":
    print(store())
