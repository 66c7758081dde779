"""MRTPO on TRL: `MRTPOConfig` and `MRTPOTrainer`, a thin subclass of TRL 1.16's `GRPOTrainer`.

TRL does everything it already does (generation, vLLM, PEFT, accelerate, loss types, logging).
This subclass changes three things:

1. Rewards. Each `Verifier` runs once per batch through TRL's own `_calculate_rewards` (so the
   gather across processes is TRL's); its verdicts are kept: scores are the rewards, infos feed
   the replay, spans go to the credit maps.
2. Advantages. After TRL has built the batch, `output["advantages"]` is replaced by the
   estimator of `mrtpo.advantages` named by `advantage_estimator` (looked up once): `grpo`/`gdpo`
   (equal to TRL's own numbers), or, for `mrtpo`, the (B, T) per-token advantages from
   replaying this process's rows with the current policy (`mrtpo.relevance.replay_distances`).
   TRL's `_compute_loss` accepts (B, T) advantages as is.
   Under `reward_weighting="saw"` the reward weights c_k of all three estimators are SAW's,
   computed every step from the gathered rewards (`mrtpo.advantages.saw_weights`).
3. Logging. Beta, replay time and share of the step, each reward's replay distance (mean and
   top-10% share) and, under SAW, each reward's weight go through TRL's `self._metrics`; a
   callback writes `metrics.jsonl` and `curves.png` (`mrtpo.logging_callbacks`); every
   `credit_map_steps` steps the credit maps of a few rows go to
   `mrtpo.credit.write_training_maps`.

Several processes: TRL gathers the rewards of the whole generation batch on every process. The
group statistics (Ã_k per group), the batch statistics of S and SAW's weights are computed from
those gathered rewards, and each process replays only its own rows, so a process's per-token
advantages equal the rows a single process would compute for the whole batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import unwrap_model_for_generation

from mrtpo import advantages
from mrtpo.credit import CreditMap, write_training_maps
from mrtpo.credit.replay import last_user_message
from mrtpo.logging_callbacks import REWARD_WEIGHT_PREFIX, MetricsFileCallback
from mrtpo.step_data import ReplayResult, ScoredBatch, StepAdvantages, TokenAdvantages
from mrtpo.verifiers import Verdict, Verifier, completion_text

ESTIMATORS = tuple(advantages.ESTIMATORS)  # "mrtpo", "gdpo", "grpo"
WEIGHTINGS = tuple(advantages.WEIGHTINGS)  # "static", "saw"
REPLAY_MODES = ("leave_one_out", "add_one")
EPS = 1e-4  # TRL's epsilon in both standard deviations
TOP_SHARE = 0.10  # the "top 10% of tokens" of the distance-concentration metric
CREDIT_ROWS_PER_END = 1  # credit maps: this many lowest- and this many highest-reward rows


# ---------------------------------------------------------------------- config


@dataclass
class MRTPOConfig(GRPOConfig):
    """`GRPOConfig` plus MRTPO's settings. Every field is a `TrlParser` flag.

    `advantage_estimator` decides TRL's `multi_objective_aggregation`: "grpo" is
    "sum_then_normalize", "gdpo" and "mrtpo" are "normalize_then_sum" (MRTPO is GDPO with each
    reward's advantage re-allocated among tokens).

    `reward_weighting="saw"` refuses `reward_weights`: SAW's per-step weights are the choice of
    c_k (its authors' estimators have no other coefficient, so a product would have no published
    counterpart), and under GDPO and MRTPO a fixed factor would only tilt SAW's ratios by a
    hand-set preference, which is what SAW replaces (docs/SAW.md).
    """

    advantage_estimator: str = field(
        default="mrtpo",
        metadata={
            "help": "How advantages are computed: 'mrtpo' (each reward's advantage goes to its relevant "
            "tokens), 'gdpo' (normalize each reward per group, sum, normalize over the batch) or 'grpo' "
            "(sum the rewards, normalize per group).",
            "choices": list(ESTIMATORS),
        },
    )
    reward_weighting: str = field(
        default="static",
        metadata={
            "help": "The reward weights c_k: 'static' (reward_weights, all 1 by default) or 'saw' "
            "(SAW, arXiv 2606.07705: each step, every reward's coefficient of variation over the "
            "batch, rescaled to sum to K; refuses reward_weights).",
            "choices": list(WEIGHTINGS),
        },
    )
    saw_reward_shifts: list[float] | None = field(
        default=None,
        metadata={
            "help": "SAW only: one value per reward added before its statistics (a reward that "
            "can be negative: its lower bound); default 0. The rewards themselves are unchanged."
        },
    )
    mrtpo_beta: float = field(
        default=0.5,
        metadata={"help": "MRTPO weighting strength beta in [0, 1]; 0 gives GDPO on every token."},
    )
    mrtpo_warmup_steps: int = field(
        default=10,
        metadata={
            "help": "Optimizer steps over which beta ramps from 0 (smoothstep); 0 = no warm-up."
        },
    )
    replay_mode: str = field(
        default="leave_one_out",
        metadata={
            "help": "Replay contexts: 'leave_one_out' (all information vs. all but reward k) or 'add_one' "
            "(bare prompt vs. prompt plus reward k's information).",
            "choices": list(REPLAY_MODES),
        },
    )
    replay_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Replay contexts (K + 1 per response) run per forward pass; default: mrtpo.relevance's own."
        },
    )
    replay_chunk_size: int | None = field(
        default=None,
        metadata={
            "help": "Response positions per JS-distance chunk; default: mrtpo.relevance's own default."
        },
    )
    shuffle_token_weights: bool = field(
        default=False,
        metadata={"help": "Ablation: permute each response's token weights among its own tokens."},
    )
    credit_map_steps: int = field(
        default=0,
        metadata={
            "help": "Write credit maps of the lowest- and highest-reward rows every N steps (0: never)."
        },
    )
    logging_steps: float = field(
        default=1,
        metadata={
            "help": "Log every N steps (metrics.jsonl gets one line per log). MRTPO default: 1."
        },
    )

    def __post_init__(self) -> None:
        if self.advantage_estimator not in ESTIMATORS:
            raise ValueError(
                f"advantage_estimator must be one of {', '.join(ESTIMATORS)}, got {self.advantage_estimator!r}"
            )
        self._check_reward_weighting()
        if not 0.0 <= self.mrtpo_beta <= 1.0:
            raise ValueError(f"mrtpo_beta must be in [0, 1], got {self.mrtpo_beta!r}")
        if self.mrtpo_warmup_steps < 0:
            raise ValueError(f"mrtpo_warmup_steps must be >= 0, got {self.mrtpo_warmup_steps!r}")
        if self.replay_mode not in REPLAY_MODES:
            raise ValueError(
                f"replay_mode must be one of {', '.join(REPLAY_MODES)}, got {self.replay_mode!r}"
            )
        for name in ("replay_batch_size", "replay_chunk_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (or unset), got {value!r}")
        if self.credit_map_steps < 0:
            raise ValueError(
                f"credit_map_steps must be >= 0 (0 = off), got {self.credit_map_steps!r}"
            )
        # The estimator decides TRL's aggregation; GRPOConfig's default is "sum_then_normalize", so
        # the only visible contradiction is GDPO's aggregation requested with GRPO.
        if not advantages.get_estimator(self.advantage_estimator).normalizes_each_reward:
            if self.multi_objective_aggregation == "normalize_then_sum":
                raise ValueError(
                    "multi_objective_aggregation='normalize_then_sum' is GDPO; with "
                    f"advantage_estimator={self.advantage_estimator!r} leave it at "
                    "'sum_then_normalize' (or use advantage_estimator='gdpo')"
                )
        else:
            self.multi_objective_aggregation = "normalize_then_sum"
        super().__post_init__()

    def _check_reward_weighting(self) -> None:
        if self.reward_weighting not in WEIGHTINGS:
            raise ValueError(
                f"reward_weighting must be one of {', '.join(WEIGHTINGS)}, got {self.reward_weighting!r}"
            )
        weighting = advantages.get_weighting(self.reward_weighting)
        if weighting.per_step and self.reward_weights is not None:
            raise ValueError(
                f"reward_weighting={self.reward_weighting!r} computes the reward weights every "
                f"step and refuses reward_weights (got {self.reward_weights!r}): leave "
                "reward_weights unset, or use reward_weighting='static'"
            )
        if not weighting.per_step and self.saw_reward_shifts is not None:
            raise ValueError(
                "saw_reward_shifts shift the rewards for SAW's statistics; with "
                f"reward_weighting={self.reward_weighting!r} leave them unset"
            )


class _VerdictKeeper:
    """A `Verifier` as a TRL reward function that also keeps its last verdicts.

    TRL calls each reward function once per batch; keeping the verdicts here avoids running a
    verifier a second time for its infos and spans.
    """

    def __init__(self, verifier: Verifier) -> None:
        self.verifier = verifier
        self.verdicts: list[Verdict] | None = None

    @property
    def __name__(self) -> str:
        return self.verifier.name

    def __call__(
        self, prompts: list[Any], completions: list[Any], **columns: Any
    ) -> list[float | None]:
        self.verdicts = self.verifier.verify_batch(prompts, completions, **columns)
        return [verdict.score for verdict in self.verdicts]


class MRTPOTrainer(GRPOTrainer):
    """TRL's `GRPOTrainer` with GRPO, GDPO or MRTPO advantages (see the module docstring).

    Construct it exactly like `GRPOTrainer`, with `args=MRTPOConfig(...)` and the task's
    verifiers as `reward_funcs`. Plain reward functions work too: they have no verifier
    information, so under MRTPO their advantage is spread uniformly over the tokens (as GDPO).
    """

    def __init__(
        self, *args: Any, callbacks: list[TrainerCallback] | None = None, **kwargs: Any
    ) -> None:
        config = kwargs.get("args", args[2] if len(args) > 2 else None)  # GRPOTrainer's order
        if not isinstance(config, MRTPOConfig):
            raise ValueError(f"args must be an MRTPOConfig, got {type(config).__name__}")
        callbacks = list(callbacks or [])
        if not any(isinstance(callback, MetricsFileCallback) for callback in callbacks):
            callbacks.append(MetricsFileCallback())
        super().__init__(*args, callbacks=callbacks, **kwargs)
        # Wrap verifiers after TRL has named the reward functions (names come from `__name__`).
        self.reward_funcs = [
            _VerdictKeeper(func) if isinstance(func, Verifier) else func
            for func in self.reward_funcs
        ]
        self._estimator = advantages.get_estimator(config.advantage_estimator)
        self._weighting = advantages.get_weighting(config.reward_weighting)
        shifts = config.saw_reward_shifts
        if shifts is not None and len(shifts) != len(self.reward_funcs):
            raise ValueError(
                f"saw_reward_shifts has {len(shifts)} values but there are "
                f"{len(self.reward_funcs)} reward functions ({', '.join(self.reward_func_names)})"
            )
        self._scored: ScoredBatch | None = None  # the last `_calculate_rewards`, for advantages
        self._last_credit_step: int | None = None

    # ------------------------------------------------------------------ rewards and verdicts

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's rewards (gathered over processes), keeping this process's batch and verdicts."""
        for func in self.reward_funcs:
            if isinstance(func, _VerdictKeeper):
                func.verdicts = None
        rewards_per_func = super()._calculate_rewards(
            inputs, prompts, completions, completion_ids_list
        )
        start = self.accelerator.process_index * len(prompts)
        self._scored = ScoredBatch(
            prompts=prompts,
            completions=completions,
            completion_ids=completion_ids_list,
            rewards=rewards_per_func,
            verdicts=[
                func.verdicts if isinstance(func, _VerdictKeeper) else None
                for func in self.reward_funcs
            ],
            local=slice(start, start + len(prompts)),
        )
        return rewards_per_func

    # ------------------------------------------------------------------ advantages

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        training = self.model.training
        group_size = self.num_generations if training else self.num_generations_eval
        scored = self._scored
        reward_weights = self._step_reward_weights(scored.rewards)
        response = self._estimator(
            scored.rewards, group_size, reward_weights, scale=self.scale_rewards, eps=EPS
        )[scored.local]
        output["advantages"] = response.to(output["advantages"].device)
        if not training:  # evaluation's loss needs no per-token credit: no replay
            return output

        width = output["completion_ids"].shape[1]
        step = StepAdvantages(reward_weights, response, per_reward=None, token=None)
        if self._estimator.normalizes_each_reward:
            normalized = advantages.per_reward(scored.rewards, group_size, eps=EPS)
            step.per_reward = torch.nan_to_num(normalized[scored.local])
        if self._estimator.token_level:
            step.token = self._token_advantages(step, group_size, width)
            output["advantages"] = step.token.advantages.to(output["completion_ids"].device)
            self._log_replay(step.token)
        if self._credit_maps_due():
            self._write_credit_maps(step, width)
        return output

    def _replay(self, completion_width: int, rows: list[int]) -> ReplayResult:
        """Replay `rows` (indices into this process's rows) with the current policy.

        Distance and mask come back on the accelerator's device, T = `completion_width`. The
        model is unwrapped as TRL unwraps it for generation: ZeRO-3 parameters gathered, FSDP
        parameters summoned, gradient checkpointing off, PEFT adapters active; so the replay is
        a local computation whatever each process replays.
        """
        # Imported here: the replay engine is only needed when something is replayed.
        from mrtpo.relevance import replay_distances

        device = self.accelerator.device
        if not rows:
            num_rewards = len(self.reward_funcs)
            return ReplayResult(
                rows=[],
                distance=torch.zeros(0, num_rewards, completion_width, device=device),
                mask=torch.zeros(0, completion_width, device=device),
                seconds=0.0,
            )
        scored = self._scored
        verdicts = scored.row_verdicts()
        options = {}
        if self.args.replay_chunk_size is not None:
            options["chunk_size"] = self.args.replay_chunk_size
        if self.args.replay_batch_size is not None:
            options["batch_size"] = self.args.replay_batch_size

        started = time.perf_counter()
        with (
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as model,
            torch.no_grad(),
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
        ):
            was_training = model.training
            model.eval()
            try:
                distance, mask = replay_distances(
                    model,
                    self.processing_class,
                    [scored.prompts[i] for i in rows],
                    [scored.completion_ids[i] for i in rows],
                    [[verdict.info for verdict in verdicts[i]] for i in rows],
                    mode=self.args.replay_mode,
                    chat_template_kwargs=self.chat_template_kwargs,  # render as generation did
                    **options,
                )
            finally:
                model.train(was_training)
        if distance.is_cuda:
            torch.cuda.synchronize(distance.device)
        return ReplayResult(
            rows=list(rows),
            distance=_fit_width(distance.float(), completion_width).to(device),
            mask=_fit_width(mask.float(), completion_width).to(device),
            seconds=time.perf_counter() - started,
        )

    def _rows_to_replay(self, normalized: torch.Tensor) -> list[int]:
        """The local rows whose distances can change their advantages.

        normalized: (B, K) this process's Ã_k, NaN as 0. A row whose every Ã_k is 0 gets the
        same advantage on every token whatever its weights, so skipping its replay is exact;
        groups where no reward varies (common early in training) cost nothing.
        """
        return (normalized != 0).any(dim=1).nonzero().flatten().tolist()

    def _token_advantages(
        self, step: StepAdvantages, group_size: int, width: int
    ) -> TokenAdvantages:
        """Per-token advantages (B, T) of this process's rows, aligned with `completion_ids`."""
        scored = self._scored
        replay = self._replay(width, self._rows_to_replay(step.per_reward))
        beta = advantages.beta_at(
            self.state.global_step, self.args.mrtpo_beta, self.args.mrtpo_warmup_steps
        )
        # The estimator takes the whole batch's rewards (group and batch statistics) and
        # distances for every row. Rows that are not replayed (other processes' rows, rows
        # skipped above) get zero distance, i.e. uniform weights; a row's advantage depends only
        # on its own distances and on the rewards, so this equals a single process replaying
        # everything.
        device = self.accelerator.device
        num_rows, num_rewards = scored.rewards.shape
        distance = torch.zeros(num_rows, num_rewards, width, device=device)
        mask = torch.ones(num_rows, width, device=device)
        distance[scored.local][replay.rows] = replay.distance  # `[local]` is a view
        mask[scored.local] = scored.response_mask(width).to(device)
        relevance = advantages.token_weights(distance, mask, beta)
        spread = relevance
        if self.args.shuffle_token_weights:
            # Seeded by step and process so that a resumed run shuffles as the original did.
            generator = torch.Generator(device=distance.device)
            generator.manual_seed(
                self.args.seed + 1_000_003 * self.state.global_step + self.accelerator.process_index
            )
            spread = advantages.shuffle_weights(relevance, mask, generator)
        per_token = self._estimator(
            scored.rewards,
            group_size,
            step.reward_weights,
            scale=self.scale_rewards,
            eps=EPS,
            relevance=advantages.TokenRelevance(spread, mask),
        )
        return TokenAdvantages(beta, replay, relevance[scored.local], per_token[scored.local])

    def _step_reward_weights(self, rewards: torch.Tensor) -> torch.Tensor:
        """This step's c_k, Tensor[K] on rewards' device, from the (N, K) rewards gathered over
        all processes (so every process gets the same weights); logged when they change per step."""
        weights = self._weighting(
            rewards, self.reward_weights.to(rewards.device), self.args.saw_reward_shifts
        )
        if self._weighting.per_step:
            metrics = self._metrics["train" if self.model.training else "eval"]
            for name, weight in zip(self.reward_func_names, weights.tolist(), strict=True):
                metrics[f"{REWARD_WEIGHT_PREFIX}{name}"].append(weight)
        return weights

    # ------------------------------------------------------------------ metrics

    def _log_replay(self, token: TokenAdvantages) -> None:
        metrics = self._metrics["train"]
        replay = token.replay
        metrics["mrtpo/beta"].append(token.beta)
        device = self.accelerator.device
        seconds = torch.tensor([replay.seconds], device=device)
        metrics["mrtpo/replay_seconds"].append(self.accelerator.gather(seconds).max().item())
        num_rows = len(self._scored.prompts)
        counts = torch.tensor([len(replay.rows), num_rows], device=device).float()
        replayed, total_rows = self.accelerator.reduce(counts, reduction="sum").tolist()
        metrics["mrtpo/replayed_rows_share"].append(replayed / total_rows)
        # Distance statistics over the replayed rows.
        token_mean = _distance_token_sums(replay.distance, replay.mask)  # (K, 2): sum, count
        # (K, 2): sum of shares, responses
        top_share = _top_share_sums(replay.distance, replay.mask, TOP_SHARE)
        totals = self.accelerator.reduce(torch.stack([token_mean, top_share]), reduction="sum")
        for k, name in enumerate(self.reward_func_names):
            metrics[f"mrtpo/distance/{name}/mean"].append(_ratio(totals[0, k]))
            metrics[f"mrtpo/distance/{name}/top10_share"].append(_ratio(totals[1, k]))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # The replay's share of the step: replay seconds over TRL's step time, same window.
        metrics = self._metrics["train"]
        replay_seconds, step_time = metrics.get("mrtpo/replay_seconds"), metrics.get("step_time")
        if self.model.training and replay_seconds and step_time and sum(step_time) > 0:
            metrics["mrtpo/replay_share"].append(sum(replay_seconds) / sum(step_time))
        super().log(logs, start_time)

    # ------------------------------------------------------------------ credit maps

    def _credit_maps_due(self) -> bool:
        """Every `credit_map_steps` optimizer steps (from step 0). The same answer on every
        process."""
        steps, step = self.args.credit_map_steps, self.state.global_step
        if steps == 0:
            return False
        if self._last_credit_step is not None and step - self._last_credit_step < steps:
            return False
        return True

    def _write_credit_maps(self, step: StepAdvantages, width: int) -> None:
        """Maps of the lowest- and highest-total-reward rows of the main process's share.

        GRPO and GDPO replay just those rows (to show where MRTPO would put the credit beside
        their uniform assignment), as does MRTPO for a chosen row it skipped; every process
        replays its own pick (a local computation, see `_replay`); the main process writes.
        """
        self._last_credit_step = self.state.global_step
        scored = self._scored
        total = (torch.nan_to_num(scored.rewards[scored.local]) * step.reward_weights).sum(dim=1)
        order = torch.argsort(total, stable=True).tolist()
        chosen = list(dict.fromkeys(order[:CREDIT_ROWS_PER_END] + order[-CREDIT_ROWS_PER_END:]))
        replayed = step.token.replay.rows if step.token is not None else []
        missing = [i for i in chosen if i not in replayed]
        # GDPO/GRPO, or MRTPO rows skipped because no reward varied
        extra = self._replay(width, rows=missing) if missing else None
        if not self.accelerator.is_main_process:
            return
        verdicts = scored.row_verdicts()
        maps = []
        for rank, i in enumerate(chosen):
            label = "lowest" if rank < CREDIT_ROWS_PER_END and len(chosen) > 1 else "highest"
            title = (
                f"{label} total reward ({total[i].item():.3g}), "
                f"step {self.state.global_step}, {self._estimator.name}"
            )
            maps.append(self._credit_map(step, i, extra, verdicts[i], title))
        write_training_maps(self.args.output_dir, self.state.global_step, maps)

    def _credit_map(
        self,
        step: StepAdvantages,
        row: int,
        extra: ReplayResult | None,
        verdicts: list[Verdict],
        title: str,
    ) -> CreditMap:
        """The map of one local row, arrays cut to the response's own length.

        MRTPO: its weights and per-token advantages. GDPO/GRPO: no weights (uniform) and the
        response's advantage on every token; GRPO has no per-reward advantages.
        """
        scored, token = self._scored, step.token
        length = len(scored.completion_ids[row])
        weights = None
        if token is not None and row in token.replay.rows:
            distance = token.replay.distance[token.replay.rows.index(row)]
            weights = token.relevance[row]
        else:  # replayed for the map only
            j = extra.rows.index(row)
            distance = extra.distance[j]
            if token is not None:
                weights = advantages.token_weights(
                    extra.distance[j : j + 1], extra.mask[j : j + 1], token.beta
                )[0]
        if token is not None:
            token_advantages = token.advantages[row, :length]
        else:
            token_advantages = step.response[row].expand(length)
        has_per_reward = step.per_reward is not None
        return CreditMap.from_replay(
            self.processing_class,
            scored.completion_ids[row],
            self.reward_func_names,
            distance[:, :length].cpu(),
            weights=None if weights is None else weights[:, :length].cpu(),
            reward_advantages=step.per_reward[row].cpu() if has_per_reward else None,
            token_advantages=token_advantages.cpu(),  # A_t, as the loss gets it
            verdicts=verdicts,
            text=completion_text(scored.completions[row]),
            gdpo_advantage=step.response[row].item() if has_per_reward else None,
            reward_weights=step.reward_weights.cpu(),
            prompt=last_user_message(scored.prompts[row]),
            title=title,
        )


# ---------------------------------------------------------------------- helpers


def _fit_width(x: torch.Tensor, width: int) -> torch.Tensor:
    """Pad with zeros or cut the last dimension to `width` (TRL may pad to a multiple)."""
    if x.shape[-1] >= width:
        return x[..., :width]
    return torch.nn.functional.pad(x, (0, width - x.shape[-1]))


def _ratio(pair: torch.Tensor) -> float:
    return (pair[0] / pair[1]).item() if pair[1] > 0 else float("nan")


def _distance_token_sums(distance: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per reward: (sum of distance over response tokens, number of tokens). Shape (K, 2)."""
    sums = (distance * mask.unsqueeze(1)).sum(dim=(0, 2))
    counts = mask.sum().expand_as(sums)
    return torch.stack([sums, counts], dim=1)


def _top_share_sums(distance: torch.Tensor, mask: torch.Tensor, fraction: float) -> torch.Tensor:
    """Per reward: (sum over responses of the share of the distance on the top `fraction` of
    the response's tokens, number of responses with a non-zero distance). Shape (K, 2).

    distance: (B, K, T); mask: (B, T).
    """
    masked = distance * mask.unsqueeze(1)
    ranked = masked.sort(dim=-1, descending=True).values.cumsum(dim=-1)  # (B, K, T)
    num_tokens = mask.sum(dim=-1)  # (B,)
    top = (num_tokens * fraction).ceil().clamp(min=1).long() - 1  # index of the last top token
    top_sum = ranked.gather(-1, top.view(-1, 1, 1).expand(-1, distance.shape[1], 1)).squeeze(-1)
    total = ranked[..., -1]  # (B, K)
    counted = (total > 0) & (num_tokens > 0).unsqueeze(1)
    shares = torch.where(counted, top_sum / total.clamp(min=1e-12), torch.zeros_like(total))
    return torch.stack([shares.sum(dim=0), counted.sum(dim=0).to(shares.dtype)], dim=1)


__all__ = ["ESTIMATORS", "REPLAY_MODES", "WEIGHTINGS", "MRTPOConfig", "MRTPOTrainer"]
