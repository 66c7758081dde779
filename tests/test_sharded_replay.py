"""The replay on a sharded model (FSDP2, two CPU processes on gloo): processes whose rows need
different replays (none at all, or different numbers of forward passes) stay in step, and
their per-token advantages equal one process's over the whole batch, replayed independently."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fsdp_replay_toys import GROUP_SIZE, SCENARIOS, scored_batch

from mrtpo import advantages
from mrtpo.relevance import naive_replay_distances
from mrtpo.testing import tiny_model_and_tokenizer
from mrtpo.trainer import EPS

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
TIMEOUT_S = 150  # a hang (processes out of step) fails here; the run takes about 30 s


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_fsdp2_replay_keeps_processes_in_step_and_equals_one_process(tmp_path):
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        str(TESTS / "fsdp_replay_toys.py"),
        str(tmp_path),
    ]
    result = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    # accelerate's FSDP is GPU-only: on CPU the run is plain multi-CPU, sharded by hand.
    assert all(rank["distributed_type"] == "DistributedType.MULTI_CPU" for rank in ranks)
    assert all(rank["sharded_after"] for rank in ranks)
    # Process 0 wrote the credit maps, after both replayed the chosen rows they had skipped.
    assert (tmp_path / "run" / "credit" / "step-00000.html").exists()

    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    replayed = {name: [rank[name]["replayed"] for rank in ranks] for name in SCENARIOS}
    assert replayed["one_process_without_rows"] == [[0, 1, 2, 3], []]
    assert replayed["different_replay_batches"] == [[0, 1, 2, 3], [0, 1]]
    for name, rewards in SCENARIOS.items():
        # One process, the whole batch, every row's contexts run from scratch (no shared
        # prefix, no stems): the reference replay, on the unsharded model.
        batches = [scored_batch(tokenizer, rewards, rank) for rank in range(2)]
        rows = [
            (prompt, ids, [verdict.info for verdict in verdicts])
            for batch in batches
            for prompt, ids, verdicts in zip(
                batch.prompts, batch.completion_ids, batch.row_verdicts(), strict=True
            )
        ]
        prompts, completion_ids, infos = (list(column) for column in zip(*rows, strict=True))
        distance, mask = naive_replay_distances(model, tokenizer, prompts, completion_ids, infos)
        rewards_tensor = torch.tensor(rewards, dtype=torch.float32)
        expected = advantages.mrtpo(rewards_tensor, GROUP_SIZE, distance, mask, 1.0, eps=EPS)
        # beta = 1 with real distances: credit moves between tokens (not GDPO's constant rows).
        on_tokens = expected.masked_fill(mask == 0, float("nan"))
        spread = on_tokens.nan_to_num(-1e9).amax(-1) + on_tokens.nan_to_num(1e9).amin(-1).neg()
        assert spread.max() > 1e-3
        for rank, batch in zip(ranks, batches, strict=True):
            actual = rank[name]["advantages"]
            torch.testing.assert_close(
                actual, expected[batch.local, : actual.shape[1]], rtol=0, atol=1e-5
            )
