"""Two processes, one of which holds a prompt the replay cannot serve (no user turn).

Run by `tests/test_trainer.py` as `accelerate launch --multi_gpu --num_processes 2
tests/prompt_check_toys.py OUT_DIR`: each process writes the error its `train()` raised to
`OUT_DIR/rank{r}.txt` (nothing if none), then exits with status 3 if it raised. A process
that waited in a collective for the other would never get there.
"""

from __future__ import annotations

import sys
from pathlib import Path

from datasets import Dataset
from trainer_toys import CPU_RUN, toy_verifiers


def main(out_dir: str) -> None:
    from mrtpo.testing import tiny_model_and_tokenizer
    from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

    system = {"role": "system", "content": "You are a helpful assistant."}
    rows = [
        {"prompt": [system, {"role": "user", "content": "Write about apples."}], "letter": "a"},
        {"prompt": [system], "letter": "r"},  # no user turn to append information to
    ]
    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    args = MRTPOConfig(
        output_dir=str(Path(out_dir) / "run"),
        per_device_train_batch_size=4,
        num_generations=4,  # one prompt a process: one of them holds the bad one
        max_completion_length=8,
        max_steps=1,
        **CPU_RUN,
    )
    trainer = MRTPOTrainer(
        model=model,
        reward_funcs=toy_verifiers(),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    rank = trainer.accelerator.process_index
    try:
        trainer.train()
    except ValueError as error:
        (Path(out_dir) / f"rank{rank}.txt").write_text(str(error))
        sys.exit(3)


if __name__ == "__main__":
    main(sys.argv[1])
