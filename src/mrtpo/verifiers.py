"""The contract every task's verifiers follow.

A verifier scores one completion and says what it checked: the score is the reward, `info` is
the verifier information that MRTPO's replay puts into the context, and `spans` are the
character ranges of the completion the check read (used by the credit analysis).

A `Verifier` is directly a TRL reward function: `verifier(prompts, completions, **columns)`
returns one float (or None, "not applicable") per completion.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Span = tuple[int, int]


@dataclass(frozen=True)
class Verdict:
    """One verifier's judgement of one completion.

    score: the reward; None when the verifier does not apply to this row. NaN is read as None
        (TRL and the estimators treat NaN as "no score"); +-inf is refused.
    info: the verifier information replayed by MRTPO (what the check compares against).
    spans: (start, end) character ranges of the completion that the check read.
    """

    score: float | None
    info: str
    spans: tuple[Span, ...] = ()

    def __post_init__(self) -> None:
        if self.score is not None and math.isnan(self.score):
            object.__setattr__(self, "score", None)  # frozen: set once, here
        if self.score is not None and not math.isfinite(self.score):
            raise ValueError(f"Verdict.score must be finite, NaN or None, got {self.score!r}")
        for span in self.spans:
            if len(span) != 2 or span[0] > span[1] or span[0] < 0:
                raise ValueError(
                    f"Verdict.spans must hold (start, end) with 0 <= start <= end, got {span!r}"
                )


def completion_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The text of a completion as TRL passes it: a string, or a list of chat messages."""
    if isinstance(completion, str):
        return completion
    return "".join(str(message.get("content") or "") for message in completion)


class Verifier:
    """Base class: subclasses set `name` and implement `verify`.

    `verify(completion, example)` must never raise on any completion text: malformed output is
    a low score with an info string that says why.
    """

    name: str = "verifier"

    def verify(self, completion: str, example: Mapping[str, Any]) -> Verdict:
        raise NotImplementedError

    def verify_batch(
        self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Sequence[Any]
    ) -> list[Verdict]:
        """Verdicts for a batch, columns as TRL passes them (one list per dataset column)."""
        if len(prompts) != len(completions):
            raise ValueError(
                f"prompts and completions must have the same length, got {len(prompts)} and {len(completions)}"
            )
        for column, values in columns.items():
            if (
                isinstance(values, Sequence)
                and not isinstance(values, str)
                and len(values) != len(completions)
            ):
                raise ValueError(
                    f"column {column!r} has {len(values)} values for {len(completions)} completions"
                )
        examples = rows_from_columns(len(completions), prompts, columns)
        return [
            self.verify(completion_text(c), ex) for c, ex in zip(completions, examples, strict=True)
        ]

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Sequence[Any]
    ) -> list[float | None]:
        return [verdict.score for verdict in self.verify_batch(prompts, completions, **columns)]

    @property
    def __name__(self) -> str:  # TRL names reward columns after `__name__`
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def rows_from_columns(
    n_rows: int, prompts: Sequence[Any], columns: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Turn TRL's column-wise keyword arguments into one dict per row (with `prompt`)."""
    rows: list[dict[str, Any]] = [{"prompt": prompt} for prompt in prompts]
    for column, values in columns.items():
        if isinstance(values, Sequence) and not isinstance(values, str) and len(values) == n_rows:
            for row, value in zip(rows, values, strict=True):
                row[column] = value
        else:  # TRL also passes scalars such as trainer_state: same for every row
            for row in rows:
                row[column] = values
    return rows
