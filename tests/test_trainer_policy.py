"""MRTPOTrainer against TRL's own options: tool calling's trained-token mask, the sign-based
loss options (off-policy mask, VESPO, SAPO), and no replay while beta stays 0."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_trainer import COMMON
from trainer_toys import toy_trainer
from trl.chat_template_utils import qwen2_5_chat_template

import mrtpo.relevance
from mrtpo import advantages
from mrtpo.testing import tiny_model_and_tokenizer
from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Recording(MRTPOTrainer):
    """Keeps each generation batch's output, scored batch and token advantages."""

    def __init__(self, *args, **kwargs):
        self.steps: list[dict] = []
        super().__init__(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self.steps.append({"output": dict(output), "scored": self._scored})
        return output

    def _token_advantages(self, scored, step, group_size, width):
        token = super()._token_advantages(scored, step, group_size, width)
        self.steps_token = token
        return token


def _train(tmp_path: Path, trainer_class=Recording, tokenizer_template=None, **overrides):
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    if tokenizer_template is not None:
        tokenizer.chat_template = tokenizer_template
    tools = overrides.pop("tools", None)
    settings = {**COMMON, "mrtpo_warmup_steps": 0, **overrides}
    args = MRTPOConfig(output_dir=str(tmp_path / "run"), **settings)
    trainer = toy_trainer(trainer_class, model, tokenizer, args, tools=tools)
    trainer.train()
    return trainer


# ---------------------------------------------------------------------- tool calling


def lookup(word: str) -> str:
    """Look up a word in the dictionary.

    Args:
        word: The word to look up.
    """
    return f"{word}: a noun."


TOOL_CALL = '<tool_call>\n{"name": "lookup", "arguments": {"word": "apple"}}\n</tool_call>'


class ScriptedToolCalls(Recording):
    """The first turn of every other row is a call of `lookup` (the tiny model cannot write
    one); TRL's own tool loop then runs the tool, appends its output (tool_mask 0) and lets the
    model continue."""

    def _generate_single_turn(
        self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False
    ):
        if num_generations == 1:  # TRL's tool loop: the model's own continuation
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        tokenizer = self.processing_class
        end = [tokenizer.eos_token_id]
        call = tokenizer(TOOL_CALL, add_special_tokens=False)["input_ids"] + end
        plain = tokenizer("A line about it.", add_special_tokens=False)["input_ids"] + end
        return [call if i % 2 == 0 else plain for i in range(len(prompt_ids))], None


def test_tool_outputs_get_no_credit_and_trained_tokens_keep_gdpos_mean(tmp_path):
    trainer = _train(
        tmp_path,
        ScriptedToolCalls,
        tokenizer_template=qwen2_5_chat_template,  # TRL parses its tool calls
        tools=[lookup],
        max_completion_length=160,
        max_steps=1,
        mrtpo_beta=1.0,
    )
    (step,) = trainer.steps
    output, scored = step["output"], step["scored"]
    tool_mask = output["tool_mask"].float()
    completion_mask = output["completion_mask"].float()
    assert ((tool_mask == 0) & (completion_mask == 1)).any(), "no tool output in the batch"
    trained = completion_mask * tool_mask
    per_token = output["advantages"]
    assert per_token.dim() == 2
    assert per_token[trained == 0].abs().max() == 0  # no credit on tool outputs (nor padding)
    gdpo = advantages.gdpo(scored.rewards, 4, trainer.reward_weights)[scored.local]
    token_mean = (per_token * trained).sum(-1) / trained.sum(-1)
    torch.testing.assert_close(token_mean, gdpo, atol=1e-5, rtol=1e-5)
    assert (per_token.std(-1) > 1e-4).any()  # the credit did move among the tokens
    weights = trainer.steps_token.relevance  # (B, K, T)
    weight_mean = (weights * trained.unsqueeze(1)).sum(-1) / trained.sum(-1).unsqueeze(1)
    torch.testing.assert_close(weight_mean, torch.ones_like(weight_mean), atol=1e-5, rtol=0)


# ---------------------------------------------------------------------- sign-based options


def _mixed_signs() -> tuple[torch.Tensor, torch.Tensor]:
    """Row 0: a positive response with one negative token; row 1: a negative response with a
    positive token; row 2: padding past its second token."""
    per_token = torch.tensor(
        [[2.0, -0.5, 1.5, 1.0], [-2.0, 0.5, -1.5, -1.0], [1.0, -3.0, 7.0, 7.0]]
    )
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]])
    return per_token, mask


def test_off_policy_mask_keeps_or_drops_whole_responses_by_their_advantage():
    per_token, mask = _mixed_signs()
    far = torch.zeros_like(per_token)  # sampling log-probs far from the policy's: KL = 2
    kept = MRTPOTrainer.get_off_policy_mask(
        advantages=per_token,
        per_token_logps=far - 2.0,
        sampling_per_token_logps=far,
        mask=mask,
        off_policy_threshold=0.5,
    )
    assert kept.shape == (3, 1)
    assert kept.flatten().tolist() == [1.0, 0.0, 0.0]  # row 2's trained mean is -1


def test_vespo_weights_are_per_response_by_its_advantage():
    per_token, mask = _mixed_signs()
    log_ratio = torch.full_like(per_token, 0.1) * mask
    weights = MRTPOTrainer.get_gamma_weights(
        advantages=per_token,
        log_ratio_per_token=log_ratio,
        mask=mask,
        importance_sampling_ratio=None,
    )
    assert weights.shape == (3, 1)
    response = torch.tensor([[1.0], [-1.0], [-1.0]])
    from trl import GRPOTrainer

    expected = GRPOTrainer.get_gamma_weights(
        advantages=response,
        log_ratio_per_token=log_ratio,
        mask=mask,
        importance_sampling_ratio=None,
    )
    torch.testing.assert_close(weights, expected)


@pytest.mark.parametrize(
    "options",
    [
        {"off_policy_mask_threshold": 0.1},
        {"loss_type": "vespo"},
        {"loss_type": "sapo"},
        {"loss_type": "vespo", "off_policy_mask_threshold": 0.1, "num_iterations": 2},
    ],
)
def test_sign_based_options_train_with_per_token_advantages(tmp_path, options):
    trainer = _train(tmp_path, mrtpo_beta=1.0, **options)
    assert trainer.state.global_step == 2
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    assert all(step["output"]["advantages"].dim() == 2 for step in trainer.steps)


# ---------------------------------------------------------------------- beta 0


def _count_replays(monkeypatch) -> list[int]:
    rows: list[int] = []
    real = mrtpo.relevance.replay_distances

    def counting(model, tokenizer, prompts, *args, **kwargs):
        rows.append(len(prompts))
        return real(model, tokenizer, prompts, *args, **kwargs)

    monkeypatch.setattr(mrtpo.relevance, "replay_distances", counting)
    return rows


def test_no_replay_while_beta_is_zero_but_credit_maps_still_replay(tmp_path, monkeypatch):
    replayed = _count_replays(monkeypatch)
    trainer = _train(tmp_path, mrtpo_beta=0.0, credit_map_steps=1)
    # Two steps, beta 0: only the credit maps' rows (lowest and highest) were replayed.
    assert replayed == [2, 2]
    for step in trainer.steps:
        scored = step["scored"]
        gdpo = advantages.gdpo(scored.rewards, 4, trainer.reward_weights)[scored.local]
        mask = step["output"]["completion_mask"].float()
        torch.testing.assert_close(step["output"]["advantages"], gdpo[:, None] * mask)
    assert len(list((Path(trainer.args.output_dir) / "credit").glob("step-*.html"))) == 2


def test_warm_up_skips_the_replay_only_while_beta_is_zero(tmp_path, monkeypatch):
    replayed = _count_replays(monkeypatch)
    _train(tmp_path, mrtpo_warmup_steps=2)  # beta 0 at step 0, > 0 at step 1
    assert len(replayed) == 1 and replayed[0] > 0
    replayed.clear()
    # One generation batch serving both optimizer steps: step 1's beta needs the distances.
    _train(
        tmp_path / "accumulated",
        mrtpo_warmup_steps=2,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        steps_per_generation=2,
        num_iterations=1,
    )
    assert len(replayed) == 1
