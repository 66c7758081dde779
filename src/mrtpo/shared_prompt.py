"""Each distinct prompt of a micro-batch runs once, for its whole group (issue 27).

GRPO samples every prompt G times and TRL runs each row, prompt + completion, whole: on the
tool task 88% of a step's tokens are prompt copies. Here the rows of a group (consecutive rows
with the same prompt) are packed into one sequence

    [ prompt[:-1] | prompt[-1] c_1 | prompt[-1] c_2 | ... | prompt[-1] c_G ]
      prompt part   one segment per completion, each C + 1 tokens

with explicit position ids (the prompt part 0..p-2, every segment p-1..p-1+C, so RoPE sees each
completion right after the prompt, as in its own row), and an attention function registered
with transformers' ``AttentionInterface`` splits every layer's queries, keys and values in two:
the prompt part attends causally to itself; each segment's queries, reshaped to one row per
completion, attend to the prompt part's keys and causally to their own segment's keys. Both are
calls to torch's scaled-dot-product attention (fused kernels on an accelerator); no
(prompt + G C)^2 mask exists anywhere. Each segment repeats the prompt's last token because that
position predicts the completion's first token, a different label for each completion, and
TRL's fused LM head scores one label per position (its ``shift_labels``). The prompt part's
keys and values are read by every segment, so autograd sums the G segments' gradients into the
shared prompt: the same parameter gradients as G copies, from one forward of the prompt.

Everything the attention needs travels in the forward's keyword arguments (the
``shared_prompt_layout`` argument that transformers hands to the attention function), so a
gradient-checkpointed layer recomputed during backward gets it again. The attention
implementation is installed once per model (``install_shared_prompt_attention``) and stays:
without a layout it is transformers' ``sdpa``, unchanged, so generation and the per-row path
are untouched.

Also here, for the trainer: finding the groups (``prompt_groups``), cutting a micro-batch's
padding (``trim_padding``), shuffling whole groups (``shuffle_groups``, so micro-batches keep
their groups together) and generating with one prefill per prompt
(``generate_with_shared_prefill``, or ``install_shared_prefill`` for TRL's ``generate`` calls).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from mrtpo.relevance.kv_share import cache_keyword

ATTENTION_NAME = "mrtpo_shared_prompt"
SUPPORTED_MODEL_TYPES = ("llama", "qwen2")  # the families the exactness tests cover
PROMPT_KEYS = ("prompt_ids", "prompt_mask")
# transformers' RoPE types whose frequencies are recomputed from the largest position id
LENGTH_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})
_IGNORE = -100  # the label that TRL's fused head does not score
# cache_implementation values that transformers' generate (5.x) unsets, building its default
# dynamic cache instead: checkpoints with sliding-window layers used to ship "hybrid" (Gemma's)
UNSET_BY_GENERATE = frozenset({"hybrid"})

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------ groups


def prompt_groups(prompt_ids: Tensor, prompt_mask: Tensor) -> list[int]:
    """Sizes of the runs of consecutive rows with identical prompts, in row order.

    ``prompt_ids``, ``prompt_mask``: (B, P), left-padded (as TRL pads prompts); two rows share a
    prompt when their real tokens are the same (the padding's token ids do not matter).
    Returns sizes summing to B, e.g. ``[4, 4, 1]``.
    """
    if prompt_ids.shape != prompt_mask.shape or prompt_ids.ndim != 2:
        raise ValueError(
            f"prompt_ids {tuple(prompt_ids.shape)} and prompt_mask {tuple(prompt_mask.shape)} "
            "must be the same (B, P) shape"
        )
    mask = prompt_mask.bool()
    if (mask[:, :-1] & ~mask[:, 1:]).any():
        raise ValueError("prompt_mask must be left-padded (zeros before ones in every row)")
    if prompt_ids.size(0) == 0:
        return []
    if not mask[:, -1].all():
        raise ValueError("every prompt needs at least one token (a prompt_mask row is all zeros)")
    same_mask = (mask[1:] == mask[:-1]).all(dim=1)
    same_ids = ((prompt_ids[1:] == prompt_ids[:-1]) | ~mask[1:]).all(dim=1)
    starts = [0, *(torch.nonzero(~(same_mask & same_ids)).flatten() + 1).tolist()]
    return [
        end - start for start, end in zip(starts, [*starts[1:], prompt_ids.size(0)], strict=True)
    ]


# ------------------------------------------------------------------ model support


def _pretrained(model: torch.nn.Module) -> Any:
    """The transformers model inside a DDP/accelerate (``.module``) or PEFT wrapper."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    if hasattr(model, "get_base_model"):
        if getattr(getattr(model, "active_peft_config", None), "is_prompt_learning", False):
            raise ValueError(
                "shared prompts cannot serve PEFT prompt learning: its virtual tokens are "
                "prepended to every row"
            )
        model = model.get_base_model()
    return model


def check_supported(model: torch.nn.Module) -> None:
    """Raise ValueError naming the reason when shared prompts cannot serve ``model``.

    Served: text-only Llama-family and Qwen2 models whose every layer is full attention, on
    transformers' ``sdpa`` attention (the default). Vision-language models, sliding-window
    layers (a window cut differently for a segment than for its own row), RoPE whose
    frequencies depend on the sequence's length (``dynamic``, ``longrope``: a packed row's
    largest position is not its per-row copy's) and other attention implementations are
    refused.
    """
    config = _pretrained(model).config
    if getattr(config, "vision_config", None) is not None or config.get_text_config() is not config:
        raise ValueError(
            f"shared prompts serve text-only models; {type(_pretrained(model)).__name__} "
            "takes vision inputs"
        )
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"shared prompts are tested on {SUPPORTED_MODEL_TYPES} models, not {config.model_type!r}"
        )
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if any(kind != "full_attention" for kind in layer_types) or getattr(
        config, "use_sliding_window", False
    ):
        raise ValueError(
            "shared prompts need full attention in every layer; this model has sliding-window "
            f"layers (layer_types={sorted(set(layer_types))})"
        )
    length_dependent = sorted(set(_rope_types(config)) & LENGTH_DEPENDENT_ROPE)
    if length_dependent:
        raise ValueError(
            f"shared prompts need RoPE frequencies that do not depend on the sequence's length; "
            f"this model's rope_type {length_dependent[0]!r} recomputes them from the largest "
            "position, which differs between a packed group and its rows"
        )
    if config._attn_implementation not in ("sdpa", ATTENTION_NAME):
        raise ValueError(
            f"shared prompts run on sdpa attention; the model uses {config._attn_implementation!r} "
            "(load it with attn_implementation='sdpa')"
        )


def _rope_types(config: Any) -> list[str]:
    """The config's RoPE types: one, or one per layer type (``rope_parameters`` keyed by it)."""
    parameters = getattr(config, "rope_parameters", None) or {}
    nested = [value for value in parameters.values() if isinstance(value, dict)]
    return [
        kind
        for entry in (parameters, *nested)
        if (kind := entry.get("rope_type", entry.get("type"))) is not None
    ]


def install_shared_prompt_attention(model: torch.nn.Module) -> None:
    """Switch ``model`` (wrapped or not) to the shared-prompt attention, once and for good.

    Without a ``shared_prompt_layout`` argument the new attention is ``sdpa`` with ``sdpa``'s
    masks, so every other forward (generation, the per-row path) computes what it did. It must
    stay installed while a packed forward can still be recomputed by gradient checkpointing in
    a backward pass, which is why it is not a context manager.
    """
    check_supported(model)
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, _attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, sdpa_mask)
    _pretrained(model).set_attn_implementation(ATTENTION_NAME)


def _attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    shared_prompt_layout: PackedLayout | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function contract: query (N, H, L, D), key/value (N, Hkv, L, D)
    -> (N, L, H, D). Packed groups when a layout is given, plain ``sdpa`` otherwise."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if shared_prompt_layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return shared_prompt_layout.attend(module, query, key, value, **kwargs)


# ------------------------------------------------------------------ packing


@dataclass
class PackedLayout:
    """Where the parts of the packed rows lie; handed to every attention call.

    A packed row is ``prompt_width`` columns of prompt (the prompt without its last token,
    right-padded to the longest in the micro-batch) followed by ``segments`` segments of
    ``segment_width`` = C + 1 columns. ``segment_mask``, (U * G, 1, S, prompt_width + S) bool,
    is what each segment's queries may read: its group's real prompt keys, then its own
    segment's keys causally.
    """

    prompt_width: int
    segments: int
    segment_width: int
    segment_mask: Tensor

    def attend(
        self, module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, **kwargs: Any
    ) -> tuple[Tensor, None]:
        """query (U, H, W + G S, D), key/value (U, Hkv, W + G S, D) -> (U, W + G S, H, D)."""
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        if kwargs.get("sliding_window") is not None:
            raise ValueError("shared prompts need full attention; this layer has a sliding window")
        kwargs.pop("is_causal", None)
        width, groups, length = self.prompt_width, query.size(0), self.segment_width

        def per_segment(states: Tensor) -> Tensor:  # (U, h, W + G S, D) -> (U G, h, S, D)
            heads, dim = states.size(1), states.size(-1)
            states = states[:, :, width:].reshape(groups, heads, self.segments, length, dim)
            return states.transpose(1, 2).reshape(groups * self.segments, heads, length, dim)

        def with_prompt(states: Tensor) -> Tensor:  # the group's prompt keys before each segment
            prompt = states[:, :, :width].repeat_interleave(self.segments, dim=0)
            return torch.cat([prompt, per_segment(states)], dim=2)

        segment_out, _ = sdpa_attention_forward(
            module,
            per_segment(query),
            with_prompt(key),
            with_prompt(value),
            self.segment_mask,
            is_causal=False,
            **kwargs,
        )
        heads, dim = segment_out.shape[-2:]
        segment_out = segment_out.reshape(groups, self.segments * length, heads, dim)
        if width == 0:  # every prompt is one token, which lives in the segments
            return segment_out, None
        # Right padding: a real prompt token never sees a pad, so plain causal attention is
        # exact for them (pads' outputs are never read: every segment masks them out).
        prompt_out, _ = sdpa_attention_forward(
            module,
            query[:, :, :width],
            key[:, :, :width],
            value[:, :, :width],
            None,
            is_causal=True,
            **kwargs,
        )
        return torch.cat([prompt_out, segment_out], dim=1), None


@dataclass
class PackedGroups:
    """One micro-batch packed by group: the model inputs and how to read the outputs back.

    input_ids, position_ids, shift_labels: (U, W + G S) for U groups; ``slot``: (B,), the
    segment (in U * G order) that holds each row.
    """

    input_ids: Tensor
    position_ids: Tensor
    shift_labels: Tensor
    layout: PackedLayout
    slot: Tensor

    def rows(self, per_position: Tensor) -> Tensor:
        """A per-position output (U, W + G S) back in rows: (B, C), C = S - 1."""
        layout = self.layout
        segments = per_position[:, layout.prompt_width :].reshape(-1, layout.segment_width)
        return segments[self.slot, :-1]


def pack_groups(
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    sizes: Sequence[int],
) -> PackedGroups:
    """Pack the rows of each group (``sizes`` from ``prompt_groups``) around one prompt copy.

    prompt_ids/prompt_mask: (B, P) left-padded; completion_ids/completion_mask: (B, C)
    right-padded. Labels are the completion tokens where ``completion_mask`` is set (what TRL
    labels), -100 elsewhere.
    """
    device = prompt_ids.device
    batch, prompt_columns = prompt_ids.shape
    completion_length = completion_ids.size(1)
    sizes_t = torch.tensor(list(sizes), device=device)
    groups, segments = len(sizes), int(sizes_t.max())
    first_rows = torch.cumsum(sizes_t, 0) - sizes_t
    group_of_row = torch.repeat_interleave(torch.arange(groups, device=device), sizes_t)
    slot = group_of_row * segments + torch.arange(batch, device=device) - first_rows[group_of_row]

    # The prompt part: each group's prompt without its last token, moved to the left.
    lengths = prompt_mask[first_rows].sum(dim=1)
    width = int(lengths.max()) - 1
    columns = torch.arange(width, device=device)
    real = columns < (lengths - 1)[:, None]
    source = (prompt_columns - lengths)[:, None] + columns
    prompt_part = prompt_ids[first_rows[:, None], source.clamp(max=prompt_columns - 1)]
    prompt_part = prompt_part.masked_fill(~real, 0)

    # Segments: the prompt's last token, then the completion (labels shifted by one).
    length = completion_length + 1
    segment_ids = completion_ids.new_zeros(groups * segments, length)
    segment_ids[slot] = torch.cat([prompt_ids[:, -1:], completion_ids], dim=1)
    labels = completion_ids.new_full((groups * segments, length), _IGNORE)
    labels[slot, :-1] = completion_ids.masked_fill(~completion_mask.bool(), _IGNORE)
    start = (lengths - 1).repeat_interleave(segments)
    segment_positions = start[:, None] + torch.arange(length, device=device)

    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    segment_mask = torch.cat(
        [
            real.repeat_interleave(segments, dim=0)[:, None, :].expand(-1, length, -1),
            causal.expand(groups * segments, -1, -1),
        ],
        dim=2,
    )[:, None]

    def packed(prompt: Tensor, segment: Tensor) -> Tensor:
        return torch.cat([prompt, segment.reshape(groups, segments * length)], dim=1)

    return PackedGroups(
        input_ids=packed(prompt_part, segment_ids),
        position_ids=packed(columns.expand(groups, -1), segment_positions),
        shift_labels=packed(torch.full_like(prompt_part, _IGNORE), labels),
        layout=PackedLayout(width, segments, length, segment_mask),
        slot=slot,
    )


# ------------------------------------------------------------------ log-probabilities


class SharedPromptLogps(NamedTuple):
    """Per-token results of ``shared_prompt_logps``: logps and entropies (B, C), 0 where a
    token is not scored, entropies None unless asked for; or ``fallback``, why the rows were
    not shared (then both are None and the caller runs its per-row path)."""

    logps: Tensor | None
    entropies: Tensor | None
    fallback: str | None = None


def shared_prompt_logps(
    model: torch.nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    *,
    compute_entropy: bool = False,
) -> SharedPromptLogps:
    """Completion log-probs (and entropies) with each group's prompt run once.

    prompt_ids/prompt_mask: (B, P) left-padded; completion_ids/completion_mask: (B, C)
    right-padded; rows of a group consecutive. Returns what TRL's
    ``_get_per_token_logps_and_entropies`` returns for the concatenated rows with
    ``logits_to_keep = C``: logps (B, C), entropies (B, C) or None.

    ``model`` carries TRL's fused LM head (``trl.trainer.utils.add_fused_lm_head``; GRPOTrainer
    adds it), called the way TRL calls it, so the temperature, the fp32 head cast and the
    entropy are the head's own; entropies need the head built with ``"entropy"`` in its
    outputs. The shared-prompt attention must be installed (``install_shared_prompt_attention``).
    Run it under the trainer's autocast, as TRL runs its forward.
    """
    config = _pretrained(model).config
    if config._attn_implementation != ATTENTION_NAME:
        raise ValueError(
            "the model does not run the shared-prompt attention: call "
            "install_shared_prompt_attention(model) once first"
        )
    sizes = prompt_groups(prompt_ids, prompt_mask)
    if max(sizes, default=1) == 1:
        return SharedPromptLogps(None, None, "no two rows share a prompt")
    packed = pack_groups(prompt_ids, prompt_mask, completion_ids, completion_mask, sizes)
    outputs = model(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        # A 4D mask is passed through as it is, so transformers builds none; the attention
        # reads the layout instead.
        attention_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool, device=prompt_ids.device),
        shift_labels=packed.shift_labels,
        fused_lm_head=True,
        shared_prompt_layout=packed.layout,
    )
    log_probs = getattr(outputs, "log_probs", None)
    if log_probs is None:
        raise ValueError(
            "the model has no TRL fused LM head: add it with trl.trainer.utils.add_fused_lm_head"
        )
    entropies = None
    if compute_entropy:
        if outputs.entropy is None:
            raise ValueError(
                "the fused LM head does not compute entropies (outputs without 'entropy')"
            )
        entropies = packed.rows(outputs.entropy)
    return SharedPromptLogps(packed.rows(log_probs), entropies)


# ------------------------------------------------------------------ micro-batches


def trim_padding(batch: dict[str, Any]) -> dict[str, Any]:
    """A micro-batch without the padding its own rows do not need.

    TRL pads a generation batch to its longest prompt and completion; a micro-batch cut from
    it keeps those widths. The prompt's left padding and the completion's right padding are cut
    to the micro-batch's longest row: ``prompt_ids``/``prompt_mask`` (B, P) lose leading
    columns, and every other (B, C) tensor (``completion_ids``, ``completion_mask``, (B, T)
    advantages, old/ref/sampling logps, ``tool_mask``...) loses trailing columns. Other values
    are returned as they are. Exact: the cut columns are masked out of every loss. One
    completion column is kept where every completion is masked out.
    """
    prompt_mask, completion_mask = batch["prompt_mask"], batch["completion_mask"]
    rows, prompt_columns = prompt_mask.shape
    completion_columns = completion_mask.size(1)
    used = prompt_mask.bool().any(dim=0)
    first = int(used.int().argmax()) if used.any() else prompt_columns
    used = completion_mask.bool().any(dim=0)
    # At least one completion column, even when every completion is masked out (all truncated,
    # with TRL's `mask_truncated_completions`): the log-probs are taken of the last C columns of
    # prompt + completion, and C = 0 would take them all.
    last = completion_columns - int(used.flip(0).int().argmax()) if used.any() else 0
    last = max(last, min(completion_columns, 1))

    def cut(key: str, value: Any) -> Any:
        if key in PROMPT_KEYS:
            return value[:, first:]
        if isinstance(value, Tensor) and value.shape[:2] == (rows, completion_columns):
            return value[:, :last]
        return value

    return {key: cut(key, value) for key, value in batch.items()}


def shuffle_groups(
    batch: dict[str, Any], group_size: int, generator: torch.Generator | None = None
) -> dict[str, Any]:
    """TRL's ``shuffle_sequence_dict`` by whole groups: the groups of ``group_size`` consecutive
    rows are permuted, each group's rows kept together and in order.

    Tensors with a batch dimension (B, ...) and lists of B items are permuted alike; None and
    0-dim tensors pass through. ``generator`` seeds the permutation (None: torch's global RNG,
    as TRL's shuffle).
    """
    batch_size = len(next(v for v in batch.values() if v is not None and not _is_scalar(v)))
    if group_size < 1 or batch_size % group_size:
        raise ValueError(f"group_size={group_size} must divide the batch size {batch_size}")
    # TRL's draw (a permutation of the rows), so the random stream after the shuffle is the
    # same as TRL's; the groups go in the order their rows first appear in it (uniform too).
    rows = torch.randperm(batch_size, generator=generator)
    order = torch.tensor(list(dict.fromkeys((rows // group_size).tolist())), dtype=torch.long)
    permutation = (order[:, None] * group_size + torch.arange(group_size)).flatten()

    def permute(value: Any) -> Any:
        if value is None or _is_scalar(value):
            return value
        if isinstance(value, Tensor):
            return value[permutation.to(value.device)]
        return [value[i] for i in permutation.tolist()]

    return {key: permute(value) for key, value in batch.items()}


def _is_scalar(value: Any) -> bool:
    return isinstance(value, Tensor) and value.ndim == 0


# ------------------------------------------------------------------ generation


@torch.no_grad()
def generate_with_shared_prefill(
    model: Any, input_ids: Tensor, attention_mask: Tensor, **generate_kwargs: Any
) -> Any:
    """``model.generate(input_ids, attention_mask, ...)`` with one prefill per distinct prompt.

    input_ids/attention_mask: (B, P), left-padded, each prompt's copies consecutive (TRL's
    batch: it puts the G copies of a prompt in the batch, not ``num_return_sequences``). Each
    distinct prompt's tokens but its last run once; the cache is copied to the prompt's rows and
    ``generate`` continues from it, computing the last prompt token for every row, so sampling
    starts from the same (B, V) logits as plain ``generate``. Returns what ``generate``
    returns, e.g. (B, P + new tokens).

    Plain ``generate`` when no two rows share a prompt, for one-token prompts, when
    ``generate`` would expand the batch itself (beams or ``num_return_sequences``), or when a
    ``cache_implementation`` other than ``"dynamic"`` asks ``generate`` for a cache of its own
    kind (``"static"``, ``"offloaded"``...; logged once per value; ``"hybrid"``, which
    ``generate`` drops for its default dynamic cache, counts as unset). Each setting is read where
    ``generate`` reads it (``generation_setting``): the call's keyword, then the generation
    config passed, then the model's own ``generation_config``. ``"dynamic"`` is the prefill's
    own kind of cache, so it is honoured by handing that cache on, with the setting cleared
    for that call wherever it was set (``generate`` refuses a cache beside a
    ``cache_implementation``).
    """
    generate = getattr(model.generate, "without_shared_prefill", model.generate)
    base = _pretrained(model)
    sizes = prompt_groups(input_ids, attention_mask)
    expands = any(
        (generation_setting(base, generate_kwargs, name)[0] or 1) > 1
        for name in ("num_beams", "num_return_sequences")
    )
    implementation, source = generation_setting(base, generate_kwargs, "cache_implementation")
    if implementation in UNSET_BY_GENERATE:
        implementation = None
    if implementation not in (None, "dynamic"):
        _log_plain_generation(implementation, source)
    if (
        max(sizes, default=1) == 1
        or input_ids.size(1) < 2
        or expands
        or implementation not in (None, "dynamic")
    ):
        return generate(input_ids=input_ids, attention_mask=attention_mask, **generate_kwargs)
    sizes_t = torch.tensor(sizes, device=input_ids.device)
    first_rows = torch.cumsum(sizes_t, 0) - sizes_t
    prefix_mask = attention_mask[first_rows, :-1]
    # generate's own position ids (attention_mask.cumsum - 1, 0 on padding)
    positions = (prefix_mask.long().cumsum(-1) - 1).masked_fill(prefix_mask == 0, 0)
    prefill = model(
        input_ids=input_ids[first_rows, :-1],
        attention_mask=prefix_mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
    )
    cache = getattr(prefill, "cache", None) or prefill.past_key_values
    groups = torch.arange(len(sizes), device=input_ids.device)
    cache.batch_select_indices(torch.repeat_interleave(groups, sizes_t))
    keyword = cache_keyword(base)
    generate_kwargs = _without_cache_implementation(generate_kwargs)
    with _model_config_without_cache_implementation(base):
        return generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            **{keyword: cache},
            **generate_kwargs,
        )


def generation_setting(model: Any, generate_kwargs: dict[str, Any], name: str) -> tuple[Any, str]:
    """The value of generation setting ``name`` that ``model.generate(**generate_kwargs)``
    would use, and where it was set: the call's keyword (``"the call"``), else the
    ``generation_config`` passed (``"the generation config passed"``), else the model's own
    ``generation_config`` (``"the model's generation_config"``); ``(None, "nowhere")`` when
    none sets it. transformers fills the passed config's unset (None) fields from the model's
    own; a checkpoint's ``generation_config.json`` can set any of them (Gemma's ship
    ``cache_implementation="hybrid"``).

    model: the transformers model whose ``generate`` runs (unwrapped, see ``_pretrained``).
    """
    if generate_kwargs.get(name) is not None:
        return generate_kwargs[name], "the call"
    passed = generate_kwargs.get("generation_config")
    if getattr(passed, name, None) is not None:
        return getattr(passed, name), "the generation config passed"
    own = getattr(getattr(model, "generation_config", None), name, None)
    if own is not None:
        return own, "the model's generation_config"
    return None, "nowhere"


def _without_cache_implementation(generate_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``generate_kwargs`` with no ``cache_implementation`` in the call or in the config passed
    (a copy of it: the caller's config is left as it is)."""
    generate_kwargs = {
        key: value for key, value in generate_kwargs.items() if key != "cache_implementation"
    }
    passed = generate_kwargs.get("generation_config")
    if getattr(passed, "cache_implementation", None) is not None:
        passed = copy.deepcopy(passed)
        passed.cache_implementation = None
        generate_kwargs["generation_config"] = passed
    return generate_kwargs


@contextlib.contextmanager
def _model_config_without_cache_implementation(model: Any) -> Iterator[None]:
    """For one ``generate`` call that is handed a cache: the model's own ``generation_config``
    swapped for a copy without ``cache_implementation`` (``generate`` fills a passed config's
    unset fields from it, and would refuse the cache beside it), put back afterwards."""
    own = getattr(model, "generation_config", None)
    if getattr(own, "cache_implementation", None) is None:
        yield
        return
    swapped = copy.deepcopy(own)
    swapped.cache_implementation = None
    model.generation_config = swapped
    try:
        yield
    finally:
        model.generation_config = own


def install_shared_prefill(model: torch.nn.Module) -> None:
    """Make ``generate`` on ``model`` (wrapped or not) prefill each distinct prompt once.

    TRL's transformers generation path calls ``generate(input_ids=..., attention_mask=...,
    generation_config=...)`` on the unwrapped model (PEFT's ``generate`` ends in the base
    model's); the base model's ``generate`` is replaced, on this instance, by
    ``generate_with_shared_prefill``. Calls that bring their own cache, or pass the prompts
    positionally, go to the original ``generate`` unchanged. The replacement holds the
    instance it serves, so a ``copy.deepcopy`` of the model generates with the copy's weights
    and the model still pickles (``torch.save``).
    """
    base = _pretrained(model)
    if not isinstance(vars(base).get("generate"), SharedPrefillGenerate):
        base.generate = SharedPrefillGenerate(base)


class SharedPrefillGenerate:
    """The ``generate`` that ``install_shared_prefill`` puts on a model instance.

    A plain object holding the model rather than a closure over it: deep copies and pickles of
    the model copy it along with the model, bound to the copy.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model

    @property
    def without_shared_prefill(self) -> Any:
        """The model class's own ``generate``, bound to the model."""
        return type(self.model).generate.__get__(self.model)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        plain = args or any(kwargs.get(name) is not None for name in _CACHE_NAMES)
        if plain or kwargs.get("input_ids") is None or kwargs.get("attention_mask") is None:
            return self.without_shared_prefill(*args, **kwargs)
        return generate_with_shared_prefill(self.model, **kwargs)


_CACHE_NAMES = ("cache", "past_key_values")


@functools.cache
def _log_plain_generation(cache_implementation: str, source: str) -> None:
    logger.warning(
        "share_prompt: generating without the shared prefill: cache_implementation=%r (set in "
        "%s) builds a cache of its own kind (the prefill's cache is a dynamic one)",
        cache_implementation,
        source,
    )
