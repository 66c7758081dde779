"""The offline, cross-fitted judgement of `mrtpo_beta: auto` (benchmarks/beta_auto_offline.py)
on planted update-quality records (`test_update_quality_plan2.records`: the measure pass's
layout, each reference kept per fold) whose answers are known, and against a hand computation
from the planted vectors themselves."""

from __future__ import annotations

import copy
import math
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from test_update_quality_plan2 import Planted, records

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import beta_auto_offline as offline  # noqa: E402
import update_quality as uq  # noqa: E402

from mrtpo.auto_beta import agreement_bound, t_quantile_95  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).resolve().parent / "data" / "beta-auto-offline-report"
DIMENSION = 8  # the references live in the first LIVE dimensions, the rest is orthogonal
LIVE = 5
Slope = Callable[[np.random.Generator, int], np.ndarray]


def plant(
    batches: int, slope: Slope, seed: int, folds: int = 4, gdpo_along: float = 1.0
) -> Planted:
    """Two rewards whose reference parts add up to e0 per mini-batch (plus noise); gdpo's
    gradient gdpo_along e0 + 2 e2 + noise; mrtpo's at beta 1 gdpo's plus `slope(rng, batches)`
    [n, D] (g_R). Noise only in the first LIVE dimensions: a slope beyond them is orthogonal
    to every reference exactly."""
    rng = np.random.default_rng(seed)
    means = np.zeros((2, DIMENSION))
    means[:, 0], means[0, 1], means[1, 1] = 0.5, 0.5, -0.5
    noise = np.zeros((batches, 2, DIMENSION))
    noise[:, :, :LIVE] = 0.3 * rng.standard_normal((batches, 2, LIVE))
    gdpo = np.zeros((batches, DIMENSION))
    gdpo[:, 0], gdpo[:, 2] = gdpo_along, 2.0
    gdpo[:, :LIVE] += 0.3 * rng.standard_normal((batches, LIVE))
    vectors = {"gdpo": gdpo, "mrtpo": gdpo + slope(rng, batches)}
    return Planted(means + noise, vectors, folds)


def along(sign: float, size: float = 2.0, spread: float = 0.3, extra: float = 0.0) -> Slope:
    """g_R = sign * size * e0 + noise in the live dimensions + `extra` beyond them (across
    every reference)."""

    def slope(rng: np.random.Generator, batches: int) -> np.ndarray:
        out = np.zeros((batches, DIMENSION))
        out[:, :LIVE] = spread * rng.standard_normal((batches, LIVE))
        out[:, 0] += sign * size
        out[:, LIVE] += extra
        return out

    return slope


def lengthening(rng: np.random.Generator, batches: int) -> np.ndarray:
    """g_R = 0.3 e0 + e2 + a little noise: a little along the reference (e0), mostly along
    gdpo's part across it (e2). cos(g_R, T) > 0, yet adding g_R turns the step away from T:
    the SmolLM2 case the derivative criterion exists for."""
    out = np.zeros((batches, DIMENSION))
    out[:, :LIVE] = 0.1 * rng.standard_normal((batches, LIVE))
    out[:, 0] += 0.3
    out[:, 2] += 1.0
    return out


def orthogonal(rng: np.random.Generator, batches: int) -> np.ndarray:
    """g_R beyond the references' dimensions: every agreement exactly 0."""
    out = np.zeros((batches, DIMENSION))
    out[:, LIVE:] = 1.0 + rng.standard_normal((batches, DIMENSION - LIVE))
    return out


def sample(planted: Planted) -> list[dict]:
    """The planted sample's records with folds, gdpo's and mrtpo's directions."""
    return records(planted, ("gdpo", "mrtpo"))


# ----------------------------------------------------------------------------- known answers


def test_a_reallocation_along_the_reference_gets_beta_max_and_is_mrtpo_1():
    measured = sample(plant(16, along(+1.0), seed=1))
    judged = offline.judge(measured)
    assert [c["beta"] for c in judged["choices"]] == [1.0] * 4
    assert all(c["lower"] > 0 and c["agreements"] == 12 for c in judged["choices"])
    intervals = judged["intervals"]
    for key in ("cosine/mrtpo(1)", "own_fold/mrtpo(1)", "gain/mrtpo(1)"):
        assert (intervals[key]["mean"], intervals[key]["low"], intervals[key]["high"]) == (0, 0, 0)
    steps = offline.statistics({0, 1, 2, 3})(measured)
    assert steps["mean/auto"] == steps["mean/mrtpo(1)"]
    assert intervals["cosine/gdpo"]["low"] > 0  # along the reference: better than gdpo


@pytest.mark.parametrize("slope", [orthogonal, along(-1.0)], ids=["orthogonal", "against"])
def test_a_reallocation_across_or_against_gets_beta_0_and_is_gdpo_exactly(slope):
    measured = sample(plant(16, slope, seed=2))
    judged = offline.judge(measured)
    assert [c["beta"] for c in judged["choices"]] == [0.0] * 4
    if slope is orthogonal:
        assert all(c["mean"] == 0.0 and c["se"] == 0.0 for c in judged["choices"])
    else:
        assert all(c["mean"] < 0 for c in judged["choices"])
    for key in ("cosine/gdpo", "own_fold/gdpo", "gain/gdpo"):
        test = judged["intervals"][key]
        assert (test["mean"], test["low"], test["high"]) == (0, 0, 0)
    for record in measured:  # the auto step's numbers are gdpo's, bit for bit
        assert offline.combination(record, 1.0, 0.0) == {
            key: record["directions"]["gdpo"][key]
            for key in ("ref_dots", "ref_fold_dots", "norm2", "dot_gdpo")
        }
    held, sentence = offline.goal("smollm2_tool_calling", judged)
    assert held and sentence.startswith("auto not below gdpo's beyond its interval (")
    # the same numbers with more mini-batches planned than measured: interim, judged nothing
    held, sentence = offline.goal("smollm2_tool_calling", {**judged, "planned": 43})
    assert held is None
    assert "not judged before all 43 mini-batches are measured (16 so far; interim: " in sentence


def test_a_reallocation_that_lengthens_gdpos_step_across_the_reference_gets_beta_0():
    """The re-allocation's cosine with the reference is clearly positive in every fold (the
    rule before the derivative criterion would have taken beta 1, mrtpo(1), whose step is
    worse than gdpo's), but at beta 0 the step's cosine falls with beta: auto stays gdpo."""
    measured = sample(plant(16, lengthening, seed=6))
    judged = offline.judge(measured)
    assert [c["beta"] for c in judged["choices"]] == [0.0] * 4
    for choice in judged["choices"]:
        fold = choice["fold"]
        kept = [g for g in range(4) if g != fold]
        cosines = [
            offline.measures_of(r, offline.combination(r, -1.0, 1.0), kept)["cosine"]
            for r in measured
            if r["fold"] != fold
        ]
        assert agreement_bound(cosines)[2] > 0.2  # the cosine: clearly positive
        assert choice["mean"] < -0.1 and choice["lower"] < 0 and choice["stop_lower"] < 0
    intervals = judged["intervals"]
    assert (intervals["cosine/gdpo"]["mean"], intervals["gain/gdpo"]["mean"]) == (0, 0)
    assert intervals["cosine/mrtpo(1)"]["low"] > 0  # mrtpo(1) below auto = gdpo


def test_a_walk_stops_where_the_bound_stops_being_positive():
    """`walk`: up by 0.1 while the bound of the evidence at beta is above 0, at most beta_max;
    fewer than 2 agreements give no bound, so no rise."""
    peak = 0.35  # agreements positive below the peak, negative above

    def evidence(beta: float) -> list[float]:
        return [peak - beta + d for d in (-0.01, 0.0, 0.01)]

    beta, lower = offline.walk(evidence, 1.0)
    assert beta == 0.4 and lower < 0
    assert offline.walk(evidence, 0.3) == (0.3, agreement_bound(evidence(0.3))[2])
    assert offline.walk(lambda beta: [0.5], 1.0)[0] == 0.0
    assert offline.walk(lambda beta: [-0.1, -0.2], 1.0)[0] == 0.0


def _scramble(record: dict, fold: int | None, rng: np.random.Generator) -> None:
    """Replace, in place, every number of `record` that holds fold `fold`'s samples: all of
    them for a mini-batch of that fold (None: this record's own fold), else its dots with that
    fold's reference part (and the whole sums, which hold it)."""
    own = fold is None or record["fold"] == fold
    fold = record["fold"] if fold is None else fold
    gram = np.asarray(record["ref_fold_gram"])
    if own:
        gram = rng.uniform(1, 2, gram.shape)
    gram[:, :, fold, :] = gram[:, :, :, fold] = rng.uniform(1, 2, gram[:, :, fold, :].shape)
    record["ref_fold_gram"] = gram.tolist()
    record["ref_gram"] = rng.uniform(1, 2, np.shape(record["ref_gram"])).tolist()
    for entry in record["directions"].values():
        dots = np.asarray(entry["ref_fold_dots"])
        if own:
            dots = rng.standard_normal(dots.shape)
            entry["norm2"], entry["dot_gdpo"] = rng.uniform(5, 9), rng.uniform(-1, 1)
        dots[:, fold] = rng.standard_normal(len(dots))
        entry["ref_fold_dots"], entry["ref_dots"] = dots.tolist(), dots.sum(axis=1).tolist()


@pytest.mark.parametrize("fold", range(4))
def test_a_folds_own_numbers_never_change_its_beta(fold):
    """Cross-fitting: scrambling every number that holds fold f's samples (its mini-batches'
    directions, every reference's part from fold f) leaves fold f's agreements and beta as
    they were; scrambling another fold's changes them."""
    rng = np.random.default_rng(fold)
    measured = sample(plant(14, along(+1.0, size=0.4, spread=1.0), seed=3))
    kept = list(range(4))
    before = offline.fold_agreements(measured, fold, kept)
    scrambled = copy.deepcopy(measured)
    for record in scrambled:
        _scramble(record, fold if record["fold"] != fold else None, rng)
    assert offline.fold_agreements(scrambled, fold, kept) == before
    assert offline.fold_choice(scrambled, fold, kept, 1.0) == offline.fold_choice(
        measured, fold, kept, 1.0
    )
    other = (fold + 1) % 4
    for record in measured:
        _scramble(record, other if record["fold"] != other else None, rng)
    assert offline.fold_agreements(measured, fold, kept) != before


# ----------------------------------------------------------------------------- by hand


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _hand(planted: Planted, out: int | None) -> dict[str, float]:
    """The judgement's statistics with fold `out` (or none) left out of everything, from the
    vectors: references as sums of the other mini-batches' parts of the kept folds, the rule's
    walk on its bound with the trainer's t table, gains up to the sample's constant."""
    n, folds = len(planted.parts), planted.folds
    parts = planted.parts.sum(axis=1)
    gdpo, mrtpo = planted.vectors["gdpo"], planted.vectors["mrtpo"]
    slope = mrtpo - gdpo
    kept = [f for f in range(folds) if f != out]
    batches = [b for b in range(n) if b % folds in kept]

    def reference(b: int, of: list[int]) -> np.ndarray:
        return sum(parts[c] for c in range(n) if c != b and c % folds in of)

    def bound(f: int, at: float) -> float:
        """The rule's bound for fold f at beta `at`: each other mini-batch's derivative
        criterion cos(g_R, T) - cos(g, T) cos(g, g_R), g = g_U + at g_R, from the vectors."""
        values = []
        for c in (c for c in batches if c % folds != f):
            step, target = gdpo[c] + at * slope[c], reference(c, [g for g in kept if g != f])
            values.append(_cos(slope[c], target) - _cos(step, target) * _cos(step, slope[c]))
        spread = np.std(values, ddof=1) / math.sqrt(len(values))
        return np.mean(values) - t_quantile_95(len(values) - 1) * spread

    beta = {}
    for f in kept:  # up by 0.1 from 0 while the bound is above 0, at most 1
        beta[f] = 0.0
        while beta[f] < 1.0 and bound(f, beta[f]) > 0:
            beta[f] = round(beta[f] + 0.1, 12)

    def gain(g: np.ndarray, r: np.ndarray) -> float:
        return float(g @ r / max(1.0, np.linalg.norm(g)))

    auto = {b: gdpo[b] + beta[b % folds] * slope[b] for b in batches}
    fixed = {b: 0.5 * gdpo[b] + 0.5 * mrtpo[b] for b in batches}
    whole = {b: reference(b, kept) for b in batches}
    alone = {b: reference(b, [b % folds]) for b in batches}
    out_stats = {"betas": tuple(beta[f] for f in kept)}
    for name, other in (("gdpo", gdpo), ("mrtpo(0.5)", fixed)):
        out_stats[f"cosine/{name}"] = np.mean(
            [_cos(auto[b], whole[b]) - _cos(other[b], whole[b]) for b in batches]
        )
        out_stats[f"own_fold/{name}"] = np.mean(
            [_cos(auto[b], alone[b]) - _cos(other[b], alone[b]) for b in batches]
        )
        gains = [np.mean([gain(v[b], whole[b]) for b in batches]) for v in (auto, other)]
        out_stats[f"gain/{name}"] = gains[0] / gains[1] - 1
    return out_stats


def test_the_fold_jackknife_intervals_equal_a_hand_computation():
    """Folds 0 and 1 re-allocate against the reference, 2 and 3 along it: the betas differ
    between folds and between the deleted samples, and every interval is the hand's."""

    def mixed(rng: np.random.Generator, batches: int) -> np.ndarray:
        out = along(+1.0, size=1.0, spread=0.5)(rng, batches)
        out[[b for b in range(batches) if b % 4 < 2], 0] *= -1
        return out

    planted = plant(16, mixed, seed=5)
    judged = offline.judge(sample(planted))
    full, deleted = _hand(planted, None), [_hand(planted, f) for f in range(4)]
    assert tuple(c["beta"] for c in judged["choices"]) == full["betas"]
    assert len({full["betas"], *(d["betas"] for d in deleted)}) > 1  # the choices do move
    quantile = stats.t.ppf(0.975, 3)
    for key in (f"{m}/{x}" for m in ("cosine", "own_fold", "gain") for x in ("gdpo", "mrtpo(0.5)")):
        values = np.array([d[key] for d in deleted])
        error = math.sqrt(3 / 4 * np.sum((values - values.mean()) ** 2))
        test = judged["intervals"][key]
        assert test["mean"] == pytest.approx(full[key], rel=1e-9, abs=1e-12)
        assert test["low"] == pytest.approx(full[key] - quantile * error, rel=1e-9, abs=1e-12)
        assert test["high"] == pytest.approx(full[key] + quantile * error, rel=1e-9, abs=1e-12)
        assert test["n"] == 4


def test_a_gain_relative_to_a_gain_not_shown_to_differ_from_0_is_not_printed():
    """gdpo across the reference (its gain 0 but for noise) and mrtpo(1) along it: auto's
    gain over gdpo's is a ratio to about 0, any size; the report says why there is none. Over
    mrtpo(1)'s (well above 0) it is a percentage, 0 exactly (auto is mrtpo(1)'s step)."""
    measured = sample(plant(16, along(+1.0), seed=1, gdpo_along=0.0))
    judged = offline.judge(measured)
    intervals = judged["intervals"]
    assert [c["beta"] for c in judged["choices"]] == [1.0] * 4
    base = intervals["base_gain/gdpo"]
    assert base["low"] < 0 < base["high"]
    assert abs(intervals["gain/gdpo"]["mean"]) > 3  # the ratio the report must not print
    assert not offline.relative_gain_defined(intervals, "gdpo")
    assert offline.relative_gain_defined(intervals, "mrtpo(1)")
    assert intervals["base_gain/mrtpo(1)"]["low"] > 0
    text = "\n".join(offline.state_lines("qwen_instructions", measured))
    assert (
        "| gdpo | " in text
        and "| none: gdpo's mean gain is not shown to differ from 0 (its interval holds 0) |"
        in text
    )
    assert re.search(
        r"\| mrtpo\(1\) \| \+0\.0000 \[\+0\.0000, \+0\.0000\] \(n = 4\) \| "
        r"\+0\.0% \[\+0\.0%, \+0\.0%\] \|",
        text,
    )


def test_a_goal_against_a_gain_not_shown_to_differ_from_0_is_judged_on_the_cosine():
    """The same planted state judged by SmolLM2's goal (auto not below gdpo's): the cosine's
    upper end is above 0, the relative gain would be read on a ratio to about 0, so the goal
    is judged on the cosine alone and the sentence says why."""
    judged = offline.judge(sample(plant(16, along(+1.0), seed=1, gdpo_along=0.0)))
    judged["intervals"]["gain/gdpo"] = {"mean": -50.0, "low": -90.0, "high": -10.0}
    holds, sentence = offline.goal("smollm2_tool_calling", judged)
    assert holds is True
    assert "gain none: gdpo's mean gain is not shown to differ from 0" in sentence
    judged["intervals"]["base_gain/gdpo"] = {"mean": 1.0, "low": 0.5, "high": 1.5}
    holds, sentence = offline.goal("smollm2_tool_calling", judged)
    assert holds is False
    assert "gain -5000.0% [-9000.0%, -1000.0%]" in sentence


# ----------------------------------------------------------------------------- the report


def build_fixture(results: Path) -> None:
    """Update-quality results: SmolLM2 measured again with folds, its re-allocation
    `lengthening` gdpo's step across the reference (beta 0: auto is gdpo, the goal holds),
    with the first plan's fold-less records of the same vectors; Qwen SQL with folds, a little
    along the reference and noisy (the folds' evidence mostly does not clear 0, while a fixed
    0.5 helps: the goal fails); qwen_instructions not measured."""
    smollm2 = plant(16, lengthening, seed=11)
    measured = {
        ("folds", "smollm2_tool_calling"): sample(smollm2),
        ("", "smollm2_tool_calling"): records(smollm2, ("gdpo", "mrtpo"), folds=False),
        ("folds", "qwen_sql"): sample(plant(9, along(+1.0, size=0.3, spread=1.0), seed=13)),
    }
    for (folder, state), chosen in measured.items():
        for record in chosen:
            path = results / folder / state / "main" / "measures"
            uq.write_json(path / f"batch{record['batch']:03d}.json", record)


def test_the_report_regenerates_byte_for_byte_and_judges_the_goals(tmp_path):
    """The report of the planted results is byte for byte the one committed beside the
    fixture's description. After an intended change of the report: `python
    benchmarks/beta_auto_offline.py --results <folder build_fixture wrote> --report --out
    tests/data/beta-auto-offline-report`."""
    build_fixture(tmp_path / "update-quality")
    path = offline.write_report(tmp_path / "update-quality", tmp_path / "out")
    text = path.read_text()
    assert path.read_bytes() == (FIXTURE / offline.REPORT).read_bytes()
    assert "- smollm2_tool_calling: auto not below gdpo's beyond its interval (" in text
    assert "clipped step): holds (auto - gdpo: cosine +0.0000 [+0.0000, +0.0000] (n = 4)" in text
    assert (
        "- qwen_sql: auto at least mrtpo(0.5)'s (cosine and gain of the clipped step): does "
        "not hold (auto - mrtpo(0.5): cosine -" in text
    )
    assert "## qwen_instructions\n\nnot measured yet (needs the second plan's main sample" in text
    # In sample, from the fold-less records: the agreement below 0, the cosine above, beta 0.
    assert re.search(r"\| smollm2_tool_calling \| 16 \| -[0-9.]+ \| .* \| \+[0-9.]+ \| 0 \|", text)
    assert "| qwen_sql | not measured yet | – |" in text


def test_fold_less_records_are_never_judged(tmp_path):
    """The first plan's layout in the folds folder: said, not judged."""
    planted = plant(8, along(+1.0), seed=4)
    for record in records(planted, ("gdpo", "mrtpo"), folds=False):
        path = tmp_path / "folds" / "qwen_sql" / "main" / "measures"
        uq.write_json(path / f"batch{record['batch']:03d}.json", record)
    text = offline.report_text(tmp_path)
    assert "## qwen_sql\n\nMeasured without folds, or without `mrtpo`: not judged" in text
    assert "- qwen_sql: auto at least mrtpo(0.5)'s (cosine and gain of the clipped step): " in text
    assert "not judged, not measured yet." in text


def test_the_committed_report_regenerates_from_the_committed_files(tmp_path):
    committed = ROOT / uq.RESULTS
    copy_ = tmp_path / "update-quality"
    shutil.copytree(committed, copy_, ignore=shutil.ignore_patterns(uq.CHECKPOINTS))
    regenerated = offline.write_report(copy_, tmp_path / "out").read_bytes()
    assert regenerated == (ROOT / offline.OUT / offline.REPORT).read_bytes()
