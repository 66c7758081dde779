"""`mrtpo_beta: auto`: beta from the step's own gradients, `AutoBetaMixin`, which
`mrtpo.trainer.MRTPOTrainer` inherits.

MRTPO's per-token advantage is affine in beta, A_t(beta) = U_t + beta R_t: U_t is GDPO's
advantage (the response's, on each trained token) and R_t the re-allocation (the batch's slope
in beta, which the trainer carries in every batch under `auto`). At ratio 1 the policy gradient
of the loss is linear in the advantages, so the step's gradient is g(beta) = g_U + beta g_R.
The step is clipped (`max_grad_norm`), so what beta changes is its direction: beta starts at 0
(GDPO) and rises only while g(beta)'s cosine with the direction we want to climb rises with
beta. That direction is the policy gradient of the weighted summed reward, estimated from other
samples: the reference G. The idea of using an auxiliary gradient only while it helps the main
one is Du et al., "Adapting Auxiliary Losses Using Gradient Similarity"; this rule is the
project's, not the MRTPO paper's (docs/METHOD.md, "beta from the step's own evidence").

On a probed step (every `mrtpo_beta_probe_every` optimizer steps) each micro-batch m runs up to
three backward passes, of -sum(X_t logp_t) over its trained tokens divided by their number for
X = R, U and P, with the training gradients set aside and restored. In one process they run on
the loss's own forward, between TRL's loss and its backward (`compute_loss`: the log-probs are
caught as TRL's loss computes them, and the graph is kept for the training backward); with
several processes, after the training backward, on one more forward of the unwrapped model (a
DDP forward allows one backward and would reduce the probe's gradients). P_t = P_i on each trained token of row i is the summed reward's advantage,
s_i minus the mean s_j of the other rows of i's group (s: the rewards weighted by c_k and summed,
`summed_reward_advantages`), so g_P estimates the policy gradient of the summed reward. The
reference G is the sum of g_P over the micro-batches already probed: this step's earlier ones,
and for the first micro-batch of a step the previous probed step's (so with one micro-batch a
step, the previous probe's g_P). Against G before m's own g_P joins it, the passes give
<g_R, G>, <g_U, G>, |g_R|^2, |g_U|^2, the cross term <g_U, g_R> and |G|^2: m is compared with
gradients of other samples only. Each parameter's gradient is consumed by a hook as soon as it
is accumulated; g_R's is kept until U's pass reaches that parameter (the cross term, taken
directly: a fourth pass, of U + R, would cost more than the buffer), so the full-size buffers
are G and, during a micro-batch's probe, g_R (at a step's first micro-batch the old G is
released before the new one is built). Both keep a 2-D gradient by its nonzero rows where they
are at most half of its rows (`StoredRows`): an input embedding apart from the output matrix
(Qwen2.5's, 22% of its parameters) has a gradient only on the batch's tokens. A pass whose advantages are
all 0 is skipped (`probe_passes`): it would add 0 to every sum, or nothing to G.

At the step's end the six sums are summed over processes and the probe's agreement is
cos(g_R, G) - cos(g, G) cos(g, g_R) at the beta the step trained with
(`auto_beta.gradient_agreement`): the sign of d/dbeta cos(g(beta), G). Beta moves by
`mrtpo_beta_step` (`auto_beta.next_auto_beta`): up while the one-sided 95% lower bound of the
mean agreement of the last `mrtpo_beta_window` probes is above 0, down otherwise; every process
computes the same numbers, so every process has the same beta.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import defaultdict, deque
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from mrtpo import advantages, auto_beta

if TYPE_CHECKING:
    from accelerate import Accelerator
    from transformers import TrainerState

    from mrtpo.config import MRTPOConfig

METRIC_PREFIX = "mrtpo/beta_auto/"
# Beside each checkpoint's trainer_state.json: the automatic beta and its window of agreements,
# so that a resumed run goes on from them (the reference gradient is not kept: a resumed run's
# first probe compares its micro-batches with each other only).
STATE_FILE = "mrtpo_beta_auto.json"
# The key under which a training batch carries each row's summed-reward advantage P_i (B,),
# set by `MRTPOTrainer._generate_and_score_completions` under `auto`.
SUMMED_ADVANTAGE = "mrtpo_summed_reward_advantage"
# The probe's sums, in the order of their tensor (`auto_beta.gradient_agreement`'s names):
# <g_R, G>, <g_U, G>, |g_R|^2, |g_U|^2, <g_U, g_R>, |G|^2.
SUMS = (
    "reallocation_dot",
    "uniform_dot",
    "reallocation_sq",
    "uniform_sq",
    "cross",
    "reference_sq",
)
_SLOT = {name: i for i, name in enumerate(SUMS)}
# The probe's backward passes, in their order: each one's advantages and the sums its gradient
# adds to (dot with G, squared norm); "uniform" also adds its dot with the kept g_R (the cross
# term); "summed" (P) adds to G instead.
PASSES = ("reallocation", "uniform", "summed")
_MEASURED = {
    "reallocation": (_SLOT["reallocation_dot"], _SLOT["reallocation_sq"]),
    "uniform": (_SLOT["uniform_dot"], _SLOT["uniform_sq"]),
}

logger = logging.getLogger("mrtpo.trainer")


class StoredRows(NamedTuple):
    """A kept gradient of a 2-D parameter by its nonzero rows (the others are exactly 0)."""

    index: torch.Tensor  # (k,) the rows, ascending
    values: torch.Tensor  # (k, d) their gradients


Stored = torch.Tensor | StoredRows  # how the probe keeps a parameter's part of G or g_R


def stored(grad: torch.Tensor) -> Stored:
    """`grad` as the probe keeps it: a 2-D gradient whose nonzero rows are at most half of its
    rows by those rows (`StoredRows`, a copy), any other as it is (the tensor itself)."""
    if grad.dim() != 2:
        return grad
    index = grad.any(dim=1).nonzero().squeeze(1)
    if 2 * index.numel() > grad.shape[0]:
        return grad
    return StoredRows(index, grad.index_select(0, index))


def stored_dot(grad: torch.Tensor, other: Stored) -> torch.Tensor:
    """<grad, other> in float64 (computed in grad's dtype): grad a parameter's whole gradient,
    other a kept one of the same parameter."""
    if isinstance(other, StoredRows):
        rows = grad.index_select(0, other.index)
        return torch.dot(rows.flatten(), other.values.to(grad.dtype).flatten()).double()
    return torch.dot(grad.flatten(), other.to(grad.dtype).flatten()).double()


def stored_square(value: Stored) -> torch.Tensor:
    """|value|^2 in float64 of a kept gradient."""
    flat = (value.values if isinstance(value, StoredRows) else value).flatten()
    return torch.dot(flat, flat).double()


def stored_add(total: Stored, grad: torch.Tensor) -> Stored:
    """total + grad (a parameter's whole gradient), by rows while the sum's nonzero rows stay at
    most half of them, else whole; every value as the whole tensors' sum gives it."""
    if not isinstance(total, StoredRows):
        return total.add_(grad)
    added = stored(grad)
    if isinstance(added, StoredRows):
        both = torch.cat([total.index, added.index])
        index, inverse = both.unique(return_inverse=True)
        if 2 * index.numel() <= grad.shape[0]:
            values = grad.new_zeros(index.numel(), grad.shape[1])
            values.index_add_(0, inverse, torch.cat([total.values, added.values]))
            return StoredRows(index, values)
    return stored_whole(total, grad).add_(grad)


def stored_whole(value: Stored, like: torch.Tensor) -> torch.Tensor:
    """A kept gradient as a whole tensor of `like`'s shape (a new one where kept by rows)."""
    if not isinstance(value, StoredRows):
        return value
    whole = torch.zeros_like(like)
    whole[value.index] = value.values
    return whole


def summed_reward_advantages(
    rewards: torch.Tensor, weights: torch.Tensor, group_size: int
) -> torch.Tensor:
    """The summed reward's leave-one-out advantage P_i = s_i - mean_{j in i's group, j != i} s_j,
    s_i = sum_k c_k r_{i,k} (NaN rewards left out of the sum, as GRPO's sum).

    rewards: (N, K), NaN where a reward gave no score (the rewards GDPO normalizes); weights:
    (K,) c_k; group_size: G, rows per prompt (groups consecutive). Returns (N,) in rewards'
    dtype: 0 for an unscorable row (every reward NaN) and where no other row of the group is
    scorable; the other rows' mean is over the scorable ones.
    """
    scorable = ~torch.isnan(rewards).all(dim=1)
    summed = (rewards * weights.to(rewards).unsqueeze(0)).nansum(dim=1)
    summed = torch.where(scorable, summed, torch.zeros_like(summed)).view(-1, group_size)
    counted = scorable.view(-1, group_size).to(summed.dtype)
    others = counted.sum(dim=1, keepdim=True) - counted  # scorable rows of the group but i
    others_mean = (summed.sum(dim=1, keepdim=True) - summed) / others.clamp(min=1)
    advantage = torch.where((counted > 0) & (others > 0), summed - others_mean, 0.0)
    return advantage.flatten()


def probe_passes(
    paired: bool, uniform: torch.Tensor, reallocation: torch.Tensor, summed: torch.Tensor
) -> tuple[str, ...]:
    """The backward passes a probed micro-batch needs (names of `PASSES`, in order).

    paired: whether there is a reference to compare with (without one only P's pass can matter:
    it starts the reference). uniform, reallocation: (B, T) U_t and R_t; summed: (B,) P_i. A pass
    whose advantages are all 0 is left out: its gradient is 0, so it would add 0 to its dot and
    norm (and to the cross term), or nothing to the reference. Empty: no forward either (every
    advantage 0, common on a small model early on, where every group's rewards are equal).
    """
    passes = []
    if paired:
        if bool(reallocation.any()):
            passes.append("reallocation")
        if bool(uniform.any()):
            passes.append("uniform")
    if bool(summed.any()):
        passes.append("summed")
    return tuple(passes)


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
    _auto_reference: dict[int, Stored] | None = None
    _auto_sums: torch.Tensor | None = None
    _auto_probe_batch: tuple[dict[str, Any], torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    _auto_probe_seconds: float = 0.0
    # While TRL's loss of a probed micro-batch runs (`compute_loss`): the log-probs (B, T) of
    # each forward with gradients, caught for the probe.
    _auto_caught_logps: list[torch.Tensor] | None = None

    def _init_auto_beta(self) -> None:
        """The automatic beta's state: beta, the window of agreements, the reference gradient
        (index of a parameter -> the sum of g_P over the micro-batches probed; None before
        any), this step's sums (`SUMS`) and the micro-batch kept for the probe."""
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
        self._auto_sums = torch.zeros(
            len(SUMS), dtype=torch.float64, device=self.accelerator.device
        )
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

    def _keep_probe_batch(
        self, inputs: dict[str, Any], slope: torch.Tensor, summed: torch.Tensor, beta: float
    ) -> None:
        """Keep a training micro-batch (advantages at `beta`), its slope R_t and its rows'
        summed-reward advantages P_i (B,) for the probe after its backward; only on probed
        steps. The slope is cut to the micro-batch's width (shared prompts cut the batch's
        padding)."""
        if not (self.model.training and self._auto_probe_due()):
            self._auto_probe_batch = None
            return
        trained = inputs["advantages"]
        reallocation = slope[:, : trained.shape[1]].to(trained.dtype)
        self._auto_probe_batch = (inputs, trained - beta * reallocation, reallocation, summed)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's loss; on a probed micro-batch in one process, then the probe, on the loss's own
        forward (its log-probs caught by `_get_per_token_logps_and_entropies`), every pass keeping
        the graph for the training backward that follows: one forward fewer than a probe of its
        own. Elsewhere (several processes, or no forward caught) the probe runs after the
        backward (`_after_micro_batch`)."""
        if self._auto_probe_batch is None or self.accelerator.num_processes > 1:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self._auto_caught_logps = []
        try:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            caught = self._auto_caught_logps
        finally:
            self._auto_caught_logps = None
        if len(caught) == 1 and caught[0].requires_grad:  # TRL's loss: one forward
            self._run_probe(logps=caught[0])
        return loss

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> tuple:
        """The trainer's forward of the loss (shared prompts included: this mixin comes first in
        the trainer's bases); while `compute_loss` probes, its log-probs with gradients caught."""
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._auto_caught_logps is not None and torch.is_grad_enabled():
            self._auto_caught_logps.append(result[0])
        return result

    def _run_probe(self, logps: torch.Tensor | None = None) -> None:
        """Probe the kept micro-batch (`_probe_gradients`), timed, and let it go."""
        started = time.perf_counter()
        self._probe_gradients(*self._auto_probe_batch, logps=logps)
        self._auto_probe_batch = None
        self._auto_probe_seconds += time.perf_counter() - started

    def _after_micro_batch(self) -> None:
        """After a training micro-batch's backward: probe it if its step is probed and
        `compute_loss` did not; at the step's last micro-batch, decide beta (on probed steps)
        and log."""
        if self._auto_probe_batch is not None:
            self._run_probe()
        position = self._position_in_step[1]
        if position == self.current_gradient_accumulation_steps - 1:
            self._finish_auto_step()

    def _probe_gradients(
        self,
        inputs: dict[str, Any],
        uniform: torch.Tensor,
        reallocation: torch.Tensor,
        summed: torch.Tensor,
        logps: torch.Tensor | None = None,
    ) -> None:
        """Micro-batch m's part of the probe: against the reference G before m joins it, add
        <g_R, G>, <g_U, G>, |g_R|^2, |g_U|^2, <g_U, g_R> and |G|^2 to the step's sums (`SUMS`;
        only where there is a reference: the pairs), then add its g_P to G (replacing G at a
        step's first micro-batch).

        uniform, reallocation: (B, T) U_t and R_t of the micro-batch's rows; summed: (B,) P_i;
        logps: (B, T) the loss's log-probs with their graph (kept: the training backward
        follows), or None for a forward of the probe's own.
        """
        paired = self._auto_reference is not None
        replace = not paired or self._position_in_step[1] == 0
        sums = torch.zeros(len(SUMS), dtype=torch.float64, device=self._auto_sums.device)
        if paired:  # |G|^2, whole (a parameter with no gradient here pairs a 0)
            sums[_SLOT["reference_sq"]] = sum(
                stored_square(ref) for ref in self._auto_reference.values()
            )
        passes = probe_passes(paired, uniform, reallocation, summed)
        if passes:
            advantages_of = {
                "reallocation": reallocation,
                "uniform": uniform,
                "summed": summed.unsqueeze(1).expand_as(uniform),
            }
            chosen = [(p, advantages_of[p]) for p in passes]
            self._backward_passes(inputs, chosen, sums, replace, logps)
        if replace and "summed" not in passes:
            self._auto_reference = {}  # this micro-batch's g_P, all zeros, replaces G
        if paired:
            self._auto_sums += sums

    def _backward_passes(
        self,
        inputs: dict[str, Any],
        passes: list[tuple[str, torch.Tensor]],
        sums: torch.Tensor,
        replace: bool,
        logps: torch.Tensor | None = None,
    ) -> None:
        """A backward pass of -sum(X_t logp_t) / trained tokens for each (name, X (B, T)) of
        `passes`, on `logps` (B, T) (the loss's forward: its graph kept after every pass) or on
        one forward of the micro-batch (None), consumed parameter by parameter: a
        measured pass adds its gradient's dot with the reference and squared norm to `sums`
        (`_MEASURED`), and "uniform" its dot with "reallocation"'s gradient, kept for it (the
        cross term); "summed" adds its gradient to the reference (a new one where `replace`).
        """
        model = self.accelerator.unwrap_model(self.model)  # no DDP hook: local gradients
        params = [p for p in model.parameters() if p.requires_grad]
        index = {id(p): i for i, p in enumerate(params)}
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        keep_graph = logps is not None  # the training backward runs on it after the probe
        if logps is None:
            input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            with self.accelerator.autocast():
                logps, _, _ = self._get_per_token_logps_and_entropies(
                    model,
                    input_ids,
                    attention_mask,
                    inputs["completion_ids"].size(1),
                    batch_size=self.args.per_device_train_batch_size,
                )
        weighted = logps * mask / mask.sum().clamp(min=1)
        reference = self._auto_reference
        names = [name for name, _ in passes]
        # g_R, parameter by parameter, until U's pass takes its dot (only where both run)
        kept_reallocation: dict[int, Stored] | None = (
            {} if "reallocation" in names and "uniform" in names else None
        )

        def measure(name: str):
            dot, norm = _MEASURED[name]

            def hook(param: torch.Tensor) -> None:
                i = index[id(param)]
                grad = param.grad
                sums[norm] += stored_square(grad)
                ref = None if reference is None else reference.get(i)
                if ref is not None:  # a parameter the reference has no gradient for: 0 there
                    sums[dot] += stored_dot(grad, ref)
                if kept_reallocation is not None:
                    if name == "reallocation":
                        kept_reallocation[i] = stored(grad)  # whole: the tensor itself
                    elif i in kept_reallocation:  # "uniform": the cross term, then released
                        sums[_SLOT["cross"]] += stored_dot(grad, kept_reallocation.pop(i))
                param.grad = None  # consumed: only g_R's kept gradients outlive their pass

            return hook

        def accumulate(param: torch.Tensor) -> None:
            i = index[id(param)]
            fresh[i] = stored_add(fresh[i], param.grad) if i in fresh else stored(param.grad)
            param.grad = None

        stashed = [p.grad for p in params]  # the training gradients, set aside (not copied)
        try:
            for p in params:
                p.grad = None
            for number, (name, values) in enumerate(passes):
                if name == "summed":
                    fresh = {} if replace else reference
                    if replace:  # the old reference is done with: freed before the new is built
                        reference = self._auto_reference = None
                    hook = accumulate
                else:
                    hook = measure(name)
                loss = -(values.to(logps.dtype) * weighted).sum()
                handles = [p.register_post_accumulate_grad_hook(hook) for p in params]
                try:
                    loss.backward(retain_graph=keep_graph or number < len(passes) - 1)
                finally:
                    for handle in handles:
                        handle.remove()
                if name == "summed":
                    self._auto_reference = fresh
        finally:
            for p, grad in zip(params, stashed, strict=True):
                p.grad = grad

    def _finish_auto_step(self) -> None:
        """At a step's last micro-batch: on a probed step, the probe's agreement over every
        process (every process enters the reduction) at the beta this step trained with, and
        beta's move; every step, the logs."""
        metrics = self._metrics["train"]
        if self._auto_probe_due():
            reduced = self.accelerator.reduce(self._auto_sums, reduction="sum").tolist()
            self._auto_sums.zero_()
            sums = dict(zip(SUMS, reduced, strict=True))
            beta = self._auto_beta_at(self.state.global_step)  # what `_prepare_inputs` used
            agreement = auto_beta.gradient_agreement(**sums, beta=beta)
            if not math.isnan(agreement):  # no reference yet, or nothing re-allocated: no move
                self._auto_agreements.append(agreement)
                self._auto_beta_value = auto_beta.next_auto_beta(
                    self._auto_beta_value,
                    self._auto_agreements,
                    self.args.mrtpo_beta_max,
                    self.args.mrtpo_beta_step,
                )
            metrics[METRIC_PREFIX + "probe_agreement"].append(agreement)
            metrics[METRIC_PREFIX + "probe_cosine"].append(
                auto_beta.gradient_cosine(
                    sums["reallocation_dot"], sums["reallocation_sq"], sums["reference_sq"]
                )
            )
            seconds = torch.tensor([self._auto_probe_seconds], device=self.accelerator.device)
            metrics[METRIC_PREFIX + "probe_seconds"].append(
                self.accelerator.gather(seconds).max().item()
            )
            self._auto_probe_seconds = 0.0
        for name, value in self._auto_beta_evidence().items():
            metrics[METRIC_PREFIX + name].append(value)
        # The beta the next step starts from (before the warm-up's cap).
        metrics[METRIC_PREFIX + "next_beta"].append(self._auto_beta_value)

    def _auto_beta_evidence(self) -> dict[str, float]:
        """What beta's moves rest on so far: the window's mean agreement, its standard error and
        one-sided 95% lower bound (NaN where there is nothing to say) and how many probes it
        holds. Logged every step (`mrtpo/beta_auto/<name>`) and shown in the credit maps."""
        mean, se, lower = auto_beta.agreement_bound(self._auto_agreements)
        return {
            "agreement": mean,
            "agreement_se": se,
            "agreement_lower": lower,
            "probes": float(len(self._auto_agreements)),
        }
