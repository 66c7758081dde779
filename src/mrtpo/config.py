"""`MRTPOConfig`: TRL's `GRPOConfig` plus the advantage estimator, the replay and the reward
weighting. Every field is a `mrtpo train` flag and a recipe key."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from mrtpo import advantages

ESTIMATORS = tuple(advantages.ESTIMATORS)  # "mrtpo", "gdpo", "grpo"
WEIGHTINGS = tuple(advantages.WEIGHTINGS)  # "static", "saw"
REPLAY_MODES = ("leave_one_out", "add_one")
REPLAY_INFORMATION = ("own", "placebo", "generic")
TOKEN_RELEVANCE = ("replay", "entropy", "contrastive")
BETA_AUTO = "auto"  # mrtpo_beta's non-numeric value: beta from the trainer's gradient probes


def parse_beta(text: str) -> float | str:
    """`--mrtpo_beta` on the command line and in a recipe: "auto" or a number (the parser's
    own type would be float, which refuses "auto"; `MRTPOConfig` checks the range)."""
    return BETA_AUTO if str(text).strip() == BETA_AUTO else float(text)


parse_beta.__name__ = "float or 'auto'"  # the type the CLI reference shows for --mrtpo_beta


@dataclass
class MRTPOConfig(GRPOConfig):
    """`GRPOConfig` plus MRTPO's settings. Every field is a `TrlParser` flag.

    `advantage_estimator` decides TRL's `multi_objective_aggregation`: "grpo" is
    "sum_then_normalize", "gdpo" and "mrtpo" are "normalize_then_sum" (MRTPO is GDPO with each
    reward's advantage re-allocated among tokens).

    `reward_weighting="saw"` refuses `reward_weights`: SAW's per-step weights are the choice of
    c_k (its authors' estimators have no other coefficient, so a product would have no published
    counterpart), and under GDPO and MRTPO a fixed factor would only tilt SAW's ratios by a
    hand-set preference, which is what SAW replaces (docs/SAW.md).
    """

    advantage_estimator: str = field(
        default="mrtpo",
        metadata={
            "help": "How advantages are computed: 'mrtpo' (each reward's advantage goes to its relevant "
            "tokens), 'gdpo' (normalize each reward per group, sum, normalize over the batch) or 'grpo' "
            "(sum the rewards, normalize per group).",
            "choices": list(ESTIMATORS),
        },
    )
    reward_weighting: str = field(
        default="static",
        metadata={
            "help": "The reward weights c_k: 'static' (reward_weights, all 1 by default) or 'saw' "
            "(SAW, arXiv 2606.07705: each step, every reward's coefficient of variation over the "
            "batch, rescaled to sum to K; refuses reward_weights).",
            "choices": list(WEIGHTINGS),
        },
    )
    saw_reward_shifts: list[float] | None = field(
        default=None,
        metadata={
            "help": "SAW only: one value per reward added before its statistics (a reward that "
            "can be negative: its lower bound); default 0. The rewards themselves are unchanged."
        },
    )
    mrtpo_beta: float | str = field(
        default=0.5,
        metadata={
            "help": "MRTPO weighting strength beta in [0, 1]; 0 gives GDPO on every token. "
            "'auto': beta starts at 0 and moves by mrtpo_beta_step after each probe, up (to at "
            "most mrtpo_beta_max) while more beta turns the clipped step towards an independent "
            "estimate of the summed reward's policy gradient (one-sided 95-percent lower bound "
            "of the recent probes' agreement, the sign of the step's cosine's derivative in "
            "beta, above 0), down otherwise (docs/METHOD.md, 'beta from the step's own evidence'). "
            "GDPO and GRPO have no beta: with them either value has no effect."
        },
    )
    mrtpo_beta_max: float = field(
        default=1.0,
        metadata={"help": "mrtpo_beta='auto' only: the largest beta it may reach, in [0, 1]."},
    )
    mrtpo_beta_step: float = field(
        default=0.1,
        metadata={
            "help": "mrtpo_beta='auto' only: how far beta moves after each probe, in (0, 1]."
        },
    )
    mrtpo_beta_probe_every: int = field(
        default=4,
        metadata={
            "help": "mrtpo_beta='auto' only: probe the gradients' agreement every N optimizer "
            "steps (one more forward and three backward passes per micro-batch of a probed step)."
        },
    )
    mrtpo_beta_window: int = field(
        default=8,
        metadata={
            "help": "mrtpo_beta='auto' only: how many of the latest probes' agreements the "
            "mean, its standard error and the bound are taken over (>= 2)."
        },
    )
    mrtpo_warmup_steps: int = field(
        default=10,
        metadata={
            "help": "Optimizer steps over which beta ramps from 0 (smoothstep); 0 = no warm-up. "
            "With mrtpo_beta='auto', the ramp to mrtpo_beta_max caps the automatic beta."
        },
    )
    bounded_token_advantages: bool = field(
        default=True,
        metadata={
            "help": "MRTPO: on a batch whose summed advantage S spreads less than one reward's "
            "advantage (rewards that cancel in the sum, std_batch S near 0), divide the "
            "re-allocated part of each token's advantage by the per-reward scale instead of "
            "std_batch S (docs/METHOD.md); every other batch gets the paper's formula bitwise. "
            "False: the paper's formula on every batch."
        },
    )
    share_prompt: bool = field(
        default=True,
        metadata={
            "help": "Compute each group's shared prompt once, in the loss's forward and backward, "
            "the old-policy and reference log-probs (each prompt packed with its G completions; "
            "exact) and in generation's prefill; shuffle whole groups into micro-batches and "
            "cut each micro-batch's padding. Every estimator. Models it cannot serve (vision "
            "inputs, sliding-window layers, not Llama/Qwen2) fall back to TRL's per-row path with "
            "a logged reason."
        },
    )
    replay_mode: str = field(
        default="leave_one_out",
        metadata={
            "help": "Replay contexts: 'leave_one_out' (all information vs. all but reward k) or 'add_one' "
            "(bare prompt vs. prompt plus reward k's information).",
            "choices": list(REPLAY_MODES),
        },
    )
    replay_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Replay contexts (K + 1 per response) run per forward pass; default: mrtpo.relevance's own."
        },
    )
    replay_chunk_size: int | None = field(
        default=None,
        metadata={
            "help": "Response positions per JS-distance chunk; default: mrtpo.relevance's own default."
        },
    )
    replay_information: str = field(
        default="own",
        metadata={
            "help": "Control: 'own' (each row is replayed with its verifiers' information), "
            "'placebo' (with the information of the same-position row of another prompt of the "
            "generation batch, a seeded pairing of groups; where that prompt has nothing in a "
            "reward's slot, another of its texts or the next prompt's; rewards and everything "
            "else unchanged) or 'generic' (every reward's information replaced by one fixed, "
            "reward-agnostic sentence cut to the same token length: what any context does).",
            "choices": list(REPLAY_INFORMATION),
        },
    )
    token_relevance: str = field(
        default="replay",
        metadata={
            "help": "Where MRTPO's token distances come from: 'replay' (each reward's verifier "
            "information, METHOD.md), 'contrastive' (the replay's distance under the own "
            "information minus that under the placebo's, clamped at 0: tokens that any context "
            "moves count less; one more replay) or 'entropy' (a control that costs no replay: "
            "the policy's own next-token entropy at each response token, the same for every "
            "reward).",
            "choices": list(TOKEN_RELEVANCE),
        },
    )
    shuffle_token_weights: bool = field(
        default=False,
        metadata={"help": "Ablation: permute each response's token weights among its own tokens."},
    )
    credit_map_steps: int = field(
        default=0,
        metadata={
            "help": "Write credit maps of the lowest- and highest-reward rows every N steps (0: never)."
        },
    )
    logging_steps: float = field(
        default=1,
        metadata={
            "help": "Log every N steps (metrics.jsonl gets one line per log). MRTPO default: 1."
        },
    )

    def __post_init__(self) -> None:
        if self.advantage_estimator not in ESTIMATORS:
            raise ValueError(
                f"advantage_estimator must be one of {', '.join(ESTIMATORS)}, got {self.advantage_estimator!r}"
            )
        self._check_reward_weighting()
        self._check_beta()
        if self.mrtpo_warmup_steps < 0:
            raise ValueError(f"mrtpo_warmup_steps must be >= 0, got {self.mrtpo_warmup_steps!r}")
        if self.replay_mode not in REPLAY_MODES:
            raise ValueError(
                f"replay_mode must be one of {', '.join(REPLAY_MODES)}, got {self.replay_mode!r}"
            )
        if self.replay_information not in REPLAY_INFORMATION:
            raise ValueError(
                f"replay_information must be one of {', '.join(REPLAY_INFORMATION)}, got "
                f"{self.replay_information!r}"
            )
        if self.token_relevance not in TOKEN_RELEVANCE:
            raise ValueError(
                f"token_relevance must be one of {', '.join(TOKEN_RELEVANCE)}, got "
                f"{self.token_relevance!r}"
            )
        if self.token_relevance == "entropy" and self.replay_information != "own":
            raise ValueError(
                "token_relevance='entropy' replays nothing, so replay_information="
                f"{self.replay_information!r} has no effect: leave it at 'own'"
            )
        if self.token_relevance == "contrastive" and self.replay_information != "own":
            raise ValueError(
                "token_relevance='contrastive' contrasts each row's own information with the "
                f"placebo's, so replay_information={self.replay_information!r} would replace the "
                "own side of the contrast: leave it at 'own'"
            )
        for name in ("replay_batch_size", "replay_chunk_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (or unset), got {value!r}")
        if self.credit_map_steps < 0:
            raise ValueError(
                f"credit_map_steps must be >= 0 (0 = off), got {self.credit_map_steps!r}"
            )
        # The estimator decides TRL's aggregation; GRPOConfig's default is "sum_then_normalize", so
        # the only visible contradiction is GDPO's aggregation requested with GRPO.
        if not advantages.get_estimator(self.advantage_estimator).normalizes_each_reward:
            if self.multi_objective_aggregation == "normalize_then_sum":
                raise ValueError(
                    "multi_objective_aggregation='normalize_then_sum' is GDPO; with "
                    f"advantage_estimator={self.advantage_estimator!r} leave it at "
                    "'sum_then_normalize' (or use advantage_estimator='gdpo')"
                )
        else:
            self.multi_objective_aggregation = "normalize_then_sum"
        super().__post_init__()

    @property
    def beta_is_auto(self) -> bool:
        """Whether beta is chosen by the trainer from its gradients (`mrtpo_beta="auto"`)."""
        return self.mrtpo_beta == BETA_AUTO

    def _check_beta(self) -> None:
        """`mrtpo_beta`: a number in [0, 1] (a numeric string is read as one: the command
        line and recipes give strings) or "auto", which needs MRTPO and sane auto settings."""
        if isinstance(self.mrtpo_beta, str) and self.mrtpo_beta != BETA_AUTO:
            try:
                self.mrtpo_beta = float(self.mrtpo_beta)
            except ValueError:
                raise ValueError(
                    f"mrtpo_beta must be a number in [0, 1] or {BETA_AUTO!r}, got "
                    f"{self.mrtpo_beta!r}"
                ) from None
        if not self.beta_is_auto and not 0.0 <= self.mrtpo_beta <= 1.0:
            raise ValueError(f"mrtpo_beta must be in [0, 1], got {self.mrtpo_beta!r}")
        if not 0.0 <= self.mrtpo_beta_max <= 1.0:
            raise ValueError(f"mrtpo_beta_max must be in [0, 1], got {self.mrtpo_beta_max!r}")
        if not 0.0 < self.mrtpo_beta_step <= 1.0:
            raise ValueError(f"mrtpo_beta_step must be in (0, 1], got {self.mrtpo_beta_step!r}")
        if self.mrtpo_beta_probe_every < 1:
            raise ValueError(
                f"mrtpo_beta_probe_every must be >= 1, got {self.mrtpo_beta_probe_every!r}"
            )
        if self.mrtpo_beta_window < 2:
            raise ValueError(
                "mrtpo_beta_window must be >= 2 (a standard error needs two probes), got "
                f"{self.mrtpo_beta_window!r}"
            )
        if self.beta_is_auto and not advantages.get_estimator(self.advantage_estimator).token_level:
            # A recipe's `auto` under `--advantage_estimator gdpo` (its baseline): GDPO and GRPO
            # have no beta and ignore a number; 0 is the step they take, and nothing is probed.
            self.mrtpo_beta = 0.0

    def _check_reward_weighting(self) -> None:
        if self.reward_weighting not in WEIGHTINGS:
            raise ValueError(
                f"reward_weighting must be one of {', '.join(WEIGHTINGS)}, got {self.reward_weighting!r}"
            )
        weighting = advantages.get_weighting(self.reward_weighting)
        if weighting.per_step and self.reward_weights is not None:
            raise ValueError(
                f"reward_weighting={self.reward_weighting!r} computes the reward weights every "
                f"step and refuses reward_weights (got {self.reward_weights!r}): leave "
                "reward_weights unset, or use reward_weighting='static'"
            )
        if not weighting.per_step and self.saw_reward_shifts is not None:
            raise ValueError(
                "saw_reward_shifts shift the rewards for SAW's statistics; with "
                f"reward_weighting={self.reward_weighting!r} leave them unset"
            )
