"""MRTPO on TRL: `MRTPOConfig` and `MRTPOTrainer`, a thin subclass of TRL 1.16's `GRPOTrainer`.

TRL does everything it already does (generation, vLLM, PEFT, accelerate, loss types, logging).
This subclass changes three things:

1. Rewards. Each `Verifier` runs once per batch through TRL's own `_calculate_rewards` (so the
   gather across processes is TRL's); its verdicts are kept: scores are the rewards, infos feed
   the replay, spans go to the credit maps.
2. Advantages. After TRL has built the batch, `output["advantages"]` is replaced by the
   estimator of `mrtpo.advantages` named by `advantage_estimator` (looked up once): `grpo`/`gdpo`
   (equal to TRL's own numbers), or, for `mrtpo`, the (B, T) per-token advantages from
   replaying this process's rows with the current policy (`mrtpo.relevance.replay_distances`;
   with `token_relevance="contrastive"`, the own information's distance minus a placebo's;
   for the entropy control `token_relevance="entropy"`, the policy's own next-token
   entropy with no replay; with TRL's temperature, logit transforms and autocast), credit only
   on the tokens TRL trains (`completion_mask * tool_mask`). TRL's `_compute_loss` accepts (B, T) advantages as is; its
   sequence-level sign-based options get each response's advantage (`mrtpo.trainer_loss_options`).
   On a batch whose rewards cancel in GDPO's sum S (std_batch S near 0), MRTPO's re-allocated
   part is bounded by the per-reward scale (`bounded_token_advantages`, docs/METHOD.md).
   Under `reward_weighting="saw"` the reward weights c_k of all three estimators are SAW's,
   computed every step from the gathered rewards (`mrtpo.advantages.saw_weights`).
   Each micro-batch trains at the beta of its own optimizer step, whatever the alignment of
   generations and steps, and every prompt is checked for the replay before generation, on
   every process at once.
3. Logging (`mrtpo.trainer_metrics`). Beta, the replay's time and reach, each reward's replay
   distances, the reallocation ratio and, under SAW, each reward's weight and the weighted
   reward go through TRL's `self._metrics`; TRL's completions table gets the advantages trained
   on; every `credit_map_steps` steps the credit maps of a few rows go to
   `mrtpo.credit.write_training_maps` (`mrtpo.trainer_credit`).

With `share_prompt`, each group's prompt runs once (`mrtpo.trainer_shared_prompt`).

Several processes: TRL gathers the rewards of the whole generation batch on every process. The
group statistics (Ã_k per group), the batch statistics of S and SAW's weights are computed from
those gathered rewards, and each process replays only its own rows, so a process's per-token
advantages equal the rows a single process would compute for the whole batch.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback
from trl import GRPOTrainer

from mrtpo import advantages, shared_prompt
from mrtpo.advantages import EPS as EPS  # its home; imported from here by older code
from mrtpo.config import ESTIMATORS, REPLAY_INFORMATION, REPLAY_MODES, WEIGHTINGS, MRTPOConfig
from mrtpo.logging_callbacks import REWARD_WEIGHT_PREFIX, MetricsFileCallback
from mrtpo.sharding import check_replay_backend, full_parameters
from mrtpo.step_data import ReplayResult, ScoredBatch, StepAdvantages, TokenAdvantages
from mrtpo.trainer_beta_auto import SUMMED_ADVANTAGE, AutoBetaMixin, summed_reward_advantages
from mrtpo.trainer_credit import CreditMapsMixin
from mrtpo.trainer_loss_options import SequenceLevelLossMixin
from mrtpo.trainer_metrics import MetricsMixin
from mrtpo.trainer_metrics import _top_share_sums as _top_share_sums  # tests import it from here
from mrtpo.trainer_shared_prompt import SharedPromptMixin
from mrtpo.verifiers import Verdict, Verifier

# Keys of a generation batch that serves several optimizer steps (see `_prepare_inputs`): its
# advantages' slope in beta (B, T), and the beta they were computed at (a 0-dim tensor, which
# TRL's shuffle and split leave whole).
BETA_SLOPE = "mrtpo_advantages_beta_slope"
GENERATION_BETA = "mrtpo_generation_beta"


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


class MRTPOTrainer(
    AutoBetaMixin,  # first: its forward wraps the shared-prompt one (the probe catches the loss's)
    SharedPromptMixin,
    MetricsMixin,
    CreditMapsMixin,
    SequenceLevelLossMixin,
    GRPOTrainer,
):
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
        if self._estimator.token_level and self.environment_factories is not None:
            # TRL renders each row with its environment's own tools; the replay takes one list.
            raise ValueError(
                "environment_factories is not supported with advantage_estimator="
                f"{config.advantage_estimator!r}: the replay renders every row with one tool list; "
                "use advantage_estimator='gdpo' with environments"
            )
        if self._estimator.token_level or config.credit_map_steps:
            check_replay_backend(self.accelerator, config.ds3_gather_for_generation)
        self._weighting = advantages.get_weighting(config.reward_weighting)
        shifts = config.saw_reward_shifts
        if shifts is not None and len(shifts) != len(self.reward_funcs):
            raise ValueError(
                f"saw_reward_shifts has {len(shifts)} values but there are "
                f"{len(self.reward_funcs)} reward functions ({', '.join(self.reward_func_names)})"
            )
        # The last `_calculate_rewards`'s batch: TRL gives that hook no way to return it to
        # `_generate_and_score_completions` (its caller), which reads it once and passes it on
        # as an argument. Left in place for observers (tests, benchmarks).
        self._scored: ScoredBatch | None = None
        self._last_credit_step: int | None = None
        self._shares_prompt = config.share_prompt and self._install_shared_prompt()
        # (optimizer step, index of the current micro-batch in it), kept by `_prepare_inputs`
        self._position_in_step: tuple[int, int] = (-1, -1)
        if config.beta_is_auto:  # `mrtpo.trainer_beta_auto`
            self._init_auto_beta()

    # Methods in the order TRL calls them in a training step: `_prepare_inputs` (every
    # micro-batch) -> `_generate_and_score_completions` (every new generation batch) ->
    # `_calculate_rewards`; then, inside `_compute_loss`, the sign-based loss options; then `log`.
    # The shared-prompt hooks, the metrics (`log` among them) and the credit maps come from
    # mixins, one module each: `mrtpo.trainer_shared_prompt`, `mrtpo.trainer_metrics`,
    # `mrtpo.trainer_credit`.

    # ------------------------------------------------------------------ micro-batches

    def _prepare_inputs(self, generation_batch: dict[str, Any]) -> dict[str, Any]:
        """TRL's micro-batch, with MRTPO's advantages at its own optimizer step's beta.

        Beta is per optimizer step. A generation batch that serves several (`num_iterations`
        > 1, `steps_per_generation` above `gradient_accumulation_steps`, or generations that do
        not start on a step boundary) carries its advantages' slope in beta, and each
        micro-batch moves them from the generation step's beta to its own step's: exact, since
        A_t is affine in beta.
        """
        if self.model.training:  # which micro-batch of its optimizer step this is
            step, position = self._position_in_step
            same_step = step == self.state.global_step
            self._position_in_step = (self.state.global_step, position + 1 if same_step else 0)
        with self._shuffling_whole_groups():
            inputs = super()._prepare_inputs(generation_batch)
        slope = summed = None
        if BETA_SLOPE in inputs:
            # A copy: TRL reuses the buffered micro-batch in later iterations.
            inputs = dict(inputs)
            slope, generation_beta = inputs.pop(BETA_SLOPE), inputs.pop(GENERATION_BETA).item()
            summed = inputs.pop(SUMMED_ADVANTAGE, None)  # under `auto`: the probe's P_i
            beta = self._beta()
            self._metrics["train"]["mrtpo/beta"].append(beta)
            if beta != generation_beta:
                inputs["advantages"] = inputs["advantages"] + (beta - generation_beta) * slope
        if self._shares_prompt:
            # TRL pads the generation batch to its longest rows; a micro-batch needs its own.
            inputs = shared_prompt.trim_padding(inputs)
        if self.args.beta_is_auto and slope is not None:  # every training batch under `auto`
            self._keep_probe_batch(inputs, slope, summed, beta)
        return inputs

    def training_step(self, model, inputs, num_items_in_batch=None):
        """TRL's training micro-batch; under `mrtpo_beta: auto`, then the gradient probe and,
        at a step's end, beta's move (`mrtpo.trainer_beta_auto`)."""
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.args.beta_is_auto:
            self._after_micro_batch()
        return loss

    # ------------------------------------------------------------------ generation batches

    def _generate_and_score_completions(self, inputs):
        training = self.model.training
        if training:
            self._check_prompts(inputs)
        output = super()._generate_and_score_completions(inputs)
        scored = self._scored  # from `_calculate_rewards`, just called; passed on from here
        group_size = self.num_generations if training else self.num_generations_eval
        reward_weights = self._step_reward_weights(scored.rewards)
        batch_response = self._estimator(
            scored.rewards, group_size, reward_weights, scale=self.scale_rewards, eps=EPS
        )
        response = batch_response[scored.local]
        output["advantages"] = response.to(output["advantages"].device)
        self._log_trained_rewards(scored, reward_weights, batch_response, group_size, EPS)
        if not training:  # evaluation's loss needs no per-token credit: no replay
            return output

        width = output["completion_ids"].shape[1]
        scored.loss_mask = _loss_mask(output)
        step = StepAdvantages(reward_weights, response, per_reward=None, token=None)
        if self._estimator.normalizes_each_reward:
            normalized = advantages.per_reward(scored.rewards, group_size, eps=EPS)
            step.per_reward = torch.nan_to_num(normalized[scored.local])
        if self._estimator.token_level:
            step.token = self._token_advantages(scored, step, group_size, output)
            output["advantages"] = step.token.advantages.to(output["completion_ids"].device)
            if step.token.slope is not None:  # see `_prepare_inputs`
                output[BETA_SLOPE] = step.token.slope.to(output["completion_ids"].device)
                output[GENERATION_BETA] = torch.tensor(step.token.beta)
            if self.args.beta_is_auto:  # the probe's reference (`mrtpo.trainer_beta_auto`)
                summed = summed_reward_advantages(scored.rewards, reward_weights, group_size)
                output[SUMMED_ADVANTAGE] = summed[scored.local].to(output["completion_ids"].device)
            self._log_replay(scored, step, group_size, EPS)
        if self._credit_maps_due():
            self._write_credit_maps(scored, step, width)
        return output

    def _check_prompts(self, inputs: list[dict[str, Any]]) -> None:
        """Refuse a prompt the replay cannot serve before generating, on every process at once.

        The replay runs only on rows whose Ã_k is not 0, at any step and on any one process; a
        prompt it cannot serve (multimodal parts, no user turn, ...) would otherwise fail there,
        on one rank, while the others enter the next collective. Every process checks its rows
        and the first problem of the whole batch is raised everywhere (`gather_object` is
        entered by every process, problem or not).
        """
        if not (self._estimator.token_level or self.args.credit_map_steps):
            return
        from mrtpo.relevance.contexts import check_prompt

        offset = self.accelerator.process_index * len(inputs)
        problem = ""
        for i, example in enumerate(inputs):
            try:
                check_prompt(
                    example["prompt"], offset + i, self.processing_class, self.chat_template
                )
            except ValueError as error:
                problem = f"process {self.accelerator.process_index}: {error}"
                break
        first = next((p for p in gather_object([problem]) if p), None)
        if first is not None:
            raise ValueError(
                f"a prompt of this generation batch cannot be replayed ({first}). The replay "
                "appends verifier information to the last user turn and feeds token ids only: "
                "use string prompts or chat messages with a text user turn, or train without "
                "the replay (advantage_estimator='gdpo' and credit_map_steps=0; now "
                f"advantage_estimator={self.args.advantage_estimator!r}, credit_map_steps="
                f"{self.args.credit_map_steps}). Checked on every process before generation."
            )

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

    def _token_advantages(
        self, scored: ScoredBatch, step: StepAdvantages, group_size: int, output: dict[str, Any]
    ) -> TokenAdvantages:
        """Per-token advantages (B, T) of this process's rows, aligned with `completion_ids`.

        output: TRL's batch (`prompt_ids`, `completion_ids` and their masks), this process's rows.
        """
        width = output["completion_ids"].shape[1]
        wanted = self._pairs_to_replay(step.per_reward)
        if self._beta_stays_zero():
            # Beta 0 at every step this batch serves: uniform weights whatever the distances.
            wanted = torch.zeros_like(wanted)
        rows = wanted.any(dim=1).nonzero().flatten().tolist()
        if self.args.token_relevance == "entropy":
            replay = self._entropy_distances(scored, output, rows, wanted[rows])
        else:
            replay = self._replay(scored, width, rows, wanted[rows])
        beta = self._beta()
        # The estimator takes the whole batch's rewards (group and batch statistics) and
        # distances for every row. Pairs that are not replayed (other processes' rows, pairs
        # skipped above) get zero distance, i.e. uniform weights; a row's advantage depends only
        # on its own distances and on the rewards, so this equals a single process replaying
        # everything.
        device = self.accelerator.device
        num_rows, num_rewards = scored.rewards.shape
        distance = torch.zeros(num_rows, num_rewards, width, device=device)
        mask = torch.ones(num_rows, width, device=device)
        distance[scored.local][replay.rows] = replay.distance  # `[local]` is a view
        mask[scored.local] = scored.trained_mask(width).to(device)
        relevance, per_token = self._advantages_at(scored, beta, step, group_size, distance, mask)
        slope = None
        first, last = self._served_steps()
        if first != last or self.args.beta_is_auto:
            # A_t is affine in beta (w = 1 + beta (q/qbar - 1), the same shuffle and the same
            # bounded normalization for every beta): its slope lets each optimizer step this
            # batch serves use its own beta. Under `auto` beta is known only at the step (and
            # the slope is the re-allocation R_t the probe needs).
            at_zero = self._advantages_at(scored, 0.0, step, group_size, distance, mask)[1]
            at_one = self._advantages_at(scored, 1.0, step, group_size, distance, mask)[1]
            slope = (at_one - at_zero)[scored.local]
        return TokenAdvantages(
            beta, replay, relevance[scored.local], per_token[scored.local], slope
        )

    def _pairs_to_replay(self, normalized: torch.Tensor) -> torch.Tensor:
        """The local (row, reward) pairs whose distances can change the advantages: (B, K) bool.

        normalized: (B, K) this process's Ã_k, NaN as 0. Reward k adds c_k w_{k,t} Ã_k to a
        row's token t: where Ã_k = 0 its weights multiply 0, so skipping its contexts is exact.
        A reward that does not vary in a group (saturated, or not yet ever met: common) costs
        nothing there, and a row where no reward varies is not replayed at all.
        """
        return normalized != 0

    def _advantages_at(
        self,
        scored: ScoredBatch,
        beta: float,
        step: StepAdvantages,
        group_size: int,
        distance: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(w (N, K, T) before any shuffle, A_t (N, T)) of the whole batch at `beta`.

        distance: (N, K, T) every row's (0 where not replayed); mask: (N, T) response tokens.
        """
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
            relevance=advantages.TokenRelevance(
                spread, mask, bounded=self.args.bounded_token_advantages
            ),
        )
        return relevance, per_token

    def _replay(
        self,
        scored: ScoredBatch,
        completion_width: int,
        rows: list[int],
        wanted: torch.Tensor | None = None,
    ) -> ReplayResult:
        """Replay `rows` (indices into this process's rows of `scored`) with the current policy.

        wanted: (R, K) bool, the rewards to replay on each of `rows` (only their contexts and
        the reference context run; the others get distance 0); None: every reward.
        Distance and mask come back on the accelerator's device, T = `completion_width`. Every
        process calls this the same number of times in a step, with or without rows: the model's
        whole parameters are gathered once around the replay (`mrtpo.sharding.full_parameters`:
        ZeRO-3 and FSDP2 gathered, gradient checkpointing off, PEFT adapters active), so that
        the replay's own forward passes, which depend on each process's rows, run no collective.

        `token_relevance="contrastive"`: each row is replayed with its own information and
        with the placebo's (`_replay_infos`) in one call
        (`mrtpo.relevance.contrastive_replay_distances`), and the distance is the own minus the
        placebo's, clamped at 0 (the placebo's is kept in `placebo_distance`).
        """
        # Imported here: the replay engine is only needed when something is replayed.
        from mrtpo.relevance import contrastive_replay_distances, replay_distances

        device = self.accelerator.device
        num_rewards = len(self.reward_funcs)
        if wanted is None:
            wanted = torch.ones(len(rows), num_rewards, dtype=torch.bool)
        wanted = wanted.to("cpu", torch.bool)
        # Before any early return: the placebo's information is gathered from every process.
        infos = self._replay_infos(scored, self.args.replay_information)
        placebo = None
        if self.args.token_relevance == "contrastive":
            placebo = self._replay_infos(scored, "placebo")
        options = self._replay_options()

        started = time.perf_counter()
        with self._whole_model_no_grad() as model:
            if not rows:  # the gather above is entered all the same
                return ReplayResult(
                    rows=[],
                    distance=torch.zeros(0, num_rewards, completion_width, device=device),
                    mask=torch.zeros(0, completion_width, device=device),
                    seconds=0.0,
                    replayed=wanted.to(device),
                )
            was_training = model.training
            model.eval()
            rendering = dict(
                mode=self.args.replay_mode,
                # Render exactly as TRL rendered the prompts for generation.
                chat_template_kwargs=self.chat_template_kwargs,
                tools=self.tools,
                chat_template=self.chat_template,
                wanted=wanted,
                **options,
            )
            prompts = [scored.prompts[i] for i in rows]
            completion_ids = [scored.completion_ids[i] for i in rows]
            row_infos = [infos[i] for i in rows]
            placebo_distance = None
            try:
                if placebo is None:
                    distance, mask = replay_distances(
                        model,
                        self.processing_class,
                        prompts,
                        completion_ids,
                        row_infos,
                        **rendering,
                    )
                else:
                    distance, placebo_distance, mask = contrastive_replay_distances(
                        model,
                        self.processing_class,
                        prompts,
                        completion_ids,
                        row_infos,
                        [placebo[i] for i in rows],
                        **rendering,
                    )
            finally:
                model.train(was_training)
        if distance.is_cuda:
            torch.cuda.synchronize(distance.device)
        # Only the tokens TRL trains (no tool outputs) count in the weights and the metrics.
        trained = scored.trained_mask(completion_width)[rows].to(device)
        return ReplayResult(
            rows=list(rows),
            distance=_fit_width(distance.float(), completion_width).to(device),
            mask=_fit_width(mask.float(), completion_width).to(device) * trained,
            seconds=time.perf_counter() - started,
            replayed=wanted.to(device),
            placebo_distance=None
            if placebo_distance is None
            else _fit_width(placebo_distance.float(), completion_width).to(device),
        )

    def _entropy_distances(
        self,
        scored: ScoredBatch,
        output: dict[str, Any],
        rows: list[int],
        wanted: torch.Tensor,
    ) -> ReplayResult:
        """The entropy control (`token_relevance="entropy"`): in place of each reward's replay
        distance, the policy's own next-token entropy at each response token (TRL's, at its
        temperature), the same for every reward, from one no-grad forward of `rows`.

        A replay that only finds the tokens where the policy is uncertain would weight the
        tokens as this does, without any verifier information. Same shapes as `_replay`'s
        result (wanted: (R, K) bool; distance 0 on the pairs not wanted), and the replay's rule:
        every process calls this the same number of times in a step, with or without rows; the
        whole parameters are gathered once around the forward (`full_parameters`), which runs
        in eval mode (no dropout) under the trainer's autocast, as the replay's do.
        """
        device = self.accelerator.device
        width = output["completion_ids"].shape[1]
        wanted = wanted.to(device, torch.bool)
        started = time.perf_counter()
        with self._whole_model_no_grad() as model:
            if not rows:  # the gather above is entered all the same
                empty = torch.zeros(0, len(self.reward_funcs), width, device=device)
                return ReplayResult([], empty, empty[:, 0], 0.0, wanted)
            index = torch.tensor(rows, device=output["completion_ids"].device)
            input_ids = torch.cat([output["prompt_ids"][index], output["completion_ids"][index]], 1)
            attention_mask = torch.cat(
                [output["prompt_mask"][index], output["completion_mask"][index]], 1
            )
            was_training = model.training
            model.eval()
            try:
                _, entropies, _ = self._get_per_token_logps_and_entropies(
                    model,
                    input_ids,
                    attention_mask,
                    width,
                    batch_size=self.args.per_device_train_batch_size,
                    compute_entropy=True,
                )
            finally:
                model.train(was_training)
        trained = scored.trained_mask(width)[rows].to(device)
        distance = (entropies.float().to(device) * trained).unsqueeze(1) * wanted.unsqueeze(-1)
        return ReplayResult(list(rows), distance, trained, time.perf_counter() - started, wanted)

    @contextlib.contextmanager
    def _whole_model_no_grad(self) -> Iterator[torch.nn.Module]:
        """The model as the replay and the entropy control run it: no gradients, its whole
        parameters gathered once on every process (`mrtpo.sharding.full_parameters`: ZeRO-3 and
        FSDP2 gathered, gradient checkpointing off, PEFT adapters active), under TRL's autocast
        (its loss forward runs under it: the same distributions). Every process enters it the
        same number of times in a step, with or without rows."""
        with (
            torch.no_grad(),
            full_parameters(
                self.model_wrapped,
                self.accelerator,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as model,
            self.accelerator.autocast(),
        ):
            yield model

    def _replay_infos(self, scored: ScoredBatch, information: str) -> list[list[str]]:
        """[B][K] the verifier information each local row is replayed with.

        information: "own", the row's own; "placebo" (a control, and the contrast of
        `token_relevance="contrastive"`): another prompt's information,
        `mrtpo.relevance.controls.placebo_infos` of the whole batch's information at the run's
        seed and this step (groups paired by a seeded derangement, the same position's row,
        another non-empty text of the partner or of the next group where the partner's slot
        is empty); the whole batch's information is gathered for that, on every process (each
        calls this from `_replay`, which every process enters). "generic": one fixed,
        reward-agnostic text cut to each own text's token length
        (`mrtpo.relevance.controls.generic_infos`).
        """
        from mrtpo.relevance import controls

        own = [[verdict.info for verdict in row] for row in scored.row_verdicts()]
        if information == "own":
            return own
        if information == "generic":
            return controls.generic_infos(own, self.processing_class)
        everything = gather_object(own)  # (N) rows, the process order of `scored.rewards`
        group_size = self.num_generations
        if len(everything) // group_size < 2:
            raise ValueError(
                f"replay_information={self.args.replay_information!r} with token_relevance="
                f"{self.args.token_relevance!r} replays a placebo, which needs at least two "
                f"prompts per generation batch (got {len(everything)} rows of num_generations="
                f"{group_size}): raise per_device_train_batch_size or steps_per_generation"
            )
        placebo = controls.placebo_infos(
            everything, group_size, self.args.seed, self.state.global_step
        )
        return placebo[scored.local]

    def _replay_options(self) -> dict[str, Any]:
        """Keyword options of `replay_distances`: the policy's distribution as TRL's loss
        computes it (temperature, LM head precision) and the configured sizes."""
        options: dict[str, Any] = {
            "temperature": self.temperature,
            "lm_head_fp32": self.args.cast_lm_head_to_fp32,
        }
        if self.args.replay_chunk_size is not None:
            options["chunk_size"] = self.args.replay_chunk_size
        if self.args.replay_batch_size is not None:
            options["batch_size"] = self.args.replay_batch_size
        return options

    # ------------------------------------------------------------------ beta per optimizer step

    def _beta(self) -> float:
        """Beta at the current optimizer step (warm-up included; under `auto`, the probes')."""
        if self.args.beta_is_auto:
            return self._auto_beta_at(self.state.global_step)
        return advantages.beta_at(
            self.state.global_step, self.args.mrtpo_beta, self.args.mrtpo_warmup_steps
        )

    def _served_steps(self) -> tuple[int, int]:
        """The first and the last optimizer step that the generation batch TRL is making now
        may serve (the last an upper bound where an epoch's end intervenes).

        TRL makes it at this micro-batch and trains on it for `steps_per_generation *
        num_iterations` micro-batches, this one first. The current optimizer step holds
        `current_gradient_accumulation_steps` micro-batches (fewer than
        `gradient_accumulation_steps` at an epoch's end) and this one is its
        `_position_in_step`-th: the batch stays in this step if its micro-batches fit in what
        is left of it, whatever the alignment of generations and steps; otherwise each further
        micro-batch may start a new step (an epoch's end makes steps short), so beta is checked
        at that many steps ahead. The same answer on every process.
        """
        micro_batches = self.args.steps_per_generation * self.num_iterations
        # Outside `train` (a direct call): a whole step, this micro-batch its first.
        in_step = getattr(
            self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps
        )
        left_in_step = in_step - max(self._position_in_step[1], 0)
        first = self.state.global_step
        return first, first + max(0, micro_batches - left_in_step)

    def _beta_stays_zero(self) -> bool:
        """Whether beta is 0 at every optimizer step the generation batch being made may serve
        (beta's warm-up never decreases, so its last step decides). Never under `auto`: beta
        may rise before the batch is used up, and the probe needs the re-allocation."""
        if self.args.beta_is_auto:
            return False
        last = self._served_steps()[1]
        return advantages.beta_at(last, self.args.mrtpo_beta, self.args.mrtpo_warmup_steps) == 0


# ---------------------------------------------------------------------- helpers


def _loss_mask(output: dict[str, Any]) -> torch.Tensor:
    """TRL's loss mask of a generation batch, (B, T): `completion_mask * tool_mask`, the tool
    mask being 0 on tool-output tokens (TRL's tool calling and environments)."""
    mask = output["completion_mask"]
    tool_mask = output.get("tool_mask")
    return mask if tool_mask is None else mask * tool_mask


def _fit_width(x: torch.Tensor, width: int) -> torch.Tensor:
    """Pad with zeros or cut the last dimension to `width` (TRL may pad to a multiple)."""
    if x.shape[-1] >= width:
        return x[..., :width]
    return torch.nn.functional.pad(x, (0, width - x.shape[-1]))


__all__ = [
    "ESTIMATORS",
    "REPLAY_INFORMATION",
    "REPLAY_MODES",
    "WEIGHTINGS",
    "MRTPOConfig",
    "MRTPOTrainer",
]
