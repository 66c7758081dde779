"""Credit maps: where each reward's advantage lands on the tokens of one response.

A `CreditMap` holds one replayed response: its tokens with their character ranges in the
completion text (the text the verifiers read), and per reward k = 1..K the replay distance
`q[k, t]`, the MRTPO weight `w[k, t]`, the reward's group-normalized advantage `Ã_k` and the
verdict; plus the combined per-token advantage `A[t]` and, optionally, GDPO's uniform
advantage of the same response (the paper's Figure 2).

Rendering lives in `mrtpo.credit.render` (HTML, PNG, terminal), the statistics over many
responses in `mrtpo.credit.analysis` (the paper's Table 4 and Figure 6), and what the trainer
writes every `credit_map_steps` steps in `mrtpo.credit.training`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mrtpo.verifiers import Verdict


def as_array(values: Any, name: str, ndim: int) -> np.ndarray:
    """A float64 numpy copy of a list / numpy array / torch tensor with `ndim` dimensions."""
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().float().cpu().numpy()
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {array.shape}")
    return array


def _common_prefix_length(a: str, b: str, start: int) -> int:
    """Length of the common prefix of `a` and `b`, given that they agree on `[:start]`."""
    end = start
    limit = min(len(a), len(b))
    while end < limit and a[end] == b[end]:
        end += 1
    return end


def token_offsets(
    tokenizer: Any, completion_ids: Sequence[int], text: str | None = None
) -> tuple[str, list[tuple[int, int]], list[bool], list[str]]:
    """Each token's (start, end) character range in the decoded completion.

    Decodes growing prefixes of the ids and keeps, after token t, the longest prefix that
    agrees with the full text. A token that ends inside a multi-byte character (a byte
    fragment: the prefix ends in U+FFFD) gets an empty range, and the token that completes the
    character gets the whole character; special tokens (skipped when decoding, as TRL does)
    get an empty range too. The ranges therefore tile `text` exactly, in order.

    Returns (text, offsets [T], is_fragment [T], special_labels [T]): `special_labels[t]` is
    the token's string ("<|im_end|>") for a special token, else "".
    """
    ids = [int(i) for i in completion_ids]
    if text is None:
        text = tokenizer.decode(ids, skip_special_tokens=True)
    special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    offsets: list[tuple[int, int]] = []
    is_fragment: list[bool] = []
    special_labels: list[str] = []
    boundary = 0
    for t, token_id in enumerate(ids):
        if token_id in special_ids:
            offsets.append((boundary, boundary))
            is_fragment.append(False)
            special_labels.append(str(tokenizer.convert_ids_to_tokens(token_id)))
            continue
        prefix = tokenizer.decode(ids[: t + 1], skip_special_tokens=True)
        # Decoding is not always prefix-stable (space clean-up, U+FFFD for a partial
        # character): only the part that agrees with the full text counts.
        if prefix.startswith(text[:boundary]):
            end = max(boundary, _common_prefix_length(prefix, text, boundary))
        else:
            end = boundary
        offsets.append((boundary, end))
        is_fragment.append(end == boundary)
        special_labels.append("")
        boundary = end
    if offsets and boundary < len(text):  # any tail the prefixes never reached
        last = max((t for t, label in enumerate(special_labels) if not label), default=len(ids) - 1)
        offsets[last] = (offsets[last][0], len(text))
        is_fragment[last] = False
        for t in range(last + 1, len(ids)):
            offsets[t] = (len(text), len(text))
    return text, offsets, is_fragment, special_labels


@dataclass
class CreditMap:
    """One replayed response and the credit each reward gives its tokens.

    text: the completion text the verifiers read.
    offsets: [T] (start, end) of each token in `text`; the ranges tile `text` in order.
        A byte fragment of a multi-byte character and a special token have start == end.
    is_fragment: [T] True for a token that ends inside a character (merged into the next).
    special_labels: [T] the token string of a special token ("<|im_end|>"), else "".
    names: [K] reward names, in the verifiers' order.
    distance: [K, T] replay distance q_{k,t} in [0, 1].
    verdicts: [K] each verifier's Verdict (score, info, spans).
    weights: [K, T] MRTPO weights w_{k,t} (mean 1 over the response), or None.
    reward_advantages: [K] the group-normalized advantage Ã_k of this response, or None.
    token_advantages: [T] the combined per-token advantage A_t, or None.
    gdpo_advantage: GDPO's response-level advantage (every token gets it), or None.
    reward_weights: [K] the reward weights c_k (default 1).
    types: [K] what kind of check each reward is (the analysis groups by it; default: names;
        the instruction-following task's slot k checks a different constraint on each row).
    prompt: the prompt text (for display).
    title: a heading for the map.
    replayed: [K] bool, whether reward k's contexts were replayed on this response, or None
        (all were). The trainer skips a reward whose Ã_k is 0 on the row (its weights cannot
        change the advantage): its distance row is 0 without being measured, its weights 1.
    """

    text: str
    offsets: list[tuple[int, int]]
    is_fragment: list[bool]
    special_labels: list[str]
    names: list[str]
    distance: np.ndarray
    verdicts: list[Verdict]
    weights: np.ndarray | None = None
    reward_advantages: np.ndarray | None = None
    token_advantages: np.ndarray | None = None
    gdpo_advantage: float | None = None
    reward_weights: np.ndarray | None = None
    types: list[str] | None = None
    prompt: str = ""
    title: str = ""
    replayed: np.ndarray | None = None

    def __post_init__(self) -> None:
        num_tokens, num_rewards = len(self.offsets), len(self.names)
        self.distance = as_array(self.distance, "distance", 2)
        if self.distance.shape != (num_rewards, num_tokens):
            raise ValueError(
                f"distance must have shape [K={num_rewards}, T={num_tokens}], got {self.distance.shape}"
            )
        if len(self.verdicts) != num_rewards:
            raise ValueError(
                f"verdicts must hold K={num_rewards} verdicts, got {len(self.verdicts)}"
            )
        if len(self.is_fragment) != num_tokens or len(self.special_labels) != num_tokens:
            raise ValueError("is_fragment and special_labels must hold one entry per token")
        position = 0
        for start, end in self.offsets:
            if start != position or end < start or end > len(self.text):
                raise ValueError(f"offsets must tile the text in order, got {self.offsets!r}")
            position = end
        if self.weights is not None:
            self.weights = as_array(self.weights, "weights", 2)
            if self.weights.shape != self.distance.shape:
                raise ValueError(
                    f"weights must have shape {self.distance.shape}, got {self.weights.shape}"
                )
        if self.reward_advantages is not None:
            self.reward_advantages = as_array(self.reward_advantages, "reward_advantages", 1)
            if self.reward_advantages.shape != (num_rewards,):
                raise ValueError(f"reward_advantages must have shape [{num_rewards}]")
        if self.token_advantages is not None:
            self.token_advantages = as_array(self.token_advantages, "token_advantages", 1)
            if self.token_advantages.shape != (num_tokens,):
                raise ValueError(f"token_advantages must have shape [{num_tokens}]")
        self.reward_weights = (
            np.ones(num_rewards)
            if self.reward_weights is None
            else as_array(self.reward_weights, "reward_weights", 1)
        )
        if self.reward_weights.shape != (num_rewards,):
            raise ValueError(f"reward_weights must have shape [{num_rewards}]")
        if self.gdpo_advantage is not None:
            self.gdpo_advantage = float(self.gdpo_advantage)
        self.types = list(self.names) if self.types is None else [str(t) for t in self.types]
        if len(self.types) != num_rewards:
            raise ValueError(f"types must hold K={num_rewards} entries, got {len(self.types)}")
        if self.replayed is not None:
            self.replayed = as_array(self.replayed, "replayed", 1).astype(bool)
            if self.replayed.shape != (num_rewards,):
                raise ValueError(
                    f"replayed must have shape [K={num_rewards}], got {self.replayed.shape}"
                )

    @property
    def num_tokens(self) -> int:
        return len(self.offsets)

    def was_replayed(self, k: int) -> bool:
        """Whether reward k's distance was measured (False: not replayed, left at 0)."""
        return self.replayed is None or bool(self.replayed[k])

    def token_text(self, t: int) -> str:
        """The characters of token t in `text` ("" for a byte fragment or a special token)."""
        start, end = self.offsets[t]
        return self.text[start:end]

    def reward_token_advantages(self) -> np.ndarray | None:
        """[K, T] each reward's share of the advantage per token: c_k * w_{k,t} * Ã_k
        (before the batch normalization that turns their sum into A_t), or None."""
        if self.reward_advantages is None:
            return None
        weights = self.weights if self.weights is not None else np.ones_like(self.distance)
        return (self.reward_weights * self.reward_advantages)[:, None] * weights

    def footprints(self) -> list[tuple[int, int]]:
        """[T] the characters each token stands for: its own range, or for a byte fragment
        the character it is a part of. Special tokens stand for none."""
        footprints = []
        for (start, end), fragment in zip(self.offsets, self.is_fragment, strict=True):
            if fragment and start < len(self.text):
                end = start + 1
            footprints.append((start, end))
        return footprints

    def tokens_in_spans(self, spans: Sequence[tuple[int, int]]) -> np.ndarray:
        """[T] bool: the tokens whose characters overlap any of `spans`."""
        selected = np.zeros(self.num_tokens, dtype=bool)
        for t, (start, end) in enumerate(self.footprints()):
            selected[t] = any(
                start < span_end and span_start < end for span_start, span_end in spans
            )
        return selected

    @classmethod
    def from_replay(
        cls,
        tokenizer: Any,
        completion_ids: Sequence[int],
        names: Sequence[str],
        distance: Any,
        weights: Any = None,
        reward_advantages: Any = None,
        token_advantages: Any = None,
        verdicts: Sequence[Verdict] = (),
        *,
        mask: Any = None,
        text: str | None = None,
        gdpo_advantage: float | None = None,
        reward_weights: Any = None,
        types: Sequence[str] | None = None,
        prompt: str = "",
        title: str = "",
        replayed: Any = None,
    ) -> CreditMap:
        """Build a map from one replayed row.

        completion_ids: [T] the response token ids (possibly right-padded: pass `mask`).
        distance: [K, T]; weights: [K, T] or None; reward_advantages: [K] or None;
        token_advantages: [T] or None; mask: [T] 1 on response tokens (a padded row is cut
        to its length); text: the completion text the verifiers read (default: the decoded
        ids, special tokens skipped, as TRL decodes them); replayed: [K] bool or None (all).
        """
        ids = [
            int(i)
            for i in (
                completion_ids.tolist() if hasattr(completion_ids, "tolist") else completion_ids
            )
        ]
        length = len(ids) if mask is None else int(as_array(mask, "mask", 1).sum())
        ids = ids[:length]
        text, offsets, is_fragment, special_labels = token_offsets(tokenizer, ids, text)

        def cut(values: Any, name: str, ndim: int) -> np.ndarray | None:
            if values is None:
                return None
            array = as_array(values, name, ndim)
            return array[..., :length]

        return cls(
            text=text,
            offsets=offsets,
            is_fragment=is_fragment,
            special_labels=special_labels,
            names=list(names),
            distance=cut(distance, "distance", 2),
            verdicts=list(verdicts),
            weights=cut(weights, "weights", 2),
            reward_advantages=None
            if reward_advantages is None
            else as_array(reward_advantages, "reward_advantages", 1),
            token_advantages=cut(token_advantages, "token_advantages", 1),
            gdpo_advantage=gdpo_advantage,
            reward_weights=reward_weights,
            types=types,
            prompt=prompt,
            title=title,
            replayed=replayed,
        )

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> CreditMap:
        """Build a map from one record as `write_training_maps` documents it."""
        missing = [key for key in ("names", "distance", "verdicts") if key not in record]
        if missing:
            raise ValueError(f"record is missing {', '.join(missing)}")
        prompt = record.get("prompt", "")
        if not isinstance(prompt, str):  # chat messages: show the last user turn
            prompt = str(prompt[-1].get("content", "")) if prompt else ""
        optional = {
            "weights": record.get("weights"),
            "reward_advantages": record.get("reward_advantages"),
            "token_advantages": record.get("token_advantages"),
            "verdicts": record["verdicts"],
            "gdpo_advantage": record.get("gdpo_advantage"),
            "reward_weights": record.get("reward_weights"),
            "types": record.get("types"),
            "prompt": prompt,
            "title": record.get("title", ""),
            "replayed": record.get("replayed"),
        }
        if "tokenizer" in record:
            return cls.from_replay(
                record["tokenizer"],
                record["completion_ids"],
                record["names"],
                record["distance"],
                mask=record.get("mask"),
                text=record.get("text"),
                **optional,
            )
        if "tokens" not in record:
            raise ValueError("record needs either `tokenizer` and `completion_ids`, or `tokens`")
        tokens = [str(token) for token in record["tokens"]]
        offsets, position = [], 0
        for token in tokens:  # the tokens' texts concatenate to the completion
            offsets.append((position, position + len(token)))
            position += len(token)
        return cls(
            text="".join(tokens),
            offsets=offsets,
            is_fragment=[False] * len(tokens),
            special_labels=[""] * len(tokens),
            names=list(record["names"]),
            distance=record["distance"],
            **optional,
        )
