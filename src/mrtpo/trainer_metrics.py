"""What `MRTPOTrainer` logs beside TRL's own metrics: `MetricsMixin`, which it inherits.

Beta, replay time and share of the step, the shares of rows and of contexts replayed, the share
of rows the bounded normalization changed, each reward's replay distance over the pairs where it
was replayed (mean and top-10% share), the reallocation ratio (what MRTPO moves over GDPO's
part, `mrtpo/reallocation_ratio`, infinite where GDPO's part is 0, and its two parts,
`mrtpo/reallocation_rms` and `mrtpo/gdpo_advantage_rms`) and, under SAW, each reward's weight
and the weighted reward trained on go through TRL's `self._metrics`; TRL's completions table gets the advantages
trained on. A callback writes `metrics.jsonl` and `curves.png` (`mrtpo.logging_callbacks`).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import torch

from mrtpo import advantages
from mrtpo.step_data import ScoredBatch, StepAdvantages

if TYPE_CHECKING:
    from accelerate import Accelerator

    from mrtpo.config import MRTPOConfig
    from mrtpo.reward_weighting import RewardWeighting

TOP_SHARE = 0.10  # the "top 10% of tokens" of the distance-concentration metric
# A run whose first this many generation batches (one per optimizer step with the defaults) have
# no group whose rewards vary is warned about once: every advantage is 0, nothing is learned.
SILENT_BATCHES_BEFORE_WARNING = 3

logger = logging.getLogger("mrtpo.trainer")  # the trainer's logger: its warnings keep its name


class MetricsMixin:
    """The metric methods of `mrtpo.trainer.MRTPOTrainer`, a `GRPOTrainer`; `log` wraps TRL's.

    What the methods need from the trainer is declared below the docstring, and nothing else is
    used (checked by tests/test_trainer.py).
    """

    # Needed from the trainer: annotations only (nothing defined here, so nothing of TRL's
    # shadowed). TRL's: its metric windows and completions table, which `log` averages and
    # prints; the rest as TRL sets them.
    _metrics: dict[str, defaultdict[str, list[float]]]
    _logs: dict[str, Any]
    model: torch.nn.Module
    args: MRTPOConfig
    accelerator: Accelerator
    reward_funcs: list[Any]
    reward_func_names: list[str]
    # MRTPOTrainer's: the reward weighting (static weights, or SAW's per step).
    _weighting: RewardWeighting

    # Whether a training generation batch so far had a group whose rewards vary, how many had
    # none, and whether the run was warned (`_watch_learning_signal`); set on the instance.
    _signal_seen: bool = False
    _silent_batches: int = 0
    _warned_silent: bool = False

    def _log_trained_rewards(
        self,
        scored: ScoredBatch,
        reward_weights: torch.Tensor,
        batch_response: torch.Tensor,
        group_size: int,
        eps: float,
    ) -> None:
        """What the trainer trains on, where TRL's own logs differ.

        TRL's completions table gets each response's advantage as this estimator computed it
        (TRL logged its own, from the static weights), and under per-step weights (SAW) the
        weighted reward sum_k c_k r_k with this step's c_k goes to `mrtpo/weighted_reward` (TRL's
        `reward` uses the static weights). `mrtpo/opposite_sign_rows_share`: the rows where
        rewards' Ã_k have opposite signs, where per-token credit can differ from GDPO's. eps:
        `mrtpo.advantages.EPS`, as the advantages use it.
        """
        table = self._logs["advantages"]
        for _ in range(min(len(batch_response), len(table))):
            table.pop()
        table.extend(batch_response.tolist())
        metrics = self._metrics["train" if self.model.training else "eval"]
        # From the gathered rewards: the same on every process, for every estimator.
        opposite = advantages.opposite_sign_rows(scored.rewards, group_size, eps)
        metrics["mrtpo/opposite_sign_rows_share"].append(opposite.float().mean().item())
        varying = varying_groups(scored.rewards, group_size)
        metrics["mrtpo/varying_groups"].append(varying.float().mean().item())
        if self.model.training:
            self._watch_learning_signal(scored.rewards, group_size, bool(varying.any()))
        if not self._weighting.per_step:
            return
        rewards = scored.rewards
        weighted = (rewards * reward_weights.to(rewards.device).unsqueeze(0)).nansum(dim=1)
        weighted = weighted[~torch.isnan(rewards).all(dim=1)]  # unscorable rows left out, as TRL
        metrics["mrtpo/weighted_reward"].append(weighted.mean().item())
        metrics["mrtpo/weighted_reward_std"].append(
            weighted.std().item() if weighted.numel() > 1 else 0.0
        )

    def _watch_learning_signal(
        self, rewards: torch.Tensor, group_size: int, any_varying: bool
    ) -> None:
        """Warn once when the first `SILENT_BATCHES_BEFORE_WARNING` training generation batches
        have no group whose rewards vary: every advantage is then 0 and the run learns nothing,
        most often because the model never produces the task's output format (every format
        reward 0), which a supervised cold start teaches it. Quiet for good once a group varies.

        rewards: the (N, K) gathered rewards of this batch (the same on every process).
        """
        if self._signal_seen or self._warned_silent:
            return
        if any_varying:
            self._signal_seen = True
            return
        self._silent_batches += 1
        if self._silent_batches < SILENT_BATCHES_BEFORE_WARNING:
            return
        self._warned_silent = True
        if not self.accelerator.is_main_process:
            return
        means = torch.nanmean(rewards.float(), dim=0).tolist()
        rewards_seen = ", ".join(
            f"{name} {mean:.2f}" for name, mean in zip(self.reward_func_names, means, strict=True)
        )
        logger.warning(
            "no group's rewards have varied in the first %d generation batches (%d completions "
            "a batch, %d per prompt; this batch's reward means: %s): every completion of a "
            "prompt gets the same rewards, so every advantage is 0 and training learns nothing. "
            "The likely cause: the model never produces the task's output format, so every "
            "format reward is 0. Fix: run the supervised cold start first, `mrtpo sft --task "
            "TASK --model_name_or_path MODEL --output_dir SFT_DIR`, and train from SFT_DIR "
            "(README); a hotter temperature or more num_generations can also help a model that "
            "only rarely produces it.",
            self._silent_batches,
            len(rewards),
            group_size,
            rewards_seen,
        )

    def _log_replay(
        self, scored: ScoredBatch, step: StepAdvantages, group_size: int, eps: float
    ) -> None:
        """The replay's metrics (see the module docstring); eps: `mrtpo.advantages.EPS`."""
        metrics = self._metrics["train"]
        token = step.token
        replay = token.replay
        if token.slope is None:  # else logged per micro-batch, see `_prepare_inputs`
            metrics["mrtpo/beta"].append(token.beta)
        if self.args.bounded_token_advantages:  # from the gathered rewards: same on every process
            bounded = advantages.bounded_rows(scored.rewards, group_size, step.reward_weights, eps)
            metrics["mrtpo/bounded_rows_share"].append(bounded.float().mean().item())
        device = self.accelerator.device
        seconds = torch.tensor([replay.seconds], device=device)
        metrics["mrtpo/replay_seconds"].append(self.accelerator.gather(seconds).max().item())
        num_rows, num_rewards = len(scored.prompts), len(self.reward_funcs)
        # A replayed row runs its reference context and one per replayed reward, of K + 1.
        contexts = len(replay.rows) + replay.replayed.sum().item()
        counts = torch.tensor(
            [len(replay.rows), num_rows, contexts, num_rows * (num_rewards + 1)], device=device
        ).float()
        rows, total_rows, contexts, total_contexts = self.accelerator.reduce(
            counts, reduction="sum"
        ).tolist()
        metrics["mrtpo/replayed_rows_share"].append(rows / total_rows)
        metrics["mrtpo/replayed_contexts_share"].append(contexts / total_contexts)
        # Distance statistics over the replayed (row, reward) pairs only.
        token_mean = _distance_token_sums(replay.distance, replay.mask, replay.replayed)
        # (K, 2): sum of shares, responses
        top_share = _top_share_sums(replay.distance, replay.mask, TOP_SHARE, replay.replayed)
        totals = self.accelerator.reduce(torch.stack([token_mean, top_share]), reduction="sum")
        for k, name in enumerate(self.reward_func_names):
            metrics[f"mrtpo/distance/{name}/mean"].append(_ratio(totals[0, k]))
            metrics[f"mrtpo/distance/{name}/top10_share"].append(_ratio(totals[1, k]))
        # What MRTPO moves (A_t minus GDPO's advantage, D_t / d of docs/METHOD.md) against
        # GDPO's part, root mean squares over the trained tokens: above 1, the re-allocation
        # dominates the advantage (at this step's beta; it grows linearly with beta). Both
        # parts are logged too: where the rewards cancel, GDPO's part is 0 while MRTPO still
        # moves credit, and the ratio is infinite (see `reallocation_ratio`).
        trained = scored.trained_mask(token.advantages.shape[1]).to(device)
        response = step.response.to(device).unsqueeze(1) * trained
        moved = (token.advantages.to(device) - response) * trained
        sums = torch.stack([moved.square().sum(), response.square().sum(), trained.sum().float()])
        moved_squares, gdpo_squares, tokens = self.accelerator.reduce(
            sums.float(), reduction="sum"
        ).tolist()
        if tokens > 0:
            metrics["mrtpo/reallocation_rms"].append(math.sqrt(moved_squares / tokens))
            metrics["mrtpo/gdpo_advantage_rms"].append(math.sqrt(gdpo_squares / tokens))
        metrics["mrtpo/reallocation_ratio"].append(reallocation_ratio(moved_squares, gdpo_squares))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # The replay's share of the step: replay seconds over TRL's step time, same window.
        metrics = self._metrics["train"]
        replay_seconds, step_time = metrics.get("mrtpo/replay_seconds"), metrics.get("step_time")
        if self.model.training and replay_seconds and step_time and sum(step_time) > 0:
            metrics["mrtpo/replay_share"].append(sum(replay_seconds) / sum(step_time))
        super().log(logs, start_time)


def varying_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Tensor[N / group_size] bool: the groups where some reward takes two different values
    among the rows it scored (NaN: no score, left out). Only there is any advantage not 0
    (GRPO's summed reward can still cancel; GDPO and MRTPO learn from each reward).

    rewards: (N, K), rows grouped by prompt in runs of group_size.
    """
    grouped = rewards.view(-1, group_size, rewards.shape[1])
    scored = ~torch.isnan(grouped)
    highest = torch.where(scored, grouped, -math.inf).amax(dim=1)
    lowest = torch.where(scored, grouped, math.inf).amin(dim=1)
    return (highest > lowest).any(dim=1)  # -inf > inf never: a reward with no score is flat


def reallocation_ratio(moved_squares: float, gdpo_squares: float) -> float:
    """sqrt(moved_squares / gdpo_squares): what MRTPO moves over GDPO's part, from their sums of
    squares over the trained tokens.

    Where GDPO's part is 0 and MRTPO moves credit (the rewards cancel in GDPO's sum), the
    ratio is infinite and returned as `math.inf`, not NaN: TRL's `log` averages a metric's
    window leaving NaN out (and logs None when nothing is left), so a NaN would vanish from
    exactly the steps where the re-allocation is all there is; an infinity survives the
    average (a window with one such step averages to inf). NaN only when neither part has
    anything (no reward varies: nothing to move and nothing moved).
    """
    if gdpo_squares > 0:
        return math.sqrt(moved_squares / gdpo_squares)
    return math.inf if moved_squares > 0 else math.nan


def _ratio(pair: torch.Tensor) -> float:
    return (pair[0] / pair[1]).item() if pair[1] > 0 else float("nan")


def _distance_token_sums(
    distance: torch.Tensor, mask: torch.Tensor, replayed: torch.Tensor
) -> torch.Tensor:
    """Per reward: (sum of distance over the response tokens of the rows where it was
    replayed, number of those tokens). Shape (K, 2).

    distance: (B, K, T); mask: (B, T); replayed: (B, K) bool.
    """
    counted = mask.unsqueeze(1) * replayed.unsqueeze(-1)  # (B, K, T)
    sums = (distance * counted).sum(dim=(0, 2))
    return torch.stack([sums, counted.sum(dim=(0, 2))], dim=1)


def _top_share_sums(
    distance: torch.Tensor,
    mask: torch.Tensor,
    fraction: float,
    replayed: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per reward: (sum over responses of the share of the distance on the top `fraction` of
    the response's tokens, number of responses with a non-zero distance where the reward was
    replayed). Shape (K, 2).

    distance: (B, K, T); mask: (B, T); replayed: (B, K) bool, None: every pair.
    """
    masked = distance * mask.unsqueeze(1)
    ranked = masked.sort(dim=-1, descending=True).values.cumsum(dim=-1)  # (B, K, T)
    num_tokens = mask.sum(dim=-1)  # (B,)
    top = (num_tokens * fraction).ceil().clamp(min=1).long() - 1  # index of the last top token
    top_sum = ranked.gather(-1, top.view(-1, 1, 1).expand(-1, distance.shape[1], 1)).squeeze(-1)
    total = ranked[..., -1]  # (B, K)
    counted = (total > 0) & (num_tokens > 0).unsqueeze(1)
    if replayed is not None:
        counted &= replayed
    shares = torch.where(counted, top_sum / total.clamp(min=1e-12), torch.zeros_like(total))
    return torch.stack([shares.sum(dim=0), counted.sum(dim=0).to(shares.dtype)], dim=1)
