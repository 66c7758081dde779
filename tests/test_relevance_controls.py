"""The replay's controls as pure functions (`mrtpo.relevance.controls`): the placebo's pairing
and its fallback where a partner has no information, the shares of placebo texts that are no
placebo, and the generic control's text; on hand-made batches."""

from __future__ import annotations

import math

import pytest
import torch

from mrtpo.relevance import controls
from mrtpo.testing import tiny_tokenizer


def former_partners(num_groups: int, seed: int, step: int) -> list[int]:
    """The trainer's pairing of groups before the fallback existed, as it was written there."""
    generator = torch.Generator().manual_seed(seed + 7_919 * step)
    order = torch.randperm(num_groups, generator=generator)
    shift = int(torch.randint(1, num_groups, (1,), generator=generator))
    partner = torch.empty_like(order)
    partner[order] = order.roll(-shift)
    return partner.tolist()


@pytest.mark.parametrize("num_groups", [2, 3, 5, 8])
def test_partners_walk_every_other_group_partner_first_as_the_trainer_paired_them(num_groups):
    for seed, step in [(0, 0), (0, 1), (3, 7), (42, 2)]:
        walks = controls.placebo_partners(num_groups, seed, step)
        assert [walk[0] for walk in walks] == former_partners(num_groups, seed, step)
        for group, walk in enumerate(walks):
            assert sorted(walk) == [g for g in range(num_groups) if g != group]
        assert walks == controls.placebo_partners(num_groups, seed, step)  # seeded
    if num_groups > 2:  # two groups have one derangement only
        drawn = {tuple(w[0] for w in controls.placebo_partners(num_groups, 0, s)) for s in range(6)}
        assert len(drawn) > 1
    with pytest.raises(ValueError, match="num_groups must be at least 2"):
        controls.placebo_partners(1, 0, 0)


# Three groups of two rows, three rewards; "" where a prompt has nothing in that slot.
INFOS = [
    ["a0", "b0", "c0"],  # group 0
    ["a0", "b0", ""],
    ["a1", "", "b2"],  # group 1
    ["a1", "", ""],
    ["a2", "b2", ""],  # group 2
    ["", "", "c2"],
]


def test_placebo_draws_information_that_exists_where_the_partner_has_none():
    # seed 0, step 0: group 0 draws from group 2 then 1, group 1 from 0 then 2, group 2 from 1
    # then 0 (the walk the expectations below are written for)
    assert controls.placebo_partners(3, 0, 0) == [[2, 1], [0, 2], [1, 0]]
    placebo = controls.placebo_infos(INFOS, group_size=2, seed=0, step=0)
    assert placebo == [
        # partner row 4 = [a2, b2, ""]: slot 2 falls back past a2, b2 (already drawn) to the
        # next group's row 2 (a1)
        ["a2", "b2", "a1"],
        # partner row 5 = ["", "", c2]: slot 0 takes c2; slot 1 the next group's row 3 (a1);
        # slot 2 is empty in the row's own information: it stays empty
        ["c2", "a1", ""],
        ["a0", "", "c0"],  # partner row 0 has every slot; own slot 1 empty stays empty
        ["a0", "", ""],
        # partner row 2 = [a1, "", b2]: slot 1 skips b2 (the row's own text for that reward)
        # and a1 (drawn), then takes the next group's row 0, slot 2 (c0)
        ["a1", "c0", ""],
        ["", "", "a1"],  # partner row 3 = [a1, "", ""]: slot 2 from its slot 0
    ]
    # Where the partner's slot has information, the placebo is the one it always was.
    partner = former_partners(3, 0, 0)
    for row, (own, drawn) in enumerate(zip(INFOS, placebo, strict=True)):
        partner_row = INFOS[partner[row // 2] * 2 + row % 2]
        for k in range(3):
            if own[k] and partner_row[k]:
                assert drawn[k] == partner_row[k]
        assert len([t for t in drawn if t]) == len(set(t for t in drawn if t))  # no duplicate
    assert placebo == controls.placebo_infos(INFOS, 2, 0, 0)  # seeded: the same everywhere


def test_placebo_is_empty_only_where_no_other_group_has_a_text():
    assert controls.placebo_infos([["x", "y"], ["", ""]], 1, 0, 0) == [["", ""], ["", ""]]
    # row 0's slot 0: the partner's only text (z) is already its slot 1's; row 1's slot 0 has
    # no own information
    assert controls.placebo_infos([["x", "y"], ["", "z"]], 1, 0, 0) == [["", "z"], ["", "y"]]
    assert controls.placebo_infos([["x", "y"], ["w", ""]], 1, 0, 0) == [["w", ""], ["x", ""]]
    with pytest.raises(ValueError, match="whole groups of group_size=2"):
        controls.placebo_infos(INFOS[:5], 2, 0, 0)
    with pytest.raises(ValueError, match="K=3"):
        controls.placebo_infos([*INFOS[:5], ["a", "b"]], 2, 0, 0)


def test_placebo_shares_count_the_replayed_pairs_equal_or_empty():
    own = [["f", "s", "r1"], ["f", "s", "r2"], ["f", "t", "r3"]]
    placebo = [["f", "", "r2"], ["f", "s", "r1"], ["g", "s", ""]]
    replayed = [[True, True, True], [True, False, True], [False, True, True]]
    overall, per_reward = controls.placebo_shares(own, placebo, replayed)
    # replayed pairs: reward 0 rows 0, 1 (both equal); reward 1 rows 0 (empty), 2 (differs);
    # reward 2 rows 0, 1 (differ), 2 (empty)
    assert per_reward[0] == controls.PlaceboShares(2, 1.0, 0.0, 1.0)
    assert per_reward[1] == controls.PlaceboShares(2, 0.0, 0.5, 0.5)
    assert per_reward[2] == controls.PlaceboShares(3, 0.0, 1 / 3, 1 / 3)
    assert overall == controls.PlaceboShares(7, 2 / 7, 2 / 7, 4 / 7)
    # every pair (no mask), and the same mask as a tensor
    overall, _ = controls.placebo_shares(own, placebo)
    assert (overall.pairs, overall.equal, overall.empty) == (9, 3 / 9, 2 / 9)
    assert controls.placebo_shares(own, placebo, torch.tensor(replayed))[0].pairs == 7
    nothing, _ = controls.placebo_shares(own, placebo, [[False] * 3] * 3)
    assert nothing.pairs == 0 and math.isnan(nothing.equal)
    with pytest.raises(ValueError, match="row 1: own, placebo and replayed"):
        controls.placebo_shares(own, [placebo[0], ["f"], placebo[2]])
    # The fallback's effect on the hand-made batch: no replayed pair is left empty.
    drawn = controls.placebo_infos(INFOS, 2, 0, 0)
    with_information = [[bool(text) for text in row] for row in INFOS]
    assert controls.placebo_shares(INFOS, drawn, with_information)[0].empty == 0.0


def test_generic_text_has_each_own_texts_token_length_and_is_the_same_text():
    tokenizer = tiny_tokenizer()

    def length(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    infos = [
        ["The response must contain the letter 'a'.", "", "Reference query: SELECT 1"],
        ["Constraint: answer in capital letters.\nLoose: followed.", "x", "Format: <answer>"],
    ]
    generic = controls.generic_infos(infos, tokenizer)
    texts = sorted({text for row in generic for text in row if text}, key=len)
    for own_row, generic_row in zip(infos, generic, strict=True):
        for own, text in zip(own_row, generic_row, strict=True):
            assert length(text) == length(own)
            assert bool(text) == bool(own)  # no information stays no information
    assert len(texts) == 5  # five token lengths, five cuts of the one text
    for shorter, longer in zip(texts, texts[1:], strict=False):
        assert longer.startswith(shorter)
    assert texts[-1].startswith(controls.GENERIC_SENTENCE[:20])
    # rows and rewards with the same length get the same text
    own = [["SELECT name", "SELECT *"], ["SELECT name", ""]]
    assert length(own[0][0]) == length(own[0][1]) == 2  # two different texts of two tokens
    same = controls.generic_infos(own, tokenizer)
    assert same[0][0] == same[0][1] == same[1][0] and same[1][1] == ""
    # beyond one sentence: it repeats
    long = controls.generic_infos([["word " * 200]], tokenizer)[0][0]
    assert length(long) == length("word " * 200)
    assert long.count(controls.GENERIC_SENTENCE) >= 2
