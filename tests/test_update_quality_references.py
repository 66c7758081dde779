"""The update-quality benchmark's decisions before the second plan's first measurement
(issue #48): the references kept per fold for the summed reward only (`--reward_references`)
on the tiny model against the first plan's layout, their memory estimate and the refusal, the
weight statistics against hand-built answers and an independent computation on the tiny model,
the second plan's variants on the re-measured states, and a pilot sampled alone at a cap."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_update_quality_bench import _records, _toy_state, _trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import update_quality as uq  # noqa: E402
import update_quality_plan2 as plan2  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MODES = ("per_fold", "whole", "none")


def test_each_reward_references_setting_measures_the_summed_reward_alike(tmp_path):
    """Three mini-batches in three folds through both passes with each `--reward_references`:
    the parts each keeps; the summed reward's cosines and fold-jackknife tests the same; the
    per-reward cosines of `whole` those of `per_fold` (its references are their fold sums),
    `none` none."""
    trainer = _trainer(tmp_path)
    records = _records(trainer, 3)
    names = records[0]["reward_names"]
    measured = {}
    for mode in MODES:
        parts = [uq.reference_pass(trainer, r, fold=b, mode=mode) for b, r in enumerate(records)]
        expected = {
            "per_fold": [uq.fold_key(f"ref/{n}", 1) for n in names],
            "whole": [uq.fold_key(uq.SUMMED, 1), *(uq.fold_key(f"ref/{n}", 0) for n in names)],
            "none": [uq.fold_key(uq.SUMMED, 1)],
        }[mode]
        assert list(parts[1]) == expected
        totals: dict = {}
        for part in parts:
            for key, vector in part.items():
                totals[key] = totals.get(key, 0) + vector
        measured[mode] = [
            uq.measure_batch(trainer, r, b, totals, folds=3, mode=mode)
            for b, r in enumerate(records)
        ]
    assert measured["none"][0]["reward_references"] == "none"
    assert "reward_gram" in measured["whole"][0] and "reward_gram" not in measured["none"][0]
    # the summed reward's reference, kept apart, is the sum of the rewards' (to rounding)
    for b in range(3):
        summed = measured["none"][b]["ref_gram"][0][0]
        assert summed == pytest.approx(np.sum(measured["per_fold"][b]["ref_gram"]), rel=1e-5)
    values = {m: uq.per_estimator(r, 3) for m, r in measured.items()}
    for estimator in uq.ESTIMATORS:
        for mode in ("whole", "none"):
            # float32 references summed in another order: a cosine near 0 (seen 0.000218, on
            # an Intel CPU 1.8e-8 apart) needs an absolute tolerance
            np.testing.assert_allclose(
                values[mode][estimator]["cosine"],
                values["per_fold"][estimator]["cosine"],
                rtol=1e-5,
                atol=1e-7,
            )
        np.testing.assert_allclose(
            values["whole"][estimator]["reward_cosines"],
            values["per_fold"][estimator]["reward_cosines"],
            rtol=1e-5,
            atol=1e-7,
        )
        assert np.isnan(values["none"][estimator]["reward_cosines"]).all()
    for contrast in uq.PRIMARY_CONTRASTS:
        tests = {mode: uq.fold_test(measured[mode], *contrast) for mode in MODES}
        for mode in ("whole", "none"):
            for key in ("mean", "low", "high"):
                assert tests[mode][key] == pytest.approx(tests["per_fold"][key], abs=1e-6)
    # the weight statistics are the same whatever the references
    assert measured["none"][0]["weights"] == measured["per_fold"][0]["weights"]


def test_the_memory_estimate_by_hand_and_the_refusal_names_the_setting_that_fits():
    vector = 250_000_000  # parameters: a float32 vector of 1 GB
    planned = uq.estimate(vector, 6, "per_fold", 4, 16, store_dtype="bfloat16", limit_gb=100)
    assert (planned.vectors, planned.reference_gb, planned.measure_gb) == (24, 24.0, 12.5)
    assert planned.disk_gb == 48.0  # the part and its temporary copy
    assert planned.margin_gb == 7.0  # weights, gradient, flat copy: 3 GB; activations 4 GB
    none = uq.estimate(vector, 6, "none", 4, 16, store_dtype="bfloat16", limit_gb=100)
    assert (none.vectors, none.reference_gb, none.measure_gb) == (4, 4.0, 2.5)
    # two lanes: each sums its own folds (0, 2 and 1, 3) and every whole reference; the
    # measure pass holds every reference per lane, or all in float32 while they are summed
    whole = uq.estimate(vector, 6, "whole", 4, 16, lanes=2, limit_gb=100)
    assert (whole.vectors, whole.reference_gb, whole.measure_gb) == (10, 16.0, 22.0)
    assert whole.disk_gb == 2 * (16 + 10)
    chunked = uq.estimate(vector, 6, "none", 4, 16, directions=8, chunked=True)
    assert chunked.margin_gb == 3 + 1 + 8 + 4  # one gradient sum per reference and direction
    assert chunked.limit_gb == pytest.approx(uq.machine_gb() - chunked.margin_gb)
    settings = dict(parameters=vector, rewards=6, folds=4, batches=16, store_dtype="bfloat16")
    assert uq.check_memory("here", mode="none", limit_gb=20, **settings).fits
    with pytest.raises(SystemExit) as refused:
        uq.check_memory("qwen_instructions main", mode="per_fold", limit_gb=20, **settings)
    message = str(refused.value)
    assert message.startswith("qwen_instructions main: the references do not fit: ")
    assert (
        "--reward_references per_fold: 24 reference vectors of 250,000,000 parameters, " in message
    )
    assert "24.0 GB in the reference pass and 12.5 GB in the measure pass" in message
    assert (
        "(limit 20.0 GB: does not fit); 48.0 GB of checkpoints. The limit: --memory_limit_gb"
        in message
    )
    assert "20. Pass --reward_references whole (--reward_references whole: 10 " in message
    with pytest.raises(SystemExit, match="Pass --reward_references none .*4.0 GB in the ref"):
        uq.check_memory("here", mode="per_fold", limit_gb=5, **settings)
    with pytest.raises(SystemExit, match="No --reward_references fits: fewer --lanes"):
        uq.check_memory("here", mode="per_fold", limit_gb=1, **settings)
    with pytest.raises(SystemExit, match=r"this machine's \d+\.\d GB less 1204.0 GB per lane"):
        uq.check_memory("here", mode="per_fold", **{**settings, "parameters": 10**11})


def test_a_run_that_does_not_fit_is_refused_before_any_pass(tmp_path, monkeypatch):
    from mrtpo.testing import save_tiny

    _toy_state(monkeypatch)
    model = save_tiny(tmp_path / "tiny", seed=3)
    lane = uq.Lane(tmp_path / "r", "toy", "pilot", 2, model_path=str(model), memory_limit_gb=1e-9)
    with pytest.raises(SystemExit, match="toy pilot: the references do not fit: .*limit_gb"):
        uq.run_lane(lane, poll_seconds=0.01)
    assert not (lane.folder / "samples").exists()  # nothing sampled, no pass run


def test_a_pilot_is_sampled_alone_at_a_cap_into_its_own_folder(tmp_path, monkeypatch):
    from mrtpo.testing import save_tiny

    _toy_state(monkeypatch)
    model = save_tiny(tmp_path / "tiny", seed=3)
    fields = dict(batches=2, model_path=str(model), sample_only=True)
    lane = uq.Lane(tmp_path / "r", "toy", "pilot", cap=6, **fields)
    uq.run_lane(lane, poll_seconds=0.01)
    assert lane.folder == tmp_path / "r" / "toy" / "pilot-cap6"
    samples = uq.load_samples(tmp_path / "r", "toy", "pilot", 6)
    assert sorted(samples) == [0, 1] and not uq.reference_path(lane, 0).exists()  # no pass
    for record in samples.values():
        assert record["max_completion_length"] == 6
        assert max(len(ids) for ids in record["completion_ids"]) <= 6
    run = json.loads((lane.folder / uq.RUN_FILE).read_text())
    assert run["max_completion_length"] == 6
    run["max_completion_length"] = 8  # as if sampled at another cap: refused
    uq.write_json(lane.folder / uq.RUN_FILE, run)
    with pytest.raises(SystemExit, match="sampled at 8 new tokens, this run at 6"):
        uq.run_lane(lane, poll_seconds=0.01)


def test_the_re_measured_first_plan_states_get_the_second_plans_variants():
    folds = uq.RESULTS / plan2.FOLDS_RESULTS
    assert uq.variants_of("qwen_sql", folds) == plan2.TOKEN_VARIANTS_2
    assert uq.variants_of("smollm2_tool_calling", folds) == plan2.TOKEN_VARIANTS_2
    assert uq.variants_of("qwen_sql", uq.RESULTS) == uq.TOKEN_VARIANTS  # the committed ones
    assert uq.variants_of("qwen_instructions", uq.RESULTS) == plan2.TOKEN_VARIANTS_2


# ----------------------------------------------------------------------------- weights


def test_the_top_fifth_and_the_pair_statistics_by_hand():
    values = torch.tensor([[3.0, 1.0, 2.0, 0.0, 5.0, 0.0], [1.0, 9.0, 1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    membership = uq.top_membership(values, mask)
    # row 0: 5 tokens, 1 place: the 5; row 1: 6 tokens, 2 places: the 9, and the five 1s
    # share the other place
    expected = [[0, 0, 0, 0, 1, 0], [0.2, 1, 0.2, 0.2, 0.2, 0.2]]
    torch.testing.assert_close(membership, torch.tensor(expected, dtype=torch.float64))
    weights = torch.tensor([[2.0, 2.0, 0.5, 0.5, 0.0], [1.0] * 5, [0.0] * 5])
    entropy = torch.tensor([[0.1, 0.9, 0.3, 0.2, 7.0], [5.0, 4.0, 3.0, 2.0, 1.0], [1.0] * 5])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    share, overlap = uq.pair_statistics(weights, entropy, mask)
    # row 0: (5)^2 / (4 * 8.5); its top weight shared by tokens 0 and 1, the top entropy
    # (within the mask) token 1: half of it. Row 1: uniform: share 1, overlap 1/5. Row 2: no
    # weight: undefined.
    assert share[0] == pytest.approx(25 / 34) and overlap[0] == pytest.approx(0.5)
    assert share[1] == pytest.approx(1.0) and overlap[1] == pytest.approx(0.2)
    assert math.isnan(share[2]) and math.isnan(overlap[2])


def _top_fifth(values: np.ndarray) -> np.ndarray:
    """The top fifth's membership by sorting (ties at the boundary sharing its places)."""
    places = -(-len(values) // 5)
    boundary = np.sort(values)[::-1][places - 1]
    above, tied = values > boundary, values == boundary
    return above + tied * (places - above.sum()) / tied.sum()


def test_the_weight_statistics_equal_an_independent_computation(tmp_path):
    """On the tiny model: the policy's next-token entropies by a plain forward (log-softmax of
    each row alone), the replayed pairs from the rewards, and the definitions applied here in
    numpy to the trainer's weights; the entropy control's own weights from those entropies."""
    from mrtpo import advantages

    trainer = _trainer(tmp_path)
    (record,) = _records(trainer, 1)
    inputs, scored = uq.batch_inputs(trainer, record)
    tokens: dict = {}
    uq.estimator_advantages(trainer, inputs, scored, 0, plan2.TOKEN_VARIANTS_2, tokens)
    width = inputs["completion_ids"].shape[1]
    stored = uq.batch_weight_statistics(tokens, scored.trained_mask(width))
    assert set(stored) == set(plan2.TOKEN_VARIANTS_2) - {"shuffled"}

    model = trainer.model
    model.eval()
    entropies = []
    with torch.no_grad():
        for prompt, completion in zip(record["prompt_ids"], record["completion_ids"], strict=True):
            ids = torch.tensor([prompt + completion])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()
            logps = torch.log_softmax(logits / trainer.args.temperature, dim=-1)
            entropies.append((-(logps.exp() * logps).sum(-1)).numpy())
    model.train()
    rewards = torch.tensor(record["rewards"], dtype=torch.float32)
    replayed = (torch.nan_to_num(advantages.per_reward(rewards, 4, eps=1e-4)) != 0).numpy()
    assert replayed.any() and not replayed.all()
    for variant, stats in stored.items():
        weights = tokens[variant].relevance.double().numpy()
        for k in range(len(record["reward_names"])):
            rows = np.flatnonzero(replayed[:, k])
            assert stats["pairs"][k] == len(rows)
            shares, overlaps = [], []
            for i in rows:
                length = len(record["completion_ids"][i])  # the end token included
                w = weights[i, k, :length]
                if variant == "entropy":  # the control's weights: the entropies, normalized
                    np.testing.assert_allclose(w, entropies[i] / entropies[i].mean(), rtol=1e-4)
                shares.append(w.sum() ** 2 / (length * (w * w).sum()))
                both = _top_fifth(w) * _top_fifth(entropies[i])
                overlaps.append(both.sum() / -(-length // 5))
            if not len(rows):
                assert stats["effective_share"][k] is None
                continue
            assert stats["effective_share"][k] == pytest.approx(np.mean(shares), rel=1e-9)
            assert stats["entropy_overlap"][k] == pytest.approx(np.mean(overlaps), abs=1e-9)
            if variant == "entropy":
                assert stats["entropy_overlap"][k] == pytest.approx(1.0)
