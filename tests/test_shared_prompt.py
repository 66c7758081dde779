"""Shared prompts (`mrtpo.shared_prompt`) against the per-row path they replace.

The per-row reference is TRL's own `GRPOTrainer._get_per_token_logps_and_entropies` (the model
on the concatenated rows, through TRL's fused LM head). Models are tiny, seeded and fp32, with
grouped-query attention (2 key/value heads for 4 query heads) so the key/value repetition is
exercised; Qwen2 adds the q/k/v biases.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
from types import SimpleNamespace

import peft
import pytest
import torch
from transformers import (
    CLIPVisionConfig,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    LlavaConfig,
    LlavaForConditionalGeneration,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

import mrtpo.shared_prompt
from mrtpo.shared_prompt import (
    ATTENTION_NAME,
    SharedPrefillGenerate,
    check_supported,
    generate_with_shared_prefill,
    install_shared_prefill,
    install_shared_prompt_attention,
    prompt_groups,
    shared_prompt_logps,
    shuffle_groups,
    trim_padding,
)

VOCAB = 101
TEMPERATURE = 0.7
PAD = 0

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _config(family: str, **overrides):
    sizes = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=PAD,
        eos_token_id=2,
    )
    sizes.update(overrides)
    return LlamaConfig(**sizes) if family == "llama" else Qwen2Config(**sizes)


def _model(family: str = "llama", fused: bool = True, seed: int = 0):
    """A tiny seeded model with TRL's fused head (as GRPOTrainer builds it) and the attention."""
    torch.manual_seed(seed)
    config = _config(family)
    model = LlamaForCausalLM(config) if family == "llama" else Qwen2ForCausalLM(config)
    if fused:
        add_fused_lm_head(model, temperature=TEMPERATURE, outputs=("log_probs", "entropy"))
    install_shared_prompt_attention(model)
    model.train()
    return model


def _batch(prompt_lengths, completion_lengths, prompt_width=None, completion_width=None, seed=1):
    """Rows of groups: ``prompt_lengths`` one per group, ``completion_lengths`` a list per group.

    Prompts left-padded (with random pad ids, which must not matter), completions right-padded.
    """
    generator = torch.Generator().manual_seed(seed)
    rows = sum(len(lengths) for lengths in completion_lengths)
    width = prompt_width or max(prompt_lengths)
    columns = completion_width or max(max(lengths) for lengths in completion_lengths)
    prompt_ids = torch.randint(3, VOCAB, (rows, width), generator=generator)
    prompt_mask = torch.zeros(rows, width, dtype=torch.long)
    completion_ids = torch.randint(3, VOCAB, (rows, columns), generator=generator)
    completion_mask = torch.zeros(rows, columns, dtype=torch.long)
    row = 0
    for length, lengths in zip(prompt_lengths, completion_lengths, strict=True):
        prompt = torch.randint(3, VOCAB, (length,), generator=generator)
        for n in lengths:
            prompt_ids[row, width - length :] = prompt
            prompt_mask[row, width - length :] = 1
            completion_mask[row, :n] = 1
            completion_ids[row, n:] = PAD
            row += 1
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def _per_row(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """TRL's per-row path itself (its profiling wrapper removed; no accelerator needed)."""
    trainer = SimpleNamespace(accelerator=SimpleNamespace(autocast=contextlib.nullcontext))
    logps, entropies, _ = GRPOTrainer._get_per_token_logps_and_entropies.__wrapped__(
        trainer,
        model,
        torch.cat([prompt_ids, completion_ids], dim=1),
        torch.cat([prompt_mask, completion_mask], dim=1),
        completion_ids.size(1),
        compute_entropy=True,
    )
    return logps, entropies


def _shared(model, *batch):
    result = shared_prompt_logps(model, *batch, compute_entropy=True)
    assert result.fallback is None
    return result.logps, result.entropies


def _gradients(model, logps_of, weights):
    model.zero_grad()
    (logps_of() * weights).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(model, batch, weights):
    per_row, per_row_entropy = _per_row(model, *batch)
    shared, shared_entropy = _shared(model, *batch)
    assert shared.shape == per_row.shape == batch[2].shape
    assert (per_row[batch[3] == 1] < 0).all()  # real log-probs where scored ...
    assert (per_row[batch[3] == 0] == 0).all()  # ... zero on padding
    torch.testing.assert_close(shared, per_row, rtol=0, atol=1e-5)
    torch.testing.assert_close(shared_entropy, per_row_entropy, rtol=0, atol=1e-5)
    expected = _gradients(model, lambda: _per_row(model, *batch)[0], weights)
    got = _gradients(model, lambda: _shared(model, *batch)[0], weights)
    assert expected.keys() == got.keys() and expected
    for name, gradient in expected.items():
        assert gradient.norm() > 0, name
        error = (got[name] - gradient).norm() / gradient.norm()
        assert error < 1e-4, (name, error.item())


# Two groups with prompts of different lengths (left padding), completions of different lengths;
# then uneven groups and a lone row (a group cut by a micro-batch edge).
LAYOUTS = {
    "two_groups": ([5, 9], [[6, 3, 5], [1, 6, 4]]),
    "uneven_groups": ([7, 4, 6], [[2, 5, 3, 5], [4, 4], [3]]),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("checkpointing", [False, True], ids=["no_ckpt", "ckpt"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_shared_prompt_equals_per_row(family, checkpointing, layout):
    model = _model(family)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = _batch(*LAYOUTS[layout])
    weights = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(2))
    _assert_same(model, batch, weights)


def test_reentrant_checkpointing_with_a_frozen_embedding():
    """TRL's other checkpointing mode (PEFT + DeepSpeed forces it): the layers' inputs need
    gradients for the reentrant recomputation, as with a frozen embedding."""
    model = _model()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.enable_input_require_grads()
    model.get_input_embeddings().weight.requires_grad_(False)
    batch = _batch(*LAYOUTS["two_groups"])
    _assert_same(model, batch, torch.randn(batch[2].shape))


def test_lora_matches_per_row():
    model = _model()
    model = peft.get_peft_model(
        model,
        peft.LoraConfig(
            r=4,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj"],
            init_lora_weights=False,  # random A and B, so every LoRA gradient is non-zero
        ),
    )
    model.train()
    batch = _batch(*LAYOUTS["two_groups"])
    _assert_same(model, batch, torch.randn(batch[2].shape, generator=torch.Generator()))
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)


def test_under_autocast_agrees_to_bf16_precision():
    """Under bf16 autocast (how TRL runs its forward) both paths round differently; they agree
    to bf16's resolution and the log-probs stay fp32 (the fused head's)."""
    model = _model()
    batch = _batch(*LAYOUTS["two_groups"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        per_row, _ = _per_row(model, *batch)
        shared, _ = _shared(model, *batch)
    assert shared.dtype == torch.float32
    exact, _ = _per_row(model, *batch)
    bf16_error = (per_row - exact).abs().max()
    assert 0 < bf16_error < 0.1
    assert (shared - per_row).abs().max() < 2 * bf16_error


def test_temperature_is_the_fused_heads():
    """The fused head's log-probs are log_softmax(logits / T) in fp32: checked on the packed
    path against the plain model's logits."""
    model = _model()
    plain = _model(fused=False)
    batch = _batch(*LAYOUTS["two_groups"])
    shared, _ = _shared(model, *batch)
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch
    logits = plain(
        input_ids=torch.cat([prompt_ids, completion_ids], 1),
        attention_mask=torch.cat([prompt_mask, completion_mask], 1),
    ).logits[:, prompt_ids.size(1) - 1 : -1]
    expected = torch.log_softmax(logits.float() / TEMPERATURE, dim=-1)
    expected = expected.gather(-1, completion_ids[..., None])[..., 0] * completion_mask
    torch.testing.assert_close(shared, expected, rtol=0, atol=1e-5)


def test_prompt_groups():
    prompt_ids, prompt_mask, _, _ = _batch([5, 9, 5], [[1, 1, 1], [1, 1], [1]], prompt_width=11)
    assert prompt_groups(prompt_ids, prompt_mask) == [3, 2, 1]  # the third prompt differs
    same = prompt_ids.clone()
    same[5] = same[0]
    assert prompt_groups(same, prompt_mask) == [3, 2, 1]  # not adjacent: its own group
    same[3:] = same[0]  # the last three rows now carry the first prompt (and padding ids vary)
    same[3:, :4] = torch.tensor([7, 8, 9, 10])
    assert prompt_groups(same, prompt_mask.clone().copy_(prompt_mask[0])) == [6]
    with pytest.raises(ValueError, match="left-padded"):
        prompt_groups(prompt_ids, prompt_mask.flip(1))


def test_no_shared_prompt_falls_back():
    model = _model()
    batch = _batch([4, 5, 6], [[3], [2], [4]])
    result = shared_prompt_logps(model, *batch)
    assert result == (None, None, "no two rows share a prompt")


def test_refusals():
    with pytest.raises(ValueError, match="sliding-window"):
        config = _config("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=1)
        check_supported(Qwen2ForCausalLM(config))
    text = _config("llama")
    vision = CLIPVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=8,
        patch_size=4,
    )
    vlm = LlavaForConditionalGeneration(LlavaConfig(text_config=text, vision_config=vision))
    with pytest.raises(ValueError, match="vision inputs"):
        check_supported(vlm)
    with pytest.raises(ValueError, match="sdpa attention"):
        check_supported(
            LlamaForCausalLM._from_config(_config("llama"), attn_implementation="eager")
        )
    torch.manual_seed(0)
    uninstalled = LlamaForCausalLM(text)
    add_fused_lm_head(uninstalled)
    with pytest.raises(ValueError, match="install_shared_prompt_attention"):
        shared_prompt_logps(uninstalled, *_batch([4], [[2, 3]]))
    with pytest.raises(ValueError, match="fused LM head"):
        shared_prompt_logps(_model(fused=False), *_batch([4], [[2, 3]]))


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_rope_that_depends_on_the_length_is_refused(rope_type):
    # Its frequencies follow the largest position id: a packed group's is not its rows'.
    scaling = dict(rope_type=rope_type, factor=2.0, original_max_position_embeddings=128)
    if rope_type == "longrope":
        scaling.update(short_factor=[1.0] * 4, long_factor=[2.0] * 4)
    with pytest.raises(ValueError, match=f"rope_type '{rope_type}' recomputes them"):
        check_supported(LlamaForCausalLM(_config("llama", rope_scaling=scaling)))
    linear = dict(rope_type="linear", factor=2.0)
    check_supported(LlamaForCausalLM(_config("llama", rope_scaling=linear)))


def test_installed_attention_leaves_other_forwards_alone():
    """Without a layout the installed attention is sdpa: same logits for a padded batch."""
    torch.manual_seed(0)
    before = LlamaForCausalLM(_config("llama")).eval()
    after = LlamaForCausalLM(_config("llama")).eval()
    after.load_state_dict(before.state_dict())
    install_shared_prompt_attention(after)
    assert after.config._attn_implementation == ATTENTION_NAME
    assert before.config._attn_implementation == "sdpa"
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch([5, 9], [[2, 3], [4]])
    inputs = dict(
        input_ids=torch.cat([prompt_ids, completion_ids], 1),
        attention_mask=torch.cat([prompt_mask, completion_mask], 1),
    )
    torch.testing.assert_close(after(**inputs).logits, before(**inputs).logits, rtol=0, atol=0)


def test_trim_padding():
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch(
        [5, 7], [[3, 2], [4, 1]], prompt_width=12, completion_width=9
    )
    rows = prompt_ids.size(0)
    batch = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.randn(rows, 9),  # MRTPO's (B, T)
        "old_per_token_logps": torch.randn(rows, 9),
        "tool_mask": torch.ones(rows, 9, dtype=torch.long),
        "sequence_advantages": torch.randn(rows),  # (B,): untouched
        "importance_sampling_ratio": torch.rand(rows, 1),  # sequence-level: untouched
        "num_items_in_batch": torch.tensor(10),
        "ref_per_token_logps": None,
    }
    trimmed = trim_padding(batch)
    assert trimmed["prompt_ids"].shape == (rows, 7) and trimmed["prompt_mask"].all(dim=0).any()
    assert torch.equal(trimmed["prompt_ids"], prompt_ids[:, 5:])
    assert torch.equal(trimmed["prompt_mask"], prompt_mask[:, 5:])
    assert int(trimmed["prompt_mask"].sum()) == int(prompt_mask.sum())
    for key in ("completion_ids", "completion_mask", "advantages", "old_per_token_logps"):
        assert torch.equal(trimmed[key], batch[key][:, :4]), key
    assert trimmed["tool_mask"].shape == (rows, 4)
    for key in ("sequence_advantages", "importance_sampling_ratio", "num_items_in_batch"):
        assert trimmed[key] is batch[key]
    assert trimmed["ref_per_token_logps"] is None
    # The cut columns were padding: the per-row log-probs are the same.
    model = _model()
    full, _ = _per_row(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
    cut, _ = _per_row(
        model,
        *(trimmed[k] for k in ("prompt_ids", "prompt_mask")),
        *(trimmed[k] for k in ("completion_ids", "completion_mask")),
    )
    torch.testing.assert_close(cut, full[:, :4], rtol=0, atol=1e-5)
    assert (full[:, 4:] == 0).all()


def test_trim_padding_keeps_a_completion_column_when_every_completion_is_masked():
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch(
        [5, 7], [[3, 2], [4, 1]], prompt_width=12, completion_width=9
    )
    masked = completion_mask.zero_()  # all truncated, with `mask_truncated_completions`
    trimmed = trim_padding(
        {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_mask": masked}
    )
    assert trimmed["completion_mask"].shape == (prompt_ids.size(0), 1)
    assert trimmed["prompt_ids"].shape == (prompt_ids.size(0), 7)


def test_shuffle_groups():
    rows, group = 12, 3
    batch = {
        "prompt_ids": torch.arange(rows)[:, None].expand(-1, 4),
        "advantages": torch.arange(rows, dtype=torch.float),
        "prompts": [f"row {i}" for i in range(rows)],
        "num_items_in_batch": torch.tensor(7),
        "ref_per_token_logps": None,
    }
    shuffled = shuffle_groups(batch, group, torch.Generator().manual_seed(0))
    order = shuffled["prompt_ids"][:, 0]
    groups = order.view(-1, group)
    assert torch.equal(groups - groups[:, :1], torch.arange(group).expand(rows // group, -1))
    assert torch.equal(groups[:, 0] % group, torch.zeros(rows // group, dtype=torch.long))
    assert sorted(order.tolist()) == list(range(rows))
    assert not torch.equal(order, torch.arange(rows))  # seed 0 moves the groups
    assert torch.equal(shuffled["advantages"].long(), order)
    assert shuffled["prompts"] == [f"row {i}" for i in order.tolist()]
    assert shuffled["num_items_in_batch"] is batch["num_items_in_batch"]
    assert shuffled["ref_per_token_logps"] is None
    again = shuffle_groups(batch, group, torch.Generator().manual_seed(0))
    assert torch.equal(again["prompt_ids"], shuffled["prompt_ids"])
    orders = {
        tuple(shuffle_groups(batch, group, torch.Generator().manual_seed(s))["advantages"].tolist())
        for s in range(6)
    }
    assert len(orders) > 1
    with pytest.raises(ValueError, match="group_size=5"):
        shuffle_groups(batch, 5)


GENERATION = dict(
    do_sample=True,
    max_new_tokens=6,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    output_logits=True,
    return_dict_in_generate=True,
)


def _generate(generate, model, prompt_ids, prompt_mask, **settings):
    """(output, input widths of the model's forwards) of one seeded generate call."""
    widths = []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda module, args, output: widths.append(tuple(args[0].shape))
    )
    torch.manual_seed(5)
    try:
        return generate(input_ids=prompt_ids, attention_mask=prompt_mask, **settings), widths
    finally:
        hook.remove()


def _generation_model():
    model = _model().eval()
    model.generation_config.pad_token_id = PAD
    return model


def test_generation_prefill_once_per_group():
    """Same samples as plain `generate` on the G copies for a fixed seed, same first logits;
    the shared path prefills each prompt once, then the last prompt token of every row."""
    model = _generation_model()
    prompt_ids, prompt_mask, _, _ = _batch([5, 9], [[1, 1, 1], [1, 1, 1]])
    plain, plain_widths = _generate(model.generate, model, prompt_ids, prompt_mask, **GENERATION)

    def shared_generate(**kwargs):
        return generate_with_shared_prefill(model, **kwargs)

    shared, widths = _generate(shared_generate, model, prompt_ids, prompt_mask, **GENERATION)
    assert torch.equal(shared.sequences, plain.sequences)
    assert len({tuple(row) for row in plain.sequences[:3, 9:].tolist()}) > 1  # real sampling
    torch.testing.assert_close(shared.logits[0], plain.logits[0], rtol=0, atol=1e-5)
    assert plain_widths[0] == (6, 9)
    assert widths[:2] == [(2, 8), (6, 1)]


def test_installed_prefill_serves_trl_style_calls_and_lora():
    """`install_shared_prefill`: `generate(input_ids=, attention_mask=, generation_config=)`
    on a PEFT model (as TRL calls it) goes through the shared prefill; calls that expand the
    batch themselves do not."""
    model = _generation_model()
    prompt_ids, prompt_mask, _, _ = _batch([5, 9], [[1, 1, 1], [1, 1, 1]])
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    lora = peft.get_peft_model(model, config).eval()
    settings = dict(GENERATION, generation_config=model.generation_config)
    plain, _ = _generate(lora.generate, model, prompt_ids, prompt_mask, **settings)
    install_shared_prefill(lora)
    install_shared_prefill(lora)  # once is enough; twice changes nothing
    shared, widths = _generate(lora.generate, model, prompt_ids, prompt_mask, **settings)
    assert widths[:2] == [(2, 8), (6, 1)]
    assert torch.equal(shared.sequences, plain.sequences)
    torch.testing.assert_close(shared.logits[0], plain.logits[0], rtol=0, atol=1e-5)
    settings["num_return_sequences"] = 2
    _, widths = _generate(lora.generate, model, prompt_ids, prompt_mask, **settings)
    assert widths[0] == (12, 9)  # generate's own expansion: plain generate


def test_generation_honours_a_dynamic_cache_and_leaves_other_caches_to_generate(caplog):
    """TRL's `cache_implementation`: "dynamic" is the prefill's own cache (shared prefill, the
    same samples); "static" asks generate for a cache of its kind (plain generate, logged once)."""
    model = _generation_model()
    prompt_ids, prompt_mask, _, _ = _batch([5, 9], [[1, 1, 1], [1, 1, 1]])
    install_shared_prefill(model)
    plain_generate = model.generate.without_shared_prefill
    mrtpo.shared_prompt._log_plain_generation.cache_clear()
    for implementation, first_widths in (("dynamic", [(2, 8), (6, 1)]), ("static", [(6, 9)])):
        config = GenerationConfig(**GENERATION, cache_implementation=implementation)
        settings = dict(generation_config=config)
        plain, _ = _generate(plain_generate, model, prompt_ids, prompt_mask, **settings)
        with caplog.at_level(logging.WARNING, logger="mrtpo.shared_prompt"):
            for _ in range(2):
                shared, widths = _generate(
                    model.generate, model, prompt_ids, prompt_mask, **settings
                )
        assert widths[: len(first_widths)] == first_widths, implementation
        assert torch.equal(shared.sequences, plain.sequences), implementation
        assert config.cache_implementation == implementation  # the caller's config untouched
    assert caplog.text.count("cache_implementation='static'") == 1
    assert "'dynamic'" not in caplog.text


@pytest.mark.parametrize(
    "setting, value, first_widths",
    [
        # the prefill's own kind of cache: shared, the setting cleared for the call only
        ("cache_implementation", "dynamic", [(2, 8), (6, 1)]),
        # generate builds a cache of its own kind: plain generate, logged once
        ("cache_implementation", "static", [(6, 9)]),
        # Gemma's checkpoints ship it; generate drops it for a dynamic cache: shared
        ("cache_implementation", "hybrid", [(2, 8), (6, 1)]),
        # generate expands the batch itself (12 rows): plain generate
        ("num_return_sequences", 2, [(12, 9)]),
    ],
)
def test_generation_reads_settings_from_the_models_own_generation_config(
    caplog, setting, value, first_widths
):
    """A setting on the model's own `generation_config` (a checkpoint's
    `generation_config.json`), with TRL's config passed and leaving it unset: `generate` fills
    it from the model's, so the shared prefill reads it there too."""
    model = _generation_model()
    prompt_ids, prompt_mask, _, _ = _batch([5, 9], [[1, 1, 1], [1, 1, 1]])
    install_shared_prefill(model)
    setattr(model.generation_config, setting, value)
    own = model.generation_config
    passed = GenerationConfig(**GENERATION)  # TRL's: its cache_implementation None
    plain_generate = model.generate.without_shared_prefill
    plain, _ = _generate(plain_generate, model, prompt_ids, prompt_mask, generation_config=passed)
    mrtpo.shared_prompt._log_plain_generation.cache_clear()
    with caplog.at_level(logging.WARNING, logger="mrtpo.shared_prompt"):
        for _ in range(2):
            shared, widths = _generate(
                model.generate, model, prompt_ids, prompt_mask, generation_config=passed
            )
    assert widths[: len(first_widths)] == first_widths
    assert torch.equal(shared.sequences, plain.sequences)
    # the model's own config and the caller's are left as they were
    assert model.generation_config is own and getattr(own, setting) == value
    assert passed.cache_implementation is None
    if value == "static":
        line = f"cache_implementation={value!r} (set in the model's generation_config)"
        assert caplog.text.count(line) == 1
    else:
        assert "without the shared prefill" not in caplog.text


def test_generation_setting_is_read_where_generate_reads_it():
    model = SimpleNamespace(generation_config=GenerationConfig(cache_implementation="static"))
    passed = GenerationConfig(cache_implementation="dynamic")
    read = mrtpo.shared_prompt.generation_setting
    assert read(model, {}, "cache_implementation") == (
        "static",
        "the model's generation_config",
    )
    assert read(model, {"generation_config": passed}, "cache_implementation") == (
        "dynamic",
        "the generation config passed",
    )
    call = {"generation_config": passed, "cache_implementation": "offloaded"}
    assert read(model, call, "cache_implementation") == ("offloaded", "the call")
    assert read(model, {}, "num_beams") == (None, "nowhere")


def test_installed_prefill_follows_copies_and_pickles():
    """The installed `generate` serves the instance it is called on: a deep copy with other
    weights samples from its own weights, and `torch.save` of the model round-trips. (Without
    TRL's fused head: its `forward` closes over the model it was added to.)"""
    model = _model(fused=False).eval()
    model.generation_config.pad_token_id = PAD
    install_shared_prefill(model)
    prompt_ids, prompt_mask, _, _ = _batch([5, 9], [[1, 1, 1], [1, 1, 1]])
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.lm_head.weight.mul_(3.0)  # every logit scaled: another distribution
    assert isinstance(twin.generate, SharedPrefillGenerate) and twin.generate.model is twin
    own, _ = _generate(twin.generate, twin, prompt_ids, prompt_mask, **GENERATION)
    plain = twin.generate.without_shared_prefill
    expected, _ = _generate(plain, twin, prompt_ids, prompt_mask, **GENERATION)
    torch.testing.assert_close(own.logits[0], expected.logits[0], rtol=0, atol=1e-5)
    assert torch.equal(own.sequences, expected.sequences)
    original, _ = _generate(model.generate, model, prompt_ids, prompt_mask, **GENERATION)
    assert (own.logits[0] - original.logits[0]).abs().max() > 0.1

    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    again, widths = _generate(loaded.generate, loaded, prompt_ids, prompt_mask, **GENERATION)
    assert widths[:2] == [(2, 8), (6, 1)]
    assert torch.equal(again.sequences, original.sequences)
