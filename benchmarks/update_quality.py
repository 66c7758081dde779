"""Does each step point uphill? Every estimator's update against the policy gradient, paired.

For a *state* (a policy and a task), P prompts x 4 responses are sampled once at temperature 1
and scored by the task's verifiers (`sample_batch`). They are cut into disjoint mini-batches of
the training shape (4 prompts x 4 responses: one optimizer step of the powered study). On each
mini-batch, every estimator's update is the gradient of the loss the trainer optimizes (TRL's
`_compute_loss` at the first iteration, with that estimator's advantages made by the trainer's
own code: the estimator registry, `MRTPOTrainer._token_advantages` and its replay), and it is
compared with a **reference direction**: the unbiased policy gradient of the expected reward
(sequence log-probability, each prompt's leave-one-out mean as the baseline, no std scaling),
for the summed reward and for each reward alone, built from the *other* mini-batches' prompts
only (the total minus the mini-batch's own part), so that an estimator and its reference share
no sample.

Measures per (mini-batch, estimator): the cosine with the reference, the gradient norm, the
first-order gain of the step the clip (max_grad_norm 1) allows, `ref . g / max(1, |g|)` (the
reference scaled to the mean over prompts of (1/G) sum_i a_i grad log p(y_i): d E[R] / d theta),
and for the token-level estimators the norm of the difference from GDPO's gradient.

Token advantages are affine in beta (also where the bounded normalization engages: the same
branch at every beta), and so is the loss gradient: an estimator at beta is
`(1 - beta) g_gdpo + beta g_1`. So each token-level variant is measured once, at beta = 1, and
its values at beta 0.25 and 0.5 come from the stored dot products (`blend`), exact
(`tests/test_update_quality_bench.py` checks against a direct computation at beta 0.5).

Two passes, resumable, in `--lanes` processes (each takes the mini-batches b with
b % lanes == lane): `reference` (each mini-batch's per-reward reference part, summed per lane
into `checkpoints/reference-lane<i>.pt`) and `measure` (each mini-batch again: its reference part
subtracted from the total, every estimator's gradient, dot products streamed, one
`measures/batch<b>.json`). Samples are committed (`samples/batch<b>.json`, token ids included)
so a measurement resumes on another machine from the same responses.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/update_quality.py --state smollm2_tool_calling \
        --sample pilot --lane 0 --lanes 2 &   # and --lane 1 beside it
    .venv/bin/python benchmarks/update_quality.py --power --state smollm2_tool_calling
    .venv/bin/python benchmarks/update_quality.py --report

Results: `benchmarks/results/update-quality/` (README.md, cosines.png, plan.json; per state and
sample: samples/, measures/, run.json; power.json from the pilot).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import convergence  # noqa: E402  (a sibling script: the cold start, machine, paired t)
import convergence_powered  # noqa: E402  (Holm)

RESULTS = Path("benchmarks/results/update-quality")
PLAN_FILE, POWER_FILE, RUN_FILE = "plan.json", "power.json", "run.json"
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


def state_dir(results: Path, state: str) -> Path:
    return Path(results) / state


def sample_dir(results: Path, state: str, sample: str) -> Path:
    return state_dir(results, state) / sample


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


def record_plan(results: Path, wanted: Mapping[str, Any] | None = None) -> None:
    """Write `plan.json` before the first measurement; refuse a run whose plan differs."""
    wanted = json.loads(json.dumps(wanted if wanted is not None else plan()))
    path = Path(results) / PLAN_FILE
    stored = _read_json(path)
    if stored is None:
        _write_json(path, wanted)
        return
    if stored != wanted:
        changed = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
        raise SystemExit(
            f"{path} holds another plan (differs in: {', '.join(changed)}); the analysis is fixed "
            "before the measurement: measure into another --results folder"
        )


def _read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text()) if Path(path).is_file() else None


def _write_json(path: Path, value: Any) -> None:
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
    return {"seed": seed, **batch_record(output, trainer._scored, trainer.reward_func_names)}


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


# ----------------------------------------------------------------------------- directions


def leave_one_out(rewards: Any, group_size: int = GROUP_SIZE) -> Any:
    """Each response's reward minus the mean of the other responses to its prompt:
    Tensor[N, K] from Tensor[N, K] (a reward with no score counts 0; none here has)."""
    import torch

    rewards = torch.nan_to_num(rewards)
    grouped = rewards.view(-1, group_size, rewards.shape[1])
    others = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - others).view_as(rewards)


def estimator_advantages(
    trainer: Any, inputs: Mapping[str, Any], scored: Any, batch: int
) -> dict[str, Any]:
    """Each directly measured estimator's advantages on the batch, made by the trainer's code:
    grpo and gdpo (Tensor[N]) by the registry as `_generate_and_score_completions` calls it;
    each token-level variant (Tensor[N, T]) by `_token_advantages` at beta 1 (its replay, or
    the entropy forward), with the variant's switches set. The step (`global_step`) is the
    mini-batch's index: the placebo's pairing and the shuffle's permutation are the ones the
    trainer would draw at that step."""
    import torch

    from mrtpo import advantages
    from mrtpo.step_data import StepAdvantages
    from mrtpo.trainer import EPS

    out: dict[str, Any] = {}
    weights = trainer._step_reward_weights(scored.rewards)
    for name in RESPONSE_LEVEL:
        out[name] = advantages.get_estimator(name)(
            scored.rewards, GROUP_SIZE, weights, scale=trainer.scale_rewards, eps=EPS
        )
    normalized = torch.nan_to_num(advantages.per_reward(scored.rewards, GROUP_SIZE, eps=EPS))
    step = StepAdvantages(weights, out["gdpo"], per_reward=normalized, token=None)
    trainer.state.global_step = batch
    output = {
        key: inputs[key]
        for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
    }
    for name, switches in TOKEN_VARIANTS.items():
        with configured(trainer, mrtpo_beta=1.0, mrtpo_warmup_steps=0, **switches):
            token = trainer._token_advantages(scored, step, GROUP_SIZE, output)
        out[name] = token.advantages
    return out


def flat_gradient(model: Any) -> Any:
    """The model's gradient as one float32 vector on the CPU (0 for a parameter without one).
    Each parameter's `.grad` is released once copied: a 0.5B model's gradient is 2.5 GB, and
    holding it twice costs what a lane can spare."""
    import torch

    parameters = [p for p in model.parameters() if p.requires_grad]
    flat = torch.zeros(sum(p.numel() for p in parameters), dtype=torch.float32)
    offset = 0
    for parameter in parameters:
        size = parameter.numel()
        if parameter.grad is not None:
            flat[offset : offset + size].copy_(parameter.grad.detach().reshape(-1))
            parameter.grad = None
        offset += size
    return flat


CHUNK = 1 << 24  # elements per step of a streamed dot product


def dot(a: Any, b: Any) -> float:
    """a . b in float64, streamed over chunks (no float64 copy of a whole gradient)."""
    total = 0.0
    for start in range(0, a.numel(), CHUNK):
        total += float(a[start : start + CHUNK].double() @ b[start : start + CHUNK].double())
    return total


def difference(total: Any, part: Any, dtype: Any) -> Any:
    """total - part, stored in `dtype`, computed chunk by chunk in float32."""
    import torch

    out = torch.empty(part.numel(), dtype=dtype)
    for start in range(0, part.numel(), CHUNK):
        chunk = slice(start, start + CHUNK)
        out[chunk] = (total[chunk].float() - part[chunk]).to(dtype)
    return out


LOSS_SUMS_OVER_TOKENS = ("dapo", "cispo", "vespo")  # TRL's normalizer: the batch's tokens


def batch_gradients(
    trainer: Any,
    inputs: Mapping[str, Any],
    coefficients: Mapping[str, Any],
    on_gradient: Any,
    rows_per_forward: int | None = None,
    recompute: bool = False,
) -> None:
    """For each entry of `coefficients`, the ascent direction (minus the loss gradient) of
    the batch, passed to `on_gradient(name, vector)` in order.

    An estimator's entry is its advantages, Tensor[N] or Tensor[N, T]: the loss is TRL's
    `_compute_loss` on the whole batch (one optimizer step of the training shape: TRL's
    normalizer is the batch's tokens). A reference's entry is ("sequence", Tensor[N]): the
    loss -sum_i a_i sum_t log p(y_i,t).

    The rows go through the model `rows_per_forward` at a time (whole groups: a multiple of
    GROUP_SIZE; default all). Each forward serves every loss (`MeasuringTrainer`), one backward
    each, the directions summed over the forwards (memory: one gradient per entry); with
    `recompute`, each entry runs its own forwards instead (memory: one gradient; time: a
    forward per entry and chunk). Chunks need a loss whose chunks add up (TRL's
    LOSS_SUMS_OVER_TOKENS); any other loss type is measured on the whole batch.
    """
    rows = inputs["completion_ids"].shape[0]
    step = rows_per_forward or rows
    if step % GROUP_SIZE:
        raise ValueError(f"rows_per_forward must hold whole groups of {GROUP_SIZE}, got {step}")
    if step < rows and trainer.loss_type not in LOSS_SUMS_OVER_TOKENS:
        raise ValueError(
            f"loss_type {trainer.loss_type!r}: rows_per_forward cuts a batch into chunks whose "
            f"losses must add up, as TRL's {', '.join(LOSS_SUMS_OVER_TOKENS)} losses do"
        )
    trainer.current_gradient_accumulation_steps = trainer.args.steps_per_generation
    chunks = [slice(start, start + step) for start in range(0, rows, step)]
    model = trainer.model
    try:
        if recompute:
            for name, coefficient in coefficients.items():
                model.zero_grad(set_to_none=True)
                for chunk in chunks:  # the chunks' gradients add up in `.grad`
                    _chunk_backwards(trainer, inputs, {name: coefficient}, chunk)
                on_gradient(name, flat_gradient(model).neg_())  # the ascent direction
            return
        sums: dict[str, Any] = {}

        def add(name: str) -> None:  # the ascent direction, summed over the chunks
            vector = flat_gradient(model)
            if name in sums:
                sums[name] -= vector
            elif len(chunks) == 1:
                on_gradient(name, -vector)
            else:
                sums[name] = -vector

        for chunk in chunks:
            _chunk_backwards(trainer, inputs, coefficients, chunk, add)
        for name in list(sums):
            on_gradient(name, sums.pop(name))
    finally:
        trainer.reused = None
        model.zero_grad(set_to_none=True)


def _chunk_backwards(
    trainer: Any,
    inputs: Mapping[str, Any],
    coefficients: Mapping[str, Any],
    rows: slice,
    after_backward: Any = None,
) -> None:
    """One forward of `rows`, then each entry's loss on them and its backward. With
    `after_backward`, `.grad` is cleared before each backward and `after_backward(name)` reads
    it after; without, the gradients are left summed in `.grad`."""
    import torch

    model = trainer.model
    chunk = {
        key: (value[rows] if key != "num_items_in_batch" else value)
        for key, value in inputs.items()
    }
    input_ids = torch.cat([chunk["prompt_ids"], chunk["completion_ids"]], dim=1)
    attention_mask = torch.cat([chunk["prompt_mask"], chunk["completion_mask"]], dim=1)
    trainer.reused = None
    logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
        model, input_ids, attention_mask, input_ids.shape[1] - chunk["prompt_ids"].shape[1],
        compute_entropy=True,
    )  # fmt: skip
    mask = chunk["completion_mask"].float()
    trainer.reused = (logps, entropies)
    names = list(coefficients)
    for position, name in enumerate(names):
        coefficient = coefficients[name]
        if after_backward is not None:
            model.zero_grad(set_to_none=True)
        if isinstance(coefficient, tuple):  # a reference: sequence log-probabilities
            a = coefficient[1][rows].to(logps.device)
            loss = -(a.unsqueeze(1) * logps * mask).sum()
        else:
            loss = trainer._compute_loss(model, {**chunk, "advantages": coefficient[rows]})
        loss.backward(retain_graph=position < len(names) - 1)
        if after_backward is not None:
            after_backward(name)
    trainer.reused = None


def reference_coefficients(scored: Any, names: Sequence[str]) -> dict[str, Any]:
    """`batch_gradients`' entries of the per-reward references: ("sequence", a_k) with a_k
    each response's leave-one-out advantage of reward k."""
    centred = leave_one_out(scored.rewards.float().cpu())
    return {f"ref/{name}": ("sequence", centred[:, k]) for k, name in enumerate(names)}


# ----------------------------------------------------------------------------- the passes


def reference_pass(
    trainer: Any,
    record: Mapping[str, Any],
    layout: Mapping[str, Any] | None = None,
    sums: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The batch's own part of each per-reward reference, added into `sums` (in place, each
    gradient as it arrives: no second copy of a 0.5B model's references) and returned:
    {"ref/<reward>": vector}. layout: `batch_gradients`' rows_per_forward and recompute."""
    inputs, scored = batch_inputs(trainer, record)
    sums = {} if sums is None else sums

    def add(name: str, vector: Any) -> None:
        if name in sums:
            sums[name].add_(vector)
        else:
            sums[name] = vector

    batch_gradients(
        trainer,
        inputs,
        reference_coefficients(scored, record["reward_names"]),
        add,
        **(layout or {}),
    )
    return sums


def measure_batch(
    trainer: Any,
    record: Mapping[str, Any],
    batch: int,
    totals: Mapping[str, Any],
    store_dtype: str = "float32",
    layout: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Every direction of one mini-batch against its leave-batch-out references.

    totals: {"ref/<reward>": the sum of every mini-batch's part} (`reference_pass`).
    store_dtype: the references and gdpo's gradient are held in it while the other gradients
    stream past ("bfloat16" halves them: the 0.5B model's references; every dot product is
    still taken in float64 against the float32 gradient).
    Returns the dot products the report needs: the references' Gram matrix, and per measured
    direction its dots with each reference, its squared norm and its dot with gdpo's.
    """
    inputs, scored = batch_inputs(trainer, record)
    names = [f"ref/{name}" for name in record["reward_names"]]
    coefficients = reference_coefficients(scored, record["reward_names"])
    started = time.perf_counter()
    estimated = estimator_advantages(trainer, inputs, scored, batch)
    advantage_seconds = time.perf_counter() - started
    coefficients.update(estimated)
    import torch

    dtype = getattr(torch, store_dtype)
    references: dict[str, Any] = {}
    kept: dict[str, Any] = {}
    directions: dict[str, dict[str, Any]] = {}

    def take(name: str, vector: Any) -> None:
        if name in names:  # the other mini-batches' part: the total minus this one's
            references[name] = difference(totals[name], vector, dtype)
            return
        entry = {
            "ref_dots": [dot(vector, references[r]) for r in names],
            "norm2": dot(vector, vector),
        }
        if "gdpo" in kept:
            entry["dot_gdpo"] = dot(vector, kept["gdpo"])
        if name == "gdpo":
            kept["gdpo"] = vector.to(dtype)
            entry["dot_gdpo"] = entry["norm2"]
        directions[name] = entry

    started = time.perf_counter()
    batch_gradients(trainer, inputs, coefficients, take, **(layout or {}))
    gram = [[dot(references[a], references[b]) for b in names] for a in names]
    return {
        "batch": batch,
        "reward_names": record["reward_names"],
        "rewards_mean": np.nanmean(np.array(record["rewards"], dtype=float), axis=0).tolist(),
        "varying_pairs_share": _varying_share(scored.rewards),
        "ref_gram": gram,
        "directions": directions,
        "seconds": {"advantages": advantage_seconds, "gradients": time.perf_counter() - started},
    }


def _varying_share(rewards: Any) -> float:
    """The share of (row, reward) pairs whose reward varies within the row's group."""
    import torch

    grouped = torch.nan_to_num(rewards).view(-1, GROUP_SIZE, rewards.shape[1])
    varying = (grouped.max(dim=1).values > grouped.min(dim=1).values).float()
    return float(varying.mean())


# ----------------------------------------------------------------------------- the run


@dataclass
class Lane:
    """One process's share of a sample: the mini-batches b with b % lanes == lane."""

    results: Path
    state_name: str
    sample: str
    batches: int
    lane: int = 0
    lanes: int = 1
    device: str = "cpu"
    store_dtype: str = "float32"
    rows_per_forward: int | None = None  # `batch_gradients`' chunks (default: the whole batch)
    recompute: bool = False
    # TRL's bf16 mixed precision: the loss forward and the replay under bfloat16 autocast, the
    # weights and gradients float32 (what a user training in bf16 gets; faster on CPU)
    bf16: bool = False
    model_path: str | None = None  # tests: a saved tiny model instead of the state's policy
    task_data: str | None = None
    waited: float = field(default=0.0)

    @property
    def folder(self) -> Path:
        return sample_dir(self.results, self.state_name, self.sample)

    @property
    def layout(self) -> dict[str, Any]:
        return {"rows_per_forward": self.rows_per_forward, "recompute": self.recompute}

    @property
    def precision(self) -> dict[str, Any]:
        return {"store_dtype": self.store_dtype, "bf16_autocast": self.bf16}

    def mine(self) -> list[int]:
        return [b for b in range(self.batches) if b % self.lanes == self.lane]


def policy_path(lane: Lane, state: State) -> str:
    """The state's policy: a test's model, the embedded model, or the powered study's cold
    start (built once into this state's folder, by the study's own recipe)."""
    if lane.model_path is not None:
        return lane.model_path
    if state.model != "cold_start":
        return state.model
    args = argparse.Namespace(
        results=state_dir(lane.results, lane.state_name),
        cold_start=None,
        model_name_or_path=None,
        sft_max_steps=3,
        device="cpu" if lane.device == "cpu" else lane.device,
    )
    folder = convergence.cold_start_dir(args)
    with convergence.run_lock(folder.parent, wait=True):
        return str(convergence.build_cold_start(args))


def load_state(lane: Lane) -> tuple[Any, Any, Any, Any, State]:
    """(trainer, dataset, task, tokenizer, state) of a lane."""
    import torch

    from mrtpo import tasks
    from mrtpo.models import load_model

    state = STATES[lane.state_name]
    task = tasks.get(state.task)
    data = lane.task_data or state.data
    dataset = task.load("train", path=data)
    model, tokenizer = load_model(policy_path(lane, state), dtype=torch.float32)
    trainer = build_trainer(
        model,
        tokenizer,
        task,
        dataset,
        state,
        lane.folder / CHECKPOINTS / "trainer",
        lane.device,
        bf16=lane.bf16,
    )
    return trainer, dataset, task, tokenizer, state


def sample_path(lane: Lane, batch: int) -> Path:
    return lane.folder / "samples" / f"batch{batch:03d}.json"


def measure_path(lane: Lane, batch: int) -> Path:
    return lane.folder / "measures" / f"batch{batch:03d}.json"


def reference_path(lane: Lane, lane_index: int) -> Path:
    return lane.folder / CHECKPOINTS / f"reference-lane{lane_index}.pt"


def run_lane(lane: Lane, poll_seconds: float = 20.0) -> None:
    """Sample, reference pass, then (once every lane's reference pass is in) measure pass, each
    resuming where it stopped."""
    import torch

    trainer, dataset, _, _, state = load_state(lane)
    limit = max_batches(len(dataset), lane.sample)
    if lane.batches > limit:
        raise SystemExit(f"{lane.sample}: at most {limit} mini-batches of these prompts")
    record = _read_json(lane.folder / RUN_FILE) or {"lanes": {}}
    info = record["lanes"].setdefault(str(lane.lane), {"sessions": [], "cpu_seconds": {}})
    policy = {}
    if state.model == "cold_start" and lane.model_path is None:  # rebuilt per machine: which one
        policy["cold_start_sha256"] = convergence.weights_digest(Path(policy_path(lane, state)))
    code = engine()
    info["sessions"].append({**_machine(lane), **code, **lane.precision, **lane.layout, **policy})
    settings = reference_settings(lane, code["commit"], policy.get("cold_start_sha256"))
    info["batches"] = lane.batches
    _write_json(lane.folder / RUN_FILE, record)

    def spend(stage: str, started: float) -> None:
        info["cpu_seconds"][stage] = (
            info["cpu_seconds"].get(stage, 0.0) + time.process_time() - started
        )
        info["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        fresh = _read_json(lane.folder / RUN_FILE) or {"lanes": {}}
        fresh["lanes"][str(lane.lane)] = info
        _write_json(lane.folder / RUN_FILE, fresh)

    seed_base = {"pilot": 1_000, "main": 2_000}[lane.sample] + 100_000 * state.seed
    for batch in lane.mine():
        if sample_path(lane, batch).is_file():
            continue
        started = time.process_time()
        rows = [dataset[i] for i in batch_rows(len(dataset), state.seed, lane.sample, batch)]
        _write_json(sample_path(lane, batch), sample_batch(trainer, rows, seed_base + batch))
        spend("sample", started)

    path = reference_path(lane, lane.lane)
    partial = {"batches": [], "sums": {}, "settings": settings, "samples": {}}
    if path.is_file():
        partial = torch.load(path)
        check_part(partial, path, lane, settings)
    for batch in lane.mine():
        if batch in partial["batches"]:
            continue
        started = time.process_time()
        reference_pass(trainer, _read_json(sample_path(lane, batch)), lane.layout, partial["sums"])
        partial["batches"].append(batch)
        partial["samples"][batch] = file_digest(sample_path(lane, batch))
        torch.save(partial, path.with_name(path.name + ".tmp"))
        os.replace(path.with_name(path.name + ".tmp"), path)
        spend("reference", started)

    del partial  # this lane's sums: 7.6 GB for the 0.5B model, not needed beside the totals
    totals = wait_for_totals(lane, poll_seconds, settings)
    for batch in lane.mine():
        if measure_path(lane, batch).is_file():
            continue
        started = time.process_time()
        measured = measure_batch(
            trainer,
            _read_json(sample_path(lane, batch)),
            batch,
            totals,
            lane.store_dtype,
            lane.layout,
        )
        _write_json(measure_path(lane, batch), measured)
        spend("measure", started)


def wait_for_totals(lane: Lane, poll_seconds: float, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The sum over all lanes' reference parts, once every mini-batch is in one: summed once
    into `reference-total.pt` (each lane writes the same sum, atomically) and memory-mapped,
    so the lanes share its pages instead of each holding a copy. Every part is checked against
    this run's `settings` (`check_part`); the total is reused only if it was summed from these
    parts (their settings and samples), else summed again."""
    import torch

    total_path = lane.folder / CHECKPOINTS / "reference-total.pt"
    while True:
        partials = [reference_path(lane, i) for i in range(lane.lanes)]
        if all(p.is_file() for p in partials):
            loaded = [torch.load(p, mmap=True) for p in partials]
            for path, part in zip(partials, loaded, strict=True):
                check_part(part, path, lane, settings)
            done = sorted(b for part in loaded for b in part["batches"])
            if done == list(range(lane.batches)):
                if len(loaded) == 1:
                    return loaded[0]["sums"]
                made_of = {"settings": dict(settings), "samples": {}}
                for part in loaded:
                    made_of["samples"].update(part["samples"])
                total = torch.load(total_path, mmap=True) if total_path.is_file() else {}
                if {k: total.get(k) for k in made_of} != made_of:  # absent, or of other parts
                    totals: dict[str, Any] = {}
                    for part in loaded:
                        for name, vector in part["sums"].items():
                            totals[name] = totals.get(name, 0) + vector
                    temporary = total_path.with_name(f"{total_path.name}.{lane.lane}.tmp")
                    torch.save({**made_of, "sums": totals}, temporary)
                    del totals
                    os.replace(temporary, total_path)
                del loaded, total
                return torch.load(total_path, mmap=True)["sums"]
        time.sleep(poll_seconds)
        lane.waited += poll_seconds


# ----------------------------------------------------------------------------- resuming

# The settings a sample's passes must share, kept in each reference part (and the total): the
# code, the policy, and the flags that make the computation (precision, storage of the
# references in the measure pass, layout, lanes). A resume with another value is refused. The
# threads and the machine are not among them: they change only the rounding, and a lane may
# resume on another machine. The sample files are checked by their digests, per mini-batch.
FLAGS = {"bf16": "--bf16", "store_dtype": "--store_dtype", "lanes": "--lanes",
         "rows_per_forward": "--rows_per_forward", "recompute": "--recompute"}  # fmt: skip


def reference_settings(lane: Lane, commit: str | None, cold_start: str | None) -> dict[str, Any]:
    policy = cold_start or lane.model_path or STATES[lane.state_name].model
    flags = {name: getattr(lane, name) for name in FLAGS}
    return {"commit": commit, "code_sha256": code_digest(), "policy": policy, **flags}


def code_digest() -> str:
    """sha256 of this script and the mrtpo package's sources: the code, committed or not."""
    import hashlib

    import mrtpo

    package = Path(mrtpo.__file__).resolve().parent
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check_part(
    part: Mapping[str, Any], path: Path, lane: Lane, settings: Mapping[str, Any]
) -> None:
    """Refuse a reference part made with other settings than `settings`, or from another
    sample file than the one now in the folder, naming the setting and how to go on."""
    checkpoints = lane.folder / CHECKPOINTS
    redo = f"or delete {checkpoints} to redo the reference pass"
    stored = part.get("settings")
    if stored is None:
        raise SystemExit(f"{path} was written before the settings were kept with it: {redo[3:]}")
    for name, new in settings.items():
        old = stored.get(name)
        if old == new:
            continue
        if name in FLAGS:
            flag = FLAGS[name]
            same = f"pass {flag}" if old is True else f"pass {flag} {old}"
            how = f"leave out {flag}" if old in (False, None) else same
            how += " as the reference pass did"
        elif name == "commit":
            how = f"run from a checkout of {old} (git worktree add --detach DIR {old})"
        elif name == "code_sha256":
            how = "run with the code as it was (src/mrtpo or this script changed, uncommitted)"
        else:
            how = f"run with the policy the reference pass used ({old})"
        raise SystemExit(
            f"{path}: made with {name} = {old!r}, this run has {name} = {new!r}: to resume, "
            f"{how}; {redo} with {name} = {new!r}"
        )
    for batch in part["batches"]:
        sample = sample_path(lane, batch)
        now = file_digest(sample) if sample.is_file() else "missing"
        if part["samples"].get(batch) != now:
            raise SystemExit(
                f"{path}: mini-batch {batch}'s sample {sample} is not the one its reference part "
                f"was made from (sha256 {part['samples'].get(batch)}, now {now}): restore that "
                f"file, {redo}"
            )


def engine() -> dict[str, Any]:
    """The commit of the code measuring (this script's checkout), and whether its src/ or this
    script differed from it: a measurement runs on one engine."""
    import subprocess

    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "../src", Path(__file__).name],
            cwd=here, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "uncommitted_changes": None}
    return {"commit": commit, "uncommitted_changes": bool(changed)}


def _machine(lane: Lane) -> dict[str, Any]:
    import torch

    return convergence.machine(
        argparse.Namespace(threads=torch.get_num_threads(), device=lane.device)
    )


# ----------------------------------------------------------------------------- the analysis


def load_measures(results: Path) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """{state: {sample: [measures of its mini-batches, by index]}} from the results files.
    Each record gets `sample_batches`, the sample's planned size (the pilot's fixed size, the
    main sample's from the power calculation): its reference averages over the other
    mini-batches of all of them, whether or not they are measured yet."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for state in STATES:
        power = _read_json(state_dir(results, state) / POWER_FILE)
        for sample in SAMPLES:
            folder = sample_dir(results, state, sample) / "measures"
            records = [_read_json(path) for path in sorted(folder.glob("batch*.json"))]
            planned = PILOT_BATCHES if sample == "pilot" else (power or {}).get("batches")
            for record in records:
                record["sample_batches"] = max(planned or 0, len(records))
            if records:
                out.setdefault(state, {})[sample] = records
    return out


def direction(record: Mapping[str, Any], estimator: str) -> dict[str, float]:
    """An estimator's dots on one mini-batch: ref_dots [K], norm2, diff2 (its squared distance
    from gdpo's gradient). At beta < 1 a token-level variant is the blend
    (1 - beta) g_gdpo + beta g_variant(1), whose dots are bilinear in the measured ones."""
    variant, beta = ESTIMATORS[estimator]
    measured = record["directions"]
    gdpo = measured["gdpo"]
    if beta is None:
        one = measured[variant]
        cross = one.get("dot_gdpo", one["norm2"] if variant == "gdpo" else float("nan"))
        return {
            "ref_dots": list(one["ref_dots"]),
            "norm2": one["norm2"],
            "diff2": one["norm2"] - 2 * cross + gdpo["norm2"] if variant != "gdpo" else 0.0,
        }
    one = measured[variant]
    cross = one["dot_gdpo"]
    dots = [
        (1 - beta) * a + beta * b for a, b in zip(gdpo["ref_dots"], one["ref_dots"], strict=True)
    ]
    norm2 = (1 - beta) ** 2 * gdpo["norm2"] + 2 * beta * (1 - beta) * cross + beta**2 * one["norm2"]
    diff2 = beta**2 * (one["norm2"] - 2 * cross + gdpo["norm2"])
    return {"ref_dots": dots, "norm2": norm2, "diff2": diff2}


def batch_measures(
    record: Mapping[str, Any], estimator: str, batches: int, weights: Sequence[float] | None = None
) -> dict[str, Any]:
    """One estimator on one mini-batch: cosine with the summed-reward reference and with each
    reward's, the gradient norm, the first-order gain of the clipped step and the norm of the
    difference from gdpo's gradient. `batches`: the sample's number of mini-batches (the
    reference averages over the other ones' prompts)."""
    values = direction(record, estimator)
    gram = np.asarray(record["ref_gram"], dtype=float)
    c = np.ones(len(gram)) if weights is None else np.asarray(weights, dtype=float)
    dots = np.asarray(values["ref_dots"], dtype=float)
    norm = math.sqrt(max(values["norm2"], 0.0))
    summed_dot, summed_norm = float(c @ dots), math.sqrt(max(float(c @ gram @ c), 0.0))
    per_prompt = (batches - 1) * PROMPTS_PER_BATCH * GROUP_SIZE  # the reference's 1 / (P G)
    if per_prompt <= 0:
        raise ValueError(
            f"batches must be at least 2 (the reference is the others'), got {batches}"
        )
    return {
        "cosine": _safe_ratio(summed_dot, norm * summed_norm),
        "reward_cosines": [
            _safe_ratio(float(dots[k]), norm * math.sqrt(max(gram[k, k], 0.0)))
            for k in range(len(dots))
        ],
        "norm": norm,
        "gain": summed_dot / per_prompt / max(MAX_GRAD_NORM, norm),
        "diff_norm": math.sqrt(max(values["diff2"], 0.0)),
    }


def _safe_ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else float("nan")


def per_estimator(
    records: Sequence[Mapping[str, Any]], batches: int | None = None
) -> dict[str, dict[str, list[float]]]:
    """{estimator: {measure: [value per mini-batch]}} (reward_cosines: one list per reward).
    batches: the sample's size; by default each record's `sample_batches` (set by
    `load_measures`), else the number of records."""
    out: dict[str, dict[str, Any]] = {}
    for estimator in ESTIMATORS:
        rows = [
            batch_measures(r, estimator, batches or r.get("sample_batches", len(records)))
            for r in records
        ]
        out[estimator] = {
            key: [row[key] for row in rows] for key in ("cosine", "norm", "gain", "diff_norm")
        }
        out[estimator]["reward_cosines"] = [
            list(v) for v in zip(*(r["reward_cosines"] for r in rows), strict=True)
        ]
    return out


def contrast_tests(
    values: Mapping[str, Mapping[str, Sequence[float]]], contrasts: Sequence[tuple[str, str]]
) -> list[dict[str, Any]]:
    """Paired t-test of the cosine differences over mini-batches, per contrast."""
    tests = []
    for first, second in contrasts:
        differences = np.subtract(values[first]["cosine"], values[second]["cosine"])
        test = convergence.paired_t(list(differences)) if len(differences) > 1 else None
        tests.append({"contrast": (first, second), "test": test})
    return tests


def primary_tests(measures: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The 6 pre-registered tests (3 per state, on the main sample), Holm over those present."""
    tests = []
    for state in STATES:
        records = measures.get(state, {}).get("main")
        if not records:
            continue
        for test in contrast_tests(per_estimator(records), PRIMARY_CONTRASTS):
            tests.append({"state": state, **test})
    adjusted = convergence_powered.holm(
        {i: t["test"]["p"] for i, t in enumerate(tests) if t["test"] is not None}
    )
    for i, test in enumerate(tests):
        test["holm_p"] = adjusted.get(i)
        test["significant"] = test["holm_p"] is not None and test["holm_p"] <= ALPHA
    return tests


def paired_power(effect: float, sd: float, n: int, alpha: float) -> float:
    """Power of the two-sided paired t-test of n differences with mean `effect` and SD `sd`."""
    from scipy import stats

    if n < 2 or sd <= 0:
        return float("nan")
    degrees = n - 1
    critical = stats.t.ppf(1 - alpha / 2, degrees)
    shift = effect / sd * math.sqrt(n)
    return float(stats.nct.sf(critical, degrees, shift) + stats.nct.cdf(-critical, degrees, shift))


def power_calculation(pilot: Sequence[Mapping[str, Any]], cap: int) -> dict[str, Any]:
    """From the pilot's mini-batches: the mini-batches for power POWER to detect EFFECT_SHARE of
    gdpo's mean cosine in mrtpo(0.5) - gdpo at ALPHA / 6 (Holm's first step); at most `cap`."""
    values = per_estimator(pilot)
    gdpo_mean = float(np.mean(values["gdpo"]["cosine"]))
    differences = np.subtract(values["mrtpo(0.5)"]["cosine"], values["gdpo"]["cosine"])
    sd = float(np.std(differences, ddof=1))
    effect = EFFECT_SHARE * abs(gdpo_mean)
    alpha = ALPHA / 6
    needed = next(
        (n for n in range(2, 10_001) if paired_power(effect, sd, n, alpha) >= POWER), None
    )
    chosen = min(needed or cap, cap)
    return {
        "pilot_batches": len(pilot),
        "gdpo_mean_cosine": gdpo_mean,
        "effect": effect,
        "difference_mean": float(differences.mean()),
        "difference_sd": sd,
        "alpha": alpha,
        "needed_batches": needed,
        "cap": cap,
        "batches": max(chosen, 2),
        "power_at_batches": paired_power(effect, sd, max(chosen, 2), alpha),
        "contrast_sds": {
            f"{a} - {b}": float(
                np.std(np.subtract(values[a]["cosine"], values[b]["cosine"]), ddof=1)
            )
            for a, b in (*PRIMARY_CONTRASTS, *SECONDARY_CONTRASTS)
        },
    }


def precision_comparison(
    reference: Sequence[Mapping[str, Any]], other: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The same mini-batches measured twice (e.g. float32 and `--bf16`): per estimator the mean
    cosine of each, the largest per-mini-batch change of the cosine, and per contrast (primary
    and secondary) the mean difference of each with the change of its mean. Only the
    mini-batches measured both ways count (a partial second measurement compares on its own)."""
    common = sorted({r["batch"] for r in reference} & {r["batch"] for r in other})
    if not common:
        raise ValueError("precision_comparison: the two measurements share no mini-batch")
    batches = len({r["batch"] for r in reference})  # the sample's size sets each reference's scale
    first = per_estimator([r for r in reference if r["batch"] in common], batches)
    second = per_estimator([r for r in other if r["batch"] in common], batches)
    estimators = {
        name: {
            "mean_cosine": [
                float(np.mean(first[name]["cosine"])),
                float(np.mean(second[name]["cosine"])),
            ],
            "max_abs_change": float(
                np.max(np.abs(np.subtract(first[name]["cosine"], second[name]["cosine"])))
            ),
            "mean_norm": [
                float(np.mean(first[name]["norm"])),
                float(np.mean(second[name]["norm"])),
            ],
        }
        for name in ESTIMATORS
    }
    contrasts = {}
    for a, b in (*PRIMARY_CONTRASTS, *SECONDARY_CONTRASTS):
        means = [
            float(np.mean(np.subtract(values[a]["cosine"], values[b]["cosine"])))
            for values in (first, second)
        ]
        contrasts[f"{a} - {b}"] = {"mean_difference": means, "change": means[1] - means[0]}
    return {"batches": common, "estimators": estimators, "contrasts": contrasts}


# ----------------------------------------------------------------------------- the report


def _interval(values: Sequence[float]) -> str:
    """mean [95% t interval] of per-mini-batch values."""
    values = [v for v in values if not math.isnan(v)]
    if len(values) < 2:
        return f"{values[0]:+.4f}" if values else "–"
    test = convergence.paired_t(values)
    return f"{test['mean']:+.4f} [{test['low']:+.4f}, {test['high']:+.4f}]"


def _p(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2g}" if value >= 1e-4 else f"{value:.1e}"


def estimator_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Per estimator: the cosine with the summed-reward reference and with each reward's (mean
    and 95% t interval over mini-batches), the gradient norm, the gain of the clipped step and
    the distance from gdpo's gradient (means)."""
    values = per_estimator(records)
    names = records[0]["reward_names"]
    header = ["estimator", "cosine, summed reward", *[f"cosine, {n}" for n in names]]
    header += ["gradient norm", "gain of the clipped step", "distance from gdpo"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for estimator, measured in values.items():
        cells = [estimator, _interval(measured["cosine"])]
        cells += [_interval(column) for column in measured["reward_cosines"]]
        cells += [
            f"{np.mean(measured['norm']):.3f}",
            f"{np.mean(measured['gain']):.3g}",
            f"{np.mean(measured['diff_norm']):.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def contrast_table(tests: Sequence[Mapping[str, Any]], corrected: bool) -> str:
    header = ["state", "contrast", "mean difference [95% t interval]", "p"]
    header += ["Holm p", "significant"] if corrected else []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for test in tests:
        t = test["test"]
        first, second = test["contrast"]
        cells = [test.get("state", ""), f"{first} - {second}"]
        if t is None:
            cells += ["–", "–"]
        else:
            cells += [
                f"{t['mean']:+.4f} [{t['low']:+.4f}, {t['high']:+.4f}] (n = {t['n']})",
                _p(t["p"]),
            ]
        if corrected:
            cells += [_p(test["holm_p"]), "yes" if test["significant"] else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def state_reading(tests: Sequence[Mapping[str, Any]], values: Mapping[str, Any]) -> str:
    """The pre-registered reading of one state's three primary tests (see ANALYSIS)."""
    by_control = {t["contrast"][1]: t for t in tests}
    if any(t["test"] is None for t in tests):
        return "no reading yet: fewer than 2 mini-batches of the main sample measured"

    def direction(control: str) -> int:
        test = by_control.get(control)
        if test is None or not test["significant"]:
            return 0
        return 1 if test["test"]["mean"] > 0 else -1

    gdpo, placebo, shuffled = (
        direction("gdpo"),
        direction("placebo(0.5)"),
        direction("shuffled(0.5)"),
    )
    dose = ", ".join(
        f"{name} {np.mean(values[name]['cosine']):+.4f}"
        for name in ("gdpo", "mrtpo(0.25)", "mrtpo(0.5)", "mrtpo(1)")
    )
    if gdpo > 0 and placebo > 0 and shuffled > 0:
        text = "the verifier's own information makes the step point further uphill"
    elif gdpo > 0 and placebo <= 0:
        text = "any added context helps the step: the information is not what matters"
    elif gdpo > 0 and placebo > 0 and shuffled <= 0:
        text = "the weights' spread helps the step, not where they fall"
    elif gdpo < 0:
        text = (
            "the reallocation displaces the uniform signal: mrtpo(0.5) points less uphill than "
            f"gdpo (dose-response, mean cosines: {dose})"
        )
    elif gdpo == 0 and placebo == 0 and shuffled == 0:
        test = by_control["gdpo"]["test"]
        text = (
            "no effect on the step's direction detected at this scale; mrtpo(0.5) - gdpo lies in "
            f"[{test['low']:+.4f}, {test['high']:+.4f}] (mean cosines: {dose})"
        )
    else:
        parts = [
            f"{c}: {'above' if d > 0 else 'below' if d < 0 else 'no difference'}"
            for c, d in (("gdpo", gdpo), ("placebo(0.5)", placebo), ("shuffled(0.5)", shuffled))
        ]
        text = "a pattern not named in advance: mrtpo(0.5) against " + "; ".join(parts)
    entropy = contrast_tests(values, [("mrtpo(0.5)", "entropy(0.5)")])[0]["test"]
    if entropy is not None:
        matches = entropy["low"] <= 0 <= entropy["high"]
        text += (
            f". Secondary: mrtpo(0.5) - entropy(0.5) {entropy['mean']:+.4f} "
            f"[{entropy['low']:+.4f}, {entropy['high']:+.4f}]"
            + (" (the entropy control matches mrtpo within the interval)" if matches else "")
        )
    return text


def plot_cosines(measures: Mapping[str, Any], path: Path) -> bool:
    """Mean cosine with the summed-reward reference and its 95% t interval, per estimator
    and state (the main sample; the pilot where no main sample exists, labelled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (state, sample, samples[sample])
        for state, samples in measures.items()
        for sample in ("main", "pilot")
        if sample in samples and (sample == "main" or "main" not in samples)
    ]
    if not panels:
        return False
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for axis, (state, sample, records) in zip(axes[0], panels, strict=True):
        values = per_estimator(records)
        names = list(values)
        means, lows, highs = [], [], []
        for name in names:
            test = convergence.paired_t(values[name]["cosine"]) if len(records) > 1 else None
            mean = float(np.mean(values[name]["cosine"]))
            means.append(mean)
            lows.append(mean - (test["low"] if test else mean))
            highs.append((test["high"] if test else mean) - mean)
        colours = ["tab:gray" if ESTIMATORS[n][1] is None else "tab:blue" for n in names]
        axis.bar(range(len(names)), means, color=colours, yerr=[lows, highs], capsize=3)
        axis.axhline(0, color="black", linewidth=0.6)
        axis.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
        axis.set_ylabel("cosine with the policy gradient (summed reward)")
        axis.set_title(f"{state} ({sample}, {len(records)} mini-batches)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def cost_table(results: Path) -> str:
    lines = ["| state | sample | lane | CPU s: sample / reference / measure | peak RSS GB | CPU |"]
    lines.append("|---|---|---|---|---|---|")
    for state in STATES:
        for sample in SAMPLES:
            record = _read_json(sample_dir(results, state, sample) / RUN_FILE)
            for lane, info in sorted((record or {}).get("lanes", {}).items()):
                seconds = " / ".join(
                    f"{info['cpu_seconds'].get(stage, 0):.0f}"
                    for stage in ("sample", "reference", "measure")
                )
                cpus = sorted({session["cpu"] for session in info["sessions"]})
                rss = info.get("peak_rss_mb", 0) / 1024
                lines.append(
                    f"| {state} | {sample} | {lane} | {seconds} | {rss:.1f} | {', '.join(cpus)} |"
                )
    return "\n".join(lines)


def write_report(results: Path = RESULTS) -> Path:
    """README.md and cosines.png of the results folder, from the results files alone."""
    results = Path(results)
    measures = load_measures(results)
    stored = _read_json(results / PLAN_FILE) or plan()
    lines = [
        "# Does each step point uphill? (update quality)",
        "",
        "Generated by `python benchmarks/update_quality.py --report` from the files in this "
        "folder; the design and the measures are described in that script's docstring.",
        "",
        "## Analysis plan (pre-registered)",
        "",
        stored["analysis"],
    ]
    for state in STATES:
        power = _read_json(state_dir(results, state) / POWER_FILE)
        samples = measures.get(state, {})
        if not samples and power is None:
            continue
        lines += [f"## {state}", ""]
        if power is not None:
            lines += [
                f"**Pilot and power** ({power['pilot_batches']} mini-batches of other prompts): "
                f"gdpo's mean cosine {power['gdpo_mean_cosine']:+.4f}; mrtpo(0.5) - gdpo mean "
                f"{power['difference_mean']:+.4f}, SD {power['difference_sd']:.4f}; effect to "
                f"detect {power['effect']:.4f} ({EFFECT_SHARE:.0%} of gdpo's cosine) at alpha "
                f"{power['alpha']:.4f}: {power['needed_batches']} mini-batches needed, budget cap "
                f"{power['cap']}, measured {power['batches']} (power "
                f"{power['power_at_batches']:.2f}).",
                "",
            ]
        for sample in ("pilot", "main"):
            records = samples.get(sample)
            if not records:
                continue
            planned = records[0]["sample_batches"]
            status = "" if len(records) >= planned else f" (interim: {len(records)} of {planned})"
            lines += [f"### {sample}: {len(records)} mini-batches{status}", ""]
            lines += [estimator_table(records), ""]
            if sample == "main":
                values = per_estimator(records)
                lines += ["Secondary contrasts (uncorrected):", ""]
                tests = [{"state": state, **t} for t in contrast_tests(values, SECONDARY_CONTRASTS)]
                lines += [contrast_table(tests, corrected=False), ""]
    tests = primary_tests(measures)
    if tests:
        lines += [
            "## Primary tests (Holm over the tests present)",
            "",
            contrast_table(tests, True),
            "",
        ]
        lines += ["## Reading", ""]
        for state in STATES:
            own = [t for t in tests if t["state"] == state]
            if own:
                values = per_estimator(measures[state]["main"])
                lines.append(f"- **{state}**: {state_reading(own, values)}.")
        lines.append("")
    if plot_cosines(measures, results / "cosines.png"):
        lines += ["![cosines](cosines.png)", ""]
    if measures:
        lines += exploratory_section(results, measures)
    lines += ["## Cost", "", cost_table(results), ""]
    path = results / "README.md"
    path.write_text("\n".join(lines))
    return path


# ----------------------------------------------------------------------------- exploratory

# Not in the plan: what the results page reads beyond the pre-registered tests, from the
# committed samples (token ids, rewards) and measures, so that every number it quotes is printed.
EXPLORATORY_CONTRASTS = (("shuffled(0.5)", "gdpo"), ("mrtpo(1)", "mrtpo(0.5)"))


def load_samples(results: Path, state: str, sample: str) -> dict[int, dict[str, Any]]:
    folder = sample_dir(results, state, sample) / "samples"
    return {int(p.stem[len("batch") :]): _read_json(p) for p in sorted(folder.glob("batch*.json"))}


def _capped(record: Mapping[str, Any], state: str) -> list[bool]:
    """Per response: whether it stopped at the state's completion cap (no end token before)."""
    cap = STATES[state].max_completion_length
    return [len(ids) >= cap for ids in record["completion_ids"]]


def _count(k: int, n: int) -> str:
    return f"{k} of {n} ({k / n:.1%})" if n else "–"


def sample_tables(results: Path) -> list[str]:
    """The responses at the completion cap, the prompts' length, and per reward its mean and
    how many responses earn it (score > 0) among those at the cap and those that finish."""
    lengths = [
        "| state | sample | responses | at the cap | mean prompt tokens |",
        "|---|---|---|---|---|",
    ]
    rewards = ["| state | sample | reward | mean | earned at the cap | earned, finished |"]
    rewards.append("|---|---|---|---|---|---|")
    for state in STATES:
        for sample in SAMPLES:
            records = list(load_samples(results, state, sample).values())
            if not records:
                continue
            capped = np.array([c for r in records for c in _capped(r, state)])
            scores = np.array([row for r in records for row in r["rewards"]], dtype=float)
            prompts = np.mean([len(ids) for r in records for ids in r["prompt_ids"]])
            cap = (
                f"{_count(int(capped.sum()), len(capped))} at {STATES[state].max_completion_length}"
            )
            lengths.append(f"| {state} | {sample} | {len(capped)} | {cap} | {prompts:.0f} |")
            for k, name in enumerate(records[0]["reward_names"]):
                earned = np.nan_to_num(scores[:, k]) > 0
                at_cap, finished = earned[capped], earned[~capped]
                rewards.append(
                    f"| {state} | {sample} | {name} | {np.nanmean(scores[:, k]):.2f} | "
                    f"{_count(int(at_cap.sum()), len(at_cap))} | "
                    f"{_count(int(finished.sum()), len(finished))} |"
                )
    return ["\n".join(lengths), "", "\n".join(rewards)]


def per_batch_table(measures: Mapping[str, Any]) -> str:
    """Each primary contrast's cosine difference on each mini-batch, in order."""
    lines = [
        "| state | sample | contrast | per mini-batch | range | above 0 |",
        "|---|" * 1 + "---|" * 5,
    ]
    for state, samples in measures.items():
        for sample in SAMPLES:
            if sample not in samples:
                continue
            values = per_estimator(samples[sample])
            for first, second in PRIMARY_CONTRASTS:
                d = np.subtract(values[first]["cosine"], values[second]["cosine"])
                cells = [state, sample, f"{first} - {second}", " ".join(f"{x:+.3f}" for x in d)]
                cells += [f"{d.min():+.3f} to {d.max():+.3f}", f"{int((d > 0).sum())} of {len(d)}"]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def relative_table(measures: Mapping[str, Any]) -> str:
    """Per estimator, its mean gain of the clipped step and mean gradient norm against gdpo's."""
    lines = ["| state | sample | against gdpo's | " + " | ".join(ESTIMATORS) + " |"]
    lines.append("|---|---|---|" + "---:|" * len(ESTIMATORS))
    for state, samples in measures.items():
        for sample in SAMPLES:
            if sample not in samples:
                continue
            values = per_estimator(samples[sample])
            for measure, label, form in (("gain", "gain", "{:+.0%}"), ("norm", "norm", "{:.2f}x")):
                base = np.mean(values["gdpo"][measure])
                shift = -1 if measure == "gain" else 0
                cells = [form.format(np.mean(v[measure]) / base + shift) for v in values.values()]
                lines.append(f"| {state} | {sample} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def capped_correlation(results: Path, measures: Mapping[str, Any]) -> str:
    """Pearson r, over every measured mini-batch (pilot and main), between the share of its
    responses at the cap and mrtpo(0.5) - gdpo."""
    lines = ["| state | mini-batches (pilot and main) | Pearson r |", "|---|---|---|"]
    for state, samples in measures.items():
        shares, differences = [], []
        for sample in SAMPLES:
            records = samples.get(sample, [])
            sampled = load_samples(results, state, sample)
            values = per_estimator(records) if records else {}
            for i, record in enumerate(records):
                if record["batch"] in sampled:
                    shares.append(float(np.mean(_capped(sampled[record["batch"]], state))))
                    differences.append(
                        values["mrtpo(0.5)"]["cosine"][i] - values["gdpo"]["cosine"][i]
                    )
        if len(shares) > 2 and np.std(shares) > 0 and np.std(differences) > 0:
            r = float(np.corrcoef(shares, differences)[0, 1])
            lines.append(f"| {state} | {len(shares)} | {r:+.2f} |")
    return "\n".join(lines)


def exploratory_section(results: Path, measures: Mapping[str, Any]) -> list[str]:
    lines = ["## Exploratory (not in the plan)", ""]
    lines += ["Responses that stop at the completion cap, and who earns each reward:", ""]
    lines += [*sample_tables(results), ""]
    lines += ["Share at the cap against mrtpo(0.5) - gdpo, per mini-batch:", ""]
    lines += [capped_correlation(results, measures), ""]
    lines += ["The primary contrasts on each mini-batch (cosine differences):", ""]
    lines += [per_batch_table(measures), ""]
    lines += ["Mean gain of the clipped step and mean gradient norm against gdpo's:", ""]
    lines += [relative_table(measures), ""]
    tests = [
        {"state": state, **test}
        for state, samples in measures.items()
        if "main" in samples
        for test in contrast_tests(per_estimator(samples["main"]), EXPLORATORY_CONTRASTS)
    ]
    lines += ["Further contrasts on the main sample (uncorrected):", ""]
    return [*lines, contrast_table(tests, corrected=False), ""]


# ----------------------------------------------------------------------------- command line


def main_batches(results: Path, state: str) -> int:
    """The main sample's size: the pilot's power calculation (`--power`) decides it."""
    power = _read_json(state_dir(results, state) / POWER_FILE)
    if power is None:
        raise SystemExit(
            f"no {state_dir(results, state) / POWER_FILE}: run the pilot and --power first"
        )
    return int(power["batches"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--results", type=Path, default=RESULTS)
    add("--state", choices=list(STATES))
    add("--sample", choices=SAMPLES, default="main")
    add("--lane", type=int, default=0)
    add("--lanes", type=int, default=1)
    add("--device", default="cpu")
    add(
        "--store_dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="dtype the references are held in while the gradients stream past (bfloat16 for "
        "the 0.5B model, whose float32 references would not fit beside its gradient)",
    )
    add(
        "--rows_per_forward",
        type=int,
        help="rows per forward pass, whole groups (default: the whole mini-batch; smaller "
        "bounds the activations' memory)",
    )
    add(
        "--recompute",
        action="store_true",
        help="one forward per direction and chunk (memory of one gradient, not one per direction)",
    )
    add(
        "--bf16",
        action="store_true",
        help="TRL's bf16 mixed precision (autocast; float32 weights): decide it before a state's "
        "first measurement, after checking on another state that its cosines are unchanged",
    )
    add("--power", action="store_true", help="size the main sample from the pilot, then stop")
    add("--max_batches", type=int, help="--power: the budget's cap on the main sample")
    add("--report", action="store_true", help="regenerate the report from the results files")
    add(
        "--compare_with",
        type=Path,
        help="another results folder holding the same --state and --sample measured another "
        "way (e.g. --bf16): print and store how much the cosines changed, then stop",
    )
    args = parser.parse_args(argv)
    if args.report:
        print(write_report(args.results))
        return 0
    if args.state is None:
        parser.error("--state is required unless --report")
    if args.compare_with is not None:
        measured = [
            load_measures(r).get(args.state, {}).get(args.sample)
            for r in (args.results, args.compare_with)
        ]
        if not all(measured):
            raise SystemExit(f"{args.state} {args.sample}: not measured in both results folders")
        compared = precision_comparison(*measured)
        _write_json(
            sample_dir(args.compare_with, args.state, args.sample) / "comparison.json", compared
        )
        print(json.dumps(compared, indent=1))
        return 0
    if args.power:
        pilot = load_measures(args.results).get(args.state, {}).get("pilot")
        if not pilot or len(pilot) < PILOT_BATCHES:
            raise SystemExit(f"{args.state}: the pilot is not complete")
        cap = args.max_batches or 10_000
        power = power_calculation(pilot, cap)
        _write_json(state_dir(args.results, args.state) / POWER_FILE, power)
        print(json.dumps(power, indent=1))
        return 0
    if not 0 <= args.lane < args.lanes:
        parser.error(f"--lane must be in [0, --lanes), got {args.lane} of {args.lanes}")
    record_plan(args.results)
    batches = PILOT_BATCHES if args.sample == "pilot" else main_batches(args.results, args.state)
    lane = Lane(
        args.results,
        args.state,
        args.sample,
        batches,
        args.lane,
        args.lanes,
        args.device,
        args.store_dtype,
        args.rows_per_forward,
        args.recompute,
        args.bf16,
    )
    run_lane(lane)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
