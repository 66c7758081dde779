"""What every task offers the trainer, the CLI and the credit analysis."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from datasets import Dataset

from mrtpo.verifiers import Verdict, Verifier


class Task:
    """A task: bundled data, its verifiers, and how to judge a model on it.

    Subclasses set `name` and `system_prompt` and implement `load` and `verifiers`.
    Dataset rows have a `prompt` column of chat messages (system prompt first), ready for
    TRL's `GRPOTrainer`/`SFTTrainer`, plus the columns the verifiers read.
    """

    name: str = "task"
    system_prompt: str = ""
    # The headline metric `mrtpo eval` reports, e.g. "execution accuracy".
    headline_name: str = "accuracy"

    def load(self, split: str = "train", path: str | None = None, **kwargs: Any) -> Dataset:
        """The bundled split ("train" or "test"), or the user's files at `path`."""
        raise NotImplementedError

    def verifiers(self, **kwargs: Any) -> list[Verifier]:
        """The task's verifiers, in a fixed order (one reward each)."""
        raise NotImplementedError

    def reference_completion(self, example: Mapping[str, Any]) -> str | None:
        """A correct response for supervised cold start, or None if the data has none."""
        return None

    def headline(self, verdicts: Sequence[Sequence[Verdict]]) -> dict[str, float]:
        """Headline metric(s) from per-example verdicts (one list of verdicts per example,
        in `verifiers()` order). Default: share of examples where every applicable score is 1."""
        if not verdicts:
            return {self.headline_name: 0.0}
        passed = [all(v.score is None or v.score >= 1.0 for v in row) for row in verdicts]
        return {self.headline_name: sum(passed) / len(passed)}
