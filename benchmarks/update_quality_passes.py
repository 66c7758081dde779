"""The update-quality benchmark's gradient passes (`update_quality.py`): every estimator's
update and the leave-batch-out references as flat gradients, the reference and measure passes,
the lanes that share them (the checks that let a pass resume only where it can:
`update_quality_resume.py`; what the references cost: `update_quality_references.py`)."""

from __future__ import annotations

import argparse
import os
import resource
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import convergence_runs  # a sibling script: the cold start
import numpy as np
import update_quality_resume as resume  # by its module: the tests replace its engine
from update_quality_references import (
    SUMMED,
    check_memory,
    folded,
    reference_names,
    trainable_parameters,
)
from update_quality_resume import (  # noqa: F401  (reached as update_quality.<name>)
    FLAGS,
    benchmark_files,
    check_part,
    code_digest,
    engine,
    file_digest,
    reference_settings,
    sample_path,
)
from update_quality_states import (
    ALL_STATES,
    CHECKPOINT_STATES,
    CHECKPOINTS,
    GROUP_SIZE,
    PLAN_2_STATES,
    PROMPTS_PER_BATCH,
    RESPONSE_LEVEL,
    RUN_FILE,
    TOKEN_VARIANTS,
    State,
    batch_inputs,
    batch_rows,
    build_trainer,
    checkpoint_policy,
    configured,
    max_batches,
    read_json,
    sample_batch,
    sample_dir,
    state_dir,
    write_json,
)
from update_quality_weights import batch_weight_statistics

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
    trainer: Any,
    inputs: Mapping[str, Any],
    scored: Any,
    batch: int,
    variants: Mapping[str, Mapping[str, Any]] = TOKEN_VARIANTS,
    tokens: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Each directly measured estimator's advantages on the batch, made by the trainer's code:
    grpo and gdpo (Tensor[N]) by the registry as `_generate_and_score_completions` calls it;
    each token-level variant (Tensor[N, T]) by `_token_advantages` at beta 1 (its replay, or
    the entropy forward), with the variant's switches set. The step (`global_step`) is the
    mini-batch's index: the placebo's pairing and the shuffle's permutation are the ones the
    trainer would draw at that step. tokens: filled with each variant's `TokenAdvantages`
    (its weights and replay: the weight statistics')."""
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
    for name, switches in variants.items():
        with configured(trainer, mrtpo_beta=1.0, mrtpo_warmup_steps=0, **switches):
            token = trainer._token_advantages(scored, step, GROUP_SIZE, output)
        out[name] = token.advantages
        if tokens is not None:
            tokens[name] = token
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


def reference_coefficients(
    scored: Any, names: Sequence[str], mode: str = "per_fold"
) -> dict[str, Any]:
    """`batch_gradients`' entries of the references `mode` keeps (`reference_names`):
    ("sequence", a) with a each response's leave-one-out advantage of reward k ("ref/<k>"),
    or of the summed reward (SUMMED: the sum over the rewards of theirs)."""
    centred = leave_one_out(scored.rewards.float().cpu())
    columns = {f"ref/{name}": centred[:, k] for k, name in enumerate(names)}
    columns[SUMMED] = centred.sum(dim=1)
    return {name: ("sequence", columns[name]) for name in reference_names(names, mode)}


# ----------------------------------------------------------------------------- the passes


def fold_key(name: str, fold: int) -> str:
    """The key of a reference's sum over one fold's mini-batches ("ref/<reward>#<fold>")."""
    return f"{name}#{fold}"


def reference_pass(
    trainer: Any,
    record: Mapping[str, Any],
    layout: Mapping[str, Any] | None = None,
    sums: dict[str, Any] | None = None,
    fold: int = 0,
    mode: str = "per_fold",
) -> dict[str, Any]:
    """The batch's own part of each reference `mode` keeps (`--reward_references`), added
    into `sums` under its fold (in place, each gradient as it arrives: no second copy of a 0.5B
    model's references) and returned: {"<reference>#<fold>": vector}, a reference kept whole
    under fold 0. layout: `batch_gradients`' rows_per_forward and recompute; fold: the
    mini-batch's fold (`fold_of`)."""
    inputs, scored = batch_inputs(trainer, record)
    sums = {} if sums is None else sums

    def add(name: str, vector: Any) -> None:
        key = fold_key(name, fold if folded(name, mode) else 0)
        if key in sums:
            sums[key].add_(vector)
        else:
            sums[key] = vector

    batch_gradients(
        trainer,
        inputs,
        reference_coefficients(scored, record["reward_names"], mode),
        add,
        **(layout or {}),
    )
    return sums


def fold_of(batch: int, folds: int) -> int:
    """Mini-batch `batch`'s fold: folds are the residues of the index (disjoint, sizes within
    one of each other, whatever the number measured so far)."""
    return batch % folds


def measure_batch(
    trainer: Any,
    record: Mapping[str, Any],
    batch: int,
    totals: Mapping[str, Any],
    store_dtype: str = "float32",
    layout: Mapping[str, Any] | None = None,
    folds: int = 1,
    variants: Mapping[str, Mapping[str, Any]] = TOKEN_VARIANTS,
    mode: str = "per_fold",
) -> dict[str, Any]:
    """Every direction of one mini-batch against its leave-batch-out references, split by fold.

    totals: {"<reference>#<fold>": the sum of the fold's mini-batches' parts} (`reference_pass`
    with the same `mode`, the `--reward_references` kept); folds: their number. The
    mini-batch's reference restricted to fold f is that sum, less the mini-batch's own part in
    its own fold; the whole reference is the sum over the folds. Each dot product with a
    reference kept per fold is kept per fold, so that the analysis can leave a fold out of the
    references and the mini-batches alike (the fold jackknife,
    `update_quality_analysis.fold_tests`) or judge on some folds what was chosen on others.
    store_dtype: the references and gdpo's gradient are held in it while the other gradients
    stream past ("bfloat16" halves them: the 0.5B model's references; every dot product is
    still taken in float64 against the float32 gradient). Memory: the references `mode` keeps
    (`update_quality_references`).
    Returns the dot products the report needs: the Gram matrix of the references kept per fold
    (whole, and per pair of folds), and per measured direction its dots with each of them
    (whole, and per fold), its squared norm and its dot with gdpo's. The references kept per
    fold are the rewards' (`per_fold`: "ref_*" over the rewards) or the summed reward's alone
    (`whole`, `none`: "ref_*" over it); `whole` adds each direction's dots with the rewards'
    whole references ("reward_dots") and their Gram matrix ("reward_gram"). And the weights'
    statistics (`update_quality_weights`).
    """
    inputs, scored = batch_inputs(trainer, record)
    coefficients = reference_coefficients(scored, record["reward_names"], mode)
    names = [name for name in coefficients if folded(name, mode)]
    whole = [name for name in coefficients if not folded(name, mode)]
    kept_references = set(coefficients)
    tokens: dict[str, Any] = {}
    started = time.perf_counter()
    estimated = estimator_advantages(trainer, inputs, scored, batch, variants, tokens)
    advantage_seconds = time.perf_counter() - started
    width = inputs["completion_ids"].shape[1]
    weights = batch_weight_statistics(tokens, scored.trained_mask(width))
    del tokens
    coefficients.update(estimated)
    import torch

    dtype = getattr(torch, store_dtype)
    own_fold = fold_of(batch, folds)
    references: dict[tuple[str, int], Any] = {}
    kept: dict[str, Any] = {}
    directions: dict[str, dict[str, Any]] = {}

    def take(name: str, vector: Any) -> None:
        if name in kept_references:  # the other mini-batches' part: less this one's own
            span, own = (folds, own_fold) if name in names else (1, 0)
            for fold in range(span):
                total = totals[fold_key(name, fold)]
                references[name, fold] = (
                    difference(total, vector, dtype) if fold == own else total.to(dtype)
                )
            return
        fold_dots = [[dot(vector, references[r, f]) for f in range(folds)] for r in names]
        entry = {
            "ref_dots": [sum(row) for row in fold_dots],
            "ref_fold_dots": fold_dots,
            "norm2": dot(vector, vector),
        }
        if whole:
            entry["reward_dots"] = [dot(vector, references[r, 0]) for r in whole]
        if "gdpo" in kept:
            entry["dot_gdpo"] = dot(vector, kept["gdpo"])
        if name == "gdpo":
            kept["gdpo"] = vector.to(dtype)
            entry["dot_gdpo"] = entry["norm2"]
        directions[name] = entry

    started = time.perf_counter()
    batch_gradients(trainer, inputs, coefficients, take, **(layout or {}))
    keys = [(r, f) for r in names for f in range(folds)]
    products: dict[tuple[int, int], float] = {}
    for i, a in enumerate(keys):  # symmetric: each pair once
        for j in range(i, len(keys)):
            products[i, j] = products[j, i] = dot(references[a], references[keys[j]])
    fold_gram = [
        [
            [[products[a * folds + f, b * folds + g] for g in range(folds)] for f in range(folds)]
            for b in range(len(names))
        ]
        for a in range(len(names))
    ]
    gram = [[float(np.sum(pair)) for pair in row] for row in fold_gram]
    measured = {
        "batch": batch,
        "folds": folds,
        "fold": own_fold,
        "reward_names": record["reward_names"],
        "reward_references": mode,
        "rewards_mean": np.nanmean(np.array(record["rewards"], dtype=float), axis=0).tolist(),
        "varying_pairs_share": _varying_share(scored.rewards),
        "ref_gram": gram,
        "ref_fold_gram": fold_gram,
        "directions": directions,
        "weights": weights,
        "seconds": {"advantages": advantage_seconds, "gradients": time.perf_counter() - started},
    }
    if whole:
        measured["reward_gram"] = [
            [dot(references[a, 0], references[b, 0]) for b in whole] for a in whole
        ]
    return measured


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
    # the folds the references are split into (at most one per mini-batch: `fold_count`)
    folds: int = 4
    # the rewards' references kept (`update_quality_references`): per_fold, whole or none
    reward_references: str = "per_fold"
    memory_limit_gb: float | None = None  # what the references may take (None: the machine's)
    cap: int | None = None  # the new-token cap (None: the state's, or its decided one)
    sample_only: bool = False  # sample the mini-batches, then stop (a pilot at a cap)
    # git-commit each sample and measure file and run.json as written: a machine that is not
    # kept loses only the reference pass (redone from the committed samples) and the batch
    # under way, since the measure pass skips the batches whose files are in the checkout
    commit: bool = False

    @property
    def folder(self) -> Path:
        return sample_dir(self.results, self.state_name, self.sample, self.cap)

    @property
    def layout(self) -> dict[str, Any]:
        return {"rows_per_forward": self.rows_per_forward, "recompute": self.recompute}

    @property
    def precision(self) -> dict[str, Any]:
        return {"store_dtype": self.store_dtype, "bf16_autocast": self.bf16}

    @property
    def fold_count(self) -> int:
        """The folds: `folds`, or one per mini-batch where the sample has fewer."""
        return min(self.folds, self.batches)

    def mine(self) -> list[int]:
        return [b for b in range(self.batches) if b % self.lanes == self.lane]


def policy_path(lane: Lane, state: State) -> str:
    """The state's policy: a test's model, a checkpoint state's kept policy (refused while it
    is not there), the embedded model, or the powered study's cold start (built once into this
    state's folder, by the study's own recipe)."""
    if lane.model_path is not None:
        return lane.model_path
    if lane.state_name in CHECKPOINT_STATES:
        return str(checkpoint_policy(lane.state_name))
    if state.model != "cold_start":
        return state.model
    args = argparse.Namespace(
        results=state_dir(lane.results, lane.state_name),
        cold_start=None,
        model_name_or_path=None,
        sft_max_steps=3,
        device="cpu" if lane.device == "cpu" else lane.device,
    )
    folder = convergence_runs.cold_start_dir(args)
    with convergence_runs.run_lock(folder.parent, wait=True):
        return str(convergence_runs.build_cold_start(args))


def load_state(lane: Lane) -> tuple[Any, Any, Any, Any, State]:
    """(trainer, dataset, task, tokenizer, state) of a lane."""
    import torch

    from mrtpo import tasks
    from mrtpo.models import load_model

    state = ALL_STATES[lane.state_name]
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
        **({} if lane.cap is None else {"max_completion_length": lane.cap}),
    )
    return trainer, dataset, task, tokenizer, state


def variants_of(state: str, results: Path | None = None) -> Mapping[str, Mapping[str, Any]]:
    """The token-level variants measured on a state: its plan's (the second plan's add the
    generic context and contrastive relevance); the first plan's states measured again into
    the second plan's re-measurement folder (`results` named FOLDS_RESULTS: `folds/`) get the
    second plan's too, one set for every re-measurement; a checkpoint state its own few."""
    from update_quality_plan2 import FOLDS_RESULTS, TOKEN_VARIANTS_2

    if state in CHECKPOINT_STATES:
        return {name: TOKEN_VARIANTS[name] for name in CHECKPOINT_STATES[state].variants}
    again = results is not None and Path(results).name == FOLDS_RESULTS
    return TOKEN_VARIANTS_2 if state in PLAN_2_STATES or again else TOKEN_VARIANTS


def lane_memory(lane: Lane, parameters: int, rewards: int) -> dict[str, Any]:
    """`update_quality_references.estimate`'s settings of a lane's run, for a model of
    `parameters` trainable parameters and `rewards` rewards."""
    rows = GROUP_SIZE * PROMPTS_PER_BATCH
    chunked = lane.rows_per_forward is not None and lane.rows_per_forward < rows
    return {
        "parameters": parameters,
        "rewards": rewards,
        "mode": lane.reward_references,
        "folds": lane.fold_count,
        "batches": lane.batches,
        "lanes": lane.lanes,
        "store_dtype": lane.store_dtype,
        "directions": len(RESPONSE_LEVEL) + len(variants_of(lane.state_name, lane.results)),
        "chunked": chunked and not lane.recompute,
        "limit_gb": lane.memory_limit_gb,
    }


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
    where = f"{lane.state_name} {lane.folder.name}"
    sizes = trainable_parameters(trainer.model), len(trainer.reward_funcs)
    memory = None if lane.sample_only else check_memory(where, **lane_memory(lane, *sizes))
    record = read_json(lane.folder / RUN_FILE) or {"lanes": {}}
    cap = trainer.args.max_completion_length
    if record.setdefault("max_completion_length", cap) != cap:
        raise SystemExit(
            f"{lane.folder / RUN_FILE}: sampled at {record['max_completion_length']} new tokens, "
            f"this run at {cap}: a sample has one cap"
        )
    info = record["lanes"].setdefault(str(lane.lane), {"sessions": [], "cpu_seconds": {}})
    policy = {}
    if state.model == "cold_start" and lane.model_path is None:  # rebuilt per machine: which one
        policy["cold_start_sha256"] = convergence_runs.weights_digest(
            Path(policy_path(lane, state))
        )
    if lane.state_name in CHECKPOINT_STATES:  # a training run's: which weights were measured
        digest = convergence_runs.weights_digest(Path(policy_path(lane, state)))
        if record.setdefault("policy_sha256", digest) != digest:
            raise SystemExit(
                f"{lane.folder / RUN_FILE}: sampled from the policy with sha256 "
                f"{record['policy_sha256']}, this run's has {digest}: a sample has one policy"
            )
        policy["policy_sha256"] = digest
    code = resume.engine()
    session = {**resume.machine(lane), **code, **lane.precision, **lane.layout, **policy}
    session["reward_references"] = lane.reward_references
    if memory is not None:
        session["memory_estimate_gb"] = {
            "reference": memory.reference_gb, "measure": memory.measure_gb,
            "limit": memory.limit_gb, "disk": memory.disk_gb,
        }  # fmt: skip
    info["sessions"].append(session)
    built = policy.get("cold_start_sha256") or policy.get("policy_sha256")  # weights by digest
    settings = resume.reference_settings(lane, code["commit"], built)
    info["batches"] = lane.batches
    write_json(lane.folder / RUN_FILE, record)

    def spend(stage: str, started: float) -> None:
        info["cpu_seconds"][stage] = (
            info["cpu_seconds"].get(stage, 0.0) + time.process_time() - started
        )
        info["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        fresh = read_json(lane.folder / RUN_FILE) or {"lanes": {}}
        fresh["lanes"][str(lane.lane)] = info
        write_json(lane.folder / RUN_FILE, fresh)

    seed_base = {"pilot": 1_000, "main": 2_000}[lane.sample] + 100_000 * state.seed
    for batch in lane.mine():
        if sample_path(lane, batch).is_file():
            continue
        started = time.process_time()
        rows = [dataset[i] for i in batch_rows(len(dataset), state.seed, lane.sample, batch)]
        write_json(sample_path(lane, batch), sample_batch(trainer, rows, seed_base + batch))
        spend("sample", started)
        keep(lane, sample_path(lane, batch), "sample")
    if lane.sample_only:
        return

    path = reference_path(lane, lane.lane)
    partial = {"batches": [], "sums": {}, "settings": settings, "samples": {}}
    if path.is_file():
        partial = torch.load(path)
        check_part(partial, path, lane, settings)
    for batch in lane.mine():
        if batch in partial["batches"]:
            continue
        started = time.process_time()
        record = read_json(sample_path(lane, batch))
        fold = fold_of(batch, lane.fold_count)
        reference_pass(trainer, record, lane.layout, partial["sums"], fold, lane.reward_references)
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
            read_json(sample_path(lane, batch)),
            batch,
            totals,
            lane.store_dtype,
            lane.layout,
            lane.fold_count,
            variants_of(lane.state_name, lane.results),
            lane.reward_references,
        )
        write_json(measure_path(lane, batch), measured)
        spend("measure", started)
        keep(lane, measure_path(lane, batch), "measures")


def keep(lane: Lane, path: Path, what: str) -> None:
    """With `lane.commit`, git-commit `path` (a mini-batch's file) and the sample's run.json."""
    if lane.commit:
        batch = path.stem.removeprefix("batch")
        message = f"#48: update quality, {lane.state_name} {lane.folder.name} {what} {batch}"
        convergence_runs.commit_files([path, lane.folder / RUN_FILE], message)


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
