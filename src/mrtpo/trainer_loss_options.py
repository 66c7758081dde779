"""The sign-based loss options of `mrtpo.trainer.MRTPOTrainer` with per-token advantages:
`SequenceLevelLossMixin`, which the trainer inherits before TRL's `GRPOTrainer`.

TRL's off-policy sequence mask (`off_policy_mask_threshold`) and VESPO's gamma weights
(`loss_type="vespo"`) are sequence-level: they keep or weight a whole response by the sign of
its advantage and return (B, 1). With MRTPO's (B, T) advantages they get the response's own
advantage, the token mean over the trained tokens, which is GDPO's (the weights average 1
there), so a response is kept or weighted as under GDPO. SAPO's soft gate (`loss_type="sapo"`)
is token-level and picks its temperature by the sign of the advantage it multiplies: with MRTPO
that is each token's own A_t, the direction of that token's update, so it is left as TRL
computes it (as PPO's clipping is).
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer


class SequenceLevelLossMixin:
    """TRL's sequence-level loss options, given each response's advantage (module docstring).
    Static methods only: nothing is needed from the trainer."""

    @staticmethod
    def get_off_policy_mask(
        advantages: torch.Tensor,
        per_token_logps: torch.Tensor,
        sampling_per_token_logps: torch.Tensor,
        mask: torch.Tensor,
        off_policy_threshold: float,
    ) -> torch.Tensor:
        """TRL's off-policy sequence mask, (B, 1), by each response's advantage.

        advantages: (B, 1) or (B, T); the others (B, T) as TRL passes them.
        """
        return GRPOTrainer.get_off_policy_mask(
            advantages=_response_advantages(advantages, mask),
            per_token_logps=per_token_logps,
            sampling_per_token_logps=sampling_per_token_logps,
            mask=mask,
            off_policy_threshold=off_policy_threshold,
        )

    @staticmethod
    def get_gamma_weights(
        advantages: torch.Tensor,
        log_ratio_per_token: torch.Tensor,
        mask: torch.Tensor,
        importance_sampling_ratio: torch.Tensor | None,
        **gamma: float,
    ) -> torch.Tensor:
        """VESPO's sequence weights, (B, 1), by each response's advantage.

        advantages: (B, 1) or (B, T); log_ratio_per_token, mask, importance_sampling_ratio:
        (B, T) as TRL passes them; gamma: TRL's k/lambda keywords.
        """
        return GRPOTrainer.get_gamma_weights(
            advantages=_response_advantages(advantages, mask),
            log_ratio_per_token=log_ratio_per_token,
            mask=mask,
            importance_sampling_ratio=importance_sampling_ratio,
            **gamma,
        )


def _response_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each response's advantage, (B, 1), from (B, 1) or per-token (B, T) advantages.

    Per-token: the mean over the trained tokens (mask: (B, T)), GDPO's advantage for MRTPO's up
    to rounding; a response with no trained token gets 0.
    """
    if advantages.shape[-1] == 1:
        return advantages
    mask = mask.to(advantages.dtype)
    return (advantages * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
