"""The SQL training study's item 2: the step measured at gdpo seed 0 after 10 steps
(`update_quality_states.CHECKPOINT_STATES`, `benchmarks/sql_training_study_step.py`).

The checkpoint state is the study's kept policy with the study's settings, kept out of both
plans; a run without the policy is refused naming the study run; a run measures grpo, gdpo and
mrtpo only, 9 mini-batches in 3 folds of 3 (end to end on the tiny model, with the policy's
digest in run.json); and the report's section on planted dot products gives the answers
computed here by hand (fold jackknife, paired t, gain ratios, capped share, mean rewards)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats
from trainer_toys import ContainsLetter, EvenLength, toy_dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import convergence_runs  # noqa: E402
import sql_training_study as study  # noqa: E402
import sql_training_study_plan as plan  # noqa: E402
import sql_training_study_step as step  # noqa: E402
import update_quality as uq  # noqa: E402
import update_quality_plan2 as plan2  # noqa: E402

NAME = step.STEP_STATE
STATE = uq.CHECKPOINT_STATES[NAME]
MEASURED = ["grpo", "gdpo", "mrtpo(0.25)", "mrtpo(0.5)", "mrtpo(1)"]


# ----------------------------------------------------------------------------- the state


def test_the_checkpoint_state_is_the_studys_kept_policy_in_neither_plan():
    rate = plan.chosen_rate(ROOT / plan.RESULTS)  # the pilot's rule on the committed pilot
    args = study.stage_args("study", plan.RESULTS, rate, 2)
    checkpoints = convergence_runs.run_dir(args, *plan.KEPT_RUN) / convergence_runs.CHECKPOINTS
    assert STATE.model == str(convergence_runs.kept_policy_dir(checkpoints, plan.KEPT_STEP))
    assert not Path(STATE.model).is_absolute()
    assert (STATE.task, STATE.max_completion_length) == (plan.TASK, plan.MAX_COMPLETION_LENGTH)
    assert STATE.learning_rate == rate == 3e-6 and STATE.start == plan.MODEL
    assert "gdpo seed 0" in STATE.kept_by and "step 10" in STATE.kept_by
    # 9 mini-batches in 3 folds of 3 (folds are b % 3); grpo, gdpo and mrtpo's three betas.
    assert (STATE.batches, STATE.folds) == (9, 3)
    assert [sum(b % 3 == f for b in range(9)) for f in range(3)] == [3, 3, 3]
    assert list(uq.state_estimators(NAME)) == MEASURED
    assert uq.variants_of(NAME) == {"mrtpo": uq.TOKEN_VARIANTS["mrtpo"]}
    assert uq.state_estimators("qwen_sql") == uq.ESTIMATORS
    # The first plan's qwen_sql main sample's prompts and sampling seeds (2000 + b).
    assert STATE.seed == uq.STATES["qwen_sql"].seed
    committed = uq.load_samples(ROOT / uq.RESULTS, "qwen_sql", "main")
    assert {b: r["seed"] for b, r in committed.items()} == {b: 2000 + b for b in range(9)}
    # In neither plan: both stored plans are what the code holds, without it.
    assert NAME not in uq.STATES and NAME not in uq.PLAN_2_STATES and NAME in uq.ALL_STATES
    stored = json.loads((ROOT / uq.RESULTS / uq.PLAN_FILE).read_text())
    assert stored == json.loads(json.dumps(uq.plan())) and NAME not in stored["states"]
    assert json.loads((ROOT / uq.RESULTS / plan2.PLAN_2_FILE).read_text()) == json.loads(
        json.dumps(plan2.plan_2())
    )


def test_without_its_policy_the_state_is_refused_naming_the_study_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the policy folder is relative: absent here
    results = tmp_path / "step-at-10"
    with pytest.raises(SystemExit, match=r"no policy in .*policy-step10 .*gdpo seed 0 .*step 10"):
        uq.checkpoint_policy(NAME)
    for refused in (["--sample", "pilot"], ["--power"], ["--folds", "4"], ["--cap", "256"]):
        with pytest.raises(SystemExit, match=f"checkpoint state: 9 main .*leave out {refused[0]}"):
            uq.main(["--state", NAME, "--results", str(results), *refused])
    assert not results.exists()  # nothing written


def test_the_memory_estimate_reads_the_architecture_it_was_trained_from(monkeypatch, capsys):
    """Before the policy is kept, `--memory_estimate` counts the model the run started from
    (the same architecture): 3 fold sums of the summed reward's reference fit where the
    rewards' own do not (the command in benchmarks/README.md)."""
    import mrtpo.models

    read = []
    monkeypatch.setattr(mrtpo.models, "resolve_model_path", lambda name: name)
    monkeypatch.setattr(uq, "config_parameters", lambda path: read.append(path) or 630_167_424)
    argv = ["--state", NAME, "--memory_estimate", "--recompute", "--store_dtype", "bfloat16"]
    argv += ["--rows_per_forward", "4", "--reward_references", "none", "--memory_limit_gb", "8.5"]
    monkeypatch.chdir(ROOT.parent)  # wherever the policy is or not
    assert uq.main(argv) == 0
    assert read == [plan.MODEL]
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == (
        "--reward_references none: 3 reference vectors of 630,167,424 parameters, 7.6 GB in the "
        "reference pass and 5.0 GB in the measure pass (limit 8.5 GB: fits); 15.1 GB of "
        "checkpoints"
    )
    assert "does not fit" in lines[0] and "does not fit" in lines[1]


@pytest.mark.usefixtures("one_torch_thread")
def test_a_checkpoint_state_measures_its_subset_in_three_folds_on_the_tiny_model(
    tmp_path, monkeypatch
):
    """The command on a checkpoint state of the tiny model (3 mini-batches, 3 folds): only
    grpo, gdpo and mrtpo are measured, each mini-batch in its own fold; no plan is written; the
    policy's digest is kept, and a resume from other weights is refused; the analysis of the
    subset runs (the fold jackknife, the comparison of two measurements)."""
    from mrtpo import tasks
    from mrtpo.testing import save_tiny

    policy = save_tiny(tmp_path / "policy-step10", seed=3)
    toy = uq.CheckpointState(
        task="toy", model=str(policy), max_completion_length=10, learning_rate=1e-3,
        batches=3, folds=3, start="tiny", kept_by="the toy run must pass step 10 first",
    )  # fmt: skip
    monkeypatch.setitem(uq.CHECKPOINT_STATES, "toy_step", toy)
    monkeypatch.setitem(uq.ALL_STATES, "toy_step", toy)
    task = SimpleNamespace(
        verifiers=lambda: [ContainsLetter(), EvenLength()],
        load=lambda split, path=None: toy_dataset(num_prompts=48),
    )
    monkeypatch.setattr(tasks, "get", lambda name: task)
    results = tmp_path / "results"
    assert uq.main(["--state", "toy_step", "--results", str(results)]) == 0

    folder = results / "toy_step" / "main"
    measured = [json.loads((folder / "measures" / f"batch{b:03d}.json").read_text()) for b in range(3)]  # fmt: skip
    for b, record in enumerate(measured):
        assert set(record["directions"]) == {"grpo", "gdpo", "mrtpo"}
        assert (record["folds"], record["fold"]) == (3, b)
    assert not (results / uq.PLAN_FILE).exists() and not (results / plan2.PLAN_2_FILE).exists()
    run = json.loads((folder / uq.RUN_FILE).read_text())
    digest = convergence_runs.weights_digest(policy)
    assert run["policy_sha256"] == digest == run["lanes"]["0"]["sessions"][0]["policy_sha256"]
    records = uq.load_measures(results, ["toy_step"])["toy_step"]["main"]
    assert [r["sample_batches"] for r in records] == [3, 3, 3]
    values = uq.per_estimator(records, estimators=uq.state_estimators("toy_step"))
    assert list(values) == MEASURED
    interval = uq.fold_interval(records, uq.mean_cosine("mrtpo(0.5)"))
    assert interval["n"] == 3 and interval["low"] <= interval["mean"] <= interval["high"]
    compared = uq.precision_comparison(records, records, uq.state_estimators("toy_step"))
    assert set(compared["contrasts"]) == {
        "mrtpo(0.5) - gdpo", "mrtpo(0.25) - gdpo", "mrtpo(1) - gdpo", "gdpo - grpo",
    }  # fmt: skip
    # Other weights in the policy's folder: the sample was drawn from another policy.
    save_tiny(policy, seed=4)
    with pytest.raises(SystemExit, match=f"sampled from the policy with sha256 {digest}"):
        uq.main(["--state", "toy_step", "--results", str(results)])


# ----------------------------------------------------------------------------- the report

T_2 = 4.302652729911275  # t quantile 0.975 on 2 degrees of freedom (3 folds)
GDPO = [0.30, 0.25, 0.35, 0.28, 0.32, 0.27, 0.31, 0.26, 0.33]
MRTPO = [0.40, 0.37, 0.44, 0.36, 0.43, 0.39, 0.42, 0.35, 0.45]  # mrtpo(1)
GRPO = [0.29] * 9
CROSS = 2.0  # gdpo's gradient . mrtpo(1)'s, both of norm 2


def planted(batch: int) -> dict:
    """A measured mini-batch of the checkpoint state whose answers are known: the summed
    reward's reference restricted to each fold is the same unit vector u (every fold Gram entry
    1), so each direction's cosine is the same on every set of folds; each direction of norm 2
    at its planted cosine c (dot 2c with u per fold)."""

    def entry(cosine: float) -> dict:
        return {"ref_dots": [6 * cosine], "ref_fold_dots": [[2 * cosine] * 3], "norm2": 4.0, "dot_gdpo": CROSS}  # fmt: skip

    return {
        "batch": batch,
        "folds": 3,
        "fold": batch % 3,
        "reward_names": ["sql_format", "sql_executable", "sql_execution"],
        "reward_references": "none",
        "ref_gram": [[9.0]],
        "ref_fold_gram": [[[[1.0] * 3] * 3]],
        "directions": {
            "grpo": entry(GRPO[batch]),
            "gdpo": {**entry(GDPO[batch]), "dot_gdpo": 4.0},
            "mrtpo": entry(MRTPO[batch]),
        },
    }


def planted_sample(batch: int) -> dict:
    """Mini-batch b's 16 responses: b + 1 of them at the 128-token cap; rewards (1, 1, 0) on
    the first 8 rows, (0, 0, 0) else, and (1, 1, 1) on row 0 of the even mini-batches."""
    rewards = [[1.0, 1.0, 0.0]] * 8 + [[0.0, 0.0, 0.0]] * 8
    if batch % 2 == 0:
        rewards = [[1.0, 1.0, 1.0]] + rewards[1:]
    return {
        "seed": 2000 + batch,
        "max_completion_length": 128,
        "completion_ids": [[7] * (128 if i <= batch else 20) for i in range(16)],
        "rewards": rewards,
        "reward_names": ["sql_format", "sql_executable", "sql_execution"],
    }


def write_step(results: Path, batches: int = 9) -> Path:
    folder = step.step_results(results) / NAME / "main"
    for b in range(batches):
        uq.write_json(folder / "measures" / f"batch{b:03d}.json", planted(b))
        uq.write_json(folder / "samples" / f"batch{b:03d}.json", planted_sample(b))
    lane = {"sessions": [{"commit": "0123456789abcdef"}], "batches": 9, "peak_rss_mb": 20.5 * 1024,
            "cpu_seconds": {"sample": 900.0, "reference": 1400.0, "measure": 5900.0}}  # fmt: skip
    uq.write_json(folder / uq.RUN_FILE, {"policy_sha256": "ab" * 32, "lanes": {"0": lane}})
    return folder


def jackknife(per_batch: list[float]) -> tuple[float, float, float]:
    """By hand: the mean over 9 mini-batches and its delete-one-fold 95% interval (fold f: the
    mini-batches b % 3 == f; the planted cosines do not change as folds leave the reference)."""
    estimate = float(np.mean(per_batch))
    deleted = [np.mean([v for b, v in enumerate(per_batch) if b % 3 != f]) for f in range(3)]
    error = math.sqrt(2 / 3 * sum((d - np.mean(deleted)) ** 2 for d in deleted))
    return estimate, estimate - T_2 * error, estimate + T_2 * error


def cell(estimate: float, low: float, high: float, n: int = 3) -> str:
    return f"{estimate:+.4f} [{low:+.4f}, {high:+.4f}] (n = {n})"


def test_the_section_on_planted_dot_products_gives_the_answers_by_hand(tmp_path):
    write_step(tmp_path)
    text = step.step_section(tmp_path)
    assert "After 10 steps: 9 mini-batches measured, in 3 folds." in text
    # mrtpo(0.5) = (gdpo + mrtpo(1)) / 2: |g|^2 = (4 + 2 CROSS + 4) / 4 = 3, dots averaged.
    half = [(g + m) / math.sqrt(3) for g, m in zip(GDPO, MRTPO, strict=True)]
    quarter = [(1.5 * g + 0.5 * m) / math.sqrt(0.75**2 * 4 + 2 * 0.1875 * CROSS + 0.0625 * 4) for g, m in zip(GDPO, MRTPO, strict=True)]  # fmt: skip
    committed = step.measured(step.UPDATE_QUALITY, "qwen_sql")[0]
    untrained = {name: values["cosine"] for name, values in uq.per_estimator(committed, estimators=MEASURED).items()}  # fmt: skip
    for name, cosines in (("grpo", GRPO), ("gdpo", GDPO), ("mrtpo(0.25)", quarter), ("mrtpo(0.5)", half), ("mrtpo(1)", MRTPO)):  # fmt: skip
        mean, low, high = jackknife(cosines)
        before = stats.ttest_1samp(untrained[name], 0.0).confidence_interval()
        row = f"| {name} | {cell(mean, low, high)} | {cell(np.mean(untrained[name]), before.low, before.high, 9)} |"  # fmt: skip
        assert row in text, row
    # The first plan's numbers at the untrained policy, as its page quotes them.
    assert "| gdpo | – |" not in text and "+0.3737 [" in text and "+0.5796 [" in text
    for name, cosines in (("mrtpo(0.5)", half), ("mrtpo(1)", MRTPO)):
        differences = np.subtract(cosines, GDPO)
        mean, low, high = jackknife(list(differences))
        p = 2 * stats.t.sf(abs(mean / ((high - mean) / T_2)), 2)
        paired = stats.ttest_1samp(differences, 0.0).confidence_interval()
        assert f"| {name} - gdpo | {cell(mean, low, high)} | {p:.2g} | {cell(differences.mean(), paired.low, paired.high, 9)} |" in text  # fmt: skip
        assert f"- {name} - gdpo after 10 steps: {mean:+.4f}, its fold-jackknife interval above 0: the advantage persists; untrained +" in text  # fmt: skip
    # The gain of the clipped step (every norm above 1): the dot with the reference over the norm.
    for name, dots in (("mrtpo(0.5)", [3 * (g + m) / math.sqrt(3) for g, m in zip(GDPO, MRTPO, strict=True)]), ("mrtpo(1)", [6 * m / 2 for m in MRTPO])):  # fmt: skip
        ratios = [np.mean(dots) / np.mean([3 * g for g in GDPO])]
        for f in range(3):
            kept = [b for b in range(9) if b % 3 != f]
            ratios.append(np.mean([dots[b] for b in kept]) / np.mean([3 * GDPO[b] for b in kept]))
        deleted = ratios[1:]
        error = math.sqrt(2 / 3 * sum((d - np.mean(deleted)) ** 2 for d in deleted))
        low, high = ratios[0] - T_2 * error, ratios[0] + T_2 * error
        assert f"| {name} / gdpo | {ratios[0]:.3f} [{low:.3f}, {high:.3f}] (n = 3) |" in text
    assert "| mrtpo(0.5) / gdpo | " in text and " | 1.460 |" in text and " | 1.553 |" in text
    # The fresh samples: b + 1 of 16 capped in mini-batch b (45 of 144); sql_format 8/16, and
    # sql_execution 1/16 in the 5 even mini-batches.
    assert "| gdpo seed 0 after 10 steps | 9 | 45 of 144 (31.2%) | 0.500 | 0.500 | 0.035 | 1.035 |" in text  # fmt: skip
    assert "| untrained (the first plan's qwen_sql) | 9 | 77 of 144 (53.5%) |" in text
    assert "Policy sha256 `abababababababab`; CPU s sample / reference / measure 900 / 1400 / 5900 (2.28 CPU-hours); peak RSS 20.5 GB; commit(s) 0123456789." in text  # fmt: skip


def test_the_section_says_not_measured_yet_and_reads_an_interim_sample_at_its_size(tmp_path):
    text = step.step_section(tmp_path)
    assert "**After 10 steps: not measured yet**" in text
    assert "| gdpo seed 0 after 10 steps | not measured yet |" in text
    assert "| mrtpo(1) - gdpo | – | – | – | +0.2060 [" in text  # the untrained side is there
    assert "Policy sha256" not in text and "persists" not in text
    write_step(tmp_path, batches=4)
    text = step.step_section(tmp_path)
    assert "**After 10 steps: interim, 4 of 9 mini-batches measured.**" in text
    records = step.measured(step.step_results(tmp_path), NAME)[0]
    assert [r["sample_batches"] for r in records] == [9] * 4  # the gain's scale: the fixed size
    # Mini-batches 0-3: folds 0, 1, 2, 0; the jackknife over the 3 folds present.
    deleted = [np.mean([GDPO[b] for b in range(4) if b % 3 != f]) for f in range(3)]
    error = math.sqrt(2 / 3 * sum((d - np.mean(deleted)) ** 2 for d in deleted))
    mean = np.mean(GDPO[:4])
    assert f"| gdpo | {cell(mean, mean - T_2 * error, mean + T_2 * error)} |" in text
