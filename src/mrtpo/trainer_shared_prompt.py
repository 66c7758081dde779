"""`MRTPOTrainer`'s hooks for `share_prompt`: `SharedPromptMixin`, which it inherits.

With `share_prompt`, each group's prompt runs once for all its completions
(`mrtpo.shared_prompt`): in the generation (one prefill per prompt; vLLM caches prefixes
itself), in the loss's forward and backward, and in the old-policy and reference
log-probabilities. TRL's micro-batches then hold whole groups. Where shared prompts cannot
serve the model, the trainer falls back to TRL's per-row path, with the reason logged.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from trl.trainer import grpo_trainer as trl_grpo

from mrtpo import shared_prompt

if TYPE_CHECKING:
    from accelerate import Accelerator

    from mrtpo.config import MRTPOConfig

logger = logging.getLogger("mrtpo.trainer")  # the trainer's logger: its warnings keep their name


class SharedPromptMixin:
    """The shared-prompt methods of `mrtpo.trainer.MRTPOTrainer`, a `GRPOTrainer`:
    `_get_per_token_logps_and_entropies` wraps TRL's (the next class in the trainer's order).

    What the methods need from the trainer is declared below the docstring, and nothing else is
    used (checked by tests/test_trainer.py).
    """

    # Needed from the trainer: annotations only (nothing defined here, so nothing of TRL's
    # shadowed). TRL's models, settings and generation switches:
    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    args: MRTPOConfig
    accelerator: Accelerator
    num_generations: int
    use_vllm: bool
    use_transformers_continuous_batching: bool
    # MRTPOTrainer's: whether this run shares prompts (`_install_shared_prompt`'s answer).
    _shares_prompt: bool

    def _install_shared_prompt(self) -> bool:
        """Switch the policy (and the reference model) to the shared-prompt attention and the
        generation to one prefill per prompt; False, with the reason logged, where shared
        prompts cannot serve the model (the per-row path then runs, as TRL's). Both models are
        checked before either is switched: the reference model may be loaded otherwise."""
        for role, model in (("policy", self.model), ("reference model", self.ref_model)):
            try:
                if model is not None:
                    shared_prompt.check_supported(model)
            except ValueError as reason:
                logger.warning(
                    "share_prompt: falling back to TRL's per-row path (%s): %s", role, reason
                )
                return False
        shared_prompt.install_shared_prompt_attention(self.model)
        if self.ref_model is not None:
            shared_prompt.install_shared_prompt_attention(self.ref_model)
        if not (self.use_vllm or self.use_transformers_continuous_batching):
            shared_prompt.install_shared_prefill(self.model)  # vLLM caches prefixes itself
        return True

    @contextlib.contextmanager
    def _shuffling_whole_groups(self) -> Iterator[None]:
        """TRL's shuffle of a generation batch's rows into micro-batches, by whole groups.

        With `share_prompt`, a micro-batch should hold whole groups, so that each prompt runs
        once for all its completions. TRL shuffles rows (`shuffle_sequence_dict`, looked up in
        its module when `_prepare_inputs` runs); here it permutes runs of rows that share a
        prompt instead: groups of `num_generations`, or, when a process holds part of a group,
        the largest runs that divide both. The same rows reach the optimizer step in another
        order: nothing changes in expectation (and nothing at all when one generation batch is
        one optimizer step and the loss sums over it, TRL's default).
        """
        if not (self._shares_prompt and self.model.training):
            yield
            return
        local_rows = self.args.per_device_train_batch_size * self.args.steps_per_generation
        unit = math.gcd(self.num_generations, local_rows)
        original = trl_grpo.shuffle_sequence_dict
        trl_grpo.shuffle_sequence_dict = lambda batch: shared_prompt.shuffle_groups(batch, unit)
        try:
            yield
        finally:
            trl_grpo.shuffle_sequence_dict = original

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **multimodal,
    ):
        """TRL's per-token log-probs (B, C) of the completions (entropies when asked), with
        each group's prompt run once (`mrtpo.shared_prompt`): the loss's forward and backward,
        the old-policy and the reference log-probs. Equal to TRL's per-row numbers (tested to
        1e-5 in fp32, parameter gradients to 1e-4); TRL's own path where the rows share no
        prompt, for multimodal inputs and for MoE auxiliary losses."""
        has_multimodal = any(value is not None for value in multimodal.values())
        if not self._shares_prompt or compute_aux_loss or has_multimodal:
            return super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=batch_size,
                compute_entropy=compute_entropy,
                compute_aux_loss=compute_aux_loss,
                **multimodal,
            )
        batch_size = batch_size or input_ids.size(0)  # TRL's chunks, to bound memory alike
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            rows = slice(start, start + batch_size)
            with self.accelerator.autocast():
                result = shared_prompt.shared_prompt_logps(
                    model,
                    input_ids[rows, :-logits_to_keep],
                    attention_mask[rows, :-logits_to_keep],
                    input_ids[rows, -logits_to_keep:],
                    attention_mask[rows, -logits_to_keep:],
                    compute_entropy=compute_entropy,
                )
            if result.fallback is not None:  # e.g. one row per prompt in this chunk
                chunk_logps, chunk_entropies, _ = super()._get_per_token_logps_and_entropies(
                    model,
                    input_ids[rows],
                    attention_mask[rows],
                    logits_to_keep,
                    compute_entropy=compute_entropy,
                )
                result = shared_prompt.SharedPromptLogps(chunk_logps, chunk_entropies)
            logps.append(result.logps)
            entropies.append(result.entropies)
        return (
            torch.cat(logps, dim=0),
            torch.cat(entropies, dim=0) if compute_entropy else None,
            None,
        )
