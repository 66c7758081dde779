"""The `Verdict` contract: NaN scores mean "no score", as in TRL."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mrtpo.verifiers import Verdict, Verifier


@pytest.mark.parametrize(
    "nan", [float("nan"), np.float32("nan"), torch.tensor(float("nan")).item()]
)
def test_nan_score_is_no_score(nan):
    verdict = Verdict(nan, "Not checked.")
    assert verdict.score is None


@pytest.mark.parametrize("infinite", [math.inf, -math.inf])
def test_infinite_score_is_refused(infinite):
    with pytest.raises(ValueError, match="Verdict.score"):
        Verdict(infinite, "")


class NanForOddRows(Verifier):
    name = "nan_for_odd_rows"

    def verify(self, completion, example):
        return Verdict(float("nan") if example["row"] % 2 else 1.0, "info")


def test_a_verifier_returning_nan_gives_trl_none():
    """TRL turns None into NaN in its rewards tensor; a NaN verdict must take that path."""
    scores = NanForOddRows()(["p"] * 4, ["c"] * 4, row=[0, 1, 2, 3])
    assert scores == [1.0, None, 1.0, None]
