"""Does each step point uphill? Every estimator's update against the policy gradient, paired.

For a *state* (a policy and a task), P prompts x 4 responses are sampled once at temperature 1
and scored by the task's verifiers (`sample_batch`). They are cut into disjoint mini-batches of
the training shape (4 prompts x 4 responses: one optimizer step of the powered study). On each
mini-batch, every estimator's update is the gradient of the loss the trainer optimizes (TRL's
`_compute_loss` at the first iteration, with that estimator's advantages made by the trainer's
own code: the estimator registry, `MRTPOTrainer._token_advantages` and its replay), and it is
compared with a **reference direction**: the unbiased policy gradient of the expected reward
(sequence log-probability, each prompt's leave-one-out mean as the baseline, no std scaling),
for the summed reward and for each reward alone, built from the *other* mini-batches' prompts
only (the total minus the mini-batch's own part), so that an estimator and its reference share
no sample.

Measures per (mini-batch, estimator): the cosine with the reference, the gradient norm, the
first-order gain of the step the clip (max_grad_norm 1) allows, `ref . g / max(1, |g|)` (the
reference scaled to the mean over prompts of (1/G) sum_i a_i grad log p(y_i): d E[R] / d theta),
and for the token-level estimators the norm of the difference from GDPO's gradient.

Token advantages are affine in beta (also where the bounded normalization engages: the same
branch at every beta), and so is the loss gradient: an estimator at beta is
`(1 - beta) g_gdpo + beta g_1`. So each token-level variant is measured once, at beta = 1, and
its values at beta 0.25 and 0.5 come from the stored dot products (`blend`), exact
(`tests/test_update_quality_bench.py` checks against a direct computation at beta 0.5).

Two passes, resumable, in `--lanes` processes (each takes the mini-batches b with
b % lanes == lane): `reference` (each mini-batch's per-reward reference part, summed per lane
into `checkpoints/reference-lane<i>.pt`) and `measure` (each mini-batch again: its reference part
subtracted from the total, every estimator's gradient, dot products streamed, one
`measures/batch<b>.json`). Samples are committed (`samples/batch<b>.json`, token ids included)
so a measurement resumes on another machine from the same responses.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/update_quality.py --state smollm2_tool_calling \
        --sample pilot --lane 0 --lanes 2 &   # and --lane 1 beside it
    .venv/bin/python benchmarks/update_quality.py --power --state smollm2_tool_calling
    .venv/bin/python benchmarks/update_quality.py --report

The second plan (`update_quality_plan2.py`, `plan-2.json`) has its own state, power step and
report (`update_quality_plan2_analysis.py`, `update_quality_plan2_report.py`):
`--power --state qwen_instructions` sizes its main sample by its rule and budget, and
`--report` writes `plan-2-report.md` beside README.md. Its new-token cap is decided after the
pilot's samples (`--sample pilot --sample_only`, then `--decide_cap`: `update_quality_cap.py`)
into `qwen_instructions/cap.json`, which every later step reads. Its main sample may be sampled
before the power step (`--sample main --sample_only --ahead N`: `main_batches`).

A checkpoint state (`update_quality_states.CHECKPOINT_STATES`, in neither plan) measures a
policy a training run kept along the way: its main sample alone, of a fixed size and folds,
drawn fresh from that policy on the main sample's prompts; grpo, gdpo and its few token-level
variants; no pilot, power step or cap decision. Its policy folder is a path relative to the
repository root (run from the main checkout, the code from a pinned worktree), refused while
absent; its weights' digest is kept in run.json. The SQL training study's item 2
(`--state qwen_sql_gdpo_seed0_step10 --results benchmarks/results/sql-training-study/step-at-10`)
is reported by that study's report.

What a run keeps of the rewards' own references (`--reward_references per_fold|whole|none`;
the summed reward's is always kept per fold) and what that costs: `update_quality_references.py`.
A run whose references do not fit `--memory_limit_gb` (default: this machine's memory less a
margin for the model) is refused before any pass, naming the setting that fits;
`--memory_estimate` prints the three settings' estimates without running.

The code: `update_quality_states.py` (the states, the plan, sampling), `update_quality_passes.py`
(the gradient passes, lanes), `update_quality_resume.py` (resuming), `update_quality_weights.py`
(the weights' statistics), `update_quality_analysis.py` (measures, tests, power),
`update_quality_report.py` (the report); the paired statistics in `paired_stats.py`. This script
is the command line, and the one name (`import update_quality`) under which the rest is reached.

Results: `benchmarks/results/update-quality/` (README.md, cosines.png, plan.json; plan-2.json,
plan-2.md, plan-2-report.md; per state and sample: samples/, measures/, run.json; power.json
from the pilot; folds/: the first plan's states measured again with folds).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The benchmark's names, reached as `update_quality.<name>` by the tests and sql_training_study.
from paired_stats import paired_power  # noqa: E402, F401
from update_quality_analysis import *  # noqa: E402, F403
from update_quality_analysis import load_measures, power_calculation, precision_comparison  # noqa: E402
from update_quality_cap import *  # noqa: E402, F403
from update_quality_cap import decide_cap, lane_cap  # noqa: E402
from update_quality_passes import *  # noqa: E402, F403
from update_quality_passes import Lane, lane_memory, run_lane  # noqa: E402
from update_quality_plan2 import PLAN_2_FILE, plan_2  # noqa: E402
from update_quality_plan2_analysis import power_2, stored_plan_2  # noqa: E402
from update_quality_plan2_report import write_plan_2_report  # noqa: E402
from update_quality_references import *  # noqa: E402, F403
from update_quality_references import REWARD_REFERENCES, config_parameters, estimate  # noqa: E402
from update_quality_report import *  # noqa: E402, F403
from update_quality_report import write_report  # noqa: E402
from update_quality_states import *  # noqa: E402, F403
from update_quality_states import (  # noqa: E402
    ALL_STATES,
    CHECKPOINT_STATES,
    PILOT_BATCHES,
    PLAN_2_STATES,
    POWER_FILE,
    RESULTS,
    RUN_FILE,
    SAMPLES,
    State,
    main_sample_size,
    max_batches,
    read_json,
    record_plan,
    sample_dir,
    state_dir,
    state_estimators,
    write_json,
)
from update_quality_weights import *  # noqa: E402, F403

# ----------------------------------------------------------------------------- command line


def main_batches(results: Path, state: str, ahead: int | None = None) -> int:
    """The main sample's size: the pilot's power calculation (`--power`) decides it, a
    checkpoint state fixes it. `ahead` (`--ahead`, with `--sample_only`): that many sampled
    before the power step, while the machine's memory goes to another state's pass; a
    mini-batch's prompts and seed follow from its index alone (`batch_rows`, `seed_base`), so
    these are the very mini-batches the main run would draw. The measure pass then refuses
    while any sampled ahead lies beyond the power step's number: those are removed unmeasured,
    so that no measured sample is chosen after the fact."""
    batches = main_sample_size(results, state)
    if ahead is not None:
        if batches is not None:
            raise SystemExit(
                f"--ahead {ahead}: {state}'s main sample is sized already ({batches} mini-batches, "
                f"{state_dir(results, state) / POWER_FILE}): run without --ahead"
            )
        if ahead < 1:
            raise SystemExit(f"--ahead must be at least 1, got {ahead}")
        return ahead
    if batches is None:
        raise SystemExit(
            f"no {state_dir(results, state) / POWER_FILE}: run the pilot and --power first"
        )
    folder = sample_dir(results, state, "main") / "samples"
    beyond = sorted(p.name for p in folder.glob("batch*.json") if int(p.stem[5:]) >= batches)
    if beyond:
        raise SystemExit(
            f"{folder}: {', '.join(beyond)} sampled ahead beyond the main sample's {batches} "
            f"mini-batches ({POWER_FILE}): remove them (unmeasured) first"
        )
    return batches


FOLDS = 4  # --folds' default (a checkpoint state's: its own)


def run_folds(args: argparse.Namespace) -> int:
    """The folds of a run: a checkpoint state's own (measured as it was defined: its main
    sample, no pilot, no power step, no cap decision), else `--folds` (default FOLDS)."""
    state = CHECKPOINT_STATES.get(args.state)
    if state is None:
        return FOLDS if args.folds is None else args.folds
    refused = [
        flag
        for flag, given in (
            ("--sample pilot", args.sample == "pilot"),
            ("--power", args.power),
            ("--decide_cap", args.decide_cap),
            ("--cap", args.cap is not None),
            (f"--folds {args.folds}", args.folds not in (None, state.folds)),
        )
        if given
    ]
    if refused:
        raise SystemExit(
            f"{args.state} is a checkpoint state: {state.batches} main mini-batches in "
            f"{state.folds} folds, fixed in advance (no pilot, power step or cap decision); "
            f"leave out {', '.join(refused)}"
        )
    return state.folds


def prompt_batches(state: State) -> int:
    """The most mini-batches of the main sample the state's train split holds."""
    from mrtpo import tasks

    return max_batches(len(tasks.get(state.task).load("train", path=state.data)), "main")


def memory_estimate(lane: Lane) -> list[str]:
    """Each `--reward_references` setting's estimate for a lane's run, from the policy's config
    and the task's rewards (no weights read; the cold start counted as the model it starts
    from)."""
    import convergence_runs

    from mrtpo import tasks
    from mrtpo.models import resolve_model_path

    state = ALL_STATES[lane.state_name]
    model = convergence_runs._default_model() if state.model == "cold_start" else state.model
    if lane.state_name in CHECKPOINT_STATES and not Path(model, "config.json").is_file():
        model = CHECKPOINT_STATES[lane.state_name].start  # not kept yet: the same architecture
    parameters = config_parameters(resolve_model_path(model))
    settings = lane_memory(lane, parameters, len(tasks.get(state.task).verifiers()))
    return [estimate(**{**settings, "mode": mode}).describe() for mode in REWARD_REFERENCES]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--results", type=Path, default=RESULTS)
    add("--state", choices=list(ALL_STATES))
    add("--sample", choices=SAMPLES, default="main")
    add("--lane", type=int, default=0)
    add("--lanes", type=int, default=1)
    add("--device", default="cpu")
    add(
        "--store_dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="dtype the references are held in while the gradients stream past (bfloat16 for "
        "the 0.5B model, whose float32 references would not fit beside its gradient)",
    )
    add(
        "--rows_per_forward",
        type=int,
        help="rows per forward pass, whole groups (default: the whole mini-batch; smaller "
        "bounds the activations' memory)",
    )
    add(
        "--recompute",
        action="store_true",
        help="one forward per direction and chunk (memory of one gradient, not one per direction)",
    )
    add(
        "--bf16",
        action="store_true",
        help="TRL's bf16 mixed precision (autocast; float32 weights): decide it before a state's "
        "first measurement, after checking on another state that its cosines are unchanged",
    )
    add(
        "--folds",
        type=int,
        help="disjoint folds of mini-batches (b %% folds) the references are kept in, so that "
        "the intervals count the shared reference (the fold jackknife); at most one per "
        f"mini-batch (default {FOLDS}; a checkpoint state's are its own)",
    )
    add(
        "--reward_references",
        choices=REWARD_REFERENCES,
        default="per_fold",
        help="what is kept of the rewards' own references (the summed reward's is kept per "
        "fold): per_fold, whole (one sum per reward: per-reward cosines with paired-t "
        "intervals) or none (per-reward cosines not measured); update_quality_references.py",
    )
    add(
        "--memory_limit_gb",
        type=float,
        help="what the references may take (default: this machine's memory less, per lane, the "
        "model's weights, gradient and a flat copy, a chunked layout's gradient sums and 4 GB)",
    )
    add(
        "--memory_estimate",
        action="store_true",
        help="print each --reward_references setting's memory estimate for this run, then stop",
    )
    add(
        "--cap",
        type=int,
        help="the second plan's new-token cap: a pilot sampled again at it (with --sample_only, "
        "into <state>/pilot-cap<cap>/), or --decide_cap by hand; otherwise cap.json's",
    )
    add("--sample_only", action="store_true", help="sample the mini-batches, then stop")
    add(
        "--ahead",
        type=int,
        help="--sample main --sample_only before the power step: sample the main sample's "
        "first N mini-batches now (those beyond the power step's number are removed unmeasured)",
    )
    add(
        "--commit",
        action="store_true",
        help="git-commit each mini-batch's sample and measure file (and run.json) as written, so "
        "a measurement longer than a machine is kept resumes on another: only the reference "
        "pass and the mini-batch under way are redone",
    )
    add(
        "--decide_cap",
        action="store_true",
        help="decide the second plan's cap from its pilots' samples by the plan's rule (or "
        "--cap N --reason TEXT by hand) into <state>/cap.json, then stop",
    )
    add("--reason", help="--decide_cap --cap: why the cap is decided by hand")
    add(
        "--power",
        action="store_true",
        help="size the main sample from the pilot, then stop (the second plan's state: by its "
        "rule, capped by its budget over the pilot's CPU seconds per mini-batch)",
    )
    add("--max_batches", type=int, help="--power: a cap on the main sample (the budget's)")
    add(
        "--report",
        action="store_true",
        help="regenerate the reports from the results files (README.md: the first plan; "
        "plan-2-report.md: the second)",
    )
    add(
        "--compare_with",
        type=Path,
        help="another results folder holding the same --state and --sample measured another "
        "way (e.g. --bf16): print and store how much the cosines changed, then stop",
    )
    args = parser.parse_args(argv)
    if args.report:
        print(write_report(args.results))
        print(write_plan_2_report(args.results))
        return 0
    if args.state is None:
        parser.error("--state is required unless --report")
    if args.ahead is not None and (args.sample != "main" or not args.sample_only):
        parser.error("--ahead samples the main sample only: with --sample main --sample_only")
    folds = run_folds(args)
    if args.decide_cap:
        decided = decide_cap(
            args.results, args.state, stored_plan_2(args.results), args.cap, args.reason
        )
        print(json.dumps(decided, indent=1))
        return 0
    if args.compare_with is not None:
        measured = [
            load_measures(r).get(args.state, {}).get(args.sample)
            for r in (args.results, args.compare_with)
        ]
        if not all(measured):
            raise SystemExit(f"{args.state} {args.sample}: not measured in both results folders")
        compared = precision_comparison(*measured, state_estimators(args.state))
        write_json(
            sample_dir(args.compare_with, args.state, args.sample) / "comparison.json", compared
        )
        print(json.dumps(compared, indent=1))
        return 0
    if args.power:
        pilot = load_measures(args.results, [args.state]).get(args.state, {}).get("pilot")
        if not pilot or len(pilot) < PILOT_BATCHES:
            raise SystemExit(f"{args.state}: the pilot is not complete")
        if args.state in PLAN_2_STATES:  # the second plan's rule, from the stored plan
            power = power_2(
                pilot,
                read_json(sample_dir(args.results, args.state, "pilot") / RUN_FILE),
                stored_plan_2(args.results),
                prompt_batches(ALL_STATES[args.state]),
                args.max_batches,
            )
        else:
            power = power_calculation(pilot, args.max_batches or 10_000)
        write_json(state_dir(args.results, args.state) / POWER_FILE, power)
        print(json.dumps(power, indent=1))
        return 0
    if folds < 1:
        parser.error(f"--folds must be at least 1, got {folds}")
    if not 0 <= args.lane < args.lanes:
        parser.error(f"--lane must be in [0, --lanes), got {args.lane} of {args.lanes}")
    only_sampling = args.sample_only or args.memory_estimate  # (the cap sets no memory)
    cap = lane_cap(args.results, args.state, args.sample, args.cap, only_sampling)
    if not args.memory_estimate and args.state not in CHECKPOINT_STATES:  # in neither plan
        record_plan(args.results)
        if args.state in PLAN_2_STATES:  # the second plan, stored before its first measurement
            record_plan(args.results, plan_2(), PLAN_2_FILE)
    batches = (
        PILOT_BATCHES
        if args.sample == "pilot"
        else main_batches(args.results, args.state, args.ahead)
    )
    lane = Lane(
        args.results,
        args.state,
        args.sample,
        batches,
        args.lane,
        args.lanes,
        args.device,
        args.store_dtype,
        args.rows_per_forward,
        args.recompute,
        args.bf16,
        folds=folds,
        reward_references=args.reward_references,
        memory_limit_gb=args.memory_limit_gb,
        cap=cap,
        sample_only=args.sample_only,
        commit=args.commit,
    )
    if args.memory_estimate:
        print("\n".join(memory_estimate(lane)))
        return 0
    run_lane(lane)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
