"""The replay on a sharded model (FSDP2, two CPU processes on gloo): processes whose rows need
different replays (none at all, or different numbers of forward passes) stay in step, and
their per-token advantages equal one process's over the whole batch, replayed independently;
so does the credit maps' replay (GDPO, and MRTPO at beta 0), which every process runs, the
entropy control's forward (`token_relevance="entropy"`), which follows the replay's rule, and
contrastive relevance (`token_relevance="contrastive"`), whose placebo every process gathers."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from fsdp_replay_toys import (
    COMPLETIONS,
    CONTRASTIVE,
    CREDIT_MAP_RUNS,
    ENTROPY,
    GROUP_SIZE,
    SCENARIOS,
    WORDS,
    scored_batch,
)
from trainer_toys import toy_verifiers

from mrtpo import advantages
from mrtpo.advantages import EPS
from mrtpo.relevance import naive_replay_distances
from mrtpo.sharding import check_replay_backend
from mrtpo.testing import tiny_model_and_tokenizer

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
TIMEOUT_S = 150  # a hang (processes out of step) fails here; the run takes about 35 s


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
    # Sharded again after the replays, and each layer frees its gathered parameters after its
    # forward again (the reshard-after-forward setting put back).
    assert all(rank["sharded_after"] and rank["layer_resharded_after_forward"] for rank in ranks)
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

    # The entropy control: process 1 weighted no row in the first scenario (and still entered
    # the gather). Its distances are per-row forwards' entropies of the unsharded model in eval
    # mode (TRL's temperature 1) on the pairs whose Ã_k is not 0, and its advantages equal one
    # process's over the whole batch.
    entropy = {name: [rank[ENTROPY][name] for rank in ranks] for name in SCENARIOS}
    assert [run["replayed"] for run in entropy["one_process_without_rows"]] == [[0, 1, 2, 3], []]
    assert [run["replayed"] for run in entropy["different_replay_batches"]] == [
        [0, 1, 2, 3],
        [0, 1],
    ]
    model.eval()
    for name, rewards in SCENARIOS.items():
        rewards_tensor = torch.tensor(rewards, dtype=torch.float32)
        varies = torch.nan_to_num(advantages.per_reward(rewards_tensor, GROUP_SIZE, eps=EPS)) != 0
        width = max(run["batch"]["completion_ids"].shape[1] for run in entropy[name])
        distance = torch.zeros(len(rewards), len(rewards[0]), width)
        mask = torch.zeros(len(rewards), width)
        for rank, run in enumerate(entropy[name]):
            rows = slice(rank * GROUP_SIZE, (rank + 1) * GROUP_SIZE)
            own = run["batch"]["completion_mask"].float()
            pairs = (eval_entropies(model, run["batch"]) * own).unsqueeze(1) * varies[rows, :, None]
            distance[rows, :, : own.shape[1]] = pairs
            mask[rows, : own.shape[1]] = own
            torch.testing.assert_close(run["distance"], pairs[run["replayed"]], rtol=0, atol=1e-5)
        assert distance.max() > 1.0  # entropies, far above the tolerance
        expected = advantages.mrtpo(rewards_tensor, GROUP_SIZE, distance, mask, 1.0, eps=EPS)
        for rank, run in enumerate(entropy[name]):
            rows = slice(rank * GROUP_SIZE, (rank + 1) * GROUP_SIZE)
            actual, trained = run["advantages"], mask[rows, : run["advantages"].shape[1]]
            torch.testing.assert_close(
                actual * trained, expected[rows, : actual.shape[1]] * trained, rtol=0, atol=1e-5
            )

    # Contrastive relevance: process 1 replayed nothing in the first scenario (and still
    # entered both gathers). Its advantages are one process's over the whole batch from the
    # naive replays' distances, own minus placebo, clamped, on the pairs whose Ã_k is not 0;
    # with two groups, each row's placebo is the other group's row at its position.
    contrastive = {name: [rank[CONTRASTIVE][name] for rank in ranks] for name in SCENARIOS}
    assert [run["replayed"] for run in contrastive["one_process_without_rows"]] == [
        [0, 1, 2, 3],
        [],
    ]
    for name, rewards in SCENARIOS.items():
        batches = [scored_batch(tokenizer, rewards, rank, contrastive=True) for rank in range(2)]
        prompts = [prompt for batch in batches for prompt in batch.prompts]
        completion_ids = [ids for batch in batches for ids in batch.completion_ids]
        own = [[v.info for v in row] for batch in batches for row in batch.row_verdicts()]
        placebo = own[GROUP_SIZE:] + own[:GROUP_SIZE]
        own_distance, mask = naive_replay_distances(model, tokenizer, prompts, completion_ids, own)
        placebo_distance, _ = naive_replay_distances(
            model, tokenizer, prompts, completion_ids, placebo
        )
        rewards_tensor = torch.tensor(rewards, dtype=torch.float32)
        varies = torch.nan_to_num(advantages.per_reward(rewards_tensor, GROUP_SIZE, eps=EPS)) != 0
        difference = (own_distance - placebo_distance) * varies.unsqueeze(-1)
        assert difference.min() < -1e-3  # the clamp cuts (process 0's rows)
        if name == "different_replay_batches":  # and keeps (process 1's rows, replayed here)
            assert difference.max() > 1e-3
        expected = advantages.mrtpo(
            rewards_tensor, GROUP_SIZE, difference.clamp(min=0.0), mask, 1.0, eps=EPS
        )
        for run, batch in zip(contrastive[name], batches, strict=True):
            actual = run["advantages"]
            trained = mask[batch.local, : actual.shape[1]]
            torch.testing.assert_close(
                actual * trained,
                expected[batch.local, : actual.shape[1]] * trained,
                rtol=0,
                atol=1e-4,  # the weights divide by mean contrasts of a few 1e-3
            )

    # The credit-map runs through TRL's hooks: every process replayed its own lowest- and
    # highest-reward rows, and nothing else (beta 0: no row for the advantages), with the naive
    # replay's distances; process 0 wrote the maps. Advantages: GDPO's, on every token at beta 0.
    rewards = torch.tensor(
        [toy_scores(text, WORDS[i // GROUP_SIZE]) for i, text in enumerate(COMPLETIONS)]
    )
    gdpo = advantages.gdpo(rewards, GROUP_SIZE, eps=EPS)
    for name in CREDIT_MAP_RUNS:
        assert (tmp_path / name / "credit" / "step-00000.html").exists(), name
        for rank, record in enumerate(ranks):
            run = record[name]
            assert [len(replay["prompts"]) for replay in run["replays"]] == [2], (name, rank)
            (replay,) = run["replays"]
            own = [tokenizer.encode(text, add_special_tokens=False) for text in COMPLETIONS]
            own = own[rank * GROUP_SIZE : (rank + 1) * GROUP_SIZE]
            assert all(ids[:-1] in own for ids in replay["completion_ids"]), (name, rank)
            reference, _ = naive_replay_distances(
                model, tokenizer, replay["prompts"], replay["completion_ids"], replay["infos"]
            )
            assert reference.max() > 1e-3  # far above the tolerance
            torch.testing.assert_close(replay["distance"], reference, rtol=0, atol=1e-5)
            response = gdpo[rank * GROUP_SIZE : (rank + 1) * GROUP_SIZE]
            if name.startswith("gdpo"):
                torch.testing.assert_close(run["advantages"], response, rtol=0, atol=1e-6)
            else:
                expected = response[:, None] * run["completion_mask"]
                torch.testing.assert_close(run["advantages"], expected, rtol=0, atol=1e-6)


def eval_entropies(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, C) next-token entropy at each completion token, by a plain forward of each row."""
    rows = []
    prompt_ids, completion_ids = batch["prompt_ids"], batch["completion_ids"]
    for prompt, completion in zip(prompt_ids, completion_ids, strict=True):
        ids = torch.cat([prompt, completion]).unsqueeze(0)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        log_probs = torch.log_softmax(logits, dim=-1)
        rows.append(-(log_probs.exp() * log_probs).sum(-1))
    return torch.stack(rows)


def toy_scores(text: str, word: str) -> list[float]:
    """The toy verifiers' scores of a completion of the prompt about `word` (NaN: no score)."""
    example = {"prompt": [{"role": "user", "content": word}], "letter": word[0]}
    scores = [verifier.verify(text, example).score for verifier in toy_verifiers()]
    return [float("nan") if score is None else score for score in scores]


# ----------------------------------------------------------------------------- setups


def accelerator_with(zero_stage: int | None = None, fsdp_version: int | None = None):
    """An object shaped like an accelerator as far as TRL's backend detection reads it."""
    deepspeed = None if zero_stage is None else SimpleNamespace(zero_stage=zero_stage)
    fsdp = None if fsdp_version is None else SimpleNamespace(fsdp_version=fsdp_version)
    return SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=deepspeed, fsdp_plugin=fsdp))


def test_replay_backend_refuses_what_it_cannot_gather_once():
    for accelerator in (accelerator_with(), accelerator_with(2), accelerator_with(fsdp_version=2)):
        check_replay_backend(accelerator, ds3_gather_for_generation=False)
    check_replay_backend(accelerator_with(3), ds3_gather_for_generation=True)
    with pytest.raises(ValueError, match="ds3_gather_for_generation=True"):
        check_replay_backend(accelerator_with(3), ds3_gather_for_generation=False)
    with pytest.raises(ValueError, match="fsdp_version: 2"):
        check_replay_backend(accelerator_with(fsdp_version=1), ds3_gather_for_generation=True)


@pytest.mark.parametrize(
    "name, distributed_type", [("ddp", "MULTI_GPU"), ("fsdp2", "FSDP"), ("zero3", "DEEPSPEED")]
)
def test_accelerate_configs_load_and_launch_existing_recipes(name, distributed_type):
    from accelerate.commands.config.config_args import load_config_from_file

    path = ROOT / "recipes" / "accelerate" / f"{name}.yaml"
    config = load_config_from_file(str(path))
    assert config.distributed_type.name == distributed_type
    if name == "fsdp2":
        assert config.fsdp_config["fsdp_version"] == 2
    if name == "zero3":
        assert config.deepspeed_config["zero_stage"] == 3
    launches = re.findall(
        r"accelerate launch --config_file (\S+) .* --config (\S+)", path.read_text()
    )
    assert launches and all(
        config_file == f"recipes/accelerate/{name}.yaml" and (ROOT / recipe).is_file()
        for config_file, recipe in launches
    )
