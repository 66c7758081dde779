"""Two processes replaying different rows of one batch on a model sharded by FSDP2.

Run by `tests/test_sharded_replay.py` as
`python -m torch.distributed.run --nproc_per_node 2 tests/fsdp_replay_toys.py OUT_DIR` (gloo on
CPU). Accelerate's FSDP is GPU-only (`use_cpu=True` makes a plain multi-CPU run), so each
process shards the tiny model itself with torch's `fully_shard` (each decoder layer, then the
whole model, as accelerate's FSDP2 does) and drives the trainer's replay path directly:
`MRTPOTrainer._token_advantages` then `_write_credit_maps`, on batches (`SCENARIOS`) where the
processes' rows need different replays; then it runs TRL's `_generate_and_score_completions`
(scripted completions) for GDPO and MRTPO at beta 0 with credit maps every step
(`CREDIT_MAP_RUNS`), whose only replay is the credit maps'. The entropy control
(`token_relevance="entropy"`) runs `_token_advantages` on the same scenarios: its one forward
follows the replay's rule (whole parameters gathered on every process, rows or none).
Contrastive relevance (`token_relevance="contrastive"`) runs `_token_advantages` on the same
scenarios too: every process gathers the whole batch's information for the placebo, and
process 1, with no row to replay in the first scenario, still enters that gather and the
parameters' gather. Each process saves its per-token advantages per scenario (`ENTROPY` for
the entropy control's, with the padded batch it read; `CONTRASTIVE` for contrastive
relevance's), and its replays per run, to `OUT_DIR/rank{r}.pt`.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from trainer_toys import CPU_RUN, toy_trainer

from mrtpo import advantages
from mrtpo.advantages import EPS
from mrtpo.step_data import ScoredBatch, StepAdvantages
from mrtpo.testing import tiny_model_and_tokenizer
from mrtpo.trainer import MRTPOConfig, MRTPOTrainer
from mrtpo.verifiers import Verdict

GROUP_SIZE = 4  # one group per process: rows 0-3 on process 0, rows 4-7 on process 1
WORDS = ("apple", "river")  # process 0's prompt, process 1's
COMPLETIONS = (
    " An apple a day.",
    " Red apples fall from the tree in autumn.",
    " apple",
    " The apple is green and sour, not sweet.",
    " A river runs through it.",
    " river",
    " Rivers flow to the sea, slowly and surely, every day.",
    " The river is cold.",
)
INFOS = (
    "The response must contain the letter {letter!r}.",
    "The response must have an even number of characters.",
    "The response must start with a space.",
)
# Process 1's information in the contrastive runs: texts unlike process 0's, so that each
# row's placebo moves the policy unlike its own information (with INFOS on both processes the
# two differ by one letter, and the contrast is within float rounding of 0).
OTHER_INFOS = (
    "Reference query: SELECT name, COUNT(*) FROM singer GROUP BY country",
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    "* first bullet\n* second bullet\n\n<<A Title>>",
)
# (N=8, K=3) rewards per scenario. A row is replayed when some reward varies in its group.
SCENARIOS = {
    # Process 1's group has constant rewards: it replays nothing (once returned early).
    "one_process_without_rows": [[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 1]] + [[1, 0, 1]] * 4,
    # Both replay, 4 rows against 2 (rewards of rows 6 and 7 at their group's mean): with two
    # contexts per forward pass, different numbers of passes.
    "different_replay_batches": [[1, 0, 1], [0, 1, 1], [1, 1, 0], [0, 0, 1]]
    + [[1, 0, 1], [0, 1, 1], [0.5, 0.5, 1], [0.5, 0.5, 1]],
}


ENTROPY = "entropy_control"  # the records' key of the entropy control's scenarios
CONTRASTIVE = "contrastive_relevance"  # and of contrastive relevance's


def scored_batch(
    tokenizer, rewards: list[list[float]], rank: int, contrastive: bool = False
) -> ScoredBatch:
    """Process `rank`'s four rows of a scenario (the same rewards on every process);
    `contrastive`: process 1's information is `OTHER_INFOS`."""
    word = WORDS[rank]
    prompt = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": f"Write one line about the word {word}."},
    ]
    local = slice(rank * GROUP_SIZE, (rank + 1) * GROUP_SIZE)
    texts = list(COMPLETIONS[local])
    rewards_tensor = torch.tensor(rewards, dtype=torch.float32)
    infos = [info.format(letter=word[0]) for info in INFOS]
    if contrastive and rank == 1:
        infos = list(OTHER_INFOS)
    return ScoredBatch(
        prompts=[prompt] * GROUP_SIZE,
        completions=texts,
        completion_ids=[tokenizer.encode(text, add_special_tokens=False) for text in texts],
        rewards=rewards_tensor,
        verdicts=[
            [
                Verdict(rewards_tensor[row, k].item(), infos[k])
                for row in range(local.start, local.stop)
            ]
            for k in range(len(INFOS))
        ],
        local=local,
    )


def padded_batch(tokenizer, scored: ScoredBatch) -> dict[str, torch.Tensor]:
    """TRL's padded tensors of a process's rows, as `_token_advantages` reads them: the prompt
    rendered for generation (one prompt per process: no left padding), completions
    right-padded."""
    text = tokenizer.apply_chat_template(
        scored.prompts[0], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    ids = scored.completion_ids
    width = max(len(row) for row in ids)
    return {
        "prompt_ids": torch.tensor([prompt_ids] * len(ids)),
        "prompt_mask": torch.ones(len(ids), len(prompt_ids), dtype=torch.long),
        "completion_ids": torch.tensor(
            [row + [tokenizer.pad_token_id] * (width - len(row)) for row in ids]
        ),
        "completion_mask": torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids]),
    }


def scenario_config(output_dir: Path, **settings) -> MRTPOConfig:
    """A quiet CPU run's config, one group of `GROUP_SIZE` per process, with `settings`."""
    return MRTPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=GROUP_SIZE,
        num_generations=GROUP_SIZE,
        max_completion_length=16,
        mrtpo_warmup_steps=0,
        **{**CPU_RUN, **settings},
    )


def step_advantages(trainer: MRTPOTrainer, scored: ScoredBatch) -> StepAdvantages:
    """GDPO's step of a scenario, as `_generate_and_score_completions` makes it."""
    weights = trainer.reward_weights
    normalized = advantages.per_reward(scored.rewards, GROUP_SIZE, eps=EPS)
    return StepAdvantages(
        weights,
        advantages.gdpo(scored.rewards, GROUP_SIZE, weights, eps=EPS)[scored.local],
        per_reward=torch.nan_to_num(normalized[scored.local]),
        token=None,
    )


# Runs through TRL's own `_generate_and_score_completions` whose only replay is the credit
# maps': each process replays its own lowest- and highest-reward rows for the maps, which only
# process 0 writes. A process that skipped that replay would leave the other in a gather.
CREDIT_MAP_RUNS = {
    "gdpo_credit_maps": {"advantage_estimator": "gdpo"},
    # beta 0 at every step: no row is replayed for the advantages, on either process
    "mrtpo_beta_zero_credit_maps": {"advantage_estimator": "mrtpo", "mrtpo_beta": 0.0},
}


class ScriptedCompletions(MRTPOTrainer):
    """TRL's generation with this process's four `COMPLETIONS` as the model's output (the same
    forward passes on every process: none)."""

    def _generate_single_turn(
        self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False
    ):
        rank = self.accelerator.process_index
        tokenizer = self.processing_class
        texts = COMPLETIONS[rank * GROUP_SIZE : (rank + 1) * GROUP_SIZE]
        ids = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
        return [row + [tokenizer.eos_token_id] for row in ids][: len(prompt_ids)], None


def credit_map_run(model, tokenizer, out_dir: str, name: str, rank: int) -> dict:
    """One generation batch of run `name` through TRL's hooks: the replays each process ran
    (through `mrtpo.relevance.replay_distances`) and the batch's advantages."""
    import mrtpo.relevance

    replays = []
    real = mrtpo.relevance.replay_distances

    def recording(model, tokenizer, prompts, completion_ids, infos, **options):
        distance, mask = real(model, tokenizer, prompts, completion_ids, infos, **options)
        replays.append(
            {
                "prompts": list(prompts),
                "completion_ids": [list(ids) for ids in completion_ids],
                "infos": [list(row) for row in infos],
                "distance": distance.float().cpu(),
            }
        )
        return distance, mask

    args = scenario_config(Path(out_dir) / name, credit_map_steps=1, **CREDIT_MAP_RUNS[name])
    trainer = toy_trainer(ScriptedCompletions, model, tokenizer, args)
    word = WORDS[rank]
    example = {
        "prompt": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"Write one line about the word {word}."},
        ],
        "letter": word[0],
    }
    model.train()
    mrtpo.relevance.replay_distances = recording
    try:
        output = trainer._generate_and_score_completions([dict(example) for _ in range(GROUP_SIZE)])
    finally:
        mrtpo.relevance.replay_distances = real
    return {
        "replays": replays,
        "advantages": output["advantages"].cpu(),
        "completion_mask": output["completion_mask"].cpu(),
    }


def token_level_runs(
    model, tokenizer, out_dir: str, rank: int, token_relevance: str, **overrides
) -> dict[str, dict]:
    """`_token_advantages` at beta 1 with `token_relevance` on each scenario (process 1's
    information `OTHER_INFOS` for "contrastive"): per scenario, the advantages, the rows
    replayed, their distances and the padded batch read."""
    args = scenario_config(
        Path(out_dir) / token_relevance,
        mrtpo_beta=1.0,
        token_relevance=token_relevance,
        **overrides,
    )
    trainer = toy_trainer(MRTPOTrainer, model, tokenizer, args)
    runs = {}
    for name, rewards in SCENARIOS.items():
        scored = scored_batch(tokenizer, rewards, rank, token_relevance == "contrastive")
        output = padded_batch(tokenizer, scored)
        step = step_advantages(trainer, scored)
        token = trainer._token_advantages(scored, step, GROUP_SIZE, output)
        runs[name] = {
            "advantages": token.advantages.cpu(),
            "replayed": token.replay.rows,
            "distance": token.replay.distance.cpu(),
            "batch": output,
        }
    return runs


def main(out_dir: str) -> None:
    # A short timeout: processes out of step fail here instead of waiting for gloo's default.
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    rank = dist.get_rank()
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    args = scenario_config(
        Path(out_dir) / "run", mrtpo_beta=1.0, replay_batch_size=2, credit_map_steps=1
    )
    trainer = toy_trainer(MRTPOTrainer, model, tokenizer, args)
    records = {"distributed_type": str(trainer.accelerator.distributed_type)}
    for index, (name, rewards) in enumerate(SCENARIOS.items()):
        scored = scored_batch(tokenizer, rewards, rank)
        trainer._scored = scored
        # The first replay comes before any forward of the model (as when vLLM generates and
        # nothing recomputes log-probabilities); later ones after a forward of the whole model,
        # as TRL's generation does.
        if index:
            with torch.no_grad():
                model(torch.tensor([tokenizer.encode(f"Write one line about {WORDS[rank]}.")[:6]]))
        width = max(len(ids) for ids in scored.completion_ids)
        step = step_advantages(trainer, scored)
        # TRL's batch as `_token_advantages` reads it here: the completion width.
        output = {"completion_ids": torch.zeros(len(scored.prompts), width, dtype=torch.long)}
        step.token = trainer._token_advantages(scored, step, GROUP_SIZE, output)
        trainer._last_credit_step = None
        trainer._write_credit_maps(
            scored, step, width
        )  # replays each process's chosen rows it skipped
        records[name] = {
            "advantages": step.token.advantages.cpu(),
            "replayed": step.token.replay.rows,
            "completion_ids": scored.completion_ids,
            "prompts": scored.prompts,
            "infos": [[verdict.info for verdict in row] for row in scored.row_verdicts()],
        }
    # The entropy control on the same scenarios: process 1 has no row to weight in the first.
    records[ENTROPY] = token_level_runs(model, tokenizer, out_dir, rank, "entropy")
    # Contrastive relevance on them (two replays in one call, minus the placebo's, whose
    # information is gathered from both processes).
    records[CONTRASTIVE] = token_level_runs(
        model, tokenizer, out_dir, rank, "contrastive", replay_batch_size=2
    )
    for name in CREDIT_MAP_RUNS:
        records[name] = credit_map_run(model, tokenizer, out_dir, name, rank)
    # The model is sharded again afterwards, and a training forward and backward still work.
    weight = model.model.layers[0].self_attn.q_proj.weight
    records["sharded_after"] = weight.to_local().shape[0] < weight.shape[0]
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3, 4]]))
    weight = model.model.layers[0].self_attn.q_proj.weight
    records["layer_resharded_after_forward"] = weight.to_local().shape[0] < weight.shape[0]
    model(torch.tensor([[1, 2, 3, 4]])).logits.sum().backward()
    torch.save(records, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
