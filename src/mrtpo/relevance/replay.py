"""The replay: per-token JS distance of each reward's information, kept cheap.

``replay_distances`` teacher-forces each response's generated ids after its K + 1 contexts
(``contexts``) and takes the JS distance (``distance``) of the reference context's next-token
distribution against each other one's. How it is kept cheap (the Cost section of
``docs/METHOD.md``):
- Only the contexts the caller wants run (``wanted``): a reward whose advantage Ã_k is 0 on a
  row cannot change that row's token advantages, so its ``minus_k`` (``plus_k``) context is
  not run; a row with no wanted reward runs nothing.
- Every context of a prompt shares the prompt as a prefix (their longest common token prefix,
  up to the last tokens of the prompt). That prefix is run once per distinct prompt (the G
  rows of a group share it); its KV cache is reused by all ``G * (K + 1)`` contexts, which
  only run (the rest of their ids + completion). Identical contexts of a
  row run once (e.g. an empty information string), and their distance is exactly 0.
- The contexts of a prompt repeat the same information: a piece sits in K of a row's K + 1
  contexts, and a format rule, a schema or a reference is the same in all G rows. Every run of
  at least ``SHARE_MIN_TOKENS`` tokens that several contexts share after the prompt (the radix
  tree of their token ids, ``_shared_stems``) runs once, as a stem whose keys/values those
  contexts read (``kv_share``); each context then runs only what is its own. Same tokens at
  the same positions: the same result.
- Only the last hidden states are kept; the vocabulary projection, log-softmax and JS distance
  run over chunks of ``chunk_size`` positions, so ``(rows, K + 1, T, V)`` never exists at once.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mrtpo.relevance.contexts import (
    Contexts,
    check_inputs,
    check_positive,
    contexts_of_rows,
    share_prefixes,
)
from mrtpo.relevance.distance import chunked_distances
from mrtpo.relevance.head import PolicyHead
from mrtpo.relevance.kv_share import (
    batch_cache,
    cache_keyword,
    plain_layers,
    reusable,
    run_body,
)

DEFAULT_CHUNK_SIZE = 64  # response positions (all rows pooled) per lm_head + JS chunk
DEFAULT_BATCH_SIZE = 16  # contexts per forward pass
SHARE_MIN_TOKENS = 8  # a shared run of information shorter than this is not run apart


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@dataclass(frozen=True)
class _Stem:
    """A run of context tokens that several jobs of one prompt share: ``ids[start:stop]`` of
    job ``source``, run once on top of its parent stem (``None``: on the prompt alone)."""

    start: int
    stop: int
    parent: int | None
    source: int


def _shared_stems(
    sequences: Sequence[Sequence[int]], min_tokens: int
) -> tuple[list[_Stem], list[int | None]]:
    """The stems of a set of token sequences (the radix tree of their shared prefixes).

    Every run of at least ``min_tokens`` tokens that two or more sequences share (after their
    nearest shared ancestor) becomes a stem; shorter shared runs stay with their children.
    Returns the stems, parents before children, and each sequence's deepest stem (None: it
    shares nothing). Running each stem once and each sequence only after its stem runs every
    shared token once.
    """
    stems: list[_Stem] = []
    stem_of: list[int | None] = [None] * len(sequences)
    pending = [(list(range(len(sequences))), 0, None, 0)]  # members, depth, parent, its stop
    while pending:
        members, depth, parent, parent_stop = pending.pop()
        groups: dict[int, list[int]] = {}
        for job in members:
            if len(sequences[job]) > depth:
                groups.setdefault(sequences[job][depth], []).append(job)
        for group in groups.values():
            if len(group) < 2:
                continue
            first = sequences[group[0]]
            stop = min(len(sequences[job]) for job in group)
            for job in group[1:]:
                other, shared = sequences[job], depth + 1
                while shared < stop and other[shared] == first[shared]:
                    shared += 1
                stop = shared
            here, here_stop = parent, parent_stop
            if stop - parent_stop >= min_tokens:
                stems.append(_Stem(parent_stop, stop, parent, group[0]))
                here, here_stop = len(stems) - 1, stop
                for job in group:
                    stem_of[job] = here
            pending.append((group, stop, here, here_stop))
    return stems, stem_of


def _batches(lengths: Sequence[int], batch_size: int, slack: float = 0.25) -> list[list[int]]:
    """Indices of ``lengths`` in batches of at most ``batch_size``, shortest first; a batch is
    closed early when padding its rows to the longest would add more than ``slack`` of its
    real tokens (a padded position costs as much as a real one)."""
    order = sorted(range(len(lengths)), key=lambda index: lengths[index])
    batches: list[list[int]] = []
    real = 0
    for index in order:
        batch = batches[-1] if batches else None
        if (
            batch is None
            or len(batch) == batch_size
            or (len(batch) + 1) * lengths[index] > (1 + slack) * (real + lengths[index])
        ):
            batches.append([index])
            real = lengths[index]
        else:
            batch.append(index)
            real += lengths[index]
    return batches


def _run_batch(
    body: Any,
    keyword: str,
    config: Any,
    device: torch.device,
    pad_id: int,
    prefix_cache: Any,
    shared: list[tuple[Tensor, Tensor]] | None,
    cached: int,
    items: list[tuple[list[int], list[tuple[Tensor, Tensor]] | None]],
    record: bool,
) -> tuple[Tensor, Any]:
    """Run (ids, stem keys/values per layer or None) items as one right-padded batch after the
    cached prompt; each item's positions continue after the prompt and its stem.

    Returns the last hidden states (B, W, H) and the batch's cache (its layers' ``new`` states
    when ``record``).
    """
    stems = [stem for _, stem in items]
    stem_lengths = [0 if stem is None else stem[0][0].shape[-2] for stem in stems]
    stem_width = max(stem_lengths)
    width = max(len(ids) for ids, _ in items)
    input_ids = torch.full((len(items), width), pad_id, dtype=torch.long, device=device)
    attention = torch.zeros(
        len(items), cached + stem_width + width, dtype=torch.long, device=device
    )
    attention[:, :cached] = 1
    positions = torch.arange(width, device=device).repeat(len(items), 1)
    for row, ((ids, _), stem_length) in enumerate(zip(items, stem_lengths, strict=True)):
        input_ids[row, : len(ids)] = torch.tensor(ids, device=device)
        attention[row, cached : cached + stem_length] = 1
        attention[row, cached + stem_width : cached + stem_width + len(ids)] = 1
        positions[row] += cached + stem_length
    cache = batch_cache(prefix_cache, shared, stems, record, config) if cached else None
    hidden, _ = run_body(
        body,
        keyword,
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        cache=cache,
        use_cache=cached > 0,
    )
    return hidden, cache


def _run_stems(
    run: Any, stems: list[_Stem], sequences: list[tuple[int, ...]], batch_size: int
) -> list[list[tuple[Tensor, Tensor]]]:
    """Each stem's keys/values per layer, (1, heads, stop, head_dim): its ancestors' then its
    own tokens'. Stems of one depth run in batches, after their parents' depth."""
    states: list[list[tuple[Tensor, Tensor]]] = []
    depth: list[int] = []
    for stem in stems:  # parents come first
        depth.append(0 if stem.parent is None else depth[stem.parent] + 1)
        states.append([])
    for level in range(max(depth, default=-1) + 1):
        todo = [index for index, d in enumerate(depth) if d == level]
        lengths = [stems[s].stop - stems[s].start for s in todo]
        for batch in _batches(lengths, batch_size):
            batch = [todo[at] for at in batch]
            items = [
                (
                    list(sequences[stems[s].source][stems[s].start : stems[s].stop]),
                    None if stems[s].parent is None else states[stems[s].parent],
                )
                for s in batch
            ]
            _, cache = run(items, True)
            for b, s in enumerate(batch):
                length = stems[s].stop - stems[s].start
                parent = items[b][1]
                for layer_index, layer in enumerate(cache.layers):
                    new = [part[b : b + 1, :, :length] for part in layer.new]
                    states[s].append(
                        tuple(
                            new[w].clone()
                            if parent is None
                            else torch.cat([parent[layer_index][w], new[w]], dim=-2)
                            for w in (0, 1)
                        )
                    )
    return states


def _replay_hidden(
    model: Any,
    pad_id: int,
    contexts: list[Contexts | None],
    completions: list[list[int]],
    unique: list[list[int]],
    batch_size: int,
    share_min_tokens: int | None = SHARE_MIN_TOKENS,
) -> list[Tensor | None]:
    """Last hidden states predicting each completion token, per row: Tensor[U_i, T_i, H].

    U_i = the row's distinct contexts to run (``unique[i]``: their context indices; slot 0 is
    the reference context); None for a row with a single one or none (its ``contexts[i]``
    may then be None). Rows with the same prefix share one prefix pass, whose KV cache every
    context reads (a model whose cache holds more than attention keys/values, e.g. a hybrid
    recurrent one, runs every context whole instead: ``kv_share.reusable``). Within a prefix,
    runs of context tokens shared by several contexts (the same verifier information in
    several contexts of a row, or in the rows of a group) are run once as stems
    (``share_min_tokens`` tokens at least; None: no stems), and identical (context,
    completion) pairs once. Each context then runs only what is its own, in right-padded
    batches with positions continuing after the prefix and its stem.
    """
    body = model.get_decoder()  # the transformer without its head (through PEFT wrappers too)
    keyword = cache_keyword(body)
    device = _device(model)
    hidden_size = model.config.get_text_config().hidden_size
    dtype = model.get_output_embeddings().weight.dtype
    # A row whose contexts are all the same (no information at all) has distance 0: not run.
    out: list[Tensor | None] = [
        torch.empty(len(unique[i]), len(completions[i]), hidden_size, dtype=dtype, device=device)
        if len(unique[i]) > 1
        else None
        for i in range(len(contexts))
    ]
    by_prefix: dict[tuple[int, ...], list[int]] = {}
    for row, ctx in enumerate(contexts):
        if out[row] is not None:
            by_prefix.setdefault(ctx.prefix, []).append(row)

    reuse_prefix = True  # until the model's cache turns out not to be reusable (kv_share)
    for prefix, rows in by_prefix.items():
        # The prefix's last token is run with each context, so that the hidden state predicting
        # the first completion token always comes from the context pass (even with no suffix).
        # An empty prefix (contexts that differ from their first token on) caches nothing.
        cached = max(len(prefix) - 1, 0) if reuse_prefix else 0
        prefix_cache = shared = None
        if cached:
            ids = torch.tensor([prefix[:-1]], device=device)
            _, prefix_cache = run_body(body, keyword, input_ids=ids, use_cache=True, cache=None)
            reuse_prefix = reusable(prefix_cache)
            if reuse_prefix:
                shared = plain_layers(prefix_cache)
            else:  # e.g. a recurrent state: every context of every prompt runs whole
                cached, prefix_cache = 0, None
        lead = prefix[cached:]  # the prefix tokens each context runs itself
        # Distinct jobs (ids run after the cache, index of the state predicting the first
        # completion token): identical (context, completion) pairs of different rows run once.
        jobs: dict[tuple[tuple[int, ...], int], list[tuple[int, int]]] = {}
        for row in rows:
            for slot, context in enumerate(unique[row]):
                suffix = contexts[row].suffixes[context]
                key = ((*lead, *suffix, *completions[row][:-1]), len(lead) + len(suffix) - 1)
                jobs.setdefault(key, []).append((row, slot))
        keys = list(jobs)
        # A job's shareable part ends before its last context token, whose state it needs.
        stems, stem_of = (
            _shared_stems([ids[:first] for ids, first in keys], share_min_tokens)
            if shared is not None and share_min_tokens is not None
            else ([], [None] * len(keys))
        )
        run = functools.partial(
            _run_batch, body, keyword, model.config, device, pad_id, prefix_cache, shared, cached
        )
        stem_states = _run_stems(run, stems, [ids for ids, _ in keys], batch_size)

        starts = [0 if stem is None else stems[stem].stop for stem in stem_of]
        lengths = [len(ids) - begin for (ids, _), begin in zip(keys, starts, strict=True)]
        for batch in _batches(lengths, batch_size):
            items = [
                (
                    list(keys[job][0][starts[job] :]),
                    None if stem_of[job] is None else stem_states[stem_of[job]],
                )
                for job in batch
            ]
            hidden, _ = run(items, False)
            for b, job in enumerate(batch):
                (ids, first), begin = keys[job], starts[job]
                states = hidden[b, first - begin : len(ids) - begin]
                for row, slot in jobs[keys[job]]:
                    out[row][slot] = states
    return out


def _check_wanted(
    wanted: Tensor | Sequence[Sequence[bool]] | None, num_rows: int, num_rewards: int
) -> list[list[bool]]:
    """``wanted`` as N lists of K bools (every pair when None); the error names its shape."""
    if wanted is None:
        return [[True] * num_rewards for _ in range(num_rows)]
    if isinstance(wanted, Tensor):
        if wanted.dtype != torch.bool:
            raise ValueError(f"wanted must be a bool Tensor[N, K], got dtype {wanted.dtype}")
        wanted = wanted.tolist()
    rows = [list(row) for row in wanted]
    if len(rows) != num_rows or any(len(row) != num_rewards for row in rows):
        lengths = sorted({len(row) for row in rows})
        raise ValueError(
            f"wanted must have shape (N, K) = ({num_rows}, {num_rewards}), got {len(rows)} "
            f"rows of {lengths} entries"
        )
    if not all(isinstance(value, bool) for row in rows for value in row):
        raise ValueError("wanted must hold bools (True: replay that row's reward)")
    return rows


def replay_distances(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str | Sequence[Mapping[str, Any]]],
    completion_ids: Sequence[Sequence[int] | Tensor],
    infos: Sequence[Sequence[str]],
    mode: str = "leave_one_out",
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    batch_size: int = DEFAULT_BATCH_SIZE,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    share_information: bool = True,
    tools: Sequence[Any] | None = None,
    chat_template: str | None = None,
    temperature: float = 1.0,
    lm_head_fp32: bool = False,
    wanted: Tensor | Sequence[Sequence[bool]] | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-token JS distance of each reward's verifier information, by replay.

    Args:
        model: a causal LM (``transformers`` ``*ForCausalLM``); run in eval mode, without
            gradients (its training mode is restored afterwards).
        tokenizer: its tokenizer.
        prompts: N prompts, each a string or a list of chat messages.
        completion_ids: N sequences of generated token ids (list or 1-D tensor, non-empty,
            variable lengths); replayed unchanged.
        infos: N lists of K strings, the verifier information of each reward for that row.
        mode: ``"leave_one_out"`` (full vs. all-but-k) or ``"add_one"`` (bare vs. bare + v_k).
        chunk_size: response positions (of all rows, pooled) per lm_head + log-softmax + JS
            chunk (bounds memory).
        batch_size: contexts per forward pass (bounds memory).
        chat_template_kwargs: extra keyword arguments for ``apply_chat_template``; with
            ``tools`` and ``chat_template``, pass what the prompts were rendered with for
            generation (TRL's ``trainer.chat_template_kwargs``, ``trainer.tools``,
            ``trainer.chat_template``): each context is rendered and tokenized as TRL does.
        share_information: run once the information tokens that several contexts of a prompt
            share (the same text in several contexts of a row, or in several rows of a
            group: a format rule, a schema, a reference) and let each context read their keys
            and values. The result is the same; False runs every context whole (a check).
        tools: the tools rendered into chat prompts (None or empty: none).
        chat_template: a chat template used instead of the tokenizer's.
        temperature: the sampling temperature. The distributions compared are the policy's as
            TRL's loss computes them (``mrtpo.relevance.head``: logit scale, soft-cap, then
            divided by the temperature), under the caller's autocast as TRL's forward is.
        lm_head_fp32: project in float32 outside autocast (TRL's ``cast_lm_head_to_fp32``).
        wanted: Tensor[N, K] bool (or N lists of K bools), the (row, reward) pairs whose
            distance is needed; default every pair. Only the contexts those need run: the
            reference context of a row with any wanted reward, plus ``minus_k`` (``plus_k``)
            for each wanted k. An unwanted pair gets distance 0 (uniform weights), which is
            exact where the reward's advantage Ã_k is 0: its weights multiply 0.

    Returns:
        ``distance``: Tensor[N, K, T] float32 in [0, 1], T = the longest completion, 0 beyond
        a row's completion; ``mask``: Tensor[N, T] float32, 1 on completion tokens. Both on the
        model's device.
    """
    completions, num_rewards = check_inputs(prompts, completion_ids, infos, mode)
    check_positive("chunk_size", chunk_size)
    check_positive("batch_size", batch_size)
    head = PolicyHead.of(model, temperature, lm_head_fp32)
    wanted = _check_wanted(wanted, len(completions), num_rewards)
    # A row with no wanted reward runs nothing, not even its tokenization.
    contexts = contexts_of_rows(
        tokenizer,
        prompts,
        infos,
        mode,
        chat_template_kwargs,
        tools,
        chat_template,
        needed=[any(row) for row in wanted],
    )
    contexts = share_prefixes(contexts, prompts)  # one prefix pass per distinct prompt
    # Distinct contexts per row among those needed (the reference, then each wanted reward's):
    # identical ones (same ids) run once and are exactly 0 apart; an unneeded context takes
    # the reference's slot, so its distance is 0 without being run.
    unique: list[list[int]] = []
    slot_of: list[list[int]] = []
    for ctx, row_wanted in zip(contexts, wanted, strict=True):
        seen: dict[tuple[int, ...], int] = {}
        slots = [0] * (num_rewards + 1)
        first_context: list[int] = []
        needed = [] if ctx is None else [0, *(k + 1 for k in range(num_rewards) if row_wanted[k])]
        for context in needed:
            slots[context] = seen.setdefault(ctx.suffixes[context], len(seen))
            if slots[context] == len(first_context):
                first_context.append(context)
        unique.append(first_context)
        slot_of.append(slots)

    device = _device(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    length = max(len(ids) for ids in completions)
    distance = torch.zeros(len(prompts), num_rewards, length, device=device)
    mask = torch.zeros(len(prompts), length, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for row, ids in enumerate(completions):
                mask[row, : len(ids)] = 1
            hidden = _replay_hidden(
                model,
                pad_id,
                contexts,
                completions,
                unique,
                batch_size,
                SHARE_MIN_TOKENS if share_information else None,
            )
            chunked_distances(
                functools.partial(head.logits, model), hidden, slot_of, chunk_size, distance
            )
    finally:
        model.train(was_training)
    return distance, mask


def contrastive_replay_distances(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str | Sequence[Mapping[str, Any]]],
    completion_ids: Sequence[Sequence[int] | Tensor],
    infos: Sequence[Sequence[str]],
    placebo_infos: Sequence[Sequence[str]],
    wanted: Tensor | Sequence[Sequence[bool]] | None = None,
    **options: Any,
) -> tuple[Tensor, Tensor, Tensor]:
    """Contrastive relevance: each token's distance under the row's own information minus its
    distance under the placebo's, clamped at 0 (``token_relevance="contrastive"``).

    One ``replay_distances`` call over the rows twice, with ``infos`` then with
    ``placebo_infos`` (N lists of K strings each, e.g. ``controls.placebo_infos``): the two
    replays share each prompt's prefix pass and its stems, and a context that is the same in
    both (a placebo text equal to the own, or an empty one) runs once. ``wanted`` (N, K) and
    ``options`` are ``replay_distances``' and apply to both.

    Returns:
        ``distance`` Tensor[N, K, T], the own minus the placebo's, clamped at 0;
        ``placebo_distance`` Tensor[N, K, T], the placebo's; ``mask`` Tensor[N, T].
    """
    if len(placebo_infos) != len(infos):
        raise ValueError(f"placebo_infos has {len(placebo_infos)} rows, infos has {len(infos)}")
    rows = len(prompts)
    if wanted is not None:
        wanted = wanted.repeat(2, 1) if isinstance(wanted, Tensor) else [*wanted, *wanted]
    distance, mask = replay_distances(
        model,
        tokenizer,
        [*prompts, *prompts],
        [*completion_ids, *completion_ids],
        [*infos, *placebo_infos],
        wanted=wanted,
        **options,
    )
    own, placebo = distance[:rows], distance[rows:]
    return (own - placebo).clamp(min=0.0), placebo, mask[:rows]
