"""Does the fold jackknife count the shared reference? A simulation with a known answer.

Each mini-batch b of a sample has a part p_b = mu + reference noise of the policy gradient
mu, and its reference is the sum of the other mini-batches' parts, so every mini-batch's
reference holds the same noise but for one part. Two estimators share the mini-batch's own
noise e_b (they see the same responses): gdpo_b = mu + e_b, other_b = mu + delta + e_b + a
little of its own, delta a systematic difference partly off mu. The contrast is the mean
over mini-batches of cos(other_b, ref_b) - cos(gdpo_b, ref_b); the reference's noise projected
on delta moves every mini-batch's difference together, which a paired t over mini-batches
leaves out. The estimand is the contrast's expectation over every draw (computed on many
more replicates than are tested); the coverage is the share of replicates whose 95% interval
holds it: the paired t's and the fold jackknife's (`update_quality_analysis.fold_test`, run
on records shaped as the measure pass writes them).

    .venv/bin/python benchmarks/update_quality_simulation.py   # the coverage figures
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired_stats import paired_t  # noqa: E402
from update_quality_analysis import cosine_differences, fold_test  # noqa: E402


@dataclass(frozen=True)
class Design:
    """The simulated sample: its mini-batches and folds, and the sizes of its parts."""

    batches: int = 16
    folds: int = 4
    dimension: int = 40
    signal: float = 1.0  # |mu|, each part's share of the policy gradient
    reference_noise: float = 3.0  # per coordinate, per part: the reference's noise
    batch_noise: float = 2.0  # per coordinate: the mini-batch's noise, shared by both estimators
    own_noise: float = 0.15  # per coordinate: the other estimator's own noise
    along: float = 0.1  # delta's component along mu (the systematic difference the contrast sees)
    across: float = 1.5  # delta's component off mu (what the reference's noise projects on)


def draw(design: Design, rng: np.random.Generator, replicates: int) -> dict[str, np.ndarray]:
    """Parts [R, n, D] and both estimators' gradients [R, n, D] of `replicates` samples."""
    shape = (replicates, design.batches, design.dimension)
    mu = np.zeros(design.dimension)
    mu[0] = design.signal
    delta = np.zeros(design.dimension)
    delta[0], delta[1] = design.along, design.across
    parts = mu + design.reference_noise * rng.standard_normal(shape)
    shared = design.batch_noise * rng.standard_normal(shape)
    gdpo = mu + shared
    other = mu + delta + shared + design.own_noise * rng.standard_normal(shape)
    return {"parts": parts, "gdpo": gdpo, "other": other}


def _cosines(vectors: np.ndarray, references: np.ndarray) -> np.ndarray:
    dots = np.sum(vectors * references, axis=-1)
    return dots / np.linalg.norm(vectors, axis=-1) / np.linalg.norm(references, axis=-1)


def contrasts(drawn: dict[str, np.ndarray]) -> np.ndarray:
    """Each replicate's contrast (mean over its mini-batches), vectorized: [R]."""
    parts = drawn["parts"]
    references = parts.sum(axis=1, keepdims=True) - parts  # the other mini-batches' parts
    return (_cosines(drawn["other"], references) - _cosines(drawn["gdpo"], references)).mean(1)


def records(drawn: dict[str, np.ndarray], replicate: int, folds: int) -> list[dict[str, Any]]:
    """One replicate's mini-batches as the measure pass stores them (one reward; folds b % F):
    gdpo's and the other estimator's (as "mrtpo" at beta 1) dots with each fold's reference."""
    parts = drawn["parts"][replicate]
    fold_sums = np.stack([parts[f::folds].sum(axis=0) for f in range(folds)])
    out = []
    for batch in range(len(parts)):
        fold = batch % folds
        references = fold_sums.copy()
        references[fold] -= parts[batch]
        gdpo, other = drawn["gdpo"][replicate, batch], drawn["other"][replicate, batch]
        gram = references @ references.T

        out.append(
            {
                "batch": batch,
                "folds": folds,
                "fold": fold,
                "reward_names": ["reward"],
                "ref_gram": [[float(gram.sum())]],
                "ref_fold_gram": [[gram.tolist()]],
                "directions": {
                    "gdpo": _entry(gdpo, gdpo, references),
                    "mrtpo": _entry(other, gdpo, references),
                },
            }
        )
    return out


def _entry(vector: np.ndarray, gdpo: np.ndarray, references: np.ndarray) -> dict[str, Any]:
    fold_dots = (references @ vector).tolist()
    return {
        "ref_dots": [sum(fold_dots)],
        "ref_fold_dots": [fold_dots],
        "norm2": float(vector @ vector),
        "dot_gdpo": float(vector @ gdpo),
    }


def coverage(
    design: Design = Design(), replicates: int = 400, seed: int = 0, truth_replicates: int = 20_000
) -> dict[str, Any]:
    """The estimand, and the 95% coverage and mean width of the paired t over mini-batches and
    of the fold jackknife, over `replicates` seeded samples."""
    rng = np.random.default_rng(seed)
    truth = float(contrasts(draw(design, rng, truth_replicates)).mean())
    drawn = draw(design, rng, replicates)
    covered = {"paired_t": 0, "fold_jackknife": 0}
    widths: dict[str, list[float]] = {"paired_t": [], "fold_jackknife": []}
    for replicate in range(replicates):
        sample = records(drawn, replicate, design.folds)
        tests = {
            "paired_t": paired_t(list(cosine_differences(sample, "mrtpo(1)", "gdpo"))),
            "fold_jackknife": fold_test(sample, "mrtpo(1)", "gdpo"),
        }
        for name, test in tests.items():
            covered[name] += int(test["low"] <= truth <= test["high"])
            widths[name].append(test["high"] - test["low"])
    return {
        "design": asdict(design),
        "replicates": replicates,
        "seed": seed,
        "estimand": truth,
        "coverage": {name: count / replicates for name, count in covered.items()},
        "mean_width": {name: float(np.mean(values)) for name, values in widths.items()},
    }


if __name__ == "__main__":
    print(json.dumps(coverage(), indent=1))
