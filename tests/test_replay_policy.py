"""The replay's distributions are the policy's as TRL's loss computes them (temperature, logit
scaling, soft-capping, autocast), and the replay's cost controls (JS block by device, no shared
cache for models whose cache is not plain attention)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from test_trainer import COMMON
from trainer_toys import toy_trainer

import mrtpo.relevance
from mrtpo.relevance import build_contexts, replay_distances
from mrtpo.relevance.head import PolicyHead
from mrtpo.relevance.replay import _replay_hidden
from mrtpo.testing import tiny_model_and_tokenizer
from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = [{"role": "user", "content": "List the singers older than 30, by name."}]
INFOS = ["Format: <answer>SQL</answer>", "Schema: singer(name, age, country)"]
COMPLETION = "<answer>SELECT name FROM singer WHERE age > 30</answer>"


def _trainer(tmp_path, model, tokenizer, **overrides) -> MRTPOTrainer:
    settings = {**COMMON, "max_steps": 1, "mrtpo_warmup_steps": 0, **overrides}
    args = MRTPOConfig(output_dir=str(tmp_path / "run"), **settings)
    return toy_trainer(MRTPOTrainer, model, tokenizer, args)


def _scaled_tiny():
    """The tiny model with a logit scale and a final soft-cap in its config (read by TRL)."""
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(6.0)  # peaked: the soft-cap bites
    model.config.logit_scale = 1.7
    model.config.final_logit_softcapping = 5.0
    return model, tokenizer


def test_replay_log_probs_equal_trls_with_temperature_scale_and_softcap(tmp_path):
    model, tokenizer = _scaled_tiny()
    trainer = _trainer(tmp_path, model, tokenizer, temperature=0.7)
    options = trainer._replay_options()
    head = PolicyHead.of(trainer.model, options["temperature"], options["lm_head_fp32"])
    assert (head.temperature, head.logit_scale, head.softcap) == (0.7, 1.7, 5.0)

    completion = tokenizer(COMPLETION, add_special_tokens=False)["input_ids"] + [2]
    contexts = build_contexts(tokenizer, PROMPT, INFOS, "add_one", {}, 0)
    bare = contexts.ids(0)  # add_one's reference: the bare prompt
    hidden = _replay_hidden(trainer.model, 0, [contexts], [completion], [[0, 1, 2]], 4)
    logits = head.logits(trainer.model, hidden[0][0])  # slot 0: the bare context
    replayed = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]

    input_ids = torch.tensor([bare + completion])
    with torch.no_grad():
        trl_log_probs, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, torch.ones_like(input_ids), len(completion)
        )
    torch.testing.assert_close(replayed, trl_log_probs[0], atol=1e-5, rtol=1e-5)
    # Without the head's transforms the numbers differ clearly: the check has teeth.
    plain = torch.log_softmax(trainer.model.get_output_embeddings()(hidden[0][0]).float(), -1)
    plain = plain.gather(-1, torch.tensor(completion)[:, None])[:, 0]
    assert (plain - trl_log_probs[0]).abs().max() > 0.1


def test_temperature_reaches_the_distances():
    """JS at temperature t of logits W h equals JS at temperature 1 of logits (W / t) h."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    _, tokenizer = tiny_model_and_tokenizer(seed=0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    hotter = copy.deepcopy(model)
    with torch.no_grad():
        hotter.lm_head.weight.div_(0.5)
    completion = tokenizer(COMPLETION, add_special_tokens=False)["input_ids"]
    inputs = ([PROMPT] * 2, [completion, completion[:5]], [INFOS, ["", INFOS[1]]])
    at_temperature, _ = replay_distances(model, tokenizer, *inputs, temperature=0.5)
    reference, _ = replay_distances(hotter, tokenizer, *inputs)
    untempered, _ = replay_distances(model, tokenizer, *inputs)
    torch.testing.assert_close(at_temperature, reference, atol=1e-5, rtol=0)
    assert (at_temperature - untempered).abs().max() > 0.01


def test_softcap_and_scale_come_from_the_text_sub_config():
    text = SimpleNamespace(final_logit_softcapping=30.0, logit_scale=None, logits_scaling=4.0)
    config = SimpleNamespace(get_text_config=lambda: text)
    head = PolicyHead.of(SimpleNamespace(config=config), temperature=0.9)
    assert (head.softcap, head.logit_scale, head.temperature) == (30.0, 0.25, 0.9)
    hyperclova = SimpleNamespace(model_type="hyperclovax", logits_scaling=4.0)
    falcon = SimpleNamespace(lm_head_multiplier=0.5, logits_scaling=4.0)
    for sub, scale in [(hyperclova, 4.0), (falcon, 0.5), (SimpleNamespace(), 1.0)]:
        model = SimpleNamespace(config=SimpleNamespace(get_text_config=lambda sub=sub: sub))
        assert PolicyHead.of(model).logit_scale == scale
    with pytest.raises(ValueError, match="temperature"):
        PolicyHead(temperature=0.0)


# The replay's log-probs against TRL's, both under bf16 autocast, on the tiny model: bf16 keeps
# 8 mantissa bits, so a bf16 matmul's output is rounded to about 0.4% of itself and one token's
# log-prob can move by ~1e-3 whenever sums run in another order (the replay batches and caches
# contexts; TRL runs each sequence whole). Seen: 11% of tokens differ, by up to 8e-4, mean 3e-5.
# The same replay in fp32 differs from TRL's bf16 on every token: mean 4.7e-4. So the mean
# absolute difference separates them, and the largest one only bounds gross errors (a wrong
# temperature moves log-probs by > 0.1).
AUTOCAST_MEAN_ATOL = 1.5e-4
AUTOCAST_MAX_ATOL = 2e-3


def test_trainer_replay_log_probs_equal_trls_under_bf16_autocast(tmp_path, monkeypatch):
    """fp32 weights with bf16=True: TRL's loss forward runs under bf16 autocast, so the
    replay's log-probs (taken where the trainer calls the replay, in its context) must be TRL's
    under it, not fp32's."""
    from mrtpo.relevance.contexts import contexts_of_rows

    compared = []
    real = mrtpo.relevance.replay_distances

    def comparing(model, tokenizer, prompts, completion_ids, infos, **options):
        rendering = [options[key] for key in ("chat_template_kwargs", "tools", "chat_template")]
        contexts = contexts_of_rows(tokenizer, prompts, infos, options["mode"], *rendering)
        completions = [list(ids) for ids in completion_ids]
        head = PolicyHead.of(model, options["temperature"], options["lm_head_fp32"])

        def replay_log_probs() -> list[torch.Tensor]:
            """Each row's reference-context log-probs of its completion, as the replay has them."""
            unique = [[0, 1]] * len(completions)
            hidden = _replay_hidden(model, 0, contexts, completions, unique, 4)
            return [
                torch.log_softmax(head.logits(model, row[0]).float(), -1).gather(
                    -1, torch.tensor(ids)[:, None]
                )[:, 0]
                for row, ids in zip(hidden, completions, strict=True)
            ]

        replayed = replay_log_probs()  # under whatever autocast the trainer set
        with torch.autocast("cpu", enabled=False):
            in_fp32 = replay_log_probs()
        for row, ids in enumerate(completions):
            input_ids = torch.tensor([contexts[row].sequence(0, ids)])
            with torch.no_grad():  # TRL's own forward: under accelerate's autocast
                trl = trainer._get_per_token_logps_and_entropies(
                    model, input_ids, torch.ones_like(input_ids), len(ids)
                )[0][0]
            compared.append((replayed[row], in_fp32[row], trl))
        return real(model, tokenizer, prompts, completion_ids, infos, **options)

    monkeypatch.setattr(mrtpo.relevance, "replay_distances", comparing)
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    trainer = _trainer(tmp_path, model, tokenizer, bf16=True, temperature=0.8)
    trainer.train()
    assert compared, "the step replayed nothing"
    replayed, in_fp32, trl = (torch.cat(column) for column in zip(*compared, strict=True))
    gap, fp32_gap = (replayed - trl).abs(), (in_fp32 - trl).abs()
    assert fp32_gap.mean() > 2 * AUTOCAST_MEAN_ATOL  # bf16 shows at this tolerance
    assert gap.mean() < AUTOCAST_MEAN_ATOL, (
        f"the replay's log-probs are not TRL's under bf16 autocast: mean |difference| "
        f"{gap.mean():.2e} (fp32's: {fp32_gap.mean():.2e})"
    )
    assert gap.max() < AUTOCAST_MAX_ATOL, f"largest |difference| {gap.max():.2e}"


# ----------------------------------------------------------------------------- cost


def test_js_block_is_sized_by_device(monkeypatch):
    """CPU: cache-sized blocks; accelerators: one block per chunk of a large vocabulary.
    Same distances either way."""
    import mrtpo.relevance.distance as distance_module

    assert distance_module.js_block_elements(torch.device("cpu")) == 2**19
    assert distance_module.js_block_elements(torch.device("cuda", 0)) >= 2**26
    generator = torch.Generator().manual_seed(0)
    vocab, positions, num_rewards = 4096, 64, 3
    hidden = [torch.randn(num_rewards + 1, positions, vocab, generator=generator)]
    calls = []
    real_js = distance_module._js_from_log_probs

    def counting(*args, **kwargs):
        calls.append(args[1].shape[1])
        return real_js(*args, **kwargs)

    monkeypatch.setattr(distance_module, "_js_from_log_probs", counting)
    results = {}
    for device_type in ("cpu", "cuda"):
        calls.clear()
        monkeypatch.setattr(
            distance_module,
            "js_block_elements",
            lambda device, kind=device_type: (
                distance_module.JS_BLOCK_ELEMENTS
                if kind == "cpu"
                else distance_module.JS_BLOCK_ELEMENTS_ACCELERATOR
            ),
        )
        out = torch.zeros(1, num_rewards, positions)
        distance_module.chunked_distances(lambda x: x, hidden, [[0, 1, 2, 3]], positions, out)
        results[device_type] = (out, list(calls))
    (cpu_out, cpu_calls), (cuda_out, cuda_calls) = results["cpu"], results["cuda"]
    assert len(cpu_calls) > 1 and cuda_calls == [positions]
    torch.testing.assert_close(cpu_out, cuda_out, atol=1e-6, rtol=0)


class _HybridBody(torch.nn.Module):
    """A decoder whose cache holds a recurrent state (no attention keys/values to copy): given a
    cache back, it fails, as a real recurrent state cannot be shared by a batch of contexts."""

    def __init__(self, body: torch.nn.Module) -> None:
        super().__init__()
        self.inner = body

    def forward(
        self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None
    ):
        from transformers.cache_utils import LinearAttentionLayer

        if cache is not None:
            raise AssertionError("the replay passed a cache to a model with a recurrent state")
        out = self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        )
        state = SimpleNamespace(layers=[LinearAttentionLayer()]) if use_cache else None
        return SimpleNamespace(last_hidden_state=out.last_hidden_state, cache=state)


def test_model_with_a_recurrent_cache_replays_without_the_shared_cache(tiny):
    from mrtpo.relevance import naive_replay_distances

    model, tokenizer = tiny
    hybrid = copy.deepcopy(model)
    with torch.no_grad():  # peaked distributions: distances far from 0
        for name, parameter in hybrid.named_parameters():
            if "norm" not in name:
                parameter.mul_(8.0)
    hybrid_body = _HybridBody(hybrid.get_decoder())
    hybrid.get_decoder = lambda: hybrid_body
    other = [{"role": "user", "content": "Write about the ocean. Do not use any commas."}]
    completion = tokenizer(COMPLETION, add_special_tokens=False)["input_ids"]
    prompts = [PROMPT, PROMPT, other]
    completions = [completion, completion[:6], completion[3:]]
    infos = [INFOS, [INFOS[0], ""], ["Constraint: no commas", INFOS[1]]]
    distance, _ = replay_distances(hybrid, tokenizer, prompts, completions, infos, batch_size=2)
    reference, _ = naive_replay_distances(hybrid, tokenizer, prompts, completions, infos)
    assert reference.max() > 0.05
    torch.testing.assert_close(distance, reference, atol=1e-5, rtol=0)
