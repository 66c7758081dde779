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

    def _token_advantages(self, scored, step, group_size, output):
        token = super()._token_advantages(scored, step, group_size, output)
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


def _loss_by_hand(trainer, inputs, per_token_logps, sign_by) -> torch.Tensor:
    """TRL 1.16's `_compute_loss` for one micro-batch, by hand (no KL term, no entropy terms, no
    vLLM, one process, one micro-batch per generation batch).

    With r_t = exp(logp_t - old_t), A_t the (B, T) advantages, m_t the trained tokens and s the
    advantage whose sign decides (sign_by "response": each response's token mean of A_t over m,
    (B, 1); "token": A_t itself):
    - loss terms: dapo -min(r A, clip(r, 1 - eps, 1 + eps) A); vespo -phi(w) A logp, with the
      sequence ratio w = exp(sum_t m (logp - old)) and phi(w) = exp(l + k log w - l w), (k, l)
      TRL's positive pair where s >= 0, its negative pair elsewhere; sapo
      -sigmoid(tau (r - 1)) 4 / tau A, tau TRL's positive temperature where s > 0.
    - off-policy mask: a term is kept where s >= 0 or its response's mean over m of
      (old - logp) is at most the threshold.
    - aggregation: dapo and vespo sum(terms m) / sum(m) (the generation batch's tokens: this
      micro-batch's); sapo the mean over responses of sum_t(terms m) / sum_t(m).
    """
    args = trainer.args
    mask = inputs["completion_mask"].float()
    per_token = inputs["advantages"]
    old = inputs.get("old_per_token_logps", per_token_logps)
    response = (per_token * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)
    sign = response if sign_by == "response" else per_token
    ratio = torch.exp(per_token_logps - old)
    if args.loss_type == "dapo":
        clipped = ratio.clamp(1 - args.epsilon, 1 + args.epsilon)
        terms = -torch.min(ratio * per_token, clipped * per_token)
    elif args.loss_type == "vespo":
        log_w = ((per_token_logps - old) * mask).sum(-1, keepdim=True)
        k = torch.where(sign >= 0, args.vespo_k_pos, args.vespo_k_neg)
        lam = torch.where(sign >= 0, args.vespo_lambda_pos, args.vespo_lambda_neg)
        phi = torch.exp(lam + k * log_w - lam * log_w.exp())
        terms = -phi * per_token * per_token_logps
    else:
        assert args.loss_type == "sapo"
        tau = torch.where(sign > 0, args.sapo_temperature_pos, args.sapo_temperature_neg)
        terms = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * per_token
    if args.off_policy_mask_threshold is not None:
        kl = ((old - per_token_logps) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)
        terms = terms * ((sign >= 0) | (kl <= args.off_policy_mask_threshold)).float()
    if args.loss_type == "sapo":
        return ((terms * mask).sum(-1) / mask.sum(-1)).mean()
    return (terms * mask).sum() / mask.sum()


class LossByHand(MRTPOTrainer):
    """Keeps, for every micro-batch, TRL's loss and the loss by hand with each sign choice."""

    def __init__(self, *args, **kwargs):
        self.losses: list[dict[str, torch.Tensor]] = []
        super().__init__(*args, **kwargs)

    def _compute_loss(self, model, inputs):
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        with torch.no_grad():
            logps = self._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, inputs["completion_ids"].shape[1]
            )[0]
        loss = super()._compute_loss(model, inputs)
        self.losses.append(
            {
                "trl": loss.detach(),
                "response": _loss_by_hand(self, inputs, logps, "response"),
                "token": _loss_by_hand(self, inputs, logps, "token"),
            }
        )
        return loss


def _staggered_replay(monkeypatch) -> None:
    """The replay, replaced: reward k's distance is 1 on every K-th response token from token
    k, 0 elsewhere. At beta 1 each token then carries one reward's advantage (times K), so a
    response whose rewards disagree in sign has tokens of both signs."""

    def staggered(model, tokenizer, prompts, completion_ids, infos, wanted=None, **options):
        lengths = torch.tensor([len(ids) for ids in completion_ids])
        positions, rewards = torch.arange(int(lengths.max())), torch.arange(len(infos[0]))
        mask = (positions < lengths[:, None]).float()
        distance = (positions % len(rewards) == rewards[:, None]).float() * mask[:, None]
        if wanted is not None:
            distance = distance * wanted[..., None]
        return distance, mask

    monkeypatch.setattr(mrtpo.relevance, "replay_distances", staggered)


@pytest.mark.parametrize(
    "options, sign_by",
    [
        # Threshold 0: on the second iteration (the policy has moved) the mask drops a
        # negative response whose probability fell, whatever the signs of its tokens.
        ({"off_policy_mask_threshold": 0.0}, "response"),
        ({"loss_type": "vespo"}, "response"),
        ({"loss_type": "vespo", "off_policy_mask_threshold": 0.0}, "response"),
        ({"loss_type": "sapo"}, "token"),  # token-level: each token's own A_t (see the trainer)
    ],
)
def test_sign_based_options_take_each_responses_advantage(tmp_path, monkeypatch, options, sign_by):
    _staggered_replay(monkeypatch)
    # Two iterations of one generation batch: the second runs off-policy (ratios not 1), where
    # the sign-based choices change the loss. A large step moves the policy clearly.
    trainer = _train(
        tmp_path,
        LossByHand,
        mrtpo_beta=1.0,
        num_iterations=2,
        learning_rate=1e-2,
        **options,
    )
    assert trainer.state.global_step == 2 and len(trainer.losses) == 2
    other = "token" if sign_by == "response" else "response"
    for step, losses in enumerate(trainer.losses):
        context = (
            f"micro-batch {step}: TRL's loss is not the loss with signs by {sign_by} "
            f"(with signs by {other} it would be {losses[other].item():.6g})"
        )
        torch.testing.assert_close(
            losses["trl"],
            losses[sign_by],
            rtol=1e-5,
            atol=1e-7,
            msg=lambda m, context=context: f"{context}: {m}",
        )
    # The signs of single tokens and of their responses differ where it matters: the check
    # tells the two choices apart.
    assert max((ls["response"] - ls["token"]).abs().item() for ls in trainer.losses) > 1e-3


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
