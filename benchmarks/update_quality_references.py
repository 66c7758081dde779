"""The update-quality benchmark's references (`update_quality.py --reward_references`): which
leave-batch-out references a run keeps, and what they cost in memory and on disk, checked
before any pass starts so that a run that cannot fit is refused at once, with the numbers and
the setting that fits.

The primary endpoint needs the summed reward's reference, per fold (the fold jackknife). The
rewards' own references serve the per-reward cosines and the cosines between the rewards'
references:

- `per_fold`: each reward's reference per fold, the summed reward's their sum (the first
  plan's layout; K x F vectors);
- `whole`: the summed reward's per fold, and each reward's as one sum over every mini-batch
  (F + K vectors; the per-reward cosines then get paired-t intervals over mini-batches);
- `none`: the summed reward's per fold only (F vectors; the per-reward cosines are not
  measured).

The estimate (`Memory`), for P trainable parameters: the reference pass holds each lane's sums
of its mini-batches' parts in float32 (its folds of the folded references, every whole one);
the measure pass holds, per lane, every reference and gdpo's gradient in `--store_dtype`, or,
while the lanes' parts are summed into one file (two lanes or more), every reference in float32.
`--memory_limit_gb` bounds the larger of the two; by default the machine's memory less, per
lane, a margin for the rest (`margin_gb`): the model's float32 weights, its gradient and one
flat copy of it (3 x P x 4 bytes), the gradient sums of a layout that runs one forward for
every direction on chunks of the mini-batch (one float32 vector per direction and reference:
`--rows_per_forward` without `--recompute`), and 4 GB for the activations and the interpreter
(Qwen2.5-Coder-0.5B's SQL lane: 17.5 GB peak in its reference pass with 7.6 GB of sums, i.e.
about 10 GB beside them). On disk, at most: each lane's part file and the summed one (two lanes
or more), each beside its temporary copy while it is saved.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REWARD_REFERENCES = ("per_fold", "whole", "none")
SUMMED = "ref+sum"  # the summed reward's reference, where the rewards' are not kept per fold
GB = 1e9
ACTIVATIONS_GB = 4.0
BYTES = {"float32": 4, "bfloat16": 2}


def reference_names(reward_names: Sequence[str], mode: str) -> list[str]:
    """The references the passes compute, in order: "ref/<reward>" for each reward kept
    (per_fold, whole), after SUMMED where the rewards' are not per fold (whole, none)."""
    if mode not in REWARD_REFERENCES:
        raise ValueError(f"reward_references must be one of {REWARD_REFERENCES}, got {mode!r}")
    summed = [] if mode == "per_fold" else [SUMMED]
    return summed + ([] if mode == "none" else [f"ref/{name}" for name in reward_names])


def folded(name: str, mode: str) -> bool:
    """Whether reference `name` is kept per fold (else one sum over every mini-batch)."""
    return name == SUMMED or mode == "per_fold"


def record_mode(record: Any) -> str:
    """The `--reward_references` a measured mini-batch was made with (the first plan's records,
    made before the option, kept each reward's per fold: `per_fold`)."""
    return record.get("reward_references", "per_fold")


# ----------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class Memory:
    """What a run's references cost (GB = 1e9 bytes); `limit_gb`: what they may take."""

    mode: str
    parameters: int
    vectors: int  # the references kept, over every fold
    reference_gb: float  # the reference pass, every lane together
    measure_gb: float  # the measure pass, every lane together
    disk_gb: float  # the checkpoint files at their largest
    margin_gb: float  # per lane: the model, its gradient, the layout's sums, activations
    limit_gb: float

    @property
    def peak_gb(self) -> float:
        return max(self.reference_gb, self.measure_gb)

    @property
    def fits(self) -> bool:
        return self.peak_gb <= self.limit_gb

    def describe(self) -> str:
        return (
            f"--reward_references {self.mode}: {self.vectors} reference vectors of "
            f"{self.parameters:,} parameters, {self.reference_gb:.1f} GB in the reference pass "
            f"and {self.measure_gb:.1f} GB in the measure pass (limit {self.limit_gb:.1f} GB: "
            f"{'fits' if self.fits else 'does not fit'}); {self.disk_gb:.1f} GB of checkpoints"
        )


def machine_gb() -> float:
    """This machine's memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB


def margin_gb(parameters: int, entries: int) -> float:
    """Per lane, the memory beside the references (the module's docstring): the model's
    weights, gradient and a flat copy, `entries` gradient sums of a chunked layout, and
    ACTIVATIONS_GB."""
    return (3 + entries) * parameters * 4 / GB + ACTIVATIONS_GB


def estimate(
    parameters: int,
    rewards: int,
    mode: str,
    folds: int,
    batches: int,
    lanes: int = 1,
    store_dtype: str = "float32",
    directions: int = 0,
    chunked: bool = False,
    limit_gb: float | None = None,
) -> Memory:
    """The references' memory of a run (the module's docstring).

    parameters: the model's trainable ones; rewards: K; folds: the folds the references are
    kept in; batches: the sample's mini-batches; directions: the estimators' gradients the
    measure pass takes; chunked: a layout whose forward serves every direction on chunks (one
    gradient sum held per direction and reference); limit_gb: None for this machine's memory
    less `margin_gb` per lane."""
    names = reference_names([str(k) for k in range(rewards)], mode)
    per_fold = sum(folded(name, mode) for name in names)
    whole = len(names) - per_fold
    vectors = per_fold * folds + whole
    vector = parameters * 4 / GB  # float32
    parts = [
        per_fold * len({b % folds for b in range(lane, batches, lanes)}) + whole
        for lane in range(lanes)
    ]
    stored = vector * BYTES[store_dtype] / 4
    summing = vectors * vector if lanes > 1 else 0.0
    measure = lanes * max(summing, (vectors + 1) * stored)
    disk = 2 * (sum(parts) + (vectors if lanes > 1 else 0)) * vector  # each with its .tmp
    entries = (len(names) + directions) if chunked else 0
    margin = margin_gb(parameters, entries)
    limit = machine_gb() - lanes * margin if limit_gb is None else limit_gb
    return Memory(mode, parameters, vectors, sum(parts) * vector, measure, disk, margin, limit)


def check_memory(where: str, **settings: Any) -> Memory:
    """`estimate` of the run's `reward_references` (settings: `estimate`'s, `mode` among them);
    refused (SystemExit) where it does not fit, naming the numbers and the setting that does."""
    memory = estimate(**settings)
    if memory.fits:
        return memory
    others = [estimate(**{**settings, "mode": mode}) for mode in REWARD_REFERENCES]
    fitting = [m for m in others if m.fits and m.mode != memory.mode]
    limit = settings.get("limit_gb")
    source = (
        f"--memory_limit_gb {limit:g}"
        if limit is not None
        else f"this machine's {machine_gb():.1f} GB less {memory.margin_gb:.1f} GB per lane (the "
        "model's float32 weights, its gradient and a flat copy, a chunked layout's gradient "
        f"sums, {ACTIVATIONS_GB:g} GB of activations)"
    )
    suggestion = (
        f"pass --reward_references {fitting[0].mode} ({fitting[0].describe()})"
        if fitting
        else "no --reward_references fits: fewer --lanes, --store_dtype bfloat16 or --recompute"
    )
    raise SystemExit(
        f"{where}: the references do not fit: {memory.describe()}. The limit: {source}. "
        f"{suggestion[0].upper()}{suggestion[1:]}, or set --memory_limit_gb."
    )


def trainable_parameters(model: Any) -> int:
    """The model's trainable parameters: the length of `flat_gradient`'s vector."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def config_parameters(path: str | Path) -> int:
    """The trainable parameters of the model saved at `path`, from its config alone (built on
    the meta device: no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    return trainable_parameters(model)
