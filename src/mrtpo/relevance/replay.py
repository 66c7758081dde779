"""Replay relevance: how much each reward's verifier information changes the policy, per token.

For every response, the *same generated token ids* are teacher-forced after K + 1 contexts
(``../shared/METHOD.md`` step 1): ``leave_one_out`` compares the prompt plus all K verifiers'
information (``full``) with the prompt plus all but reward k's (``minus_k``); ``add_one``
compares the bare prompt with the prompt plus reward k's information only. The distance of
reward k at response token t is the base-2 Jensen-Shannon distance between the two next-token
distributions (step 2), in [0, 1].

How it is kept cheap (the cost section of METHOD.md):
- The verifier information goes after the original prompt, so every context of a prompt shares
  the prompt as a prefix. That prefix is tokenized once and run once per distinct prompt (the
  G rows of a group share it); its KV cache is reused by all ``G * (K + 1)`` contexts, which
  only run (information + completion). Identical contexts of a row run once (e.g. an empty
  information string), and their distance is exactly 0.
- The contexts of a prompt repeat the same information: a piece sits in K of a row's K + 1
  contexts, and a format rule, a schema or a reference is the same in all G rows. Every run of
  at least ``SHARE_MIN_TOKENS`` tokens that several contexts share after the prompt (the radix
  tree of their token ids) runs once, as a stem whose keys/values those contexts read; each
  context then runs only what is its own. Same tokens at the same positions: the same result.
- Only the last hidden states are kept; the vocabulary projection, log-softmax and JS distance
  run over chunks of ``chunk_size`` positions, so ``(rows, K + 1, T, V)`` never exists at once.
``naive_replay_distances`` is the straightforward reference (every full context from scratch,
all logits kept) used by the tests and the benchmark.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

MODES = ("leave_one_out", "add_one")
INFO_SEPARATOR = "\n\n"  # between the original user content and each piece of information
DEFAULT_CHUNK_SIZE = 64  # response positions (all rows pooled) per lm_head + JS chunk
DEFAULT_BATCH_SIZE = 16  # contexts per forward pass
SHARE_MIN_TOKENS = 8  # a shared run of information shorter than this is not run apart
JS_BLOCK_ELEMENTS = 2**19  # entries per JS temporary (2 MiB in float32): stays in CPU caches
_LN2 = math.log(2.0)
_MARKER = "\u2063MRTPO-INFO\u2063"  # an invisible separator that no template or prompt contains


# ----------------------------------------------------------------------------- distance


def _js_from_log_probs(log_p: Tensor, log_q: Tensor, dim: int = -1) -> Tensor:
    """Base-2 JS distance between two distributions given as log-probabilities.

    Per vocabulary entry, with ``B = max(p, q)``, ``delta = -|log q - log p|`` and
    ``r = exp(delta) = min(p, q) / B``, the entry's share of ``2 JSD`` (nats) is
    ``B * (r delta - (1 + r) log((1 + r) / 2))`` >= 0, computed from ``expm1(delta)``. The
    textbook ``p log(p / m)`` sums terms of both signs whose rounding (~1e-6 of log-probs near
    -11) survives the cancellation and is magnified by the square root near 0 (errors ~1e-4
    on close distributions); here each term's error is proportional to its own ``delta``.
    Two transcendental functions per entry and pair (the replay's hot loop).
    """
    shape = torch.broadcast_shapes(log_p.shape, log_q.shape)
    larger, smaller = (log_q, log_p) if log_q.shape == shape else (log_p, log_q)
    larger = larger.exp()  # max(p, q), built in place on the full-size one
    torch.maximum(larger, smaller.exp(), out=larger)
    delta = (log_q - log_p).abs_().neg_()
    # Both -inf: NaN, where larger = 0 anyway. Clamped so that exp(delta) * delta stays finite.
    delta = torch.nan_to_num_(delta, nan=0.0).clamp_(min=-100.0)
    half = torch.expm1(delta).mul_(0.5)  # (r - 1) / 2
    terms = torch.addcmul(delta, delta, half, value=2.0)  # r delta
    del delta
    log_half_sum = torch.log1p(half)  # log((1 + r) / 2)
    terms.sub_(half.add_(1.0).mul_(log_half_sum).mul_(2.0))  # - (1 + r) log((1 + r) / 2)
    del half, log_half_sum
    divergence = terms.mul_(larger).sum(dim) / (2.0 * _LN2)  # JSD in bits
    return divergence.clamp_(0.0, 1.0).sqrt_()  # rounding can dip below 0


def js_distance(logits_p: Tensor, logits_q: Tensor, dim: int = -1) -> Tensor:
    """Base-2 Jensen-Shannon distance ``sqrt(JSD_2(P || Q))`` between ``softmax`` of two logits.

    Args:
        logits_p: Tensor[..., V, ...], unnormalized log-probabilities (``-inf`` allowed).
        logits_q: Tensor broadcastable with ``logits_p``.
        dim: the vocabulary dimension.

    Returns:
        Tensor of the broadcast shape without ``dim``, float32 (or float64 for float64 input),
        in [0, 1]: 0 for equal distributions, 1 for disjoint supports.
    """
    if not isinstance(logits_p, Tensor) or not isinstance(logits_q, Tensor):
        raise ValueError("logits_p and logits_q must be torch.Tensor")
    dtype = torch.float64 if torch.float64 in (logits_p.dtype, logits_q.dtype) else torch.float32
    log_p = torch.log_softmax(logits_p.to(dtype), dim=dim)
    log_q = torch.log_softmax(logits_q.to(dtype), dim=dim)
    return _js_from_log_probs(log_p, log_q, dim=dim)


# ----------------------------------------------------------------------------- contexts


@dataclass(frozen=True)
class Contexts:
    """The K + 1 replay contexts of one row, as token ids.

    Context c is ``prefix + suffixes[c]`` (c = 0: the reference, ``full`` or the bare prompt;
    c = k >= 1: ``minus_k`` or ``plus_k``); the completion ids follow unchanged. ``prefix`` is
    the prompt rendered up to the end of its original (last user) content, tokenized once and
    shared by every context of the prompt.
    """

    prefix: tuple[int, ...]
    suffixes: tuple[tuple[int, ...], ...]

    def ids(self, context: int) -> list[int]:
        return [*self.prefix, *self.suffixes[context]]

    def sequence(self, context: int, completion: Sequence[int]) -> list[int]:
        """The ids teacher-forced for context ``context``: context ids then the completion."""
        return [*self.prefix, *self.suffixes[context], *completion]


def context_infos(infos: Sequence[str], mode: str = "leave_one_out") -> list[list[str]]:
    """Which pieces of information each of the K + 1 contexts appends (empty ones dropped)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    kept = list(infos)
    if mode == "leave_one_out":
        full = [info for info in kept if info]
        minus = [[info for j, info in enumerate(kept) if j != k and info] for k in range(len(kept))]
        return [full, *minus]
    return [[], *[[info] if info else [] for info in kept]]


def _appended_text(pieces: Sequence[str]) -> str:
    """The text added after the original content: nothing when there is no information."""
    return "".join(INFO_SEPARATOR + piece for piece in pieces)


def _render_chat(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], appended: str, template_kwargs: Mapping
) -> str:
    """Messages rendered with ``appended`` added to the last user turn's content."""
    messages = [dict(message) for message in messages]
    last_user = max(i for i, message in enumerate(messages) if message.get("role") == "user")
    messages[last_user]["content"] = messages[last_user]["content"] + appended
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **template_kwargs
    )


def _check_messages(prompt: Sequence[Any], row: int, tokenizer: Any) -> None:
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"prompts[{row}] is a list of chat messages but the tokenizer has no chat template"
        )
    if not all(isinstance(message, Mapping) for message in prompt):
        raise ValueError(f"prompts[{row}] must be a string or a list of chat-message dicts")
    users = [m for m in prompt if m.get("role") == "user"]
    if not users:
        raise ValueError(f"prompts[{row}] has no user message to append verifier information to")
    if not isinstance(users[-1].get("content"), str):
        raise ValueError(f"prompts[{row}]: the last user message's content must be a string")


def _common_prefix(texts: Sequence[str]) -> str:
    first, last = min(texts), max(texts)
    size = 0
    while size < len(first) and first[size] == last[size]:
        size += 1
    return first[:size]


def build_contexts(
    tokenizer: Any,
    prompt: str | Sequence[Mapping[str, Any]],
    infos: Sequence[str],
    mode: str = "leave_one_out",
    chat_template_kwargs: Mapping[str, Any] | None = None,
    row: int = 0,
) -> Contexts:
    """Token ids of the K + 1 replay contexts of one row (without the completion).

    Args:
        tokenizer: a Hugging Face tokenizer (with a chat template when ``prompt`` is messages).
        prompt: the original prompt: a string, or chat messages (the information is appended to
            the last user turn's content, then rendered with ``add_generation_prompt=True``).
        infos: K strings, the verifier information of each reward ("" appends nothing).
        mode: ``"leave_one_out"`` or ``"add_one"``.
        chat_template_kwargs: extra keyword arguments for ``apply_chat_template`` (e.g. tools).
        row: the row's index, for error messages.

    Returns:
        ``Contexts`` whose prefix is tokenized once and shared by all K + 1 contexts.
    """
    template_kwargs = dict(chat_template_kwargs or {})
    appended = [_appended_text(pieces) for pieces in context_infos(infos, mode)]
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"prompts[{row}] is empty: there is no context to replay after")
        # As TRL tokenizes a plain prompt: special tokens (e.g. BOS) on the prompt itself.
        prefix = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        suffixes = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in appended]
        return Contexts(tuple(prefix), tuple(tuple(s) for s in suffixes))

    _check_messages(prompt, row, tokenizer)
    marked = _render_chat(tokenizer, prompt, _MARKER, template_kwargs)
    texts = [_render_chat(tokenizer, prompt, text, template_kwargs) for text in appended]
    shared = marked[: marked.index(_MARKER)] if _MARKER in marked else ""
    if not all(text.startswith(shared) for text in texts):  # a template that rewrites content
        shared = _common_prefix(texts)
    if not shared:
        raise ValueError(f"prompts[{row}] renders to an empty shared prefix")
    # Rendered chat text carries its own special tokens (TRL tokenizes it the same way).
    prefix = tokenizer(shared, add_special_tokens=False)["input_ids"]
    suffixes = [
        tokenizer(text[len(shared) :], add_special_tokens=False)["input_ids"] for text in texts
    ]
    return Contexts(tuple(prefix), tuple(tuple(s) for s in suffixes))


# ----------------------------------------------------------------------------- input checks


def _check_inputs(
    prompts: Sequence[Any], completion_ids: Sequence[Any], infos: Sequence[Sequence[str]], mode: str
) -> tuple[list[list[int]], int]:
    """Completions as lists of ints, and K."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if isinstance(prompts, str):
        raise ValueError("prompts must be a list (one prompt per row), not a string")
    if not len(prompts):
        raise ValueError("prompts is empty")
    if len(completion_ids) != len(prompts):
        raise ValueError(
            f"completion_ids has {len(completion_ids)} rows, prompts has {len(prompts)}"
        )
    if len(infos) != len(prompts):
        raise ValueError(f"infos has {len(infos)} rows, prompts has {len(prompts)}")
    num_rewards = None
    for row, row_infos in enumerate(infos):
        if isinstance(row_infos, str) or not all(isinstance(info, str) for info in row_infos):
            raise ValueError(f"infos[{row}] must be a list of K strings")
        if num_rewards is None:
            num_rewards = len(row_infos)
        elif len(row_infos) != num_rewards:
            raise ValueError(
                f"infos[{row}] has {len(row_infos)} entries, infos[0] has {num_rewards}: K must be equal"
            )
    if not num_rewards:
        raise ValueError("infos must hold at least one string per row (K >= 1)")
    completions = []
    for row, ids in enumerate(completion_ids):
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        if not ids:
            raise ValueError(f"completion_ids[{row}] is empty: there is no token to replay")
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError(f"completion_ids[{row}] must hold integer token ids")
        completions.append(ids)
    return completions, num_rewards


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


# ----------------------------------------------------------------------------- model plumbing


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _logits(model: Any, hidden: Tensor) -> Tensor:
    """Next-token logits (float32) from last hidden states, as the model's head computes them."""
    logits = model.get_output_embeddings()(hidden).float()
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def _cache_keyword(body: torch.nn.Module) -> str:
    """transformers 5 renamed ``past_key_values`` to ``cache`` (older bodies keep the old name)."""
    return "cache" if "cache" in inspect.signature(body.forward).parameters else "past_key_values"


def _run_body(body: Any, keyword: str, **inputs: Any) -> tuple[Tensor, Any]:
    out = body(**{keyword if k == "cache" else k: v for k, v in inputs.items()})
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    return out.last_hidden_state, cache


def _shared_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class SharedLayer(DynamicLayer):
        """One layer's cache for one batch: the prompt's keys/values (shared by every context)
        followed by each context's stem (a run of information tokens it shares with other
        contexts, computed once; rows padded to ``width``).

        ``update`` returns prompt + stem + new states for this forward's attention; the new
        states are kept only when ``record`` is set (a stem being computed), so no layer holds a
        batch's (prompt + context) keys/values once it is done.
        """

        def __init__(self, prompt: tuple[Tensor, Tensor], stems: list, width: int, record: bool):
            super().__init__()
            self.prompt, self.stems, self.width, self.record = prompt, stems, width, record
            self.new: tuple[Tensor, Tensor] | None = None
            self.keys, self.values = prompt
            self.device, self.is_initialized = prompt[0].device, True

        def get_seq_length(self) -> int:
            return self.prompt[0].shape[-2] + self.width

        def _with_past(self, states: Tensor, which: int) -> Tensor:
            batch, heads, length, dim = states.shape
            cached = self.prompt[which].shape[-2]
            # One copy: the prompt broadcast, each stem in its row, zeros where a row's stem is
            # shorter than ``width`` (masked out by the attention mask).
            out = states.new_zeros(batch, heads, cached + self.width + length, dim)
            out[:, :, :cached] = self.prompt[which]
            for row, stem in enumerate(self.stems):
                if stem is not None:
                    out[row, :, cached : cached + stem[which].shape[-2]] = stem[which][0]
            out[:, :, cached + self.width :] = states
            return out

        def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any):
            if self.record:
                self.new = (key_states, value_states)
            return self._with_past(key_states, 0), self._with_past(value_states, 1)

    return SharedLayer


def _plain_layers(prefix_cache: Any) -> list[tuple[Tensor, Tensor]] | None:
    """The prefix's (keys, values) per layer when every layer is plain full attention, else None
    (e.g. sliding-window layers: those get an ordinary copied cache and no stems)."""
    from transformers.cache_utils import DynamicLayer

    if not all(type(layer) is DynamicLayer for layer in prefix_cache.layers):
        return None
    return [(layer.keys, layer.values) for layer in prefix_cache.layers]


def _batch_cache(
    prefix_cache: Any,
    shared: list[tuple[Tensor, Tensor]] | None,
    stems: list[list[tuple[Tensor, Tensor]] | None],
    record: bool,
    config: Any,
) -> Any:
    """The cache for one batch: the shared prompt plus each row's stem, or a plain copy."""
    from transformers import DynamicCache

    if shared is None:  # no stems on this path (see _plain_layers)
        layers = [
            (keys.expand(len(stems), -1, -1, -1), values.expand(len(stems), -1, -1, -1))
            for keys, values, *_ in prefix_cache
        ]
        return DynamicCache(ddp_cache_data=layers, config=config)
    layer_class = _shared_layer_class()
    width = max((stem[0][0].shape[-2] for stem in stems if stem is not None), default=0)
    cache = DynamicCache(config=config)
    cache.layers = [
        layer_class(
            prompt, [None if stem is None else stem[layer] for stem in stems], width, record
        )
        for layer, prompt in enumerate(shared)
    ]
    return cache


# ----------------------------------------------------------------------------- replay


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
    cache = _batch_cache(prefix_cache, shared, stems, record, config) if cached else None
    hidden, _ = _run_body(
        body,
        keyword,
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=positions,
        cache=cache,
        use_cache=cached > 0,
    )
    return hidden, cache


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


def _replay_hidden(
    model: Any,
    pad_id: int,
    contexts: list[Contexts],
    completions: list[list[int]],
    unique: list[list[int]],
    batch_size: int,
    share_min_tokens: int | None = SHARE_MIN_TOKENS,
) -> list[Tensor | None]:
    """Last hidden states predicting each completion token, per row: Tensor[U_i, T_i, H].

    U_i = the row's distinct contexts (``unique[i]``: their context indices; slot 0 is the
    reference context); None for a row with a single distinct context. Rows with the same
    prefix share one prefix pass, whose KV cache every context reads. Within a prefix, runs of
    context tokens shared by several contexts (the same verifier information in several
    contexts of a row, or in the rows of a group) are run once as stems
    (``share_min_tokens`` tokens at least; None: no stems), and identical (context,
    completion) pairs once. Each context then runs only what is its own, in right-padded
    batches with positions continuing after the prefix and its stem.
    """
    body = model.get_decoder()  # the transformer without its head (through PEFT wrappers too)
    keyword = _cache_keyword(body)
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

    for prefix, rows in by_prefix.items():
        # The prefix's last token is run with each context, so that the hidden state predicting
        # the first completion token always comes from the context pass (even with no suffix).
        cached = len(prefix) - 1
        prefix_cache = shared = None
        if cached:
            ids = torch.tensor([prefix[:-1]], device=device)
            _, prefix_cache = _run_body(body, keyword, input_ids=ids, use_cache=True, cache=None)
            shared = _plain_layers(prefix_cache)
        # Distinct jobs (ids run after the cache, index of the state predicting the first
        # completion token): identical (context, completion) pairs of different rows run once.
        jobs: dict[tuple[tuple[int, ...], int], list[tuple[int, int]]] = {}
        for row in rows:
            for slot, context in enumerate(unique[row]):
                suffix = contexts[row].suffixes[context]
                key = ((prefix[-1], *suffix, *completions[row][:-1]), len(suffix))
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


def _chunks(sizes: dict[int, int], chunk_size: int) -> list[list[tuple[int, int, int]]]:
    """Response positions of all rows packed into chunks of at most ``chunk_size`` positions.

    Each chunk is a list of (row, start, stop) pieces; a row longer than ``chunk_size`` is
    split. Packing short rows together keeps the vocabulary projection a large matmul.
    """
    pieces = [
        (row, start, min(start + chunk_size, size))
        for row, size in sizes.items()
        for start in range(0, size, chunk_size)
    ]
    chunks: list[list[tuple[int, int, int]]] = []
    used = chunk_size
    for piece in pieces:
        length = piece[2] - piece[1]
        if used + length > chunk_size:
            chunks.append([])
            used = 0
        chunks[-1].append(piece)
        used += length
    return chunks


def _chunked_distances(
    model: Any,
    hidden: list[Tensor | None],
    slot_of: list[list[int]],
    chunk_size: int,
    distance: Tensor,
) -> None:
    """Fill ``distance`` (Tensor[N, K, T]) from the hidden states, chunk by chunk.

    Per chunk of pooled positions: the K + 1 contexts' states laid out as (K + 1, P, H), one
    vocabulary projection, one log-softmax and one JS call of the reference against the K
    others. Few, large operations: per-operation overhead (and thread synchronisation on a
    busy CPU) stays small. A context identical to the reference gives exactly 0.
    """
    sizes = {row: states.shape[1] for row, states in enumerate(hidden) if states is not None}
    for chunk in _chunks(sizes, chunk_size):
        states = torch.cat(
            [hidden[row][slot_of[row], start:stop] for row, start, stop in chunk], dim=1
        )  # (K + 1, P, H): slot_of maps each context to its distinct hidden states
        log_probs = torch.log_softmax(_logits(model, states), dim=-1)
        # The JS temporaries (K, block, V) are kept cache-sized: several times faster on CPU.
        block = max(1, JS_BLOCK_ELEMENTS // (log_probs[1:, :1].numel()))
        values = torch.cat(
            [
                _js_from_log_probs(log_probs[:1, at : at + block], log_probs[1:, at : at + block])
                for at in range(0, log_probs.shape[1], block)
            ],
            dim=1,
        )  # (K, P)
        offset = 0
        for row, start, stop in chunk:
            distance[row, :, start:stop] = values[:, offset : offset + stop - start]
            offset += stop - start


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
        chat_template_kwargs: extra keyword arguments for ``apply_chat_template``.
        share_information: run once the information tokens that several contexts of a prompt
            share (the same text in several contexts of a row, or in several rows of a
            group: a format rule, a schema, a reference) and let each context read their keys
            and values. The result is the same; False runs every context whole (a check).

    Returns:
        ``distance``: Tensor[N, K, T] float32 in [0, 1], T = the longest completion, 0 beyond
        a row's completion; ``mask``: Tensor[N, T] float32, 1 on completion tokens. Both on the
        model's device.
    """
    completions, num_rewards = _check_inputs(prompts, completion_ids, infos, mode)
    _check_positive("chunk_size", chunk_size)
    _check_positive("batch_size", batch_size)
    contexts = [
        build_contexts(tokenizer, prompt, row_infos, mode, chat_template_kwargs, row)
        for row, (prompt, row_infos) in enumerate(zip(prompts, infos, strict=True))
    ]
    # Distinct contexts per row: identical ones (same ids) run once and are exactly 0 apart.
    unique: list[list[int]] = []
    slot_of: list[list[int]] = []
    for ctx in contexts:
        seen: dict[tuple[int, ...], int] = {}
        slots = [seen.setdefault(suffix, len(seen)) for suffix in ctx.suffixes]
        first_context = {slot: c for c, slot in reversed(list(enumerate(slots)))}
        unique.append([first_context[slot] for slot in range(len(seen))])
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
            _chunked_distances(model, hidden, slot_of, chunk_size, distance)
    finally:
        model.train(was_training)
    return distance, mask


def naive_replay_distances(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str | Sequence[Mapping[str, Any]]],
    completion_ids: Sequence[Sequence[int] | Tensor],
    infos: Sequence[Sequence[str]],
    mode: str = "leave_one_out",
    batch_size: int = 1,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[Tensor, Tensor]:
    """The straightforward replay, as a reference: same contract as ``replay_distances``.

    Every full context (prompt + information + completion) runs from scratch through the whole
    model, ``batch_size`` left-padded sequences at a time, computing logits at the completion
    positions only; all ``(N, K + 1, T, V)`` completion logits are kept, then the JS distances
    are taken row by row.
    """
    completions, num_rewards = _check_inputs(prompts, completion_ids, infos, mode)
    _check_positive("batch_size", batch_size)
    device = _device(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    length = max(len(ids) for ids in completions)
    vocab = model.get_output_embeddings().weight.shape[0]
    logits = torch.zeros(len(prompts), num_rewards + 1, length, vocab, device=device)
    mask = torch.zeros(len(prompts), length, device=device)
    jobs = []  # (row, context, ids: the context then the completion but its last token)
    for row, (prompt, row_infos) in enumerate(zip(prompts, infos, strict=True)):
        ctx = build_contexts(tokenizer, prompt, row_infos, mode, chat_template_kwargs, row)
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
