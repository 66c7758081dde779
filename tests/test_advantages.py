"""Advantages: GRPO/GDPO equal TRL 1.16's own lines; MRTPO's properties (hypothesis)."""

from __future__ import annotations

import inspect
import textwrap
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trl.trainer import grpo_trainer
from trl.trainer.utils import nanstd

from mrtpo.advantages import (
    ESTIMATORS,
    TokenRelevance,
    beta_at,
    bounded_rows,
    gdpo,
    get_estimator,
    grpo,
    mrtpo,
    opposite_sign_rows,
    per_reward,
    reallocation_scale,
    register_estimator,
    shuffle_weights,
    token_weights,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------- TRL's own code


def _trl_advantage_block():
    """The advantage lines of TRL 1.16 `GRPOTrainer._generate_and_score_completions`.

    Taken from the installed TRL's source at test time (from `unscorable_mask = ...` to
    `advantages = torch.nan_to_num(...)`, i.e. grpo_trainer.py ~lines 2759-2812 in 1.16.0), so the
    comparison runs TRL's code itself, not a transcription of it.
    """
    source = textwrap.dedent(
        inspect.getsource(grpo_trainer.GRPOTrainer._generate_and_score_completions)
    )
    start = source.index("unscorable_mask = torch.isnan(rewards_per_func)")
    end_marker = "advantages = torch.nan_to_num(advantages, nan=0.0)"
    end = source.index(end_marker) + len(end_marker)
    # Cut at the start of the line so the block's indentation is consistent, then dedent it.
    start = source.rindex("\n", 0, start) + 1
    return compile(textwrap.dedent(source[start:end]), "trl_advantages", "exec")


TRL_BLOCK = _trl_advantage_block()


def trl_advantages(
    rewards: torch.Tensor, group_size: int, weights, aggregation: str, scale: str = "group"
):
    """Run TRL's lines with a stand-in `self` holding only the attributes they read."""
    num_rewards = rewards.shape[1]
    fake_self = SimpleNamespace(
        multi_objective_aggregation=aggregation,
        scale_rewards=scale,
        reward_weights=torch.tensor(weights, dtype=torch.float32)
        if weights is not None
        else torch.ones(num_rewards, dtype=torch.float32),
        reward_funcs=[None] * num_rewards,
    )
    scope = {
        "self": fake_self,
        "torch": torch,
        "nanstd": nanstd,
        "device": rewards.device,
        "num_generations": group_size,
        "rewards_per_func": rewards.clone(),
    }
    exec(TRL_BLOCK, scope)
    return scope["advantages"]


def random_rewards(
    gen: torch.Generator, groups: int, group_size: int, num_rewards: int
) -> torch.Tensor:
    """Mixed binary / continuous rewards with NaNs, whole NaN rows, and zero-variance groups."""
    n = groups * group_size
    binary = (torch.rand(n, num_rewards, generator=gen) < 0.5).float()
    continuous = torch.randn(n, num_rewards, generator=gen) * 3 + 0.1
    rewards = torch.where(torch.rand(n, num_rewards, generator=gen) < 0.5, binary, continuous)
    rewards[torch.rand(n, num_rewards, generator=gen) < 0.2] = torch.nan
    rewards[torch.rand(n, generator=gen) < 0.1] = torch.nan  # unscorable rows
    # A zero-variance group for one reward, and one group constant on every reward.
    rewards[:group_size, 0] = 0.3
    if groups > 1:
        rewards[group_size : 2 * group_size] = 1.0
    return rewards


CASES = [(g, k, seed) for g in (2, 4, 8) for k in (1, 2, 5) for seed in range(3)]


@pytest.mark.parametrize(("group_size", "num_rewards", "seed"), CASES)
def test_gdpo_equals_trl(group_size, num_rewards, seed):
    gen = torch.Generator().manual_seed(seed)
    rewards = random_rewards(gen, groups=4, group_size=group_size, num_rewards=num_rewards)
    for weights in (None, (torch.rand(num_rewards, generator=gen) * 2 - 0.5).tolist()):
        expected = trl_advantages(rewards, group_size, weights, "normalize_then_sum")
        actual = gdpo(rewards, group_size, weights=weights)
        assert torch.equal(actual, expected), (actual, expected)
        assert torch.isfinite(actual).all()


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize(("group_size", "num_rewards", "seed"), CASES)
def test_grpo_equals_trl(group_size, num_rewards, seed, scale):
    gen = torch.Generator().manual_seed(100 + seed)
    rewards = random_rewards(gen, groups=4, group_size=group_size, num_rewards=num_rewards)
    for weights in (None, (torch.rand(num_rewards, generator=gen) * 2 - 0.5).tolist()):
        expected = trl_advantages(rewards, group_size, weights, "sum_then_normalize", scale)
        actual = grpo(rewards, group_size, weights=weights, scale=scale)
        assert torch.equal(actual, expected), (actual, expected)
        assert torch.isfinite(actual).all()


def test_single_generation_and_single_row_match_trl():
    rewards = torch.tensor([[1.0, 0.0], [0.5, float("nan")], [2.0, 1.0]])
    assert torch.equal(gdpo(rewards, 1), trl_advantages(rewards, 1, None, "normalize_then_sum"))
    for scale in ("group", "batch", "none"):
        assert torch.equal(
            grpo(rewards, 1, scale=scale),
            trl_advantages(rewards, 1, None, "sum_then_normalize", scale),
        )
    one = torch.tensor([[0.7, 0.2]])
    assert torch.equal(gdpo(one, 1), trl_advantages(one, 1, None, "normalize_then_sum"))


def test_per_reward_values():
    rewards = torch.tensor([[1.0, 5.0], [0.0, 5.0], [1.0, float("nan")], [0.0, 5.0]])
    normalized = per_reward(rewards, group_size=4)
    std = torch.tensor([1.0, 0.0, 1.0, 0.0]).std()  # Bessel
    expected0 = (torch.tensor([1.0, 0.0, 1.0, 0.0]) - 0.5) / (std + 1e-4)
    torch.testing.assert_close(normalized[:, 0], expected0)
    assert normalized[[0, 1, 3], 1].eq(0).all()  # zero variance -> 0
    assert torch.isnan(normalized[2, 1])  # no score stays NaN (dropped by the nansum later)


def test_all_nan_column_in_a_group_gives_zero():
    rewards = torch.tensor([[1.0, float("nan")], [0.0, float("nan")], [1.0, 1.0], [0.0, 0.0]])
    advantages = gdpo(rewards, 2)
    assert torch.isfinite(advantages).all()
    # Group 1 has only reward 0; group 2 has both; the NaN column adds nothing in group 1.
    s = torch.tensor([0.5, -0.5, 1.0, -1.0]) / (torch.tensor([1.0, 0.0]).std() + 1e-4)
    torch.testing.assert_close(advantages, (s - s.mean()) / (s.std() + 1e-4))


# ----------------------------------------------------------------------------- MRTPO properties

FINITE = st.floats(min_value=-10, max_value=10, allow_nan=False, width=32)


@st.composite
def mrtpo_inputs(draw):
    group_size = draw(st.sampled_from([1, 2, 4]))
    groups = draw(st.integers(1, 3))
    num_rewards = draw(st.integers(1, 4))
    length = draw(st.integers(1, 9))
    n = groups * group_size
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.tensor(
        draw(st.lists(FINITE, min_size=n * num_rewards, max_size=n * num_rewards))
    )
    rewards = rewards.view(n, num_rewards)
    rewards[torch.rand(n, num_rewards, generator=gen) < draw(st.sampled_from([0.0, 0.3]))] = (
        torch.nan
    )
    lengths = torch.randint(0, length + 1, (n,), generator=gen)
    lengths[0] = max(int(lengths[0]), 1)
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    if draw(st.booleans()):
        mask = mask.flip(-1)  # left-aligned responses work the same
    distance = torch.rand(n, num_rewards, length, generator=gen)
    distance[torch.rand(n, num_rewards, length, generator=gen) < 0.3] = 0.0
    if draw(st.booleans()):
        distance[0, 0] = 0.0  # a response with no relevant token for reward 0
    distance[~mask.unsqueeze(1).expand_as(distance)] = draw(st.sampled_from([0.0, 7.0]))
    beta = draw(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]) | st.floats(0, 1))
    c = draw(st.none() | st.lists(st.floats(0.1, 3), min_size=num_rewards, max_size=num_rewards))
    return rewards, group_size, distance, mask, beta, c


def rounding_scale(inputs) -> float:
    """Tolerance for float32 rounding in MRTPO's per-token sums.

    The terms c_k w_{k,t} Ã_k of a token can be large and cancel; their rounding error is then
    divided by std_batch S + eps (as small as 1e-4), so the tolerance follows the terms' size.
    """
    rewards, group_size, distance, mask, beta, c = inputs
    terms = per_reward(rewards, group_size).abs().unsqueeze(-1) * token_weights(
        distance, mask, beta
    )
    if c is not None:
        terms = terms * torch.tensor(c).view(1, -1, 1)
    summed = gdpo_sums(rewards, group_size, c)
    std = summed.std() if summed.numel() > 1 else torch.tensor(0.0)
    largest = float(terms.nansum(1).max()) + (float(summed.abs().max()) if summed.numel() else 0.0)
    return float(1e-5 + 4e-7 * largest / (torch.nan_to_num(std) + 1e-4))


def gdpo_sums(rewards, group_size, c):
    """S = sum_k c_k Ã_k on scorable rows (for the tolerance only)."""
    normalized = per_reward(rewards, group_size)
    if c is not None:
        normalized = normalized * torch.tensor(c)
    scorable = ~torch.isnan(rewards).all(1)
    return normalized.nansum(1)[scorable]


@settings(max_examples=150, deadline=None)
@given(mrtpo_inputs())
def test_mrtpo_token_mean_is_gdpo(inputs):
    rewards, group_size, distance, mask, beta, c = inputs
    advantages = mrtpo(rewards, group_size, distance, mask, beta, weights=c)
    assert advantages.shape == mask.shape
    assert torch.isfinite(advantages).all()
    assert advantages[~mask].eq(0).all()
    expected = gdpo(rewards, group_size, weights=c)
    lengths = mask.sum(-1)
    has_tokens = lengths > 0
    token_mean = advantages.sum(-1)[has_tokens] / lengths[has_tokens]
    torch.testing.assert_close(
        token_mean, expected[has_tokens], atol=rounding_scale(inputs), rtol=1e-5
    )


@settings(max_examples=100, deadline=None)
@given(mrtpo_inputs())
def test_mrtpo_beta_zero_and_uniform_distance_give_gdpo(inputs):
    rewards, group_size, distance, mask, _, c = inputs
    expected = gdpo(rewards, group_size, weights=c).unsqueeze(-1).expand_as(mask) * mask
    at_zero = mrtpo(rewards, group_size, distance, mask, 0.0, weights=c)
    torch.testing.assert_close(at_zero, expected, atol=1e-6, rtol=1e-6)
    uniform = torch.full_like(distance, 0.37)
    for beta in (0.5, 1.0):
        torch.testing.assert_close(
            mrtpo(rewards, group_size, uniform, mask, beta, weights=c),
            expected,
            atol=1e-5,
            rtol=1e-5,
        )


def test_mrtpo_beta_zero_is_exactly_gdpo():
    gen = torch.Generator().manual_seed(0)
    rewards = random_rewards(gen, groups=3, group_size=4, num_rewards=3)
    distance = torch.rand(12, 3, 6, generator=gen)
    mask = torch.ones(12, 6, dtype=torch.bool)
    expected = gdpo(rewards, 4).unsqueeze(-1).expand(12, 6)
    assert torch.equal(mrtpo(rewards, 4, distance, mask, 0.0), expected)


@settings(max_examples=100, deadline=None)
@given(mrtpo_inputs())
def test_token_weights_properties(inputs):
    _, _, distance, mask, beta, _ = inputs
    weights = token_weights(distance, mask, beta)
    assert torch.isfinite(weights).all()
    assert weights[~mask.unsqueeze(1).expand_as(weights)].eq(0).all()
    assert (weights >= 0).all()
    lengths = mask.sum(-1)
    rows = lengths > 0
    means = weights.sum(-1)[rows] / lengths[rows].unsqueeze(-1)
    torch.testing.assert_close(means, torch.ones_like(means), atol=1e-5, rtol=0)
    # A reward whose distances are all 0 on a response gets uniform weights 1.
    valid = mask.unsqueeze(1).expand_as(distance)
    zero_rows = (torch.where(valid, distance, 0.0).sum(-1) == 0) & rows.unsqueeze(1)
    for n, k in zero_rows.nonzero().tolist():
        assert weights[n, k][mask[n]].eq(1).all()


def test_token_weights_values():
    distance = torch.tensor([[[0.1, 0.3, 0.0, 0.9]]])
    mask = torch.tensor([[1, 1, 1, 0]])
    weights = token_weights(distance, mask, 0.5)
    qbar = 0.4 / 3
    expected = torch.tensor([[[0.5 + 0.5 * 0.1 / qbar, 0.5 + 0.5 * 0.3 / qbar, 0.5, 0.0]]])
    torch.testing.assert_close(weights, expected)


@settings(max_examples=100, deadline=None)
@given(mrtpo_inputs(), st.integers(0, 1000))
def test_shuffle_keeps_each_responses_weights(inputs, seed):
    rewards, group_size, distance, mask, beta, c = inputs
    weights = token_weights(distance, mask, beta)
    shuffled = shuffle_weights(weights, mask, torch.Generator().manual_seed(seed))
    for n in range(mask.shape[0]):
        for k in range(weights.shape[1]):
            before = weights[n, k][mask[n]].sort().values
            after = shuffled[n, k][mask[n]].sort().values
            assert torch.equal(before, after)
    assert shuffled[~mask.unsqueeze(1).expand_as(weights)].eq(0).all()
    # The shuffled advantages keep the token mean (= GDPO) and stay finite.
    advantages = mrtpo(
        rewards,
        group_size,
        distance,
        mask,
        beta,
        weights=c,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    assert torch.isfinite(advantages).all()
    unshuffled = mrtpo(rewards, group_size, distance, mask, beta, weights=c)
    atol = mask.shape[1] * rounding_scale(inputs)
    torch.testing.assert_close(advantages.sum(-1), unshuffled.sum(-1), atol=atol, rtol=1e-5)


def test_shuffle_moves_weights():
    distance = torch.arange(1, 41, dtype=torch.float32).view(1, 1, 40)
    mask = torch.ones(1, 40, dtype=torch.bool)
    mask[0, 35:] = False
    weights = token_weights(distance, mask, 1.0)
    shuffled = shuffle_weights(weights, mask, torch.Generator().manual_seed(0))
    assert not torch.equal(shuffled, weights)
    assert shuffled[0, 0, 35:].eq(0).all()


def test_mrtpo_reallocates_towards_relevant_tokens():
    rewards = torch.tensor([[1.0], [0.0]])
    distance = torch.tensor([[[0.0, 0.0, 1.0, 0.0]], [[0.0, 0.0, 1.0, 0.0]]])
    mask = torch.ones(2, 4)
    advantages = mrtpo(rewards, 2, distance, mask, 1.0)
    # beta = 1: the whole advantage goes to token 2 (4x, others 0).
    scalar = gdpo(rewards, 2)
    expected = torch.zeros(2, 4)
    expected[:, 2] = 4 * scalar
    torch.testing.assert_close(advantages, expected)


def test_unscorable_rows_get_zero():
    rewards = torch.tensor(
        [[1.0, float("nan")], [float("nan"), float("nan")], [0.0, 1.0], [1.0, 0.0]]
    )
    distance = torch.rand(4, 2, 3, generator=torch.Generator().manual_seed(0))
    advantages = mrtpo(rewards, 2, distance, torch.ones(4, 3), 0.5)
    assert advantages[1].eq(0).all()
    assert torch.isfinite(advantages).all()


# ----------------------------------------------------------------------------- beta schedule


def test_beta_at_smoothstep():
    assert beta_at(0, 0.5, 10) == 0.0
    assert beta_at(5, 0.5, 10) == pytest.approx(0.25)
    assert beta_at(2, 1.0, 10) == pytest.approx(3 * 0.04 - 2 * 0.008)
    assert beta_at(10, 0.5, 10) == 0.5
    assert beta_at(50, 0.5, 10) == 0.5
    assert beta_at(0, 0.75, 0) == 0.75
    values = [beta_at(s, 1.0, 10) for s in range(12)]
    assert values == sorted(values)


# ----------------------------------------------------------------------------- bad input


def test_bad_input_raises_naming_the_argument():
    rewards = torch.zeros(4, 2)
    distance = torch.zeros(4, 2, 3)
    mask = torch.ones(4, 3)
    with pytest.raises(ValueError, match="group_size"):
        gdpo(rewards, 3)
    with pytest.raises(ValueError, match="group_size"):
        grpo(rewards, 0)
    with pytest.raises(ValueError, match="rewards"):
        gdpo(torch.zeros(4), 2)
    with pytest.raises(ValueError, match="rewards"):
        gdpo(torch.tensor([[1.0, float("inf")], [0.0, 0.0]]), 2)
    with pytest.raises(ValueError, match="weights"):
        gdpo(rewards, 2, weights=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="scale"):
        grpo(rewards, 2, scale="token")
    with pytest.raises(ValueError, match="beta"):
        mrtpo(rewards, 2, distance, mask, 1.5)
    with pytest.raises(ValueError, match="beta"):
        beta_at(0, -0.1, 10)
    with pytest.raises(ValueError, match="distance"):
        mrtpo(rewards, 2, torch.zeros(4, 3, 3), mask, 0.5)
    with pytest.raises(ValueError, match="mask"):
        mrtpo(rewards, 2, distance, torch.ones(4, 4), 0.5)
    with pytest.raises(ValueError, match="mask"):
        token_weights(distance, torch.full((4, 3), 2.0), 0.5)
    with pytest.raises(ValueError, match="distance"):
        token_weights(torch.full((4, 2, 3), float("nan")), mask, 0.5)
    with pytest.raises(ValueError, match="step"):
        beta_at(-1, 0.5, 10)


# ----------------------------------------------------------------------------- registry


def test_registry_names_and_what_the_trainer_reads():
    assert list(ESTIMATORS) == ["mrtpo", "gdpo", "grpo"]
    assert [get_estimator(name).token_level for name in ESTIMATORS] == [True, False, False]
    assert [get_estimator(name).normalizes_each_reward for name in ESTIMATORS] == [
        True,
        True,
        False,
    ]
    with pytest.raises(ValueError, match="'ppo'.*mrtpo, gdpo, grpo"):
        get_estimator("ppo")
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("gdpo", token_level=False, normalizes_each_reward=True)(gdpo)


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_registered_estimators_equal_the_functions(scale):
    gen = torch.Generator().manual_seed(0)
    rewards = random_rewards(gen, groups=3, group_size=4, num_rewards=2)
    c = [0.5, 2.0]
    distance = torch.rand(12, 2, 5, generator=gen)
    mask = torch.ones(12, 5)
    mask[3, 2:] = 0
    estimate = {name: get_estimator(name) for name in ESTIMATORS}
    assert torch.equal(estimate["grpo"](rewards, 4, c, scale=scale), grpo(rewards, 4, c, scale))
    assert torch.equal(estimate["gdpo"](rewards, 4, c, scale=scale), gdpo(rewards, 4, c))
    # Without relevance MRTPO gives each response GDPO's advantage (its token mean).
    assert torch.equal(estimate["mrtpo"](rewards, 4, c, scale=scale), gdpo(rewards, 4, c))
    for shuffle in (False, True):
        weights = token_weights(distance, mask, 0.5)
        if shuffle:
            weights = shuffle_weights(weights, mask, torch.Generator().manual_seed(1))
        per_token = estimate["mrtpo"](rewards, 4, c, relevance=TokenRelevance(weights, mask))
        expected = mrtpo(
            rewards, 4, distance, mask, 0.5, c, shuffle=shuffle,
            generator=torch.Generator().manual_seed(1),
        )  # fmt: skip
        assert torch.equal(per_token, expected)
    with pytest.raises(ValueError, match="relevance must be None"):
        estimate["gdpo"](rewards, 4, relevance=TokenRelevance(weights, mask))
    with pytest.raises(ValueError, match="relevance.weights"):
        estimate["mrtpo"](rewards, 4, relevance=TokenRelevance(weights[:, :1], mask))


# ----------------------------------------------------------------------------- bounded normalization

# One group of 4 whose two binary rewards are exactly anti-correlated: every row's S is 0.
ANTI = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])


def paper_formula(rewards, group_size, distance, mask, beta, c=None, eps=1e-4):
    """The paper's A_t, written out independently in float64 (no code of mrtpo.advantages)."""
    r = rewards.double()
    n, k = r.shape
    c = torch.ones(k, dtype=torch.float64) if c is None else torch.tensor(c, dtype=torch.float64)
    g = r.view(-1, group_size, k)
    mean = torch.nanmean(g, dim=1, keepdim=True)
    count = (~torch.isnan(g)).sum(dim=1, keepdim=True)
    var = torch.nansum((g - mean) ** 2, dim=1, keepdim=True) / (count - 1)
    std = (
        torch.where(count > 1, var.sqrt(), torch.nan) if group_size > 1 else torch.zeros_like(mean)
    )
    a = ((g - mean) / (std + eps)).view(n, k)  # Ã_k
    s = torch.nansum(a * c, dim=1)
    scorable = ~torch.isnan(r).all(dim=1)
    s_ok = s[scorable]
    std_s = s_ok.std() if s_ok.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)
    q = distance.double() * mask.unsqueeze(1)
    lengths = mask.sum(-1).clamp(min=1).double().view(n, 1, 1)
    qbar = q.sum(-1, keepdim=True) / lengths
    w = torch.where(qbar < 1e-8, 1.0, (1 - beta) + beta * q / qbar.clamp(min=1e-300))
    num = torch.nansum(torch.nan_to_num(a, nan=0.0).unsqueeze(-1) * c.view(1, -1, 1) * w, dim=1)
    out = (num - s_ok.mean()) / (std_s + eps)
    out[~scorable] = 0.0
    return out * mask


def test_opposite_sign_rows_by_hand():
    # Group 1: both rewards vary; rows 0 and 1 disagree, rows 2 and 3 agree. Group 2: reward 1
    # is constant (Ã_1 = 0), so no row there can disagree; a NaN score is neither sign.
    rewards = torch.tensor(
        [
            [1.0, 0.0],  # Ã_0 > 0, Ã_1 < 0: opposite
            [0.0, 1.0],  # Ã_0 < 0, Ã_1 > 0: opposite
            [1.0, 1.0],  # both > 0
            [0.0, 0.0],  # both < 0
            [1.0, 0.5],
            [0.0, 0.5],
            [float("nan"), 0.5],
            [1.0, 0.5],
        ]
    )
    got = opposite_sign_rows(rewards, 4)
    assert got.tolist() == [True, True, False, False, False, False, False, False]
    # Rewards that always agree never pull apart.
    agreeing = torch.tensor([[1.0, 0.9], [0.0, 0.1], [0.5, 0.5], [0.2, 0.3]])
    assert not opposite_sign_rows(agreeing, 4).any()


def test_reallocation_scale_and_bounded_rows_on_the_anti_correlated_group():
    a = 0.5 / (torch.tensor([1.0, 1.0, 0.0, 0.0]).std() + 1e-4)  # |Ã_k| on every row
    torch.testing.assert_close(reallocation_scale(ANTI, 4), a, rtol=1e-6, atol=0)
    assert bounded_rows(ANTI, 4).tolist() == [True] * 4
    # Two groups, one ordinary (rewards agree), one anti-correlated: std S is that of the
    # ordinary group's S, well above one reward's scale: nothing is bounded.
    agree = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    assert not bounded_rows(torch.cat([agree, ANTI]), 4).any()
    # Rows with nothing to re-allocate are not counted: a constant group beside ANTI.
    constant = torch.ones(4, 2)
    assert bounded_rows(torch.cat([ANTI, constant]), 4).tolist() == [True] * 4 + [False] * 4


@pytest.mark.parametrize("beta", [0.5, 1.0])
def test_bounded_advantages_on_the_anti_correlated_group(beta):
    gen = torch.Generator().manual_seed(3)
    distance = torch.rand(4, 2, 16, generator=gen)
    distance[:, :, :4] *= 20  # concentrated: large weights on a few tokens
    mask = torch.ones(4, 16, dtype=torch.bool)
    unbounded = mrtpo(ANTI, 4, distance, mask, beta, bounded=False)
    assert unbounded.abs().max() > 1_000  # the failure the bound exists for
    bounded = mrtpo(ANTI, 4, distance, mask, beta)
    # By hand: S = 0 on every row, so A_t = sum_k (w_{k,t} - 1) Ã_k / scale, scale = |Ã_k|.
    normalized = per_reward(ANTI, 4)
    w = token_weights(distance, mask, beta)
    expected = ((w - 1) * normalized.unsqueeze(-1)).sum(1) / normalized.abs().max()
    torch.testing.assert_close(bounded, expected, rtol=1e-5, atol=1e-6)
    assert bounded.abs().max() <= (w - 1).abs().sum(1).max() + 1e-5  # weights' scale
    # Token mean is GDPO's (0 here) and the credit still moves: rewards point at their tokens.
    torch.testing.assert_close(bounded.mean(-1), torch.zeros(4), atol=1e-5, rtol=0)
    assert bounded.std(-1).min() > 0.1


@pytest.mark.parametrize("top", [0.999, 0.99])
def test_bounded_advantages_when_one_reward_is_perturbed(top):
    rewards = ANTI.clone()
    rewards[0, 0] = top  # std S is tiny but not 0: GDPO's own advantage is then of order 1
    gen = torch.Generator().manual_seed(4)
    distance = torch.rand(4, 2, 12, generator=gen)
    mask = torch.ones(4, 12, dtype=torch.bool)
    unbounded = mrtpo(rewards, 4, distance, mask, 1.0, bounded=False)
    assert unbounded.abs().max() > 50
    bounded = mrtpo(rewards, 4, distance, mask, 1.0)
    response = gdpo(rewards, 4)
    w = token_weights(distance, mask, 1.0)
    normalized = per_reward(rewards, 4)
    scale = reallocation_scale(rewards, 4)
    expected = response.unsqueeze(-1) + ((w - 1) * normalized.unsqueeze(-1)).sum(1) / scale
    torch.testing.assert_close(bounded, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bounded.mean(-1), response, rtol=1e-5, atol=1e-5)
    assert bounded.abs().max() < response.abs().max() + 2 * (w - 1).abs().sum(1).max()


def test_bounded_normalization_is_continuous_where_it_engages():
    """Moving a reward across the point where std S + eps meets the per-reward scale moves the
    advantages continuously (no cliff): both formulas agree there."""
    gen = torch.Generator().manual_seed(5)
    distance = torch.rand(4, 2, 10, generator=gen)
    mask = torch.ones(4, 10, dtype=torch.bool)

    anti, independent = torch.tensor([0.0, 0.0, 1.0, 1.0]), torch.tensor([1.0, 0.0, 1.0, 0.0])

    def rewards_at(x: float) -> torch.Tensor:  # x = 0: anti-correlated; x = 1: uncorrelated
        return torch.stack([ANTI[:, 0], (1 - x) * anti + x * independent], dim=1)

    def gap(x: float) -> float:
        r = rewards_at(x)
        normalized = per_reward(r, 4)
        s = normalized.sum(1)
        return float(s.std() + 1e-4 - reallocation_scale(r, 4))

    lo, hi = 0.0, 1.0  # bisect for the crossing (gap < 0: bounded)
    assert gap(lo) < 0 < gap(hi)
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    below, above = rewards_at(lo), rewards_at(hi)
    assert bounded_rows(below, 4).all() and not bounded_rows(above, 4).any()
    a_below = mrtpo(below, 4, distance, mask, 1.0)
    a_above = mrtpo(above, 4, distance, mask, 1.0)
    torch.testing.assert_close(a_below, a_above, atol=1e-5, rtol=0)


# ANTI beside a reward that is constant (column 2 all 0), and beside one that varies ([1,0,1,0]).
ANTI_AND_CONSTANT = torch.cat([ANTI, torch.zeros(4, 1)], dim=1)
ANTI_AND_VARYING = torch.cat([ANTI, torch.tensor([[1.0], [0.0], [1.0], [0.0]])], dim=1)


def test_reallocation_scale_counts_the_varying_rewards_by_their_spread():
    a = 0.5 / (torch.tensor([1.0, 1.0, 0.0, 0.0]).std() + 1e-4)  # |Ã_k| on every row
    # A reward that never varies adds nothing: the scale is that of the varying ones alone
    # (a count of all K rewards would give a * sqrt(2/3) here).
    torch.testing.assert_close(reallocation_scale(ANTI_AND_CONSTANT, 4), a, rtol=1e-6, atol=0)
    # One varying reward beside a constant one: that reward's own RMS, as alone.
    one = torch.stack([ANTI[:, 0], torch.ones(4)], dim=1)
    torch.testing.assert_close(reallocation_scale(one, 4), a, rtol=1e-6, atol=0)
    torch.testing.assert_close(reallocation_scale(one[:, :1], 4), a, rtol=1e-6, atol=0)
    # Spreads m_k = (c_k a)^2. From 1% of the largest on a reward counts fully: (1 + 4) / 2.
    torch.testing.assert_close(
        reallocation_scale(ANTI, 4, [1.0, 2.0]), a * (5 / 2) ** 0.5, rtol=1e-6, atol=0
    )
    # Below, in proportion: m = (1, 0.0025) a^2 counts 1 + 0.25 (a count of the rewards that
    # vary at all would divide by 2).
    torch.testing.assert_close(
        reallocation_scale(ANTI, 4, [1.0, 0.05]), a * (1.0025 / 1.25) ** 0.5, rtol=1e-6, atol=0
    )
    assert reallocation_scale(torch.ones(4, 2), 4) == 0  # nothing varies


@pytest.mark.parametrize(
    ("before", "after", "size", "limit"),
    [
        # 1e-12 added to the constant reward: its Ã moves by about 1e-12 / eps, GDPO's
        # advantage by that over std S + eps again, so up to size / eps^2.
        pytest.param(
            (ANTI_AND_CONSTANT, None),
            (ANTI_AND_CONSTANT + torch.tensor([[0, 0, 1e-12]] + [[0, 0, 0]] * 3), None),
            1e-12,
            1e-12 / 1e-4**2,
            id="reward-plus-1e-12",
        ),
        # A varying reward's weight c_k from 1e-9 to 0: S moves by c_k Ã_k, GDPO's advantage by
        # that over std S + eps, so up to size / eps.
        pytest.param(
            (ANTI_AND_VARYING, [1.0, 1.0, 1e-9]),
            (ANTI_AND_VARYING, [1.0, 1.0, 0.0]),
            1e-9,
            1e-9 / 1e-4,
            id="weight-1e-9-to-0",
        ),
    ],
)
@pytest.mark.parametrize("beta", [0.5, 1.0])
def test_bounded_advantages_move_little_when_a_reward_barely_varies(
    before, after, size, limit, beta
):
    """A reward that starts to vary, or a weight that leaves 0, moves the token advantages by
    no more than GDPO's own sensitivity to that change (no cliff in the per-reward scale)."""
    gen = torch.Generator().manual_seed(6)
    distance = torch.rand(4, 3, 10, generator=gen)
    mask = torch.ones(4, 10, dtype=torch.bool)
    (rewards_before, c_before), (rewards_after, c_after) = before, after
    assert bounded_rows(rewards_before, 4, c_before).all()  # the bound engages on both sides
    assert bounded_rows(rewards_after, 4, c_after).all()
    a_before = mrtpo(rewards_before, 4, distance, mask, beta, c_before)
    a_after = mrtpo(rewards_after, 4, distance, mask, beta, c_after)
    moved = (a_after - a_before).abs().max()
    assert moved <= limit
    # All of it is GDPO's move: the re-allocated part stays put.
    gdpo_moved = (gdpo(rewards_after, 4, c_after) - gdpo(rewards_before, 4, c_before)).abs().max()
    assert moved <= gdpo_moved + 1e-6


def test_reallocated_part_is_continuous_along_a_sweep_through_the_bound():
    """A reward's weight c_2 swept from 0 (where it adds nothing) up through the point where
    std S + eps meets the scale: the re-allocated part A_t - GDPO's advantage has no jump, so
    the largest change between neighbours shrinks with the step (a cliff would not)."""
    gen = torch.Generator().manual_seed(7)
    distance = torch.rand(4, 3, 10, generator=gen)
    mask = torch.ones(4, 10, dtype=torch.bool)

    def largest_jump(steps: int) -> float:
        sweep = torch.linspace(0.0, 1.2, steps + 1, dtype=torch.float64).tolist()
        reallocated = torch.stack(
            [
                mrtpo(ANTI_AND_VARYING, 4, distance, mask, 1.0, [1.0, 1.0, x])
                - gdpo(ANTI_AND_VARYING, 4, [1.0, 1.0, x]).unsqueeze(-1)
                for x in sweep
            ]
        )
        return float((reallocated[1:] - reallocated[:-1]).abs().max())

    assert bounded_rows(ANTI_AND_VARYING, 4, [1.0, 1.0, 0.0]).all()
    assert not bounded_rows(ANTI_AND_VARYING, 4, [1.0, 1.0, 1.2]).any()  # the sweep crosses
    coarse, fine = largest_jump(120), largest_jump(1200)
    assert fine <= coarse / 5


@pytest.mark.parametrize("seed", range(20))
def test_ordinary_batches_are_the_papers_formula_bitwise(seed):
    gen = torch.Generator().manual_seed(seed)
    groups, group_size, num_rewards, length = 4, 4, 3, 7
    n = groups * group_size
    rewards = (torch.rand(n, num_rewards, generator=gen) < 0.5).float()
    rewards[:, 2] = torch.rand(n, generator=gen)  # a continuous reward
    distance = torch.rand(n, num_rewards, length, generator=gen)
    mask = torch.arange(length) < torch.randint(1, length + 1, (n, 1), generator=gen)
    c = [1.0, 0.5, 2.0] if seed % 2 else None
    assert not bounded_rows(rewards, group_size, c).any()
    bounded = mrtpo(rewards, group_size, distance, mask, 0.7, weights=c)
    assert torch.equal(bounded, mrtpo(rewards, group_size, distance, mask, 0.7, c, bounded=False))
    expected = paper_formula(rewards, group_size, distance, mask, 0.7, c).float()
    torch.testing.assert_close(bounded, expected, rtol=1e-5, atol=1e-5)


@settings(max_examples=100, deadline=None)
@given(mrtpo_inputs())
def test_one_varying_reward_never_engages_the_bound(inputs):
    rewards, group_size, distance, mask, beta, c = inputs
    single = rewards[:, :1]
    assert not bounded_rows(single, group_size, None if c is None else c[:1]).any()
    # Constant extra rewards vary nowhere and do not change that.
    padded = torch.cat([single, torch.ones_like(single)], dim=1)
    assert not bounded_rows(padded, group_size).any()


@settings(max_examples=100, deadline=None)
@given(mrtpo_inputs())
def test_bounded_advantages_are_affine_in_beta(inputs):
    """The trainer moves a generation's advantages between betas by their slope: exact only if
    A_t is affine in beta, bounded or not."""
    rewards, group_size, distance, mask, _, c = inputs
    at = {b: mrtpo(rewards, group_size, distance, mask, b, weights=c) for b in (0.0, 0.5, 1.0)}
    torch.testing.assert_close(
        at[0.5], (at[0.0] + at[1.0]) / 2, atol=rounding_scale(inputs) + 1e-5, rtol=1e-5
    )
