"""`mrtpo_beta: auto`: beta from the step's own gradients, `AutoBetaMixin`, which
`mrtpo.trainer.MRTPOTrainer` inherits.

MRTPO's per-token advantage is affine in beta, A_t(beta) = U_t + beta R_t: U_t is GDPO's
advantage (the response's, on each trained token) and R_t the re-allocation (the batch's slope
in beta, which the trainer carries in every batch under `auto`). At ratio 1 the policy gradient
of the loss is linear in the advantages, so the step's gradient is g_U + beta g_R. Beta starts
at 0 (GDPO) and rises only while g_R agrees with an independent estimate of g_U; the idea of
using an auxiliary gradient only while it agrees with the main one is Du et al., "Adapting
Auxiliary Losses Using Gradient Similarity"; this rule is the project's, not the MRTPO paper's
(docs/METHOD.md, "beta from the step's own evidence").

On a probed step (every `mrtpo_beta_probe_every` optimizer steps) each micro-batch, after its
own training backward, runs one more forward (the loss's, with gradients) and two backward
passes, of -sum(R_t logp_t) and -sum(U_t logp_t) over its trained tokens divided by their
number, on the unwrapped model (no DDP reduction) with the training gradients set aside and
restored. Each parameter's gradient is consumed by a hook as soon as it is accumulated, so the
only full-size buffer is the reference: the sum of g_U over the micro-batches already probed.
Micro-batch m's g_R is dotted with the reference before its own g_U joins it: the
reference holds this step's earlier micro-batches, and for the first micro-batch of a step the
previous probed step's (so with one micro-batch a step, the previous probe's g_U). Each g_R is
thus compared with gradients of other samples only. At the step's end the three sums (cross dot
product, |g_R|^2, |reference|^2 over the pairs) are summed over processes, the probe's agreement
is their cosine (`advantages.gradient_agreement`), and beta moves by `mrtpo_beta_step`
(`advantages.next_auto_beta`): up while the one-sided 95% lower bound of the mean agreement of
the last `mrtpo_beta_window` probes is above 0, down otherwise; every process computes the
same numbers, so every process has the same beta.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import defaultdict, deque
from typing import TYPE_CHECKING, Any

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from mrtpo import advantages

if TYPE_CHECKING:
    from accelerate import Accelerator
    from transformers import TrainerState

    from mrtpo.config import MRTPOConfig

METRIC_PREFIX = "mrtpo/beta_auto/"
# Beside each checkpoint's trainer_state.json: the automatic beta and its window of agreements,
# so that a resumed run goes on from them (the reference gradient is not kept: a resumed run's
# first probe compares its micro-batches with each other only).
STATE_FILE = "mrtpo_beta_auto.json"

logger = logging.getLogger("mrtpo.trainer")


def nothing_to_probe(uniform: torch.Tensor, reallocation: torch.Tensor) -> bool:
    """Whether a micro-batch's probe gradients are both 0: every U_t and R_t is 0 ((B, T) each)."""
    return not (bool(uniform.any()) or bool(reallocation.any()))


class AutoBetaMixin:
    """The `mrtpo_beta: auto` methods of `mrtpo.trainer.MRTPOTrainer` (module docstring).

    What the methods need from the trainer is declared below the docstring, and nothing else is
    used (checked by tests/test_trainer.py).
    """

    # Needed from the trainer: TRL's metric windows, the model and its accelerator, the state;
    # `_position_in_step` (optimizer step, micro-batch index in it) from `_prepare_inputs`;
    # TRL's forward of the loss (the shared-prompt mixin's where prompts are shared).
    _metrics: dict[str, defaultdict[str, list[float]]]
    model: torch.nn.Module
    args: MRTPOConfig
    accelerator: Accelerator
    state: TrainerState
    current_gradient_accumulation_steps: int
    _position_in_step: tuple[int, int]
    _get_per_token_logps_and_entropies: Any
    _get_output_dir: Any  # where transformers saves this run's checkpoints

    # The automatic beta's own state, set on the instance by `_init_auto_beta` (under `auto`).
    _auto_beta_value: float = 0.0
    _auto_agreements: deque[float] | None = None
    _auto_reference: dict[int, torch.Tensor] | None = None
    _auto_sums: torch.Tensor | None = None
    _auto_probe_batch: tuple[dict[str, Any], torch.Tensor, torch.Tensor] | None = None
    _auto_probe_seconds: float = 0.0

    def _init_auto_beta(self) -> None:
        """The automatic beta's state: beta, the window of agreements, the reference gradient
        (index of a parameter -> the sum of g_U over the micro-batches probed; None before
        any), this step's sums and the micro-batch kept for the probe."""
        from accelerate.utils import DistributedType

        if self.accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP):
            raise ValueError(
                f"mrtpo_beta={self.args.mrtpo_beta!r} probes gradients parameter by parameter, "
                "which sharded training (DeepSpeed, FSDP; now "
                f"{self.accelerator.distributed_type.value}) does not give whole: use a number "
                "for mrtpo_beta, or train with DDP or one process"
            )
        self._auto_beta_value = 0.0
        self._auto_agreements = deque(maxlen=self.args.mrtpo_beta_window)
        self._auto_reference = None
        self._auto_sums = torch.zeros(3, dtype=torch.float64, device=self.accelerator.device)
        self._auto_probe_batch = None
        self._auto_probe_seconds = 0.0

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Transformers' checkpoint, and under `mrtpo_beta: auto` the automatic beta's state
        beside it (`STATE_FILE`), written by the main process."""
        super()._save_checkpoint(model, trial)
        if self.args.beta_is_auto and self.args.should_save:
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            self._save_auto_beta(os.path.join(self._get_output_dir(trial=trial), folder))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        """Transformers' resumption, and under `mrtpo_beta: auto` the automatic beta's state."""
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        if self.args.beta_is_auto:
            self._load_auto_beta(resume_from_checkpoint)

    def _save_auto_beta(self, checkpoint: str) -> None:
        """Write the automatic beta's state into `checkpoint` (a checkpoint folder)."""
        state = {"beta": self._auto_beta_value, "agreements": list(self._auto_agreements)}
        with open(f"{checkpoint}/{STATE_FILE}", "w") as handle:
            json.dump(state, handle)

    def _load_auto_beta(self, checkpoint: str) -> None:
        """Go on from the automatic beta's state saved in `checkpoint`; a checkpoint without one
        (saved with a numeric beta, or before this file existed) restarts beta at 0, said once."""
        try:
            with open(f"{checkpoint}/{STATE_FILE}") as handle:
                state = json.load(handle)
        except FileNotFoundError:
            logger.warning(
                "mrtpo_beta='auto': %s has no %s (saved with a numeric mrtpo_beta?): the "
                "automatic beta restarts at 0",
                checkpoint,
                STATE_FILE,
            )
            return
        self._auto_beta_value = float(state["beta"])
        self._auto_agreements.clear()
        self._auto_agreements.extend(float(value) for value in state["agreements"])

    def _auto_beta_at(self, step: int) -> float:
        """Beta at optimizer `step` under `auto`: the probes' beta, capped by the warm-up's ramp
        to `mrtpo_beta_max` (`advantages.beta_at`)."""
        cap = advantages.beta_at(step, self.args.mrtpo_beta_max, self.args.mrtpo_warmup_steps)
        return min(self._auto_beta_value, cap)

    def _auto_probe_due(self) -> bool:
        return self.state.global_step % self.args.mrtpo_beta_probe_every == 0

    def _keep_probe_batch(self, inputs: dict[str, Any], slope: torch.Tensor, beta: float) -> None:
        """Keep a training micro-batch (advantages at `beta`) and its slope R_t for the probe
        after its backward; only on probed steps. The slope is cut to the micro-batch's width
        (shared prompts cut the batch's padding)."""
        if not (self.model.training and self._auto_probe_due()):
            self._auto_probe_batch = None
            return
        trained = inputs["advantages"]
        reallocation = slope[:, : trained.shape[1]].to(trained.dtype)
        self._auto_probe_batch = (inputs, trained - beta * reallocation, reallocation)

    def _after_micro_batch(self) -> None:
        """After a training micro-batch's backward: probe it if its step is probed; at the
        step's last micro-batch, decide beta (on probed steps) and log."""
        if self._auto_probe_batch is not None:
            started = time.perf_counter()
            self._probe_gradients(*self._auto_probe_batch)
            self._auto_probe_batch = None
            self._auto_probe_seconds += time.perf_counter() - started
        position = self._position_in_step[1]
        if position == self.current_gradient_accumulation_steps - 1:
            self._finish_auto_step()

    def _probe_gradients(
        self, inputs: dict[str, Any], uniform: torch.Tensor, reallocation: torch.Tensor
    ) -> None:
        """Add this micro-batch's <g_R, reference>, |g_R|^2 and |reference|^2 to the step's
        sums, then its g_U to the reference (replacing it at a step's first micro-batch).

        uniform, reallocation: (B, T) U_t and R_t of the micro-batch's rows.
        """
        if nothing_to_probe(uniform, reallocation):
            self._probe_without_gradients()
            return
        model = self.accelerator.unwrap_model(self.model)  # no DDP hook: local gradients
        params = [p for p in model.parameters() if p.requires_grad]
        index = {id(p): i for i, p in enumerate(params)}
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        with self.accelerator.autocast():
            logps, _, _ = self._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                inputs["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size,
            )
        weighted = logps * mask / mask.sum().clamp(min=1)
        reallocation_loss = -(reallocation.to(logps.dtype) * weighted).sum()
        uniform_loss = -(uniform.to(logps.dtype) * weighted).sum()

        reference = self._auto_reference
        replace = reference is None or self._position_in_step[1] == 0
        fresh: dict[int, torch.Tensor] = {} if replace else reference
        sums = self._auto_sums

        def compare(param: torch.Tensor) -> None:
            # Only the pairs with a reference count, |g_R|^2 too: the cosine is of the pairs.
            if reference is not None:
                grad = param.grad.flatten()
                sums[1] += torch.dot(grad, grad).double()
                ref = reference.get(index[id(param)])
                if ref is not None:  # a parameter the reference had no gradient for: 0 there
                    sums[0] += torch.dot(grad, ref.to(grad.dtype).flatten()).double()
                    sums[2] += torch.dot(ref.flatten(), ref.flatten()).double()
            param.grad = None  # consumed: at most one parameter's gradient lives at a time

        def accumulate(param: torch.Tensor) -> None:
            i = index[id(param)]
            if replace or i not in fresh:
                fresh[i] = param.grad  # the tensor itself: no copy
            else:
                fresh[i].add_(param.grad)
            param.grad = None

        stashed = [p.grad for p in params]  # the training gradients, set aside (not copied)
        handles = []
        try:
            for p in params:
                p.grad = None
            handles = [p.register_post_accumulate_grad_hook(compare) for p in params]
            reallocation_loss.backward(retain_graph=True)
            for handle in handles:
                handle.remove()
            handles = [p.register_post_accumulate_grad_hook(accumulate) for p in params]
            uniform_loss.backward()
        finally:
            for handle in handles:
                handle.remove()
            for p, grad in zip(params, stashed, strict=True):
                p.grad = grad
        if replace:  # the previous reference's tensors are released here
            self._auto_reference = fresh

    def _probe_without_gradients(self) -> None:
        """The probe of a micro-batch whose every advantage is 0 (every group's rewards equal,
        common on a small model early on): g_R = g_U = 0, so the sums and the reference change
        as the two backward passes would change them, without the forward or the backward.
        The pair still counts: |reference|^2 joins the sums (the cosine is over the pairs)."""
        reference = self._auto_reference
        if reference is not None:
            for ref in reference.values():
                self._auto_sums[2] += torch.dot(ref.flatten(), ref.flatten()).double()
        if reference is None or self._position_in_step[1] == 0:
            self._auto_reference = {}  # this micro-batch's g_U, all zeros, replaces it

    def _finish_auto_step(self) -> None:
        """At a step's last micro-batch: on a probed step, the probe's agreement over every
        process (every process enters the reduction) and beta's move; every step, the logs."""
        metrics = self._metrics["train"]
        if self._auto_probe_due():
            cross, reallocation_sq, reference_sq = self.accelerator.reduce(
                self._auto_sums, reduction="sum"
            ).tolist()
            self._auto_sums.zero_()
            agreement = advantages.gradient_agreement(cross, reallocation_sq, reference_sq)
            if not math.isnan(agreement):  # no reference yet, or nothing re-allocated: no move
                self._auto_agreements.append(agreement)
                self._auto_beta_value = advantages.next_auto_beta(
                    self._auto_beta_value,
                    self._auto_agreements,
                    self.args.mrtpo_beta_max,
                    self.args.mrtpo_beta_step,
                )
            metrics[METRIC_PREFIX + "probe_agreement"].append(agreement)
            seconds = torch.tensor([self._auto_probe_seconds], device=self.accelerator.device)
            metrics[METRIC_PREFIX + "probe_seconds"].append(
                self.accelerator.gather(seconds).max().item()
            )
            self._auto_probe_seconds = 0.0
        mean, se, lower = advantages.agreement_bound(self._auto_agreements)
        metrics[METRIC_PREFIX + "agreement"].append(mean)
        metrics[METRIC_PREFIX + "agreement_se"].append(se)
        metrics[METRIC_PREFIX + "agreement_lower"].append(lower)
        metrics[METRIC_PREFIX + "probes"].append(float(len(self._auto_agreements)))
        # The beta the next step starts from (before the warm-up's cap).
        metrics[METRIC_PREFIX + "next_beta"].append(self._auto_beta_value)
