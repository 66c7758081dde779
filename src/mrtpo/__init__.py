"""mrtpo: multi-reward RL for language models with reward-specific token-level credit.

Modules, one idea each:
- `mrtpo.advantages`: GRPO, GDPO and MRTPO advantages as pure tensor functions.
- `mrtpo.relevance`: Jensen-Shannon distance and the leave-one-out replay.
- `mrtpo.verifiers`: `Verdict` and `Verifier`, the contract every task follows.
- `mrtpo.tasks`: text-to-SQL, tool calling, instruction following.
- `mrtpo.trainer`: `MRTPOConfig`, `MRTPOTrainer` on TRL's `GRPOTrainer`.
- `mrtpo.credit`: credit maps and localization analysis.
"""

__version__ = "0.1.0"
