"""Every combination of settings trains, or is refused before training by name (issues 40, 46).

The crashes this guards against came from combining options a user sets every day (every
completion truncated with `mask_truncated_completions`, TRL's `cache_implementation` beside
the shared prefill, a cache set on the model's own generation config). A seeded sample of
combinations over TRL's options, ours and the model's generation config: each option's values
are cycled through the sample in an order of their own, so every value is tried several times
and beside varied others; a few combinations are added whole (`ADDED`). Each combination trains
two steps on the tiny model, saved to disk and passed by path as users pass one, and must log a
finite loss at both, unless it is one that must be refused (`expected_refusal`): then
`MRTPOConfig` or `MRTPOTrainer` must refuse it, and the message must name that option, parsed
as a name (`named_options`), never as a substring of a longer word. Two tiny models take turns:
the plain one, whose completions all run to the budget (so with `mask_truncated_completions`
every row is masked), and one whose EOS is likely (some rows masked).
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_toys import CPU_RUN, toy_dataset, toy_verifiers

from mrtpo.testing import tiny_model, tiny_model_and_tokenizer, tiny_tokenizer
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
    "mrtpo_beta": (0.5, 0.0, 1.0, "auto"),
    "mrtpo_warmup_steps": (10, 0, 1),
    "replay_information": ("own", "placebo", "generic"),
    "shuffle_token_weights": (False, True),
    "reward_weighting": ("static", "saw"),
    "credit_map_steps": (0, 1),
    "token_relevance": ("replay", "entropy", "contrastive"),
    "bounded_token_advantages": (True, False),
    "num_generations": (4, 2),
}
# Not `MRTPOConfig` fields: which saved tiny model a combination trains ("tiny" never writes
# EOS within a short budget, so with `mask_truncated_completions` every completion is masked;
# "tiny_eos" often does), and the `cache_implementation` saved in that model's own generation
# config (as Gemma's checkpoints ship "hybrid"; transformers' `generate` reads it where the
# config TRL passes leaves it unset).
MODEL_SIDE: dict[str, tuple[Any, ...]] = {
    "model": ("tiny", "tiny_eos"),
    "model_cache_implementation": (None, "static", "dynamic"),
}
COMBINATIONS = 32
SEED = 40

# Two prompts of four completions a generation batch (the placebo needs two), or four of two.
BASE = dict(
    CPU_RUN,
    per_device_train_batch_size=8,
    max_steps=2,
    logging_steps=1,
)
CONFIG_FIELDS = frozenset(field.name for field in dataclasses.fields(MRTPOConfig))


def expected_refusal(combination: dict[str, Any]) -> str | None:
    """The option whose refusal a combination must meet before training, None if it must train
    (in the order `MRTPOConfig` checks them).

    GDPO and GRPO have no beta, so an automatic one trains as their beta 0 (a recipe's `auto`
    under `--advantage_estimator gdpo`). The entropy control replays nothing, so another
    information would go nowhere; contrastive relevance replays the own information against
    the placebo's, so another would replace its own side.
    """
    if (
        combination["token_relevance"] in ("entropy", "contrastive")
        and combination["replay_information"] != "own"
    ):
        return "replay_information"
    return None


def named_options(message: str) -> set[str]:
    """The `MRTPOConfig` options a refusal names, each read as a whole identifier, never as part
    of a longer one (`mrtpo_beta` names `mrtpo_beta`, not `beta`). A name with an underscore
    cannot be an English word by accident; a one-word name (`beta`, `temperature`) counts only
    as an option is written: followed by `=`, ` (` or ` must`, or in backquotes or quotes."""
    named = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_][A-Za-z0-9_]*)(?!\w)", message):
        name = match.group(1)
        if name not in CONFIG_FIELDS:
            continue
        before, after = message[: match.start()], message[match.end() :]
        written = re.match(r"=| \(| must\b", after) or (
            before[-1:] in ("`", "'") and after[:1] == before[-1:]
        )
        if "_" in name or written:
            named.add(name)
    return named


def sample_combinations(count: int, seed: int) -> list[dict[str, Any]]:
    """`count` combinations of OPTIONS and MODEL_SIDE: each column's values repeated in turn to
    `count`, then shuffled by its own seeded draw, so every value appears at least
    count // len(values) times, beside varied others."""
    generator = random.Random(seed)
    columns = {}
    for name, values in {**OPTIONS, **MODEL_SIDE}.items():
        column = [values[i % len(values)] for i in range(count)]
        generator.shuffle(column)
        columns[name] = column
    return [{name: column[i] for name, column in columns.items()} for i in range(count)]


def added(**settings: Any) -> dict[str, Any]:
    """A combination of every option's first value (its default) with `settings` on top."""
    defaults = {name: values[0] for name, values in {**OPTIONS, **MODEL_SIDE}.items()}
    unknown = set(settings) - set(defaults)
    assert not unknown, f"not options of the sweep: {sorted(unknown)}"
    return {**defaults, **settings}


# Combinations that must be tried whatever the draw, each with beta from the first step (no
# warm-up) so that the replay or the entropy control runs.
ADDED = [
    # SAW's per-step weights with the placebo's information (trains).
    added(reward_weighting="saw", replay_information="placebo", mrtpo_warmup_steps=0),
    # A cache on the model's own generation config beside the shared prefill: issue 46's crash,
    # "Passing both cache_implementation ... and cache ... is unsupported", at the first step.
    added(model_cache_implementation="static", mrtpo_warmup_steps=0),
    added(
        model="tiny_eos",
        model_cache_implementation="dynamic",
        token_relevance="entropy",
        mrtpo_warmup_steps=0,
    ),
    # The entropy control with the placebo: refused, naming replay_information.
    added(token_relevance="entropy", replay_information="placebo"),
    # Issue 48's options and issue 50's automatic beta from the first step, with SAW, several
    # micro-batches a step and generations reused (where the probes take their pairs from).
    added(token_relevance="contrastive", mrtpo_warmup_steps=0, reward_weighting="saw"),
    added(replay_information="generic", mrtpo_warmup_steps=0, steps_per_generation=2),
    added(
        mrtpo_beta="auto",
        mrtpo_warmup_steps=0,
        gradient_accumulation_steps=2,
        token_relevance="contrastive",
    ),
    added(
        mrtpo_beta="auto", mrtpo_warmup_steps=0, replay_information="placebo", share_prompt=False
    ),
]
COMBINATIONS_TRIED = sample_combinations(COMBINATIONS, SEED) + ADDED


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[tuple[str, str | None], Path]:
    """{(model, model_cache_implementation) of MODEL_SIDE: its Hugging Face folder}. "tiny" is
    the tiny model; "tiny_eos" the tiny model with its own output matrix, whose EOS row gives a
    logit of 5 on the prompts' mean final hidden state: a third to two thirds of its 6-token
    completions end. Each is saved once per cache, that cache in its `generation_config.json`."""
    tokenizer = tiny_tokenizer()
    plain, _ = tiny_model_and_tokenizer(seed=0)
    eos = tiny_model(len(tokenizer), seed=0, tied=False)
    chats = [row["prompt"] for row in toy_dataset()]
    texts = tokenizer.apply_chat_template(chats, tokenize=False, add_generation_prompt=True)
    inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        hidden = eos.model(**inputs).last_hidden_state[inputs.attention_mask.bool()]
        mean = hidden.mean(dim=0)
        eos.lm_head.weight[tokenizer.eos_token_id] = 5.0 * mean / mean.square().sum()
    folders = {}
    for name, model in (("tiny", plain), ("tiny_eos", eos)):
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        for cache in MODEL_SIDE["model_cache_implementation"]:
            model.generation_config.cache_implementation = cache
            path = tmp_path_factory.mktemp(f"{name}-{cache or 'no'}-cache")
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            folders[name, cache] = path
    return folders


def test_the_sample_tries_every_value_of_every_option():
    sampled = COMBINATIONS_TRIED[:COMBINATIONS]
    for name, values in {**OPTIONS, **MODEL_SIDE}.items():
        tried = [combination[name] for combination in sampled]
        assert all(tried.count(value) >= COMBINATIONS // len(values) for value in values), name
    # Both branches run: combinations that must train and ones that must be refused.
    refused = [c for c in COMBINATIONS_TRIED if expected_refusal(c)]
    assert 1 <= len(refused) < len(COMBINATIONS_TRIED) // 2, len(refused)
    assert any(
        c["reward_weighting"] == "saw" and c["replay_information"] == "placebo"
        for c in COMBINATIONS_TRIED
        if not expected_refusal(c)
    )


def test_named_options_reads_names_never_parts_of_words():
    assert named_options("mrtpo_beta must be in [0, 1], got 1.5") == {"mrtpo_beta"}
    assert named_options("beta grows linearly with the step's beta") == set()
    assert named_options("beta must be >= 0") == {"beta"}
    assert named_options("got `temperature` and 'beta'") == {"temperature", "beta"}
    assert named_options("generation_batch_size (8) must be divisible by num_generations (3).") == {
        "generation_batch_size",
        "num_generations",
    }
    assert named_options("self.beta and betas_x and num_generations2") == set()


# Refused before training, each naming the option that must change (the message may name the
# other option of the conflict too): (settings over BASE, the option).
MUST_REFUSE = [
    ({"token_relevance": "entropy", "replay_information": "placebo"}, "replay_information"),
    ({"token_relevance": "uncertainty"}, "token_relevance"),
    ({"reward_weighting": "saw", "reward_weights": [1.0, 2.0, 1.0]}, "reward_weights"),
    ({"saw_reward_shifts": [0.0, 0.0, 0.0]}, "saw_reward_shifts"),  # static weights: no shifts
    ({"reward_weighting": "saw", "saw_reward_shifts": [0.0]}, "saw_reward_shifts"),  # 3 rewards
    (
        {"advantage_estimator": "grpo", "multi_objective_aggregation": "normalize_then_sum"},
        "multi_objective_aggregation",
    ),
    ({"num_generations": 3}, "num_generations"),  # 8 rows a batch: not whole groups
    ({"mrtpo_beta": 1.5}, "mrtpo_beta"),
    ({"token_relevance": "contrastive", "replay_information": "generic"}, "replay_information"),
    ({"replay_batch_size": 0}, "replay_batch_size"),
]


@pytest.mark.parametrize("settings, option", MUST_REFUSE, ids=[option for _, option in MUST_REFUSE])
def test_refused_combinations_name_the_option(settings, option, model_dirs, tmp_path):
    with pytest.raises(ValueError) as refusal:
        args = MRTPOConfig(output_dir=str(tmp_path / "run"), **BASE, **settings)
        MRTPOTrainer(
            model=str(model_dirs["tiny", None]),
            reward_funcs=toy_verifiers(),
            args=args,
            train_dataset=toy_dataset(),
        )
    assert option in named_options(str(refusal.value)), str(refusal.value)


@pytest.mark.parametrize(
    "combination",
    COMBINATIONS_TRIED,
    ids=[f"combination{i}" for i in range(COMBINATIONS)] + [f"added{i}" for i in range(len(ADDED))],
)
def test_settings_train_or_are_refused_up_front(combination, model_dirs, tmp_path):
    settings = {name: value for name, value in combination.items() if name not in MODEL_SIDE}
    model = model_dirs[combination["model"], combination["model_cache_implementation"]]
    refused_for = expected_refusal(combination)
    try:
        args = MRTPOConfig(output_dir=str(tmp_path / "run"), **BASE, **settings)
        trainer = MRTPOTrainer(
            model=str(model), reward_funcs=toy_verifiers(), args=args, train_dataset=toy_dataset()
        )
    except ValueError as refusal:
        assert refused_for is not None, f"refused a combination that must train: {refusal}"
        assert refused_for in named_options(str(refusal)), f"{refused_for} not named: {refusal}"
        return
    assert refused_for is None, f"trains, but must be refused for {refused_for}"
    assert (
        trainer.model.generation_config.cache_implementation
        == (combination["model_cache_implementation"])
    )  # the model's own setting reached the trainer
    trainer.train()
    losses = [line["loss"] for line in trainer.state.log_history if "loss" in line]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses), losses
