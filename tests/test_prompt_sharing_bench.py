"""benchmarks/prompt_sharing.py on the tiny model: every variant trains on the same samples."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import prompt_sharing  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_variants_see_the_same_samples_and_report_their_parts():
    args = prompt_sharing.parse_args(
        [
            "--model=tiny",
            "--task=tool_calling",
            "--prompts=2",
            "--max-new-tokens=8",
            "--steps=2",
            "--variants=gdpo/per-row,gdpo/shared,trl-grpo-trainer",
        ]
    )
    result = prompt_sharing.run(args)
    runs = result["runs"]
    assert set(runs) == {"gdpo/per-row", "gdpo/shared", "trl-grpo-trainer"}
    for step in range(2):  # same seed, same samples: same rewards and lengths everywhere
        rewards = {name: runs[name][step]["reward"] for name in runs}
        lengths = {name: runs[name][step]["mean_length"] for name in runs}
        assert len(set(rewards.values())) == 1 and len(set(lengths.values())) == 1
    for name, measured in ((n, r) for n in runs for r in runs[n]):
        assert 0 < measured["generation"] < measured["seconds"], name
        assert 0 < measured["loss"] < measured["seconds"], name  # forward, backward, optimizer
        assert measured["replay"] <= measured["scoring_and_advantages"], name
    table = prompt_sharing.table(result)
    assert "gdpo shared / per-row" in table and "TRL's GRPOTrainer" in table


def test_unknown_variant_is_refused():
    with pytest.raises(SystemExit, match="unknown gdpo/sometimes"):
        prompt_sharing.parse_args(["--variants=gdpo/sometimes"])
