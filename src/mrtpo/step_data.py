"""What one training step of `MRTPOTrainer` passes from hook to hook, typed.

TRL's scoring produces a `ScoredBatch`; the replay of some rows a `ReplayResult`; a token-level
estimator (MRTPO) a `TokenAdvantages`; every estimator a `StepAdvantages`, which the metrics and
the credit maps read instead of recomputing anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from mrtpo.verifiers import Verdict

# B: this process's rows; N: the whole generation batch's (all processes); K: reward functions;
# T: the batch's completion width; R: rows replayed.


@dataclass
class ScoredBatch:
    """What TRL's scoring (`_calculate_rewards`) saw and produced for one generation batch."""

    prompts: list[Any]  # [B] prompts (text or chat messages)
    completions: list[Any]  # [B] completions as the reward functions got them
    completion_ids: list[list[int]]  # [B] response token ids, unpadded
    rewards: torch.Tensor  # (N, K) gathered over processes; NaN where a reward gave no score
    verdicts: list[list[Verdict] | None]  # [K] a verifier's [B] verdicts; None: plain function
    local: slice  # this process's rows of `rewards`
    # (B, T) TRL's loss mask, completion_mask * tool_mask (tool outputs are not trained); set
    # once TRL has built the batch. None before: every response token counts.
    loss_mask: torch.Tensor | None = None

    def row_verdicts(self) -> list[list[Verdict]]:
        """[B][K] verdicts; a plain function's is its score with no information."""
        local_rewards = self.rewards[self.local]
        rows: list[list[Verdict]] = [[] for _ in self.prompts]
        for k, verdicts in enumerate(self.verdicts):
            for i, row in enumerate(rows):
                if verdicts is not None:
                    row.append(verdicts[i])
                else:
                    score = local_rewards[i, k].item()
                    row.append(Verdict(None if math.isnan(score) else score, ""))
        return rows

    def response_mask(self, width: int) -> torch.Tensor:
        """(B, T=width) float: 1 on each row's response tokens."""
        lengths = torch.tensor([len(ids) for ids in self.completion_ids])
        return (torch.arange(width) < lengths.unsqueeze(1)).float()

    def trained_mask(self, width: int) -> torch.Tensor:
        """(B, T=width) float: 1 on the tokens TRL's loss trains (`loss_mask`, else every
        response token). The relevance weights average 1 over these tokens, so that their token
        mean of MRTPO's advantages stays GDPO's advantage."""
        if self.loss_mask is None:
            return self.response_mask(width)
        if self.loss_mask.shape != (len(self.completion_ids), width):
            raise ValueError(
                f"loss_mask has shape {tuple(self.loss_mask.shape)}, expected "
                f"({len(self.completion_ids)}, {width})"
            )
        return self.loss_mask.float().cpu()


@dataclass
class ReplayResult:
    """One replay of some of this process's rows with the current policy (accelerator device)."""

    rows: list[int]  # [R] the replayed rows, indices into this process's rows
    distance: torch.Tensor  # (R, K, T) JS distance of each reward's information at each token
    mask: torch.Tensor  # (R, T) 1 on the response tokens TRL trains (ScoredBatch.trained_mask)
    seconds: float  # wall time of the replay
    # (R, K) bool: the rewards replayed on each row; a reward not replayed (its Ã_k is 0, so its
    # weights cannot matter) has distance 0 there, not measured
    replayed: torch.Tensor
    # (R, K, T) token_relevance="contrastive" only: the distances under the placebo's
    # information, which `distance` is the own's minus (clamped at 0); None otherwise
    placebo_distance: torch.Tensor | None = None


@dataclass
class TokenAdvantages:
    """A token-level estimator's (MRTPO's) part of a step, this process's rows."""

    beta: float  # the weighting strength at this step (after warm-up)
    # the (row, reward) pairs where Ã_k is not 0 (elsewhere the weights cannot matter)
    replay: ReplayResult
    relevance: torch.Tensor  # (B, K, T) w_{k,t} before any shuffle; 1 on pairs not replayed
    advantages: torch.Tensor  # (B, T) A_t at `beta`, as the loss gets them
    # (B, T) dA_t/dbeta, when the batch serves several optimizer steps (each at its own beta)
    slope: torch.Tensor | None = None


@dataclass
class StepAdvantages:
    """The advantages a training generation batch got, for the metrics and the credit maps."""

    reward_weights: torch.Tensor  # (K,) c_k
    response: torch.Tensor  # (B,) each response's advantage: GRPO's, or GDPO's (= MRTPO's mean)
    per_reward: torch.Tensor | None  # (B, K) Ã_k, NaN as 0; None where rewards are summed first
    token: TokenAdvantages | None  # None for response-level estimators
