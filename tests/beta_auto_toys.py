"""A task where the re-allocation's direction is planted, for `mrtpo_beta: auto`'s tests, and
the two-process run of tests/test_beta_auto.py.

`FirstChar` rewards a completion whose first character has an even code: the reward is decided
by the first token alone. `planted_replay` stands in for `mrtpo.relevance.replay_distances` and
puts every reward's whole distance on each response's first token, so the re-allocation moves
credit off the tokens that do not decide the reward onto the one that does: the step
g_U + beta g_R sheds the later tokens' noise as beta grows, and its direction comes closer to
the summed reward's policy gradient (the rule's agreement is positive). With
`shuffle_token_weights` the same weights land on random tokens: no closer.
At temperature 0.15 the tiny model samples its first token among a few, so that independent
micro-batches' gradients agree measurably (at 1.0 they are nearly orthogonal).

Run as `accelerate launch --multi_gpu --num_processes 2 tests/beta_auto_toys.py OUT_DIR` (CPU,
gloo): each process trains auto-beta steps and saves its log history (`OUT_DIR/rank{r}.pt`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from mrtpo.verifiers import Verdict, Verifier

# Sampling temperature at which the tiny model's first token varies among a few candidates.
PLANTED_TEMPERATURE = 0.15

# The planted task: 16 rows per micro-batch (4 prompts x 4), 2 micro-batches a step, 4 tokens,
# a probe every step and beta moving by 0.25.
PLANTED = dict(
    per_device_train_batch_size=16,
    num_generations=4,
    gradient_accumulation_steps=2,
    max_completion_length=4,
    learning_rate=1e-3,
    temperature=PLANTED_TEMPERATURE,
    mrtpo_beta="auto",
    mrtpo_warmup_steps=0,
    mrtpo_beta_probe_every=1,
    mrtpo_beta_step=0.25,
)


class FirstChar(Verifier):
    """1 if the completion's first character has an even code point."""

    name = "first_char"

    def verify(self, completion: str, example: Mapping[str, Any]) -> Verdict:
        even = bool(completion) and ord(completion[0]) % 2 == 0
        return Verdict(float(even), "The first character's code must be even.", ((0, 1),))


def planted_replay(model, tokenizer, prompts, completion_ids, infos, **options):
    """`replay_distances`' signature: distance 1 on each response's first token, 0 elsewhere
    (pairs not wanted: 0), mask 1 on the response tokens."""
    width = max(len(ids) for ids in completion_ids)
    wanted = options["wanted"].float()
    distance = torch.zeros(len(prompts), wanted.shape[1], width)
    distance[:, :, 0] = 1.0
    lengths = torch.tensor([len(ids) for ids in completion_ids])
    mask = (torch.arange(width) < lengths.unsqueeze(1)).float()
    return distance * wanted.unsqueeze(-1), mask


def main(out_dir: str) -> None:
    from trainer_toys import CPU_RUN, toy_dataset

    import mrtpo.relevance
    from mrtpo.testing import tiny_model_and_tokenizer
    from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

    mrtpo.relevance.replay_distances = planted_replay  # the trainer imports it when it replays
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    args = MRTPOConfig(output_dir=str(Path(out_dir) / "run"), max_steps=6, **PLANTED, **CPU_RUN)
    trainer = MRTPOTrainer(
        model=model,
        reward_funcs=[FirstChar()],
        args=args,
        train_dataset=toy_dataset(16),
        processing_class=tokenizer,
    )
    trainer.train()
    rank = trainer.accelerator.process_index
    torch.save({"log_history": trainer.state.log_history}, Path(out_dir) / f"rank{rank}.pt")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main(*sys.argv[1:])
