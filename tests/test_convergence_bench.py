"""The convergence study's machinery (`benchmarks/convergence.py`): variants by configuration,
resuming a killed run without redoing finished ones (tiny model), and the report regenerated
from results files alone (steps to 0.8 with "not reached", median/IQR, seeded bootstrap)."""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import convergence  # noqa: E402
import convergence_report  # noqa: E402
import convergence_runs  # noqa: E402
import paired_stats  # noqa: E402


def study_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["--results", str(tmp_path / "results"), "--device", "cpu", *extra]


# ----------------------------------------------------------------------------- configuration


def test_methods_differ_only_by_their_overrides(tmp_path):
    variant = '{"advantage_estimator": "mrtpo", "mrtpo_beta": 0.3}'
    args = convergence_runs.parse_args(
        study_args(
            tmp_path, "--methods", "gdpo", "mrtpo_beta3", "--variant", f"mrtpo_beta3={variant}"
        )  # fmt: skip
    )
    gdpo = convergence_runs.method_config(args, "gdpo", 4, tmp_path / "a").to_dict()
    variant_config = convergence_runs.method_config(
        args, "mrtpo_beta3", 4, tmp_path / "a"
    ).to_dict()
    assert variant_config["mrtpo_beta"] == 0.3
    assert variant_config["advantage_estimator"] == "mrtpo"
    differing = {key for key in gdpo if gdpo[key] != variant_config[key]}
    assert differing == {"advantage_estimator", "mrtpo_beta"}
    assert gdpo["seed"] == 4 and gdpo["max_steps"] == args.steps
    assert gdpo["per_device_train_batch_size"] * gdpo["gradient_accumulation_steps"] == 16
    shuffled = convergence_runs.method_config(args, "mrtpo_shuffled", 0, tmp_path / "b")
    assert shuffled.shuffle_token_weights and shuffled.advantage_estimator == "mrtpo"


def test_bad_variants_and_methods_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="unknown method"):
        convergence_runs.parse_args(study_args(tmp_path, "--methods", "nope"))
    with pytest.raises(argparse.ArgumentTypeError, match="not JSON"):
        convergence_runs.parse_variant("x={bad")
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=JSON"):
        convergence_runs.parse_variant("just-a-name")
    args = convergence_runs.parse_args(
        study_args(tmp_path, "--methods", "odd", "--variant", 'odd={"no_such_field": 1}')
    )
    with pytest.raises(ValueError, match="method 'odd'"):
        convergence_runs.method_config(args, "odd", 0, tmp_path)
    with pytest.raises(SystemExit, match="micro_batch"):
        convergence_runs.parse_args(study_args(tmp_path, "--micro_batch", "3"))


def test_seeds_per_method_and_pending_order(tmp_path):
    args = convergence_runs.parse_args(
        study_args(
            tmp_path, "--methods", "gdpo", "mrtpo", "--seeds", "0", "--seeds_for", "mrtpo=0,1"
        )
    )
    assert convergence_runs.seeds_of(args) == {"gdpo": [0], "mrtpo": [0, 1]}
    assert convergence.pending_runs(args) == [("gdpo", 0), ("mrtpo", 0), ("mrtpo", 1)]
    convergence_runs._write_json(
        convergence_runs.run_dir(args, "mrtpo", 0) / convergence_runs.EVAL_FILE, {}
    )
    assert convergence.pending_runs(args) == [("gdpo", 0), ("mrtpo", 1)]


def test_a_run_locked_by_another_process_is_skipped_then_free(tmp_path):
    import subprocess

    folder = tmp_path / "gdpo" / "seed0"
    holder = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); import convergence_runs; from pathlib "
        "import Path\nwith convergence_runs.run_lock(Path(sys.argv[2])) as held:\n"
        "    print(held, flush=True); time.sleep(30)"
    )
    benchmarks = str(Path(convergence.__file__).parent)
    other = subprocess.Popen(
        [sys.executable, "-c", holder, benchmarks, str(folder)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout.readline().strip() == "True"
        with convergence_runs.run_lock(folder) as held:
            assert held is False
    finally:
        other.kill()
        other.wait()
    # The lock dies with its process: the run is free again, and held while inside.
    with convergence_runs.run_lock(folder) as held:
        assert held is True
        with convergence_runs.run_lock(folder) as again:  # another open file description
            assert again is False
    assert (folder / convergence_runs.CHECKPOINTS / "run.lock").is_file()


def test_study_data_is_left_alone_when_unchanged_and_replaced_whole_otherwise(
    tmp_path, tiny_model_dir
):
    args = convergence_runs.parse_args(study_args(tmp_path, "--max_reference_tokens", "100000"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    train = convergence_runs.write_study_data(args, tokenizer) / "train.jsonl"
    rows = train.read_text().splitlines()
    assert len(rows) > 1 and all(json.loads(row)["id"] for row in rows)
    # A second grid process writing the same rows does not touch the file a run is reading.
    before = train.stat().st_mtime_ns
    convergence_runs.write_study_data(args, tokenizer)
    assert train.stat().st_mtime_ns == before
    train.write_text(rows[0] + "\n")
    convergence_runs.write_study_data(args, tokenizer)
    assert train.read_text().splitlines() == rows
    assert not list(train.parent.glob("*.tmp"))


def test_a_study_refuses_other_settings_in_the_same_folder(tmp_path):
    convergence.record_study(convergence_runs.parse_args(study_args(tmp_path, "--steps", "5")))
    with pytest.raises(SystemExit, match="steps"):
        convergence.record_study(convergence_runs.parse_args(study_args(tmp_path, "--steps", "6")))
    # A recorded design (e.g. the pre-registered analysis) is kept, never changed.
    args = convergence_runs.parse_args(study_args(tmp_path, "--steps", "5"))
    convergence.record_study(args, {"analysis": "plan A"})
    convergence.record_study(args, {"analysis": "plan A"})
    convergence.record_study(args)  # a run without one keeps it
    study = json.loads((tmp_path / "results" / "tool_calling" / "study.json").read_text())
    assert study["analysis"] == "plan A"
    with pytest.raises(SystemExit, match="another analysis"):
        convergence.record_study(args, {"analysis": "plan B"})


# ----------------------------------------------------------------------------- resume


class Killed(Exception):
    """Stands for the process being killed right after its first checkpoint."""


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_checkpoint_and_finished_runs_are_skipped(
    tmp_path, tiny_model_dir, monkeypatch, one_torch_thread
):
    args = convergence_runs.parse_args(
        study_args(
            tmp_path,
            *("--cold_start", str(tiny_model_dir), "--methods", "gdpo", "--seeds", "0"),
            *("--steps", "2", "--save_steps", "1", "--prompts", "2", "--generations", "2"),
            *("--micro_batch", "2", "--max_completion_length", "8"),
            *("--max_reference_tokens", "100000", "--eval_samples", "1", "--eval_rows", "2"),
            *("--bfcl_examples", "1", "--eval_batch", "2"),
        )
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    convergence_runs.write_study_data(args, tokenizer)
    folder = convergence_runs.run_dir(args, "gdpo", 0)

    save = transformers.Trainer._save_checkpoint

    def save_then_die(self, *arguments, **keywords):
        save(self, *arguments, **keywords)
        raise Killed

    with pytest.raises(ValueError, match="keep_steps: 3 is not a saved step"):
        convergence_runs.train_run(args, "gdpo", 0, keep_steps=[3])
    monkeypatch.setattr(transformers.Trainer, "_save_checkpoint", save_then_die)
    with pytest.raises(Killed):  # killed after step 1's checkpoint, before its callbacks
        convergence_runs.train_run(args, "gdpo", 0, keep_steps=[1, 2])
    monkeypatch.setattr(transformers.Trainer, "_save_checkpoint", save)
    assert (folder / "checkpoints" / "checkpoint-1").is_dir()
    assert not convergence_runs.kept_policy_dir(folder / "checkpoints", 1).exists()
    step_1 = (folder / "checkpoints" / "checkpoint-1" / "model.safetensors").read_bytes()
    first = convergence_runs.read_metrics(folder / "checkpoints" / "metrics.jsonl")
    assert [record["step"] for record in first] == [1]
    assert convergence.pending_runs(args) == [("gdpo", 0)]

    convergence_runs.train_run(args, "gdpo", 0, keep_steps=[1, 2])
    run = json.loads((folder / "run.json").read_text())
    assert run["resumed_from"] == ["checkpoint-1"] and run["trained"]
    # Both steps' policies kept: step 1's copied on resuming (its save outlived its callback),
    # step 2's as it was saved; each outlives the rotation of the step checkpoints.
    assert not (folder / "checkpoints" / "checkpoint-1").exists()
    kept = [convergence_runs.kept_policy_dir(folder / "checkpoints", step) for step in (1, 2)]
    assert (kept[0] / "model.safetensors").read_bytes() == step_1
    weights = [load_file(policy / "model.safetensors") for policy in kept]
    final = load_file(folder / "checkpoints" / "model.safetensors")  # the trained model
    assert all(torch.equal(weights[1][name], final[name]) for name in final)
    for policy in kept:
        assert (policy / "config.json").is_file() and (policy / "tokenizer_config.json").is_file()
        assert not (policy / "optimizer.pt").exists()
    # Where and when each start of training ran: the first, then the resumption.
    assert [session["checkpoint"] for session in run["sessions"]] == [None, "checkpoint-1"]
    for session in run["sessions"] + [run["eval_session"]]:
        assert session["threads"] == 1 and session["cpu"] and session["logical_cpus"] >= 1
        assert session["started_at"].endswith("Z") and len(session["load_average"]) == 3
    weights = hashlib.sha256((tiny_model_dir / "model.safetensors").read_bytes()).hexdigest()
    assert [session["cold_start_sha256"] for session in run["sessions"]] == [weights, weights]
    records = convergence_runs.read_metrics(folder / "metrics.jsonl")
    assert [record["step"] for record in records] == [1, 2]
    assert records[0] == first[0]  # step 1 kept, not redone
    evaluation = json.loads((folder / "final_eval.json").read_text())
    assert evaluation["test"]["rows"] == 2 and evaluation["test"]["format"]["n"] == 2
    assert evaluation["bfcl_simple_python"]["rows"] == 1

    assert convergence.pending_runs(args) == []
    # The cold start (step 0) is evaluated as a run's final policy is, once.
    start = convergence_runs.evaluate_cold_start(args)
    cold = json.loads((start / "final_eval.json").read_text())
    assert cold["test"]["rows"] == 2 and cold["bfcl_simple_python"]["rows"] == 1
    assert json.loads((start / "run.json").read_text())["evaluated"] == str(tiny_model_dir)
    stamp = (start / "final_eval.json").stat().st_mtime_ns
    convergence_runs.evaluate_cold_start(args)
    assert (start / "final_eval.json").stat().st_mtime_ns == stamp
    stamp = (folder / "final_eval.json").stat().st_mtime_ns
    convergence_runs.train_run(args, "gdpo", 0)  # finished: nothing is redone
    assert (folder / "final_eval.json").stat().st_mtime_ns == stamp
    assert json.loads((folder / "run.json").read_text()) == run

    # A machine restart keeps the committed files but not the checkpoints: a run.json that says
    # "trained" without the model to evaluate starts the run over instead of failing.
    (folder / "final_eval.json").unlink()
    shutil.rmtree(folder / "checkpoints")
    convergence_runs.train_run(args, "gdpo", 0)
    again = json.loads((folder / "run.json").read_text())
    assert again["resumed_from"] == [] and again["trained"]
    retrained = convergence_runs.read_metrics(folder / "metrics.jsonl")
    assert [(r["step"], r.get("loss")) for r in retrained] == [(r["step"], r.get("loss")) for r in records]  # fmt: skip


def test_each_run_draws_its_own_evaluation_samples_and_the_cold_start_keeps_seed_0(
    tmp_path, tiny_model_dir, monkeypatch, one_torch_thread
):
    """Three "trained" runs (each the tiny model) and the cold start evaluated as the study
    does: a run's test samples are drawn with 1000 + its training seed, recorded in its
    run.json, so seeds 0 and 1 draw different samples from one policy; the cold start keeps
    seed 0, the seed every evaluation used before."""
    import mrtpo.evaluation

    args = convergence_runs.parse_args(
        study_args(
            tmp_path,
            *("--cold_start", str(tiny_model_dir), "--methods", "gdpo", "mrtpo"),
            *("--seeds", "0", "1", "--max_completion_length", "8"),
            *("--max_reference_tokens", "100000", "--eval_samples", "2", "--eval_rows", "2"),
            *("--bfcl_examples", "0", "--eval_batch", "4"),
        )
    )
    convergence_runs.write_study_data(
        args, transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    )
    runs = [("gdpo", 0), ("gdpo", 1), ("mrtpo", 0)]
    for method, seed in runs:
        folder = convergence_runs.run_dir(args, method, seed)
        shutil.copytree(tiny_model_dir, folder / "checkpoints")  # the trained model
        convergence_runs._write_json(folder / "run.json", {"method": method, "seed": seed, "trained": True})  # fmt: skip
    drawn = []
    generate = mrtpo.evaluation.generate

    def recorded(*arguments, **keywords):
        completions = generate(*arguments, **keywords)
        drawn.append((keywords["seed"], completions))
        return completions

    monkeypatch.setattr(mrtpo.evaluation, "generate", recorded)
    for method, seed in runs:
        convergence_runs.train_run(args, method, seed)
    start = convergence_runs.evaluate_cold_start(args)

    assert [seed for seed, _ in drawn] == [1000, 1001, 1000, 0]
    samples = [completions for _, completions in drawn]
    assert samples[0] != samples[1]  # seeds 0 and 1: two draws from the same policy
    assert samples[0] == samples[2]  # one training seed: one draw, whatever the method
    assert samples[3] != samples[0]  # the cold start's draw is none of the runs'
    recorded_seeds = [
        json.loads((convergence_runs.run_dir(args, m, s) / "run.json").read_text())["eval_seed"]
        for m, s in runs
    ]
    assert recorded_seeds == [1000, 1001, 1000]
    assert json.loads((start / "run.json").read_text())["eval_seed"] == 0


# ----------------------------------------------------------------------------- the report


def test_steps_to_threshold_and_median_with_not_reached():
    assert convergence_report.steps_to_threshold([0.7, 0.8, 0.9, 0.9]) == 3  # (0.7+0.8+0.9)/3 = 0.8
    assert convergence_report.steps_to_threshold([0.9, 0.9]) is None  # no full window
    assert convergence_report.steps_to_threshold([1.0, 0.3, 1.0, 0.9, 0.8]) == 5
    assert convergence_report.steps_to_threshold([0.5] * 10) is None
    assert convergence_report.median_steps([3, None, 5]) == 5
    assert convergence_report.median_steps([3, None, None]) is None
    assert convergence_report.median_steps([2, 4]) == 3
    assert convergence_report.median_steps([2, None]) is None
    assert convergence_report.median_steps([]) is None


def test_paired_t_against_a_hand_computation():
    differences = [0.05, 0.10, -0.02, 0.07, 0.03]
    got = paired_stats.paired_t(differences)
    # mean 0.046, s = 0.045056, s / sqrt(5) = 0.020149; t_{4, 0.975} = 2.776445
    assert got["mean"] == pytest.approx(0.046)
    assert got["t"] == pytest.approx(0.046 / 0.0201494, rel=1e-5)
    assert got["low"] == pytest.approx(0.046 - 2.776445 * 0.0201494, abs=1e-6)
    assert got["high"] == pytest.approx(0.046 + 2.776445 * 0.0201494, abs=1e-6)
    assert got["p"] == pytest.approx(0.08451, abs=2e-4)  # two-sided, t = 2.2829, 4 df
    assert got["n"] == 5
    assert paired_stats.paired_t([0.1, 0.1, 0.1])["low"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="at least 2"):
        paired_stats.paired_t([0.1])


def test_median_band_ignores_missing_steps():
    median, low, high = convergence_report.median_band(
        [np.array([0.0, 1.0, np.nan]), np.array([1.0, 2.0, np.nan]), np.array([2.0, 3.0, np.nan])]
    )
    assert median[:2].tolist() == [1.0, 2.0] and low[:2].tolist() == [0.5, 1.5]
    assert high[:2].tolist() == [1.5, 2.5] and np.isnan(median[2])


def write_fixture_run(
    root: Path, method: str, seed: int, formats: list[float], exact: float
) -> None:
    folder = root / "tool_calling" / method / f"seed{seed}"
    folder.mkdir(parents=True)
    lines = []
    for step, value in enumerate(formats, start=1):
        record = {"step": step, "rewards/tool_format/mean": value,
                  "rewards/tool_correctness/mean": value / 2, "step_time": 10.0 * (1 + (method == "mrtpo")) * (1 + seed)}  # fmt: skip
        if method == "mrtpo":
            record.update({"mrtpo/distance/tool_format/mean": 0.02,
                           "mrtpo/distance/tool_format/top10_share": 0.4})  # fmt: skip
        lines.append(json.dumps(record))
    lines.append(json.dumps({"step": len(formats), "train_runtime": 100.0}))  # the end summary
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if len(formats) == 4:
        result = {part: {metric: {"mean": exact, "se": 0.02, "n": 300} for metric in ("format", "correctness", "exact")}  # fmt: skip
                  for part in ("test", "bfcl_simple_python")}  # fmt: skip
        (folder / "final_eval.json").write_text(json.dumps(result))
        # Half a core's CPU time while training. mrtpo seed 2 was killed and resumed after its
        # run.json was lost: its record times only the last 2 of its 4 steps.
        steps_timed = 2 if (method, seed) == ("mrtpo", 2) else 4
        wall = 10.0 * (1 + (method == "mrtpo")) * (1 + seed) * steps_timed
        cpu = {"train_seconds": wall, "train_cpu_seconds": wall / 2, "eval_cpu_seconds": 100.0}
        (folder / "run.json").write_text(json.dumps(cpu))


def test_report_is_regenerated_from_the_results_files(tmp_path):
    root = tmp_path / "results"
    study = {
        "command": "python benchmarks/convergence.py --steps 4",
        "settings": {
            "steps": 4,
            "prompts": 4,
            "generations": 4,
            "max_completion_length": 96,
            "learning_rate": 1e-5,
            "model_name_or_path": "m",
            "sft_max_steps": 3,
            "device": "cpu",
            "eval_samples": 6,
            "eval_temperature": 1.0,
            "bfcl_examples": 100,
        },  # fmt: skip
        "methods": {
            "gdpo": {"advantage_estimator": "gdpo"},
            "mrtpo": {"advantage_estimator": "mrtpo"},
            "grpo": {"advantage_estimator": "grpo"},
        },  # fmt: skip
        "seeds": {"gdpo": [0, 1, 2], "mrtpo": [0, 1, 2], "grpo": [0, 1, 2]},
    }
    convergence_runs._write_json(root / "tool_calling" / "study.json", study)
    write_fixture_run(root, "gdpo", 0, [0.5, 0.6, 0.7, 0.8], 0.30)  # never 0.8 on average
    write_fixture_run(root, "gdpo", 1, [0.8, 0.8, 0.8, 0.9], 0.40)  # step 3
    write_fixture_run(root, "gdpo", 2, [0.2, 0.3], 0.0)  # unfinished: 2 of 4 steps
    write_fixture_run(root, "mrtpo", 0, [0.8, 0.9, 0.9, 0.9], 0.35)  # step 3
    write_fixture_run(root, "mrtpo", 1, [0.7, 0.9, 0.9, 1.0], 0.50)  # step 3
    write_fixture_run(root, "mrtpo", 2, [0.9, 0.9, 0.6, 0.9], 0.45)  # step 3
    write_fixture_run(root, "grpo", 0, [0.7, 0.7, 0.8, 0.9], 0.20)  # step 4
    write_fixture_run(root, "grpo", 1, [0.8, 0.8, 0.8], 0.0)  # step 3, 3 of 4 steps run
    # grpo seed 2: not started (no folder)

    path = convergence_report.write_report(root)
    text = path.read_text()
    assert text.index("python benchmarks/convergence.py --steps 4") < text.index("## Training")
    # A run in progress is "pending", not "not reached"; the median is over decided seeds.
    assert "| gdpo | not reached | 3 | pending (2/4 steps) | not reached (2 of 3 seeds) |" in text
    assert "| mrtpo | 3 | 3 | 3 | 3 |" in text
    assert "| grpo | 4 | 3 (3/4 steps) | – | 3.5 (2 of 3 seeds) |" in text
    # Final policy: the median over seeds, every seed's value (an unfinished one as "–").
    assert "| gdpo | 0.350 (0.30, 0.40, –) |" in text
    # Paired by seed, seeds both finished: 0.35 - 0.30 and 0.50 - 0.40.
    # Range [0.05, 0.10]; t interval 0.075 ± t_{1, 0.975} 0.025 = 0.075 ± 12.706 x 0.025.
    assert (
        "| test exact calls | 0.050 | 0.100 | – | 0.075 | [0.050, 0.100] | [-0.243, 0.393] |"
        in text
    )
    assert "seed 1: +0" in text  # steps to 0.8, both reached on seed 1
    # Step times per seed (each seed ran on a machine of another speed); ratios paired by seed:
    # grpo's pooled median (15.0) over gdpo's (20.0) would read 0.75 though every pair is 1.
    # CPU s per step: the step's wall time x the CPU share (0.5) of the timed part, so mrtpo
    # seed 2 reads 30.0 although its run.json timed 2 of its 4 steps (60 s over 4 steps: 15.0).
    assert "| mrtpo | 20.0 | 40.0 | 60.0 | 40.0 | 2.00 | 20.0 | 2.00 | 100 |" in text
    assert "| grpo | 10.0 | 20.0 | – | 15.0 | 1.00 | 5.0 | 1.00 | 100 |" in text
    assert "| gdpo | 10.0 | 20.0 | 30.0 | 20.0 | 1.00 | 7.5 | 1.00 | 100 |" in text
    assert "| mrtpo | tool_format | 0.020 | 0.020 | 0.400 | 0.400 |" in text
    assert (root / "curves.png").stat().st_size > 0 and (root / "replay.png").stat().st_size > 0
    assert convergence_report.write_report(root).read_text() == text  # from the files alone
