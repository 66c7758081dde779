"""Contrastive relevance (`token_relevance="contrastive"`) and the generic-context control
(`replay_information="generic"`) in the trainer, on the tiny model: the contrastive per-token
advantages against an independent computation (the own and the placebo's distances by
`replay_distances`, subtracted and clamped, then `advantages.mrtpo`), and training steps with
warm-up, credit maps and the shared prompt on and off."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fsdp_replay_toys import COMPLETIONS, WORDS
from trainer_toys import CPU_RUN, toy_trainer

import mrtpo.relevance
import mrtpo.relevance.replay
from mrtpo import advantages
from mrtpo.advantages import EPS
from mrtpo.relevance import controls, replay_distances
from mrtpo.step_data import ScoredBatch, StepAdvantages
from mrtpo.testing import tiny_model_and_tokenizer
from mrtpo.trainer import MRTPOConfig, MRTPOTrainer
from mrtpo.verifiers import Verdict

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GROUP_SIZE = 4
COMMON = dict(
    **CPU_RUN,
    per_device_train_batch_size=8,  # two prompts of four completions: the placebo needs two
    num_generations=GROUP_SIZE,
    max_completion_length=10,
    learning_rate=1e-3,
)
# Each prompt's information for its three rewards (the placebo of one is the other's).
INFOS = (
    (
        "The response must contain the letter 'a'.",
        "The response must have an even number of characters.",
        "The response must start with a space.",
    ),
    (
        "The response must contain the letter 'r'.",
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
        "* first bullet\n* second bullet\n\n<<A Title>>",
    ),
)
# (8, 3): reward 2 constant in group 0 and reward 0 in group 1 (Ã_k = 0: not replayed there).
REWARDS = [[1, 0, 1], [0, 1, 1], [1, 1, 1], [0, 0, 1]] + [
    [1, 0, 1],
    [1, 1, 0],
    [1, 0, 0],
    [1, 1, 1],
]


def hand_batch(tokenizer) -> ScoredBatch:
    prompts = [
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"Write one line about the word {word}."},
        ]
        for word in WORDS
        for _ in range(GROUP_SIZE)
    ]
    rewards = torch.tensor(REWARDS, dtype=torch.float32)
    return ScoredBatch(
        prompts=prompts,
        completions=list(COMPLETIONS),
        completion_ids=[tokenizer.encode(text, add_special_tokens=False) for text in COMPLETIONS],
        rewards=rewards,
        verdicts=[
            [Verdict(rewards[row, k].item(), INFOS[row // GROUP_SIZE][k]) for row in range(8)]
            for k in range(3)
        ],
        local=slice(0, 8),
    )


def trainer_on(tmp_path: Path, model, tokenizer, **overrides) -> MRTPOTrainer:
    args = MRTPOConfig(output_dir=str(tmp_path / "run"), **{**COMMON, **overrides})
    return toy_trainer(MRTPOTrainer, model, tokenizer, args)


def trained(tmp_path: Path, **overrides) -> tuple[MRTPOTrainer, object]:
    """(a trainer after two steps on the tiny model with `overrides`, its tokenizer)."""
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    trainer = trainer_on(tmp_path, model, tokenizer, max_steps=2, **overrides)
    trainer.train()
    assert trainer.state.global_step == 2
    return trainer, tokenizer


@pytest.mark.parametrize("replay_mode", ["leave_one_out", "add_one"])
def test_contrastive_advantages_equal_own_minus_placebo_distances_clamped(tmp_path, replay_mode):
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    with torch.no_grad():  # sharper next-token distributions than the random model's uniform
        model.model.norm.weight.mul_(3.0)
    trainer = trainer_on(
        tmp_path,
        model,
        tokenizer,
        token_relevance="contrastive",
        replay_mode=replay_mode,
        mrtpo_beta=1.0,
        mrtpo_warmup_steps=0,
    )
    scored = hand_batch(tokenizer)
    normalized = torch.nan_to_num(advantages.per_reward(scored.rewards, GROUP_SIZE, eps=EPS))
    step = StepAdvantages(
        trainer.reward_weights,
        advantages.gdpo(scored.rewards, GROUP_SIZE, eps=EPS),
        per_reward=normalized,
        token=None,
    )
    width = max(len(ids) for ids in scored.completion_ids)
    output = {"completion_ids": torch.zeros(8, width, dtype=torch.long)}
    token = trainer._token_advantages(scored, step, GROUP_SIZE, output)

    # Independently: the two replays apart; with two prompts, each row's placebo is the other
    # prompt's row's information, at the same position.
    wanted = normalized != 0
    assert not wanted[:4, 2].any() and not wanted[4:, 0].any() and wanted.sum() == 16
    own_infos = [list(INFOS[row // GROUP_SIZE]) for row in range(8)]
    placebo_infos = [list(INFOS[1 - row // GROUP_SIZE]) for row in range(8)]
    common = dict(mode=replay_mode, wanted=wanted)
    own, mask = replay_distances(
        model, tokenizer, scored.prompts, scored.completion_ids, own_infos, **common
    )
    placebo, _ = replay_distances(
        model, tokenizer, scored.prompts, scored.completion_ids, placebo_infos, **common
    )
    difference = own - placebo
    signs = [
        (bool(row_pair.min() < -1e-4), bool(row_pair.max() > 1e-4))
        for row, k in wanted.nonzero().tolist()
        for row_pair in [difference[row, k, mask[row].bool()]]
    ]
    assert (True, False) in signs  # a reward the placebo moves more at every token: all 0
    assert (False, True) in signs  # one the own information moves more at every token
    if replay_mode == "add_one":
        assert (True, True) in signs  # and the clamp cuts inside a response
    with pytest.raises(ValueError, match="distance must be finite and >= 0"):
        advantages.mrtpo(scored.rewards, GROUP_SIZE, difference, mask, 1.0)  # why the clamp
    contrasted = difference.clamp(min=0.0)
    assert token.replay.rows == list(range(8))
    torch.testing.assert_close(token.replay.placebo_distance, placebo, rtol=0, atol=1e-5)
    torch.testing.assert_close(token.replay.distance, contrasted, rtol=0, atol=1e-5)
    expected = advantages.mrtpo(scored.rewards, GROUP_SIZE, contrasted, mask, 1.0, eps=EPS)
    # The weights divide by each pair's mean contrast (a few 1e-3): float32 rounding of the
    # two replays' distances (1e-7 apart) moves advantages of up to 6 by about 1e-4.
    torch.testing.assert_close(token.advantages * mask, expected * mask, rtol=1e-4, atol=1e-4)
    own_advantages = advantages.mrtpo(scored.rewards, GROUP_SIZE, own, mask, 1.0, eps=EPS)
    assert ((token.advantages - own_advantages) * mask).abs().max() > 0.1  # not the own's


def recording_replays(monkeypatch) -> list[dict]:
    """Each call of `replay_distances` the trainer makes: its prompts, ids and infos."""
    calls: list[dict] = []
    real = mrtpo.relevance.replay_distances

    def recording(model, tokenizer, prompts, completion_ids, infos, **options):
        calls.append({"prompts": list(prompts), "ids": list(completion_ids), "infos": list(infos)})
        return real(model, tokenizer, prompts, completion_ids, infos, **options)

    monkeypatch.setattr(mrtpo.relevance, "replay_distances", recording)
    # contrastive_replay_distances calls it from its own module
    monkeypatch.setattr(mrtpo.relevance.replay, "replay_distances", recording)
    return calls


def own_infos(prompt) -> list[str]:
    """The toy verifiers' information for a toy prompt (as `trainer_toys` writes it)."""
    content = prompt[-1]["content"]
    letter = content.split()[-1][0]
    space = "Not checked for this prompt." if "stone" in content else None
    return [
        f"The response must contain the letter {letter!r}.",
        "The response must have an even number of characters.",
        space or "The response must start with a space.",
    ]


@pytest.mark.parametrize("share_prompt", [True, False])
def test_contrastive_trains_through_warm_up_and_credit_maps(tmp_path, monkeypatch, share_prompt):
    calls = recording_replays(monkeypatch)
    trainer, _ = trained(
        tmp_path,
        token_relevance="contrastive",
        share_prompt=share_prompt,
        mrtpo_warmup_steps=2,  # beta 0 at step 0: only the credit maps replay there
        credit_map_steps=1,
    )
    for step in (0, 1):
        assert (Path(trainer.args.output_dir) / "credit" / f"step-{step:05d}.html").exists()
    # Step 0 (beta 0): only the credit maps' two rows; step 1: every row whose rewards vary.
    assert len(calls) == 2 and len(calls[0]["prompts"]) == 2 * 2
    for call in calls:
        rows = len(call["prompts"]) // 2  # each row twice: own, then the placebo's
        assert call["prompts"][:rows] == call["prompts"][rows:]
        assert call["ids"][:rows] == call["ids"][rows:]
        for prompt, own, placebo in zip(
            call["prompts"][:rows], call["infos"][:rows], call["infos"][rows:], strict=True
        ):
            assert own == own_infos(prompt)
            assert placebo[0] != own[0]  # another prompt's letter
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logged[-1]["mrtpo/beta"] > 0 and logged[-1]["mrtpo/replay_seconds"] > 0


def test_generic_control_replays_one_text_at_each_own_texts_token_length(tmp_path, monkeypatch):
    calls = recording_replays(monkeypatch)
    _, tokenizer = trained(
        tmp_path, replay_information="generic", mrtpo_beta=1.0, mrtpo_warmup_steps=0
    )
    assert len(calls) == 2

    def length(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    texts: dict[int, str] = {}
    for call in calls:
        for prompt, infos in zip(call["prompts"], call["infos"], strict=True):
            own = own_infos(prompt)
            assert [length(text) for text in infos] == [length(text) for text in own]
            for text in infos:
                assert texts.setdefault(length(text), text) == text  # one text per length
                assert text not in own
    ordered = [texts[size] for size in sorted(texts)]
    assert len(ordered) >= 2 and ordered[-1].startswith("The morning was quiet")
    assert all(
        longer.startswith(shorter) for shorter, longer in zip(ordered, ordered[1:], strict=False)
    )


@pytest.mark.parametrize("information", ["placebo", "generic"])
def test_contrastive_refuses_other_information(tmp_path, information):
    with pytest.raises(ValueError, match=f"replay_information='{information}'.*leave it at 'own'"):
        MRTPOConfig(
            output_dir=str(tmp_path), use_cpu=True, token_relevance="contrastive",
            replay_information=information,
        )  # fmt: skip
    with pytest.raises(ValueError, match="token_relevance='entropy' replays nothing"):
        MRTPOConfig(
            output_dir=str(tmp_path), use_cpu=True, token_relevance="entropy",
            replay_information="generic",
        )  # fmt: skip


def test_trainer_draws_the_placebo_of_the_pure_function(tmp_path, monkeypatch):
    """The trainer's placebo is `controls.placebo_infos` of the gathered batch at its seed and
    step, its own rows cut out (the second process's half here), partners' empty slots filled."""
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    trainer = trainer_on(tmp_path, model, tokenizer, replay_information="placebo", seed=5)
    everything = [
        ["f", "x0", ""],
        ["f", "x1", ""],
        ["f", "", "y2"],
        ["f", "", "y3"],
        ["f", "z4", "w4"],
        ["f", "z5", "w5"],
    ]
    monkeypatch.setattr(mrtpo.trainer, "gather_object", lambda own: everything)
    monkeypatch.setattr(trainer, "num_generations", 2)
    local = slice(2, 4)
    scored = ScoredBatch(
        prompts=[None] * 2,
        completions=[""] * 2,
        completion_ids=[[1]] * 2,
        rewards=torch.zeros(6, 3),
        verdicts=[[Verdict(1.0, everything[row][k]) for row in range(2, 4)] for k in range(3)],
        local=local,
    )
    for step in (0, 3):
        trainer.state.global_step = step
        got = trainer._replay_infos(scored, "placebo")
        assert got == controls.placebo_infos(everything, 2, 5, step)[local]
        for own, drawn in zip(everything[local], got, strict=True):
            assert [bool(text) for text in drawn] == [bool(text) for text in own]


def test_contrastive_replay_is_two_replays_in_one_call(tiny):
    model, tokenizer = tiny
    scored = hand_batch(tokenizer)
    own = [list(INFOS[row // GROUP_SIZE]) for row in range(8)]
    placebo = own[GROUP_SIZE:] + own[:GROUP_SIZE]
    wanted = [[row % 2 == 0, True, row < 6] for row in range(8)]  # lists, as the API allows
    args = (model, tokenizer, scored.prompts, scored.completion_ids)
    distance, placebo_distance, mask = mrtpo.relevance.contrastive_replay_distances(
        *args, own, placebo, wanted=wanted, mode="add_one"
    )
    own_alone, own_mask = replay_distances(*args, own, wanted=wanted, mode="add_one")
    placebo_alone, _ = replay_distances(*args, placebo, wanted=wanted, mode="add_one")
    torch.testing.assert_close(placebo_distance, placebo_alone, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        distance, (own_alone - placebo_alone).clamp(min=0), rtol=0, atol=1e-6
    )
    assert torch.equal(mask, own_mask) and distance.max() > 1e-3
    assert not distance[1::2, 0].any() and not placebo_distance[6:, 2].any()  # not wanted
    with pytest.raises(ValueError, match="placebo_infos has 7 rows, infos has 8"):
        mrtpo.relevance.contrastive_replay_distances(*args, own, placebo[:7])
