"""SAW weights (arXiv 2606.07705) against values computed by hand; the weighting registry;
SAW in place of c_k in GRPO, GDPO and MRTPO."""

from __future__ import annotations

import math

import pytest
import torch

from mrtpo.advantages import (
    SAW_EPS,
    WEIGHTINGS,
    coefficients_of_variation,
    gdpo,
    get_estimator,
    get_weighting,
    grpo,
    mrtpo,
    register_weighting,
    saw_weights,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NAN = float("nan")
SQRT3 = math.sqrt(3.0)

# Hand values used below (sample std, n - 1):
#   [1, 0, 1, 0]: mean 1/2, std sqrt(1/3), cv = 2/sqrt(3)
#   [1, 0, 0, 0]: mean 1/4, std 1/2,       cv = 2
# With K = 2 the weights are 2 * (2/sqrt(3), 2) / (2/sqrt(3) + 2) = (sqrt(3) - 1, 3 - sqrt(3)).
HALF_ONES = [1.0, 0.0, 1.0, 0.0]
ONE_IN_FOUR = [1.0, 0.0, 0.0, 0.0]


def columns(*cols: list[float]) -> torch.Tensor:
    return torch.tensor(cols, dtype=torch.float32).T.contiguous()


def test_coefficients_of_variation_by_hand():
    cv = coefficients_of_variation(columns(HALF_ONES, ONE_IN_FOUR))
    assert cv.tolist() == pytest.approx([2 / SQRT3, 2.0], rel=1e-6)


def test_weights_by_hand():
    weights = saw_weights(columns(HALF_ONES, ONE_IN_FOUR))
    assert weights.tolist() == pytest.approx([SQRT3 - 1, 3 - SQRT3], rel=1e-6)


def test_equal_coefficients_of_variation_give_equal_weights():
    # The second reward is the first times 3: same cv, so each gets K / 2 = 1.
    weights = saw_weights(columns(HALF_ONES, [3 * x for x in HALF_ONES]))
    assert weights.tolist() == pytest.approx([1.0, 1.0], rel=1e-6)
    three = saw_weights(columns(HALF_ONES, HALF_ONES, HALF_ONES))
    assert three.tolist() == pytest.approx([1.0, 1.0, 1.0], rel=1e-6)


def test_weights_sum_to_the_number_of_rewards():
    rewards = torch.rand(32, 3, generator=torch.Generator().manual_seed(0))
    assert saw_weights(rewards).sum().item() == pytest.approx(3.0, rel=1e-6)


def test_a_constant_reward_gets_weight_zero_and_the_others_share_k():
    weights = saw_weights(columns([1.0, 1.0, 1.0, 1.0], ONE_IN_FOUR))
    assert weights[0].item() == 0.0
    assert weights[1].item() == pytest.approx(2.0, rel=1e-6)


def test_when_no_reward_varies_every_weight_is_zero():
    weights = saw_weights(columns([1.0, 1.0, 1.0], [0.0, 0.0, 0.0]))
    assert weights.tolist() == [0.0, 0.0]


def test_a_zero_mean_reward_that_varies_takes_nearly_all_the_weight():
    # [-1, 1, -1, 1]: mean 0, std sqrt(4/3), so cv = sqrt(4/3) / 1e-8.
    rewards = columns([-1.0, 1.0, -1.0, 1.0], ONE_IN_FOUR)
    cv = coefficients_of_variation(rewards)
    assert cv[0].item() == pytest.approx(math.sqrt(4 / 3) / SAW_EPS, rel=1e-5)
    weights = saw_weights(rewards)
    assert weights[0].item() == pytest.approx(2.0, rel=1e-6)
    assert weights[1].item() == pytest.approx(2 * 2 / (math.sqrt(4 / 3) / SAW_EPS), rel=1e-4)


def test_shifting_a_negative_reward_by_its_lower_bound():
    # [-1, 1, -1, 1] + 1 = [0, 2, 0, 2]: mean 1, std 2/sqrt(3), cv = 2/sqrt(3), as HALF_ONES.
    weights = saw_weights(columns([-1.0, 1.0, -1.0, 1.0], ONE_IN_FOUR), shifts=[1.0, 0.0])
    assert weights.tolist() == pytest.approx([SQRT3 - 1, 3 - SQRT3], rel=1e-6)


def test_a_zero_reward_is_constant_not_zero_mean():
    weights = saw_weights(columns([0.0, 0.0, 0.0, 0.0], ONE_IN_FOUR))
    assert weights.tolist() == pytest.approx([0.0, 2.0], rel=1e-6)


def test_scale_invariance():
    rewards = torch.rand(24, 3, generator=torch.Generator().manual_seed(1)) + 0.1
    scaled = rewards.clone()
    scaled[:, 1] *= 7.5
    assert torch.allclose(saw_weights(scaled), saw_weights(rewards), rtol=1e-5, atol=0)


def test_nan_scores_are_left_out_of_a_rewards_statistics():
    # Without their NaN, the columns are HALF_ONES and ONE_IN_FOUR.
    rewards = columns([1.0, 0.0, NAN, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0, NAN])
    weights = saw_weights(rewards)
    assert weights.tolist() == pytest.approx([SQRT3 - 1, 3 - SQRT3], rel=1e-6)


def test_a_reward_with_fewer_than_two_scores_gets_weight_zero():
    one_score = saw_weights(columns(HALF_ONES, [NAN, NAN, 5.0, NAN]))
    no_score = saw_weights(columns(HALF_ONES, [NAN, NAN, NAN, NAN]))
    for weights in (one_score, no_score):
        assert not torch.isnan(weights).any()
        assert weights.tolist() == pytest.approx([2.0, 0.0], rel=1e-6)


def test_integer_rewards_are_accepted():
    weights = saw_weights(torch.tensor([[1, 1], [0, 0], [1, 0], [0, 0]]))
    assert weights.tolist() == pytest.approx([SQRT3 - 1, 3 - SQRT3], rel=1e-6)


@pytest.mark.parametrize(
    ("rewards", "kwargs", "message"),
    [
        (torch.ones(4), {}, "shape \\(N, K\\)"),
        (torch.ones(0, 2), {}, "at least one row"),
        ([[1.0, 2.0]], {}, "must be a torch.Tensor"),
        (torch.tensor([[1.0, float("inf")]]), {}, "inf"),
        (torch.ones(3, 2), {"eps": 0.0}, "eps must be > 0"),
        (torch.ones(3, 2), {"shifts": [1.0]}, "shifts must be 2 finite values"),
        (torch.ones(3, 2), {"shifts": [1.0, NAN]}, "shifts must be 2 finite values"),
    ],
)
def test_bad_arguments_say_what_was_wrong(rewards, kwargs, message):
    with pytest.raises(ValueError, match=message):
        saw_weights(rewards, **kwargs)


# ----------------------------------------------------------------------------- GDPO + SAW


def reference_gdpo_saw(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """GDPO with SAW in plain torch ops (no NaN): the weights multiply each reward's
    group-normalized advantage before the sum, and the sum is then normalized over the batch."""
    num_rewards = rewards.shape[1]
    mean = rewards.mean(dim=0)
    std = rewards.std(dim=0)
    cv = std / (mean.abs() + SAW_EPS)
    weights = num_rewards * cv / (cv.sum() + SAW_EPS)
    grouped = rewards.view(-1, group_size, num_rewards)
    normalized = (grouped - grouped.mean(dim=1, keepdim=True)) / (
        grouped.std(dim=1, keepdim=True) + eps
    )
    summed = (normalized.view(-1, num_rewards) * weights).sum(dim=1)
    return (summed - summed.mean()) / (summed.std() + eps)


def test_gdpo_with_saw_on_a_two_group_two_reward_batch():
    # Groups of 2. Reward 0 (format, mostly learned): [1, 0 | 1, 1]; reward 1 (correctness,
    # rare): [0, 1 | 0, 0]. cv = (0.5/0.75, 0.5/0.25) = (2/3, 2), so w = (0.5, 1.5).
    rewards = columns([1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0])
    assert saw_weights(rewards).tolist() == pytest.approx([0.5, 1.5], rel=1e-6)
    # Group 1: each reward's advantage is +-a with a = 0.5 / (sqrt(0.5) + eps); group 2: 0.
    # S = 0.5 * (a, -a, 0, 0) + 1.5 * (-a, a, 0, 0) = (-a, a, 0, 0); std_batch S = a sqrt(2/3).
    eps = 1e-4
    a = 0.5 / (math.sqrt(0.5) + eps)
    top = a / (a * math.sqrt(2 / 3) + eps)  # ~ sqrt(3/2)
    expected = [-top, top, 0.0, 0.0]
    assert reference_gdpo_saw(rewards, 2).tolist() == pytest.approx(expected, abs=1e-6)
    # The SAW weights in place of c_k in the GDPO estimator give the same advantages.
    assert gdpo(rewards, 2, weights=saw_weights(rewards)).tolist() == pytest.approx(
        expected, abs=1e-6
    )
    # With equal static weights the two rewards cancel here: SAW is what makes row 1 win.
    assert gdpo(rewards, 2).tolist() == pytest.approx([0.0] * 4, abs=1e-6)


# The batch above, by hand: w = (0.5, 1.5); in group 1 each reward's advantage is +-a.
FORMAT_AND_CORRECT = ([1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0])
A = 0.5 / (math.sqrt(0.5) + 1e-4)


def test_grpo_with_saw_on_a_two_group_two_reward_batch():
    rewards = columns(*FORMAT_AND_CORRECT)
    # R = 0.5 * format + 1.5 * correctness = [0.5, 1.5 | 0.5, 0.5]. Group 1: mean 1, std
    # sqrt(0.5), so (-a, a); group 2 is constant: 0.
    weights = saw_weights(rewards)
    assert grpo(rewards, 2, weights=weights).tolist() == pytest.approx([-A, A, 0, 0], abs=1e-5)
    # Static weights of 1 give R = 1 everywhere: no signal at all.
    assert grpo(rewards, 2).tolist() == pytest.approx([0.0] * 4, abs=1e-6)


def test_mrtpo_with_saw_keeps_the_token_mean_of_gdpo_with_saw():
    rewards = columns(*FORMAT_AND_CORRECT)
    weights = saw_weights(rewards)
    top = A / (A * math.sqrt(2 / 3) + 1e-4)  # GDPO + SAW's (-top, top, 0, 0), computed above
    # Three response tokens (the last row has two and a padding position); reward 0's distance
    # sits on token 0, reward 1's on token 2.
    distance = torch.tensor([[[0.6, 0.0, 0.0], [0.0, 0.0, 0.3]]]).expand(4, 2, 3).contiguous()
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]])
    per_token = mrtpo(rewards, 2, distance, mask, beta=1.0, weights=weights)
    # beta 1: w_{0,t} = (3, 0, 0), w_{1,t} = (0, 0, 3). Row 1: S-terms 0.5 * a and 1.5 * (-a),
    # so tokens (1.5 a, 0, -4.5 a) / std S, whose mean is -a / std S = -top.
    std = A * math.sqrt(2 / 3) + 1e-4
    assert per_token[0].tolist() == pytest.approx([1.5 * A / std, 0, -4.5 * A / std], abs=1e-4)
    token_mean = (per_token * mask).sum(-1) / mask.sum(-1)
    assert token_mean.tolist() == pytest.approx([-top, top, 0, 0], abs=1e-5)
    # And on random batches with NaN scores: MRTPO + SAW's token mean is GDPO + SAW's advantage.
    gen = torch.Generator().manual_seed(3)
    rewards = (torch.rand(12, 3, generator=gen) > 0.5).float()
    rewards[torch.rand(12, 3, generator=gen) < 0.15] = NAN
    weights = saw_weights(rewards)
    mask = (torch.rand(12, 7, generator=gen) > 0.2).long()
    mask[:, 0] = 1
    per_token = mrtpo(rewards, 4, torch.rand(12, 3, 7, generator=gen), mask, 0.7, weights=weights)
    token_mean = (per_token * mask).sum(-1) / mask.sum(-1)
    torch.testing.assert_close(token_mean, gdpo(rewards, 4, weights=weights), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- registry


def test_weighting_registry():
    assert list(WEIGHTINGS) == ["static", "saw"]
    assert [get_weighting(name).per_step for name in WEIGHTINGS] == [False, True]
    with pytest.raises(ValueError, match="'ema'.*static, saw"):
        get_weighting("ema")
    with pytest.raises(ValueError, match="already registered"):
        register_weighting("saw", per_step=True)(lambda rewards, weights, shifts: weights)


def test_registered_weightings_give_the_static_weights_or_saws():
    rewards = columns(HALF_ONES, ONE_IN_FOUR)
    static, saw = get_weighting("static"), get_weighting("saw")
    assert static(rewards).tolist() == [1.0, 1.0]
    assert static(rewards, [0.5, 2.0]).tolist() == [0.5, 2.0]
    assert torch.equal(saw(rewards), saw_weights(rewards))
    assert torch.equal(saw(rewards, torch.ones(2)), saw_weights(rewards))  # TRL's default c_k
    assert torch.equal(saw(rewards, shifts=[1.0, 0.0]), saw_weights(rewards, [1.0, 0.0]))
    with pytest.raises(ValueError, match="static weights must be all 1"):
        saw(rewards, [0.5, 2.0])
    with pytest.raises(ValueError, match="shifts apply to a per-step weighting"):
        static(rewards, shifts=[1.0, 0.0])


@pytest.mark.parametrize("name", ["grpo", "gdpo", "mrtpo"])
def test_each_estimator_takes_saws_weights_as_its_c_k(name):
    # What the trainer does: the weighting's c_k passed to the registered estimator.
    rewards = columns(*FORMAT_AND_CORRECT)
    advantage = get_estimator(name)(rewards, 2, get_weighting("saw")(rewards))
    top = A / (A * math.sqrt(2 / 3) + 1e-4)
    expected = [-A, A, 0.0, 0.0] if name == "grpo" else [-top, top, 0.0, 0.0]
    assert advantage.tolist() == pytest.approx(expected, abs=1e-5)
