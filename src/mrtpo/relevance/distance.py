"""The base-2 Jensen-Shannon distance between next-token distributions, in [0, 1].

``js_distance`` takes two tensors of logits. ``chunked_distances`` is how the replay uses it:
the vocabulary projection, log-softmax and JS distance run over chunks of response positions,
in blocks sized for the device, so ``(rows, K + 1, T, V)`` never exists at once (the Cost
section of ``docs/METHOD.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

# Entries per JS temporary (K, block, V). CPU: 2 MiB in float32, so the temporaries stay in the
# caches (several times faster). Accelerators: 256 MiB, so a chunk of a 152k-token vocabulary is a
# few large kernels rather than one small kernel sequence per position.
JS_BLOCK_ELEMENTS = 2**19
JS_BLOCK_ELEMENTS_ACCELERATOR = 2**26
_LN2 = math.log(2.0)


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


def js_block_elements(device: torch.device) -> int:
    """Entries per JS temporary on ``device`` (see ``JS_BLOCK_ELEMENTS``)."""
    return JS_BLOCK_ELEMENTS if device.type == "cpu" else JS_BLOCK_ELEMENTS_ACCELERATOR


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


def chunked_distances(
    project: Callable[[Tensor], Tensor],
    hidden: list[Tensor | None],
    slot_of: list[list[int]],
    chunk_size: int,
    distance: Tensor,
) -> None:
    """Fill ``distance`` from the hidden states, chunk by chunk.

    Args:
        project: the model's head, last hidden states Tensor[..., H] to float32 logits
            Tensor[..., V].
        hidden: per row i, Tensor[U_i, T_i, H], the states predicting each completion token in
            each of the row's U_i distinct contexts (slot 0: the reference); None for a row
            whose contexts are all the same (left at 0).
        slot_of: per row, K + 1 ints, the slot of ``hidden[i]`` holding each context.
        chunk_size: response positions (all rows pooled) per chunk.
        distance: Tensor[N, K, T], written in place at ``[i, :, :T_i]``.

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
        log_probs = torch.log_softmax(project(states), dim=-1)
        # The JS temporaries (K, block, V) are sized for the device (js_block_elements).
        block = max(1, js_block_elements(log_probs.device) // (log_probs[1:, :1].numel()))
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
