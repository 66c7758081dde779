"""From dataset rows to credit maps: generate, verify, replay (used by `mrtpo explain` and
`mrtpo analyze`).

Prompts are rendered and completions decoded exactly as in training and `mrtpo eval` (chat
template with the generation prompt; special tokens skipped when decoding), and the replay
teacher-forces the generated token ids themselves (`mrtpo.relevance.replay_distances`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mrtpo.credit.map import CreditMap
from mrtpo.verifiers import Verdict, Verifier


def reward_types(verifiers: Sequence[Verifier], example: Mapping[str, Any]) -> list[str]:
    """[K] what kind of check each reward is on this row, for grouping the analysis.

    A verifier's name, except for slot verifiers (an `index` attribute) over rows with an
    `instruction_id_list` column: the instruction-following task's slot k checks the row's
    k-th constraint, so its type is that constraint's id ("punctuation:no_comma").
    """
    ids = example.get("instruction_id_list")
    types = []
    for verifier in verifiers:
        index = getattr(verifier, "index", None)
        if isinstance(ids, list | tuple) and isinstance(index, int) and 0 <= index < len(ids):
            types.append(str(ids[index]))
        else:
            types.append(verifier.name)
    return types


def verify_rows(
    verifiers: Sequence[Verifier], texts: Sequence[str], examples: Sequence[Mapping[str, Any]]
) -> list[list[Verdict]]:
    """[N][K] each verifier's verdict on each completion (`examples[i]` is its dataset row)."""
    if len(texts) != len(examples):
        raise ValueError(
            f"texts and examples must have the same length, got {len(texts)} and {len(examples)}"
        )
    return [
        [verifier.verify(text, example) for verifier in verifiers]
        for text, example in zip(texts, examples, strict=True)
    ]


@torch.no_grad()
def sample_completions(
    model: Any,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    num_samples: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
) -> list[list[int]]:
    """`num_samples` sampled completions of one prompt (token ids, cut after the first eos),
    reproducible from `seed` on a given machine."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    eos_ids = model.generation_config.eos_token_id
    eos_ids = {eos_ids} if isinstance(eos_ids, int) else set(eos_ids or [tokenizer.eos_token_id])
    input_ids = torch.tensor([list(prompt_ids)] * num_samples, device=model.device)
    torch.manual_seed(seed)
    output = model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        do_sample=True,
        temperature=temperature,
        top_p=1.0,
        top_k=0,
        pad_token_id=tokenizer.pad_token_id,
    )
    completions = []
    for row in output[:, input_ids.shape[1] :].tolist():
        cut = next((i + 1 for i, token in enumerate(row) if token in eos_ids), len(row))
        completions.append(row[:cut])
    return completions


def replay_rows(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Any],
    completion_ids: Sequence[Sequence[int]],
    verdicts: Sequence[Sequence[Verdict]],
    mode: str = "leave_one_out",
    batch_size: int = 8,
) -> list[torch.Tensor]:
    """Replay distances of each row, cut to its length: a list of Tensor[K, T_i] (float32, CPU).

    Rows go to `mrtpo.relevance.replay_distances` `batch_size` at a time.
    """
    from mrtpo.relevance import replay_distances

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    model.eval()
    distances: list[torch.Tensor] = []
    for start in range(0, len(prompts), batch_size):
        stop = start + batch_size
        infos = [[verdict.info for verdict in row] for row in verdicts[start:stop]]
        with torch.no_grad():
            distance, mask = replay_distances(
                model,
                tokenizer,
                list(prompts[start:stop]),
                [list(ids) for ids in completion_ids[start:stop]],
                infos,
                mode=mode,
            )
        for row, ids in enumerate(completion_ids[start:stop]):
            distances.append(distance[row, :, : len(ids)].float().cpu())
    return distances


def last_user_message(prompt: Any) -> str:
    """The prompt as shown on a map: the last message's content (or the text itself)."""
    if isinstance(prompt, str):
        return prompt
    return str(prompt[-1].get("content", "")) if prompt else ""


def distance_maps(
    tokenizer: Any,
    prompts: Sequence[Any],
    completion_ids: Sequence[Sequence[int]],
    texts: Sequence[str],
    names: Sequence[str],
    verdicts: Sequence[Sequence[Verdict]],
    distances: Sequence[torch.Tensor],
    types: Sequence[Sequence[str]] | None = None,
) -> list[CreditMap]:
    """One distance-only `CreditMap` per row (no advantages: what `mrtpo analyze` measures)."""
    maps = []
    for i, ids in enumerate(completion_ids):
        maps.append(
            CreditMap.from_replay(
                tokenizer,
                ids,
                names,
                distances[i],
                verdicts=verdicts[i],
                text=texts[i],
                types=None if types is None else types[i],
                prompt=last_user_message(prompts[i]),
                title=f"example {i}",
            )
        )
    return maps
