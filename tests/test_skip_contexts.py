"""Replaying only what can change an advantage: a reward's contexts are skipped on the rows
where its Ã_k is 0, and the per-token advantages stay those of replaying everything."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_relevance import INFOS, MESSAGES, OTHER, sharp  # noqa: F401 (sharp: a fixture)
from test_trainer import AlwaysOne, RecordingMRTPO, train_mrtpo
from trainer_toys import ContainsLetter

from mrtpo import advantages
from mrtpo.credit import CreditMap
from mrtpo.credit.render import map_rows, to_html
from mrtpo.relevance import build_contexts, naive_replay_distances, replay_distances
from mrtpo.verifiers import Verdict

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GROUP_SIZE = 4
# Two groups of 4 rows, K = 3. Group 1: reward 0 never varies (Ã = 0 on every row), reward 1
# is at its group mean on rows 2 and 3 (Ã = 0 there only), reward 2 varies on every row.
# Group 2: only reward 0 varies, and rows 6 and 7 are at its mean: nothing to replay there.
REWARDS = torch.tensor(
    [
        [1.0, 0.0, 0.0],
        [1.0, 1.0, 0.0],
        [1.0, 0.5, 1.0],
        [1.0, 0.5, 0.0],
        [0.0, 1.0, 0.5],
        [1.0, 1.0, 0.5],
        [0.5, 1.0, 0.5],
        [0.5, 1.0, 0.5],
    ]
)


@pytest.fixture(scope="module")
def group_rows(sharp):  # noqa: F811 (the imported fixture)
    """Eight rows whose contexts share long information (a schema, a reference, the format
    rule) within each prompt, so that the replay runs shared stems."""
    _, tokenizer = sharp
    schema = "Database schema:\n" + "\n".join(
        f"CREATE TABLE t{i} (id INTEGER PRIMARY KEY, name TEXT, value REAL);" for i in range(4)
    )
    texts = [
        "<answer>SELECT name FROM t1 WHERE value > 3 ORDER BY name</answer>",
        "<answer>SELECT * FROM t1</answer>",
        "<answer>SELECT nme FROM t1</answer>",
        "SELECT name FROM t1",
        "The ocean is deep and blue.",
        "* first bullet\n* second bullet",
        "P.S. Thanks for reading!",
        "Waves, waves.",
    ]
    completions = [tokenizer(t, add_special_tokens=False)["input_ids"] + [2] for t in texts]
    verdicts = ["the query runs", "the query runs", "no such column: nme", "no answer tags"]
    infos = [
        [INFOS[0], f"{schema}\nVerdict: {v}.", f"{INFOS[2]}\nRow {i}."]
        for i, v in enumerate(verdicts)
    ]
    infos += [
        ["Format: plain prose, no lists", "Constraint: no commas", "Length: 300 words or more"],
        ["Format: plain prose, no lists", "Constraint: no commas (violated)", ""],
        ["Format: plain prose, no lists", "Constraint: no commas", "Length: 300 words or more"],
        ["Format: plain prose, no lists", "", "Length: 300 words or more"],
    ]
    return [MESSAGES] * 4 + [OTHER] * 4, completions, infos


def wanted_pairs() -> torch.Tensor:
    """The pairs the trainer asks for: Ã_k != 0 (NaN as 0)."""
    normalized = torch.nan_to_num(advantages.per_reward(REWARDS, GROUP_SIZE))
    return normalized != 0


def test_the_fixture_mixes_zero_and_nonzero_advantages():
    wanted = wanted_pairs()
    assert wanted.tolist() == [
        [False, True, True],
        [False, True, True],
        [False, False, True],
        [False, False, True],
        [True, False, False],
        [True, False, False],
        [False, False, False],
        [False, False, False],
    ]


@pytest.mark.parametrize("mode", ["leave_one_out", "add_one"])
def test_skipping_contexts_keeps_the_token_advantages(sharp, group_rows, mode):  # noqa: F811
    model, tokenizer = sharp
    prompts, completions, infos = group_rows
    wanted = wanted_pairs()
    everything, mask = replay_distances(model, tokenizer, prompts, completions, infos, mode=mode)
    naive, _ = naive_replay_distances(model, tokenizer, prompts, completions, infos, mode=mode)
    assert everything[wanted].max() > 0.05  # the comparison is not between zeros
    for share_information, batch_size in [(True, 3), (True, 64), (False, 5)]:
        skipped, skipped_mask = replay_distances(
            model,
            tokenizer,
            prompts,
            completions,
            infos,
            mode=mode,
            batch_size=batch_size,
            share_information=share_information,
            wanted=wanted,
        )
        assert torch.equal(skipped_mask, mask)
        # Wanted pairs: the distances of replaying everything (and of the naive reference);
        # the others: exactly 0, never computed.
        kept = wanted.unsqueeze(-1).float()
        torch.testing.assert_close(skipped, everything * kept, atol=1e-5, rtol=0)
        torch.testing.assert_close(skipped, naive * kept, atol=1e-5, rtol=0)
        assert skipped[~wanted].eq(0).all()
        # The advantages: what each row's reward k puts on its tokens is c_k w_{k,t} Ã_k, and
        # a skipped pair has Ã_k = 0 (its uniform weights multiply 0).
        for beta in (0.5, 1.0):
            full = advantages.mrtpo(REWARDS, GROUP_SIZE, everything, mask, beta)
            torch.testing.assert_close(
                advantages.mrtpo(REWARDS, GROUP_SIZE, skipped, mask, beta),
                full,
                atol=1e-6,
                rtol=1e-5,
            )
        assert (full.max(-1).values - full.min(-1).values)[:6].min() > 1e-3  # weights matter


def context_runs(model, tokenizer, prompts, completions, infos, **options) -> list:
    """What the decoder runs after a cached prefix: (cached length, ids) per context, with
    shared information not split off; plus the number of prefix passes."""
    calls = []

    def record(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        calls.append((ids.clone(), None if mask is None else mask.clone()))

    handle = model.get_decoder().register_forward_pre_hook(record, with_kwargs=True)
    try:
        replay_distances(
            model, tokenizer, prompts, completions, infos, share_information=False, **options
        )
    finally:
        handle.remove()
    ran = []
    for ids, mask in calls:
        if mask is None:
            ran.append(("prefix", tuple(ids[0].tolist())))
            continue
        cached = mask.shape[1] - ids.shape[1]
        for row_ids, row_mask in zip(ids, mask, strict=True):
            ran.append((cached, tuple(row_ids[row_mask[cached:].bool()].tolist())))
    return ran


@pytest.mark.parametrize("mode", ["leave_one_out", "add_one"])
def test_only_the_reference_and_the_wanted_rewards_contexts_run(sharp, group_rows, mode):  # noqa: F811
    model, tokenizer = sharp
    prompts, completions, infos = group_rows
    wanted = wanted_pairs()
    ran = context_runs(model, tokenizer, prompts, completions, infos, mode=mode, wanted=wanted)
    expected = []
    prefixes = set()
    for row, (prompt, row_infos, completion) in enumerate(
        zip(prompts, infos, completions, strict=True)
    ):
        if not wanted[row].any():
            continue  # row 6 and 7: nothing
        ctx = build_contexts(tokenizer, prompt, row_infos, mode)
        prefixes.add(("prefix", ctx.prefix[:-1]))
        needed = [0, *(k + 1 for k in range(3) if wanted[row, k])]
        for suffix in dict.fromkeys(ctx.suffixes[context] for context in needed):
            full = [*ctx.prefix, *suffix, *completion]
            expected.append((len(ctx.prefix) - 1, tuple(full[len(ctx.prefix) - 1 : -1])))
    assert sorted(run for run in ran if run[0] != "prefix") == sorted(expected)
    assert {run for run in ran if run[0] == "prefix"} == prefixes
    # Replaying everything runs K + 1 = 4 contexts per row (fewer where information is empty).
    everything = context_runs(model, tokenizer, prompts, completions, infos, mode=mode)
    distinct = len(expected)
    assert distinct <= len([run for run in everything if run[0] != "prefix"]) // 2
    # Nothing wanted: nothing runs (not even the prompts' prefixes), and every distance is 0.
    nothing = torch.zeros(8, 3, dtype=torch.bool)
    assert context_runs(model, tokenizer, prompts, completions, infos, wanted=nothing) == []
    distance, mask = replay_distances(model, tokenizer, prompts, completions, infos, wanted=nothing)
    assert distance.eq(0).all() and mask.sum() == sum(len(ids) for ids in completions)


def test_stems_shared_by_skipped_contexts_still_run_for_the_others(sharp, group_rows):  # noqa: F811
    """Row 0 alone with only reward 2 wanted: the full and minus_3 contexts still share the
    format rule and the schema (a stem), now run for two contexts instead of four."""
    model, tokenizer = sharp
    prompts, completions, infos = group_rows
    tokens_run = []

    def count(_module, args, kwargs):
        mask = kwargs.get("attention_mask")
        ids = kwargs.get("input_ids", args[0] if args else None)
        if mask is not None:
            tokens_run[-1] += int(mask[:, -ids.shape[1] :].sum())

    only_last = torch.tensor([[False, False, True]] * 4)
    handle = model.get_decoder().register_forward_pre_hook(count, with_kwargs=True)
    results = []
    try:
        for share_information in (True, False):
            tokens_run.append(0)
            results.append(
                replay_distances(
                    model,
                    tokenizer,
                    prompts[:4],
                    completions[:4],
                    infos[:4],
                    share_information=share_information,
                    wanted=only_last,
                )[0]
            )
    finally:
        handle.remove()
    naive, _ = naive_replay_distances(model, tokenizer, prompts[:4], completions[:4], infos[:4])
    for distance in results:
        torch.testing.assert_close(distance[:, 2], naive[:, 2], atol=1e-5, rtol=0)
        assert distance[:, :2].eq(0).all()
    assert tokens_run[0] < 0.6 * tokens_run[1]  # the stems ran once


def test_bad_wanted_raises_naming_it(sharp):  # noqa: F811
    model, tokenizer = sharp
    good = ([MESSAGES], [[5, 6]], [["a", "b"]])
    with pytest.raises(ValueError, match=r"wanted must have shape \(N, K\) = \(1, 2\)"):
        replay_distances(model, tokenizer, *good, wanted=torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="wanted must be a bool"):
        replay_distances(model, tokenizer, *good, wanted=torch.ones(1, 2))
    with pytest.raises(ValueError, match="wanted must hold bools"):
        replay_distances(model, tokenizer, *good, wanted=[[1, 0]])
    distance, _ = replay_distances(model, tokenizer, *good, wanted=[[False, True]])
    assert distance[0, 0].eq(0).all() and distance[0, 1].gt(0).all()


# ----------------------------------------------------------------------------- the trainer


class BothReplays(RecordingMRTPO):
    """Each step's token advantages computed twice, from the same policy: replaying only the
    pairs with Ã_k != 0 (what it trains on) and replaying every pair."""

    def __init__(self, *args, **kwargs):
        self.replay_everything = False
        self.compared: list[tuple] = []
        super().__init__(*args, **kwargs)

    def _pairs_to_replay(self, normalized):
        if self.replay_everything:
            return torch.ones_like(normalized, dtype=torch.bool)
        return super()._pairs_to_replay(normalized)

    def _token_advantages(self, scored, step, group_size, output):
        skipped = super()._token_advantages(scored, step, group_size, output)
        self.replay_everything = True
        try:
            everything = super()._token_advantages(scored, step, group_size, output)
        finally:
            self.replay_everything = False
        self.compared.append((step.per_reward.clone(), skipped, everything))
        return skipped


@pytest.mark.parametrize("mode", ["leave_one_out", "add_one"])
def test_trainer_skips_zero_advantage_pairs_and_keeps_its_advantages(tmp_path, mode):
    trainer = train_mrtpo(
        tmp_path,
        trainer_class=BothReplays,
        replay_mode=mode,
        mrtpo_warmup_steps=0,
        mrtpo_beta=1.0,
        shuffle_token_weights=mode == "add_one",  # the ablation's permutation too
    )
    mixed_rows = 0
    for normalized, skipped, everything in trainer.compared:
        varies = normalized != 0
        mixed_rows += int((varies.any(dim=1) & ~varies.all(dim=1)).sum())
        replay = skipped.replay
        assert replay.rows == varies.any(dim=1).nonzero().flatten().tolist()
        assert torch.equal(replay.replayed.cpu(), varies[replay.rows])
        assert replay.distance[~replay.replayed].eq(0).all()
        torch.testing.assert_close(skipped.advantages, everything.advantages, atol=1e-5, rtol=0)
        measured = everything.replay.distance[replay.rows]  # every row: rows == range(B)
        torch.testing.assert_close(
            replay.distance, measured * replay.replayed.unsqueeze(-1), atol=1e-5, rtol=0
        )
        spread = skipped.advantages.max(-1).values - skipped.advantages.min(-1).values
        assert spread.max() > 1e-3  # the weights do move credit
    assert mixed_rows > 0  # rows where some rewards were replayed and others skipped


def test_contexts_share_and_distances_over_replayed_pairs_only(tmp_path):
    """K = 2, one reward constant: a replayed row runs 2 of its 3 contexts; the constant
    reward is never replayed, so it has no distance (None, not 0) and its credit-map row
    says so."""
    trainer = train_mrtpo(
        tmp_path,
        reward_funcs=[AlwaysOne(), ContainsLetter()],
        mrtpo_warmup_steps=0,
        credit_map_steps=1,
    )
    output_dir = Path(trainer.args.output_dir)
    lines = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "loss" in line]
    assert len(steps) == 2
    assert any(line["mrtpo/replayed_rows_share"] > 0 for line in steps)
    for line in steps:
        rows = line["mrtpo/replayed_rows_share"]
        assert line["mrtpo/replayed_contexts_share"] == pytest.approx(rows * 2 / 3)
        assert line["mrtpo/distance/always_one/mean"] is None
        if rows > 0:
            assert 0 < line["mrtpo/distance/contains_letter/mean"] <= 1
    page = (output_dir / "credit" / "step-00000.html").read_text()
    assert "not replayed" in page and "not replayed: no distance measured" in page


def credit_map(replayed) -> CreditMap:
    return CreditMap(
        text="ab",
        offsets=[(0, 1), (1, 2)],
        is_fragment=[False, False],
        special_labels=["", ""],
        names=["format", "answer"],
        distance=[[0.0, 0.0], [0.2, 0.6]],
        verdicts=[Verdict(1.0, "Use tags."), Verdict(0.0, "The answer is 3.")],
        weights=[[1.0, 1.0], [0.5, 1.5]],
        reward_advantages=[0.0, -1.2],
        token_advantages=[-0.3, -0.9],
        replayed=replayed,
    )


def test_credit_map_says_which_rewards_were_not_replayed():
    shown = credit_map([False, True])
    assert not shown.was_replayed(0) and shown.was_replayed(1)
    rows, _ = map_rows(shown)
    assert rows[0].summary.endswith("not replayed") and "not replayed" not in rows[1].summary
    page = to_html(shown)
    assert "not replayed: no distance measured" in page
    assert "replay distance q 0.6000" in page and "replay distance q 0.0000" not in page
    everything = credit_map(None)  # the default: every reward replayed
    assert everything.was_replayed(0) and "not replayed:" not in to_html(everything)
    record = {
        "tokens": ["a", "b"],
        "names": ["format", "answer"],
        "distance": [[0.0, 0.0], [0.2, 0.6]],
        "verdicts": shown.verdicts,
        "replayed": [False, True],
    }
    np.testing.assert_array_equal(CreditMap.from_record(record).replayed, [False, True])
    with pytest.raises(ValueError, match="replayed must have shape"):
        credit_map([True, True, False])
