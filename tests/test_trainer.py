"""MRTPOTrainer on the tiny model: estimators, equality with TRL, beta 0 = GDPO, resume,
several processes, logged metrics and files, credit-map hook."""

from __future__ import annotations

import ast
import inspect
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from trainer_toys import (
    CPU_RUN,
    ContainsLetter,
    EvenLength,
    launch_two_processes,
    toy_dataset,
    toy_verifiers,
)
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import RepeatSampler

import mrtpo.relevance
import mrtpo.trainer
import mrtpo.trainer_metrics
from mrtpo import advantages, tasks
from mrtpo.step_data import ScoredBatch
from mrtpo.testing import tiny_model_and_tokenizer
from mrtpo.trainer import ESTIMATORS, MRTPOConfig, MRTPOTrainer, _top_share_sums
from mrtpo.trainer_credit import CreditMapsMixin
from mrtpo.trainer_shared_prompt import SharedPromptMixin
from mrtpo.verifiers import Verdict, Verifier

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# Small and fast: 8 rows per step (2 prompts x 4 completions), 10 new tokens.
COMMON = dict(
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=10,
    max_steps=2,
    report_to=[],
    use_cpu=True,
    bf16=False,
    save_strategy="no",
    seed=0,
    disable_tqdm=True,
    learning_rate=1e-3,  # large enough that step 2's policy differs from step 1's
)


class Recorder:
    """Keeps what reaches `_compute_loss` (advantages, masks, loss) for every micro-batch."""

    def __init__(self, *args, **kwargs):
        self.seen: list[dict] = []
        super().__init__(*args, **kwargs)

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        self.seen.append(
            {
                "advantages": inputs["advantages"].detach().clone(),
                "completion_ids": inputs["completion_ids"].clone(),
                "completion_mask": inputs["completion_mask"].clone(),
                "loss": loss.detach().clone(),
            }
        )
        return loss


class RecordingMRTPO(Recorder, MRTPOTrainer):
    """Also keeps each generation batch (before TRL shuffles it) and counts replays."""

    def __init__(self, *args, **kwargs):
        self.batches: list[dict] = []
        self.replays = 0
        self.replayed_rows = 0
        super().__init__(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.batches.append(
            {
                "advantages": output["advantages"].clone(),
                "completion_mask": output["completion_mask"].clone(),
                "rewards": self._scored.rewards.clone(),
            }
        )
        return output

    def _replay(self, scored, completion_width, rows, wanted=None):
        self.replays += 1
        self.replayed_rows += len(rows)
        return super()._replay(scored, completion_width, rows, wanted)


class RecordingGRPO(Recorder, GRPOTrainer):
    pass


class GradientSnapshots(TrainerCallback):
    """The accumulated gradients just before each optimizer step."""

    def __init__(self):
        self.grads: list[dict[str, torch.Tensor]] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append(
            {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        )


class CountingLetter(ContainsLetter):
    calls = 0

    def verify_batch(self, prompts, completions, **columns):
        CountingLetter.calls += 1
        return super().verify_batch(prompts, completions, **columns)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def train_mrtpo(
    tmp_path,
    reward_funcs=None,
    callbacks=None,
    dataset=None,
    trainer_class=None,
    **overrides,
) -> RecordingMRTPO:
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    args = MRTPOConfig(output_dir=str(tmp_path / "run"), **{**COMMON, **overrides})
    trainer = (trainer_class or RecordingMRTPO)(
        model=model,
        reward_funcs=reward_funcs or toy_verifiers(),
        args=args,
        train_dataset=dataset if dataset is not None else toy_dataset(),
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    trainer.train()
    return trainer


# ---------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "field, value",
    [
        ("advantage_estimator", "ppo"),
        ("mrtpo_beta", 1.5),
        ("mrtpo_beta", -0.1),
        ("mrtpo_warmup_steps", -1),
        ("replay_mode", "drop_all"),
        ("replay_batch_size", 0),
        ("replay_chunk_size", 0),
        ("credit_map_steps", -2),
        ("reward_weighting", "ema"),
        ("replay_information", "another"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        MRTPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **{field: value})


def test_config_sets_trl_aggregation_from_the_estimator(tmp_path):
    def config(**kwargs):
        return MRTPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **kwargs)

    assert config().multi_objective_aggregation == "normalize_then_sum"
    assert config(advantage_estimator="gdpo").multi_objective_aggregation == "normalize_then_sum"
    assert config(advantage_estimator="grpo").multi_objective_aggregation == "sum_then_normalize"
    assert config().logging_steps == 1
    with pytest.raises(ValueError, match="multi_objective_aggregation"):
        config(advantage_estimator="grpo", multi_objective_aggregation="normalize_then_sum")


def test_saw_refuses_static_weights_and_shifts_need_saw(tmp_path):
    def config(**kwargs):
        return MRTPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **kwargs)

    assert config().reward_weighting == "static"
    assert config(reward_weighting="saw", saw_reward_shifts=[3.0, 0.0]).saw_reward_shifts == [3, 0]
    with pytest.raises(ValueError, match="reward_weighting='saw'.*refuses reward_weights"):
        config(reward_weighting="saw", reward_weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="saw_reward_shifts.*reward_weighting='static'"):
        config(saw_reward_shifts=[1.0, 0.0])


def test_saw_shifts_must_match_the_reward_functions(tmp_path):
    # A model of its own: TRL's constructor runs before the check and changes the model it gets
    # (gradient checkpointing), which would leak into the session's `tiny`.
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    args = MRTPOConfig(
        output_dir=str(tmp_path), **COMMON, reward_weighting="saw", saw_reward_shifts=[1.0]
    )
    with pytest.raises(ValueError, match="saw_reward_shifts has 1 values but there are 3"):
        MRTPOTrainer(
            model=model,
            reward_funcs=toy_verifiers(),
            args=args,
            train_dataset=toy_dataset(),
            processing_class=tokenizer,
        )


def test_trainer_requires_an_mrtpo_config(tmp_path, tiny):
    model, tokenizer = tiny
    plain = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[])
    with pytest.raises(ValueError, match="args must be an MRTPOConfig"):
        MRTPOTrainer(
            model=model, reward_funcs=toy_verifiers(), args=plain, processing_class=tokenizer
        )


def test_trl_parser_exposes_every_mrtpo_field():
    from trl import TrlParser

    (args,) = TrlParser(MRTPOConfig).parse_args_into_dataclasses(
        [
            "--output_dir=x",
            "--use_cpu=true",
            "--bf16=false",
            "--advantage_estimator=gdpo",
            "--mrtpo_beta=0.25",
            "--mrtpo_warmup_steps=3",
            "--replay_mode=add_one",
            "--replay_batch_size=2",
            "--replay_chunk_size=16",
            "--shuffle_token_weights=true",
            "--credit_map_steps=5",
        ]
    )
    assert (args.advantage_estimator, args.mrtpo_beta, args.mrtpo_warmup_steps) == ("gdpo", 0.25, 3)
    assert (args.replay_mode, args.replay_batch_size, args.replay_chunk_size) == ("add_one", 2, 16)
    assert args.shuffle_token_weights is True and args.credit_map_steps == 5


def test_trl_parser_exposes_the_reward_weighting():
    from trl import TrlParser

    (args,) = TrlParser(MRTPOConfig).parse_args_into_dataclasses(
        [
            "--output_dir=x",
            "--use_cpu=true",
            "--bf16=false",
            "--reward_weighting=saw",
            "--saw_reward_shifts",
            "3",
            "0",
        ]
    )
    assert (args.reward_weighting, args.saw_reward_shifts) == ("saw", [3.0, 0.0])


# ---------------------------------------------------------------------- estimators


def test_mrtpo_two_steps_gives_per_token_advantages(tmp_path):
    CountingLetter.calls = 0
    verifiers = [CountingLetter(), *toy_verifiers()[1:]]
    trainer = train_mrtpo(tmp_path, reward_funcs=verifiers, mrtpo_warmup_steps=0, mrtpo_beta=0.5)

    assert trainer.state.global_step == 2
    assert CountingLetter.calls == 2  # each verifier runs once per generation batch
    assert trainer.replays == 2
    assert len(trainer.seen) == 2
    for seen in trainer.seen:
        assert seen["advantages"].shape == seen["completion_ids"].shape  # (B, T)
        assert seen["advantages"].dim() == 2
    for batch in trainer.batches:
        per_token, mask = batch["advantages"], batch["completion_mask"].float()
        # METHOD.md step 4: the token mean of A_t is the GDPO advantage of the response.
        token_mean = (per_token * mask).sum(-1) / mask.sum(-1)
        expected = advantages.gdpo(batch["rewards"], 4)
        torch.testing.assert_close(token_mean, expected, rtol=1e-5, atol=1e-5)
    # beta 0.5 with real distances moves credit between tokens: some row is not constant.
    spreads = [
        (b["advantages"].max(-1).values - b["advantages"].min(-1).values).max()
        for b in trainer.batches
    ]
    assert max(spreads) > 1e-3

    # Logged every step through TRL's metrics, written to metrics.jsonl, plotted to curves.png.
    output_dir = Path(trainer.args.output_dir)
    lines = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "loss" in line]
    assert [line["step"] for line in steps] == [1, 2]
    for line in steps:
        assert line["mrtpo/beta"] == pytest.approx(0.5)
        assert line["mrtpo/replay_seconds"] > 0
        assert 0 < line["mrtpo/replay_share"] < 1
        assert 0 < line["mrtpo/replayed_rows_share"] <= 1
        for name in ("contains_letter", "even_length", "starts_with_space"):
            assert 0 <= line[f"rewards/{name}/mean"] <= 1
            assert 0 < line[f"mrtpo/distance/{name}/mean"] <= 1
            assert 0.1 <= line[f"mrtpo/distance/{name}/top10_share"] <= 1
    assert (output_dir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "estimator, aggregation", [("gdpo", "normalize_then_sum"), ("grpo", "sum_then_normalize")]
)
def test_baseline_advantages_equal_trl(tmp_path, estimator, aggregation):
    # Row by row, bitwise: TRL's own path (share_prompt reorders rows by whole groups and packs
    # prompts; that it trains the same is tests/test_trainer_shared_prompt.py's).
    ours = train_mrtpo(tmp_path / "ours", advantage_estimator=estimator, share_prompt=False)
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    trl_args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        multi_objective_aggregation=aggregation,
        logging_steps=1,
        **COMMON,
    )
    theirs = RecordingGRPO(
        model=model,
        reward_funcs=toy_verifiers(),
        args=trl_args,
        train_dataset=toy_dataset(),
        processing_class=tokenizer,
    )
    theirs.train()
    assert ours.replays == 0
    assert len(ours.seen) == len(theirs.seen) == 2
    for mine, trl in zip(ours.seen, theirs.seen, strict=True):
        assert torch.equal(mine["completion_ids"], trl["completion_ids"])  # same rows, same order
        assert mine["advantages"].shape == trl["advantages"].shape
        torch.testing.assert_close(mine["advantages"], trl["advantages"], rtol=0, atol=1e-6)
        assert mine["advantages"].abs().max() > 0.1  # the batches carry signal
        torch.testing.assert_close(mine["loss"], trl["loss"], rtol=0, atol=1e-7)


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_saw_weights_are_the_steps_own_and_logged(tmp_path, estimator):
    trainer = train_mrtpo(
        tmp_path, advantage_estimator=estimator, reward_weighting="saw", mrtpo_warmup_steps=0
    )
    lines = [
        json.loads(line)
        for line in (Path(trainer.args.output_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [line for line in lines if "loss" in line]
    names = trainer.reward_func_names
    assert len(steps) == len(trainer.batches) == 2  # one generation per optimizer step
    opposite_shares = []
    for line, batch in zip(steps, trainer.batches, strict=True):
        # The pure function on the step's gathered rewards (the toys have NaN scores).
        expected = advantages.saw_weights(batch["rewards"])
        logged = [line[f"mrtpo/reward_weight/{name}"] for name in names]
        assert logged == pytest.approx(expected.tolist(), rel=1e-6, abs=1e-7)
        # They are the c_k of the advantages (MRTPO: of the token advantages, whose mean is
        # GDPO + SAW's advantage).
        response = advantages.get_estimator(estimator)(
            batch["rewards"], 4, expected, scale=trainer.scale_rewards
        )
        got = batch["advantages"]
        if estimator == "mrtpo":
            mask = batch["completion_mask"].float()
            got = (got * mask).sum(-1) / mask.sum(-1)
        torch.testing.assert_close(got, response, rtol=1e-5, atol=1e-5)
        # The weighted reward trained on, sum_k c_k r_k with SAW's c_k (unscorable rows left
        # out), beside TRL's `reward` with the static weights 1.
        rewards = batch["rewards"]
        scorable = ~torch.isnan(rewards).all(1)
        weighted = (torch.nan_to_num(rewards) * expected).sum(1)[scorable]
        static = torch.nan_to_num(rewards).sum(1)[scorable]
        assert line["mrtpo/weighted_reward"] == pytest.approx(weighted.mean().item(), rel=1e-5)
        assert line["mrtpo/weighted_reward_std"] == pytest.approx(weighted.std().item(), rel=1e-5)
        assert line["reward"] == pytest.approx(static.mean().item(), rel=1e-5)
        assert abs(weighted.mean() - static.mean()) > 1e-3  # the two differ here
        # The rows whose rewards' Ã_k have opposite signs, by hand from the step's rewards.
        normalized = torch.nan_to_num(advantages.per_reward(rewards, 4))
        opposite = [
            any(a > 0 for a in row) and any(a < 0 for a in row) for row in normalized.tolist()
        ]
        assert line["mrtpo/opposite_sign_rows_share"] == pytest.approx(
            sum(opposite) / len(opposite), abs=1e-7
        )
        opposite_shares.append(line["mrtpo/opposite_sign_rows_share"])
    # TRL's completions table holds the last batch's response advantages with SAW's weights.
    torch.testing.assert_close(
        torch.tensor(list(trainer._logs["advantages"])), response, rtol=1e-5, atol=1e-6
    )
    assert any(sum(line[f"mrtpo/reward_weight/{n}"] for n in names) > 2.9 for line in steps)
    assert max(opposite_shares) > 0  # the toys' rewards do pull apart on some rows
    # The curves figure gets a second panel (taller) for the weights.
    width, height = png_size(Path(trainer.args.output_dir) / "curves.png")
    assert (width, height) == (700, 700)


def test_static_weights_are_not_logged(tmp_path):
    trainer = train_mrtpo(tmp_path, advantage_estimator="gdpo", max_steps=1)
    text = (Path(trainer.args.output_dir) / "metrics.jsonl").read_text()
    assert "mrtpo/reward_weight/" not in text and "mrtpo/weighted_reward" not in text
    assert png_size(Path(trainer.args.output_dir) / "curves.png") == (700, 400)


def test_mrtpo_with_beta_zero_matches_gdpo_loss_and_gradients(tmp_path):
    runs = {}
    for estimator in ("gdpo", "mrtpo"):
        grads = GradientSnapshots()
        trainer = train_mrtpo(
            tmp_path / estimator, callbacks=[grads], advantage_estimator=estimator, mrtpo_beta=0.0
        )
        runs[estimator] = (trainer, grads)
    (gdpo, gdpo_grads), (mrtpo, mrtpo_grads) = runs["gdpo"], runs["mrtpo"]
    assert mrtpo.replays == 2 and gdpo.replays == 0
    for a, b in zip(gdpo.seen, mrtpo.seen, strict=True):
        assert a["advantages"].dim() == 1 and b["advantages"].dim() == 2
        torch.testing.assert_close(a["loss"], b["loss"], rtol=0, atol=1e-7)
    assert len(gdpo_grads.grads) == len(mrtpo_grads.grads) == 2
    for a, b in zip(gdpo_grads.grads, mrtpo_grads.grads, strict=True):
        assert a.keys() == b.keys() and a
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-7)
    assert any(g.abs().max() > 0 for g in gdpo_grads.grads[0].values())


def test_accumulation_and_iterations_reuse_one_generation(tmp_path):
    # 2 optimizer steps x 2 accumulation micro-batches, each generation used for 2 iterations:
    # one generation batch (16 rows) serves all four micro-batches.
    trainer = train_mrtpo(
        tmp_path,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_iterations=2,
        mrtpo_warmup_steps=0,
    )
    assert trainer.state.global_step == 2
    assert trainer.replays == 1
    assert len(trainer.batches) == 1 and trainer.batches[0]["advantages"].shape[0] == 8
    assert len(trainer.seen) == 4
    assert all(seen["advantages"].shape == seen["completion_ids"].shape for seen in trainer.seen)
    # The second iteration reuses the first one's advantages (same rows, same values).
    first = {
        tuple(s["completion_ids"][i].tolist()): s["advantages"][i]
        for s in trainer.seen[:2]
        for i in range(4)
    }
    for seen in trainer.seen[2:]:
        for i in range(4):
            torch.testing.assert_close(
                seen["advantages"][i], first[tuple(seen["completion_ids"][i].tolist())]
            )


class StepBetaRecorder(RecordingMRTPO):
    """Keeps each generation batch's rows (keyed by prompt and completion ids) with the rewards
    and distances its advantages came from, and the optimizer step of every micro-batch."""

    def __init__(self, *args, **kwargs):
        self.generations: list[dict] = []
        self.steps_seen: list[int] = []
        super().__init__(*args, **kwargs)

    def _token_advantages(self, scored, step, group_size, output):
        token = super()._token_advantages(scored, step, group_size, output)
        width = output["completion_ids"].shape[1]
        distance = torch.zeros(len(scored.prompts), len(self.reward_funcs), width)
        distance[token.replay.rows] = token.replay.distance.cpu()
        self.generations.append({"distance": distance, "mask": scored.response_mask(width)})
        return token

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.generations[-1]["keys"] = row_keys(output)
        self.generations[-1]["rewards"] = self._scored.rewards.clone()
        return output

    def _compute_loss(self, model, inputs):
        self.steps_seen.append(self.state.global_step)
        self.seen_keys = getattr(self, "seen_keys", []) + [row_keys(inputs)]
        return super()._compute_loss(model, inputs)


def row_keys(batch: dict) -> list[tuple]:
    """(prompt ids, completion ids) of each row without padding (micro-batches cut theirs)."""
    return [
        (tuple(prompt[prompt_mask.bool()].tolist()), tuple(completion[mask.bool()].tolist()))
        for prompt, prompt_mask, completion, mask in zip(
            batch["prompt_ids"],
            batch["prompt_mask"],
            batch["completion_ids"],
            batch["completion_mask"],
            strict=True,
        )
    ]


@pytest.mark.parametrize(
    "schedule",
    [
        # one generation batch (8 rows) per 2 optimizer steps of one micro-batch each
        dict(gradient_accumulation_steps=1, steps_per_generation=2),
        # ... of two micro-batches each, every generation used for 2 iterations
        dict(gradient_accumulation_steps=2, steps_per_generation=2, num_iterations=2),
        # generations not aligned with optimizer steps: the second of each three starts inside
        # a step and ends in the next (micro-batches 2, 3 serve steps 0, 1)
        dict(gradient_accumulation_steps=3, steps_per_generation=2),
        # three micro-batches a generation, two a step: every other one crosses a boundary
        dict(gradient_accumulation_steps=2, steps_per_generation=3),
        # one micro-batch a step, each generation trained on twice (two steps)
        dict(gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=2),
    ],
)
def test_beta_is_the_optimizer_steps_own_whatever_the_schedule(tmp_path, schedule):
    warmup, final_beta, steps = 4, 1.0, 4
    trainer = train_mrtpo(
        tmp_path,
        trainer_class=StepBetaRecorder,
        per_device_train_batch_size=4,
        max_steps=steps,
        mrtpo_warmup_steps=warmup,
        mrtpo_beta=final_beta,
        **schedule,
    )
    accumulation = schedule["gradient_accumulation_steps"]
    served = schedule["steps_per_generation"] * schedule.get("num_iterations", 1)
    # By hand, as transformers' Trainer groups micro-batches: GA of them a step, and the rest
    # at an epoch's end (8 prompts: 8 micro-batches of one group an epoch, x num_iterations).
    # Micro-batch m comes from generation m // served (TRL makes one every `served`).
    per_epoch = len(trainer.get_train_dataloader())
    hand_steps: list[int] = []
    while len(set(hand_steps)) < steps:
        for start in range(0, per_epoch, accumulation):
            hand_steps += [len(set(hand_steps))] * min(accumulation, per_epoch - start)
    hand_steps = [s for s in hand_steps if s < steps]
    assert trainer.state.global_step == steps
    assert trainer.steps_seen == hand_steps
    assert len(trainer.generations) == -(-len(hand_steps) // served)  # ceil
    for g, generation in enumerate(trainer.generations):
        steps_served = set(hand_steps[g * served : (g + 1) * served])
        some_beta = max(advantages.beta_at(s, final_beta, warmup) for s in steps_served) > 0
        moving = (torch.nan_to_num(advantages.per_reward(generation["rewards"], 4)) != 0).any()
        # Replayed if and only if some step it serves has beta > 0 (and some Ã_k is not 0).
        assert bool(generation["distance"].abs().sum() > 0) == bool(some_beta and moving), (
            f"generation {g} serves steps {sorted(steps_served)}"
        )
    # Each micro-batch's advantages are MRTPO's at the beta of the optimizer step it is in,
    # from the distances and rewards of the generation batch its rows come from.
    moved = 0.0
    for m, (keys, seen) in enumerate(zip(trainer.seen_keys, trainer.seen, strict=True)):
        g = m // served
        generation = trainer.generations[g]
        assert set(keys) <= set(generation["keys"])
        rows = [generation["keys"].index(key) for key in keys]
        beta = advantages.beta_at(hand_steps[m], final_beta, warmup)
        expected = advantages.mrtpo(
            generation["rewards"], 4, generation["distance"], generation["mask"], beta
        )[rows]
        width = seen["advantages"].shape[1]
        torch.testing.assert_close(seen["advantages"], expected[:, :width], rtol=1e-5, atol=1e-6)
        at_generation = advantages.mrtpo(
            generation["rewards"],
            4,
            generation["distance"],
            generation["mask"],
            advantages.beta_at(hand_steps[g * served], final_beta, warmup),
        )[rows]
        moved = max(moved, (expected - at_generation).abs().max().item())
    assert moved > 1e-3  # the generation step's beta would have given other advantages
    lines = (Path(trainer.args.output_dir) / "metrics.jsonl").read_text().splitlines()
    logged = [json.loads(line) for line in lines if '"loss"' in line]
    assert [line["mrtpo/beta"] for line in logged] == pytest.approx(
        [advantages.beta_at(line["step"] - 1, final_beta, warmup) for line in logged]
    )


def test_shuffled_weights_move_credit_but_keep_each_response_total(tmp_path):
    # Same seed: same completions and rewards (the shuffle draws from its own generator).
    plain = train_mrtpo(tmp_path / "plain", mrtpo_warmup_steps=0, mrtpo_beta=1.0)
    shuffled = train_mrtpo(
        tmp_path / "shuffled", mrtpo_warmup_steps=0, mrtpo_beta=1.0, shuffle_token_weights=True
    )
    for a, b in zip(plain.batches, shuffled.batches, strict=True):
        assert torch.allclose(a["rewards"], b["rewards"], equal_nan=True)
        mask = a["completion_mask"].float()
        mean_a = (a["advantages"] * mask).sum(-1) / mask.sum(-1)
        mean_b = (b["advantages"] * mask).sum(-1) / mask.sum(-1)
        torch.testing.assert_close(mean_a, mean_b, rtol=1e-5, atol=1e-5)
        assert (a["advantages"] - b["advantages"]).abs().max() > 1e-3


class AlwaysOne(Verifier):
    name = "always_one"

    def verify(self, completion, example):
        return Verdict(1.0, "Any response is fine.")


def test_rows_where_no_reward_varies_are_not_replayed(tmp_path):
    # Ã_k = 0 for every reward of every row: the weights cannot matter, nothing is replayed.
    trainer = train_mrtpo(tmp_path / "constant", reward_funcs=[AlwaysOne()], mrtpo_warmup_steps=0)
    assert trainer.replays == 2 and trainer.replayed_rows == 0
    assert all(seen["advantages"].abs().max() == 0 for seen in trainer.seen)
    lines = (Path(trainer.args.output_dir) / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line) for line in lines if '"loss"' in line]
    assert [line["mrtpo/replayed_rows_share"] for line in steps] == [0.0, 0.0]
    assert all(line["mrtpo/distance/always_one/mean"] is None for line in steps)

    # With a varying reward beside it, exactly the rows of groups where it varies are replayed.
    mixed = train_mrtpo(
        tmp_path / "mixed", reward_funcs=[AlwaysOne(), ContainsLetter()], mrtpo_warmup_steps=0
    )
    varying = 0
    for batch in mixed.batches:
        grouped = torch.nan_to_num(batch["rewards"][:, 1], nan=-1.0).view(-1, 4)
        varying += 4 * int((grouped.max(1).values != grouped.min(1).values).sum())
    assert mixed.replayed_rows == varying


def test_plain_reward_function_gets_uniform_credit(tmp_path):
    # A plain TRL reward function has no verifier information: leaving it out changes no
    # context, so its distance is 0 and its advantage is spread uniformly (as in GDPO).
    def ends_with_letter(prompts, completions, **columns):
        return [float(c[-1]["content"][-1:].isalpha()) for c in completions]

    trainer = train_mrtpo(
        tmp_path, reward_funcs=[ContainsLetter(), ends_with_letter], mrtpo_warmup_steps=0
    )
    lines = [
        json.loads(line)
        for line in (Path(trainer.args.output_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [line for line in lines if "loss" in line]
    assert len(steps) == 2
    for line in steps:
        assert line["mrtpo/distance/ends_with_letter/mean"] == 0.0
        assert line["mrtpo/distance/contains_letter/mean"] > 0.0
        assert line["rewards/ends_with_letter/mean"] is not None


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("task_name", ["sql", "tool_calling", "instructions"])
def test_two_steps_on_each_bundled_task(tmp_path, task_name, estimator, monkeypatch):
    task = tasks.get(task_name)
    verifiers = task.verifiers()
    # The tiny model's text scores 0 on most task rewards; a reward that varies makes MRTPO
    # replay the rows (with every task verifier's information in the contexts). Every reward
    # is replayed, not only those that vary, so that each verifier's own context runs too.
    monkeypatch.setattr(
        MRTPOTrainer,
        "_pairs_to_replay",
        lambda self, normalized: torch.ones_like(normalized).bool(),
    )
    trainer = train_mrtpo(
        tmp_path,
        reward_funcs=[*verifiers, EvenLength()],
        dataset=task.load("train"),
        advantage_estimator=estimator,
        mrtpo_warmup_steps=0,
        per_device_train_batch_size=4,  # one prompt x 4 completions: the prompts are long
        max_completion_length=6,
        gradient_checkpointing=False,
    )
    assert trainer.state.global_step == 2
    assert len(trainer.seen) == 2
    for seen, batch in zip(trainer.seen, trainer.batches, strict=True):
        expected_dim = 2 if estimator == "mrtpo" else 1
        assert seen["advantages"].dim() == expected_dim
        assert seen["advantages"].shape[0] == seen["completion_ids"].shape[0] == 4
        if estimator != "mrtpo":
            estimate = advantages.gdpo if estimator == "gdpo" else advantages.grpo
            torch.testing.assert_close(batch["advantages"], estimate(batch["rewards"], 4))
    lines = [
        json.loads(line)
        for line in (Path(trainer.args.output_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [line for line in lines if "loss" in line]
    assert len(steps) == 2
    for verifier in verifiers:
        for line in steps:
            mean = line[f"rewards/{verifier.name}/mean"]
            assert mean is None or 0 <= mean <= 1  # None: the verifier applied to no row
        if estimator == "mrtpo":
            distances = [line[f"mrtpo/distance/{verifier.name}/mean"] for line in steps]
            assert any(d is not None for d in distances)
            assert all(d is None or 0 <= d <= 1 for d in distances)
    if estimator == "mrtpo":
        assert trainer.replayed_rows > 0


def _recording_replays(monkeypatch) -> list[dict]:
    """Every call of `mrtpo.relevance.replay_distances` the trainer makes: its inputs, options,
    result, and the parameters of the model it got (the policy at that step)."""
    calls: list[dict] = []
    real = mrtpo.relevance.replay_distances

    def recording(model, tokenizer, prompts, completion_ids, infos, **options):
        distance, mask = real(model, tokenizer, prompts, completion_ids, infos, **options)
        calls.append(
            {
                "state": {name: t.detach().clone() for name, t in model.state_dict().items()},
                "inputs": (list(prompts), [list(ids) for ids in completion_ids], infos),
                "options": options,
                "distance": distance.detach().float().clone(),
            }
        )
        return distance, mask

    monkeypatch.setattr(mrtpo.relevance, "replay_distances", recording)
    return calls


def test_peft_replay_runs_the_adapted_policy(tmp_path, monkeypatch):
    # peft is optional (not a project dependency): this runs where it is installed, e.g.
    # PYTHONPATH=<dir with peft> .venv/bin/pytest tests/test_trainer.py -k peft
    peft = pytest.importorskip("peft")
    from mrtpo.relevance import naive_replay_distances

    calls = _recording_replays(monkeypatch)
    # Random A and B (not PEFT's no-op B = 0): the adapted policy differs from the base model
    # from the first step on, so a replay of the base model shows.
    lora = peft.LoraConfig(
        r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM", init_lora_weights=False
    )
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    args = MRTPOConfig(
        output_dir=str(tmp_path), **{**COMMON, "learning_rate": 1e-2}, mrtpo_warmup_steps=0
    )
    trainer = MRTPOTrainer(
        model=model,
        reward_funcs=toy_verifiers(),
        args=args,
        train_dataset=toy_dataset(),
        processing_class=tokenizer,
        peft_config=lora,
    )
    trainer.train()
    assert len(calls) == 2, "one replay per step"
    lora_names = [name for name in calls[0]["state"] if "lora_B" in name]
    assert lora_names and all(
        not torch.equal(calls[0]["state"][n], calls[1]["state"][n]) for n in lora_names
    ), "the adapter was not trained between the two replays"
    base, _ = tiny_model_and_tokenizer(seed=0)  # what a replay with adapters off would run
    for call in calls:
        # The step's policy rebuilt from the replayed model's parameters, LoRA merged in.
        adapted = peft.get_peft_model(tiny_model_and_tokenizer(seed=0)[0], lora)
        adapted.load_state_dict(call["state"])
        merged = adapted.merge_and_unload()
        options = call["options"]
        assert (options["temperature"], options["lm_head_fp32"]) == (1.0, False)  # naive's
        rendering = {
            key: options[key] for key in ("mode", "chat_template_kwargs", "tools", "chat_template")
        }
        expected, _ = naive_replay_distances(merged, tokenizer, *call["inputs"], **rendering)
        adapters_off, _ = naive_replay_distances(base, tokenizer, *call["inputs"], **rendering)
        # Only the wanted (row, reward) pairs were replayed; the others are 0 by contract.
        wanted = options["wanted"].unsqueeze(-1).expand_as(expected)
        assert wanted.any()
        actual = call["distance"]
        torch.testing.assert_close(
            actual[wanted],
            expected[wanted],
            rtol=0,
            atol=1e-5,
            msg=lambda m: f"the replay did not run the adapted policy (LoRA merged): {m}",
        )
        assert actual[~wanted].abs().max() == 0
        assert (actual[wanted] - adapters_off[wanted]).abs().max() > 5e-4


# ---------------------------------------------------------------------- resume


class StopAfter(TrainerCallback):
    """Stops training after `step` optimizer steps, like an interrupted run."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True


def test_resume_continues_steps_optimizer_and_scheduler(tmp_path):
    def run(output_dir, stop_after=None, resume=None):
        model, tokenizer = tiny_model_and_tokenizer(seed=0)
        args = MRTPOConfig(
            output_dir=str(output_dir),
            **{**COMMON, "save_strategy": "steps", "save_steps": 1},
            mrtpo_warmup_steps=0,
        )
        trainer = MRTPOTrainer(
            model=model,
            reward_funcs=toy_verifiers(),
            args=args,
            train_dataset=toy_dataset(),
            processing_class=tokenizer,
            callbacks=[StopAfter(stop_after)] if stop_after else None,
        )
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    straight = run(tmp_path / "straight")
    interrupted = tmp_path / "interrupted"
    run(interrupted, stop_after=1)
    assert not (interrupted / "checkpoint-2").exists()
    # The run continues in the same folder from its checkpoint, as `--resume_from_checkpoint` does.
    resumed = run(interrupted, resume=str(interrupted / "checkpoint-1"))

    assert resumed.state.global_step == 2
    assert resumed.lr_scheduler.last_epoch == straight.lr_scheduler.last_epoch == 2
    assert resumed.lr_scheduler.get_last_lr() == straight.lr_scheduler.get_last_lr()
    adam_steps = {
        float(state["step"]) for state in resumed.optimizer.state_dict()["state"].values()
    }
    assert adam_steps == {2.0}  # the moments were loaded from step 1, then stepped once more
    for (name, a), (_, b) in zip(
        straight.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    # metrics.jsonl keeps step 1 from the first run and step 2 from the resumed one, once each.
    lines = [json.loads(line) for line in (interrupted / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "loss" in line] == [1, 2]


# ---------------------------------------------------------------------- credit maps


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_credit_map_hook_receives_lowest_and_highest_rows(tmp_path, monkeypatch, estimator):
    import mrtpo.trainer_credit as trainer_module

    received, shown = [], []
    original = trainer_module.write_training_maps

    def recording(output_dir, step, records, diagnostics):
        received.append((step, records))
        shown.append(diagnostics)
        return original(output_dir, step, records, diagnostics)

    monkeypatch.setattr(trainer_module, "write_training_maps", recording)
    trainer = train_mrtpo(
        tmp_path, credit_map_steps=1, mrtpo_warmup_steps=0, advantage_estimator=estimator
    )

    # MRTPO replays its rows (and a shown row it skipped); the baselines only the rows shown.
    assert trainer.replays >= 2 if estimator == "mrtpo" else trainer.replays == 2
    assert [step for step, _ in received] == [0, 1]
    for (_, maps), batch in zip(received, trainer.batches, strict=True):
        assert [m.title.split()[0] for m in maps] == ["lowest", "highest"]
        # Each map's verdicts are the scores of a row of the batch (NaN: no score, as -1 here),
        # the rows of the lowest and the highest total reward.
        rows = batch["rewards"].nan_to_num(-1.0).tolist()
        scores = [[-1.0 if v.score is None else v.score for v in m.verdicts] for m in maps]
        assert all(row in rows for row in scores)
        totals = batch["rewards"].nan_to_num().sum(dim=1)
        assert [sum(s for s in row if s != -1.0) for row in scores] == [
            totals.min().item(),
            totals.max().item(),
        ]
        for credit_map in maps:
            length = credit_map.num_tokens
            assert credit_map.distance.shape == (3, length)
            assert 0 < credit_map.distance.max() <= 1
            assert credit_map.token_advantages.shape == (length,)
            assert credit_map.names == ["contains_letter", "even_length", "starts_with_space"]
            if estimator == "mrtpo":
                assert credit_map.weights.shape == (3, length)
                np.testing.assert_allclose(credit_map.weights.mean(-1), np.ones(3), atol=1e-5)
            else:  # uniform: every token gets the response's advantage
                assert credit_map.weights is None
                assert np.all(credit_map.token_advantages == credit_map.token_advantages[0])
            if estimator != "grpo":
                assert credit_map.reward_advantages.shape == (3,)
                assert credit_map.token_advantages.mean() == pytest.approx(
                    credit_map.gdpo_advantage, abs=1e-5
                )
    credit_dir = Path(trainer.args.output_dir) / "credit"
    assert (credit_dir / "step-00000.html").exists() and (credit_dir / "index.html").exists()
    # Above the maps and in the index: MRTPO's beta and re-allocation ratio as the step logged
    # them (one generation batch a step here); nothing for the uniform baselines.
    if estimator == "mrtpo":
        logs = [log for log in trainer.state.log_history if "mrtpo/beta" in log]
        assert [d["beta"] for d in shown] == [log["mrtpo/beta"] for log in logs]
        assert [d["reallocation_ratio"] for d in shown] == pytest.approx(
            [log["mrtpo/reallocation_ratio"] for log in logs]
        )
        assert set(shown[0]) == {"beta", "reallocation_ratio"}
        index = json.loads((credit_dir / "index.json").read_text())
        assert index[1]["diagnostics"]["beta"] == logs[1]["mrtpo/beta"]
        assert "<th>reallocation_ratio</th>" in (credit_dir / "index.html").read_text()
    else:
        assert shown == [{}, {}]


# ---------------------------------------------------------------------- metric helper


# ---------------------------------------------------------------------- the mixins


def attributes_read_on_self(cls: type) -> set[str]:
    """Every `self.<name>` in the source of `cls`'s methods (read, written or called)."""
    tree = ast.parse(inspect.getsource(cls))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }


@pytest.mark.parametrize("mixin", [CreditMapsMixin, SharedPromptMixin])
def test_each_mixin_declares_what_it_needs_from_the_trainer(tmp_path, mixin):
    """A mixin's class body declares (annotations without values) what its methods use of the
    trainer: everything they use on `self` is the mixin's own or declared, every declaration is
    used, and a trainer has every declared attribute."""
    own = {name for name in vars(mixin) if not name.startswith("__")}
    declared = set(vars(mixin).get("__annotations__", {})) - own
    used = attributes_read_on_self(mixin)
    assert used - own - declared == set(), f"{mixin.__name__} uses undeclared trainer attributes"
    assert declared - used == set(), f"{mixin.__name__} declares what it does not use"
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    args = MRTPOConfig(output_dir=str(tmp_path), **CPU_RUN)
    trainer = MRTPOTrainer(
        model=model,
        reward_funcs=toy_verifiers(),
        args=args,
        train_dataset=toy_dataset(),
        processing_class=tokenizer,
    )
    assert sorted(name for name in declared if not hasattr(trainer, name)) == []


def test_the_credit_maps_are_written_by_their_mixin():
    """The trainer calls the credit-map mixin (`_credit_maps_due`, `_write_credit_maps`), and
    the mixin calls back only what it declares (test above): the write lives in the mixin."""
    assert "_write_credit_maps" in vars(CreditMapsMixin)
    assert "_write_credit_maps" not in vars(MRTPOTrainer)
    assert {"_write_credit_maps", "_credit_maps_due"} <= attributes_read_on_self(MRTPOTrainer)
    assert "_credit_maps" not in attributes_read_on_self(MRTPOTrainer)


def test_top_share_by_hand():
    # Row 0: 5 tokens, top 10% = 1 token (0.5 of 1.0). Row 1: 3 tokens + 2 padding, distance 0
    # for reward 0 (not counted) and top token 0.6 of 0.6 + 0.2 + 0.2 for reward 1.
    distance = torch.tensor(
        [
            [[0.5, 0.1, 0.1, 0.1, 0.2], [0.2, 0.2, 0.2, 0.2, 0.2]],
            [[0.0, 0.0, 0.0, 0.9, 0.9], [0.2, 0.6, 0.2, 0.9, 0.9]],
        ]
    )
    mask = torch.tensor([[1.0, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    sums = _top_share_sums(distance, mask, 0.10)
    torch.testing.assert_close(sums[0], torch.tensor([0.5, 1.0]))
    torch.testing.assert_close(sums[1], torch.tensor([0.2 + 0.6, 2.0]))


# ---------------------------------------------------------------------- several processes


def _fit(x: torch.Tensor, width: int) -> torch.Tensor:
    """Pad with zeros or cut the last dimension to `width`."""
    if x.shape[-1] >= width:
        return x[..., :width]
    return torch.nn.functional.pad(x, (0, width - x.shape[-1]))


def _two_processes(out: Path, weighting: str, share_prompt: bool) -> None:
    """`tests/trainer_toys.py` on two gloo processes, its files in `out` (rank{r}.pt)."""
    flag = "true" if share_prompt else "false"
    result = launch_two_processes("trainer_toys.py", str(out), weighting, flag, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    """Each (weighting, share_prompt) run once for the tests of this module that read it."""
    done: dict[tuple[str, bool], Path] = {}

    def run(weighting: str, share_prompt: bool = True) -> Path:
        if (weighting, share_prompt) not in done:
            out = tmp_path_factory.mktemp(f"two-{weighting}-{share_prompt}")
            _two_processes(out, weighting, share_prompt)
            done[weighting, share_prompt] = out
        return done[weighting, share_prompt]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("weighting", ["static", "saw"])
def test_two_processes_agree_with_a_naive_replay_of_the_whole_batch(two_process_runs, weighting):
    from mrtpo.relevance import naive_replay_distances

    tmp_path = two_process_runs(weighting)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert all(rank["shares_prompt"] for rank in ranks)
    assert all(rank["num_processes"] == 2 for rank in ranks)
    assert len(ranks[0]["generations"]) == len(ranks[1]["generations"]) == 2  # one per step
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    verifiers = toy_verifiers()
    replayed_rows = 0
    for step in range(2):
        both = [rank["generations"][step] for rank in ranks]
        assert all(torch.equal(t, both[1]["state"][n]) for n, t in both[0]["state"].items())
        model.load_state_dict(both[0]["state"])  # the policy both processes replayed with
        # The whole batch, process 0's rows first, scored again here by the toy verifiers.
        rows = [
            (example, ids[mask.bool()].tolist())
            for generation in both
            for example, ids, mask in zip(
                generation["inputs"],
                generation["completion_ids"],
                generation["completion_mask"],
                strict=True,
            )
        ]
        verdicts = [
            [v.verify(tokenizer.decode(ids, skip_special_tokens=True), example) for v in verifiers]
            for example, ids in rows
        ]
        rewards = torch.tensor(
            [[float("nan") if v.score is None else v.score for v in row] for row in verdicts]
        )
        for generation in both:  # TRL gathered them, in process order, on each process
            torch.testing.assert_close(generation["rewards"], rewards, equal_nan=True)
        # One process, the whole batch, every context from scratch: the reference replay.
        distance, mask = naive_replay_distances(
            model,
            tokenizer,
            [example["prompt"] for example, _ in rows],
            [ids for _, ids in rows],
            [[verdict.info for verdict in row] for row in verdicts],
            mode=ranks[0]["replay_mode"],
        )
        width = mask.shape[1]
        weights = advantages.saw_weights(rewards) if weighting == "saw" else torch.ones(3)
        # One group of 8 spans both processes: each process's per-token advantages are the rows
        # of one computation over the whole batch with the naive distances (pairs a process did
        # not replay have Ã_k = 0: their distances cannot matter).
        together = advantages.mrtpo(rewards, 8, distance, mask, 0.5, weights)
        split = torch.cat([_fit(generation["advantages"], width) for generation in both])
        torch.testing.assert_close(
            split,
            together,
            rtol=1e-5,
            atol=1e-6,
            msg=lambda m, step=step: (
                f"step {step}: the processes' advantages are not those of "
                f"a naive replay of the whole batch: {m}"
            ),
        )
        assert (together.amax(-1) - together.amin(-1)).max() > 1e-3  # credit moved: not GDPO
        token_mean = (split * mask).sum(-1) / mask.sum(-1)
        torch.testing.assert_close(
            token_mean, advantages.gdpo(rewards, 8, weights), rtol=1e-5, atol=1e-5
        )
        # Each process replayed only its own rows; their distances are naive's where wanted.
        for rank, generation in enumerate(both):
            own = range(4 * rank, 4 * rank + 4)
            for replay in generation["replays"]:
                for i, (prompt, ids) in enumerate(
                    zip(replay["prompts"], replay["completion_ids"], strict=True)
                ):
                    row = next(j for j in own if rows[j][1] == ids)
                    assert rows[row][0]["prompt"] == prompt
                    wanted = replay["wanted"][i]
                    torch.testing.assert_close(
                        _fit(replay["distance"][i], len(ids))[wanted],
                        distance[row, :, : len(ids)][wanted],
                        rtol=0,
                        atol=1e-5,
                    )
                    replayed_rows += 1
    assert replayed_rows > 0


@pytest.mark.slow
def test_two_processes_share_prompts_as_the_per_row_path_trains(two_process_runs):
    """Each process packs its rows of the group spanning both: same losses, grad norms and
    rewards as TRL's per-row path on two processes."""
    shared = torch.load(two_process_runs("static", True) / "rank0.pt")
    per_row = torch.load(two_process_runs("static", False) / "rank0.pt")
    assert shared["shares_prompt"] and not per_row["shares_prompt"]
    lines = [[line for line in run["log_history"] if "loss" in line] for run in (shared, per_row)]
    assert len(lines[0]) == len(lines[1]) == 2
    for a, b in zip(*lines, strict=True):
        for key in ("reward", "grad_norm", "entropy"):
            assert a[key] == pytest.approx(b[key], rel=1e-4), key
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)


# ---------------------------------------------------------------------- prompts refused up front


def test_unsupported_prompt_is_refused_before_generation(tmp_path):
    image_part = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image", "text": None},
    ]
    rows = [{"prompt": [{"role": "user", "content": image_part}], "letter": "a"}] * 2
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    generated = []

    class Watching(MRTPOTrainer):
        def _generate(self, prompts):
            generated.append(len(prompts))
            return super()._generate(prompts)

    args = MRTPOConfig(output_dir=str(tmp_path), **{**COMMON, "max_steps": 1})
    trainer = Watching(
        model=model,
        reward_funcs=toy_verifiers(),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    with pytest.raises(ValueError) as error:
        trainer.train()
    message = str(error.value)
    assert "prompts[0] has a 'user' message with a non-text content part" in message
    assert "advantage_estimator='gdpo' and credit_map_steps=0" in message
    assert generated == []  # refused before anything was generated
    # GDPO with credit maps replays the rows it shows: refused alike.
    gdpo_args = MRTPOConfig(
        output_dir=str(tmp_path / "gdpo"),
        **{**COMMON, "max_steps": 1},
        advantage_estimator="gdpo",
        credit_map_steps=1,
    )
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    gdpo_trainer = Watching(
        model=model,
        reward_funcs=toy_verifiers(),
        args=gdpo_args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    with pytest.raises(ValueError, match="credit_map_steps=1"):
        gdpo_trainer.train()
    assert generated == []


def test_two_processes_refuse_a_prompt_that_only_one_holds(tmp_path):
    # A process left waiting in a collective would hang until gloo's 30-minute timeout.
    result = launch_two_processes("prompt_check_toys.py", str(tmp_path), timeout=240)
    assert result.returncode != 0
    messages = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert messages[0] == messages[1]  # the same error on both, whichever held the row
    # TRL's sampler (the run's seed, 0) orders the two prompts' groups of four rows; process p
    # holds rows 4p..4p+3 of the batch. The message names the holder and its first row there.
    dealt = list(RepeatSampler(range(2), mini_repeat_count=4, batch_size=2, seed=0))[:8]
    row = dealt.index(1)  # the prompt without a user turn is the dataset's second
    assert row == 4  # on process 1, whose rows a dropped offset would number from 0
    expected = f"(process {row // 4}: prompts[{row}] has no user message to append verifier"
    assert expected in messages[0], messages[0]


# ---------------------------------------------------------------------- bounded normalization


class OddLength(EvenLength):
    """EvenLength's complement: with it every row's GDPO sum S is 0 (std_batch S = 0)."""

    name = "odd_length"

    def verify(self, completion, example):
        even = super().verify(completion, example)
        return Verdict(1.0 - even.score, "The response must have an odd number of characters.")


@pytest.mark.parametrize("bounded", [True, False])
def test_anti_correlated_rewards_train_on_bounded_advantages(tmp_path, bounded):
    trainer = train_mrtpo(
        tmp_path,
        reward_funcs=[EvenLength(), OddLength()],
        max_steps=1,
        mrtpo_warmup_steps=0,
        mrtpo_beta=1.0,
        bounded_token_advantages=bounded,
    )
    (batch,) = trainer.batches
    rewards = batch["rewards"]
    share = advantages.bounded_rows(rewards, 4).float().mean().item()
    assert share > 0  # some group's lengths vary: its rows are bounded
    largest = batch["advantages"].abs().max().item()
    lines = (Path(trainer.args.output_dir) / "metrics.jsonl").read_text().splitlines()
    (logged,) = [json.loads(line) for line in lines if '"loss"' in line]
    if bounded:
        assert logged["mrtpo/bounded_rows_share"] == pytest.approx(share)
        # On the scale of the weights: |A_t| <= sum_k |w_{k,t} - 1| |Ã_k| / scale, |Ã_k| ~ 0.87.
        assert largest < 50
    else:
        assert "mrtpo/bounded_rows_share" not in logged
        assert largest > 500  # the paper's formula divides by std_batch S + eps = 1e-4


# ---------------------------------------------------------------------- placebo information


def test_placebo_replays_each_row_with_another_prompts_information(tmp_path, monkeypatch):
    import mrtpo.relevance

    calls = []
    original = mrtpo.relevance.replay_distances

    def recording(model, tokenizer, prompts, completion_ids, infos, **options):
        calls.append((prompts, completion_ids, infos))
        return original(model, tokenizer, prompts, completion_ids, infos, **options)

    monkeypatch.setattr(mrtpo.relevance, "replay_distances", recording)
    settings = dict(
        max_steps=2, mrtpo_warmup_steps=0, mrtpo_beta=1.0, per_device_train_batch_size=12
    )
    placebo = train_mrtpo(tmp_path / "placebo", replay_information="placebo", **settings)
    placebo_calls, calls[:] = list(calls), []
    own = train_mrtpo(tmp_path / "own", **settings)
    assert len(placebo_calls) == len(calls) == 2  # one replay a step, same rows (same seed)
    for (prompts, ids, infos), (own_prompts, own_ids, own_infos) in zip(
        placebo_calls, calls, strict=True
    ):
        assert prompts == own_prompts and ids == own_ids  # only the information differs
        for prompt, row_infos, row_own in zip(prompts, infos, own_infos, strict=True):
            letter = prompt[-1]["content"].split()[-1][0]  # "... the word apple." -> "a"
            assert f"letter {letter!r}" in row_own[0]
            assert f"letter {letter!r}" not in row_infos[0]  # another prompt's letter
    assert placebo.state.global_step == own.state.global_step == 2
    assert placebo.args.replay_information == "placebo"

    # Whose information each row gets, read off labelled rows: a 24-row batch (six groups of
    # four) on two processes of 12 rows each; the second process's rows start at row 12.
    group_size, rows, per_process = placebo.num_generations, 24, 12
    labels = [f"group {r // group_size} position {r % group_size}" for r in range(rows)]
    monkeypatch.setattr(mrtpo.trainer, "gather_object", lambda own: [[label] for label in labels])

    def pairing(step: int) -> dict[int, int]:
        """{group: the group whose information it gets} over both processes at `step`."""
        placebo.state.global_step = step
        partners: dict[int, set[int]] = {}
        for start in (0, per_process):
            local = range(start, start + per_process)
            scored = ScoredBatch(
                prompts=[None] * per_process,
                completions=[""] * per_process,
                completion_ids=[[1]] * per_process,
                rewards=torch.zeros(rows, 1),
                verdicts=[[Verdict(1.0, labels[row]) for row in local]],
                local=slice(start, start + per_process),
            )
            for row, (info,) in zip(local, placebo._replay_infos(scored, "placebo"), strict=True):
                _, group, _, position = info.split()
                assert int(position) == row % group_size, (step, row)  # the same position
                partners.setdefault(row // group_size, set()).add(int(group))
        assert all(len(groups) == 1 for groups in partners.values())  # one partner a group
        paired = {group: groups.pop() for group, groups in partners.items()}
        assert sorted(paired.values()) == list(range(rows // group_size)), paired  # a permutation
        assert all(group != partner for group, partner in paired.items()), paired  # of others
        return paired

    pairings = [pairing(step) for step in range(4)]
    assert pairing(2) == pairings[2]  # a function of the step: every process draws it alike
    assert len({tuple(paired.items()) for paired in pairings}) > 1  # drawn again each step


def test_placebo_needs_two_prompts_per_generation_batch(tmp_path):
    with pytest.raises(ValueError, match="at least two prompts per generation batch"):
        train_mrtpo(
            tmp_path,
            replay_information="placebo",
            per_device_train_batch_size=4,
            max_steps=1,
            mrtpo_warmup_steps=0,
        )


# ---------------------------------------------------------------------- #46: metrics that vanish,
# a run that cannot learn (the metrics helper's block: `mrtpo.trainer_metrics`, `mrtpo.training`)


def _logged_steps(trainer) -> list[dict]:
    return [entry for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.parametrize("rewards", ["cancelling", "ordinary"])
def test_reallocation_parts_are_logged_and_the_ratio_is_infinite_where_gdpo_has_none(
    tmp_path, rewards
):
    """EvenLength and OddLength cancel in GDPO's sum on every row: GDPO's part is 0 while MRTPO
    moves credit, and the ratio is an infinity (a NaN would be dropped by TRL's window mean).
    Each part is the root mean square over the trained tokens of the advantages trained on."""
    funcs = [EvenLength(), OddLength()] if rewards == "cancelling" else toy_verifiers()[:2]
    trainer = train_mrtpo(
        tmp_path, reward_funcs=funcs, max_steps=1, mrtpo_warmup_steps=0, mrtpo_beta=1.0
    )
    (batch,) = trainer.batches
    (logged,) = _logged_steps(trainer)
    if rewards == "cancelling":  # before, NaN: TRL's window mean logged None
        assert logged["mrtpo/reallocation_ratio"] == float("inf")
    mask = batch["completion_mask"].float()
    gdpo = advantages.gdpo(batch["rewards"], 4).unsqueeze(1) * mask
    moved = (batch["advantages"] - gdpo) * mask
    moved_rms = float(moved.square().sum() / mask.sum()) ** 0.5
    gdpo_rms = float(gdpo.square().sum() / mask.sum()) ** 0.5
    assert logged["mrtpo/reallocation_rms"] == pytest.approx(moved_rms, rel=1e-5)
    assert logged["mrtpo/gdpo_advantage_rms"] == pytest.approx(gdpo_rms, rel=1e-5, abs=1e-9)
    assert moved_rms > 0.01
    jsonl = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    (line,) = [entry for entry in jsonl if "loss" in entry]
    assert line["mrtpo/reallocation_rms"] == pytest.approx(moved_rms, rel=1e-5)
    if rewards == "cancelling":
        assert gdpo_rms == 0.0  # S = 0 on every row
        assert line["mrtpo/reallocation_ratio"] is None  # JSON has no infinity: the parts tell
        assert line["mrtpo/gdpo_advantage_rms"] == 0.0
    else:
        assert logged["mrtpo/reallocation_ratio"] == pytest.approx(moved_rms / gdpo_rms, rel=1e-5)


def test_reallocation_ratio_by_hand():
    from mrtpo.trainer_metrics import reallocation_ratio

    assert reallocation_ratio(4.0, 1.0) == 2.0
    assert reallocation_ratio(0.0, 1.0) == 0.0
    assert reallocation_ratio(1e-3, 0.0) == float("inf")
    assert np.isnan(reallocation_ratio(0.0, 0.0))  # nothing to move and nothing moved


def constant_reward(prompts, completions, **columns):
    """A reward no completion can change, as a format never produced scores 0."""
    return [0.0] * len(completions)


def _silence_warnings(caplog) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "mrtpo.trainer"
        and "no group's rewards have varied" in record.getMessage()
    ]


def test_a_run_whose_rewards_never_vary_warns_once_at_the_third_batch(tmp_path, caplog):
    caplog.set_level("WARNING", logger="mrtpo.trainer")
    short = train_mrtpo(tmp_path / "short", reward_funcs=[constant_reward], max_steps=2)
    assert _silence_warnings(caplog) == []

    trainer = train_mrtpo(tmp_path / "long", reward_funcs=[constant_reward], max_steps=4)
    (warning,) = _silence_warnings(caplog)  # once, not again at the fourth batch
    assert "first 3 generation batches" in warning and "constant_reward 0.00" in warning
    assert "mrtpo sft --task" in warning and "output format" in warning
    assert mrtpo.trainer_metrics.SILENT_BATCHES_BEFORE_WARNING == 3
    assert [step["mrtpo/varying_groups"] for step in _logged_steps(short)] == [0.0] * 2
    assert [step["mrtpo/varying_groups"] for step in _logged_steps(trainer)] == [0.0] * 4


def test_varying_groups_are_logged_and_a_run_that_varies_is_not_warned(tmp_path, caplog):
    caplog.set_level("WARNING", logger="mrtpo.trainer")
    trainer = train_mrtpo(tmp_path, reward_funcs=[constant_reward, EvenLength()], max_steps=3)
    assert _silence_warnings(caplog) == []
    shares = [step["mrtpo/varying_groups"] for step in _logged_steps(trainer)]
    expected = []
    for batch in trainer.batches:  # EvenLength varies in a group unless all 4 lengths agree
        lengths = batch["rewards"][:, 1].view(-1, 4)
        expected.append(float((lengths.amax(1) > lengths.amin(1)).float().mean()))
    assert shares == pytest.approx(expected) and max(expected) > 0


def test_varying_groups_by_hand():
    from mrtpo.trainer_metrics import varying_groups

    nan = float("nan")
    rewards = torch.tensor(
        [
            [1.0, 0.0], [1.0, 0.0],  # group 0: both rewards flat
            [1.0, 0.0], [1.0, 1.0],  # group 1: the second reward varies
            [nan, 0.0], [0.5, 0.0],  # group 2: one score of the first, the second flat
            [nan, 2.0], [nan, 2.0],  # group 3: the first unscored, the second flat
        ]
    )  # fmt: skip
    assert varying_groups(rewards, 2).tolist() == [False, True, False, False]


def test_the_console_says_why_a_run_cannot_learn(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """`mrtpo train --task tool_calling` on a model that never writes a tool call: the warning
    is a line of its own on the console, and each step's line shows 0% of groups varying."""
    from mrtpo import cli
    from mrtpo.training import step_summary

    # pytest's log capture sits on the root logger; a user's run has no handler there.
    monkeypatch.setattr(logging.getLogger("mrtpo"), "propagate", False)
    code = cli.main(
        ["train", "--task", "tool_calling", "--model_name_or_path", str(tiny_model_dir),
         "--output_dir", str(tmp_path / "run"), "--max_steps", "3", "--max_completion_length",
         "4", "--num_generations", "2", "--per_device_train_batch_size", "4",
         "--max_train_examples", "8", "--save_strategy", "no"]
    )  # fmt: skip
    stdout = capsys.readouterr().out
    assert code == 0
    summaries = [line for line in stdout.splitlines() if line.startswith("step ")]
    assert len(summaries) == 3 and all("| varying groups 0% |" in line for line in summaries)
    warnings = [line for line in stdout.splitlines() if line.startswith("warning: no group's")]
    assert len(warnings) == 1 and "tool_format 0.00" in warnings[0], stdout
    assert "varying groups 50%" in step_summary(
        {"rewards/a/mean": 1.0, "mrtpo/varying_groups": 0.5}, 1, 2
    )


def test_the_metrics_mixin_declares_what_it_needs_from_the_trainer(tmp_path):
    """As the other mixins (the test above): `MetricsMixin` uses on `self` only its own and what
    its class body declares, declares nothing it does not use, and a trainer has it all."""
    from mrtpo.trainer_metrics import MetricsMixin

    test_each_mixin_declares_what_it_needs_from_the_trainer(tmp_path, MetricsMixin)
