"""The naive replay: the straightforward reference that the tests and the benchmark compare
``replay_distances`` with.

Every full context (prompt + information + completion) runs from scratch through the whole
model and all ``(N, K + 1, T, V)`` completion logits are kept: no shared prefix, no stems, no
chunks. It shares only the contexts and the JS distance with the replay, so that an error in
the replay's caching or batching shows as a difference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from mrtpo.relevance.contexts import check_inputs, check_positive, contexts_of_rows
from mrtpo.relevance.distance import js_distance


def naive_replay_distances(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str | Sequence[Mapping[str, Any]]],
    completion_ids: Sequence[Sequence[int] | Tensor],
    infos: Sequence[Sequence[str]],
    mode: str = "leave_one_out",
    batch_size: int = 1,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    tools: Sequence[Any] | None = None,
    chat_template: str | None = None,
) -> tuple[Tensor, Tensor]:
    """The straightforward replay, as a reference: same contract as ``replay_distances``.

    Every full context (prompt + information + completion) runs from scratch through the whole
    model, ``batch_size`` left-padded sequences at a time, computing logits at the completion
    positions only; all ``(N, K + 1, T, V)`` completion logits are kept, then the JS distances
    are taken row by row.
    """
    completions, num_rewards = check_inputs(prompts, completion_ids, infos, mode)
    check_positive("batch_size", batch_size)
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    length = max(len(ids) for ids in completions)
    vocab = model.get_output_embeddings().weight.shape[0]
    logits = torch.zeros(len(prompts), num_rewards + 1, length, vocab, device=device)
    mask = torch.zeros(len(prompts), length, device=device)
    contexts = contexts_of_rows(
        tokenizer, prompts, infos, mode, chat_template_kwargs, tools, chat_template
    )
    jobs = []  # (row, context, ids: the context then the completion but its last token)
    for row, ctx in enumerate(contexts):
        mask[row, : len(completions[row])] = 1
        for context in range(num_rewards + 1):
            jobs.append((row, context, ctx.sequence(context, completions[row])[:-1]))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(jobs), batch_size):
                batch = jobs[start : start + batch_size]
                width = max(len(ids) for _, _, ids in batch)
                keep = max(len(completions[row]) for row, _, _ in batch)
                input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long, device=device)
                attention = torch.zeros(len(batch), width, dtype=torch.long, device=device)
                for b, (_, _, ids) in enumerate(batch):
                    input_ids[b, width - len(ids) :] = torch.tensor(ids, device=device)
                    attention[b, width - len(ids) :] = 1
                positions = (attention.cumsum(-1) - 1).clamp(min=0)
                # The last `keep` positions predict the completion tokens (left padding).
                out = model(
                    input_ids=input_ids,
                    attention_mask=attention,
                    position_ids=positions,
                    logits_to_keep=keep,
                ).logits.float()
                for b, (row, context, _) in enumerate(batch):
                    size = len(completions[row])
                    logits[row, context, :size] = out[b, keep - size :]
            # One row at a time: the (N, K + 1, T, V) logits are the naive part, not the JS.
            distance = torch.stack([js_distance(row[:1], row[1:]) for row in logits])
            distance = distance * mask.unsqueeze(1)
    finally:
        model.train(was_training)
    return distance, mask
