"""The policy's whole parameters for the replay, gathered the same way on every process.

Sharded training (DeepSpeed ZeRO-3, FSDP2) keeps each parameter in pieces across processes; a
forward pass on sharded parameters gathers them with collectives that every process must enter
the same number of times. The replay's forward passes depend on each process's own rows (how
many, their distinct prompts, shared stems, batch splits), and a process may have no row to
replay at all. So the replay never runs on sharded parameters: every process gathers the whole
model once before it and frees it afterwards, whatever its rows, and everything in between is
a local computation (`full_parameters`).

- ZeRO-3: TRL's generation unwrap with the parameters gathered (what TRL's generation does with
  its default `ds3_gather_for_generation=True`).
- FSDP2 (`fully_shard`): every FSDP module unsharded, in the model's module order (the same on
  every process), kept unsharded through the replay's forward passes, resharded afterwards.
- DDP, one process, ZeRO-1/2: the parameters are whole already; nothing is gathered.

The cost is the whole model in its compute dtype on each device during the replay (7B in bf16:
about 15 GB), what ZeRO-3's default generation already holds at the same point of the step.
Setups where gathering is impossible or asked against are refused (`check_replay_backend`):
ZeRO-3 with `ds3_gather_for_generation=False`, and FSDP version 1.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from trl.distributed import DistributedBackend
from trl.models.utils import unwrap_model_for_generation


def check_replay_backend(accelerator: Any, ds3_gather_for_generation: bool) -> None:
    """Refuse the sharded setups whose parameters the replay cannot gather once.

    Args:
        accelerator: the trainer's `accelerate.Accelerator`.
        ds3_gather_for_generation: the config's flag of that name (ZeRO-3 only).
    """
    backend = DistributedBackend(accelerator)
    if backend.is_zero3 and not ds3_gather_for_generation:
        raise ValueError(
            "the MRTPO replay (advantage_estimator='mrtpo', or credit_map_steps > 0) gathers the "
            "whole model once per replay so that processes with different rows stay in step, "
            "but ds3_gather_for_generation=False asks ZeRO-3 not to gather it: set "
            "ds3_gather_for_generation=True, or use advantage_estimator='gdpo' with "
            "credit_map_steps=0"
        )
    if backend.fsdp_version == 1:
        raise ValueError(
            "the MRTPO replay does not support FSDP version 1 (its forward cannot run on summoned "
            "whole parameters); use FSDP2: fsdp_version: 2 in the accelerate config "
            "(recipes/accelerate/fsdp2.yaml)"
        )


@contextmanager
def full_parameters(
    model: torch.nn.Module,
    accelerator: Any,
    gradient_checkpointing_kwargs: Mapping[str, Any] | None = None,
) -> Iterator[torch.nn.Module]:
    """The unwrapped model with whole parameters, for forward passes that differ by process.

    Every process must enter and leave this context the same number of times (it gathers on
    entry and frees on exit); inside, forward passes run no collective. Gradient checkpointing
    is off inside (as in TRL's generation) and PEFT adapters stay active.

    Args:
        model: the trainer's `model_wrapped` (DDP, DeepSpeed engine or FSDP2 module).
        accelerator: the trainer's `accelerate.Accelerator`.
        gradient_checkpointing_kwargs: the config's, to turn checkpointing back on afterwards.
    """
    with (
        unwrap_model_for_generation(
            model,
            accelerator,
            gather_deepspeed3_params=True,
            gradient_checkpointing_kwargs=gradient_checkpointing_kwargs,
        ) as unwrapped,
        _fsdp2_unsharded(unwrapped),
    ):
        yield unwrapped


@contextmanager
def _fsdp2_unsharded(model: torch.nn.Module) -> Iterator[None]:
    """Unshard every FSDP2 module of `model` and keep it unsharded until the context ends.

    `model.modules()` is in the same order on every process, so the all-gathers pair up. The
    outermost FSDP module is initialized as the root first (FSDP makes the first module to run
    forward the root, and the replay calls inner modules directly). Reshard-after-forward is
    turned off inside, so that the modules' own forward hooks neither free nor gather again;
    each module's setting is put back afterwards as it was (private attributes of torch 2.13's
    FSDP2: the public setter cannot restore the root's automatic value).
    """
    modules = [module for module in model.modules() if isinstance(module, FSDPModule)]
    if not modules:
        yield
        return
    modules[0]._get_fsdp_state()._lazy_init()
    saved = []
    for module in modules:
        state = module._get_fsdp_state()
        saved.append(
            (
                state._auto_reshard_after_forward,
                [group.post_forward_mesh_info for group in state._fsdp_param_groups],
            )
        )
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    try:
        yield
    finally:
        for module, (automatic, mesh_infos) in zip(modules, saved, strict=True):
            module.reshard()
            state = module._get_fsdp_state()
            state._auto_reshard_after_forward = automatic
            for group, mesh_info in zip(state._fsdp_param_groups, mesh_infos, strict=True):
                group.post_forward_mesh_info = mesh_info


__all__ = ["check_replay_backend", "full_parameters"]
