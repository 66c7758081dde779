"""The part of the replay that is coupled to ``transformers``' cache classes, kept small.

A prompt's keys/values are computed once and read by every context of the prompt; a stem (a
run of information tokens that several contexts share) is computed once and read by the
contexts that share it. ``batch_cache`` builds one batch's cache for that: ``SharedLayer``s
(a ``DynamicLayer`` subclass) over plain full-attention layers, or, for sliding-window
attention layers, an ordinary copy of the prompt's cache and no stems. A cache with any other
kind of layer (a recurrent or linear-attention state, an indexer cache) cannot be copied into
a batch: ``reusable`` says so, and the replay then runs every context whole, without a shared
cache. ``transformers`` is imported only when a cache is built, so importing
``mrtpo.relevance`` does not load it.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor


def cache_keyword(body: torch.nn.Module) -> str:
    """transformers 5 renamed ``past_key_values`` to ``cache`` (older bodies keep the old name)."""
    return "cache" if "cache" in inspect.signature(body.forward).parameters else "past_key_values"


def run_body(body: Any, keyword: str, **inputs: Any) -> tuple[Tensor, Any]:
    """The decoder body run on ``inputs``, its ``cache`` input passed under ``keyword``.

    Returns the last hidden states, Tensor[B, W, H], and the cache the body returns (None
    without ``use_cache``).
    """
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


def reusable(prefix_cache: Any) -> bool:
    """Whether a prompt's cache can be read by a batch of contexts: every layer holds only
    attention keys/values (full or sliding window). Hybrid and recurrent models' states (e.g.
    ``LinearAttentionLayer``, a Mamba state) and subclasses that carry more than keys/values are
    not copied: their contexts run whole."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(prefix_cache, "layers", None)
    if not layers:
        return False
    return all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers)


def plain_layers(prefix_cache: Any) -> list[tuple[Tensor, Tensor]] | None:
    """The prefix's (keys, values) per layer when every layer is plain full attention, else None
    (e.g. sliding-window layers: those get an ordinary copied cache and no stems)."""
    from transformers.cache_utils import DynamicLayer

    if not all(type(layer) is DynamicLayer for layer in prefix_cache.layers):
        return None
    return [(layer.keys, layer.values) for layer in prefix_cache.layers]


def batch_cache(
    prefix_cache: Any,
    shared: list[tuple[Tensor, Tensor]] | None,
    stems: list[list[tuple[Tensor, Tensor]] | None],
    record: bool,
    config: Any,
) -> Any:
    """The cache for one batch: the shared prompt plus each row's stem, or a plain copy."""
    from transformers import DynamicCache

    if shared is None:  # no stems on this path (see plain_layers)
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
