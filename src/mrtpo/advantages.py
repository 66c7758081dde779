"""Advantages for multi-reward RL: GRPO, GDPO and MRTPO, as pure functions on tensors.

Rows are ordered group by group: rows ``g*G .. g*G+G-1`` are the ``G`` responses to one prompt
(TRL's layout). ``rewards`` is ``Tensor[N, K]``: one column per reward function, ``NaN`` where a
reward function gave no score (TRL turns ``None`` into ``NaN``).

``grpo`` and ``gdpo`` reproduce TRL 1.16 ``GRPOTrainer._generate_and_score_completions``
operation by operation (``multi_objective_aggregation`` ``"sum_then_normalize"`` and
``"normalize_then_sum"``), so that the numbers are equal, not merely close. ``mrtpo`` is GDPO
with each reward's normalized advantage re-allocated among the response's tokens by relevance
weights (``docs/METHOD.md``, MRTPO, steps 3-5).

The three are also registered by name (``ESTIMATORS``, ``get_estimator``) behind one common
signature, so that a trainer picks its estimator once instead of comparing names.

The reward weights ``c_k`` they take are chosen in ``mrtpo.reward_weighting`` (``"static"`` or
SAW's per-step weights); its registry and ``saw_weights`` are importable from here as well.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mrtpo.reward_batch import RewardWeights, check_rewards, check_weights, nanstd, registered

# The reward weightings, where the trainer, the configuration and the tests look them up.
from mrtpo.reward_weighting import SAW_EPS as SAW_EPS
from mrtpo.reward_weighting import WEIGHTINGS as WEIGHTINGS
from mrtpo.reward_weighting import coefficients_of_variation as coefficients_of_variation
from mrtpo.reward_weighting import get_weighting as get_weighting
from mrtpo.reward_weighting import register_weighting as register_weighting
from mrtpo.reward_weighting import saw_weights as saw_weights

SCALES = ("group", "batch", "none")
QBAR_MIN = 1e-8  # below this a reward's mean distance counts as 0: uniform weights
SPREAD_SHARE = 0.01  # from this share of the largest spread a reward counts fully (bound)
# TRL's epsilon, added to both standard deviations (GRPOTrainer's `std + 1e-4`): every
# estimator's default, and what the trainer passes.
EPS = 1e-4


# ----------------------------------------------------------------------------- checks


def _check_eps(eps: float) -> None:
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")


def _check_beta(beta: float) -> None:
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta!r}")


def _check_distance_mask(distance: Tensor, mask: Tensor) -> Tensor:
    """Validate shapes and values; returns the mask as a bool Tensor[N, T]."""
    if not isinstance(distance, Tensor) or distance.dim() != 3:
        raise ValueError(
            f"distance must be a Tensor of shape (N, K, T), got {getattr(distance, 'shape', type(distance))}"
        )
    if not isinstance(mask, Tensor) or mask.dim() != 2:
        raise ValueError(
            f"mask must be a Tensor of shape (N, T), got {getattr(mask, 'shape', type(mask))}"
        )
    n, _, t = distance.shape
    if mask.shape != (n, t):
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}, expected (N, T) = ({n}, {t}) from distance"
        )
    if mask.dtype != torch.bool:
        if not ((mask == 0) | (mask == 1)).all():
            raise ValueError("mask must contain only 0 and 1")
        mask = mask != 0
    valid = distance[mask.unsqueeze(1).expand_as(distance)]
    if not torch.isfinite(valid).all() or (valid < 0).any():
        raise ValueError("distance must be finite and >= 0 on response tokens (mask = 1)")
    return mask


# ----------------------------------------------------------------------------- baselines


def per_reward(rewards: Tensor, group_size: int, eps: float = EPS) -> Tensor:
    """Group-normalized advantage of each reward, ``Ã_k = (r_k - mean_g r_k) / (std_g r_k + eps)``.

    Args:
        rewards: Tensor[N, K], NaN where a reward gave no score.
        group_size: G, the number of rows per prompt; must divide N.
        eps: added to the std (TRL: 1e-4).

    Returns:
        Tensor[N, K]. NaN where the reward is NaN, and in a group where that reward has fewer
        than two scores (TRL's nanstd is NaN there; its nansum later drops these). With
        ``group_size == 1`` the std is taken as 0 (TRL's branch), so Ã_k is 0. A reward with zero
        variance in a group gives 0 there.
    """
    rewards = check_rewards(rewards, group_size)
    _check_eps(eps)
    num_rewards = rewards.shape[1]
    grouped = rewards.view(-1, group_size, num_rewards)  # (N/G, G, K)
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    if group_size > 1:
        std_k = nanstd(grouped, dim=1, keepdim=True)
    else:
        std_k = torch.zeros_like(mean_k)
    return ((grouped - mean_k) / (std_k + eps)).view(-1, num_rewards)


def opposite_sign_rows(rewards: Tensor, group_size: int, eps: float = EPS) -> Tensor:
    """The rows where two rewards pull apart: some ``Ã_k > 0`` and some ``Ã_j < 0``, Tensor[N] bool.

    These are the rows where GDPO's sum cancels credit that MRTPO can place on different
    tokens (with two rewards: format and correctness disagree on the response).

    Args:
        rewards: Tensor[N, K], NaN where a reward gave no score.
        group_size: G, rows per prompt; must divide N.
        eps: added to the std (TRL: 1e-4), as in `per_reward`.
    """
    normalized = torch.nan_to_num(per_reward(rewards, group_size, eps=eps))
    return (normalized > 0).any(dim=1) & (normalized < 0).any(dim=1)


def _gdpo_parts(
    rewards: Tensor, group_size: int, weights: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """GDPO's pieces: (Ã Tensor[N,K], c Tensor[K], S Tensor[N], mean_batch S, std_batch S).

    S is NaN on unscorable rows (every reward NaN), which are left out of the batch statistics.
    """
    rewards = check_rewards(rewards, group_size)
    weights = check_weights(weights, rewards)
    normalized = per_reward(rewards, group_size, eps)
    summed = (normalized * weights.unsqueeze(0)).nansum(dim=1)
    unscorable = torch.isnan(rewards).all(dim=1)
    summed[unscorable] = torch.nan
    if summed.numel() > 1:
        std_batch = nanstd(summed).expand_as(summed)
    else:
        std_batch = torch.zeros_like(summed)
    return normalized, weights, summed, torch.nanmean(summed), std_batch


def gdpo(
    rewards: Tensor,
    group_size: int,
    weights: Sequence[float] | Tensor | None = None,
    eps: float = EPS,
) -> Tensor:
    """GDPO: normalize each reward within its group, sum, then normalize over the batch.

    Equal to TRL 1.16 with ``multi_objective_aggregation="normalize_then_sum"``.

    Args:
        rewards: Tensor[N, K], NaN where a reward gave no score.
        group_size: G, rows per prompt; must divide N.
        weights: c_k, Tensor[K] or a sequence of K floats (default all 1).
        eps: added to both stds (TRL: 1e-4).

    Returns:
        Tensor[N]. 0 on rows where every reward is NaN; never NaN.
    """
    _check_eps(eps)
    _, _, summed, mean_batch, std_batch = _gdpo_parts(rewards, group_size, weights, eps)
    advantages = (summed - mean_batch) / (std_batch + eps)
    return torch.nan_to_num(advantages, nan=0.0)


def grpo(
    rewards: Tensor,
    group_size: int,
    weights: Sequence[float] | Tensor | None = None,
    scale: str = "group",
    eps: float = EPS,
) -> Tensor:
    """GRPO: sum the weighted rewards, then normalize within each group.

    Equal to TRL 1.16 with ``multi_objective_aggregation="sum_then_normalize"`` and
    ``scale_rewards=scale``: the mean is always the group's; the std is the group's
    (``"group"``), the batch's (``"batch"``), or not divided by (``"none"``).

    Args:
        rewards: Tensor[N, K], NaN where a reward gave no score.
        group_size: G, rows per prompt; must divide N.
        weights: c_k, Tensor[K] or a sequence of K floats (default all 1).
        scale: "group", "batch" or "none".
        eps: added to the std (TRL: 1e-4).

    Returns:
        Tensor[N]. 0 where TRL's value is NaN (unscorable rows, groups with one score).
    """
    rewards = check_rewards(rewards, group_size)
    weights = check_weights(weights, rewards)
    _check_eps(eps)
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    summed = (rewards * weights.unsqueeze(0)).nansum(dim=1)
    summed[torch.isnan(rewards).all(dim=1)] = torch.nan
    mean_group = torch.nanmean(summed.view(-1, group_size), dim=1).repeat_interleave(group_size)
    advantages = summed - mean_group
    if scale == "group":
        if group_size > 1:
            std = nanstd(summed.view(-1, group_size), dim=1).repeat_interleave(group_size)
        else:
            std = torch.zeros_like(summed)
        advantages = advantages / (std + eps)
    elif scale == "batch":
        std = nanstd(summed).expand_as(summed) if summed.numel() > 1 else torch.zeros_like(summed)
        advantages = advantages / (std + eps)
    return torch.nan_to_num(advantages, nan=0.0)


# ----------------------------------------------------------------------------- MRTPO


def token_weights(distance: Tensor, mask: Tensor, beta: float) -> Tensor:
    """Relevance weights ``w_{k,t} = (1 - beta) + beta * q_{k,t} / qbar_k`` (METHOD.md step 3).

    Args:
        distance: Tensor[N, K, T], q_{k,t} >= 0 (JS distance from replay); ignored where mask is 0.
        mask: Tensor[N, T], 1 on response tokens, 0 on padding (bool or 0/1).
        beta: in [0, 1]; 0 gives uniform weights.

    Returns:
        Tensor[N, K, T]: weights averaging exactly 1 (up to rounding) over each response's tokens
        for every reward; 1 everywhere on the response where qbar_k < 1e-8; 0 where mask is 0.
    """
    _check_beta(beta)
    mask = _check_distance_mask(distance, mask)
    valid = mask.unsqueeze(1)  # (N, 1, T)
    dtype = distance.dtype if distance.is_floating_point() else torch.float32
    q = torch.where(valid, distance.to(dtype), torch.zeros((), dtype=dtype, device=distance.device))
    num_tokens = mask.sum(dim=-1, keepdim=True).unsqueeze(1).to(dtype)  # (N, 1, 1)
    qbar = q.sum(dim=-1, keepdim=True) / num_tokens.clamp(min=1)  # (N, K, 1)
    uniform = qbar < QBAR_MIN
    weights = (1.0 - beta) + beta * q / torch.where(uniform, torch.ones_like(qbar), qbar)
    weights = torch.where(uniform, torch.ones_like(weights), weights)
    return torch.where(valid, weights, torch.zeros_like(weights))


def shuffle_weights(
    weights: Tensor, mask: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    """Permute each response's weights of each reward among its own response tokens.

    The ``shuffle`` ablation: same values per (row, reward), random positions; an independent
    permutation for every (row, reward). Positions where mask is 0 are left unchanged.

    Args:
        weights: Tensor[N, K, T].
        mask: Tensor[N, T], 1 on response tokens.
        generator: torch.Generator for reproducibility (on weights' device).

    Returns:
        Tensor[N, K, T].
    """
    valid = (mask != 0).unsqueeze(1).expand_as(weights)
    positions = torch.arange(weights.shape[-1], device=weights.device).expand_as(weights)
    inf = torch.tensor(float("inf"), device=weights.device)
    # The valid positions in order, then the others: j-th slot of the permutation's target.
    targets = torch.argsort(
        torch.where(valid, positions.to(torch.float32), inf), dim=-1, stable=True
    )
    # The valid positions in random order, then the others: where each slot takes its value from.
    keys = torch.rand(weights.shape, generator=generator, device=weights.device)
    sources = torch.argsort(torch.where(valid, keys, inf), dim=-1, stable=True)
    return torch.empty_like(weights).scatter_(-1, targets, weights.gather(-1, sources))


def mrtpo(
    rewards: Tensor,
    group_size: int,
    distance: Tensor,
    mask: Tensor,
    beta: float,
    weights: Sequence[float] | Tensor | None = None,
    eps: float = EPS,
    shuffle: bool = False,
    generator: torch.Generator | None = None,
    bounded: bool = True,
) -> Tensor:
    """MRTPO per-token advantages (METHOD.md step 4, with the bounded normalization).

    ``A_t = (sum_k c_k w_{k,t} Ã_k - mean_batch S) / (std_batch S + eps)``, with Ã_k, S and the
    batch statistics exactly as GDPO's. A reward with no normalized advantage on a row (NaN)
    contributes 0 there, as in GDPO's nansum. With ``bounded`` (the default), on a batch whose
    ``std_batch S + eps`` is below ``reallocation_scale`` (the summed advantage spreads less than
    one reward's does: rewards that cancel in the sum), the re-allocated part
    ``sum_k c_k (w_{k,t} - 1) Ã_k`` is divided by that scale instead, so ``|A_t|`` stays on the
    scale of the Ã_k; every other batch gets the formula above, bitwise.

    Args:
        rewards: Tensor[N, K], NaN where a reward gave no score.
        group_size: G, rows per prompt; must divide N.
        distance: Tensor[N, K, T], replay JS distance of each reward at each response token.
        mask: Tensor[N, T], 1 on response tokens.
        beta: weighting strength in [0, 1] (0: GDPO on every token).
        weights: c_k, Tensor[K] or a sequence of K floats (default all 1).
        eps: added to both stds (TRL: 1e-4).
        shuffle: permute each response's token weights among its tokens (ablation).
        generator: torch.Generator for the shuffle.
        bounded: the bounded normalization (False: the paper's formula on every batch).

    Returns:
        Tensor[N, T]: 0 where mask is 0 and on rows where every reward is NaN; the mean over a
        response's tokens equals its GDPO advantage (bounded or not).
    """
    _check_eps(eps)
    rewards = check_rewards(rewards, group_size)
    _check_rows_match(distance, "distance", rewards)
    relevance = token_weights(distance, mask, beta).to(rewards.dtype)
    if shuffle:
        relevance = shuffle_weights(relevance, mask, generator)
    return _spread_gdpo(rewards, group_size, relevance, mask, weights, eps, bounded)


def _check_rows_match(per_token: Tensor, name: str, rewards: Tensor) -> None:
    """A (N, K, T) tensor's (N, K) must be the rewards'; other shapes are left to later checks."""
    if (
        isinstance(per_token, Tensor)
        and per_token.dim() == 3
        and per_token.shape[:2] != rewards.shape
    ):
        raise ValueError(
            f"{name} has shape {tuple(per_token.shape)}, expected (N, K, T) with (N, K) = "
            f"{tuple(rewards.shape)} from rewards"
        )


def _reallocation_scale(normalized: Tensor, weights: Tensor, summed: Tensor) -> Tensor:
    """The per-reward scale of a batch, a 0-dim Tensor (see ``reallocation_scale``).

    normalized: Tensor[N, K] Ã_k (NaN: no advantage); weights: Tensor[K] c_k; summed: Tensor[N]
    S (NaN on unscorable rows, which are left out).
    """
    scorable = ~torch.isnan(summed)
    weighted = torch.nan_to_num(normalized[scorable] * weights.unsqueeze(0))  # (N', K)
    spread = weighted.square().mean(dim=0)  # (K,) m_k; NaN without scorable rows
    largest = spread.max()
    if not largest > 0:  # no reward varies (or no row is scorable)
        return torch.zeros((), dtype=normalized.dtype, device=normalized.device)
    # A reward counts fully from a share SPREAD_SHARE of the largest spread on and in proportion
    # below it: a count of the rewards that vary at all jumps when one starts to.
    counted = (spread / (SPREAD_SHARE * largest)).clamp(max=1.0).sum()
    return (spread.sum() / counted).sqrt()


def reallocation_scale(
    rewards: Tensor,
    group_size: int,
    weights: Sequence[float] | Tensor | None = None,
    eps: float = EPS,
) -> Tensor:
    """The floor of the bounded normalization: ``sqrt(sum_k m_k / K')``, a 0-dim Tensor.

    ``m_k = mean_i (c_k Ã_{k,i})^2`` over the batch's scorable rows is reward k's spread, and
    ``K' = sum_k min(1, m_k / (SPREAD_SHARE * max_j m_j))`` counts the rewards that vary: fully
    from 1% of the largest spread on, in proportion below it. So the scale is the root mean
    square of one varying reward's weighted advantage; a reward that never varies adds nothing,
    and one that barely varies (or has a tiny c_k) barely counts, so the scale is continuous in
    the rewards and the c_k (a plain count of the rewards whose advantage is not 0 somewhere
    would jump by sqrt(K'/(K'+1)) as one starts to vary). It never exceeds the largest
    ``sqrt(m_k)``; with one varying reward it is that reward's RMS and never exceeds
    ``std_batch S`` (S is its c_k Ã_k, centred per group), so the bound engages only where
    several rewards cancel in S.

    Args:
        rewards: Tensor[N, K], NaN where a reward gave no score.
        group_size: G, rows per prompt; must divide N.
        weights: c_k, Tensor[K] or a sequence of K floats (default all 1).
        eps: added to the group std of Ã_k (TRL: 1e-4).

    Returns:
        A 0-dim Tensor, >= 0 (0 when no reward varies).
    """
    normalized, c, summed, _, _ = _gdpo_parts(rewards, group_size, weights, eps)
    return _reallocation_scale(normalized, c, summed)


def bounded_rows(
    rewards: Tensor,
    group_size: int,
    weights: Sequence[float] | Tensor | None = None,
    eps: float = EPS,
) -> Tensor:
    """The rows whose MRTPO advantages the bounded normalization changes: Tensor[N] bool.

    A batch is bounded where ``std_batch S + eps < reallocation_scale``; its rows with some
    ``c_k Ã_k != 0`` (the others have nothing to re-allocate) are changed.

    Args:
        rewards: Tensor[N, K], NaN where a reward gave no score.
        group_size: G, rows per prompt; must divide N.
        weights: c_k, Tensor[K] or a sequence of K floats (default all 1).
        eps: added to both stds (TRL: 1e-4).
    """
    _check_eps(eps)
    normalized, c, summed, _, std_batch = _gdpo_parts(rewards, group_size, weights, eps)
    engaged = _bounding_scale(normalized, c, summed, std_batch, eps) is not None
    moving = (torch.nan_to_num(normalized * c.unsqueeze(0)) != 0).any(dim=1)
    return moving & ~torch.isnan(summed) & engaged


def _bounding_scale(
    normalized: Tensor, weights: Tensor, summed: Tensor, std_batch: Tensor, eps: float
) -> Tensor | None:
    """The divisor of the re-allocated part where the bound engages (``std_batch S + eps`` is
    below the per-reward scale), else None: GDPO's parts as ``_gdpo_parts`` returns them."""
    scale = _reallocation_scale(normalized, weights, summed)
    return scale if std_batch[0] + eps < scale else None


def _spread_gdpo(
    rewards: Tensor,
    group_size: int,
    relevance: Tensor,
    mask: Tensor,
    weights: Sequence[float] | Tensor | None,
    eps: float,
    bounded: bool = True,
) -> Tensor:
    """GDPO with each reward's Ã_k spread over the tokens by ``relevance`` (METHOD.md step 4).

    Args:
        rewards: Tensor[N, K], checked.
        group_size: G, rows per prompt.
        relevance: Tensor[N, K, T], w_{k,t} in rewards' dtype (0 where mask is 0).
        mask: Tensor[N, T], 1 on response tokens.
        weights: c_k, Tensor[K] or K floats, or None (all 1).
        eps: added to both stds.
        bounded: the bounded normalization (see ``mrtpo``).

    Returns:
        Tensor[N, T], as ``mrtpo``.
    """
    normalized, c, summed, mean_batch, std_batch = _gdpo_parts(rewards, group_size, weights, eps)
    weighted = normalized.unsqueeze(-1) * c.view(1, -1, 1)  # (N, K, 1) c_k Ã_k
    scale = _bounding_scale(normalized, c, summed, std_batch, eps) if bounded else None
    if scale is not None:
        # S cancels between rewards: GDPO's advantage plus the re-allocation over the per-reward
        # scale, not over the (near-)zero std of S (which would multiply it by up to 1/eps).
        response = (summed - mean_batch) / (std_batch + eps)  # GDPO's, (N,)
        moved = (weighted * (relevance - 1)).nansum(dim=1)  # (N, T), token mean 0
        advantages = response.unsqueeze(-1) + moved / scale
    else:
        per_token = (weighted * relevance).nansum(dim=1)  # (N, T)
        per_token[torch.isnan(summed)] = torch.nan  # unscorable rows, as in GDPO
        advantages = (per_token - mean_batch) / (std_batch.unsqueeze(-1) + eps)
    advantages = torch.nan_to_num(advantages, nan=0.0)
    return torch.where(mask != 0, advantages, torch.zeros_like(advantages))


def beta_at(step: int, beta: float, warmup_steps: int) -> float:
    """Smoothstep warm-up of beta: ``beta * (3u^2 - 2u^3)``, ``u = min(step / warmup_steps, 1)``.

    Args:
        step: optimizer step (0-based), >= 0.
        beta: the final beta, in [0, 1].
        warmup_steps: steps to reach beta, >= 0 (0: beta from the start).
    """
    _check_beta(beta)
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step!r}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps!r}")
    if warmup_steps == 0:
        return float(beta)
    u = min(step / warmup_steps, 1.0)
    return float(beta * (3 * u**2 - 2 * u**3))


# ----------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class TokenRelevance:
    """What a token-level estimator needs beyond the rewards: where each reward's credit goes.

    weights: Tensor[N, K, T], the relevance weights w_{k,t} (``token_weights``, permuted by
        ``shuffle_weights`` for the ablation); 0 where mask is 0.
    mask: Tensor[N, T], 1 on response tokens (bool or 0/1).
    bounded: the bounded normalization of the re-allocation (``mrtpo``; False: the paper's
        formula on every batch).
    """

    weights: Tensor
    mask: Tensor
    bounded: bool = True  # the bounded normalization (``mrtpo``); False: the paper's formula


# The common signature: (rewards, group_size, weights, scale, eps, relevance) -> advantages.
EstimateFn = Callable[[Tensor, int, RewardWeights, str, float, "TokenRelevance | None"], Tensor]


@dataclass(frozen=True)
class Estimator:
    """A registered advantage estimator; call it as ``Estimator.__call__`` documents.

    estimate: the function, with the common signature ``EstimateFn``.
    token_level: spreads the advantage over the tokens by relevance (needs replay distances).
    normalizes_each_reward: normalizes each reward within its group before summing (GDPO's Ã_k;
        TRL's ``"normalize_then_sum"``); its response-level advantage is then GDPO's.
    """

    name: str
    estimate: EstimateFn
    token_level: bool
    normalizes_each_reward: bool

    def __call__(
        self,
        rewards: Tensor,
        group_size: int,
        weights: RewardWeights = None,
        *,
        scale: str = "group",
        eps: float = EPS,
        relevance: TokenRelevance | None = None,
    ) -> Tensor:
        """Advantages of a batch.

        Args:
            rewards: Tensor[N, K], NaN where a reward gave no score.
            group_size: G, rows per prompt; must divide N.
            weights: c_k, Tensor[K] or a sequence of K floats (default all 1).
            scale: GRPO's std scale, "group", "batch" or "none" (the others ignore it).
            eps: added to the stds (TRL: 1e-4).
            relevance: the batch's token weights and mask (token-level estimators only).

        Returns:
            Tensor[N], each response's advantage; Tensor[N, T] given ``relevance``.
        """
        if relevance is not None and not self.token_level:
            raise ValueError(
                f"estimator {self.name!r} gives one advantage per response: relevance must be None"
            )
        return self.estimate(rewards, group_size, weights, scale, eps, relevance)


ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(
    name: str, *, token_level: bool, normalizes_each_reward: bool
) -> Callable[[EstimateFn], EstimateFn]:
    """Decorator: register an ``EstimateFn`` as ``name`` (flags as ``Estimator``'s)."""

    def register(estimate: EstimateFn) -> EstimateFn:
        if name in ESTIMATORS:
            raise ValueError(f"an advantage estimator named {name!r} is already registered")
        ESTIMATORS[name] = Estimator(name, estimate, token_level, normalizes_each_reward)
        return estimate

    return register


def get_estimator(name: str) -> Estimator:
    """The estimator registered as ``name``; the error names the valid choices."""
    return registered(ESTIMATORS, name, "advantage estimator")


# Registered in this order: MRTPO, then the baselines it is compared with. Arguments as
# `Estimator.__call__`'s; each ignores those it has no use for.


@register_estimator("mrtpo", token_level=True, normalizes_each_reward=True)
def _mrtpo_estimate(rewards, group_size, weights, scale, eps, relevance) -> Tensor:
    """Tensor[N, T] given ``relevance`` (``mrtpo`` with its token weights already made);
    Tensor[N] without: GDPO's advantage, the token mean of MRTPO's."""
    if relevance is None:
        return gdpo(rewards, group_size, weights, eps)
    _check_eps(eps)
    rewards = check_rewards(rewards, group_size)
    _check_rows_match(relevance.weights, "relevance.weights", rewards)
    mask = _check_distance_mask(relevance.weights, relevance.mask)
    return _spread_gdpo(
        rewards,
        group_size,
        relevance.weights.to(rewards.dtype),
        mask,
        weights,
        eps,
        relevance.bounded,
    )


@register_estimator("gdpo", token_level=False, normalizes_each_reward=True)
def _gdpo_estimate(rewards, group_size, weights, scale, eps, relevance) -> Tensor:
    """``gdpo``: Tensor[N]."""
    return gdpo(rewards, group_size, weights, eps)


@register_estimator("grpo", token_level=False, normalizes_each_reward=False)
def _grpo_estimate(rewards, group_size, weights, scale, eps, relevance) -> Tensor:
    """``grpo``: Tensor[N]."""
    return grpo(rewards, group_size, weights, scale, eps)
