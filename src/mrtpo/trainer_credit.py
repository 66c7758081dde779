"""The credit maps `MRTPOTrainer` builds while it trains: `CreditMapsMixin`, which it inherits.

Every `credit_map_steps` optimizer steps (`credit_map_steps=0`: never) the trainer writes the
maps of the lowest- and the highest-total-reward rows of the main process's share of the batch
(`mrtpo.credit.write_training_maps`): the tokens each reward's information moved, the token
weights and advantages trained on, the verdicts and the response's text; above them and in the
index, the step's beta, re-allocation ratio and, under `mrtpo_beta: auto`, beta's evidence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from mrtpo.credit import CreditMap, write_training_maps
from mrtpo.credit.replay import last_user_message
from mrtpo.step_data import ReplayResult, ScoredBatch, StepAdvantages
from mrtpo.verifiers import Verdict, completion_text

if TYPE_CHECKING:
    from accelerate import Accelerator
    from transformers import TrainerState

    from mrtpo.advantages import Estimator
    from mrtpo.config import MRTPOConfig

CREDIT_ROWS_PER_END = 1  # credit maps: this many lowest- and this many highest-reward rows


class CreditMapsMixin:
    """The credit-map methods of `mrtpo.trainer.MRTPOTrainer`, a `GRPOTrainer`.

    The trainer calls `_credit_maps_due` and `_write_credit_maps`; what the methods need from
    the trainer is declared below the docstring, and nothing else is used (checked by
    tests/test_trainer.py).
    """

    # Needed from the trainer: annotations only (nothing defined here, so nothing of TRL's
    # shadowed). TRL's:
    args: MRTPOConfig
    state: TrainerState
    accelerator: Accelerator
    processing_class: Any  # the tokenizer
    reward_funcs: list[Any]
    reward_func_names: list[str]
    # MRTPOTrainer's: its estimator, the step of the last maps (None: none yet; set here),
    # the replay of some local rows (every process calls it alike) and whether beta stays 0
    # over the batch being made.
    _estimator: Estimator
    _last_credit_step: int | None
    _replay: Callable[..., ReplayResult]
    _beta_stays_zero: Callable[[], bool]
    # TRL's metric lists of this logging window, and under `mrtpo_beta: auto` the evidence
    # beta moves on (`mrtpo.trainer_beta_auto`).
    _metrics: dict[str, dict[str, list[float]]]
    _auto_beta_evidence: Callable[[], dict[str, float]]

    def _write_credit_maps(self, scored: ScoredBatch, step: StepAdvantages, width: int) -> None:
        """This step's credit maps, written by the main process (`write_training_maps`) into
        `output_dir/credit`; every process calls it (each may replay its own shown rows).

        width: the completion width T of the batch's tensors.
        """
        maps = self._credit_maps(scored, step, width)
        if maps is not None:
            diagnostics = self._credit_diagnostics(step)
            write_training_maps(self.args.output_dir, self.state.global_step, maps, diagnostics)

    def _credit_diagnostics(self, step: StepAdvantages) -> dict[str, float]:
        """The step's figures shown above its maps and in the index: MRTPO's beta for this
        generation batch and `mrtpo/reallocation_ratio` as just logged; under
        `mrtpo_beta: auto` the agreement evidence beta was chosen on. Nothing for GDPO/GRPO."""
        if step.token is None:
            return {}
        figures = {"beta": float(step.token.beta)}
        ratios = self._metrics["train"].get("mrtpo/reallocation_ratio")
        if ratios:  # `_log_replay` logged this batch's just before
            figures["reallocation_ratio"] = float(ratios[-1])
        if self.args.beta_is_auto:
            figures.update(self._auto_beta_evidence())
        return figures

    def _credit_maps_due(self) -> bool:
        """Every `credit_map_steps` optimizer steps (from step 0). The same answer on every
        process."""
        steps, step = self.args.credit_map_steps, self.state.global_step
        if steps == 0:
            return False
        if self._last_credit_step is not None and step - self._last_credit_step < steps:
            return False
        return True

    def _credit_maps(
        self, scored: ScoredBatch, step: StepAdvantages, width: int
    ) -> list[CreditMap] | None:
        """Maps of the lowest- and highest-total-reward rows of the main process's share; None
        on the other processes.

        GRPO and GDPO replay just those rows (to show where MRTPO would put the credit beside
        their uniform assignment); every process replays its own pick, possibly none (every
        process enters `_replay`, which gathers sharded parameters); the main process's maps
        are written by `_write_credit_maps`.
        MRTPO's maps show its step's own replay: a reward it did not replay on a row (Ã_k = 0
        there) shows as not replayed; while beta is 0 (nothing replayed) the shown rows are
        replayed for the map.
        """
        self._last_credit_step = self.state.global_step
        total = (torch.nan_to_num(scored.rewards[scored.local]) * step.reward_weights).sum(dim=1)
        order = torch.argsort(total, stable=True).tolist()
        chosen = list(dict.fromkeys(order[:CREDIT_ROWS_PER_END] + order[-CREDIT_ROWS_PER_END:]))
        # GDPO/GRPO replay the rows shown; so does MRTPO while beta is 0 (it replayed nothing).
        # The same decision on every process: each enters `_replay` (see above).
        shown_only = step.token is None or self._beta_stays_zero()
        extra = self._replay(scored, width, rows=chosen) if shown_only else None
        if not self.accelerator.is_main_process:
            return None
        verdicts = scored.row_verdicts()
        maps = []
        for rank, i in enumerate(chosen):
            label = "lowest" if rank < CREDIT_ROWS_PER_END and len(chosen) > 1 else "highest"
            title = (
                f"{label} total reward ({total[i].item():.3g}), "
                f"step {self.state.global_step}, {self._estimator.name}"
            )
            maps.append(self._credit_map(scored, step, i, extra, verdicts[i], title))
        return maps

    def _credit_map(
        self,
        scored: ScoredBatch,
        step: StepAdvantages,
        row: int,
        extra: ReplayResult | None,
        verdicts: list[Verdict],
        title: str,
    ) -> CreditMap:
        """The map of one local row, arrays cut to the response's own length.

        MRTPO: its weights, per-token advantages and which rewards it replayed on the row.
        GDPO/GRPO: the row replayed for the map (`extra`), no weights (uniform) and the
        response's advantage on every token; GRPO has no per-reward advantages.
        """
        token = step.token
        length = len(scored.completion_ids[row])
        weights = replayed = None
        if token is not None:
            weights, token_advantages = token.relevance[row], token.advantages[row, :length]
            replay = token.replay
            replayed = torch.zeros(len(self.reward_funcs), dtype=torch.bool)
            distance = torch.zeros(len(self.reward_funcs), length)
            if row in replay.rows:
                replayed = replay.replayed[replay.rows.index(row)]
                distance = replay.distance[replay.rows.index(row)]
            elif extra is not None:  # beta 0: replayed for the map only
                replayed = extra.replayed[extra.rows.index(row)]
                distance = extra.distance[extra.rows.index(row)]
        else:  # replayed for the map only
            distance = extra.distance[extra.rows.index(row)]
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
            replayed=None if replayed is None else replayed.cpu(),
        )
