"""Reward weightings: how a step's reward weights c_k are chosen, as pure functions on tensors.

The estimators of ``mrtpo.advantages`` take the c_k; they are chosen here, each weighting
registered by name (``WEIGHTINGS``, ``get_weighting``): ``"static"`` (fixed weights, TRL's
``reward_weights``) or ``"saw"`` (SAW, Stage-Aware Dynamic Weighting, arXiv 2606.07705: weights
recomputed every step from the batch's rewards, each reward's coefficient of variation rescaled
to sum to K; ``saw_weights``, ``docs/SAW.md``). ``mrtpo.advantages`` re-exports the names the
trainer and the configuration use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mrtpo.reward_batch import RewardWeights, check_rewards, check_weights, nanstd, registered

SAW_EPS = 1e-8  # SAW's epsilon (the authors' code), in both denominators of its weights


def _shifted(rewards: Tensor, shifts: Sequence[float] | Tensor | None) -> Tensor:
    """Checked rewards (float) plus their per-reward shifts: Tensor[N, K]."""
    rewards = check_rewards(rewards, 1)
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
            reward's mean and std (as TRL's ``nanmean`` and ``nanstd`` leave them out).
        shifts: Tensor[K] or K floats added to each reward before its statistics (default 0).
            The coefficient of variation depends on the reward's origin: a reward that can be
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
    shifted = _shifted(rewards, shifts)
    count = (~torch.isnan(shifted)).sum(dim=0)  # (K,)
    # The std of the scored values only; 0 instead of TRL's NaN below two scores (no spread).
    std = torch.nan_to_num(nanstd(shifted, dim=0), nan=0.0)
    coefficient = std / (torch.nanmean(shifted, dim=0).abs() + eps)
    return torch.where(count >= 2, coefficient, torch.zeros_like(coefficient))


def saw_weights(
    rewards: Tensor, shifts: Sequence[float] | Tensor | None = None, eps: float = SAW_EPS
) -> Tensor:
    """SAW's reward weights for one step: ``w_k = K * cv_k / (sum_j cv_j + eps)``.

    ``cv_k`` is :func:`coefficients_of_variation` (same arguments). Nothing is carried from one
    step to the next (no moving average, no clipping). The weights are >= 0 and sum to K (up to
    eps) whenever some reward varies; when none varies they are all 0, which changes nothing,
    since every reward's group-normalized advantage is 0 then as well.

    Args:
        rewards: Tensor[N, K], the whole batch's rewards (all processes), NaN where a reward
            gave no score.
        shifts: Tensor[K] or K floats added to each reward before its statistics (default 0);
            used for the weights only, never added to the rewards the estimators see.
        eps: in both denominators (SAW's code: 1e-8); must be > 0.

    Returns:
        Tensor[K] in rewards' dtype (float32 for integer rewards), never NaN. A reward with no
        score at all in the batch gets weight 0 (its advantages are NaN, dropped by the
        estimators' nansum anyway).
    """
    coefficients = coefficients_of_variation(rewards, shifts, eps)
    return coefficients.shape[0] * coefficients / (coefficients.sum() + eps)


# ----------------------------------------------------------------------------- registry


RewardShifts = Sequence[float] | Tensor | None  # Tensor[K] or K floats added before statistics
# The common signature: (rewards, static weights, shifts) -> the step's c_k, Tensor[K].
WeighFn = Callable[[Tensor, RewardWeights, RewardShifts], Tensor]


@dataclass(frozen=True)
class RewardWeighting:
    """A registered way of choosing a step's reward weights c_k; call it as ``__call__`` says.

    weigh: the function, with the common signature ``WeighFn``.
    per_step: the weights are computed from each step's rewards (so they are logged every
        step); such a weighting replaces the static weights and refuses any but all 1.
    """

    name: str
    weigh: WeighFn
    per_step: bool

    def __call__(
        self, rewards: Tensor, static_weights: RewardWeights = None, shifts: RewardShifts = None
    ) -> Tensor:
        """The c_k of a step.

        Args:
            rewards: Tensor[N, K], the whole batch's rewards (every process's rows), NaN where
                a reward gave no score.
            static_weights: the configured c_k, Tensor[K] or K floats (default all 1).
            shifts: Tensor[K] or K floats, added to the rewards before a per-step weighting's
                statistics (never to the rewards themselves); None for a static weighting.

        Returns:
            Tensor[K] in rewards' dtype (float32 for integer rewards), finite.
        """
        return self.weigh(rewards, static_weights, shifts)


WEIGHTINGS: dict[str, RewardWeighting] = {}


def register_weighting(name: str, *, per_step: bool) -> Callable[[WeighFn], WeighFn]:
    """Decorator: register a ``WeighFn`` as ``name`` (``per_step`` as ``RewardWeighting``'s)."""

    def register(weigh: WeighFn) -> WeighFn:
        if name in WEIGHTINGS:
            raise ValueError(f"a reward weighting named {name!r} is already registered")
        WEIGHTINGS[name] = RewardWeighting(name, weigh, per_step)
        return weigh

    return register


def get_weighting(name: str) -> RewardWeighting:
    """The reward weighting registered as ``name``; the error names the valid choices."""
    return registered(WEIGHTINGS, name, "reward weighting")


@register_weighting("static", per_step=False)
def _static_weigh(rewards, static_weights, shifts) -> Tensor:
    """The configured weights as they are (all 1 by default); shifts have no use here."""
    if shifts is not None:
        raise ValueError("shifts apply to a per-step weighting (saw) only; static got some")
    return check_weights(static_weights, check_rewards(rewards, 1))


@register_weighting("saw", per_step=True)
def _saw_weigh(rewards, static_weights, shifts) -> Tensor:
    """``saw_weights``. Static weights other than all 1 (TRL's value when none are given) are
    refused: SAW's weights are the choice of c_k, a product with fixed ones has no published
    counterpart (docs/SAW.md)."""
    rewards = check_rewards(rewards, 1)
    if (check_weights(static_weights, rewards) != 1).any():
        raise ValueError(
            "saw computes the reward weights from each batch: static weights must be all 1 "
            f"(or None), got {static_weights!r}"
        )
    return saw_weights(rewards, shifts)
