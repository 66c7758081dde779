"""The second plan's power step, tests, reading and report (benchmarks/update_quality_plan2_*.py)
on planted results: records shaped as the measure pass writes them (dots with each fold's
reference) from vectors whose contrasts' signs and sizes are set, checked against the same
quantities computed here from the vectors themselves with numpy and scipy."""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import update_quality as uq  # noqa: E402
import update_quality_plan2 as plan2  # noqa: E402
import update_quality_plan2_analysis as analysis2  # noqa: E402
import update_quality_plan2_report as report2  # noqa: E402

VARIANTS = ("grpo", "gdpo", "mrtpo", "placebo", "shuffled", "entropy", "generic", "contrastive")
PLAN = plan2.plan_2()
FIXTURE = Path(__file__).resolve().parent / "data" / "update-quality-plan2-report"
STATE = "qwen_instructions"


@dataclass
class Planted:
    """A sample's vectors: each mini-batch's part of each reward's reference [n, K, D] and each
    variant's gradient at beta 1 [n, D]; the mini-batches' folds are b % folds."""

    parts: np.ndarray
    vectors: dict[str, np.ndarray]
    folds: int = 4


def plant(batches: int, shifts: dict[str, float], seed: int, own: float = 0.02) -> Planted:
    """Two rewards whose references add up to e0 per mini-batch (plus noise); gdpo's gradient
    e0 + 2 e2 + noise; a variant's gdpo's plus shifts[variant] e0 plus a little of its own:
    at any beta, a larger shift points the blend further along the reference."""
    rng = np.random.default_rng(seed)
    dimension = 8
    means = np.zeros((2, dimension))
    means[:, 0], means[0, 1], means[1, 1] = 0.5, 0.5, -0.5
    parts = means + 0.3 * rng.standard_normal((batches, 2, dimension))
    gdpo = np.zeros((batches, dimension))
    gdpo[:, 0], gdpo[:, 2] = 1.0, 2.0
    gdpo += 0.3 * rng.standard_normal((batches, dimension))
    vectors = {"gdpo": gdpo}
    for variant in VARIANTS:
        if variant != "gdpo":
            shifted = gdpo.copy()
            shifted[:, 0] += shifts.get(variant, 0.0)
            vectors[variant] = shifted + own * rng.standard_normal((batches, dimension))
    return Planted(parts, vectors)


WEIGHED = ("mrtpo", "placebo", "entropy", "generic", "contrastive")  # weight statistics


def planted_weights(batch: int) -> dict:
    """A mini-batch's weight statistics (`measure_batch`'s "weights"), seeded by the batch:
    constraint_1 replays nothing on odd mini-batches (None, 0 pairs)."""
    rng = np.random.default_rng(100 + batch)
    out = {}
    for variant in WEIGHED:
        share = [float(rng.uniform(0.3, 1.0)), float(rng.uniform(0.3, 1.0))]
        overlap = [float(rng.uniform(0.1, 0.9)), float(rng.uniform(0.1, 0.9))]
        pairs = [int(rng.integers(1, 16)), int(rng.integers(1, 16))]
        if batch % 2:
            share[1] = overlap[1] = None
            pairs[1] = 0
        out[variant] = {"effective_share": share, "entropy_overlap": overlap, "pairs": pairs}
    return out


def records(
    planted: Planted,
    variants: tuple[str, ...] = VARIANTS,
    folds: bool = True,
    mode: str = "per_fold",
    weights: bool = False,
) -> list[dict]:
    """The measure pass's records of the planted sample (`measure_batch`'s keys), as stored,
    with the rewards' references kept as `mode` (`--reward_references`) says: per fold
    (per_fold), or the summed reward's per fold and the rewards' whole (whole) or not (none)."""
    parts, count = planted.parts, planted.folds
    fold_sums = np.stack([parts[f::count].sum(axis=0) for f in range(count)])  # [F, K, D]
    out = []
    for batch in range(len(parts)):
        fold = batch % count
        references = fold_sums.copy()
        references[fold] -= parts[batch]
        by_reward = references.transpose(1, 0, 2)  # [K, F, D]
        kept = by_reward if mode == "per_fold" else by_reward.sum(axis=0, keepdims=True)
        whole = by_reward.sum(axis=1)  # [K, D] each reward's whole reference
        fold_gram = np.einsum("afd,bgd->abfg", kept, kept)
        gdpo = planted.vectors["gdpo"][batch]
        directions = {}
        for variant in variants:
            vector = planted.vectors[variant][batch]
            fold_dots = kept @ vector  # [K, F] (or [1, F]: the summed reward)
            directions[variant] = {
                "ref_dots": fold_dots.sum(axis=1).tolist(),
                "norm2": float(vector @ vector),
                "dot_gdpo": float(vector @ gdpo),
                **({"ref_fold_dots": fold_dots.tolist()} if folds else {}),
                **({"reward_dots": (whole @ vector).tolist()} if mode == "whole" else {}),
            }
        record = {
            "batch": batch,
            "reward_names": ["constraint_0", "constraint_1"],
            "ref_gram": fold_gram.sum(axis=(2, 3)).tolist(),
            "directions": directions,
        }
        if folds:
            record.update(folds=count, fold=fold, ref_fold_gram=fold_gram.tolist())
        if mode != "per_fold":
            record["reward_references"] = mode
        if mode == "whole":
            record["reward_gram"] = (whole @ whole.T).tolist()
        if weights:
            record["weights"] = planted_weights(batch)
        out.append(json.loads(json.dumps(record)))
    return out


SPECS = {"gdpo": ("gdpo", 0.0), "mrtpo(0.5)": ("mrtpo", 0.5), "placebo(0.5)": ("placebo", 0.5)}
SPECS["contrastive(0.5)"] = ("contrastive", 0.5)


def hand_difference(planted: Planted, first: str, second: str, left_out: int | None) -> float:
    """The mean cosine difference over the mini-batches, from the vectors: with fold
    `left_out` (or none) out of the mini-batches and out of every reference."""
    n = len(planted.parts)
    kept = [b for b in range(n) if left_out is None or b % planted.folds != left_out]
    summed = planted.parts.sum(axis=1)

    def cosine(name: str, batch: int) -> float:
        variant, beta = SPECS[name]
        vector = (1 - beta) * planted.vectors["gdpo"][batch]
        vector = vector + beta * planted.vectors[variant][batch]
        reference = sum(summed[b] for b in kept if b != batch)
        return float(vector @ reference / np.linalg.norm(vector) / np.linalg.norm(reference))

    return float(np.mean([cosine(first, b) - cosine(second, b) for b in kept]))


def hand_power(effect: float, error: float, pilot: int, n: int, alpha: float) -> float:
    """P(|T| > t_crit) for T = (Z + shift) / sqrt(V / df), V chi-square on df = min(4, n) - 1
    folds less one, shift = effect over the pilot's SE scaled to n: integrated over V."""
    from scipy import integrate

    degrees = min(4, n) - 1
    shift = effect / (error * math.sqrt(pilot / n))
    critical = stats.t.ppf(1 - alpha / 2, degrees)

    def rejected(v: float) -> float:
        bound = critical * math.sqrt(v / degrees)
        tails = stats.norm.sf(bound - shift) + stats.norm.cdf(-bound - shift)
        return tails * stats.chi2.pdf(v, degrees)

    return integrate.quad(rejected, 0, np.inf, epsabs=1e-12, epsrel=1e-10)[0]


PILOT_SHIFTS = {"mrtpo": 0.4, "placebo": 0.3, "generic": 0.3, "contrastive": 0.5}


def planted_pilot() -> Planted:
    """The pilot: 8 mini-batches, noisy enough that the sample size is not trivial."""
    return plant(8, PILOT_SHIFTS, seed=4, own=0.3)


PILOT_RUN = {
    "lanes": {
        "0": {"cpu_seconds": {"sample": 500.0, "reference": 1500.0, "measure": 3000.0}},
        "1": {"cpu_seconds": {"sample": 400.0, "reference": 1400.0, "measure": 3200.0}},
    }
}


def test_the_power_step_equals_a_hand_computation():
    planted = planted_pilot()
    power = analysis2.power_2(records(planted), PILOT_RUN, PLAN, prompt_batches=72)
    alpha = 0.05 / 3
    summed = planted.parts.sum(axis=1)
    gdpo_mean = np.mean(
        [
            planted.vectors["gdpo"][b]
            @ (summed.sum(0) - summed[b])
            / np.linalg.norm(planted.vectors["gdpo"][b])
            / np.linalg.norm(summed.sum(0) - summed[b])
            for b in range(8)
        ]
    )
    effect = 0.2 * abs(gdpo_mean)
    assert power["gdpo_mean_cosine"] == pytest.approx(gdpo_mean, rel=1e-9)
    assert power["effect"] == pytest.approx(effect, rel=1e-9)
    assert power["alpha"] == pytest.approx(alpha)
    for first, second in plan2.PRIMARY_CONTRASTS_2:
        stored = power["contrasts"][f"{first} - {second}"]
        deleted = np.array([hand_difference(planted, first, second, f) for f in range(4)])
        error = math.sqrt(3 / 4 * np.sum((deleted - deleted.mean()) ** 2))
        assert stored["difference_mean"] == pytest.approx(
            hand_difference(planted, first, second, None), rel=1e-9
        )
        assert stored["jackknife_se"] == pytest.approx(error, rel=1e-9)
        needed = stored["needed_batches"]  # the fewest: power rises with n
        assert hand_power(effect, error, 8, needed, alpha) >= 0.8
        assert hand_power(effect, error, 8, needed - 1, alpha) < 0.8
        assert stored["power_at_batches"] == pytest.approx(
            hand_power(effect, error, 8, power["batches"], alpha), rel=1e-7
        )
    # the planted signs: mrtpo above gdpo (shift 0.4), contrastive above mrtpo (0.1)
    assert power["contrasts"]["mrtpo(0.5) - gdpo"]["difference_mean"] > 0
    assert power["contrasts"]["contrastive(0.5) - mrtpo(0.5)"]["difference_mean"] > 0
    # the budget: 10 CPU-hours over the pilot's 10,000 CPU seconds / 8 mini-batches
    assert power["cost"]["per_batch"] == pytest.approx(1250.0)
    assert power["caps"] == {"budget": 28, "prompts": 72, "max_batches": None}
    needed = power["contrasts"]["mrtpo(0.5) - gdpo"]["needed_batches"]
    assert power["needed_batches"] == needed > 28  # the budget binds
    assert power["batches"] == 28 and power["cap"] == 28
    assert power["main_cpu_hours"] == pytest.approx(28 * 1250 / 3600)


def test_a_tighter_cap_and_no_cost_record():
    pilot = records(planted_pilot())
    capped = analysis2.power_2(pilot, PILOT_RUN, PLAN, prompt_batches=72, max_batches=5)
    assert capped["cap"] == 5 and capped["batches"] == min(5, capped["needed_batches"])
    free = analysis2.power_2(pilot, None, PLAN)
    assert free["cost"] is None and free["caps"]["budget"] is None
    assert free["batches"] == free["needed_batches"] and free["main_cpu_hours"] is None
    with pytest.raises(ValueError, match="without folds"):
        analysis2.power_2(records(planted_pilot(), folds=False), None, PLAN)


def test_the_power_command_writes_the_sizing_beside_the_unchanged_plan(tmp_path):
    plan2.store(tmp_path)
    stored = (tmp_path / plan2.PLAN_2_FILE).read_bytes()
    folder = tmp_path / STATE / "pilot"
    for record in records(planted_pilot()):
        uq.write_json(folder / "measures" / f"batch{record['batch']:03d}.json", record)
    uq.write_json(folder / uq.RUN_FILE, PILOT_RUN)
    assert uq.main(["--results", str(tmp_path), "--power", "--state", STATE]) == 0
    power = json.loads((tmp_path / STATE / uq.POWER_FILE).read_text())
    assert power["caps"]["prompts"] == (320 - 32) // 4  # the bundled train split's prompts
    assert uq.main_batches(tmp_path, STATE) == power["batches"]
    assert (tmp_path / plan2.PLAN_2_FILE).read_bytes() == stored


def test_the_main_sample_sampled_ahead_of_the_power_step_is_cut_to_its_size(tmp_path, capsys):
    with pytest.raises(SystemExit, match="run the pilot and --power first"):
        uq.main_batches(tmp_path, STATE)
    assert uq.main_batches(tmp_path, STATE, ahead=5) == 5
    with pytest.raises(SystemExit, match="--ahead must be at least 1"):
        uq.main_batches(tmp_path, STATE, ahead=0)
    samples = tmp_path / STATE / "main" / "samples"
    for batch in range(5):  # what `--ahead 5` leaves
        uq.write_json(samples / f"batch{batch:03d}.json", {"batch": batch})
    uq.write_json(tmp_path / STATE / uq.POWER_FILE, {"batches": 3})
    with pytest.raises(SystemExit, match="sized already \\(3 mini-batches"):
        uq.main_batches(tmp_path, STATE, ahead=5)
    with pytest.raises(SystemExit, match="batch003.json, batch004.json sampled ahead beyond"):
        uq.main_batches(tmp_path, STATE)
    for batch in (3, 4):
        (samples / f"batch{batch:03d}.json").unlink()
    assert uq.main_batches(tmp_path, STATE) == 3
    for sample in (["--sample", "pilot", "--sample_only"], ["--sample", "main"]):
        with pytest.raises(SystemExit):
            uq.main(["--results", str(tmp_path), "--state", STATE, *sample, "--ahead", "2"])
        assert "--ahead samples the main sample only" in capsys.readouterr().err


def _adjusted_by_hand(pvalues: list[float]) -> list[float]:
    order = sorted(range(3), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * 3, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (3 - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


# Planted patterns and the reading each selects (placebo and contrastive: above or not).
PATTERNS = [
    (
        {"mrtpo": 0.6, "placebo": 0.0, "generic": 0.0, "contrastive": 0.6},
        {"gdpo": "above", "placebo": "above", "contrastive": "not above", "generic": "not equal"},
    ),
    (
        {"mrtpo": 0.6, "placebo": 0.6, "generic": 0.6, "contrastive": 1.4},
        {"gdpo": "above", "placebo": "not above", "contrastive": "above", "generic": "equal"},
    ),
    (
        {"mrtpo": -0.6, "placebo": -0.6, "generic": -0.6, "contrastive": -1.4},
        {"gdpo": "below", "placebo": "not above", "contrastive": "not above", "generic": "equal"},
    ),
    (
        {"mrtpo": 0.0, "placebo": 0.0, "generic": 0.5, "contrastive": 0.0},
        {
            "gdpo": "none",
            "placebo": "not above",
            "contrastive": "not above",
            "generic": "not equal",
        },
    ),
]


@pytest.mark.parametrize(("shifts", "expected"), PATTERNS)
def test_holm_and_the_reading_each_planted_pattern_selects(shifts, expected):
    main = records(plant(16, shifts, seed=11, own=0.002))
    tests = analysis2.plan_2_tests(main, plan2.PRIMARY_CONTRASTS_2, 0.05)
    pvalues = [t["test"]["p"] for t in tests]
    for test, adjusted in zip(tests, _adjusted_by_hand(pvalues), strict=True):
        assert test["holm_p"] == pytest.approx(adjusted, rel=1e-12)
        assert test["significant"] == (adjusted <= 0.05)
        assert test["paired"]["n"] == 16 and test["test"]["n"] == 4
    (generic,) = analysis2.plan_2_tests(main, [("mrtpo(0.5)", "generic(0.5)")])
    chosen = analysis2.pattern(tests, generic["test"], effect=0.05)
    assert chosen == expected
    values = uq.per_estimator(main, estimators=plan2.ESTIMATORS_2)
    lines = report2.reading_lines(tests, generic["test"], {"effect": 0.05}, values, "SHARES")
    for role, reading in chosen.items():
        text = analysis2.READINGS[role, reading].split("(")[0].strip()
        assert sum(text in line for line in lines) == 1, (role, reading)
    assert ("(SHARES)" in "".join(lines)) == (chosen["placebo"] == "not above")
    # each planted contrast: its sign where it is planted non-zero, no difference where zero
    for (first, second), test in zip(plan2.PRIMARY_CONTRASTS_2, tests, strict=True):
        planted = shifts.get(SPECS[first][0], 0.0) - shifts.get(SPECS[second][0], 0.0)
        assert analysis2.outcome(test) == np.sign(round(planted, 9))


def test_a_contrast_not_measured_is_said_so_and_does_not_fail():
    main = records(plant(8, PILOT_SHIFTS, seed=5), variants=("grpo", "gdpo", "mrtpo"))
    tests = analysis2.plan_2_tests(main, plan2.PRIMARY_CONTRASTS_2, 0.05)
    assert [t["measured"] for t in tests] == [True, False, False]
    assert tests[0]["holm_p"] == tests[0]["test"]["p"]  # Holm over the one test present
    table = "\n".join(report2.tests_table(tests, corrected=True))
    assert "| mrtpo(0.5) - placebo(0.5) | not measured yet |" in table
    assert analysis2.reward_cosine_test(main, "generic(0.5)", 0) is None
    assert analysis2.plan_2_tests([], plan2.PRIMARY_CONTRASTS_2, 0.05)[0]["test"] is None


# ----------------------------------------------------------------------------- the report


def _sample(batch: int, rng: np.random.Generator) -> dict:
    """A sampled mini-batch of 4 prompts x 4 responses, two constraint slots: the prompts of
    odd index have no second constraint (score NaN, no information); some responses stop at
    the cap (256 ids)."""
    rewards, verdicts = [], [[], []]
    completion_ids = []
    for row in range(16):
        prompt = 4 * batch + row // 4
        scores = [float(rng.integers(0, 2)), float(rng.integers(0, 2))]
        infos = [f"Constraint 0 of prompt {prompt}.", f"Constraint 1 of prompt {prompt}."]
        if prompt % 2:
            scores[1], infos[1] = float("nan"), ""
        rewards.append(scores)
        for k in range(2):
            verdicts[k].append([None if math.isnan(scores[k]) else scores[k], infos[k], []])
        completion_ids.append([5] * (256 if rng.random() < 0.15 else int(rng.integers(10, 40))))
    return {
        "prompt_ids": [[1, 2, 3]] * 16,
        "completion_ids": completion_ids,
        "rewards": rewards,
        "reward_names": ["constraint_0", "constraint_1"],
        "verdicts": verdicts,
    }


def build_fixture(folder: Path) -> None:
    """The report fixture: the second plan stored; its state's pilot (8 mini-batches sampled,
    about 15% at the cap: cap.json decides 256 by the rule; measured with `--reward_references
    none`, its run.json), the power step's power.json (capped at 8), a main sample of 8
    (none, with weight statistics; samples of its first 3); the first plan's qwen_sql main
    sample (no folds) and the same measured again into folds/ (none, every variant of the
    second plan, weight statistics; smollm2_tool_calling: nothing)."""
    plan2.store(folder)
    rng = np.random.default_rng(0)
    pilot = records(planted_pilot(), mode="none")
    main = records(plant(8, PATTERNS[0][0], 7), mode="none", weights=True)
    state = folder / STATE
    for sample, measured in (("pilot", pilot), ("main", main)):
        for record in measured:
            name = f"batch{record['batch']:03d}.json"
            uq.write_json(state / sample / "measures" / name, record)
            if sample == "pilot" or record["batch"] < 3:
                uq.write_json(state / sample / "samples" / name, _sample(record["batch"], rng))
    uq.write_json(state / "pilot" / uq.RUN_FILE, PILOT_RUN)
    assert uq.decide_cap(folder, STATE, PLAN)["cap"] == 256
    power = analysis2.power_2(pilot, PILOT_RUN, PLAN, prompt_batches=72, max_batches=8)
    uq.write_json(state / uq.POWER_FILE, power)
    sql = plant(8, {"mrtpo": 0.3, "placebo": 0.25, "shuffled": -0.1}, seed=9)
    measured = {
        folder: records(sql, VARIANTS[:6], folds=False),
        folder / plan2.FOLDS_RESULTS: records(sql, mode="none", weights=True),
    }
    for root, chosen in measured.items():
        for record in chosen:
            name = f"batch{record['batch']:03d}.json"
            uq.write_json(root / "qwen_sql" / "main" / "measures" / name, record)


def _files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != report2.REPORT_2
    }


def _close(built: object, committed: object, where: str) -> None:
    """Equal JSON values, floats to 1e-12 relative: the planted dot products are numpy sums
    whose order follows the CPU's vector width (seen: the last digit of a norm on an Intel
    machine against the AMD one the fixture was written on)."""
    if isinstance(committed, float) and isinstance(built, float):
        both_nan = math.isnan(built) and math.isnan(committed)
        assert both_nan or math.isclose(built, committed, rel_tol=1e-12, abs_tol=1e-15), where
    elif isinstance(committed, dict) and isinstance(built, dict):
        assert sorted(built) == sorted(committed), where
        for key in committed:
            _close(built[key], committed[key], f"{where}/{key}")
    elif isinstance(committed, list) and isinstance(built, list):
        assert len(built) == len(committed), where
        for index, (mine, theirs) in enumerate(zip(built, committed, strict=True)):
            _close(mine, theirs, f"{where}[{index}]")
    else:
        assert built == committed and type(built) is type(committed), where


def test_the_fixture_is_the_planted_one(tmp_path):
    """The committed fixture holds what `build_fixture` writes (the known answers above), to
    the rounding of the CPU that sums the planted vectors (`_close`)."""
    build_fixture(tmp_path)
    built, committed = _files(tmp_path), _files(FIXTURE)
    assert sorted(built) == sorted(committed)
    for name in committed:
        if name.endswith(".json"):
            _close(json.loads(built[name]), json.loads(committed[name]), name)
        else:
            assert built[name] == committed[name], name


def test_the_report_regenerates_byte_for_byte_and_reads_the_planted_pattern(tmp_path):
    """The report of the committed fixture is byte for byte the plan-2-report.md committed
    beside it. After an intended change of the report: `python benchmarks/update_quality.py
    --results tests/data/update-quality-plan2-report --report` (and delete the README.md and
    cosines.png it writes beside it)."""
    shutil.copytree(FIXTURE, tmp_path, dirs_exist_ok=True)
    expected = (FIXTURE / report2.REPORT_2).read_bytes()
    assert report2.write_plan_2_report(tmp_path).read_bytes() == expected
    text = expected.decode()
    assert "### main: 8 mini-batches\n" in text
    assert (
        "- mrtpo(0.5) above placebo(0.5) " in text
        and "the information matters (the replay's weights" in text
    )
    assert "- contrastive(0.5) not above mrtpo(0.5) " in text
    assert "the plain replay stays the default" in text
    # the first plan's pre-registered contrasts beside the same samples' fold jackknife
    pre = uq.primary_tests(uq.load_measures(tmp_path))
    sql = {t["contrast"]: t["test"] for t in pre if t["state"] == "qwen_sql"}
    again = uq.load_measures(tmp_path / report2.FOLDS_RESULTS)["qwen_sql"]["main"]
    for contrast, test in sql.items():
        fold = uq.fold_test(again, *contrast)
        assert fold["mean"] == pytest.approx(test["mean"], rel=1e-9)
        row = (
            f"| qwen_sql | {' - '.join(contrast)} | {test['mean']:+.4f} [{test['low']:+.4f}, "
            f"{test['high']:+.4f}] (n = 8) |"
        )
        assert row in text
    # Holm over the fold jackknife's tests measured again (here qwen_sql's 3), by hand
    folded = {c: uq.fold_test(again, *c)["p"] for c in sql}
    for contrast, adjusted in zip(sql, _adjusted_by_hand(list(folded.values())), strict=True):
        cells = f"| {report2._p(folded[contrast])} | {report2._p(adjusted)} |\n"
        assert f"| qwen_sql | {' - '.join(contrast)} |" in text.split(cells)[0].rsplit("\n", 1)[-1]
    assert "fold-jackknife tests of the first plan's six measured so far (3)" in text
    (generic,) = analysis2.plan_2_tests(again, [("mrtpo(0.5)", "generic(0.5)")])
    assert (
        f"| qwen_sql | mrtpo(0.5) - generic(0.5) | {report2._test_cell(generic['test'])} |" in text
    )
    assert "| smollm2_tool_calling | mrtpo(0.5) - gdpo | not measured yet | – |" in text
    assert "Measured again so far: smollm2_tool_calling not measured yet; qwen_sql 8 of 8" in text
    # the fixture's folds records are the first plan's planted ones with folds: the same cosines
    same = re.search(r"qwen_sql largest difference (\S+) over 8 mini-batches x 11 estimators", text)
    assert same and float(same.group(1)) < 1e-12
    # the exploratory agreement section: each sample's row from `reference_agreement`
    from update_quality_analysis import reference_agreement

    pilot = uq.load_measures(tmp_path, [STATE])[STATE]["pilot"]
    agreement = reference_agreement(pilot)
    assert agreement["pairs"] == 48 and 0.2 < agreement["mean"] < 0.9
    assert (
        f"| {STATE} | pilot (8) | 48 | {agreement['mean']:+.3f} (sd {agreement['sd']:.3f}; "
        f"{agreement['min']:+.3f} to {agreement['max']:+.3f}) | {agreement['ceiling']:.2f} |"
    ) in text
    assert "| qwen_sql (`folds/`) | main (8) | 48 |" in text


def test_a_state_measured_again_in_part_is_reported_as_interim(tmp_path):
    """Half of qwen_sql's re-measured mini-batches: the report says how many, and that the
    numbers are interim, above the table whose fold jackknife uses them."""
    shutil.copytree(FIXTURE, tmp_path, dirs_exist_ok=True)
    measures = tmp_path / report2.FOLDS_RESULTS / "qwen_sql" / "main" / "measures"
    for path in sorted(measures.glob("batch*.json"))[4:]:
        path.unlink()
    # the planned size, as the real folds/ folder holds it (the first plan's power.json)
    uq.write_json(measures.parents[1] / uq.POWER_FILE, {"batches": 8})
    # one re-measured mini-batch's gdpo step half again as long along every reference
    path = measures / "batch002.json"
    record = json.loads(path.read_text())
    gdpo = record["directions"]["gdpo"]
    gdpo["ref_dots"] = [1.5 * v for v in gdpo["ref_dots"]]
    gdpo["ref_fold_dots"] = [[1.5 * v for v in row] for row in gdpo["ref_fold_dots"]]
    path.write_text(json.dumps(record))
    text = report2.write_plan_2_report(tmp_path).read_text()
    assert (
        "Measured again so far: smollm2_tool_calling not measured yet; "
        "qwen_sql 4 of 8 mini-batches (interim numbers below)." in text
    )
    first = {r["batch"]: r for r in uq.load_measures(tmp_path)["qwen_sql"]["main"]}
    again = uq.load_measures(tmp_path / report2.FOLDS_RESULTS)["qwen_sql"]["main"]
    largest = max(
        abs(
            uq.batch_measures(first[r["batch"]], name, 8)["cosine"]
            - uq.batch_measures(r, name, 8)["cosine"]
        )
        for r in again
        for name in uq.ESTIMATORS
    )
    gdpo_cosine = uq.batch_measures(first[2], "gdpo", 8)["cosine"]
    assert largest >= 0.5 * abs(gdpo_cosine) * (1 - 1e-9) > 0.01  # at least gdpo's own shift
    assert f"qwen_sql largest difference {largest:.1e} over 4 mini-batches x 11 estimators" in text


def test_a_main_sample_measured_in_part_gets_no_reading(tmp_path):
    """The reading the plan fixed is of the whole main sample: on 3 of its 8 mini-batches the
    report gives the interim tests and says that no reading is made yet."""
    shutil.copytree(FIXTURE, tmp_path, dirs_exist_ok=True)
    measures = tmp_path / STATE / "main" / "measures"
    for path in sorted(measures.glob("batch*.json"))[3:]:
        path.unlink()
    text = report2.write_plan_2_report(tmp_path).read_text()
    assert "### main: 3 mini-batches (interim: 3 of 8)\n" in text
    reading = text.split("### Reading (fixed in advance)\n\n")[1].split("\n\n")[0]
    assert reading == (
        "No reading yet: the main sample is measured in part (3 of 8 mini-batches); the plan's "
        "reading is applied to the whole sample only."
    )
    assert "the plain replay stays the default" not in text
    primary = text.split("### Primary contrasts")[1].split("### Reading")[0]
    assert re.search(r"\| mrtpo\(0\.5\) - gdpo \| [+-]\d\.\d{4} \[", primary)  # interim tests


def test_the_report_before_any_measurement_says_not_measured_yet(tmp_path):
    plan2.store(tmp_path)
    text = report2.write_plan_2_report(tmp_path).read_text()
    assert "Pilot and power: not measured yet." in text
    assert "No reading yet: the main sample's primary tests are not measured yet." in text
    assert "| mrtpo(0.5) - gdpo | not measured yet | – | – | – | – |" in text


def test_the_committed_report_regenerates_from_the_committed_files(tmp_path):
    committed = Path(__file__).resolve().parents[1] / uq.RESULTS
    copy = tmp_path / "update-quality"
    shutil.copytree(committed, copy, ignore=shutil.ignore_patterns(uq.CHECKPOINTS))
    regenerated = report2.write_plan_2_report(copy).read_bytes()
    assert regenerated == (committed / report2.REPORT_2).read_bytes()


def test_the_jackknife_error_and_a_power_at_a_large_shift():
    """`jackknife_error` by hand; `t_power` where scipy's far tail turns NaN (a shift of 40 on
    3 degrees of freedom) against the integral; `paired_power` through it as before."""
    from paired_stats import jackknife_error, paired_power, t_power

    deleted = [0.1, 0.3, 0.2, 0.4]
    assert jackknife_error(deleted) == pytest.approx(math.sqrt(3 / 4 * 0.05), rel=1e-12)
    alpha = 0.05 / 3
    for shift in (2.5, 40.0, -40.0):
        # hand_power's shift is effect / (error * sqrt(pilot / n)): 1 / (1 / |shift|) at n = 4
        assert t_power(shift, 3, alpha) == pytest.approx(
            hand_power(1.0, 1 / abs(shift), 4, 4, alpha), rel=1e-7
        )
    assert paired_power(1.0, 1.0, 10, 0.05) == pytest.approx(0.803, abs=0.005)


# ----------------------------------------------------------------------------- decisions A-D


def test_the_reference_modes_agree_where_they_overlap():
    """The same planted sample with the rewards' references per fold, whole, or not kept: the
    summed reward's cosines and fold-jackknife tests are the same; `whole` gives the same
    per-reward cosines as `per_fold` (its references are their fold sums) with paired-t
    intervals, `none` none; the references' cosines follow."""
    planted = plant(8, PILOT_SHIFTS, seed=6, own=0.1)
    kept = {mode: records(planted, mode=mode) for mode in ("per_fold", "whole", "none")}
    values = {m: uq.per_estimator(r, estimators=plan2.ESTIMATORS_2) for m, r in kept.items()}
    for name in plan2.ESTIMATORS_2:
        for mode in ("whole", "none"):
            np.testing.assert_allclose(
                values[mode][name]["cosine"], values["per_fold"][name]["cosine"], rtol=1e-12
            )
        np.testing.assert_allclose(
            values["whole"][name]["reward_cosines"],
            values["per_fold"][name]["reward_cosines"],
            rtol=1e-12,
        )
        assert all(math.isnan(c) for row in values["none"][name]["reward_cosines"] for c in row)
    for contrast in plan2.PRIMARY_CONTRASTS_2:
        tests = {mode: uq.fold_test(r, *contrast) for mode, r in kept.items()}
        for mode in ("whole", "none"):
            assert tests[mode] == pytest.approx(tests["per_fold"], rel=1e-9)
    # per reward: fold jackknife (per_fold), paired t over mini-batches (whole), none (none)
    folded = analysis2.reward_cosine_test(kept["per_fold"], "mrtpo(0.5)", 1)
    paired = analysis2.reward_cosine_test(kept["whole"], "mrtpo(0.5)", 1)
    cosines = values["whole"]["mrtpo(0.5)"]["reward_cosines"][1]
    by_hand = stats.ttest_1samp(cosines, 0.0)
    assert paired["mean"] == pytest.approx(np.mean(cosines), rel=1e-12)
    assert paired["p"] == pytest.approx(by_hand.pvalue, rel=1e-9) and paired["n"] == 8
    assert folded["n"] == 4 and folded["mean"] == pytest.approx(paired["mean"], rel=1e-12)
    assert analysis2.reward_cosine_test(kept["none"], "mrtpo(0.5)", 1) is None
    assert uq.reference_correlations(kept["whole"]) == uq.reference_correlations(kept["per_fold"])
    assert uq.reference_correlations(kept["none"]) == []
    lines = "\n".join(report2.reward_cosine_lines(kept["none"]))
    assert "not measured (memory)" in lines and "--reward_references none" in lines
    assert "paired t intervals" in "\n".join(report2.reward_cosine_lines(kept["whole"]))
    with pytest.raises(ValueError, match="holds the summed reward only"):
        uq.batch_measures(kept["none"][0], "gdpo", 8, weights=[1.0, 2.0])


def test_the_weight_table_is_the_mean_and_range_over_mini_batches():
    main = records(plant(4, PILOT_SHIFTS, seed=8), weights=True)
    lines = "\n".join(report2.weight_lines(main))
    for statistic in ("effective_share", "entropy_overlap"):
        summary = uq.weight_summary(main, statistic)
        assert set(summary) == set(WEIGHED)
        for variant in WEIGHED:
            first = [planted_weights(b)[variant][statistic][0] for b in range(4)]
            second = [planted_weights(b)[variant][statistic][1] for b in (0, 2)]  # odd: None
            for k, values in enumerate((first, second)):
                mean, low, high, count = summary[variant][k]
                assert (low, high, count) == (min(values), max(values), len(values))
                assert mean == pytest.approx(np.mean(values), rel=1e-12)
            cells = [f"{np.mean(v):.2f} [{min(v):.2f}, {max(v):.2f}]" for v in (first, second)]
            if statistic == "effective_share":
                assert f"| {variant} | {cells[0]} | {cells[1]} |" in lines
    assert "not measured yet" in "\n".join(report2.weight_lines(records(plant(2, {}, 1))))


def _pilot_samples(folder: Path, cap: int, share: float, stored: bool = True) -> None:
    """8 pilot mini-batches of 16 responses, `share` of them stopped at `cap`; every prompt a
    bundled training row's, every verdict 1."""
    capped = round(share * 128)
    prompt, slots = next(iter(uq.slot_instructions(STATE).items()))
    for batch in range(8):
        ids = [[7] * (cap if 16 * batch + row < capped else 20) for row in range(16)]
        record = {
            "completion_ids": ids,
            "prompts": [[{"role": "user", "content": prompt}]] * 16,
            "rewards": [[1.0] * len(slots)] * 16,
            **({"max_completion_length": cap} if stored else {}),
        }
        name = f"batch{batch:03d}.json"
        uq.write_json(uq.sample_dir(folder, STATE, "pilot", cap) / "samples" / name, record)


def test_the_cap_is_decided_after_the_pilot_in_its_own_file(tmp_path):
    plan2.store(tmp_path)
    stored = (tmp_path / plan2.PLAN_2_FILE).read_bytes()
    with pytest.raises(SystemExit, match="not decided yet: sample the pilot .*--sample_only"):
        uq.lane_cap(tmp_path, STATE, "main", None, sample_only=False)
    assert uq.lane_cap(tmp_path, STATE, "pilot", 384, sample_only=True) == 384
    with pytest.raises(SystemExit, match="the rule needs the pilot at 256 new tokens"):
        uq.decide_cap(tmp_path, STATE, PLAN)
    _pilot_samples(tmp_path, 256, 0.3, stored=False)  # stored before the samples kept their cap
    with pytest.raises(SystemExit, match="pilot at 384 new tokens: sample it .*--cap 384"):
        uq.decide_cap(tmp_path, STATE, PLAN)
    assert uq.sample_dir(tmp_path, STATE, "pilot", 384) == tmp_path / STATE / "pilot-cap384"
    _pilot_samples(tmp_path, 384, 0.125)
    decision = uq.decide_cap(tmp_path, STATE, PLAN)
    assert decision["cap"] == 384 and decision["decided_by"] == "the plan's rule"
    assert decision["pilots"]["256"] == {
        "mini_batches": 8, "responses": 128, "capped": 38, "share": 38 / 128
    }  # fmt: skip
    assert decision["pilots"]["384"]["capped"] == 16
    # every later step reads it: the pilot's folder, the main sample's cap
    assert uq.sample_dir(tmp_path, STATE, "pilot") == tmp_path / STATE / "pilot-cap384"
    assert uq.lane_cap(tmp_path, STATE, "main", None, sample_only=False) == 384
    with pytest.raises(SystemExit, match="cap.json decided 384 new tokens, not --cap 256"):
        uq.lane_cap(tmp_path, STATE, "pilot", 256, sample_only=False)
    with pytest.raises(SystemExit, match="give its --reason"):
        uq.decide_cap(tmp_path, STATE, PLAN, cap=512)
    with pytest.raises(SystemExit, match="holds cap 384 .*delete it to decide again"):
        uq.decide_cap(tmp_path, STATE, PLAN, cap=512, reason="longer answers")
    (tmp_path / STATE / uq.CAP_FILE).unlink()
    by_hand = uq.decide_cap(tmp_path, STATE, PLAN, cap=512, reason="longer answers")
    assert (by_hand["decided_by"], by_hand["reason"]) == ("hand", "longer answers")
    text = "\n".join(report2.cap_lines(tmp_path, STATE, PLAN))
    assert "| pilot at 256 | 128 | 38 (29.7%) |" in text
    assert "| pilot at 384 | 128 | 16 (12.5%) |" in text
    assert "**512** new tokens, decided by hand: longer answers." in text
    # the first 16 cut at 256 are cut again at 384, the other 22 are 20 tokens long there
    assert (
        "of the 38 responses cut at 256, 0 end within 384 with the cut text as their start "
        "(16 are cut again, 22 start otherwise)" in text
    )
    assert "main at 512 | not measured yet" in text
    # a main sample sampled ahead (`--ahead 4`), 20 of its 64 responses at the cap
    for batch in range(4):
        ids = [[7] * (512 if 16 * batch + row < 20 else 30) for row in range(16)]
        record = {"completion_ids": ids, "max_completion_length": 512}
        uq.write_json(tmp_path / STATE / "main" / "samples" / f"batch{batch:03d}.json", record)
    text = "\n".join(report2.cap_lines(tmp_path, STATE, PLAN))
    assert (
        "| main at 512 (4 mini-batches sampled ahead of the power step) | 64 | 20 (31.2%) |" in text
    )
    assert "The main sample has more than the rule's 20% at the cap" in text
    uq.write_json(tmp_path / STATE / uq.POWER_FILE, {"batches": 4})
    assert "| main at 512 | 64 | 20 (31.2%) |" in "\n".join(
        report2.cap_lines(tmp_path, STATE, PLAN)
    )
    assert (tmp_path / plan2.PLAN_2_FILE).read_bytes() == stored  # the plan is unchanged
    with pytest.raises(SystemExit, match="--cap is the second plan's"):
        uq.lane_cap(tmp_path, "qwen_sql", "main", 256, sample_only=False)
    # every pilot above the share: the last candidate
    (tmp_path / STATE / uq.CAP_FILE).unlink()
    _pilot_samples(tmp_path, 384, 0.5)
    _pilot_samples(tmp_path, 512, 0.4)
    assert uq.decide_cap(tmp_path, STATE, PLAN)["cap"] == 512


def test_what_a_cut_does_to_each_constraints_verdict():
    """Planted pairs of a pilot at 4 new tokens and the same prompts at 8: a response cut at 4
    that ends at 6 with the cut text as its start (its verdicts compared), one cut again at 8,
    one that starts otherwise, one that ended before the cut (not counted)."""
    nan = float("nan")
    rows = {"p": ["length:min", "case:lower"], "q": ["length:min", "case:lower", "end:phrase"]}

    def record(ids, prompts, rewards):
        messages = [[{"role": "user", "content": p}] for p in prompts]
        return {"completion_ids": ids, "prompts": messages, "rewards": rewards}

    short = {
        0: record(
            [[1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7, 8], [1, 2]],
            ["p", "q", "p", "q"],
            [[0.0, 1.0, nan], [0.0, 0.0, 1.0], [0.0, 0.0, nan], [1.0, 1.0, 1.0]],
        ),
        1: record([[9, 9, 9, 9]], ["q"], [[1.0, 0.0, 0.0]]),
    }
    long = {
        0: record(
            [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7, 8], [5, 6, 0, 0, 1], [1, 2]],
            ["p", "q", "p", "q"],
            [[1.0, 1.0, nan], [1.0, 1.0, 1.0], [1.0, 1.0, nan], [1.0, 1.0, 1.0]],
        ),
        1: record([[9, 9, 9, 9, 1]], ["q"], [[1.0, 1.0, nan]]),
    }
    effect = uq.cap_effect(short, long, (4, 8), rows)
    assert {k: effect[k] for k in ("cut", "prefix_differs", "cut_again", "ended")} == {
        "cut": 4, "prefix_differs": 1, "cut_again": 1, "ended": 2
    }  # fmt: skip
    # batch 0 row 0 (p): length lost to the cut, case kept; batch 1 (q): length kept, case
    # lost, the phrase's verdict missing at 8 (no pair)
    assert effect["by_instruction"] == {
        "case:lower": {"pairs": 2, "kept": 1, "lost": 1, "gained": 0},
        "length:min": {"pairs": 2, "kept": 1, "lost": 1, "gained": 0},
    }
    text = "\n".join(report2.cut_lines(effect, 4, 8))
    assert "of the 4 responses cut at 4, 2 end within 8 with the cut text as their start" in text
    assert "Their 4 (response, constraint) verdicts on the cut text against the whole " in text
    assert "2 the same, 2 failed on the cut text and satisfied by the whole, 0 the reverse." in text
    assert "| case:lower | 2 | 1 | 1 | 0 |" in text


def test_the_reference_agreement_equals_a_hand_computation():
    """The cosine between two folds' parts of each mini-batch's summed-reward reference, from
    the planted vectors: the same whether the rewards' references were kept per fold (summed
    here) or only the summed reward's; the ceiling by the Spearman-Brown formula."""
    from update_quality_analysis import reference_agreement

    planted = plant(12, {}, seed=9)
    summed = planted.parts.sum(axis=1)  # [n, D]
    cosines = []
    for batch in range(len(summed)):
        parts = [
            sum(summed[b] for b in range(len(summed)) if b % 4 == f and b != batch)
            for f in range(4)
        ]
        for f in range(4):
            for g in range(f + 1, 4):
                a, b = parts[f], parts[g]
                cosines.append(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    mean = float(np.mean(cosines))
    assert 0.2 < mean < 0.9  # the planted references share e0 and e1: they agree
    for mode in ("per_fold", "none"):
        agreement = reference_agreement(records(planted, mode=mode))
        assert agreement["pairs"] == 12 * 6
        assert agreement["mean"] == pytest.approx(mean, rel=1e-9)
        assert agreement["sd"] == pytest.approx(np.std(cosines, ddof=1), rel=1e-9)
        assert agreement["min"] == pytest.approx(min(cosines), rel=1e-9)
        assert agreement["ceiling"] == pytest.approx(math.sqrt(4 * mean / (1 + 3 * mean)))
    assert reference_agreement(records(planted, folds=False)) is None
    assert reference_agreement([]) is None
    # references that share nothing (orthogonal per mini-batch): agreement 0, ceiling 0
    lone = Planted(np.zeros((8, 2, 8)), plant(8, {}, seed=9).vectors)
    for batch in range(8):
        lone.parts[batch, batch % 2, batch] = 1.0
    agreement = reference_agreement(records(lone, variants=("gdpo",)))
    assert agreement["mean"] == 0.0 and agreement["ceiling"] == 0.0
