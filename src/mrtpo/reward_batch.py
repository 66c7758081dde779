"""What the advantage estimators and the reward weightings share about a batch of rewards.

The checks of the rewards (``Tensor[N, K]``, one column per reward function, ``NaN`` where a
reward function gave no score) and of the reward weights c_k, the NaN-aware std both take their
statistics with, and the lookup by name their registries use. Like ``mrtpo.advantages`` and
``mrtpo.reward_weighting``, which import it, it imports nothing else of the package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

RewardWeights = Sequence[float] | Tensor | None  # c_k: Tensor[K], K floats, or None (all 1)


def check_rewards(rewards: Tensor, group_size: int) -> Tensor:
    """Rewards Tensor[N, K] checked (G must divide N; no inf), as float: Tensor[N, K]."""
    if not isinstance(rewards, Tensor):
        raise ValueError(f"rewards must be a torch.Tensor of shape (N, K), got {type(rewards)}")
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (N, K), got {tuple(rewards.shape)}")
    if rewards.shape[0] == 0 or rewards.shape[1] == 0:
        raise ValueError(
            f"rewards must have at least one row and one column, got {tuple(rewards.shape)}"
        )
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if rewards.shape[0] % group_size:
        raise ValueError(
            f"group_size={group_size} does not divide the number of rows N={rewards.shape[0]}"
        )
    if not rewards.is_floating_point():
        rewards = rewards.float()
    if torch.isinf(rewards).any():
        raise ValueError("rewards contain +-inf (NaN means 'no score'; inf is not a reward)")
    return rewards


def check_weights(weights: Sequence[float] | Tensor | None, rewards: Tensor) -> Tensor:
    """Reward weights c_k as a Tensor[K] in rewards' dtype (TRL: float32 ones by default)."""
    num_rewards = rewards.shape[1]
    if weights is None:
        return torch.ones(num_rewards, dtype=rewards.dtype, device=rewards.device)
    weights = torch.as_tensor(weights, dtype=rewards.dtype, device=rewards.device)
    if weights.shape != (num_rewards,):
        raise ValueError(
            f"weights must have shape ({num_rewards},) (one per reward), got {tuple(weights.shape)}"
        )
    if not torch.isfinite(weights).all():
        raise ValueError("weights must be finite")
    return weights


def nanstd(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Std ignoring NaN with Bessel's correction; NaN where fewer than 2 values (as TRL's nanstd)."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(x), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    std = torch.sqrt(variance * correction)
    if keepdim:
        return std
    return std.squeeze(dim) if dim is not None else std.squeeze()


def registered(table: dict[str, Any], name: str, kind: str) -> Any:
    """``table[name]``; the error names the kind and the valid choices."""
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; valid choices: {', '.join(table)}")
    return table[name]
