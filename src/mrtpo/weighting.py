"""SAW, Stage-Aware Dynamic Weighting (arXiv 2606.07705): reward weights computed every step.

Each reward's coefficient of variation over the batch (its std divided by the absolute value of
its mean) measures how much signal it still carries; the weights are these coefficients rescaled
to sum to the number of rewards K. A reward the policy has already learned (nearly constant over
the batch) gets a weight near 0, and the rewards still being learned share the rest. The weights
replace the static c_k of GRPO, GDPO and MRTPO; see ``docs/SAW.md`` for the definition, its
sources and where the weights enter each estimator.

Pure functions on tensors, without state: SAW keeps nothing from one step to the next (no moving
average), so the weights of a step depend only on that step's rewards.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

SAW_EPS = 1e-8  # the authors' epsilon, in both denominators of the weights


def _shifted_rewards(rewards: Tensor, shifts: Sequence[float] | Tensor | None) -> Tensor:
    """Validate both arguments; returns the rewards (float) plus their shifts, Tensor[N, K]."""
    if not isinstance(rewards, Tensor) or rewards.dim() != 2 or 0 in rewards.shape:
        raise ValueError(
            "rewards must be a torch.Tensor of shape (N, K) with N, K >= 1, got "
            f"{tuple(rewards.shape) if isinstance(rewards, Tensor) else type(rewards)}"
        )
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    if torch.isinf(rewards).any():
        raise ValueError("rewards contain +-inf (NaN means 'no score'; inf is not a reward)")
    if shifts is None:
        return rewards
    shift_row = torch.as_tensor(shifts, dtype=rewards.dtype, device=rewards.device)
    if shift_row.shape != rewards.shape[1:] or not torch.isfinite(shift_row).all():
        raise ValueError(
            f"shifts must be {rewards.shape[1]} finite values (one per reward), got {shifts!r}"
        )
    return rewards + shift_row


def coefficients_of_variation(
    rewards: Tensor, shifts: Sequence[float] | Tensor | None = None, eps: float = SAW_EPS
) -> Tensor:
    """Each reward's coefficient of variation over the batch, ``std_k / (|mean_k| + eps)``.

    Args:
        rewards: Tensor[N, K], one row per response of the whole batch (every process's rows
            gathered), NaN where a reward gave no score; NaN entries are left out of that
            reward's mean and std.
        shifts: Tensor[K] or K floats added to each reward before its statistics (default 0).
            The coefficient of variation changes with the reward's origin: a reward that can be
            negative should be shifted by its lower bound so that its mean is positive.
        eps: added to ``|mean_k|``; must be > 0.

    Returns:
        Tensor[K], >= 0. The std has Bessel's correction (n - 1). A reward with fewer than two
        scores in the batch has no measurable spread and gets 0, as does a constant reward.
        A reward whose mean is 0 but which varies gets ``std_k / eps``, a huge value: its
        weight then takes nearly all of K (shift such rewards).
    """
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    shifted = _shifted_rewards(rewards, shifts)
    scored = ~torch.isnan(shifted)
    count = scored.sum(dim=0)  # (K,)
    mean = torch.nanmean(shifted, dim=0)  # (K,), NaN where a reward has no score
    deviation = torch.where(scored, shifted - mean.unsqueeze(0), torch.zeros_like(shifted))
    sum_squares = (deviation**2).sum(dim=0)
    variance = sum_squares / (count - 1).clamp(min=1)
    coefficient = variance.sqrt() / (mean.abs() + eps)
    return torch.where(count >= 2, coefficient, torch.zeros_like(coefficient))


def saw_weights(
    rewards: Tensor, shifts: Sequence[float] | Tensor | None = None, eps: float = SAW_EPS
) -> Tensor:
    """SAW's reward weights for one step: ``w_k = K * cv_k / (sum_j cv_j + eps)``.

    ``cv_k`` is :func:`coefficients_of_variation` (same arguments). The weights are >= 0 and sum
    to K (up to eps) whenever some reward varies; when none varies they are all 0, which changes
    nothing, since then every reward's group-normalized advantage is 0 as well.

    Args:
        rewards: Tensor[N, K], the whole batch's rewards (all processes), NaN where a reward
            gave no score.
        shifts: Tensor[K] or K floats added to each reward before its statistics (default 0);
            used only for the weights, never added to the rewards the estimators see.
        eps: in both denominators (the authors use 1e-8); must be > 0.

    Returns:
        Tensor[K] in rewards' dtype, never NaN. A reward with no score at all in the batch gets
        weight 0 (its advantages are NaN and dropped by the estimators' nansum anyway).
    """
    coefficients = coefficients_of_variation(rewards, shifts, eps)
    num_rewards = coefficients.shape[0]
    return num_rewards * coefficients / (coefficients.sum() + eps)
