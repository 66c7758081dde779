"""`share_prompt` in the trainer: the same run as TRL's per-row path, up to rounding.

Each prompt runs once for its group in the loss's forward and backward, the old-policy and the
reference log-probs and generation's prefill (`mrtpo.shared_prompt`, whose own exactness tests
are in tests/test_shared_prompt.py); micro-batches hold whole groups and their own padding.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from trainer_toys import toy_dataset, toy_verifiers
from transformers import LlamaConfig, LlamaForCausalLM

import mrtpo.shared_prompt
from mrtpo.shared_prompt import SharedPrefillGenerate
from mrtpo.testing import tiny_model_and_tokenizer
from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

COMMON = dict(
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=10,
    max_steps=2,
    report_to=[],
    use_cpu=True,
    bf16=False,
    save_strategy="no",
    seed=0,
    disable_tqdm=True,
    learning_rate=1e-3,
    mrtpo_warmup_steps=0,
)


class Watching(MRTPOTrainer):
    """Counts the packed forwards and keeps every micro-batch that reaches the loss."""

    def __init__(self, *args, **kwargs):
        self.micro_batches: list[dict] = []
        super().__init__(*args, **kwargs)

    def _compute_loss(self, model, inputs):
        self.micro_batches.append({k: v for k, v in inputs.items() if torch.is_tensor(v)})
        return super()._compute_loss(model, inputs)


def train(tmp_path, share: bool, model=None, peft_config=None, **overrides) -> Watching:
    if model is None:
        model, tokenizer = tiny_model_and_tokenizer(seed=0)
    else:
        tokenizer = tiny_model_and_tokenizer(seed=0)[1]
    args = MRTPOConfig(
        output_dir=str(tmp_path / f"share-{share}"),
        **{**COMMON, **overrides},
        share_prompt=share,
    )
    trainer = Watching(
        model=model,
        reward_funcs=toy_verifiers(),
        args=args,
        train_dataset=toy_dataset(),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.train()
    return trainer


def logged(trainer) -> list[dict]:
    return [line for line in trainer.state.log_history if "loss" in line]


def assert_same_run(shared, per_row, keys=("reward", "loss", "grad_norm", "entropy")):
    a, b = logged(shared), logged(per_row)
    assert len(a) == len(b) > 0
    for step, (x, y) in enumerate(zip(a, b, strict=True)):
        assert set(x) == set(y)
        for key in (key for key in keys if key in x):  # a step without generation: no reward
            # The losses are sums of terms that cancel (GRPO's is ~0): compare them on the scale
            # of their terms, the grad norm relatively.
            assert x[key] == pytest.approx(y[key], rel=1e-4, abs=1e-6), f"step {step}: {key}"
        assert "loss" in x and "grad_norm" in x


@pytest.fixture
def packed_calls(monkeypatch):
    calls = []
    original = mrtpo.shared_prompt.shared_prompt_logps

    def counting(*args, **kwargs):
        result = original(*args, **kwargs)
        calls.append(result.fallback)
        return result

    monkeypatch.setattr(mrtpo.shared_prompt, "shared_prompt_logps", counting)
    return calls


@pytest.mark.parametrize("estimator", ["mrtpo", "gdpo", "grpo"])
def test_sharing_gives_the_per_row_run(tmp_path, estimator, packed_calls):
    shared = train(tmp_path, True, max_steps=3, advantage_estimator=estimator)
    assert shared._shares_prompt and len(packed_calls) >= 3 and None in packed_calls
    per_row = train(tmp_path, False, max_steps=3, advantage_estimator=estimator)
    assert not per_row._shares_prompt
    assert_same_run(shared, per_row)


@pytest.mark.parametrize(
    "settings",
    [
        # old-policy log-probs: each generation is trained on twice
        dict(num_iterations=2, per_device_train_batch_size=4, gradient_accumulation_steps=2),
        # reference log-probs (a reference model beside the policy)
        dict(beta=0.04),
    ],
    ids=["old-policy", "reference"],
)
def test_old_policy_and_reference_log_probs_are_shared_too(tmp_path, settings, packed_calls):
    model = None
    if "beta" in settings:  # TRL loads the reference model from the policy's folder
        model, tokenizer = tiny_model_and_tokenizer(seed=0)
        model.save_pretrained(tmp_path / "tiny")
        tokenizer.save_pretrained(tmp_path / "tiny")
        model = str(tmp_path / "tiny")
    shared = train(tmp_path, True, model=model, **settings)
    if "beta" in settings:
        assert shared.ref_model.config._attn_implementation == "mrtpo_shared_prompt"
    generation_time = len(packed_calls)
    per_row = train(tmp_path, False, model=model, **settings)
    assert generation_time > len(shared.micro_batches)  # more than the losses' forwards
    keys = ("reward", "loss", "grad_norm") + (("kl",) if "beta" in settings else ())
    assert_same_run(shared, per_row, keys)
    # Rows reach the loss in another order (whole groups): match them by prompt and completion.
    key = "old_per_token_logps" if "num_iterations" in settings else "ref_per_token_logps"
    expected = dict(_rows(per_row.micro_batches, key))
    got = list(_rows(shared.micro_batches, key))
    rows = sum(len(batch["completion_ids"]) for batch in per_row.micro_batches)
    assert len(got) == rows and {k for k, _ in got} <= set(expected)
    for row_key, logps in got:
        torch.testing.assert_close(logps, expected[row_key], rtol=1e-5, atol=1e-5)


def _rows(micro_batches, key):
    """((prompt ids, completion ids), the row's `key` log-probs on its completion tokens)."""
    for batch in micro_batches:
        for i in range(len(batch["completion_ids"])):
            mask = batch["completion_mask"][i].bool()
            prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()]
            row_key = (tuple(prompt.tolist()), tuple(batch["completion_ids"][i][mask].tolist()))
            yield row_key, batch[key][i][: mask.numel()][mask]


def test_micro_batches_hold_whole_groups_and_their_own_padding(tmp_path):
    # 2 groups a generation, one group a micro-batch: a row shuffle would mix them.
    trainer = train(
        tmp_path,
        True,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        steps_per_generation=2,
        max_steps=3,
    )
    assert len(trainer.micro_batches) == 6
    for batch in trainer.micro_batches:
        prompts = {
            tuple(ids[mask.bool()].tolist())
            for ids, mask in zip(batch["prompt_ids"], batch["prompt_mask"], strict=True)
        }
        assert len(prompts) == 1  # the four completions of one prompt
        # No column that every row pads: the micro-batch's own longest prompt and completion.
        assert batch["prompt_mask"][:, 0].any() and batch["completion_mask"][:, -1].any()
        assert batch["advantages"].shape[-1] == batch["completion_ids"].shape[1]


def test_peft_sharing_gives_the_per_row_run(tmp_path):
    peft = pytest.importorskip("peft")

    def lora():
        return peft.LoraConfig(
            r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM", init_lora_weights=False
        )

    shared = train(tmp_path, True, model=tiny_model_and_tokenizer(seed=0)[0], peft_config=lora())
    assert shared._shares_prompt
    per_row = train(tmp_path, False, model=tiny_model_and_tokenizer(seed=0)[0], peft_config=lora())
    assert_same_run(shared, per_row)


def test_unsupported_model_falls_back_with_a_logged_reason(tmp_path, caplog):
    model, _ = tiny_model_and_tokenizer(seed=0)
    model.set_attn_implementation("eager")
    with caplog.at_level(logging.WARNING, logger="mrtpo.trainer"):
        trainer = train(tmp_path, True, model=model, max_steps=1)
    assert not trainer._shares_prompt
    assert "falling back to TRL's per-row path" in caplog.text and "eager" in caplog.text


def test_micro_batches_whose_every_completion_is_masked_train_and_evaluate(tmp_path):
    # A 2-token budget cuts every completion of the tiny model; `mask_truncated_completions`
    # then masks them all, and trimming the padding must still leave a completion column.
    settings = dict(max_completion_length=2, mask_truncated_completions=True, max_steps=1)
    runs = {share: train(tmp_path, share, **settings) for share in (True, False)}
    assert runs[True]._shares_prompt
    for batch in runs[True].micro_batches:
        assert not batch["completion_mask"].any() and batch["completion_ids"].shape[1] == 1
    assert logged(runs[True])[0]["completions/clipped_ratio"] == 1.0
    assert_same_run(runs[True], runs[False])
    evaluations = {share: run.evaluate(toy_dataset()) for share, run in runs.items()}
    assert evaluations[True]["eval_loss"] == evaluations[False]["eval_loss"] == 0.0
    assert evaluations[True]["eval_completions/clipped_ratio"] == 1.0


@pytest.mark.parametrize("cache_implementation", ["dynamic", "static"])
def test_trl_cache_implementation_trains_with_sharing(tmp_path, cache_implementation):
    settings = dict(max_steps=1, cache_implementation=cache_implementation)
    shared = train(tmp_path, True, **settings)
    assert shared._shares_prompt
    assert_same_run(shared, train(tmp_path, False, **settings))


@pytest.mark.parametrize(
    "cache_implementation, relevance",
    [("dynamic", "replay"), ("static", "replay"), ("hybrid", "replay"), ("static", "entropy")],
)
def test_a_cache_set_on_the_models_generation_config_trains_with_sharing(
    tmp_path, caplog, cache_implementation, relevance
):
    """A checkpoint's own `generation_config.json` may set `cache_implementation` (Gemma's ship
    "hybrid"); TRL's config leaves it unset and `generate` fills it from the model's. "dynamic"
    and "hybrid" (which `generate` drops) keep the shared prefill, "static" generates plainly
    (logged once); each trains as the per-row path does, the entropy control too."""
    settings = dict(max_steps=1)
    if relevance == "entropy":
        settings.update(token_relevance="entropy", mrtpo_beta=1.0)
    runs = {}
    mrtpo.shared_prompt._log_plain_generation.cache_clear()
    for share in (True, False):
        model, _ = tiny_model_and_tokenizer(seed=0)
        model.generation_config.cache_implementation = cache_implementation
        with caplog.at_level(logging.WARNING, logger="mrtpo.shared_prompt"):
            runs[share] = train(tmp_path, share, model=model, **settings)
        assert model.generation_config.cache_implementation == cache_implementation
    assert runs[True]._shares_prompt
    assert_same_run(runs[True], runs[False])
    line = "cache_implementation='static' (set in the model's generation_config)"
    assert caplog.text.count(line) == (cache_implementation == "static")


def test_reference_model_on_another_attention_falls_back_before_installing(tmp_path, caplog):
    # The policy passed on sdpa; TRL loads the reference from its folder with
    # `model_init_kwargs`, here on eager attention, which shared prompts do not serve.
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    policy = type(model).from_pretrained(tmp_path / "tiny", attn_implementation="sdpa")
    settings = dict(max_steps=1, beta=0.04, model_init_kwargs={"attn_implementation": "eager"})
    with caplog.at_level(logging.WARNING, logger="mrtpo.trainer"):
        trainer = train(tmp_path, True, model=policy, **settings)
    assert not trainer._shares_prompt
    assert "per-row path (reference model)" in caplog.text and "'eager'" in caplog.text
    assert trainer.ref_model.config._attn_implementation == "eager"
    assert trainer.model.config._attn_implementation == "sdpa"  # nothing installed
    assert not isinstance(vars(trainer.model).get("generate"), SharedPrefillGenerate)
    assert logged(trainer)[0]["kl"] >= 0.0


def test_dynamic_rope_falls_back_with_a_logged_reason(tmp_path, caplog):
    settings = tiny_model_and_tokenizer(seed=0)[0].config.to_dict()
    settings.pop("rope_parameters", None)
    model = LlamaForCausalLM(
        LlamaConfig(**settings, rope_scaling=dict(rope_type="dynamic", factor=2.0))
    )
    assert model.config.rope_parameters["rope_type"] == "dynamic"
    with caplog.at_level(logging.WARNING, logger="mrtpo.trainer"):
        trainer = train(tmp_path, True, model=model, max_steps=1)
    assert not trainer._shares_prompt
    assert "rope_type 'dynamic'" in caplog.text
    assert math.isfinite(logged(trainer)[0]["loss"])
