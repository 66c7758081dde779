"""The entropy control (`token_relevance="entropy"`) and `mrtpo/reallocation_ratio`, on the tiny
model: token weights from the policy's own next-token entropy against an independent forward,
no replay; the logged ratio against the advantages the loss got."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from trainer_toys import CPU_RUN, ContainsLetter, EvenLength, toy_dataset

from mrtpo import advantages
from mrtpo.step_data import ScoredBatch
from mrtpo.testing import tiny_model_and_tokenizer
from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

COMMON = dict(
    **CPU_RUN,
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=10,
    max_steps=2,
    learning_rate=1e-3,
    mrtpo_warmup_steps=0,
)


class Recording(MRTPOTrainer):
    """Keeps each generation batch, the weights it was generated with, and counts replays."""

    def __init__(self, *args, **kwargs):
        self.batches: list[dict] = []
        self.replays = 0
        super().__init__(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        weights = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        output = super()._generate_and_score_completions(inputs)
        self.batches.append({"output": output, "rewards": self._scored.rewards, "weights": weights})
        return output

    def _replay(self, *args, **kwargs):
        self.replays += 1
        return super()._replay(*args, **kwargs)


def _train(tmp_path: Path, **overrides) -> Recording:
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    args = MRTPOConfig(output_dir=str(tmp_path / "run"), **{**COMMON, **overrides})
    trainer = Recording(
        model=model,
        reward_funcs=[ContainsLetter(), EvenLength()],
        args=args,
        train_dataset=toy_dataset(),
        processing_class=tokenizer,
    )
    trainer.train()
    return trainer


def _entropies(model, output) -> torch.Tensor:
    """(B, T) next-token entropy of each response token, by a plain per-row forward."""
    rows = []
    width = output["completion_ids"].shape[1]
    for i in range(output["prompt_ids"].shape[0]):
        prompt = output["prompt_ids"][i][output["prompt_mask"][i].bool()]
        ids = torch.cat([prompt, output["completion_ids"][i]]).unsqueeze(0)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        logp = torch.log_softmax(logits, dim=-1)
        rows.append(-(logp.exp() * logp).sum(-1)[:width])
    return torch.stack(rows)


def _logged(trainer) -> list[dict]:
    path = Path(trainer.args.output_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if '"loss"' in line]


def test_entropy_control_weights_tokens_by_the_policys_entropy_without_replay(tmp_path):
    trainer = _train(tmp_path, token_relevance="entropy", mrtpo_beta=1.0)
    assert trainer.replays == 0  # no verifier information is replayed
    checked = 0
    model, _ = tiny_model_and_tokenizer(seed=0)
    for batch in trainer.batches:
        model.load_state_dict(batch["weights"])
        output, rewards = batch["output"], batch["rewards"]
        mask = output["completion_mask"].float()
        entropy = _entropies(model, output) * mask
        # beta 1: w_t = H_t / mean_t H_t, the same for every reward: A_t = (w_t S - mean S) / sd.
        weights = entropy / (entropy.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True))
        normalized = torch.nan_to_num(advantages.per_reward(rewards, 4))
        summed = normalized.sum(-1)
        varying = (normalized != 0).any(-1)
        assert not advantages.bounded_rows(rewards, 4).any()
        expected = (weights * summed.unsqueeze(1) - summed.mean()) / (summed.std() + 1e-4)
        expected = torch.where(
            varying.unsqueeze(1), expected, advantages.gdpo(rewards, 4).unsqueeze(1)
        )
        got = output["advantages"]
        torch.testing.assert_close(got * mask, expected * mask, rtol=1e-4, atol=1e-5)
        checked += int(varying.sum())
    assert checked > 0
    for line in _logged(trainer):
        assert line["mrtpo/replay_seconds"] > 0  # the entropy forward's time
        assert line["mrtpo/reallocation_ratio"] > 0


def _dropout_batch(tokenizer, completions: list[str]) -> tuple[ScoredBatch, dict]:
    """One group of `completions` to a toy prompt: the scored batch and TRL's padded tensors
    (prompt left-padded, completions right-padded)."""
    prompt = toy_dataset()[0]["prompt"]
    prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True)
    prompt_ids = list(getattr(prompt_ids, "input_ids", prompt_ids))
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in completions]
    width = max(len(row) for row in ids)
    rows = len(ids)
    output = {
        "prompt_ids": torch.tensor([prompt_ids] * rows),
        "prompt_mask": torch.ones(rows, len(prompt_ids), dtype=torch.long),
        "completion_ids": torch.tensor(
            [row + [tokenizer.pad_token_id] * (width - len(row)) for row in ids]
        ),
        "completion_mask": torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids]),
    }
    scored = ScoredBatch(
        prompts=[prompt] * rows,
        completions=completions,
        completion_ids=ids,
        rewards=torch.zeros(rows, 2),
        verdicts=[None, None],
        local=slice(0, rows),
    )
    return scored, output


@pytest.mark.parametrize("share_prompt", [True, False])
def test_entropy_control_runs_the_policy_in_eval_mode(tmp_path, share_prompt):
    """The entropy forward runs as the replay's do, in eval mode: with dropout in the model,
    its distances are an eval-mode forward's entropies (not a train-mode draw), and the model
    is left in the mode it was in."""
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    with torch.no_grad():  # sharper next-token distributions than the random model's uniform
        model.model.norm.weight.mul_(8.0)
    args = MRTPOConfig(
        output_dir=str(tmp_path / "run"),
        **{**COMMON, "token_relevance": "entropy", "share_prompt": share_prompt},
    )
    trainer = MRTPOTrainer(
        model=model,
        reward_funcs=[ContainsLetter(), EvenLength()],
        args=args,
        train_dataset=toy_dataset(),
        processing_class=tokenizer,
    )
    completions = [" An apple a day.", " apple", " Red apples fall in autumn.", " The apple"]
    scored, output = _dropout_batch(tokenizer, completions)
    wanted = torch.tensor([[True, True], [True, False], [False, True], [True, True]])
    model.train()
    torch.manual_seed(0)
    result = trainer._entropy_distances(scored, output, [0, 1, 2, 3], wanted)
    assert model.training
    mask = output["completion_mask"].float()
    model.eval()
    in_eval = _entropies(model, output) * mask
    model.train()
    torch.manual_seed(0)
    in_train = _entropies(model, output) * mask
    # dropout moves the entropies far beyond the tolerance: the comparison tells them apart
    assert (in_train - in_eval).abs().max() > 0.1
    expected = in_eval.unsqueeze(1) * wanted.unsqueeze(-1)
    torch.testing.assert_close(result.distance, expected, rtol=0, atol=1e-4)
    assert result.rows == [0, 1, 2, 3] and torch.equal(result.mask, mask)


def test_entropy_control_refuses_the_placebo(tmp_path):
    with pytest.raises(ValueError, match="token_relevance"):
        MRTPOConfig(
            output_dir=str(tmp_path), use_cpu=True, token_relevance="entropy",
            replay_information="placebo",
        )  # fmt: skip
    with pytest.raises(ValueError, match="token_relevance"):
        MRTPOConfig(output_dir=str(tmp_path), use_cpu=True, token_relevance="uncertainty")


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_reallocation_ratio_is_what_mrtpo_moves_over_gdpos_part(tmp_path, beta):
    trainer = _train(tmp_path, mrtpo_beta=beta)
    lines = _logged(trainer)
    assert len(lines) == len(trainer.batches) == 2
    for line, batch in zip(lines, trainer.batches, strict=True):
        output, rewards = batch["output"], batch["rewards"]
        mask = output["completion_mask"].float()
        gdpo = advantages.gdpo(rewards, 4).unsqueeze(1) * mask
        moved = (output["advantages"] - gdpo) * mask
        expected = math.sqrt(float(moved.square().sum() / gdpo.square().sum()))
        assert line["mrtpo/reallocation_ratio"] == pytest.approx(expected, rel=1e-5, abs=1e-7)
        if beta == 0.0:
            assert line["mrtpo/reallocation_ratio"] == pytest.approx(0.0, abs=1e-6)
        else:
            assert line["mrtpo/reallocation_ratio"] > 0.01
