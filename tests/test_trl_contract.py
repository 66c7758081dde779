"""What `mrtpo.trainer.MRTPOTrainer` (and `mrtpo.sharding`) rely on in TRL 1.16, one test each.

`MRTPOTrainer` subclasses TRL's `GRPOTrainer` and overrides or calls private hooks, reads
attributes TRL's constructor sets, reads and adds keys of TRL's generation batch, and hands TRL
(B, T) advantages. None of that is TRL's public API, hence the pin `trl==1.16.0`. Each piece is
checked here on plain TRL (no MRTPO code runs, except the config's field list): a TRL upgrade
that changes one fails the test named after it, with a message that says what changed.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections import defaultdict, deque

import pytest
import torch
import trl
from trainer_toys import CPU_RUN, toy_dataset, toy_verifiers
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen2_5_chat_template

from mrtpo.testing import tiny_model_and_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TRL = f"TRL {trl.__version__}"
NUM_GENERATIONS = 4
BATCH = 8  # rows per generation batch: 2 prompts x 4 completions


def _config(tmp_path, **overrides) -> GRPOConfig:
    settings = dict(
        per_device_train_batch_size=BATCH,
        num_generations=NUM_GENERATIONS,
        max_completion_length=6,
        max_steps=1,
        **CPU_RUN,
    )
    return GRPOConfig(output_dir=str(tmp_path / "run"), **{**settings, **overrides})


def _trainer(tmp_path, trainer_class=GRPOTrainer, reward_funcs=None, **overrides):
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    tools = overrides.pop("tools", None)
    if tools is not None:
        tokenizer.chat_template = qwen2_5_chat_template  # TRL parses its tool calls
    return trainer_class(
        model=model,
        reward_funcs=reward_funcs if reward_funcs is not None else toy_verifiers(),
        args=_config(tmp_path, **overrides),
        train_dataset=toy_dataset(),
        processing_class=tokenizer,
        tools=tools,
    )


def _rows(trainer) -> list[dict]:
    """One generation batch of dataset rows, each prompt repeated as TRL's sampler does."""
    dataset = trainer.train_dataset
    return [dict(dataset[i // NUM_GENERATIONS]) for i in range(BATCH)]


# ---------------------------------------------------------------------- hooks: signatures

# name: (the parameters MRTPOTrainer's override or call relies on, a staticmethod?, whether
# more trailing parameters may follow)
HOOKS = {
    "_calculate_rewards": (
        ["self", "inputs", "prompts", "completions", "completion_ids_list"],
        False,
        False,
    ),
    "_generate_and_score_completions": (["self", "inputs"], False, False),
    "_prepare_inputs": (["self", "generation_batch"], False, False),
    "get_off_policy_mask": (
        [
            "advantages",
            "per_token_logps",
            "sampling_per_token_logps",
            "mask",
            "off_policy_threshold",
        ],
        True,
        False,
    ),
    # MRTPOTrainer passes k_pos, lambda_pos, k_neg, lambda_neg through as keywords.
    "get_gamma_weights": (
        ["advantages", "log_ratio_per_token", "mask", "importance_sampling_ratio"],
        True,
        True,
    ),
    "log": (["self", "logs", "start_time"], False, False),
    # Called by the tests (TRL's per-token log-probs); the others are keyword options.
    "_get_per_token_logps_and_entropies": (
        ["self", "model", "input_ids", "attention_mask", "logits_to_keep"],
        False,
        True,
    ),
    "_compute_loss": (["self", "model", "inputs"], False, False),
    # Overridden by the tests to script the model's completions.
    "_generate_single_turn": (
        ["self", "prompt_ids", "images", "multimodal_fields", "num_generations"],
        False,
        True,
    ),
}


@pytest.mark.parametrize("name", list(HOOKS))
def test_hook_exists_with_the_signature_mrtpo_relies_on(name):
    expected, static, more = HOOKS[name]
    raw = inspect.getattr_static(GRPOTrainer, name, None)
    assert raw is not None, f"{TRL}: GRPOTrainer.{name} is gone (MRTPOTrainer overrides it)"
    assert isinstance(raw, staticmethod) == static, (
        f"{TRL}: GRPOTrainer.{name} is {'no longer' if static else 'now'} a staticmethod"
    )
    parameters = list(inspect.signature(getattr(GRPOTrainer, name)).parameters)
    got = parameters[: len(expected)] if more else parameters
    assert got == expected, (
        f"{TRL}: GRPOTrainer.{name} now takes {parameters}; MRTPOTrainer relies on {expected}"
    )


def test_gamma_weights_keywords_are_trls_config_pairs():
    parameters = inspect.signature(GRPOTrainer.get_gamma_weights).parameters
    for name in ("k_pos", "lambda_pos", "k_neg", "lambda_neg"):
        assert name in parameters, f"{TRL}: GRPOTrainer.get_gamma_weights lost its {name!r} keyword"


# Where TRL calls each overridden hook through `self` (so that the override runs), and how.
CALL_SITES = [
    ("_prepare_inputs", "self._generate_and_score_completions(generation_batch)"),
    (
        "_generate_and_score_completions",
        "self._calculate_rewards(inputs, prompts, completions, completion_ids_list)",
    ),
    ("_compute_loss", "self.get_off_policy_mask("),
    ("_compute_loss", "self.get_gamma_weights("),
    ("_compute_loss", "self._get_per_token_logps_and_entropies("),
    ("_compute_loss", 'advantages = inputs["advantages"]'),
    # share_prompt: the trainer swaps this module-level name for a whole-group shuffle while
    # TRL's `_prepare_inputs` runs, and computes every per-token log-prob through the hook.
    ("_prepare_inputs", "generation_batch = shuffle_sequence_dict(generation_batch)"),
    ("_generate_and_score_completions", "self._get_per_token_logps_and_entropies("),
    # share_prompt's generation prefill: TRL's transformers path calls the model's generate
    ("_generate_single_turn", "unwrapped_model.generate("),
]


def test_shuffle_is_looked_up_in_the_trainers_module():
    from trl.trainer import grpo_trainer

    assert callable(getattr(grpo_trainer, "shuffle_sequence_dict", None)), (
        f"{TRL}: trl.trainer.grpo_trainer no longer has shuffle_sequence_dict (share_prompt "
        "replaces it there to shuffle whole groups)"
    )


@pytest.mark.parametrize("caller, call", CALL_SITES)
def test_trl_calls_the_hook_through_self(caller, call):
    source = inspect.getsource(getattr(GRPOTrainer, caller))
    assert call in source, f"{TRL}: GRPOTrainer.{caller} no longer contains `{call}`"


# ---------------------------------------------------------------------- attributes

# Config fields MRTPOConfig and MRTPOTrainer read (config.py sets the aggregation and logging).
CONFIG_FIELDS = [
    "cast_lm_head_to_fp32",
    "chat_template_kwargs",
    "ds3_gather_for_generation",
    "gradient_accumulation_steps",
    "gradient_checkpointing_kwargs",
    "logging_steps",
    "multi_objective_aggregation",
    "num_generations",
    "num_iterations",
    "output_dir",
    "reward_weights",
    "scale_rewards",
    "seed",
    "steps_per_generation",
    "temperature",
]


@pytest.mark.parametrize("field", CONFIG_FIELDS)
def test_grpo_config_has_the_field(field):
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert field in names, f"{TRL}: GRPOConfig has no field {field!r} (MRTPOConfig reads it)"


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A GRPOTrainer with the toy verifiers as reward functions, untouched after construction."""
    return _trainer(tmp_path_factory.mktemp("plain"))


# attribute: (what MRTPOTrainer expects of it on `plain`, the expectation in words)
ATTRIBUTES = {
    "num_generations": (lambda t: t.num_generations == NUM_GENERATIONS, "args.num_generations"),
    "num_generations_eval": (
        lambda t: t.num_generations_eval == NUM_GENERATIONS,
        "args.num_generations_eval, else num_generations",
    ),
    "scale_rewards": (lambda t: t.scale_rewards == "group", 'the string "group" by default'),
    "temperature": (lambda t: t.temperature == t.args.temperature, "args.temperature"),
    "reward_funcs": (
        lambda t: [f.name for f in t.reward_funcs] == [v.name for v in toy_verifiers()],
        "the list of reward functions given, in order",
    ),
    "reward_func_names": (
        lambda t: t.reward_func_names == [v.name for v in toy_verifiers()],
        "each function's __name__ (a Verifier's name)",
    ),
    "reward_weights": (
        lambda t: torch.equal(t.reward_weights, torch.ones(3)),
        "a float32 (K,) tensor, ones by default",
    ),
    "tools": (lambda t: not t.tools, "None (or empty) without tools"),
    "chat_template": (lambda t: t.chat_template is None, "None without tools"),
    "chat_template_kwargs": (lambda t: t.chat_template_kwargs == {}, "args' kwargs, else {}"),
    "processing_class": (
        lambda t: hasattr(t.processing_class, "apply_chat_template"),
        "the tokenizer",
    ),
    "environment_factories": (
        lambda t: t.environment_factories is None,
        "None without environments",
    ),
    "num_iterations": (lambda t: t.num_iterations == t.args.num_iterations, "args.num_iterations"),
    "_step": (lambda t: t._step == 0, "the micro-step count, 0 before training"),
    "_buffered_inputs": (lambda t: t._buffered_inputs is None, "None before the first generation"),
    "_metrics": (
        lambda t: (
            set(t._metrics) == {"train", "eval"}
            and all(
                isinstance(m, defaultdict) and m.default_factory is list
                for m in t._metrics.values()
            )
        ),
        '{"train": defaultdict(list), "eval": defaultdict(list)}',
    ),
    "model_wrapped": (lambda t: t.model_wrapped is t.model, "the model (wrapped once prepared)"),
    "accelerator": (lambda t: t.accelerator.process_index == 0, "accelerate's Accelerator"),
    "state": (lambda t: t.state.global_step == 0, "the TrainerState, global_step 0"),
    "ref_model": (lambda t: t.ref_model is None, "None without a reference model (beta 0)"),
    "use_vllm": (lambda t: t.use_vllm is False, "args.use_vllm"),
    "use_transformers_continuous_batching": (
        lambda t: t.use_transformers_continuous_batching is False,
        "args.use_transformers_continuous_batching",
    ),
    "_logs": (
        lambda t: (
            isinstance(t._logs["advantages"], deque)
            and t._logs["advantages"].maxlen == t.args.generation_batch_size
        ),
        'a dict whose "advantages" is a deque of the last generation batch (the completions table)',
    ),
}


@pytest.mark.parametrize("name", list(ATTRIBUTES))
def test_trl_sets_the_attribute(plain, name):
    check, expected = ATTRIBUTES[name]
    assert hasattr(plain, name), f"{TRL}: GRPOTrainer no longer sets self.{name}"
    assert check(plain), (
        f"{TRL}: GRPOTrainer's self.{name} is {getattr(plain, name)!r}; MRTPOTrainer expects "
        f"{expected}"
    )


def test_reward_functions_are_read_at_call_time(tmp_path):
    # MRTPOTrainer wraps the reward functions after TRL's constructor has named them; TRL must
    # call what `self.reward_funcs` holds then, with the batch's columns as keywords.
    trainer = _trainer(tmp_path)
    seen = {}

    def replacement(prompts, completions, **columns):
        seen.update(columns, prompts=prompts, completions=completions)
        return [float(i) for i in range(len(prompts))]

    trainer.reward_funcs[1] = replacement
    rows = _rows(trainer)
    completions = [[{"role": "assistant", "content": "a b"}]] * BATCH
    rewards = trainer._calculate_rewards(
        rows, [row["prompt"] for row in rows], completions, [[1, 2]] * BATCH
    )
    assert rewards.shape == (BATCH, 3), f"{TRL}: _calculate_rewards returned {rewards.shape}"
    assert rewards[:, 1].tolist() == list(range(BATCH)), (
        f"{TRL}: _calculate_rewards did not call the function now in self.reward_funcs"
    )
    assert seen["letter"] == [row["letter"] for row in rows], (
        f"{TRL}: _calculate_rewards no longer passes the dataset's columns to reward functions"
    )
    assert seen["completions"] == completions and seen["completion_ids"] == [[1, 2]] * BATCH


def test_calculate_rewards_gives_nan_for_none(tmp_path):
    def abstains(prompts, completions, **columns):
        return [None] * len(prompts)

    trainer = _trainer(tmp_path, reward_funcs=[abstains, toy_verifiers()[0]])
    rows = _rows(trainer)
    rewards = trainer._calculate_rewards(
        rows,
        [row["prompt"] for row in rows],
        [[{"role": "assistant", "content": "x"}]] * BATCH,
        [[1]] * BATCH,
    )
    assert torch.isnan(rewards[:, 0]).all(), f"{TRL}: a None reward is no longer NaN"


def test_log_averages_metrics_and_clears_them(tmp_path):
    trainer = _trainer(tmp_path)
    trainer.model.train()
    trainer._metrics["train"]["mrtpo/x"].extend([1.0, 3.0])
    trainer._metrics["train"]["mrtpo/none"].append(math.nan)
    trainer.log({"loss": 0.5})
    logged = trainer.state.log_history[-1]
    assert logged.get("mrtpo/x") == 2.0, f"{TRL}: log() no longer averages self._metrics: {logged}"
    assert "mrtpo/none" in logged and logged["mrtpo/none"] is None, (
        f"{TRL}: log() no longer logs an all-NaN metric as None: {logged}"
    )
    assert not trainer._metrics["train"], f"{TRL}: log() no longer clears self._metrics"


# ---------------------------------------------------------------------- the generation batch


class RecordingRewards(GRPOTrainer):
    """Keeps what `_calculate_rewards` was called with."""

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self.reward_calls = getattr(self, "reward_calls", []) + [(prompts, completion_ids_list)]
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)


@pytest.fixture(scope="module")
def generation(tmp_path_factory):
    """(trainer, rows, output) of one generation batch of plain TRL, in training mode."""
    trainer = _trainer(tmp_path_factory.mktemp("generation"), RecordingRewards)
    trainer.model.train()
    rows = _rows(trainer)
    return trainer, rows, trainer._generate_and_score_completions(rows)


# key: (dims, dtype kind) of output[key], B = this process's rows
OUTPUT_KEYS = {
    "advantages": (1, "float"),
    "completion_ids": (2, "int"),
    "completion_mask": (2, "int"),
    "prompt_ids": (2, "int"),
    "prompt_mask": (2, "int"),
}


@pytest.mark.parametrize("key", list(OUTPUT_KEYS))
def test_generation_batch_has_the_key(generation, key):
    _, _, output = generation
    assert key in output, f"{TRL}: _generate_and_score_completions no longer returns {key!r}"
    dims, kind = OUTPUT_KEYS[key]
    value = output[key]
    assert value.dim() == dims and value.shape[0] == BATCH, (
        f"{TRL}: output[{key!r}] has shape {tuple(value.shape)}, expected {dims} dims, B = {BATCH}"
    )
    assert value.is_floating_point() == (kind == "float"), (
        f"{TRL}: output[{key!r}] is {value.dtype}"
    )


def test_generation_batch_masks_match_their_ids(generation):
    _, _, output = generation
    for ids, mask in (("completion_ids", "completion_mask"), ("prompt_ids", "prompt_mask")):
        assert output[mask].shape == output[ids].shape, f"{TRL}: {mask} and {ids} differ in shape"


def test_rewards_are_scored_once_on_the_batchs_rows_in_order(generation):
    # MRTPOTrainer keeps the scored batch: row i of its prompts and completion ids must be row i
    # of the output, and the rewards this process's rows at process_index * B.
    trainer, rows, output = generation
    assert len(trainer.reward_calls) == 1, f"{TRL}: rewards computed {len(trainer.reward_calls)}x"
    ((prompts, completion_ids),) = trainer.reward_calls
    assert prompts == [row["prompt"] for row in rows], f"{TRL}: prompts reordered before scoring"
    unpadded = [
        ids[mask.bool()].tolist()
        for ids, mask in zip(output["completion_ids"], output["completion_mask"], strict=True)
    ]
    assert [list(ids) for ids in completion_ids] == unpadded, (
        f"{TRL}: the completion ids scored are not the output's rows, unpadded, in order"
    )


def lookup(word: str) -> str:
    """Look up a word in the dictionary.

    Args:
        word: The word to look up.
    """
    return f"{word}: a noun."


class ScriptedToolCall(GRPOTrainer):
    """Every row's first turn calls `lookup`; TRL runs it and the model continues."""

    def _generate_single_turn(
        self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False
    ):
        tokenizer = self.processing_class
        end = [tokenizer.eos_token_id]
        if num_generations == 1:  # TRL's tool loop: the model's continuation
            return [tokenizer.encode("Done.", add_special_tokens=False) + end] * len(
                prompt_ids
            ), None
        call = '<tool_call>\n{"name": "lookup", "arguments": {"word": "apple"}}\n</tool_call>'
        return [tokenizer.encode(call, add_special_tokens=False) + end] * len(prompt_ids), None


def test_generation_batch_has_tool_mask_with_tools(tmp_path):
    trainer = _trainer(tmp_path, ScriptedToolCall, tools=[lookup], max_completion_length=160)
    trainer.model.train()
    output = trainer._generate_and_score_completions(_rows(trainer))
    assert "tool_mask" in output, f"{TRL}: no 'tool_mask' in the generation batch with tools"
    tool_mask, completion_mask = output["tool_mask"], output["completion_mask"]
    assert tool_mask.shape == completion_mask.shape, f"{TRL}: tool_mask's shape changed"
    trained = (tool_mask == 0) & (completion_mask == 1)
    assert trained.any() and (tool_mask[completion_mask == 1] == 1).any(), (
        f"{TRL}: tool_mask is no longer 0 on tool outputs and 1 on the model's tokens"
    )


# ---------------------------------------------------------------------- batch handling


def _generation_like(rows: int, width: int) -> dict:
    advantages = torch.arange(rows, dtype=torch.float32)
    return {
        "advantages": advantages,
        "per_token": advantages[:, None] * 10 + torch.arange(width),  # row i: 10 i + t
        "beta": torch.tensor(0.25),  # 0-dim
        "num_items_in_batch": torch.tensor(rows * width),
    }


def test_shuffle_keeps_zero_dim_tensors_whole_and_rows_together():
    from trl.trainer import grpo_trainer  # the names `_prepare_inputs` calls

    shuffled = grpo_trainer.shuffle_sequence_dict(_generation_like(8, 5))
    assert shuffled["beta"].dim() == 0 and shuffled["beta"].item() == 0.25, (
        f"{TRL}: shuffle_sequence_dict no longer leaves a 0-dim tensor whole"
    )
    expected = shuffled["advantages"][:, None] * 10 + torch.arange(5)
    assert torch.equal(shuffled["per_token"], expected), (
        f"{TRL}: shuffle_sequence_dict no longer permutes (B, T) and (B,) tensors together"
    )


def test_split_keeps_zero_dim_tensors_whole():
    from trl.trainer import grpo_trainer

    chunks = grpo_trainer.split_tensor_dict(_generation_like(8, 5), 2)
    assert len(chunks) == 2
    for chunk in chunks:
        assert chunk["beta"].dim() == 0 and chunk["beta"].item() == 0.25, (
            f"{TRL}: split_tensor_dict no longer leaves a 0-dim tensor whole"
        )
        assert chunk["per_token"].shape == (4, 5), f"{TRL}: split_tensor_dict split (B, T) badly"
        torch.testing.assert_close(
            chunk["per_token"][:, 0], chunk["advantages"] * 10, rtol=0, atol=0
        )


class SyntheticGeneration(GRPOTrainer):
    """A generation batch with an extra (B, T) key and a 0-dim one, as MRTPOTrainer adds."""

    def _generate_and_score_completions(self, inputs):
        self.generations = getattr(self, "generations", 0) + 1
        return _generation_like(len(inputs), 5)


def test_prepare_inputs_splits_the_batch_keeps_extra_keys_and_reuses_it(tmp_path):
    trainer = _trainer(
        tmp_path,
        SyntheticGeneration,
        per_device_train_batch_size=2,
        steps_per_generation=2,
        num_iterations=2,
    )
    trainer.model.train()
    rows = [dict(trainer.train_dataset[0])] * 4  # 2 micro-batches of 2 rows
    micro = []
    for step in range(4):  # TRL's training_step counts the micro-steps in self._step
        trainer._step = step
        micro.append(trainer._prepare_inputs(rows))
    assert trainer.generations == 1, f"{TRL}: {trainer.generations} generations for 4 micro-steps"
    assert sorted(torch.cat([m["advantages"] for m in micro[:2]]).tolist()) == [0, 1, 2, 3], (
        f"{TRL}: _prepare_inputs no longer splits the generation batch in steps_per_generation"
    )
    for batch in micro:
        assert batch["beta"].dim() == 0 and batch["beta"].item() == 0.25, (
            f"{TRL}: _prepare_inputs lost or split the 0-dim key"
        )
        assert torch.equal(batch["per_token"][:, 0], batch["advantages"] * 10), (
            f"{TRL}: _prepare_inputs no longer keeps an extra (B, T) key aligned with the rows"
        )
    # The second iteration gets the very same buffered dicts (MRTPOTrainer copies before popping).
    assert micro[2] is micro[0] and micro[3] is micro[1], (
        f"{TRL}: _prepare_inputs no longer returns the buffered micro-batches on reuse"
    )


# ---------------------------------------------------------------------- the loss


class TokenAdvantages(GRPOTrainer):
    """TRL with seeded, non-uniform (B, T) advantages, keeping each micro-batch's loss beside
    the loss by hand, and the metrics each `log` call found."""

    def __init__(self, *args, **kwargs):
        self.losses: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.logged_metrics: list[dict] = []
        super().__init__(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        generator = torch.Generator().manual_seed(0)
        shape = output["completion_ids"].shape
        output["advantages"] = torch.randn(shape, generator=generator) * output["completion_mask"]
        return output

    def _compute_loss(self, model, inputs):
        prompt, completion = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt, completion], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        with torch.no_grad():  # the policy's log-probs of the completion, by hand
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
            logits = logits[:, prompt.shape[1] - 1 : -1].float() / self.temperature
            logps = torch.log_softmax(logits, -1).gather(-1, completion[..., None])[..., 0]
        # DAPO: -sum over trained tokens of min(r A, clip(r, 1 - eps, 1 + eps) A), over their
        # number (one process, one micro-batch per generation batch); r = exp(logp - old).
        mask = inputs["completion_mask"].float()
        old = inputs.get("old_per_token_logps", logps)
        ratio = torch.exp(logps - old)
        clipped = ratio.clamp(1 - self.args.epsilon, 1 + self.args.epsilon)

        def dapo(advantages):
            terms = -torch.min(ratio * advantages, clipped * advantages)
            return (terms * mask).sum() / mask.sum()

        per_token = inputs["advantages"]
        row_mean = (per_token * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)
        loss = super()._compute_loss(model, inputs)
        self.losses.append((loss.detach(), dapo(per_token), dapo(row_mean)))
        return loss

    def log(self, logs, start_time=None):
        if "loss" in logs:  # a step's log (not the run's summary at the end)
            self.logged_metrics.append({k: list(v) for k, v in self._metrics["train"].items()})
        super().log(logs, start_time)


@pytest.fixture(scope="module")
def token_training(tmp_path_factory):
    """Two optimizer steps on one generation batch (two iterations): the second off-policy."""
    trainer = _trainer(
        tmp_path_factory.mktemp("token"),
        TokenAdvantages,
        loss_type="dapo",
        num_iterations=2,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
    )
    trainer.train()
    return trainer


def test_compute_loss_takes_per_token_advantages_token_by_token(token_training):
    assert len(token_training.losses) == 2
    for step, (loss, by_hand, _) in enumerate(token_training.losses):
        torch.testing.assert_close(
            loss,
            by_hand,
            rtol=1e-5,
            atol=1e-6,
            msg=lambda m, step=step: (
                f"{TRL}: micro-batch {step}: _compute_loss with (B, T) "
                f"advantages is no longer DAPO's loss token by token: {m}"
            ),
        )
    # Off-policy (ratios not 1), each row's mean advantage on every token gives another loss:
    # the check tells per-token advantages from per-response ones.
    assert (
        max(abs(by_hand - row_mean).item() for _, by_hand, row_mean in token_training.losses) > 1e-4
    )


def test_training_step_records_step_time(token_training):
    # MRTPOTrainer's log() reads TRL's step times to log the replay's share of the step.
    assert len(token_training.logged_metrics) == 2, "not one log per step"
    for metrics in token_training.logged_metrics:
        times = metrics.get("step_time")
        assert times and all(t > 0 for t in times), (
            f"{TRL}: self._metrics['train']['step_time'] is no longer recorded per step: {metrics}"
        )


# ---------------------------------------------------------------------- mrtpo.sharding


def test_unwrap_model_for_generation_takes_the_keywords_sharding_passes():
    from trl.models.utils import unwrap_model_for_generation

    parameters = inspect.signature(unwrap_model_for_generation).parameters
    for name in (
        "model",
        "accelerator",
        "gather_deepspeed3_params",
        "gradient_checkpointing_kwargs",
    ):
        assert name in parameters, f"{TRL}: unwrap_model_for_generation lost {name!r}"


def test_distributed_backend_tells_zero3_and_fsdp_version(plain):
    from trl.distributed import DistributedBackend

    backend = DistributedBackend(plain.accelerator)
    assert backend.is_zero3 is False and backend.fsdp_version is None, (
        f"{TRL}: DistributedBackend no longer has is_zero3 / fsdp_version (mrtpo.sharding reads them)"
    )
