"""The policy's next-token logits from last hidden states, as TRL's loss computes them.

TRL 1.16's `GRPOTrainer` scores completions through a fused LM head
(`trl.trainer.utils.add_fused_lm_head`), and that is the distribution it trains: the vocabulary
projection runs under accelerate's autocast (or in float32 with `cast_lm_head_to_fp32`), then,
in float32, the logits are multiplied by the model's logit scale, soft-capped by the text
config's `final_logit_softcapping`, and divided by the sampling `temperature`. The model's own
forward applies none of the temperature and, depending on the architecture, not all of the
rest, so the replay applies them itself, in TRL's order (``PolicyHead``). Where the logit scale
comes from, in TRL's order of precedence: `logit_scale` (Cohere), `output_multiplier`,
`lm_head_multiplier` (Falcon-H1), then `logits_scaling` (Granite, MiniCPM3: logits divided by
it; HyperCLOVA X: multiplied).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


def _logit_scale(text_config: Any) -> float:
    """The factor the logits are multiplied by (1.0 when the config names none)."""
    for name in ("logit_scale", "output_multiplier", "lm_head_multiplier"):
        value = getattr(text_config, name, None)
        if value is not None:  # None means "not scaled" (e.g. MPT); a real 0.0 is kept
            return float(value)
    scaling = getattr(text_config, "logits_scaling", None)
    if scaling is not None:
        multiplies = getattr(text_config, "model_type", None) == "hyperclovax"
        return float(scaling) if multiplies else 1.0 / float(scaling)
    return 1.0


@dataclass(frozen=True)
class PolicyHead:
    """How last hidden states become the policy's logits (see the module docstring).

    temperature: the sampling temperature the logits are divided by (TRL's `temperature`).
    logit_scale: the model's logit multiplier.
    softcap: `final_logit_softcapping` of the text config (None: no soft-capping).
    lm_head_fp32: project in float32 outside autocast (TRL's `cast_lm_head_to_fp32`).
    """

    temperature: float = 1.0
    logit_scale: float = 1.0
    softcap: float | None = None
    lm_head_fp32: bool = False

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")

    @classmethod
    def of(cls, model: Any, temperature: float = 1.0, lm_head_fp32: bool = False) -> PolicyHead:
        """The head of ``model`` (its text config's scale and soft-cap) at ``temperature``."""
        text_config = model.config.get_text_config()
        softcap = getattr(text_config, "final_logit_softcapping", None)
        return cls(
            temperature=float(temperature),
            logit_scale=_logit_scale(text_config),
            softcap=float(softcap) if softcap else None,
            lm_head_fp32=lm_head_fp32,
        )

    def logits(self, model: Any, hidden: Tensor) -> Tensor:
        """Float32 logits Tensor[..., V] from last hidden states ``hidden``: Tensor[..., H]."""
        lm_head = model.get_output_embeddings()
        if self.lm_head_fp32:
            bias = None if lm_head.bias is None else lm_head.bias.float()
            with torch.autocast(hidden.device.type, enabled=False):
                logits = torch.nn.functional.linear(hidden.float(), lm_head.weight.float(), bias)
        else:
            logits = lm_head(hidden).float()  # autocast's dtype when the caller enabled it
        if self.logit_scale != 1.0:
            logits = logits * self.logit_scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        if self.temperature != 1.0:
            logits = logits / self.temperature
        return logits
