"""Toy verifiers and data for the trainer tests, and the two-process training script.

Run by `tests/test_trainer.py` as
`accelerate launch --multi_gpu --num_processes 2 tests/trainer_toys.py OUT_DIR WEIGHTING` (CPU:
the config has `use_cpu=True`, so the two processes talk over gloo): each process trains
two MRTPO steps on the tiny model with `reward_weighting=WEIGHTING` and saves, per generation
batch, what TRL's hooks and the replay's entry point see: its input rows, the policy's
parameters, the gathered rewards, each call of `mrtpo.relevance.replay_distances` (inputs and
distances) and the batch's completions and per-token advantages (`OUT_DIR/rank{r}.pt`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from datasets import Dataset

from mrtpo.verifiers import Verdict, Verifier


def launch_two_processes(script: str, *args: str, timeout: int) -> subprocess.CompletedProcess:
    """`tests/<script>` with `args` on two CPU processes talking over gloo (from the repository
    root, one torch thread each)."""
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [
        str(Path(sys.executable).with_name("accelerate")),
        "launch",
        # accelerate's `--cpu` launcher starts one process unless MPI is set up; `--multi_gpu`
        # runs torchrun, and the config's `use_cpu=True` makes that two CPU processes on gloo.
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        str(tests / script),
        *args,
    ]
    return subprocess.run(
        command, cwd=tests.parent, env=env, capture_output=True, text=True, timeout=timeout
    )


WORDS = ["apple", "river", "stone", "cloud", "table", "green", "music", "light"]
# MRTPOConfig settings of a quiet CPU run that saves nothing.
CPU_RUN = dict(
    report_to=[], use_cpu=True, bf16=False, save_strategy="no", seed=0, disable_tqdm=True
)


class ContainsLetter(Verifier):
    """1 if the completion contains the example's `letter`; spans = where it occurs."""

    name = "contains_letter"

    def verify(self, completion: str, example: Mapping[str, Any]) -> Verdict:
        letter = example["letter"]
        spans = tuple((i, i + 1) for i, char in enumerate(completion) if char == letter)
        return Verdict(
            float(bool(spans)), f"The response must contain the letter {letter!r}.", spans
        )


class EvenLength(Verifier):
    """1 if the completion has an even number of characters."""

    name = "even_length"

    def verify(self, completion: str, example: Mapping[str, Any]) -> Verdict:
        even = len(completion) % 2 == 0
        return Verdict(
            float(even),
            "The response must have an even number of characters.",
            ((0, len(completion)),),
        )


class StartsWithSpace(Verifier):
    """1 if the completion starts with a space; None (not applicable) for the word 'stone'."""

    name = "starts_with_space"

    def verify(self, completion: str, example: Mapping[str, Any]) -> Verdict:
        if "stone" in example["prompt"][-1]["content"]:
            return Verdict(None, "Not checked for this prompt.")
        return Verdict(
            float(completion.startswith(" ")), "The response must start with a space.", ((0, 1),)
        )


def toy_dataset(num_prompts: int = 8) -> Dataset:
    """Chat prompts with a `letter` column the verifiers read."""
    rows = []
    for i in range(num_prompts):
        word = WORDS[i % len(WORDS)]
        rows.append(
            {
                "prompt": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": f"Write one line about the word {word}."},
                ],
                "letter": word[0],
            }
        )
    return Dataset.from_list(rows)


def toy_verifiers() -> list[Verifier]:
    return [ContainsLetter(), EvenLength(), StartsWithSpace()]


def toy_trainer(trainer_class: type, model: Any, tokenizer: Any, args: Any, **kwargs: Any) -> Any:
    """`trainer_class` (an `MRTPOTrainer`) on the toy verifiers and data."""
    return trainer_class(
        model=model,
        reward_funcs=toy_verifiers(),
        args=args,
        train_dataset=toy_dataset(),
        processing_class=tokenizer,
        **kwargs,
    )


def main(out_dir: str, weighting: str, share_prompt: str = "true") -> None:
    import torch

    import mrtpo.relevance
    from mrtpo.testing import tiny_model_and_tokenizer
    from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

    generations: list[dict[str, Any]] = []
    real = mrtpo.relevance.replay_distances

    def recording(model, tokenizer, prompts, completion_ids, infos, **options):
        distance, mask = real(model, tokenizer, prompts, completion_ids, infos, **options)
        generations[-1]["replays"].append(
            {
                "prompts": list(prompts),
                "completion_ids": [list(ids) for ids in completion_ids],
                "wanted": options["wanted"].cpu(),
                "distance": distance.float().cpu(),
            }
        )
        return distance, mask

    mrtpo.relevance.replay_distances = recording  # the trainer imports it when it replays

    class Recording(MRTPOTrainer):
        """Keeps what TRL's hooks see of each generation batch (nothing of the trainer's own)."""

        def _generate_and_score_completions(self, inputs):
            policy = self.accelerator.unwrap_model(self.model)
            generations.append(
                {
                    "inputs": [dict(row) for row in inputs],
                    "state": {name: t.detach().clone() for name, t in policy.state_dict().items()},
                    "replays": [],
                }
            )
            output = super()._generate_and_score_completions(inputs)
            for key in ("completion_ids", "completion_mask", "advantages"):
                generations[-1][key] = output[key].cpu()
            return output

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            generations[-1]["rewards"] = rewards.cpu()  # gathered over the processes
            return rewards

    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    args = MRTPOConfig(
        output_dir=str(Path(out_dir) / "run"),
        per_device_train_batch_size=4,
        num_generations=8,  # one group spans both processes
        max_completion_length=8,
        max_steps=2,
        mrtpo_warmup_steps=0,
        mrtpo_beta=0.5,
        reward_weighting=weighting,
        share_prompt=share_prompt == "true",
        **CPU_RUN,
    )
    trainer = toy_trainer(Recording, model, tokenizer, args)
    trainer.train()
    rank = trainer.accelerator.process_index
    torch.save(
        {
            "generations": generations,
            "num_processes": trainer.accelerator.num_processes,
            "replay_mode": args.replay_mode,
            "shares_prompt": trainer._shares_prompt,
            "log_history": trainer.state.log_history,
        },
        Path(out_dir) / f"rank{rank}.pt",
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
