"""Every combination of settings trains, or is refused before training by name (issue 40).

The crashes this guards against came from combining options a user sets every day (every
completion truncated with `mask_truncated_completions`, TRL's `cache_implementation` beside
the shared prefill). A seeded sample of combinations over TRL's options and ours: each option's
values are cycled through the sample in an order of their own, so every value is tried several
times and beside varied others. Each combination trains two steps on the tiny model, saved to
disk and passed by path as users pass one, and must log a finite loss at both, or be refused by
`MRTPOConfig` or `MRTPOTrainer` with a message that names one of its options. Two tiny models
take turns: the plain one, whose completions all run to the budget (so with
`mask_truncated_completions` every row is masked), and one whose EOS is likely (some rows
masked).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_toys import CPU_RUN, toy_dataset, toy_verifiers

from mrtpo.testing import tiny_model, tiny_tokenizer
from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# The first value of each is the default (or the usual setting).
OPTIONS: dict[str, tuple[Any, ...]] = {
    # TRL's
    "loss_type": ("dapo", "grpo", "bnpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo"),
    "scale_rewards": ("group", "batch", "none"),
    "num_iterations": (1, 2),
    "steps_per_generation": (1, 2),
    "gradient_accumulation_steps": (1, 2),
    "beta": (0.0, 0.04),
    "temperature": (1.0, 0.7),
    "top_p": (1.0, 0.9),
    "cache_implementation": (None, "dynamic", "static"),
    "mask_truncated_completions": (False, True),
    "top_entropy_quantile": (1.0, 0.5),
    "importance_sampling_level": ("token", "sequence"),
    "gradient_checkpointing": (False, True),
    "max_completion_length": (6, 2),
    # ours
    "advantage_estimator": ("mrtpo", "gdpo", "grpo"),
    "share_prompt": (True, False),
    "mrtpo_beta": (0.5, 0.0, 1.0),
    "mrtpo_warmup_steps": (10, 0, 1),
    "replay_information": ("own", "placebo"),
    "shuffle_token_weights": (False, True),
    "reward_weighting": ("static", "saw"),
    "credit_map_steps": (0, 1),
}
# Which saved tiny model a combination trains: "tiny" never writes EOS within a short budget
# (with `mask_truncated_completions` every completion is masked), "tiny_eos" often does.
MODELS = ("tiny", "tiny_eos")
COMBINATIONS = 32
SEED = 40

# Two prompts of four completions a generation batch (the placebo needs two).
BASE = dict(
    CPU_RUN,
    per_device_train_batch_size=8,
    num_generations=4,
    max_steps=2,
    logging_steps=1,
)


def sample_combinations(count: int, seed: int) -> list[dict[str, Any]]:
    """`count` combinations of OPTIONS and a model: each column's values repeated in turn to
    `count`, then shuffled by its own seeded draw, so every value appears at least
    count // len(values) times, beside varied others."""
    generator = random.Random(seed)
    columns = {}
    for name, values in {**OPTIONS, "model": MODELS}.items():
        column = [values[i % len(values)] for i in range(count)]
        generator.shuffle(column)
        columns[name] = column
    return [{name: column[i] for name, column in columns.items()} for i in range(count)]


COMBINATIONS_TRIED = sample_combinations(COMBINATIONS, SEED)


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    """{name in MODELS: its Hugging Face folder}. "tiny_eos" is the tiny model with its own
    output matrix, whose EOS row gives a logit of 5 on the prompts' mean final hidden state:
    a third to two thirds of its 6-token completions end."""
    tokenizer = tiny_tokenizer()
    model = tiny_model(len(tokenizer), seed=0, tied=False)
    chats = [row["prompt"] for row in toy_dataset()]
    texts = tokenizer.apply_chat_template(chats, tokenize=False, add_generation_prompt=True)
    inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        hidden = model.model(**inputs).last_hidden_state[inputs.attention_mask.bool()]
        mean = hidden.mean(dim=0)
        model.lm_head.weight[tokenizer.eos_token_id] = 5.0 * mean / mean.square().sum()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    path = tmp_path_factory.mktemp("tiny-eos")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return {"tiny": tiny_model_dir, "tiny_eos": path}


def test_the_sample_tries_every_value_of_every_option():
    for name, values in {**OPTIONS, "model": MODELS}.items():
        tried = [combination[name] for combination in COMBINATIONS_TRIED]
        assert all(tried.count(value) >= COMBINATIONS // len(values) for value in values), name


@pytest.mark.parametrize(
    "combination", COMBINATIONS_TRIED, ids=[f"combination{i}" for i in range(COMBINATIONS)]
)
def test_settings_train_or_are_refused_up_front(combination, model_dirs, tmp_path):
    settings = {name: value for name, value in combination.items() if name != "model"}
    try:
        args = MRTPOConfig(output_dir=str(tmp_path / "run"), **BASE, **settings)
        trainer = MRTPOTrainer(
            model=str(model_dirs[combination["model"]]),
            reward_funcs=toy_verifiers(),
            args=args,
            train_dataset=toy_dataset(),
        )
    except ValueError as refusal:
        named = [name for name in settings if name in str(refusal)]
        assert named, f"refused without naming an option: {refusal}"
        return
    trainer.train()
    losses = [line["loss"] for line in trainer.state.log_history if "loss" in line]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses), losses
