"""Prompt rendering and generation outside training: the one implementation behind `mrtpo eval`,
`mrtpo explain`, `mrtpo analyze` and the demo.

Prompts are rendered exactly as `mrtpo train` renders them: TRL's `GRPOTrainer` tokenizes the
`prompt` messages with `tokenizer.apply_chat_template(..., add_generation_prompt=True)` and the
same `chat_template_kwargs`. Completions are generated in left-padded batches, greedily or
sampled from the whole distribution as training samples (no top-k/top-p cut), and cut after
their first eos token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch


def render_prompt_ids(
    tokenizer: Any, prompts: Sequence[Any], chat_template_kwargs: dict | None = None
) -> list[list[int]]:
    """Token ids of each prompt, exactly as TRL's GRPOTrainer builds them before generation.

    Chat-message prompts go through the chat template with the generation prompt; plain-text
    prompts are tokenized as they are (TRL's `_tokenize_prompts`).
    """
    if not prompts:
        return []
    if isinstance(prompts[0], str):
        return [list(ids) for ids in tokenizer(text=list(prompts))["input_ids"]]
    tokenized = tokenizer.apply_chat_template(
        conversation=list(prompts),
        tools=None,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        **(chat_template_kwargs or {}),
    )
    return [list(ids) for ids in tokenized["input_ids"]]


@torch.no_grad()
def generate(
    model: Any,
    tokenizer: Any,
    prompt_ids: Sequence[Sequence[int]],
    max_new_tokens: int,
    batch_size: int = 8,
    temperature: float = 0.0,
    num_samples: int = 1,
    seed: int = 0,
    on_batch: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """Completions (token ids, cut after the first eos) for left-padded batches of prompts.

    ``temperature`` 0 decodes greedily; above 0 it samples from the whole distribution (no
    top-k/top-p cut, TRL's GRPO defaults), ``num_samples`` per prompt, seeded by ``seed``
    (reproducible on a given machine). Returns ``len(prompt_ids) * num_samples`` completions,
    each prompt's samples together. ``on_batch``, when given, is called after each batch with
    the number of completions it made (a progress bar's hook).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if num_samples > 1 and temperature == 0:
        raise ValueError(
            f"num_samples is {num_samples} but temperature is 0: greedy decoding gives one "
            "completion per prompt; set a temperature above 0 to sample several"
        )
    eos_ids = model.generation_config.eos_token_id
    eos_ids = {eos_ids} if isinstance(eos_ids, int) else set(eos_ids or [tokenizer.eos_token_id])
    pad_id = tokenizer.pad_token_id
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
        if temperature > 0
        else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    )
    if temperature > 0:
        torch.manual_seed(seed)
    model.eval()
    rows = [ids for ids in prompt_ids for _ in range(num_samples)]
    completions: list[list[int]] = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        width = max(len(ids) for ids in batch)
        input_ids = torch.tensor([[pad_id] * (width - len(ids)) + list(ids) for ids in batch])
        attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])
        output = model.generate(
            input_ids=input_ids.to(model.device),
            attention_mask=attention_mask.to(model.device),
            max_new_tokens=max_new_tokens,
            pad_token_id=pad_id,
            **sampling,
        )
        for row in output[:, width:].tolist():
            cut = next((i + 1 for i, token in enumerate(row) if token in eos_ids), len(row))
            completions.append(row[:cut])
        if on_batch is not None:
            on_batch(len(batch))
    return completions


def decoding(temperature: float, num_samples: int) -> str:
    """How completions were decoded, in words (for reports)."""
    if temperature == 0:
        return "greedy"
    return f"{num_samples} sample{'s' if num_samples > 1 else ''} per prompt at temperature {temperature:g}"
