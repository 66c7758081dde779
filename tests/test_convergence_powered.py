"""The powered study's design and pre-registered analysis (`benchmarks/convergence_powered.py`):
the design reaches `MRTPOConfig` as declared, Holm and the paired t-tests by hand, the reading
rules, the power calculation, and the report regenerated from results files alone."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import convergence  # noqa: E402
import convergence_powered as powered  # noqa: E402
import convergence_runs  # noqa: E402
import paired_stats  # noqa: E402


def test_the_design_reaches_the_trainer_config(tmp_path):
    args = convergence_runs.parse_args(powered.grid_argv(jobs=2, threads=1, device="cpu"))
    assert args.methods == ["gdpo", "mrtpo", "mrtpo_shuffled", "mrtpo_placebo"]
    assert args.seeds == [0, 1, 2, 3, 4, 5] and args.steps == 20 and args.eval_cold_start
    assert (args.prompts, args.generations, args.max_completion_length) == (4, 4, 96)
    assert args.learning_rate == 1e-5 and args.results == powered.RESULTS
    configs = {m: convergence_runs.method_config(args, m, 0, tmp_path) for m in args.methods}
    assert configs["gdpo"].advantage_estimator == "gdpo"
    for method in ("mrtpo", "mrtpo_shuffled", "mrtpo_placebo"):
        config = configs[method]
        assert config.advantage_estimator == "mrtpo"
        assert (config.mrtpo_beta, config.mrtpo_warmup_steps) == (1.0, 2)
        assert config.shuffle_token_weights == (method == "mrtpo_shuffled")
        assert config.replay_information == ("placebo" if method == "mrtpo_placebo" else "own")
    # Seeds outer, methods inner: the methods of a seed run back to back (in an empty results
    # folder: the real one holds the runs finished so far).
    args.results = str(tmp_path / "empty")
    pending = convergence.pending_runs(args)
    assert pending[:5] == [("gdpo", 0), ("mrtpo", 0), ("mrtpo_shuffled", 0), ("mrtpo_placebo", 0), ("gdpo", 1)]  # fmt: skip


def test_holm_by_hand():
    # Sorted: a 0.01 x 3 = 0.03; c 0.03 x 2 = 0.06; b 0.04 x 1 = 0.04 -> kept at 0.06.
    assert powered.holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx(
        {"a": 0.03, "b": 0.06, "c": 0.06}
    )
    assert powered.holm({"a": 0.5, "b": 0.9}) == {"a": 1.0, "b": 1.0}


def records(values_format, values_correctness, **extra):
    return [
        {"step": step, "rewards/tool_format/mean": f, "rewards/tool_correctness/mean": c, **extra}
        for step, (f, c) in enumerate(zip(values_format, values_correctness, strict=True), start=1)
    ]


def test_auc_and_steps_to_threshold():
    ramp = [0.05 * step for step in range(1, 21)]  # 0.05 ... 1.0
    assert powered.auc(records(ramp, ramp), "tool_format") == pytest.approx(np.mean(ramp))
    assert powered.auc(records(ramp[:19], ramp[:19]), "tool_format") is None  # unfinished
    # Rolling mean of 3 reaches 0.8 at step 17 (0.75, 0.8, 0.85).
    assert powered.steps_to_threshold(records(ramp, ramp), "tool_format") == 17
    flat = [0.5] * 20
    assert powered.steps_to_threshold(records(flat, flat), "tool_format") == 21  # counted
    assert powered.steps_to_threshold(records(flat[:5], flat[:5]), "tool_format") is None


def synthetic_runs(shift: dict[str, float]) -> dict[str, dict[int, dict]]:
    """Every method's 6 seeds: a seeded noisy ramp plus the method's shift."""
    generator = np.random.default_rng(0)
    base = {seed: generator.normal(0, 0.02, size=20) for seed in powered.SEEDS}
    runs = {}
    for method in powered.METHODS:
        runs[method] = {}
        for seed in powered.SEEDS:
            noise = generator.normal(0, 0.01, size=20)
            fmt = 0.3 + 0.02 * np.arange(1, 21) + base[seed] + noise + shift.get(method, 0.0)
            runs[method][seed] = {
                "records": records(fmt.tolist(), (fmt / 2).tolist()),
                "eval": None,
                "run": None,
            }
    return runs


def test_primary_tests_by_hand_and_the_reading():
    runs = synthetic_runs({"mrtpo": 0.1, "mrtpo_placebo": 0.1})  # MRTPO = placebo > GDPO
    tests = powered.primary_tests(runs)
    assert [(t["contrast"], t["endpoint"]) for t in tests] == [
        (contrast, name) for contrast in powered.CONTRASTS for name in powered.ENDPOINTS
    ]
    first = tests[0]  # mrtpo - gdpo on the format AUC, by hand
    differences = [
        np.mean([r["rewards/tool_format/mean"] for r in runs["mrtpo"][s]["records"]])
        - np.mean([r["rewards/tool_format/mean"] for r in runs["gdpo"][s]["records"]])
        for s in powered.SEEDS
    ]
    mean, error = np.mean(differences), np.std(differences, ddof=1) / math.sqrt(6)
    assert first["test"]["mean"] == pytest.approx(mean)
    assert first["test"]["t"] == pytest.approx(mean / error)
    assert first["test"]["high"] - first["test"]["mean"] == pytest.approx(2.570582 * error)
    ps = [t["test"]["p"] for t in tests]
    assert [t["holm_p"] for t in tests] == pytest.approx(
        [powered.holm(dict(enumerate(ps)))[i] for i in range(6)]
    )
    significant = {(t["contrast"][1], t["endpoint"]): t["significant"] for t in tests}
    assert significant[("gdpo", "tool_format")] and significant[("mrtpo_shuffled", "tool_format")]
    assert not significant[("mrtpo_placebo", "tool_format")]
    text = powered.reading(tests, complete=True)
    assert text.startswith("MRTPO differs from GDPO but not from the placebo")
    assert "mrtpo - gdpo on tool_format +0.1" in text
    assert powered.reading(tests, complete=False).startswith("**Interim")

    alike = powered.primary_tests(synthetic_runs({}))
    assert not any(t["significant"] for t in alike)
    text = powered.reading(alike, complete=True)
    low, high = alike[0]["test"]["low"], alike[0]["test"]["high"]
    assert text.startswith("MRTPO differs from none")
    assert f"tool_format [{low:+.3f}, {high:+.3f}]" in text

    nothing = powered.primary_tests({m: {} for m in powered.METHODS})
    assert powered.reading(nothing, complete=False).endswith("no contrast has two seeds with both runs finished yet.")  # fmt: skip

    best = powered.primary_tests(synthetic_runs({"mrtpo": 0.1}))
    assert powered.reading(best, complete=True).startswith(
        "MRTPO differs from GDPO, from the placebo and from the shuffled weights"
    )

    # MRTPO like GDPO, both above a placebo that falls: a pattern not named in advance.
    other = powered.primary_tests(synthetic_runs({"mrtpo_placebo": -0.1}))
    assert powered.reading(other, complete=True).startswith(
        "None of the patterns named in advance: MRTPO does not differ from gdpo, does not "
        "differ from mrtpo_shuffled, differs from mrtpo_placebo."
    )


def test_exploratory_table_puts_the_controls_against_gdpo():
    runs = synthetic_runs({"mrtpo_placebo": -0.1})
    table = powered.exploratory_table(runs)
    differences = [
        np.mean([r["rewards/tool_format/mean"] for r in runs["mrtpo_placebo"][s]["records"]])
        - np.mean([r["rewards/tool_format/mean"] for r in runs["gdpo"][s]["records"]])
        for s in powered.SEEDS
    ]
    test = paired_stats.paired_t(differences)
    assert test["mean"] == pytest.approx(-0.1, abs=0.01)
    assert (
        f"| mrtpo_placebo - gdpo | tool_format | 6 | {test['mean']:+.3f} | "
        f"[{test['low']:+.3f}, {test['high']:+.3f}] | {test['p']:.3f} |"
    ) in table
    assert "| mrtpo_shuffled - gdpo | tool_correctness | 6 |" in table
    del runs["gdpo"]
    assert "| mrtpo_placebo - gdpo | tool_format | 0 | – | – | – |" in powered.exploratory_table(
        runs
    )


def write_study(root: Path, runs: dict, cold_start: dict | None, power: dict) -> None:
    task = root / "tool_calling"
    study = {
        "command": "python benchmarks/convergence.py ...",
        "settings": {
            "steps": 20,
            "prompts": 4,
            "generations": 4,
            "max_completion_length": 96,
            "learning_rate": 1e-5,
            "model_name_or_path": "m",
            "sft_max_steps": 3,
            "device": "cpu",
        },  # fmt: skip
        "methods": powered.METHODS,
        "seeds": {m: list(powered.SEEDS) for m in powered.METHODS},
        "analysis": powered.PREREGISTRATION,
        "power": power,
    }
    convergence_runs._write_json(task / "study.json", study)
    for method, seeds in runs.items():
        for seed, run in seeds.items():
            folder = task / method / f"seed{seed}"
            folder.mkdir(parents=True)
            lines = [json.dumps({**r, "step_time": 10.0}) for r in run["records"]]
            (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
            evaluation = {part: {metric: {"mean": 0.5, "se": 0.02} for metric in ("format", "correctness", "exact")} for part in ("test", "bfcl_simple_python")}  # fmt: skip
            (folder / "final_eval.json").write_text(json.dumps(evaluation))
    if cold_start is not None:
        convergence_runs._write_json(task / "cold_start" / "final_eval.json", cold_start)


def test_power_calculation_on_a_first_study(tmp_path):
    # A first study of 2 methods x 3 seeds x 15 steps: gdpo's median ramps 0.02 a step.
    generator = np.random.default_rng(1)
    runs = {}
    for method in ("gdpo", "mrtpo"):
        runs[method] = {}
        for seed in range(3):
            fmt = 0.1 + 0.02 * np.arange(1, 16) + generator.normal(0, 0.03)  # a per-seed level
            runs[method][seed] = {"records": records(fmt.tolist(), (fmt / 2).tolist())}
    write_study(tmp_path, runs, None, {})
    study = json.loads((tmp_path / "tool_calling" / "study.json").read_text())
    study["settings"]["steps"] = 15
    study["seeds"] = {"gdpo": [0, 1, 2], "mrtpo": [0, 1, 2]}
    (tmp_path / "tool_calling" / "study.json").write_text(json.dumps(study))
    power = powered.power_calculation(tmp_path)
    part = power["tool_format"]
    levels = {m: [np.mean([r["rewards/tool_format/mean"] for r in runs[m][s]["records"]]) for s in range(3)] for m in runs}  # fmt: skip
    pooled = math.sqrt(sum(np.var(v, ddof=1) * 2 for v in levels.values()) / 4)
    assert part["pooled_auc_sd"] == pytest.approx(pooled)
    assert part["pooled_degrees_of_freedom"] == 4
    median = np.median([[r["rewards/tool_format/mean"] for r in runs["gdpo"][s]["records"]] for s in range(3)], axis=0)  # fmt: skip
    slope = np.polyfit(np.arange(1, 16), median, 1)[0]
    assert part["gdpo_slope_per_step"] == pytest.approx(slope)
    assert part["paper_sized_auc_effect"] == pytest.approx(slope * (19 / 13 - 1) * 10.5)
    assert 0 < part["power"]["alpha_0.05/6"] < part["power"]["alpha_0.05"] <= 1
    assert "| tool_format | 0.0200 |" in powered.power_markdown(power)


def test_report_is_regenerated_from_the_results_files(tmp_path):
    runs = synthetic_runs({"mrtpo": 0.1, "mrtpo_placebo": 0.1})
    del runs["mrtpo_shuffled"][5]  # a run not started yet: the report is interim
    cold = {"test": {m: {"mean": 0.2} for m in ("format", "correctness", "exact")}}
    power = {"source": "x", "first_study_steps": 15, "seeds": 6, "paper_speedup": 19 / 13}
    for name in powered.ENDPOINTS:
        power[name] = {"gdpo_slope_per_step": 0.02, "paper_sized_auc_effect": 0.1,
                       "pooled_auc_sd": 0.02, "pooled_degrees_of_freedom": 8,
                       "difference_sd": 0.03, "measured_difference_sd": None,
                       "power": {"alpha_0.05": 0.99, "alpha_0.05/6": 0.9}}  # fmt: skip
    write_study(tmp_path, runs, cold, power)
    # A run trained and being evaluated: trained, not finished.
    (tmp_path / "tool_calling" / "gdpo" / "seed4" / "final_eval.json").unlink()
    path = powered.write_report(tmp_path)
    text = path.read_text()
    assert powered.PREREGISTRATION in text
    assert text.index("## The analysis, as pre-registered") < text.index("## Result")
    assert "**Interim (the grid is not complete; not the result):** MRTPO differs from GDPO but not from the placebo" in text  # fmt: skip
    assert (
        "Progress: 22 of 24 runs finished (trained and evaluated), 1 more trained and not yet "
        "evaluated; the cold start evaluated." in " ".join(text.split())
    )
    assert "| mrtpo - mrtpo_shuffled | tool_format |" in text and "| 5 |" in text  # 5 seeds
    assert "| test format rate | 0.200 |" in text  # the cold start beside the methods
    assert "| steps to 0.8 (21: not reached) | – |" in text  # the cold start never trained
    assert "### Exploratory: the controls against GDPO (not pre-registered)" in text
    # Every run sampled its test rows with one seed: a limitation, after the secondary table.
    limitation = text.index("**Limitation: one sampling draw for every run's test rows.**")
    assert text.index("### Secondary") < limitation < text.index("### Exploratory")
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert (tmp_path / "diagnostics.png").stat().st_size > 0
    assert powered.write_report(tmp_path).read_text() == text


def test_one_evaluation_seed_for_every_run_is_reported_as_a_limitation():
    """Runs evaluated with one seed (no `eval_seed` in run.json: seed 0, as every run of the
    study was): the note says the test-row intervals are too narrow, with each method's
    between-seed SD of test correctness beside its runs' sampling SE."""

    def run(correctness, se, eval_seed=None):
        record = {} if eval_seed is None else {"eval_seed": eval_seed}
        return {"eval": {"test": {"correctness": {"mean": correctness, "se": se}}}, "run": record}

    runs = {
        "gdpo": {0: run(0.40, 0.018), 1: run(0.42, 0.020), 2: run(0.44, 0.019)},
        "mrtpo": {0: run(0.30, 0.019), 1: run(0.40, 0.019), 2: {"eval": None, "run": None}},
    }
    note = powered.evaluation_draw_note(runs)
    assert "**Limitation: one sampling draw for every run's test rows.**" in note
    assert "with seed 0 (" in note
    assert "| gdpo | 0.020 | 0.019 (0.018-0.020) |" in note  # SD of 0.40, 0.42, 0.44
    assert "| mrtpo | 0.071 | 0.019 (0.019-0.019) |" in note  # two evaluated runs
    assert "here it is below it for no method" in note
    runs["gdpo"][2] = run(0.42, 0.019)  # 0.40, 0.42, 0.42: SD 0.012
    assert "below it for `gdpo`:" in powered.evaluation_draw_note(runs)
    assert "the primary endpoints, the training rewards, are not affected" in " ".join(note.split())

    for seed, each in enumerate([*runs["gdpo"].values(), *runs["mrtpo"].values()]):
        if each["eval"]:
            each["run"] = {"eval_seed": 1000 + seed}
    note = powered.evaluation_draw_note(runs)
    assert "Limitation" not in note and "sampled with its own seed" in note


def test_the_machines_table_shows_each_start_of_training():
    session = {"cpu": "Intel Xeon", "cold_start_sha256": "0123456789abcdef" * 4}
    runs = {
        "gdpo": {0: {"run": {"sessions": [{"cpu": "AMD EPYC"}]}}},
        "mrtpo": {0: {"run": {"sessions": [session, {**session, "cpu": "AMD EPYC"}]}}},
    }
    table = powered.machines_table(runs)
    row = next(line for line in table.splitlines() if line.startswith("| 0 |"))
    assert row == (
        "| 0 | AMD EPYC, cold start not recorded | Intel Xeon, cold start 0123456789ab; "
        "AMD EPYC, cold start 0123456789ab | – | – |"
    )
    assert table.count("| – | – | – | – |") == len(powered.SEEDS) - 1


def test_the_diagnostics_table_skips_an_arm_without_runs():
    """A study's report is written after each run: while an arm has no run yet, its row is left
    out (a crash there stopped the runner before its commit)."""
    records = [{"step": step, "grad_norm": 2.0 * step} for step in range(1, 21)]
    runs = {"gdpo": {0: {"records": records}}, "auto": {}}
    table = powered.diagnostics_table(runs, (("grad_norm", "gradient norm"),))
    rows = [line for line in table.splitlines() if line.startswith("| gdpo")]
    assert [row.split(" | ")[1] for row in rows] == ["1-5", "6-10", "11-15", "16-20"]
    assert "| gdpo | 1-5 | 6.000 |" in table and "auto" not in table
