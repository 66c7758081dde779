"""benchmarks/beta_auto_training.py: the arms reach the trainer as the powered study ran them,
the margins and the ceiling of beta by hand, the check of GDPO seed 0 and the baseline it
implies (stored, a change refused, the rerun adding GDPO's seeds), the verdicts by hand, the
report from synthetic files byte for byte, and the logged beta names on the tiny model."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import beta_auto_training as study  # noqa: E402
import convergence  # noqa: E402
import convergence_powered  # noqa: E402
import convergence_runs  # noqa: E402

POWERED_STUDY = ROOT / "benchmarks" / "results" / "convergence-powered" / "tool_calling" / "study.json"  # fmt: skip
COMMAND = "python benchmarks/beta_auto_training.py --threads 1 --jobs 1 --commit"


# ----------------------------------------------------------------------------- the design


def test_the_arms_reach_the_trainer_as_the_powered_study_ran_them(tmp_path):
    args = study.study_args(tmp_path)
    study.check_recipe(args)  # the committed powered study's settings, unchanged
    powered = convergence_runs.parse_args(convergence_powered.grid_argv(1, 1, "auto"))

    def config(arguments, method):
        values = convergence_runs.method_config(arguments, method, 3, tmp_path / "out").to_dict()
        return {k: v for k, v in values.items() if k not in ("output_dir", "logging_dir")}

    assert config(args, "gdpo") == config(powered, "gdpo")
    auto, mrtpo = config(args, "auto"), config(powered, "mrtpo")
    assert auto["mrtpo_beta"] == "auto" and auto["mrtpo_warmup_steps"] == 2
    assert (auto["mrtpo_beta_max"], auto["mrtpo_beta_step"]) == (1.0, 0.1)
    assert (auto["mrtpo_beta_probe_every"], auto["mrtpo_beta_window"]) == (4, 8)
    # Beta is the only difference from the powered study's MRTPO arm.
    assert {k for k in auto if auto[k] != mrtpo[k]} == {"mrtpo_beta"}
    assert convergence.pending_runs(args)[:3] == [("gdpo", 0), ("auto", 0), ("auto", 1)]
    assert len(convergence.pending_runs(args)) == 7
    other = convergence_runs.parse_args(study.study_argv(tmp_path, [0], 1, 1) + ["--steps", "15"])
    with pytest.raises(SystemExit, match="steps"):
        study.check_recipe(other)


def test_the_margins_are_half_the_powered_studys_paper_sized_effect():
    power = json.loads(POWERED_STUDY.read_text())["power"]
    for name, margin in study.MARGINS.items():
        half = power[name]["paper_sized_auc_effect"] / 2
        assert margin == math.floor(half * 1000) / 1000
    assert study.MARGINS == {"tool_format": 0.047, "tool_correctness": 0.037}


def test_the_ceiling_of_beta_by_hand():
    # Probes at steps 1, 5, 9, 13, 17; the first cannot raise beta, each later one by 0.1,
    # applied from the step after it.
    expected = [0.0] * 5 + [0.1] * 4 + [0.2] * 4 + [0.3] * 4 + [0.4] * 3
    assert study.beta_ceiling() == pytest.approx(expected)
    text = study.plan_text()
    assert "Probes at steps 1, 5, 9, 13, 17" in text
    assert "0 at steps 1-5, 0.1 at steps 6-9, 0.2 at steps 10-13, 0.3 at steps 14-17, 0.4 at steps 18-20 (mean over the 20 steps 0.180)" in text  # fmt: skip
    assert "tool_format 0.047; tool_correctness 0.037" in text


# ----------------------------------------------------------------------------- synthetic runs


def curves(seed: int, shift: float = 0.0, from_step: int = 6) -> dict[str, np.ndarray]:
    steps = np.arange(1, study.STEPS + 1)
    moved = np.where(steps >= from_step, shift, 0.0)
    return {
        "rewards/tool_format/mean": 0.3 + 0.02 * steps + 0.01 * seed + moved,
        "rewards/tool_correctness/mean": 0.2 + 0.01 * steps + 0.005 * seed,
        "loss": 0.1 + 0.001 * steps,
    }


def write_run(folder: Path, values: dict[str, np.ndarray], auto: bool = False, steps: int = 20) -> None:  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    ceiling = study.beta_ceiling()
    lines = []
    for step in range(1, steps + 1):
        record = {"step": step, "step_time": 60.0}
        record.update({key: float(curve[step - 1]) for key, curve in values.items()})
        if auto:
            record[study.BETA] = ceiling[step - 1]
            record[study.PREFIX + "agreement_lower"] = 0.01 * step - 0.05
            if (step - 1) % 4 == 0:
                record[study.PREFIX + "probe_agreement"] = 0.05 * step
                record[study.PREFIX + "probe_seconds"] = 15.0
        lines.append(json.dumps(record))
    (folder / convergence_runs.METRICS_FILE).write_text("\n".join(lines) + "\n")
    session = {"cpu": "AMD EPYC", "commit": "0123456789abcdef", "cold_start_sha256": "5cd58fbc2a89aa"}  # fmt: skip
    run = {"sessions": [session], "train_seconds": 1200.0, "train_cpu_seconds": 1100.0}
    (folder / convergence_runs.RUN_FILE).write_text(json.dumps(run))
    evaluation = {"test": {"format": {"mean": 0.5 + (0.1 if auto else 0.0)}, "correctness": {"mean": 0.3}}}  # fmt: skip
    (folder / convergence_runs.EVAL_FILE).write_text(json.dumps(evaluation))


def write_powered(root: Path) -> Path:
    """A powered study's folder: its study.json (the real settings) and GDPO's six runs."""
    task = root / "tool_calling"
    real = json.loads(POWERED_STUDY.read_text())
    task.mkdir(parents=True)
    stored = {"settings": real["settings"], "seeds": {"gdpo": list(study.SEEDS)}, "methods": {}}
    (task / "study.json").write_text(json.dumps(stored))
    for seed in study.SEEDS:
        write_run(task / "gdpo" / f"seed{seed}", curves(seed))
    return root


# The auto runs' format shift from step 6 on, per seed: AUC differences of 15/20 of it.
SHIFTS = (0.0, 0.02, -0.02, 0.04, 0.0, 0.02)


def write_results(root: Path, powered: Path, rerun_shift: float = 0.0) -> argparse.Namespace:
    args = study.study_args(root)
    convergence.record_study(args, study.design(), command=COMMAND)
    write_run(convergence_runs.run_dir(args, "gdpo", 0), curves(0, rerun_shift, from_step=7))
    study.check_gdpo_seed(args, COMMAND, powered)
    for seed, shift in zip(study.SEEDS, SHIFTS, strict=True):
        write_run(convergence_runs.run_dir(args, "auto", seed), curves(seed, shift), auto=True)
    return args


def test_the_check_of_gdpo_seed_0_and_the_baseline_it_implies(tmp_path):
    powered = write_powered(tmp_path / "powered")
    committed = convergence_runs.read_metrics(powered / "tool_calling/gdpo/seed0/metrics.jsonl")
    same = study.reproduction(committed, committed)
    assert same["reproduces"] and same["loss"]["largest_difference"] == 0.0
    assert same["rewards/tool_format/mean"] == {"equal_steps": 20, "first_differing_step": None, "largest_difference": 0.0}  # fmt: skip
    # Only the loss differs: the samples are the same, it reproduces; the loss's gap is shown.
    louder = [{**record, "loss": record["loss"] + 1e-4} for record in committed]
    assert study.reproduction(louder, committed)["reproduces"]
    assert study.reproduction(louder, committed)["loss"]["largest_difference"] == pytest.approx(1e-4)  # fmt: skip
    assert study.reproduction(committed[:19], committed) is None  # not every step yet
    # Reproduces: the committed six are the baseline, only seed 0 of GDPO trains here.
    args = write_results(tmp_path / "same", powered)
    stored = json.loads((tmp_path / "same/tool_calling/study.json").read_text())
    assert stored["baseline"] == "powered" and stored["reproduction"]["reproduces"]
    assert stored["seeds"]["gdpo"] == [0] and "analysis" in stored
    assert study.baseline_seeds(tmp_path / "same") == [0]
    loaded = study.load(tmp_path / "same", powered)
    assert loaded["runs"]["gdpo"][3]["records"][0]["rewards/tool_format/mean"] == pytest.approx(
        0.35
    )
    # The stored check is not changed afterwards: another result is refused.
    other = [{**r, "rewards/tool_format/mean": r["rewards/tool_format/mean"] + 0.0625} for r in committed]  # fmt: skip
    (convergence_runs.run_dir(args, "gdpo", 0) / "metrics.jsonl").write_text("\n".join(map(json.dumps, other)))  # fmt: skip
    with pytest.raises(SystemExit, match="reproduction"):
        study.check_gdpo_seed(args, COMMAND, powered)
    # Differs from step 7 on: GDPO's six are rerun here, seed by seed beside auto's.
    write_results(tmp_path / "differs", powered, rerun_shift=0.0625)
    stored = json.loads((tmp_path / "differs/tool_calling/study.json").read_text())
    check = stored["reproduction"]["rewards/tool_format/mean"]
    assert stored["baseline"] == "rerun" and not stored["reproduction"]["reproduces"]
    assert check["first_differing_step"] == 7 and check["equal_steps"] == 6
    assert check["largest_difference"] == pytest.approx(0.0625)
    assert stored["seeds"]["gdpo"] == list(study.SEEDS)
    rerun = study.study_args(tmp_path / "differs", study.baseline_seeds(tmp_path / "differs"))
    # Every auto run and GDPO seed 0 are finished (evaluated): GDPO's seeds 1-5 are left.
    assert convergence.pending_runs(rerun) == [("gdpo", seed) for seed in range(1, 6)]
    assert set(study.load(tmp_path / "differs", powered)["runs"]["gdpo"]) == set(study.SEEDS)


def test_the_verdicts_by_hand(tmp_path):
    def runs(format_differences, correctness_differences):
        out = {"gdpo": {}, "auto": {}}
        for seed, (first, second) in enumerate(zip(format_differences, correctness_differences, strict=True)):  # fmt: skip
            base = curves(seed)
            out["gdpo"][seed] = {"records": [{"step": s, **{k: float(v[s - 1]) for k, v in base.items()}} for s in range(1, 21)]}  # fmt: skip
            moved = {**base, "rewards/tool_format/mean": base["rewards/tool_format/mean"] + first, "rewards/tool_correctness/mean": base["rewards/tool_correctness/mean"] + second}  # fmt: skip
            out["auto"][seed] = {"records": [{"step": s, **{k: float(v[s - 1]) for k, v in moved.items()}} for s in range(1, 21)]}  # fmt: skip
        return out

    format_differences = [0.01, -0.02, 0.0, 0.015, -0.005, 0.02]
    tests = study.primary(runs(format_differences, [-0.05, -0.06, -0.04, -0.05, -0.07, -0.03]))
    values = np.array(format_differences)
    error = values.std(ddof=1) / math.sqrt(6)
    low = values.mean() - stats.t.ppf(0.975, 5) * error
    assert tests[0]["test"]["low"] == pytest.approx(low)
    assert tests[0]["verdict"] == "holds" and low > -0.047
    assert tests[1]["verdict"] == "below"  # every seed lower: the interval entirely below 0
    assert "**auto is below GDPO** on tool_correctness" in study.reading(tests)
    wide = study.primary(runs([0.1, -0.15, 0.05, -0.1, 0.12, -0.08], [0.0] * 6))
    assert [t["verdict"] for t in wide] == ["not shown", "holds"]
    assert study.reading(wide).startswith("**The goal is not shown** on tool_format")
    both = study.primary(runs(format_differences, [0.0] * 6))
    assert study.reading(both).startswith("**The goal holds**")
    five = runs(format_differences, [0.0] * 6)
    five["auto"][5]["records"] = five["auto"][5]["records"][:12]
    assert [t["verdict"] for t in study.primary(five)] == ["pending", "pending"]
    assert study.reading(study.primary(five)).startswith("Pending: 5 of 6 seeds")


# ----------------------------------------------------------------------------- the report


def test_the_report_regenerates_byte_for_byte_from_the_files(tmp_path):
    powered = write_powered(tmp_path / "powered")
    results = tmp_path / "results"
    write_results(results, powered)
    text = study.write_report(results, powered).read_text()
    for name in ("README.md", "curves.png", "beta.png"):
        (results / name).unlink()
    assert study.write_report(results, powered).read_text() == text  # from the files alone
    assert (results / "beta.png").stat().st_size > 0 and (results / "curves.png").is_file()
    # AUC differences 15/20 of each seed's shift; correctness identical in every seed.
    assert "| tool_format | +0.000 | +0.015 | -0.015 | +0.030 | +0.000 | +0.015 | 6 | +0.008 | [-0.009, +0.024] | -0.047 | holds |" in text  # fmt: skip
    assert "| tool_correctness | +0.000 | +0.000 | +0.000 | +0.000 | +0.000 | +0.000 | 6 | +0.000 | [+0.000, +0.000] | -0.037 | holds |" in text  # fmt: skip
    assert "**The goal holds**" in text and "**It reproduces**" in text
    assert "| `rewards/tool_format/mean` | 20 of 20 | none | 0 |" in text
    # Seeds shifted from step 6 differ from their GDPO pair there; unshifted seeds never.
    assert "| 1 | 20 | +0.050 | +0.250 | +0.450 | +0.650 | +0.850 | 15 | 0.40 | 0.180 | 6 |" in text  # fmt: skip
    assert "| 0 | 20 | +0.050 | +0.250 | +0.450 | +0.650 | +0.850 | 15 | 0.40 | 0.180 | none |" in text  # fmt: skip
    assert "| test format rate | 0.500 | 0.600 | 6 | +0.100 | [+0.100, +0.100] |" in text
    assert "| 0 | 5 | 15.0 | 0.062 |" in text  # 5 probes of 15 s over 20 steps of 60 s
    # the fixture's one gdpo run here (seed 0): the time ratios pair it alone, not side by side
    assert "The ratios to gdpo pair the seeds with a gdpo run here (0), " in text
    assert "not a side-by-side timing" in text
    assert "runs that recorded theirs: 5cd58fbc2a89)" in text and "commit 0123456789" in text
    assert json.loads((results / "tool_calling/study.json").read_text())["analysis"] in text


# ----------------------------------------------------------------------------- the tiny model


@pytest.mark.slow
def test_the_auto_arm_logs_the_names_the_report_reads(tmp_path, tiny_model_dir, one_torch_thread):
    argv = study.study_argv(tmp_path, [0], 1, 1)
    argv += ["--steps", "2", "--prompts", "2", "--generations", "2", "--micro_batch", "2"]
    args = convergence_runs.parse_args(
        argv + ["--max_completion_length", "8", "--eval_samples", "0"]
    )
    folder = convergence_runs.train_run(args, "auto", 0, start=str(tiny_model_dir))
    records = convergence_runs.read_metrics(folder / convergence_runs.METRICS_FILE)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:  # beta 0 at both steps (one probe cannot raise it), logged each step
        assert record[study.BETA] == 0.0 and record[study.PREFIX + "next_beta"] == 0.0
        assert study.PREFIX + "agreement_lower" in record
    assert (
        study.PREFIX + "probe_seconds" in records[0] and records[-1][study.PREFIX + "probes"] <= 1
    )


# ----------------------------------------------------------------------------- the cost benchmark


def test_the_cost_ratios_are_medians_over_repetitions_of_paired_ratios():
    import beta_auto_cost

    fixed, every_four, every_step = beta_auto_cost.VARIANTS
    repetitions = [
        {
            fixed: [10.0, 10.0, 10.0, 10.0],
            every_four: [15.0, 10.0, 10.0, 10.0],
            every_step: [15.0] * 4,
        },  # fmt: skip
        {
            fixed: [20.0, 20.0, 20.0, 20.0],
            every_four: [40.0, 20.0, 20.0, 20.0],
            every_step: [30.0] * 4,
        },  # fmt: skip
        {
            fixed: [10.0, 10.0, 10.0, 10.0],
            every_four: [30.0, 10.0, 10.0, 10.0],
            every_step: [20.0] * 4,
        },  # fmt: skip
    ]
    ratios = beta_auto_cost.ratios(repetitions)
    # Means over the fixed beta's in each repetition: 1.125, 1.25, 1.5; medians all 1.0.
    assert ratios[every_four] == {"median": 1.0, "mean": 1.25}
    assert ratios[every_step] == {"median": 1.5, "mean": 1.5}
    assert ratios[fixed] == {"median": 1.0, "mean": 1.0}


def test_the_steady_state_by_hand():
    """Probing every step: steps of 10, 12, 8 s whose probes took 4, 4, 2 s (the first step,
    probe 1 s, left out): probe 10 s over 20 s of the rest, so every k steps 1 + 0.5 / k."""
    import beta_auto_cost

    steady = beta_auto_cost.steady_state([5.0, 10.0, 12.0, 8.0], [1.0, 4.0, 4.0, 2.0])
    assert steady == {"every 1": 1.5, "every 2": 1.25, "every 4": 1.125, "every 8": 1.0625}
    with pytest.raises(ValueError, match="a probe per step"):
        beta_auto_cost.steady_state([5.0, 10.0], [1.0])


def test_the_cost_benchmark_times_each_step_and_records_each_probe(tiny_model_dir, tmp_path, one_torch_thread):  # fmt: skip
    """Each variant's trainer on the tiny model: one time per optimizer step; a probe's seconds
    per probed step for auto (every 4 steps: steps 1 and 5 of 5), none for the fixed beta."""
    import argparse

    import beta_auto_cost

    args = argparse.Namespace(
        model=str(tiny_model_dir), task="tool_calling", steps=5, max_completion_length=4
    )
    times, probes, peaks = {}, {}, {}
    for name, settings in beta_auto_cost.VARIANTS.items():
        run = beta_auto_cost.run(settings, args, str(tmp_path / name))
        times[name], probes[name], peaks[name] = run
    assert all(len(seconds) == 5 and min(seconds) > 0 for seconds in times.values())
    # Each trainer's own peak (reset before it): the tiny model's trainer, well under 5 GB.
    assert all(0 < peak < 5 for peak in peaks.values()), peaks
    fixed, every_four, every_step = beta_auto_cost.VARIANTS
    assert [len(probes[name]) for name in (fixed, every_four, every_step)] == [0, 2, 5]
    assert all(seconds >= 0 for seconds in probes[every_step])


def test_the_cost_benchmark_with_the_every_step_trainer_alone(tiny_model_dir, tmp_path, monkeypatch, one_torch_thread):  # fmt: skip
    """`--variants every`: one trainer per repetition, no ratio to a fixed beta's trainer, the
    steady state at each period from its own steps (equal to `steady_state` of the stored
    times), its peak recorded."""
    import beta_auto_cost

    output = tmp_path / "cost.json"
    argv = ["beta_auto_cost.py", "--model", str(tiny_model_dir), "--steps", "3"]
    argv += ["--repetitions", "1", "--max_completion_length", "4", "--variants", "every"]
    monkeypatch.setattr(sys, "argv", [*argv, "--output", str(output)])
    beta_auto_cost.main()
    result = json.loads(output.read_text())
    every = beta_auto_cost.EVERY_STEP
    assert list(result["seconds"][0]) == [every] and result["ratio_to_fixed"] == {}
    assert result["repetitions_done"] == result["repetitions_planned"] == 1
    assert len(result["commit"]) == 40  # the code measured
    seconds, probes = result["seconds"][0][every], result["probe_seconds"][0][every]
    assert len(seconds) == len(probes) == 3
    expected = beta_auto_cost.steady_state(seconds, probes)
    assert result["steady_state_to_fixed"] == pytest.approx(expected)
    assert list(expected) == ["every 1", "every 2", "every 4", "every 8"]
    assert expected["every 1"] > expected["every 8"] >= 1.0

    # --resume: the repetition measured is kept, the next one added (its order rotated), each
    # session recorded; a file written before --resume existed (no "sessions") is one session.
    del result["sessions"]
    output.write_text(json.dumps(result))
    resumed = [*argv, "--output", str(output), "--resume"]
    resumed[resumed.index("--repetitions") + 1] = "2"
    monkeypatch.setattr(sys, "argv", resumed)
    beta_auto_cost.main()
    both = json.loads(output.read_text())
    assert both["seconds"][0] == result["seconds"][0] and len(both["seconds"]) == 2
    assert both["repetitions_done"] == both["repetitions_planned"] == 2
    assert [session["from_repetition"] for session in both["sessions"]] == [0, 1]
    assert both["started_at"] == result["started_at"]
    # Other settings than the file's: refused, the file untouched.
    other = [*resumed]
    other[other.index("--steps") + 1] = "2"
    monkeypatch.setattr(sys, "argv", other)
    with pytest.raises(SystemExit, match="other settings.*steps"):
        beta_auto_cost.main()
    assert json.loads(output.read_text()) == both
