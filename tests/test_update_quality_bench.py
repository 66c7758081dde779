"""benchmarks/update_quality.py on the tiny model: the reference against a hand computation, an
estimator's gradient against a real trainer step's, the streamed cosines against vectors held
whole, the beta blend against a direct computation, the plan refused when changed."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from trainer_toys import CPU_RUN, ContainsLetter, EvenLength, toy_dataset
from transformers import TrainerCallback

from mrtpo.testing import tiny_model, tiny_model_and_tokenizer, tiny_tokenizer
from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import update_quality as uq  # noqa: E402
import update_quality_passes as passes  # noqa: E402  (its private helpers)
import update_quality_resume as resume  # noqa: E402  (its engine)
import update_quality_simulation as simulation  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STATE = uq.State(task="toy", model="tiny", max_completion_length=10, learning_rate=1e-3)
TASK = SimpleNamespace(verifiers=lambda: [ContainsLetter(), EvenLength()])


def _trainer(tmp_path: Path, seed: int = 0):
    model, tokenizer = tiny_model_and_tokenizer(seed=seed)
    return uq.build_trainer(model, tokenizer, TASK, toy_dataset(), STATE, tmp_path / "trainer")


def _records(trainer, batches: int) -> list[dict]:
    """Sampled batches whose rewards vary (the toy rewards vary on most seeds)."""
    dataset = toy_dataset()
    records, seed = [], 0
    while len(records) < batches:
        rows = [dataset[(4 * len(records) + i) % len(dataset)] for i in range(4)]
        record = uq.sample_batch(trainer, rows, seed)
        seed += 1
        if passes._varying_share(torch.tensor(record["rewards"])) > 0.2:
            records.append(json.loads(json.dumps(record)))  # as stored
    return records


def _sequence_logps(model, record) -> list[torch.Tensor]:
    """Each row's log-probability of its response, by a plain per-row forward (no packing)."""
    out = []
    for prompt, completion in zip(record["prompt_ids"], record["completion_ids"], strict=True):
        ids = torch.tensor([prompt + completion])
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        logps = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion).unsqueeze(1))
        out.append(logps.sum())
    return out


def _flat(grads) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads])


def test_leave_one_out_by_hand():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    expected = torch.tensor(
        [[1 - 1 / 3, -2 / 3], [-2 / 3, -2 / 3], [1 - 1 / 3, 1 - 1 / 3], [-2 / 3, 1 - 1 / 3]]
    )
    torch.testing.assert_close(uq.leave_one_out(rewards), expected)


def test_reference_equals_a_hand_computed_policy_gradient(tmp_path):
    trainer = _trainer(tmp_path)
    (record,) = _records(trainer, 1)
    parts = uq.reference_pass(trainer, record)

    model = trainer.model
    params = [p for p in model.parameters() if p.requires_grad]
    logps = _sequence_logps(model, record)
    rewards = torch.tensor(record["rewards"])
    for k, name in enumerate(record["reward_names"]):
        group = rewards[:, k].view(-1, 4)
        baseline = (group.sum(1, keepdim=True) - group) / 3  # the other three responses' mean
        a = (group - baseline).flatten()
        objective = sum(a[i] * logps[i] for i in range(len(logps)))
        expected = _flat(torch.autograd.grad(objective, params, retain_graph=True))
        assert expected.abs().max() > 1e-4  # the rewards vary: a real direction
        torch.testing.assert_close(
            parts[uq.fold_key(f"ref/{name}", 0)], expected, rtol=1e-4, atol=1e-6
        )


class _Capture(TrainerCallback):
    def __init__(self):
        self.grads = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads = _flat([p.grad.detach().clone() for p in model.parameters() if p.requires_grad])


class _KeepBatch(MRTPOTrainer):
    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.kept = uq.batch_record(output, self._scored, self.reward_func_names)
        return output


def _ends_early(seed: int = 0):
    """The tiny model with its own output layer and a bias towards the end token: most of its
    responses end before the cap of 10 tokens, at different lengths, where each loss type's
    normalizer (tokens of the batch, of each response, or the cap) gives another gradient."""
    tokenizer = tiny_tokenizer()
    model = tiny_model(len(tokenizer), seed=seed, tied=False)
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(len(tokenizer)))
    with torch.no_grad():
        model.lm_head.bias[tokenizer.eos_token_id] = 4.0
    return model, tokenizer


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])  # TRL's default (the study's), and not
@pytest.mark.parametrize("estimator", [*uq.RESPONSE_LEVEL, *uq.TOKEN_VARIANTS])
def test_an_estimators_gradient_equals_a_trainer_steps(tmp_path, estimator, loss_type):
    """One real `MRTPOTrainer` step (no clip) from the same weights, then the benchmark on the
    batch that step trained on: the same gradient, with the sign of an ascent direction."""
    model, tokenizer = _ends_early()
    capture = _Capture()
    if estimator in uq.RESPONSE_LEVEL:
        switches = {"advantage_estimator": estimator}
    else:
        switches = {"advantage_estimator": "mrtpo", **uq.TOKEN_VARIANTS[estimator]}
    args = MRTPOConfig(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=16,
        num_generations=4,
        max_completion_length=10,
        max_steps=1,
        learning_rate=1e-3,
        max_grad_norm=0.0,
        loss_type=loss_type,
        mrtpo_beta=1.0,
        mrtpo_warmup_steps=0,
        **switches,
        **CPU_RUN,
    )
    step = _KeepBatch(
        model=model,
        reward_funcs=TASK.verifiers(),
        args=args,
        train_dataset=toy_dataset(),
        processing_class=tokenizer,
        callbacks=[capture],
    )
    step.train()
    record = json.loads(json.dumps(step.kept))
    assert passes._varying_share(torch.tensor(record["rewards"])) > 0
    lengths = [len(ids) for ids in record["completion_ids"]]
    assert max(lengths) == 10 and min(lengths) < 5 and len(set(lengths)) >= 4, lengths

    model, tokenizer = _ends_early()  # the same seeded weights, untrained
    trainer = uq.build_trainer(
        model, tokenizer, TASK, toy_dataset(), STATE, tmp_path / "trainer", loss_type=loss_type
    )
    inputs, scored = uq.batch_inputs(trainer, record)
    measured = uq.estimator_advantages(trainer, inputs, scored, batch=0)
    coefficients = {estimator: measured[estimator]}
    vectors = {}
    uq.batch_gradients(trainer, inputs, coefficients, vectors.__setitem__)
    assert capture.grads.abs().max() > 1e-5
    torch.testing.assert_close(vectors[estimator], -capture.grads, rtol=1e-4, atol=1e-7)
    # The loss type matters on these lengths: the other one's gradient is another.
    other = {}
    trainer.loss_type = {"dapo": "grpo", "grpo": "dapo"}[loss_type]
    uq.batch_gradients(trainer, inputs, coefficients, other.__setitem__)
    trainer.loss_type = loss_type
    assert (other[estimator] - vectors[estimator]).norm() > 0.05 * vectors[estimator].norm()
    # The same gradient a group per forward, and with one forward per direction; chunks only
    # where their losses add up.
    for layout in ({"rows_per_forward": 4}, {"rows_per_forward": 8, "recompute": True}):
        if loss_type not in uq.LOSS_SUMS_OVER_TOKENS:
            with pytest.raises(ValueError, match="loss_type 'grpo': rows_per_forward cuts"):
                uq.batch_gradients(trainer, inputs, coefficients, print, **layout)
            continue
        chunked = {}
        uq.batch_gradients(trainer, inputs, coefficients, chunked.__setitem__, **layout)
        torch.testing.assert_close(chunked[estimator], vectors[estimator], rtol=1e-4, atol=1e-7)


def test_streamed_cosines_and_beta_blend_equal_whole_vectors(tmp_path):
    """Three mini-batches through both passes; then every needed gradient held whole: the
    cosine with the leave-batch-out reference, the norm, the gain and the distance from gdpo
    of gdpo, mrtpo(1) and mrtpo(0.5) (computed directly at beta 0.5, not blended)."""
    trainer = _trainer(tmp_path)
    records = _records(trainer, 3)
    parts = [uq.reference_pass(trainer, r) for r in records]
    names = list(parts[0])
    totals = {n: sum(p[n] for p in parts) for n in names}
    measures = [uq.measure_batch(trainer, r, b, totals) for b, r in enumerate(records)]

    for b, record in enumerate(records):
        inputs, scored = uq.batch_inputs(trainer, record)
        advantages = uq.estimator_advantages(trainer, inputs, scored, batch=b)
        from mrtpo.step_data import StepAdvantages

        step = StepAdvantages(torch.ones(2), advantages["gdpo"], per_reward=None, token=None)
        from mrtpo import advantages as math_

        step.per_reward = torch.nan_to_num(math_.per_reward(scored.rewards, 4, eps=1e-4))
        output = {
            k: inputs[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
        }
        trainer.state.global_step = b
        with uq.configured(trainer, mrtpo_beta=0.5, mrtpo_warmup_steps=0):
            half = trainer._token_advantages(scored, step, 4, output).advantages
        vectors = {}
        uq.batch_gradients(
            trainer,
            inputs,
            {"gdpo": advantages["gdpo"], "mrtpo(1)": advantages["mrtpo"], "mrtpo(0.5)": half},
            vectors.__setitem__,
        )
        reference = sum(totals[n] - parts[b][n] for n in names).double()
        for estimator in ("gdpo", "mrtpo(1)", "mrtpo(0.5)"):
            g = vectors[estimator].double()
            got = uq.batch_measures(measures[b], estimator, len(records))
            cosine = float(g @ reference / (g.norm() * reference.norm()))
            # The references are float32 sums (total - part): seen 4.5e-6 of a dot product off.
            assert got["cosine"] == pytest.approx(cosine, rel=1e-6, abs=1e-7)
            assert got["norm"] == pytest.approx(float(g.norm()), rel=1e-6)
            gain = float(g @ reference) / (2 * 4 * 4) / max(1.0, float(g.norm()))
            assert got["gain"] == pytest.approx(gain, rel=1e-5, abs=1e-12)  # as the cosine
            distance = float((g - vectors["gdpo"].double()).norm())
            assert got["diff_norm"] == pytest.approx(distance, rel=1e-5, abs=1e-9)
            for k, name in enumerate(names):
                own = (totals[name] - parts[b][name]).double()
                expected = float(g @ own / (g.norm() * own.norm()))
                # float32 references, as the cosine above (seen 4.4e-8 off on an Intel CPU)
                assert got["reward_cosines"][k] == pytest.approx(expected, rel=1e-6, abs=1e-7)
        # the reallocation is real: mrtpo's step is not gdpo's
        assert uq.batch_measures(measures[b], "mrtpo(1)", 3)["diff_norm"] > 1e-6
        # References held in bfloat16 (the 0.5B model's lane): the same cosines to 1e-3.
        lean = uq.measure_batch(trainer, record, b, totals, store_dtype="bfloat16")
        for estimator in uq.ESTIMATORS:
            full = uq.batch_measures(measures[b], estimator, len(records))
            half = uq.batch_measures(lean, estimator, len(records))
            assert half["cosine"] == pytest.approx(full["cosine"], abs=1e-3)
            assert half["norm"] == pytest.approx(full["norm"], rel=1e-4)  # via bf16 gdpo


def test_fold_split_references_add_up_and_restrict_to_a_fold(tmp_path):
    """Three mini-batches, one per fold: each direction's dot with the reference restricted to
    fold f is its dot with mini-batch f's part (0 for its own fold), and the folds add up to
    the measurement without folds."""
    trainer = _trainer(tmp_path)
    records = _records(trainer, 3)
    parts = [uq.reference_pass(trainer, r, fold=b) for b, r in enumerate(records)]
    assert list(parts[1]) == [uq.fold_key(f"ref/{n}", 1) for n in records[1]["reward_names"]]
    totals = {name: vector for part in parts for name, vector in part.items()}
    whole = {
        uq.fold_key(f"ref/{n}", 0): sum(p[uq.fold_key(f"ref/{n}", b)] for b, p in enumerate(parts))
        for n in records[0]["reward_names"]
    }
    for b, record in enumerate(records):
        split = uq.measure_batch(trainer, record, b, totals, folds=3)
        plain = uq.measure_batch(trainer, record, b, whole)
        assert (split["folds"], split["fold"]) == (3, b)
        for estimator in uq.ESTIMATORS:
            got = uq.batch_measures(split, estimator, 3)["cosine"]
            assert got == pytest.approx(uq.batch_measures(plain, estimator, 3)["cosine"], rel=1e-5)
        inputs, scored = uq.batch_inputs(trainer, record)
        gdpo = {}
        advantages = uq.estimator_advantages(trainer, inputs, scored, batch=b)
        uq.batch_gradients(trainer, inputs, {"gdpo": advantages["gdpo"]}, gdpo.__setitem__)
        g = gdpo["gdpo"].double()
        for fold in range(3):
            one = uq.restricted(split, [fold])["directions"]["gdpo"]["ref_dots"]
            for k, name in enumerate(record["reward_names"]):
                part = parts[fold][uq.fold_key(f"ref/{name}", fold)].double()
                expected = 0.0 if fold == b else float(g @ part)
                assert one[k] == pytest.approx(expected, rel=1e-5, abs=1e-9)
        others = uq.restricted(split, [f for f in range(3) if f != b])
        np.testing.assert_allclose(others["ref_gram"], split["ref_gram"], rtol=1e-5)


def test_the_fold_jackknife_covers_a_shared_reference_the_paired_t_misses():
    """The simulation (benchmarks/update_quality_simulation.py): a systematic difference seen
    through a reference noise common to every mini-batch. The paired t over mini-batches
    covers the estimand far less often than 95%; the fold jackknife close to 95%, with 4 folds
    of 16 mini-batches and with one fold per mini-batch (8)."""
    for design in (simulation.Design(), simulation.Design(batches=8, folds=8)):
        figures = simulation.coverage(design, replicates=300, seed=1)
        assert figures["coverage"]["paired_t"] < 0.6
        assert 0.89 <= figures["coverage"]["fold_jackknife"] <= 0.99
        assert figures["mean_width"]["fold_jackknife"] > 3 * figures["mean_width"]["paired_t"]


def test_the_fold_jackknife_by_hand():
    from paired_stats import fold_jackknife

    deleted = [0.1, 0.3, 0.2, 0.4]
    variance = 3 / 4 * sum((d - 0.25) ** 2 for d in deleted)
    test = fold_jackknife(0.2, deleted)
    assert test["high"] - 0.2 == pytest.approx(3.182446 * math.sqrt(variance), rel=1e-6)
    assert test["n"] == 4
    with pytest.raises(ValueError, match="deleted must hold at least 2"):
        fold_jackknife(0.2, [0.1])


def test_power_grows_with_the_sample_and_sizes_the_main_sample():
    assert uq.paired_power(0.01, 0.02, 40, 0.05 / 6) > uq.paired_power(0.01, 0.02, 10, 0.05 / 6)
    # A known value: effect = SD, n = 10, alpha 0.05 two-sided (about 0.80; z gives 0.89).
    assert uq.paired_power(1.0, 1.0, 10, 0.05) == pytest.approx(0.803, abs=0.005)


def test_changed_plan_is_refused(tmp_path):
    uq.record_plan(tmp_path)
    stored = json.loads((tmp_path / uq.PLAN_FILE).read_text())
    assert stored["analysis"] == uq.ANALYSIS
    uq.record_plan(tmp_path)  # the same plan: accepted
    changed = {**uq.plan(), "effect_share": 0.1}
    with pytest.raises(SystemExit, match="effect_share"):
        uq.record_plan(tmp_path, changed)


def _synthetic(batch: int, gdpo: float, mrtpo: float, noise: float, cross: float) -> dict:
    """A measures record whose cosines are known: unit references orthogonal to each other,
    gdpo's gradient at cosine `gdpo` with the summed reference, every token-level variant at
    beta 1 at cosine `mrtpo` (+ noise), gradients of norm 2, `cross` their dot with gdpo's."""
    rng = torch.Generator().manual_seed(batch)
    jitter = float(torch.randn(1, generator=rng)) * noise
    reference = math.sqrt(2.0)  # |ref_a + ref_b| with unit orthogonal references

    def entry(cosine: float, cross: float | None) -> dict:
        dot = cosine * 2.0 * reference  # |g| = 2
        item = {"ref_dots": [dot / 2, dot / 2], "norm2": 4.0}
        if cross is not None:
            item["dot_gdpo"] = cross
        return item

    directions = {"grpo": entry(gdpo, 4.0), "gdpo": entry(gdpo, 4.0)}
    for name in uq.TOKEN_VARIANTS:
        value = mrtpo + jitter if name == "mrtpo" else gdpo
        directions[name] = entry(value, cross)
    return {
        "batch": batch,
        "reward_names": ["a", "b"],
        "ref_gram": [[1.0, 0.0], [0.0, 1.0]],
        "directions": directions,
    }


REPORT_FIXTURE = Path(__file__).resolve().parent / "data" / "update-quality-report"


def test_report_regenerates_byte_for_byte_and_reads_the_plan(tmp_path):
    """The report of a committed folder of results files (`_synthetic` measures of 12
    mini-batches per state, samples of 6, power.json, plan.json, a run.json) is byte for byte
    the README.md committed beside them, written when the report last changed on purpose: a
    changed number, table or reading fails here. After an intended change of the report:
    `python benchmarks/update_quality.py --results tests/data/update-quality-report --report`
    (and delete the cosines.png it writes)."""
    shutil.copytree(REPORT_FIXTURE, tmp_path, dirs_exist_ok=True)
    expected = (REPORT_FIXTURE / "README.md").read_bytes()
    assert uq.write_report(tmp_path).read_bytes() == expected
    text = expected.decode()
    assert (tmp_path / "cosines.png").read_bytes()[:4] == b"\x89PNG"
    measures = uq.load_measures(tmp_path)
    values = uq.per_estimator(measures["smollm2_tool_calling"]["main"])
    # The blend: mrtpo(0.5) = (gdpo + mrtpo(1)) / 2 with |g| = 2 everywhere and g1 . g0 = 3:
    # |g(0.5)|^2 = (4 + 2*3 + 4) / 4 = 3.5, cosine = mean dot / (|g| |ref|).
    cosine = (0.5 * 0.05 * 2 + 0.5 * values["mrtpo(1)"]["cosine"][0] * 2) / math.sqrt(3.5)
    assert values["mrtpo(0.5)"]["cosine"][0] == pytest.approx(cosine, rel=1e-9)
    tests = uq.primary_tests(measures)
    assert len(tests) == 6
    smol = {t["contrast"][1]: t for t in tests if t["state"] == "smollm2_tool_calling"}
    assert smol["gdpo"]["significant"] and smol["gdpo"]["test"]["mean"] > 0
    assert "the verifier's own information makes the step point further uphill" in text
    assert "**qwen_sql**: no effect on the step's direction detected" in text
    # The samples' statistics, counted here from the fixture's files.
    records = [
        json.loads(p.read_text()) for p in sorted(REPORT_FIXTURE.glob("qwen_sql/main/samples/*"))
    ]
    capped = [len(ids) == 128 for r in records for ids in r["completion_ids"]]
    earned = [row[0] > 0 for r in records for row in r["rewards"]]
    at_cap = sum(e for e, c in zip(earned, capped, strict=True) if c)
    finished = sum(e for e, c in zip(earned, capped, strict=True) if not c)
    k, n = sum(capped), len(capped)
    assert f"| qwen_sql | main | {n} | {k} of {n} ({k / n:.1%}) at 128 |" in text
    assert (
        f"| qwen_sql | main | a | {np.mean([r[0] for x in records for r in x['rewards']]):.2f} | "
        f"{at_cap} of {k} ({at_cap / k:.1%}) | {finished} of {n - k} ({finished / (n - k):.1%}) |"
        in text
    )


def test_the_second_plan_is_stored_apart_and_a_change_is_refused(tmp_path):
    import update_quality_plan2 as plan2

    committed = Path(__file__).resolve().parents[1] / uq.RESULTS
    assert json.loads((committed / plan2.PLAN_2_FILE).read_text()) == json.loads(
        json.dumps(plan2.plan_2())
    )
    assert json.loads((committed / uq.PLAN_FILE).read_text()) == json.loads(json.dumps(uq.plan()))
    plan2.store(tmp_path)
    changed = {**plan2.plan_2(), "folds": 8}
    with pytest.raises(SystemExit, match="plan-2.json holds another plan .*folds"):
        uq.record_plan(tmp_path, changed, plan2.PLAN_2_FILE)
    assert "qwen_instructions" not in uq.STATES  # the first plan's states are as stored
    assert passes.variants_of("qwen_instructions") == plan2.TOKEN_VARIANTS_2
    for switches in plan2.TOKEN_VARIANTS_2.values():  # the trainer takes every switch
        MRTPOConfig(output_dir=str(tmp_path), **CPU_RUN, **switches)


def test_placebo_shares_on_the_fixture_count_the_replayed_pairs(tmp_path):
    """The fixture's qwen_sql main samples: reward a's information is one rule for every
    prompt, b's the prompt's own text, so the trainer's placebo equals the own text on every
    replayed pair of a and on none of b; replayed: the reward differs from its group's mean."""
    fixture = Path(__file__).parent / "data" / "update-quality-report"
    rows = uq.placebo_share_rows(fixture, "qwen_sql", "main")
    by_reward = {row[2]: row[3:] for row in rows}
    assert by_reward["a"][1:] == ["100.0%", "0.0%", "100.0%"]
    assert by_reward["b"][1:] == ["0.0%", "0.0%", "0.0%"]
    for k, name in enumerate(("a", "b")):
        replayed = 0
        for record in uq.load_samples(fixture, "qwen_sql", "main").values():
            grouped = np.array(record["rewards"], dtype=float)[:, k].reshape(-1, 4)
            replayed += int((np.abs(grouped - grouped.mean(1, keepdims=True)) > 1e-9).sum())
        assert int(by_reward[name][0]) == replayed > 0
    assert int(by_reward["all rewards"][0]) == int(by_reward["a"][0]) + int(by_reward["b"][0])
    assert uq.placebo_share_rows(fixture, "smollm2_tool_calling", "main") is None  # no verdicts
    # the references' cosine, from the Gram matrix
    record = {"reward_names": ["a", "b"], "ref_gram": [[4.0, 1.0], [1.0, 1.0]]}
    assert uq.reference_correlations([record]) == ["a / b: +0.50 (+0.50 to +0.50)"]


def test_an_interim_sample_scales_the_gain_by_the_planned_size(tmp_path):
    """Each reference averages over the other mini-batches of the whole planned sample, so a
    mini-batch's gain must not change as more of the sample is measured (it did: the report
    scaled by the number measured so far, and a single measured mini-batch divided by 0)."""
    uq.write_json(
        tmp_path / "qwen_sql" / uq.POWER_FILE,
        {"pilot_batches": 8, "gdpo_mean_cosine": 0.05, "difference_mean": 0.0,
         "difference_sd": 0.01, "effect": 0.01, "alpha": 0.05 / 6, "needed_batches": 17,
         "cap": 9, "batches": 9, "power_at_batches": 0.37},
    )  # fmt: skip
    folder = tmp_path / "qwen_sql" / "main" / "measures"
    uq.write_json(folder / "batch000.json", _synthetic(0, 0.05, 0.09, 0.0, 3.0))
    interim = uq.load_measures(tmp_path)["qwen_sql"]["main"]
    assert interim[0]["sample_batches"] == 9
    gain = uq.per_estimator(interim)["gdpo"]["gain"][0]
    # gdpo: ref . g = 0.05 * |g| 2 * |ref| sqrt(2); 8 other mini-batches of 16 responses; |g| 2.
    assert gain == pytest.approx(0.05 * 2 * math.sqrt(2) / (8 * 16) / 2, rel=1e-12)
    text = uq.write_report(tmp_path).read_text()
    assert "main: 1 mini-batches (interim: 1 of 9)" in text
    assert "**qwen_sql**: no reading yet" in text
    for b in range(1, 9):
        uq.write_json(folder / f"batch{b:03d}.json", _synthetic(b, 0.05, 0.09, 0.0, 3.0))
    complete = uq.per_estimator(uq.load_measures(tmp_path)["qwen_sql"]["main"])
    assert complete["gdpo"]["gain"][0] == pytest.approx(gain, rel=1e-12)
    with pytest.raises(ValueError, match="batches must be at least 2"):
        uq.batch_measures(interim[0], "gdpo", 1)


def test_the_committed_report_regenerates_from_the_committed_files(tmp_path):
    """The report in the repository is what `--report` writes from the committed results files
    (the git-ignored checkpoints are not read)."""
    committed = Path(__file__).resolve().parents[1] / uq.RESULTS
    copy = tmp_path / "update-quality"
    shutil.copytree(committed, copy, ignore=shutil.ignore_patterns(uq.CHECKPOINTS))
    assert not list(copy.rglob("*.pt"))
    regenerated = uq.write_report(copy).read_text()
    assert regenerated == (committed / "README.md").read_text()
    assert "## qwen_sql" in regenerated and "## smollm2_tool_calling" in regenerated


def test_lanes_share_one_summed_reference(tmp_path):
    lanes = [uq.Lane(tmp_path, "smollm2_tool_calling", "pilot", 3, i, 2) for i in range(2)]
    settings = uq.reference_settings(lanes[0], "abc", None)
    for b in range(3):
        uq.write_json(uq.sample_path(lanes[0], b), {"batch": b})
    digests = {b: uq.file_digest(uq.sample_path(lanes[0], b)) for b in range(3)}

    def part(batches: list[int], values: list[float], made_with: dict = settings) -> dict:
        samples = {b: digests[b] for b in batches}
        return {"batches": batches, "sums": {"ref/a": torch.tensor(values)},
                "settings": made_with, "samples": samples}  # fmt: skip

    (lanes[0].folder / uq.CHECKPOINTS).mkdir()
    for i, stored in {0: part([0, 2], [1.0, 2.0]), 1: part([1], [0.5, -4.0])}.items():
        torch.save(stored, uq.reference_path(lanes[0], i))
    totals = uq.wait_for_totals(lanes[1], 0.01, settings)
    torch.testing.assert_close(totals["ref/a"], torch.tensor([1.5, -2.0]))
    total_path = lanes[0].folder / uq.CHECKPOINTS / "reference-total.pt"
    written = total_path.stat().st_mtime_ns
    again = uq.wait_for_totals(lanes[0], 0.01, settings)  # the other lane reads the file
    torch.testing.assert_close(again["ref/a"], torch.tensor([1.5, -2.0]))
    assert total_path.stat().st_mtime_ns == written  # current: reused, not summed again
    # The parts redone with a new commit (their files deleted, the total's not): summed again.
    newer = uq.reference_settings(lanes[0], "def", None)
    for i, stored in {0: part([0, 2], [1.0, 2.0], newer), 1: part([1], [0.0, 1.0], newer)}.items():
        torch.save(stored, uq.reference_path(lanes[0], i))
    again = uq.wait_for_totals(lanes[0], 0.01, newer)
    torch.testing.assert_close(again["ref/a"], torch.tensor([1.0, 3.0]))
    with pytest.raises(SystemExit, match="made with commit = 'def', this run has commit = 'abc'"):
        uq.wait_for_totals(lanes[1], 0.01, settings)  # a lane still on the old commit
    # A sample file changed under a finished part: refused, naming the mini-batch.
    uq.write_json(uq.sample_path(lanes[0], 2), {"batch": 2, "regenerated": True})
    with pytest.raises(SystemExit, match="mini-batch 2's sample .* is not the one"):
        uq.wait_for_totals(lanes[0], 0.01, newer)


@pytest.fixture(scope="module")
def resumable(tmp_path_factory):
    """A lane run to the end on the tiny model (2 mini-batches, one lane), to resume from."""
    from mrtpo.testing import save_tiny

    root = tmp_path_factory.mktemp("resume")
    with pytest.MonkeyPatch.context() as patch:
        _toy_state(patch)
        model = save_tiny(root / "tiny", seed=3)
        lane = uq.Lane(root / "results", "toy", "pilot", batches=2, model_path=str(model))
        uq.run_lane(lane, poll_seconds=0.01)
    return lane


def _toy_state(patch) -> None:
    from mrtpo import tasks

    patch.setitem(uq.STATES, "toy", STATE)
    patch.setitem(uq.ALL_STATES, "toy", STATE)  # the lanes look states up in every plan's
    toy = SimpleNamespace(
        verifiers=TASK.verifiers, load=lambda split, path=None: toy_dataset(num_prompts=16)
    )
    patch.setattr(tasks, "get", lambda name: toy)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"bf16": True}, "bf16 = False, this run has bf16 = True: to resume, leave out --bf16"),
        ({"store_dtype": "bfloat16"}, "store_dtype = 'float32', this run has store_dtype = "
         "'bfloat16': to resume, pass --store_dtype float32"),
        ({"rows_per_forward": 4}, "rows_per_forward = None, this run has rows_per_forward = 4: "
         "to resume, leave out --rows_per_forward"),
        ({"recompute": True}, "recompute = False, this run has recompute = True"),
        ({"lanes": 2}, "lanes = 1, this run has lanes = 2: to resume, pass --lanes 1"),
        ({"reward_references": "none"}, "reward_references = 'per_fold', this run has "
         "reward_references = 'none': to resume, pass --reward_references per_fold"),
        ("policy", "policy = '.*tiny', this run has policy = '.*other'"),
        ("commit", "commit = '[0-9a-f]{40}', this run has commit = 'f00'"),
        ("code", "code_sha256 = '[0-9a-f]{64}', this run has code_sha256 = 'edited'"),
        ("sample", "mini-batch 1's sample .*batch001.json is not the one"),
    ],
)  # fmt: skip
def test_a_resume_with_other_settings_is_refused_naming_the_setting(
    resumable, tmp_path, monkeypatch, change, named
):
    _toy_state(monkeypatch)
    shutil.copytree(resumable.results, tmp_path / "results")
    fields = {**vars(resumable), "results": tmp_path / "results"}
    if change == "commit":
        monkeypatch.setattr(
            resume, "engine", lambda: {"commit": "f00", "uncommitted_changes": False}
        )
    elif change == "code":
        monkeypatch.setattr(resume, "code_digest", lambda: "edited")
    elif change == "policy":
        from mrtpo.testing import save_tiny

        fields["model_path"] = str(save_tiny(tmp_path / "other", seed=4))
    elif change == "sample":
        path = uq.sample_path(uq.Lane(**fields), 1)
        path.write_text(path.read_text().replace('"seed": ', '"seed": 1'))
    else:
        fields.update(change)
    lane = uq.Lane(**fields)
    with pytest.raises(SystemExit, match=named) as refused:
        uq.run_lane(lane, poll_seconds=0.01)
    assert f"or delete {lane.folder / uq.CHECKPOINTS} to redo the reference pass" in str(
        refused.value
    )


def test_bf16_autocast_keeps_the_direction(tmp_path):
    """TRL's bf16 mixed precision (`--bf16`): float32 weights, the loss under autocast; the
    gradient keeps its direction on the tiny model (cosine with float32's above 0.99)."""
    trainer = _trainer(tmp_path)
    (record,) = _records(trainer, 1)
    inputs, scored = uq.batch_inputs(trainer, record)
    measured = uq.estimator_advantages(trainer, inputs, scored, batch=0)
    full, mixed = {}, {}
    uq.batch_gradients(trainer, inputs, {"gdpo": measured["gdpo"]}, full.__setitem__)
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    autocast = uq.build_trainer(
        model, tokenizer, TASK, toy_dataset(), STATE, tmp_path / "bf16", bf16=True
    )
    assert next(autocast.model.parameters()).dtype == torch.float32
    uq.batch_gradients(autocast, inputs, {"gdpo": measured["gdpo"]}, mixed.__setitem__)
    a, b = full["gdpo"].double(), mixed["gdpo"].double()
    assert float(a @ b / (a.norm() * b.norm())) > 0.999
    assert 1e-4 < float((a - b).norm() / a.norm()) < 0.05  # not the same computation


def test_precision_comparison_reports_the_cosines_change(tmp_path):
    same = [_synthetic(b, 0.05, 0.08, 0.0, 3.0) for b in range(4)]
    moved = [_synthetic(b, 0.05, 0.09, 0.0, 3.0) for b in range(4)]  # mrtpo(1) +0.01
    compared = uq.precision_comparison(same, moved)
    assert compared["batches"] == [0, 1, 2, 3]
    gdpo = compared["estimators"]["gdpo"]
    assert gdpo["mean_cosine"] == pytest.approx([0.05, 0.05]) and gdpo["max_abs_change"] == 0
    assert compared["estimators"]["mrtpo(1)"]["max_abs_change"] == pytest.approx(0.01)
    assert compared["contrasts"]["mrtpo(1) - gdpo"]["change"] == pytest.approx(0.01)
    # At beta 0.5 the blend carries part of it: a positive change below mrtpo(1)'s.
    half = compared["contrasts"]["mrtpo(0.5) - gdpo"]["change"]
    assert 0 < half < 0.01
    partial = uq.precision_comparison(same, moved[1:2])  # only batch 1 measured both ways
    assert partial["batches"] == [1]
    assert partial["contrasts"]["mrtpo(1) - gdpo"]["change"] == pytest.approx(0.01)
    with pytest.raises(ValueError, match="share no mini-batch"):
        uq.precision_comparison(same[:1], moved[1:])
    # The command stores it beside the other measurement.
    for root, records in {"a": same, "b": moved}.items():
        for record in records:
            uq.write_json(
                tmp_path
                / root
                / "qwen_sql"
                / "pilot"
                / "measures"
                / f"batch{record['batch']:03d}.json",
                record,
            )
    argv = ["--results", str(tmp_path / "a"), "--compare_with", str(tmp_path / "b")]
    assert uq.main([*argv, "--state", "qwen_sql", "--sample", "pilot"]) == 0
    stored = json.loads((tmp_path / "b" / "qwen_sql" / "pilot" / "comparison.json").read_text())
    assert stored["contrasts"]["mrtpo(1) - gdpo"]["change"] == pytest.approx(0.01)


def test_run_lane_end_to_end_leaves_each_batch_out_and_resumes(tmp_path, monkeypatch):
    """The runner as the benchmark runs it (sample, reference pass, measure pass, run.json) on
    the tiny model and the toy task: each mini-batch's reference is the other one's part, and
    a rerun resumes without redoing a finished pass."""
    from mrtpo.testing import save_tiny

    _toy_state(monkeypatch)
    model = save_tiny(tmp_path / "tiny", seed=3)
    lane = uq.Lane(tmp_path / "results", "toy", "pilot", batches=2, model_path=str(model))
    uq.run_lane(lane, poll_seconds=0.01)

    measured = [json.loads(uq.measure_path(lane, b).read_text()) for b in range(2)]
    assert [m["batch"] for m in measured] == [0, 1]
    for m in measured:
        assert set(m["directions"]) == {"grpo", "gdpo", *uq.TOKEN_VARIANTS}
        assert m["reward_references"] == "per_fold"  # the default: each reward's per fold
        assert set(m["weights"]) == set(uq.TOKEN_VARIANTS) - {"shuffled"}
        for entry in m["directions"].values():
            assert all(math.isfinite(x) for x in entry["ref_dots"]) and entry["norm2"] > 0
    # Leave-batch-out: mini-batch 0's references are mini-batch 1's own parts, and back.
    trainer = uq.load_state(lane)[0]
    for own, other in ((0, 1), (1, 0)):
        sample = json.loads(uq.sample_path(lane, other).read_text())
        parts = uq.reference_pass(trainer, sample, fold=other)  # 2 mini-batches: 2 folds
        names = [uq.fold_key(f"ref/{n}", other) for n in measured[own]["reward_names"]]
        assert (measured[own]["folds"], measured[own]["fold"]) == (2, own)
        gram = [[uq.dot(parts[a], parts[b]) for b in names] for a in names]
        assert gram[0][0] > 0  # the toy rewards vary: a real direction
        flat = [x for row in measured[own]["ref_gram"] for x in row]
        assert flat == pytest.approx([x for row in gram for x in row], rel=1e-4, abs=1e-9)

    run = json.loads((lane.folder / uq.RUN_FILE).read_text())["lanes"]["0"]
    assert run["sessions"][0]["reward_references"] == "per_fold"
    assert run["sessions"][0]["memory_estimate_gb"]["reference"] > 0
    spent = dict(run["cpu_seconds"])
    assert set(spent) == {"sample", "reference", "measure"}
    first = uq.measure_path(lane, 1).read_text()
    uq.measure_path(lane, 1).unlink()
    uq.run_lane(lane, poll_seconds=0.01)  # resumes: only mini-batch 1's measure pass again
    again = json.loads((lane.folder / uq.RUN_FILE).read_text())["lanes"]["0"]
    assert len(again["sessions"]) == 2
    assert again["cpu_seconds"]["sample"] == spent["sample"]
    assert again["cpu_seconds"]["reference"] == spent["reference"]
    assert again["cpu_seconds"]["measure"] > spent["measure"]
    redone = json.loads(uq.measure_path(lane, 1).read_text())
    assert redone["directions"]["mrtpo"]["norm2"] == pytest.approx(
        json.loads(first)["directions"]["mrtpo"]["norm2"], rel=1e-6
    )


def test_commit_keeps_each_batch_so_a_new_machine_redoes_only_the_reference(tmp_path, monkeypatch):
    """`--commit` (`Lane.commit`): every sample and measure file and run.json is committed as it
    is written; on a machine that kept nothing but the checkout (no reference parts, the batch
    under way lost), the rerun redoes the reference pass and that batch's measure pass only."""
    import subprocess

    from mrtpo.testing import save_tiny

    def git(*argv: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tmp_path), *argv], capture_output=True, text=True, check=True
        ).stdout

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (tmp_path / ".git" / "info" / "exclude").write_text("checkpoints/\n")  # as the repository's
    _toy_state(monkeypatch)
    model = save_tiny(tmp_path / "tiny", seed=3)
    lane = uq.Lane(
        tmp_path / "results", "toy", "pilot", batches=2, model_path=str(model), commit=True
    )
    uq.run_lane(lane, poll_seconds=0.01)
    tracked = set(git("ls-files").split())
    folder = lane.folder.relative_to(tmp_path)
    expected = {str(folder / "run.json")}
    expected |= {str(uq.sample_path(lane, b).relative_to(tmp_path)) for b in range(2)}
    expected |= {str(uq.measure_path(lane, b).relative_to(tmp_path)) for b in range(2)}
    assert tracked == expected  # the reference parts (checkpoints/) are not committed
    assert git("status", "--porcelain").strip() == "?? tiny/"  # nothing written left out
    messages = git("log", "--format=%s").splitlines()
    assert messages == [
        "#48: update quality, toy pilot measures 001",
        "#48: update quality, toy pilot measures 000",
        "#48: update quality, toy pilot sample 001",
        "#48: update quality, toy pilot sample 000",
    ]
    spent = json.loads((lane.folder / uq.RUN_FILE).read_text())["lanes"]["0"]["cpu_seconds"]
    kept = uq.measure_path(lane, 0).read_text()
    first = json.loads(uq.measure_path(lane, 1).read_text())

    # Another machine: the checkout as committed, less mini-batch 1's measures (under way).
    shutil.rmtree(lane.folder / uq.CHECKPOINTS)
    git("rm", "-q", str(uq.measure_path(lane, 1)))
    git("commit", "-q", "-m", "lost")
    uq.run_lane(lane, poll_seconds=0.01)
    again = json.loads((lane.folder / uq.RUN_FILE).read_text())["lanes"]["0"]
    assert len(again["sessions"]) == 2
    assert again["cpu_seconds"]["sample"] == spent["sample"]  # the samples are not redrawn
    assert again["cpu_seconds"]["reference"] > spent["reference"]  # the reference is redone
    assert uq.measure_path(lane, 0).read_text() == kept  # a committed batch is not measured again
    redone = json.loads(uq.measure_path(lane, 1).read_text())
    for name, entry in first["directions"].items():
        assert redone["directions"][name]["ref_dots"] == pytest.approx(entry["ref_dots"], rel=1e-5)
    assert git("log", "-1", "--format=%s").strip() == "#48: update quality, toy pilot measures 001"
    assert git("status", "--porcelain").strip() == "?? tiny/"
