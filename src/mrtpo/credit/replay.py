"""Credit maps of replayed rows: from given token ids, verdicts, rewards and replay distances
(used by the trainer, `mrtpo explain`, `mrtpo analyze` and the benchmarks).

Nothing here generates, replays or loads a model: `mrtpo.explaining` does that and hands the
results over. `distance_maps` builds distance-only maps (what `mrtpo analyze` measures);
`group_credit_map` builds one response's map with the advantages of its group.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mrtpo import advantages
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


def group_credit_map(
    tokenizer: Any,
    response_ids: Sequence[int],
    text: str,
    names: Sequence[str],
    verdicts: Sequence[Sequence[Verdict]],
    distance: torch.Tensor,
    *,
    beta: float = 0.5,
    types: Sequence[str] | None = None,
    prompt: str = "",
    title: str = "",
) -> CreditMap:
    """The credit map of the first response of a group, with the group's advantages.

    Args:
        tokenizer: decodes `response_ids` (token offsets come from it).
        response_ids: [T] the explained response (row 0 of the group).
        text: the completion text the verifiers read.
        names: [K] the rewards' names.
        verdicts: [G] lists of [K]: every group member's verdicts, the explained response's first. With
            one member there is no group: the map holds replay distances only.
        distance: [K, T] the explained response's replay distances. Only it is needed: its A_t
            depends on the other members only through their rewards.
        beta: MRTPO's allocation strength.
        types: [K] each reward's kind of check (default: the names).
        prompt: shown on the map.
        title: shown on the map, with the group's size and beta appended.

    Rewards that do not apply to the response (score None) are left off the map.
    """
    group_size = len(verdicts)
    if group_size < 1:
        raise ValueError("verdicts must hold at least the explained response's, got none")
    if tuple(distance.shape) != (len(names), len(response_ids)):
        raise ValueError(
            f"distance must have shape (K, T) = ({len(names)}, {len(response_ids)}), "
            f"got {tuple(distance.shape)}"
        )
    rewards = torch.tensor(
        [[math.nan if v.score is None else v.score for v in line] for line in verdicts],
        dtype=torch.float64,
    )  # [G, K]
    num_tokens = distance.shape[-1]
    numbers: dict[str, Any] = {}
    if group_size > 1:
        # Only row 0 is replayed: its A_t reads the other rows' rewards, never their distances.
        all_distance = torch.zeros(group_size, len(names), num_tokens, dtype=torch.float64)
        all_distance[0] = distance.double()
        all_mask = torch.zeros(group_size, num_tokens)
        all_mask[0] = 1
        numbers = {
            "weights": advantages.token_weights(all_distance[:1], all_mask[:1], beta)[0],
            "reward_advantages": torch.nan_to_num(advantages.per_reward(rewards, group_size)[0]),
            "token_advantages": advantages.mrtpo(rewards, group_size, all_distance, all_mask, beta)[
                0
            ],
            "gdpo_advantage": float(advantages.gdpo(rewards, group_size)[0]),
        }
    applicable = [k for k, verdict in enumerate(verdicts[0]) if verdict.score is not None]
    types = list(names) if types is None else list(types)
    return CreditMap.from_replay(
        tokenizer,
        response_ids,
        [names[k] for k in applicable],
        distance[applicable],
        weights=numbers["weights"][applicable] if numbers else None,
        reward_advantages=numbers["reward_advantages"][applicable] if numbers else None,
        token_advantages=numbers.get("token_advantages"),
        verdicts=[verdicts[0][k] for k in applicable],
        text=text,
        gdpo_advantage=numbers.get("gdpo_advantage"),
        types=[types[k] for k in applicable],
        prompt=prompt,
        title=title
        + (f", in a group of {group_size} (beta {beta})" if numbers else ", replay distances"),
    )
