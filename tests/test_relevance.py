"""Replay relevance: JS distance vs scipy; the replay against a naive reference on a tiny model."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from mrtpo.relevance import (
    _shared_stems,
    build_contexts,
    context_infos,
    js_distance,
    naive_replay_distances,
    replay_distances,
)
from mrtpo.testing import tiny_qwen2_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------- js_distance


def test_js_distance_matches_scipy():
    gen = torch.Generator().manual_seed(0)
    checked = []
    for vocab, temperature in [(2, 1.0), (7, 3.0), (50, 0.3), (1000, 5.0)]:
        logits_p = torch.randn(20, vocab, generator=gen, dtype=torch.float64) * temperature
        logits_q = torch.randn(20, vocab, generator=gen, dtype=torch.float64) * temperature
        logits_q[:5] = logits_p[:5] + 0.05 * torch.randn(
            5, vocab, generator=gen, dtype=torch.float64
        )
        p = torch.softmax(logits_p, -1).numpy()
        q = torch.softmax(logits_q, -1).numpy()
        expected = np.array([jensenshannon(p[i], q[i], base=2) for i in range(20)])
        for dtype in (torch.float32, torch.float64):
            actual = js_distance(logits_p.to(dtype), logits_q.to(dtype)).numpy()
            np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=0)
        checked.extend(expected.tolist())
    assert min(checked) < 1e-3 and max(checked) > 0.5  # a spread of values was checked


def test_js_distance_with_minus_inf_matches_scipy():
    logits_p = torch.tensor(
        [[0.0, 1.0, -float("inf"), 2.0], [3.0, -float("inf"), -float("inf"), 0.0]]
    )
    logits_q = torch.tensor(
        [[-float("inf"), 1.0, 0.5, 2.0], [3.0, 1.0, -float("inf"), -float("inf")]]
    )
    p = torch.softmax(logits_p, -1).numpy()
    q = torch.softmax(logits_q, -1).numpy()
    expected = [jensenshannon(p[i], q[i], base=2) for i in range(2)]
    np.testing.assert_allclose(js_distance(logits_p, logits_q).numpy(), expected, atol=1e-6)


def test_js_distance_properties():
    gen = torch.Generator().manual_seed(1)
    logits_p = torch.randn(4, 6, 300, generator=gen) * 4
    logits_q = torch.randn(4, 6, 300, generator=gen) * 4
    forward, backward = js_distance(logits_p, logits_q), js_distance(logits_q, logits_p)
    torch.testing.assert_close(forward, backward, atol=1e-6, rtol=0)
    assert forward.shape == (4, 6)
    assert js_distance(logits_p, logits_p).eq(0).all()
    assert js_distance(logits_p, logits_p + 123.0).abs().max() < 1e-3  # shift-invariant
    # Disjoint supports: distance 1 (large finite or -inf logits).
    minus_inf = float("-inf")
    disjoint_p = torch.tensor([[0.0, 0.0, minus_inf, minus_inf], [1e4, 1e4, -1e4, -1e4]])
    disjoint_q = torch.tensor([[minus_inf, minus_inf, 0.0, 3.0], [-1e4, -1e4, 1e4, 1e4]])
    torch.testing.assert_close(js_distance(disjoint_p, disjoint_q), torch.ones(2))
    # Close distributions over a large vocabulary: float32 keeps the float64 value (no
    # rounding noise magnified by the square root).
    wide = torch.randn(3, 50_000, generator=gen, dtype=torch.float64) * 3
    nudged = wide + 1e-3 * torch.randn(3, 50_000, generator=gen, dtype=torch.float64)
    exact = js_distance(wide, nudged)
    assert 1e-4 < exact.min() and exact.max() < 1e-3
    torch.testing.assert_close(
        js_distance(wide.float(), nudged.float()).double(), exact, atol=1e-6, rtol=0
    )
    # Large logits stay finite and in range; dim other than -1.
    huge = js_distance(logits_p * 1e4, logits_q * 1e4)
    assert torch.isfinite(huge).all() and (huge >= 0).all() and (huge <= 1).all()
    torch.testing.assert_close(
        js_distance(logits_p.transpose(1, 2), logits_q.transpose(1, 2), dim=1), forward
    )


# ----------------------------------------------------------------------------- fixtures

SYSTEM = "You are a helpful assistant. Answer with the query only."
MESSAGES = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "List the singers older than 30, by name."},
]
OTHER = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Write an essay about the ocean. Do not use any commas."},
]
INFOS = [
    "Format: <think>...</think><answer>SQL</answer>",
    "Schema: singer(name, age, country)",
    "Reference: SELECT name FROM singer WHERE age > 30 ORDER BY name",
]


@pytest.fixture(scope="module")
def rows(tiny):
    """Two prompts x G=3 rows, K=3, completions of different lengths, one empty info."""
    _, tokenizer = tiny
    texts = [
        "<answer>SELECT name FROM singer WHERE age > 30 ORDER BY name</answer>",
        "SELECT * FROM singer",
        "<think>I need the table of singers.</think><answer>SELECT name FROM singer</answer>",
        "The ocean is deep and blue.",
        "* first bullet\n* second bullet",
        "P.S. Thanks for reading!",
    ]
    completions = [tokenizer(t, add_special_tokens=False)["input_ids"] + [2] for t in texts]
    prompts = [MESSAGES] * 3 + [OTHER] * 3
    infos = [
        INFOS,
        [INFOS[0], "", INFOS[2]],
        [INFOS[0], "Execution error: no such column: nme", INFOS[2]],
        ["Format: plain prose", "Constraint: no commas", "Length: at least 300 words"],
        ["Format: plain prose", "Constraint: no commas (violated)", ""],
        ["Format: plain prose", "Constraint: no commas", "Length: at least 300 words"],
    ]
    return prompts, completions, infos


@pytest.fixture(scope="module")
def sharp(tiny):
    """The tiny model with larger weights: peaked distributions, distances far from 0."""
    model, tokenizer = tiny
    sharpened = copy.deepcopy(model)
    with torch.no_grad():
        for name, parameter in sharpened.named_parameters():
            if "norm" not in name:
                parameter.mul_(8.0)
    return sharpened, tokenizer


# ----------------------------------------------------------------------------- contexts


def test_context_infos_modes():
    assert context_infos(["a", "b", "c"]) == [["a", "b", "c"], ["b", "c"], ["a", "c"], ["a", "b"]]
    assert context_infos(["a", "", "c"]) == [["a", "c"], ["c"], ["a", "c"], ["a"]]
    assert context_infos(["a"]) == [["a"], []]  # K = 1: minus_1 is the bare prompt
    assert context_infos(["a", "b"], "add_one") == [[], ["a"], ["b"]]
    with pytest.raises(ValueError, match="mode"):
        context_infos(["a"], "leave_two_out")


def test_contexts_render_the_information_after_the_prompt(tiny):
    _, tokenizer = tiny
    contexts = build_contexts(tokenizer, MESSAGES, INFOS)
    assert len(contexts.suffixes) == 4
    for context, pieces in enumerate(context_infos(INFOS)):
        messages = copy.deepcopy(MESSAGES)
        messages[-1]["content"] += "".join("\n\n" + piece for piece in pieces)
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        assert tokenizer.decode(contexts.ids(context)) == rendered
    # The prefix is the contexts' longest common token prefix: all start with it, and they do
    # not all go on with the same token. It holds the prompt up to its last user content.
    whole = [contexts.ids(context) for context in range(4)]
    assert len({tuple(ids[: len(contexts.prefix) + 1]) for ids in whole}) > 1
    assert MESSAGES[-1]["content"] in tokenizer.decode(contexts.prefix)
    # add_one: the bare prompt first, then the prompt plus one piece of information.
    bare = build_contexts(tokenizer, MESSAGES, INFOS, mode="add_one")
    assert bare.prefix == contexts.prefix[: len(bare.prefix)]
    assert tokenizer.decode(bare.prefix).endswith(MESSAGES[-1]["content"])
    plain = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(bare.ids(0)) == plain
    assert INFOS[1] in tokenizer.decode(bare.ids(2)) and INFOS[0] not in tokenizer.decode(
        bare.ids(2)
    )
    # A plain-text prompt: the information is appended to the string.
    text = build_contexts(tokenizer, "Question: singers?", ["Schema: singer"])
    assert tokenizer.decode(text.ids(0)) == "Question: singers?\n\nSchema: singer"
    assert tokenizer.decode(text.ids(1)) == "Question: singers?"


def test_completion_ids_are_replayed_unchanged_in_every_context(tiny, rows):
    """Record what the model actually runs: cached prefix + (context suffix, completion), with
    shared information not split off (``share_information=False``; see the next test)."""
    model, tokenizer = tiny
    prompts, completions, infos = rows
    calls = []

    def record(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        calls.append((ids.clone(), None if mask is None else mask.clone()))

    handle = model.get_decoder().register_forward_pre_hook(record, with_kwargs=True)
    try:
        replay_distances(
            model, tokenizer, prompts, completions, infos, batch_size=5, share_information=False
        )
    finally:
        handle.remove()
    prefix_runs = [ids for ids, mask in calls if mask is None]
    context_runs = [(ids, mask) for ids, mask in calls if mask is not None]
    contexts = [build_contexts(tokenizer, p, i) for p, i in zip(prompts, infos, strict=True)]
    prefixes = {ctx.prefix for ctx in contexts}
    assert len(prefix_runs) == len(prefixes) == 2  # one prefix pass per distinct prompt
    assert {tuple(ids[0].tolist()) + (None,) for ids in prefix_runs} == {
        p[:-1] + (None,) for p in prefixes
    }
    ran = []
    for ids, mask in context_runs:
        cached = mask.shape[1] - ids.shape[1]
        for row_ids, row_mask in zip(ids, mask, strict=True):
            ran.append((cached, row_ids[row_mask[cached:].bool()].tolist()))
    expected = []
    for ctx, completion in zip(contexts, completions, strict=True):
        for suffix in dict.fromkeys(ctx.suffixes):  # distinct contexts of the row, once each
            full = [*ctx.prefix, *suffix, *completion]
            expected.append((len(ctx.prefix) - 1, full[len(ctx.prefix) - 1 : -1]))
            assert full[-len(completion) :] == completion
    assert sorted(ran) == sorted(expected)
    # Row 1 has an empty info: its minus_2 context is the full one and is not run twice.
    assert len(ran) == sum(len(set(ctx.suffixes)) for ctx in contexts) == 6 * 4 - 2


def test_shared_stems_form_the_radix_tree_of_shared_runs():
    rule, schema = list(range(100, 112)), list(range(200, 230))
    sequences = [
        [*rule, 1, *schema, 7],  # rule, verdict 1, schema, ...
        [*rule, 1, *schema, 8],
        [*rule, 2, 3],  # rule, another verdict
        [*rule, 2, 4],
        [9, 9, 9],  # shares nothing
        [*rule, 1, *schema, 7],  # a duplicate of the first
    ]
    stems, stem_of = _shared_stems(sequences, min_tokens=8)
    runs = [tuple(sequences[s.source][s.start : s.stop]) for s in stems]
    assert runs == [tuple(rule), (1, *schema)]  # "rule + 2" shares 1 token: not a stem
    assert stems[1].parent == 0 and stems[0].parent is None
    assert stem_of == [1, 1, 0, 0, None, 1]
    # With no threshold every token shared by two sequences is in exactly one stem.
    stems, stem_of = _shared_stems(sequences, min_tokens=1)
    assert [tuple(sequences[s.source][s.start : s.stop]) for s in stems] == [
        tuple(rule),
        (1, *schema),
        (2,),
        (7,),
    ]
    assert stem_of == [3, 1, 2, 2, None, 3]


def test_shared_information_runs_once_and_changes_nothing(sharp):
    """A group whose rows share long information (a schema, a reference) but differ in their
    verdicts: the distances equal the naive reference, and far fewer tokens are run."""
    model, tokenizer = sharp
    schema = "Database schema:\n" + "\n".join(
        f"CREATE TABLE t{i} (id INTEGER PRIMARY KEY, name TEXT, value REAL);" for i in range(6)
    )
    reference = "Reference query: SELECT name FROM t1 WHERE value > 3 ORDER BY name"
    texts = [
        "<answer>SELECT name FROM t1 WHERE value > 3 ORDER BY name</answer>",
        "<answer>SELECT * FROM t1</answer>",
        "<answer>SELECT nme FROM t1</answer>",
        "<answer>SELECT name FROM t1 WHERE value > 3 ORDER BY name</answer>",  # a duplicate
    ]
    completions = [tokenizer(t, add_special_tokens=False)["input_ids"] + [2] for t in texts]
    verdicts = ["the query runs", "the query runs", "Database error: no such column: nme", "ok"]
    infos = [
        [INFOS[0], f"{schema}\nVerdict: {verdict}.", f"{reference}\nVerdict: {i}."]
        for i, verdict in enumerate(verdicts)
    ]
    prompts = [MESSAGES] * 4
    tokens_run = []

    def count(_module, args, kwargs):
        mask = kwargs.get("attention_mask")
        ids = kwargs.get("input_ids", args[0] if args else None)
        if mask is not None:
            tokens_run[-1] += int(mask[:, -ids.shape[1] :].sum())

    handle = model.get_decoder().register_forward_pre_hook(count, with_kwargs=True)
    results = []
    try:
        for share, batch_size in [(True, 3), (True, 64), (False, 64)]:
            tokens_run.append(0)
            results.append(
                replay_distances(
                    model,
                    tokenizer,
                    prompts,
                    completions,
                    infos,
                    batch_size=batch_size,
                    share_information=share,
                )[0]
            )
    finally:
        handle.remove()
    naive, _ = naive_replay_distances(model, tokenizer, prompts, completions, infos)
    assert naive.max() > 0.05
    for distance in results:
        torch.testing.assert_close(distance, naive, atol=1e-5, rtol=0)
    assert tokens_run[0] == tokens_run[1] < 0.5 * tokens_run[2]


# ----------------------------------------------------------------------------- replay values


@pytest.mark.parametrize("mode", ["leave_one_out", "add_one"])
def test_chunked_replay_equals_naive_reference(tiny, sharp, rows, mode):
    prompts, completions, infos = rows
    for model, tokenizer in (tiny, sharp):
        reference, reference_mask = naive_replay_distances(
            model, tokenizer, prompts, completions, infos, mode=mode
        )
        assert reference.max() > 1e-3  # the comparison is not between zeros
        if model is sharp[0]:  # the reference itself, left-padded in batches
            padded, _ = naive_replay_distances(
                model, tokenizer, prompts, completions, infos, mode=mode, batch_size=7
            )
            torch.testing.assert_close(padded, reference, atol=1e-5, rtol=0)
        for chunk_size, batch_size in [(1, 3), (7, 5), (4096, 64)]:
            distance, mask = replay_distances(
                model,
                tokenizer,
                prompts,
                completions,
                infos,
                mode=mode,
                chunk_size=chunk_size,
                batch_size=batch_size,
            )
            assert torch.equal(mask, reference_mask)
            torch.testing.assert_close(distance, reference, atol=1e-5, rtol=0)


def test_sharp_model_gives_large_distances(sharp, rows):
    prompts, completions, infos = rows
    distance, _ = replay_distances(*sharp, prompts, completions, infos)
    assert distance.max() > 0.3
    assert (distance >= 0).all() and (distance <= 1).all()


def test_padded_batch_equals_each_row_alone(sharp, rows):
    model, tokenizer = sharp
    prompts, completions, infos = rows
    together, mask = replay_distances(model, tokenizer, prompts, completions, infos, batch_size=64)
    for row in range(len(prompts)):
        alone, alone_mask = replay_distances(
            model, tokenizer, [prompts[row]], [completions[row]], [infos[row]], batch_size=64
        )
        size = len(completions[row])
        assert mask[row].sum() == size and alone_mask.shape == (1, size)
        torch.testing.assert_close(together[row, :, :size], alone[0], atol=1e-5, rtol=0)
        assert together[row, :, size:].eq(0).all()


def test_empty_information_gives_zero_distance(tiny, rows):
    model, tokenizer = tiny
    prompts, completions, infos = rows
    for mode in ("leave_one_out", "add_one"):
        distance, mask = replay_distances(model, tokenizer, prompts, completions, infos, mode=mode)
        assert distance[1, 1].eq(0).all() and distance[4, 2].eq(0).all()  # the empty infos
        assert (distance[0][:, mask[0].bool()] > 0).all()  # the others do change the context
    # A row without any information: every context is the bare prompt, nothing to compare.
    blank = [["", "", ""], infos[0]]
    distance, mask = replay_distances(model, tokenizer, prompts[:2], completions[:2], blank)
    assert distance[0].eq(0).all() and mask[0].sum() == len(completions[0])
    reference, _ = naive_replay_distances(model, tokenizer, prompts[:2], completions[:2], blank)
    torch.testing.assert_close(distance, reference, atol=1e-5, rtol=0)
    assert distance[1].max() > 1e-3


def test_string_prompts_and_one_token_prompt(sharp):
    model, tokenizer = sharp
    one_token = tokenizer.convert_ids_to_tokens(300)
    prompts = [
        "Question: which singers are older than 30?",
        tokenizer.convert_tokens_to_string([one_token]),
    ]
    assert len(tokenizer(prompts[1])["input_ids"]) == 1  # no prefix cache for this row
    completions = [[40, 41, 42, 43], torch.tensor([44, 45])]
    infos = [["Schema: singer(name, age)"], ["Reference: SELECT name"]]
    distance, mask = replay_distances(model, tokenizer, prompts, completions, infos, chunk_size=3)
    reference, _ = naive_replay_distances(model, tokenizer, prompts, completions, infos)
    torch.testing.assert_close(distance, reference, atol=1e-5, rtol=0)
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert distance[0].min() > 0


def test_training_mode_restored_and_no_gradients(tiny, rows):
    model, tokenizer = tiny
    prompts, completions, infos = rows
    model.train()
    try:
        distance, _ = replay_distances(model, tokenizer, prompts[:2], completions[:2], infos[:2])
        assert model.training
        assert not distance.requires_grad
    finally:
        model.eval()


# ----------------------------------------------------------------------------- bad input


def test_bad_input_raises_naming_the_argument(tiny):
    model, tokenizer = tiny
    good = ([MESSAGES], [[5, 6]], [["a", "b"]])
    with pytest.raises(ValueError, match="completion_ids"):
        replay_distances(model, tokenizer, [MESSAGES, MESSAGES], [[5, 6]], [["a"], ["b"]])
    with pytest.raises(ValueError, match="infos"):
        replay_distances(model, tokenizer, [MESSAGES], [[5, 6]], [["a"], ["b"]])
    with pytest.raises(ValueError, match=r"infos\[1\]"):
        replay_distances(model, tokenizer, [MESSAGES] * 2, [[5], [6]], [["a", "b"], ["c"]])
    with pytest.raises(ValueError, match=r"completion_ids\[0\] is empty"):
        replay_distances(model, tokenizer, [MESSAGES], [[]], [["a"]])
    with pytest.raises(ValueError, match="mode"):
        replay_distances(model, tokenizer, *good, mode="all")
    with pytest.raises(ValueError, match="chunk_size"):
        replay_distances(model, tokenizer, *good, chunk_size=0)
    with pytest.raises(ValueError, match="batch_size"):
        replay_distances(model, tokenizer, *good, batch_size=0)
    with pytest.raises(ValueError, match="infos"):
        replay_distances(model, tokenizer, [MESSAGES], [[5]], [[]])
    with pytest.raises(ValueError, match=r"infos\[0\]"):
        replay_distances(model, tokenizer, [MESSAGES], [[5]], ["abc"])
    with pytest.raises(ValueError, match="prompts"):
        replay_distances(model, tokenizer, [[{"role": "system", "content": "x"}]], [[5]], [["a"]])
    with pytest.raises(ValueError, match="prompts"):
        replay_distances(model, tokenizer, [""], [[5]], [["a"]])
    without_template = copy.deepcopy(tokenizer)
    without_template.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        replay_distances(model, without_template, *good)
    with pytest.raises(ValueError, match="logits_p"):
        js_distance([0.0, 1.0], torch.zeros(2))


def test_qwen2_model_matches_naive_reference(tiny, rows):
    """Another architecture (bias in q/k/v, its own cache plumbing) through the same path."""
    _, tokenizer = tiny
    model = tiny_qwen2_model(len(tokenizer), seed=0, hidden_size=64)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # peaked distributions: distances far from 0
    prompts, completions, infos = rows
    distance, _ = replay_distances(model, tokenizer, prompts, completions, infos, batch_size=5)
    reference, _ = naive_replay_distances(model, tokenizer, prompts, completions, infos)
    assert reference.max() > 0.01
    torch.testing.assert_close(distance, reference, atol=1e-5, rtol=0)


def test_copied_prefix_cache_fallback_matches(sharp, rows, monkeypatch):
    """Layer types other than plain full attention get a per-batch copy of the prefix cache."""
    import mrtpo.relevance.replay as replay

    model, tokenizer = sharp
    prompts, completions, infos = rows
    shared, _ = replay_distances(model, tokenizer, prompts, completions, infos, batch_size=5)
    monkeypatch.setattr(replay, "plain_layers", lambda *args: None)
    copied, _ = replay_distances(model, tokenizer, prompts, completions, infos, batch_size=5)
    torch.testing.assert_close(copied, shared, atol=1e-6, rtol=0)
    assert shared.max() > 0.1
