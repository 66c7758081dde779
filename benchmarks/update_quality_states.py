"""The update-quality benchmark's design (`update_quality.py`): the states (a policy and a task),
the estimators and contrasts, the pre-registered plan; the prompts of each sample and their
sampling with the trainer's own generation, stored so that a measurement resumes elsewhere."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path("benchmarks/results/update-quality")
PLAN_FILE, POWER_FILE, RUN_FILE = "plan.json", "power.json", "run.json"
# The second plan's new-token cap, decided after its pilot (`update_quality_cap.py`): beside
# plan-2.json, which stays as stored.
CAP_FILE = "cap.json"
CHECKPOINTS = "checkpoints"  # ignored by git: the cold start, the reference sums
GROUP_SIZE = 4  # responses per prompt
PROMPTS_PER_BATCH = 4  # the training shape: one optimizer step of the powered study
SAMPLES = ("pilot", "main")


@dataclass(frozen=True)
class State:
    """A policy and a task. `model` is an embedded model's name, or "cold_start": the powered
    study's SmolLM2 tool-calling cold start, rebuilt by its own recipe."""

    task: str
    model: str
    max_completion_length: int
    learning_rate: float
    data: str | None = None  # a train file (default: the task's bundled train split)
    seed: int = 0


STATES: dict[str, State] = {
    # Exactly the powered study's: its cold start, its training rows, completion length and rate.
    "smollm2_tool_calling": State(
        task="tool_calling",
        model="cold_start",
        max_completion_length=96,
        learning_rate=1e-5,
        data="benchmarks/results/convergence-powered/tool_calling/data/train.jsonl",
    ),
    # As installed, on the bundled SQL task, with the recipe's completion length and rate
    # (recipes/sql-qwen2.5-coder-0.5b.yaml).
    "qwen_sql": State(
        task="sql",
        model="qwen2.5-coder-0.5b-instruct",
        max_completion_length=128,
        learning_rate=1e-6,
    ),
}

# The second plan's state (issue #48, `update_quality_plan2.py`): kept apart from STATES, which
# the first plan stores. Qwen2.5-Coder-0.5B-Instruct as installed on the bundled multi-constraint
# instruction-following task (one reward per constraint slot; a placebo row gets another
# prompt's constraints). The new-token cap is 256 unless the pilot says otherwise
# (`update_quality_plan2.CAP_RULE`); the rate is the SQL state's (Qwen2.5-Coder's recipes').
PLAN_2_STATES: dict[str, State] = {
    "qwen_instructions": State(
        task="instructions",
        model="qwen2.5-coder-0.5b-instruct",
        max_completion_length=256,
        learning_rate=1e-6,
    ),
}


@dataclass(frozen=True)
class CheckpointState(State):
    """A policy a training run kept along the way (`model`: its folder, a path relative to the
    repository root, resolved against the working directory), measured outside either plan: no
    pilot and no power step, a main sample of a fixed size drawn fresh from that policy (the
    main sample's prompts and sampling seeds), its token-level `variants` only."""

    batches: int = 9  # the main sample's mini-batches, fixed in advance
    folds: int = 3  # the references' folds (the fold jackknife's F)
    variants: tuple[str, ...] = ("mrtpo",)  # TOKEN_VARIANTS measured (beside grpo and gdpo)
    start: str = ""  # the model the run trained from: the architecture, for the memory estimate
    kept_by: str = ""  # the run that keeps the policy, and the step it must pass


# Measurements at a training study's checkpoint: kept apart from both plans (neither stores
# them). The SQL training study's gdpo seed 0 after 10 steps (issue #47, item 2): its kept policy
# (`convergence_runs.kept_policy_dir`, git-ignored), the study's completion length and rate; 9
# mini-batches of the first plan's qwen_sql main sample's prompts, in 3 folds of 3.
CHECKPOINT_STATES: dict[str, CheckpointState] = {
    "qwen_sql_gdpo_seed0_step10": CheckpointState(
        task="sql",
        model="benchmarks/results/sql-training-study/study/sql/gdpo/seed0/checkpoints/policy-step10",
        max_completion_length=128,
        learning_rate=3e-6,
        start="qwen2.5-coder-0.5b-instruct",
        kept_by="the SQL training study's run gdpo seed 0 (benchmarks/sql_training_study.py "
        "--study) must pass step 10 first",
    ),
}
ALL_STATES: dict[str, State] = {**STATES, **PLAN_2_STATES, **CHECKPOINT_STATES}

# Measured directly (one gradient each per mini-batch). "ref/<reward>" are the references.
# The token-level variants at beta = 1: the trainer's settings that make each.
TOKEN_VARIANTS: dict[str, dict[str, Any]] = {
    "mrtpo": {"replay_information": "own", "shuffle_token_weights": False, "token_relevance": "replay"},
    "placebo": {"replay_information": "placebo", "shuffle_token_weights": False, "token_relevance": "replay"},
    "shuffled": {"replay_information": "own", "shuffle_token_weights": True, "token_relevance": "replay"},
    "entropy": {"replay_information": "own", "shuffle_token_weights": False, "token_relevance": "entropy"},
}  # fmt: skip
RESPONSE_LEVEL = ("gdpo", "grpo")  # gdpo first: the others' distance from it is taken
# Every estimator of the report: (variant, beta); beta None for the response-level ones.
ESTIMATORS: dict[str, tuple[str, float | None]] = {
    "grpo": ("grpo", None),
    "gdpo": ("gdpo", None),
    "mrtpo(0.25)": ("mrtpo", 0.25),
    "mrtpo(0.5)": ("mrtpo", 0.5),
    "mrtpo(1)": ("mrtpo", 1.0),
    "placebo(0.5)": ("placebo", 0.5),
    "placebo(1)": ("placebo", 1.0),
    "shuffled(0.5)": ("shuffled", 0.5),
    "shuffled(1)": ("shuffled", 1.0),
    "entropy(0.5)": ("entropy", 0.5),
    "entropy(1)": ("entropy", 1.0),
}
PRIMARY_CONTRASTS = (
    ("mrtpo(0.5)", "gdpo"),
    ("mrtpo(0.5)", "placebo(0.5)"),
    ("mrtpo(0.5)", "shuffled(0.5)"),
)
SECONDARY_CONTRASTS = (
    ("mrtpo(0.25)", "gdpo"),
    ("mrtpo(1)", "gdpo"),
    ("mrtpo(1)", "placebo(1)"),
    ("mrtpo(1)", "shuffled(1)"),
    ("mrtpo(0.5)", "entropy(0.5)"),
    ("entropy(0.5)", "gdpo"),
    ("gdpo", "grpo"),
)
ALPHA, POWER, EFFECT_SHARE = 0.05, 0.8, 0.2  # detect 20% of gdpo's mean cosine, power 0.8
PILOT_BATCHES = 8
MAX_GRAD_NORM = 1.0  # the trainer's clip (MRTPOConfig's default, the study's)

ANALYSIS = f"""\
Written before the first measurement and stored in `plan.json`; a run with another plan is
refused.

- **Primary endpoint**: per mini-batch (4 prompts x 4 responses, the training shape), the
  cosine between an estimator's update (the gradient of TRL's loss at the first iteration) and
  the reference direction for the summed reward (the leave-one-out policy gradient from every
  other mini-batch's prompts).
- **Contrasts**, per state, paired by mini-batch: mrtpo(0.5) - gdpo, mrtpo(0.5) - placebo(0.5),
  mrtpo(0.5) - shuffled(0.5); 3 contrasts x 2 states = 6 tests.
- **Test**: two-sided paired t-test over the mini-batches, Holm's step-down correction over the
  6 p-values, family-wise alpha = {ALPHA}. **Estimates**: the mean difference with its 95% t
  interval (not corrected).
- **Sample size**: per state, from a pilot on a separate sample ({PILOT_BATCHES} mini-batches of
  other prompts): the number of mini-batches for power {POWER} to detect a difference of
  {EFFECT_SHARE:.0%} of gdpo's mean pilot cosine in mrtpo(0.5) - gdpo at alpha {ALPHA}/6 (Holm's
  first step), with the pilot's SD of that difference; capped by the budget, and the power then
  reached stated. No mini-batch is dropped or replaced.
- **Secondary** (uncorrected, 95% t intervals): the beta dose-response (mrtpo at 0.25, 0.5, 1);
  beta = 1 against its controls (the powered study's setting); the entropy control (token
  weights from the policy's own next-token entropy, no replay); grpo; each reward's own
  reference; gradient norms; the first-order gain of the clipped step; the norm of mrtpo's
  difference from gdpo's gradient.
- **Reading**, fixed in advance (per state; "differs" = significant after Holm):
  - mrtpo(0.5) above gdpo, the placebo and the shuffled weights: the verifier's own information
    makes the step point further uphill;
  - above gdpo but not above the placebo: any added context helps the step (the information is
    not what matters);
  - above gdpo and the placebo but not the shuffled weights: the weights' spread helps, not
    where they fall;
  - below gdpo: the reallocation displaces the uniform signal; the dose-response (cosine
    falling with beta) is the evidence, and the gradient norms say whether the clip is why;
  - no difference from gdpo: no effect on the step's direction at this scale, the interval of
    mrtpo(0.5) - gdpo bounding it;
  - the entropy control matching mrtpo (secondary): the replay finds what the policy's own
    uncertainty finds;
  - any other pattern is reported as it is, with its direction.
"""


# ----------------------------------------------------------------------------- paths, plan


def state_estimators(state: str) -> dict[str, tuple[str, float | None]]:
    """The first plan's estimators a state measures: every one, or, for a checkpoint state, the
    response-level ones and its variants' (`CheckpointState.variants`, at each beta)."""
    if state not in CHECKPOINT_STATES:
        return ESTIMATORS
    kept = {*RESPONSE_LEVEL, *CHECKPOINT_STATES[state].variants}
    return {name: spec for name, spec in ESTIMATORS.items() if spec[0] in kept}


def main_sample_size(results: Path, state: str) -> int | None:
    """The main sample's planned mini-batches: a checkpoint state's fixed size, else the pilot's
    power calculation's (`<state>/power.json`); None before it."""
    if state in CHECKPOINT_STATES:
        return CHECKPOINT_STATES[state].batches
    power = read_json(state_dir(results, state) / POWER_FILE)
    return None if power is None else int(power["batches"])


def checkpoint_policy(state: str) -> Path:
    """A checkpoint state's policy folder; refused (SystemExit) where no policy is there yet,
    naming the run that must keep it."""
    folder = Path(CHECKPOINT_STATES[state].model)
    if not (folder / "config.json").is_file() or not list(folder.glob("*.safetensors")):
        raise SystemExit(
            f"{state}: no policy in {folder.resolve()} (the state's folder, relative to the "
            f"working directory: run from the main checkout): {CHECKPOINT_STATES[state].kept_by}"
        )
    return folder


def state_dir(results: Path, state: str) -> Path:
    return Path(results) / state


def sample_dir(results: Path, state: str, sample: str, cap: int | None = None) -> Path:
    """A sample's folder. The main sample is `<state>/main`; a pilot at the state's stored cap
    `<state>/pilot`, a pilot sampled again at another new-token cap `<state>/pilot-cap<cap>`
    (the second plan's cap rule). cap: the pilot's; None: the decided one (`decided_cap`)."""
    if sample != "pilot":
        return state_dir(results, state) / sample
    stored = ALL_STATES[state].max_completion_length if state in ALL_STATES else None
    cap = decided_cap(results, state) if cap is None else cap
    name = sample if cap in (None, stored) else f"{sample}-cap{cap}"
    return state_dir(results, state) / name


def decided_cap(results: Path, state: str) -> int | None:
    """The new-token cap stored in `<state>/cap.json` after the pilot; None before (and for the
    first plan's states, whose caps their plan stores)."""
    decision = read_json(state_dir(results, state) / CAP_FILE)
    return None if decision is None else int(decision["cap"])


def load_samples(
    results: Path, state: str, sample: str, cap: int | None = None
) -> dict[int, dict[str, Any]]:
    """{mini-batch: its sample record} of a sample folder (`sample_dir`)."""
    folder = sample_dir(results, state, sample, cap) / "samples"
    return {int(p.stem[len("batch") :]): read_json(p) for p in sorted(folder.glob("batch*.json"))}


def capped(record: Mapping[str, Any], state: str) -> list[bool]:
    """Per response: whether it stopped at its completion cap (no end token before): the cap it
    was sampled at (stored with the sample since the second plan), else the state's."""
    cap = record.get("max_completion_length", ALL_STATES[state].max_completion_length)
    return [len(ids) >= cap for ids in record["completion_ids"]]


def plan(states: Mapping[str, State] = STATES) -> dict[str, Any]:
    """The design and the analysis: what a run compares against the stored `plan.json`."""
    return {
        "analysis": ANALYSIS,
        "states": {name: vars(state) for name, state in states.items()},
        "group_size": GROUP_SIZE,
        "prompts_per_batch": PROMPTS_PER_BATCH,
        "pilot_batches": PILOT_BATCHES,
        "estimators": {name: list(spec) for name, spec in ESTIMATORS.items()},
        "token_variants": TOKEN_VARIANTS,
        "primary_contrasts": [list(c) for c in PRIMARY_CONTRASTS],
        "secondary_contrasts": [list(c) for c in SECONDARY_CONTRASTS],
        "alpha": ALPHA,
        "power": POWER,
        "effect_share": EFFECT_SHARE,
        "max_grad_norm": MAX_GRAD_NORM,
    }


def record_plan(
    results: Path, wanted: Mapping[str, Any] | None = None, file: str = PLAN_FILE
) -> None:
    """Write the plan (`plan.json`, or `file`) before the first measurement; refuse a run whose
    plan differs."""
    wanted = json.loads(json.dumps(wanted if wanted is not None else plan()))
    path = Path(results) / file
    stored = read_json(path)
    if stored is None:
        write_json(path, wanted)
        return
    if stored != wanted:
        changed = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
        raise SystemExit(
            f"{path} holds another plan (differs in: {', '.join(changed)}); the analysis is fixed "
            "before the measurement: measure into another --results folder"
        )


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text()) if Path(path).is_file() else None


def write_json(path: Path, value: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(value, indent=1) + "\n")
    os.replace(temporary, path)


# ----------------------------------------------------------------------------- prompts


def prompt_order(num_rows: int, seed: int) -> list[int]:
    """A seeded permutation of the train rows: the pilot takes the first PILOT_BATCHES *
    PROMPTS_PER_BATCH, the main sample the rest, so the two share no prompt."""
    return np.random.default_rng(seed).permutation(num_rows).tolist()


def batch_rows(num_rows: int, seed: int, sample: str, batch: int) -> list[int]:
    """The dataset rows of mini-batch `batch` of `sample`."""
    order = prompt_order(num_rows, seed)
    start = (0 if sample == "pilot" else PILOT_BATCHES) + batch
    rows = order[start * PROMPTS_PER_BATCH : (start + 1) * PROMPTS_PER_BATCH]
    if len(rows) < PROMPTS_PER_BATCH:
        raise ValueError(
            f"sample {sample!r} batch {batch}: the split has {num_rows} rows, too few for it"
        )
    return rows


def max_batches(num_rows: int, sample: str) -> int:
    pilot_rows = PILOT_BATCHES * PROMPTS_PER_BATCH
    if sample == "pilot":
        return PILOT_BATCHES
    return (num_rows - pilot_rows) // PROMPTS_PER_BATCH


# ----------------------------------------------------------------------------- the trainer


def _trainer_class() -> type:
    from mrtpo.trainer import MRTPOTrainer

    class MeasuringTrainer(MRTPOTrainer):
        """The trainer, able to reuse one forward's log-probabilities for several losses
        (`reusing_forward`): each loss is TRL's `_compute_loss` on the same graph."""

        reused: tuple[Any, Any] | None = None

        def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
            if self.reused is not None:
                return (*self.reused, None)
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)

    return MeasuringTrainer


def build_trainer(
    model: Any,
    tokenizer: Any,
    task: Any,
    dataset: Any,
    state: State,
    output_dir: Path,
    device: str = "cpu",
    **overrides: Any,
) -> Any:
    """An MRTPO trainer with the powered study's settings (mrtpo at beta 1, no warm-up: the
    variants are switched by `configured`); never trained, used for its hooks."""
    from mrtpo.training import train_config

    settings: dict[str, Any] = {
        "output_dir": str(output_dir),
        "seed": state.seed,
        "max_steps": 1,
        "num_generations": GROUP_SIZE,
        "per_device_train_batch_size": GROUP_SIZE * PROMPTS_PER_BATCH,
        "gradient_accumulation_steps": 1,
        "max_completion_length": state.max_completion_length,
        "learning_rate": state.learning_rate,
        "advantage_estimator": "mrtpo",
        "mrtpo_beta": 1.0,
        "mrtpo_warmup_steps": 0,
        "save_strategy": "no",
        "disable_tqdm": True,
        "max_grad_norm": MAX_GRAD_NORM,
    }
    if device == "cpu":  # bf16 (an override) is autocast: the weights stay float32
        settings.update(use_cpu=True, bf16=False, dataloader_pin_memory=False)
    config = train_config(**{**settings, **overrides})
    trainer = _trainer_class()(
        model=model,
        reward_funcs=task.verifiers(),
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.model.train()
    return trainer


@contextlib.contextmanager
def configured(trainer: Any, **fields: Any) -> Iterator[Any]:
    """The trainer with some `MRTPOConfig` fields set for a while (the variants' switches)."""
    before = {name: getattr(trainer.args, name) for name in fields}
    for name, value in fields.items():
        setattr(trainer.args, name, value)
    try:
        yield trainer
    finally:
        for name, value in before.items():
            setattr(trainer.args, name, value)


# ----------------------------------------------------------------------------- sampling


def sample_batch(trainer: Any, rows: Sequence[Mapping[str, Any]], seed: int) -> dict[str, Any]:
    """Generate GROUP_SIZE responses to each of `rows` with TRL's own generation and score
    them with the task's verifiers (the trainer's `_generate_and_score_completions`, GDPO's
    advantages: nothing replayed). Returns `batch_record`'s record."""
    import torch

    from mrtpo import advantages

    inputs = [dict(row) for row in rows for _ in range(GROUP_SIZE)]  # TRL's repeat sampler
    torch.manual_seed(seed)
    estimator = trainer._estimator
    trainer._estimator = advantages.get_estimator("gdpo")
    try:
        output = trainer._generate_and_score_completions(inputs)
    finally:
        trainer._estimator = estimator
    record = batch_record(output, trainer._scored, trainer.reward_func_names)
    return {"seed": seed, "max_completion_length": trainer.args.max_completion_length, **record}


def batch_record(
    output: Mapping[str, Any], scored: Any, reward_names: Sequence[str]
) -> dict[str, Any]:
    """A generation batch as JSON (TRL's batch dict and the trainer's `ScoredBatch`), from
    which `batch_inputs` rebuilds both exactly: unpadded prompt and completion ids, the
    completion width, rewards and verdicts."""
    prompt_lengths = output["prompt_mask"].sum(dim=1).tolist()
    completion_lengths = output["completion_mask"].sum(dim=1).tolist()
    width = output["prompt_ids"].shape[1]
    prompt_ids = output["prompt_ids"].tolist()
    completion_ids = output["completion_ids"].tolist()
    return {
        "prompts": list(scored.prompts),
        "completions": list(scored.completions),
        "prompt_ids": [ids[width - n :] for ids, n in zip(prompt_ids, prompt_lengths, strict=True)],
        "completion_ids": [
            ids[:n] for ids, n in zip(completion_ids, completion_lengths, strict=True)
        ],
        "completion_width": output["completion_ids"].shape[1],
        "rewards": scored.rewards.tolist(),
        "reward_names": list(reward_names),
        "verdicts": [
            [[v.score, v.info, [list(span) for span in v.spans]] for v in verdicts]
            if verdicts is not None
            else None
            for verdicts in scored.verdicts
        ],
        "scored_completion_ids": [list(ids) for ids in scored.completion_ids],
    }


def batch_inputs(trainer: Any, record: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    """(TRL's batch dict, the trainer's `ScoredBatch`) of a sampled record: prompts left-padded,
    completions right-padded with the tokenizer's pad id, as TRL pads them."""
    import torch

    from mrtpo.step_data import ScoredBatch
    from mrtpo.verifiers import Verdict

    pad = trainer._tokenizer.pad_token_id
    prompt_width = max(len(ids) for ids in record["prompt_ids"])
    width = record["completion_width"]
    prompt_ids = torch.tensor(
        [[pad] * (prompt_width - len(ids)) + ids for ids in record["prompt_ids"]]
    )
    prompt_mask = torch.tensor(
        [[0] * (prompt_width - len(ids)) + [1] * len(ids) for ids in record["prompt_ids"]]
    )
    completion_ids = torch.tensor(
        [ids + [pad] * (width - len(ids)) for ids in record["completion_ids"]]
    )
    completion_mask = torch.tensor(
        [[1] * len(ids) + [0] * (width - len(ids)) for ids in record["completion_ids"]]
    )
    device = trainer.accelerator.device
    inputs = {
        "prompt_ids": prompt_ids.to(device),
        "prompt_mask": prompt_mask.to(device),
        "completion_ids": completion_ids.to(device),
        "completion_mask": completion_mask.to(device),
        "num_items_in_batch": completion_mask.sum().to(device),
    }
    verdicts = [
        [
            Verdict(score, info, tuple(tuple(span) for span in spans))
            for score, info, spans in column
        ]
        if column is not None
        else None
        for column in record["verdicts"]
    ]
    rows = len(record["prompts"])
    scored = ScoredBatch(
        prompts=record["prompts"],
        completions=record["completions"],
        completion_ids=record["scored_completion_ids"],
        rewards=torch.tensor(record["rewards"], dtype=torch.float32, device=device),
        verdicts=verdicts,
        local=slice(0, rows),
        loss_mask=completion_mask.float(),
    )
    return inputs, scored
