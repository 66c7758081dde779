"""A tiny, seeded causal LM and tokenizer built in code, for tests and benchmarks.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on a few lines of text that
look like what the tasks produce (SQL, JSON tool calls, prose), with SmolLM2's ChatML chat
template; the model is a small Llama (or Qwen2) with random weights from a fixed seed.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "SELECT name, COUNT(*) FROM singer WHERE age >= 30 GROUP BY country ORDER BY name LIMIT 5;",
    "<think>I need the table of customers.</think><answer>SELECT * FROM customers</answer>",
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}</tool_call>',
    "Write an essay about the ocean in at least 300 words. Do not use any commas.",
    "The quick brown fox jumps over the lazy dog. P.S. Thanks for reading!",
    "* first bullet\n* second bullet\n- third item\n\n***\n\n<<A Title>>",
    "You are a helpful assistant. Answer with the query only. Verifier information follows.",
    "0123456789 ,.;:!?()[]{}\"'`-_=+*/\\<>|@#$%^&~ \n\t",
]


def tiny_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with a ChatML template (deterministic)."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def tiny_model(
    vocab_size: int,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_positions: int = 2048,
    tied: bool = True,
) -> LlamaForCausalLM:
    """A small Llama with seeded random weights; `tied=False` gives it its own output matrix
    (as the converted Qwen2.5-Coder-0.5B has)."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.eval()
    return model


def tiny_qwen2_model(
    vocab_size: int, seed: int = 0, hidden_size: int = 32, num_layers: int = 2
) -> Qwen2ForCausalLM:
    """A small Qwen2 (bias in q/k/v, grouped keys/values, output matrix apart from the
    embedding) with seeded random weights: e.g. over Qwen2.5's 151,936-token vocabulary."""
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval()


def tiny_model_and_tokenizer(seed: int = 0) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    tokenizer = tiny_tokenizer()
    return tiny_model(len(tokenizer), seed=seed), tokenizer


def save_tiny(path: str | Path, seed: int = 0) -> Path:
    """Save the tiny model and tokenizer as a Hugging Face folder (for CLI tests)."""
    model, tokenizer = tiny_model_and_tokenizer(seed)
    path = Path(path)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
