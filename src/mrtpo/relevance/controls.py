"""The information the replay's controls put in place of each row's own (``docs/METHOD.md``,
Ablations): pure functions of the batch's verifier information, so that the trainer and the
benchmarks that measure the controls draw exactly the same texts.

- ``placebo_infos``: each row gets another prompt's information (``replay_information=
  "placebo"``, and the contrast of ``token_relevance="contrastive"``);
- ``placebo_shares``: how often a placebo text is no placebo at all (equal to the own text, or
  empty), per reward and over all of them;
- ``generic_infos``: one fixed, reward-agnostic text cut to the token length of each own text
  (``replay_information="generic"``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

# The generic control's text (``generic_infos``). English prose, as the verifiers' information
# is, so that the replayed context changes in kind and length as it does with the own text; it
# states no rule and names no format, code, tool, letter or number, so it can point at none of
# a task's checks; plain, frequent words, so that no rare token stands out in it.
GENERIC_SENTENCE = "The morning was quiet and the streets were calm as people went about their day."
# Seeds the placebo's pairing of groups with the run's seed and the step (the trainer's since
# the placebo was added: a change would change every placebo run's draws).
STEP_SEED_FACTOR = 7_919


def placebo_partners(num_groups: int, seed: int, step: int) -> list[int]:
    """The groups in the order each group draws its placebo from: ``[g]`` lists every group
    but ``g``, its partner first.

    The partners form a derangement (no group is its own), drawn from ``seed + 7919 * step``:
    a random order of the groups, each group's partner ``shift`` places further along it
    (``shift`` in ``[1, num_groups)``, drawn too). After its partner, a group walks on along the
    same order, skipping itself. The same arguments give the same answer on every process.
    """
    if num_groups < 2:
        raise ValueError(
            f"num_groups must be at least 2 for a placebo (another prompt), got {num_groups}"
        )
    generator = torch.Generator().manual_seed(seed + STEP_SEED_FACTOR * step)
    order = torch.randperm(num_groups, generator=generator).tolist()
    shift = int(torch.randint(1, num_groups, (1,), generator=generator))
    place = {group: index for index, group in enumerate(order)}
    walks = []
    for group in range(num_groups):
        start = place[group] + shift
        walk = [order[(start + offset) % num_groups] for offset in range(num_groups)]
        walks.append([other for other in walk if other != group])
    return walks


def placebo_infos(
    infos: Sequence[Sequence[str]], group_size: int, seed: int, step: int
) -> list[list[str]]:
    """The placebo information of every row of a generation batch: N lists of K strings.

    infos: the batch's own information, N rows of K strings, groups of ``group_size``
    consecutive rows (the whole batch, every process's rows, in TRL's order); seed, step: the
    run's seed and the optimizer step, which draw the pairing of groups (``placebo_partners``).

    Row ``i`` of group ``g`` at position ``p`` draws from its partner group's row at position
    ``p``:
    1. reward ``k`` gets that row's reward ``k`` information when it is not empty (the placebo
       as it always was);
    2. where it is empty (the partner prompt has nothing in that slot: an instruction-following
       prompt with fewer constraints), reward ``k`` gets the first text, taking the partner's
       slots from ``k + 1`` on (cyclically), then those of the next groups of the walk
       (``placebo_partners``) at the same position, that is not empty, not already among the
       row's placebo texts (a duplicate would stay in a leave-one-out context that drops the
       other copy) and not the row's own text for reward ``k``; "" if no group has one.
    Where the row's own information for reward ``k`` is empty, its placebo is empty too: there
    is nothing to replace, and the reward keeps the uniform weights it has with its own.
    """
    rows = [list(row) for row in infos]
    if group_size < 1 or not rows or len(rows) % group_size:
        raise ValueError(
            f"infos must hold whole groups of group_size={group_size} rows, got {len(rows)} rows"
        )
    num_rewards = len(rows[0])
    if any(len(row) != num_rewards for row in rows):
        raise ValueError(f"every row of infos must hold K={num_rewards} strings (as infos[0])")
    walks = placebo_partners(len(rows) // group_size, seed, step)
    placebo: list[list[str]] = []
    for index, own in enumerate(rows):
        group, position = divmod(index, group_size)
        donors = [rows[other * group_size + position] for other in walks[group]]
        drawn = [donors[0][k] if own[k] else "" for k in range(num_rewards)]
        for k in range(num_rewards):
            if own[k] and not drawn[k]:
                drawn[k] = _fallback(donors, k, own[k], drawn)
        placebo.append(drawn)
    return placebo


def _fallback(donors: list[list[str]], reward: int, own: str, drawn: list[str]) -> str:
    """The first usable text of ``donors`` (rows, partner first) for ``reward``: each row's
    slots from ``reward + 1`` on, cyclically; usable: not empty, not in ``drawn``, not ``own``."""
    num_rewards = len(donors[0])
    for row in donors:
        for offset in range(1, num_rewards + 1):
            text = row[(reward + offset) % num_rewards]
            if text and text != own and text not in drawn:
                return text
    return ""


@dataclass(frozen=True)
class PlaceboShares:
    """How often the placebo replays no other information, over some (row, reward) pairs."""

    pairs: int  # the pairs counted (replayed)
    equal: float  # share whose placebo text equals the own text (NaN when pairs is 0)
    empty: float  # share whose placebo text is empty (the reward then gets uniform weights)
    equal_or_empty: float  # share where either holds: the placebo is no other information


def placebo_shares(
    own: Sequence[Sequence[str]],
    placebo: Sequence[Sequence[str]],
    replayed: Sequence[Sequence[bool]] | torch.Tensor | None = None,
) -> tuple[PlaceboShares, list[PlaceboShares]]:
    """The shares of the replayed (row, reward) pairs whose placebo text equals the own text
    or is empty: over every reward, then for each reward.

    own, placebo: N lists of K strings (``placebo_infos(own, ...)``); replayed: N lists of K
    bools (or a bool Tensor[N, K]), the pairs that the replay runs (the trainer's: Ã_k not 0);
    default every pair.
    """
    if len(placebo) != len(own):
        raise ValueError(f"placebo has {len(placebo)} rows, own has {len(own)}")
    if replayed is None:
        replayed = [[True] * len(row) for row in own]
    elif isinstance(replayed, torch.Tensor):
        replayed = replayed.bool().tolist()
    if len(replayed) != len(own):
        raise ValueError(f"replayed has {len(replayed)} rows, own has {len(own)}")
    num_rewards = len(own[0]) if own else 0
    counts = [[0, 0, 0, 0] for _ in range(num_rewards)]  # pairs, equal, empty, either
    for row, (own_row, placebo_row, replayed_row) in enumerate(
        zip(own, placebo, replayed, strict=True)
    ):
        if not len(own_row) == len(placebo_row) == len(replayed_row) == num_rewards:
            raise ValueError(
                f"row {row}: own, placebo and replayed must each hold K={num_rewards} entries"
            )
        for k in range(num_rewards):
            if replayed_row[k]:
                equal, empty = placebo_row[k] == own_row[k], not placebo_row[k]
                for at, counted in enumerate((True, equal, empty, equal or empty)):
                    counts[k][at] += int(counted)
    total = [sum(count[at] for count in counts) for at in range(4)]
    return _shares(total), [_shares(count) for count in counts]


def _shares(count: list[int]) -> PlaceboShares:
    pairs = count[0]
    share = [value / pairs if pairs else math.nan for value in count[1:]]
    return PlaceboShares(pairs, *share)


def generic_infos(infos: Sequence[Sequence[str]], tokenizer: Any) -> list[list[str]]:
    """The generic control's information: each non-empty own text replaced by the same fixed
    text (``GENERIC_SENTENCE`` repeated), cut to the own text's token length; "" stays "".

    infos: N lists of K strings; tokenizer: the policy's (lengths are counted with it, without
    special tokens). The text of length ``n`` is the first ``n`` tokens of the repeated
    sentence's ids, decoded: every reward and every row gets the same text, up to its length.
    Where that text does not re-tokenize to ``n`` tokens (a cut inside a byte-level character,
    say), the nearest cut that does is taken; if none within 3 tokens does, the first ``n``
    tokens as they are.
    """
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor: its tokenizer

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    lengths = [[count(info) if info else 0 for info in row] for row in infos]
    longest = max((length for row in lengths for length in row), default=0)
    stream: list[int] = []
    repeats = 1
    while len(stream) < longest + 3:
        stream = tokenizer(" ".join([GENERIC_SENTENCE] * repeats), add_special_tokens=False)[
            "input_ids"
        ]
        repeats *= 2
    texts: dict[int, str] = {0: ""}

    def text_of(length: int) -> str:
        if length not in texts:
            # the nearest cuts first, the shorter of two equally near
            cuts = [
                length + offset for delta in range(4) for offset in dict.fromkeys((-delta, delta))
            ]
            candidates = [tokenizer.decode(stream[:cut]) for cut in cuts if cut > 0]
            texts[length] = next(
                (text for text in candidates if count(text) == length),
                tokenizer.decode(stream[:length]),
            )
        return texts[length]

    return [[text_of(length) for length in row] for row in lengths]
