"""The update-quality benchmark's weight statistics (issue #48 item 3): per mini-batch, for each
token-level variant's weights and each reward, how many tokens carry the weight and how much of
it falls on the tokens where the policy is uncertain. Stored by the measure pass
(`measure_batch`'s "weights"), tabulated by the second plan's report.

Per replayed (row, reward) pair (the reward's normalized advantage is not 0: the pairs the
trainer replays; elsewhere the weights multiply 0 and are not counted):

- the tokens: the row's response tokens the loss trains, T of them (TRL's completion mask: up
  to and including the end token, as training counts them);
- the weights w_t: the variant's relevance weights at beta 1 (`TokenAdvantages.relevance`, the
  trainer's own, before any shuffle: the `shuffled` variant's are mrtpo's permuted within the
  row, so it is left out);
- the effective share of tokens: (sum_t w_t)^2 / (T sum_t w_t^2): 1 for uniform weights, 1/T
  for all the weight on one token;
- the entropy overlap: the share of the top-fifth weighted tokens that are among the top-fifth
  entropy tokens, the entropy being the policy's next-token entropy at each response position
  from the forward the trainer's entropy control runs (`token_relevance="entropy"`: the
  `entropy` variant's distances, the same for every reward). The top fifth: the n = ceil(T / 5)
  largest values; tokens tied at the n-th value share its remaining places (each belongs with
  weight (n - #above) / #tied), so the overlap, sum_t a_t b_t / n, is the expected one under a
  random order of the ties (uniform weights: 1/5 in expectation whatever the entropies).

Per mini-batch, per variant and reward: the mean of each over its replayed pairs (None where
the reward replays none) and their number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

TOP_PART = 5  # the top fifth: ceil(T / 5) tokens
ENTROPY_VARIANT = "entropy"
UNWEIGHED = ("shuffled",)  # variants whose weights the trainer does not hand out (see above)


def top_membership(values: Any, mask: Any) -> Any:
    """Each token's membership of its row's top fifth (the module's docstring): Tensor[R, T]
    in [0, 1], summing to ceil(T_r / 5) over row r's tokens (0 outside the mask), ties at the
    boundary sharing its places.

    values: Tensor[R, T]; mask: Tensor[R, T], 1 (or True) on the row's tokens."""
    import torch

    valid = mask.bool()
    values = values.double()
    counts = valid.sum(dim=1)
    places = (counts + TOP_PART - 1) // TOP_PART  # [R] ceil(T / 5), integer
    ordered = torch.where(valid, values, torch.full_like(values, -torch.inf))
    ordered = ordered.sort(dim=1, descending=True).values
    boundary = ordered.gather(1, (places - 1).clamp(min=0).unsqueeze(1))  # [R, 1] n-th value
    above = valid & (values > boundary)
    tied = valid & (values == boundary)
    share = (places - above.sum(dim=1)).double() / tied.sum(dim=1).clamp(min=1)  # [R]
    membership = above.double() + tied.double() * share.unsqueeze(1)
    return torch.where(places.unsqueeze(1) > 0, membership, torch.zeros_like(membership))


def pair_statistics(weights: Any, entropy: Any, mask: Any) -> tuple[Any, Any]:
    """(effective share [R], entropy overlap [R]) of R (row, reward) pairs' weights.

    weights, entropy: Tensor[R, T] (the pair's row's entropies); mask: Tensor[R, T] the row's
    trained tokens. float64; NaN for a row without tokens or with zero weights."""
    import torch

    valid = mask.double()
    w = weights.double() * valid
    tokens = valid.sum(dim=1)
    squares = (w * w).sum(dim=1)
    effective = w.sum(dim=1) ** 2 / (tokens * squares)
    places = (tokens + TOP_PART - 1).div(TOP_PART, rounding_mode="floor")
    both = top_membership(w, mask) * top_membership(entropy, mask)
    overlap = both.sum(dim=1) / places
    bad = (tokens == 0) | (squares == 0)
    nan = torch.full_like(effective, float("nan"))
    return torch.where(bad, nan, effective), torch.where(bad, nan, overlap)


def replayed_mask(token: Any, rows: int) -> Any:
    """Tensor[N, K] bool: the (row, reward) pairs a variant replayed (`TokenAdvantages.replay`,
    its rows' `replayed`), of the batch's N rows."""
    import torch

    replay = token.replay
    pairs = torch.zeros(rows, replay.replayed.shape[1], dtype=torch.bool)
    if replay.rows:
        pairs[torch.tensor(replay.rows)] = replay.replayed.bool().cpu()
    return pairs


def policy_entropy(token: Any, rows: int) -> Any:
    """Tensor[N, T]: the policy's next-token entropy at each response token of each row the
    entropy control ran (0 elsewhere), from its `TokenAdvantages`: its distance on a replayed
    reward of the row (every reward it replays gets the row's entropies)."""
    import torch

    replay = token.replay
    entropy = torch.zeros(rows, replay.distance.shape[-1], dtype=torch.float64)
    if replay.rows:
        first = replay.replayed.int().argmax(dim=1)  # a reward the row replays
        picked = replay.distance[torch.arange(len(replay.rows)), first]
        entropy[torch.tensor(replay.rows)] = picked.double().cpu()
    return entropy


def batch_weight_statistics(tokens: Mapping[str, Any], mask: Any) -> dict[str, Any]:
    """The measure pass's "weights" entry of a mini-batch: per variant (each token-level one
    but UNWEIGHED), {"effective_share": [K], "entropy_overlap": [K], "pairs": [K]} (the
    means over each reward's replayed pairs; None where none).

    tokens: {variant: its `TokenAdvantages` at beta 1} (the entropy control among them for
    the overlap; without it the overlaps are None); mask: Tensor[N, T] the trained tokens."""
    rows = mask.shape[0]
    mask = mask.cpu()
    entropy = None
    if ENTROPY_VARIANT in tokens:
        entropy = policy_entropy(tokens[ENTROPY_VARIANT], rows)
    out: dict[str, Any] = {}
    for name, token in tokens.items():
        if name in UNWEIGHED:
            continue
        pairs = replayed_mask(token, rows)
        weights = token.relevance.detach().cpu()
        stats: dict[str, list[Any]] = {"effective_share": [], "entropy_overlap": [], "pairs": []}
        for k in range(pairs.shape[1]):
            chosen = pairs[:, k]
            count = int(chosen.sum())
            stats["pairs"].append(count)
            if count == 0:
                stats["effective_share"].append(None)
                stats["entropy_overlap"].append(None)
                continue
            row_entropy = entropy[chosen] if entropy is not None else weights[chosen, k]
            effective, overlap = pair_statistics(weights[chosen, k], row_entropy, mask[chosen])
            stats["effective_share"].append(_mean(effective))
            stats["entropy_overlap"].append(None if entropy is None else _mean(overlap))
        out[name] = stats
    return out


def _mean(values: Any) -> float | None:
    finite = values[~values.isnan()]
    return float(finite.mean()) if len(finite) else None


# ----------------------------------------------------------------------------- the summary


def weight_summary(
    records: Sequence[Mapping[str, Any]], statistic: str
) -> dict[str, list[tuple[float, float, float, int] | None]]:
    """Over a sample's mini-batches: per variant and reward, (mean, min, max, mini-batches) of
    `statistic` ("effective_share" or "entropy_overlap") over the mini-batches where it is
    defined (None where none is). Records without weight statistics (measured before they
    were stored) are skipped."""
    stored = [r["weights"] for r in records if "weights" in r]
    out: dict[str, list[tuple[float, float, float, int] | None]] = {}
    for variant in stored[0] if stored else {}:
        rewards = len(stored[0][variant][statistic])
        out[variant] = []
        for k in range(rewards):
            values = [w[variant][statistic][k] for w in stored if variant in w]
            values = [v for v in values if v is not None]
            out[variant].append(
                (float(np.mean(values)), min(values), max(values), len(values)) if values else None
            )
    return out
