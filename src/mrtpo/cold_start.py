"""The supervised cold start: a few optimizer steps of TRL's `SFTTrainer` on a task's reference
responses, so that a small model produces the task's output format before RL.

A model that never writes the format gets 0 from every binary format reward, no group has
variance and RL learns nothing. The dataset is prompt-completion: `prompt` is the task's chat
messages (the very column `mrtpo train` generates from, rendered by the same chat template with
the generation prompt) and `completion` is one assistant message holding the task's reference
response, so TRL puts the loss on the completion only. `mrtpo sft` and the demo call
`build_sft_trainer` and `run_sft`.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import torch

# The measured cold-start budget for the embedded model (see recipes/tool_calling.yaml):
# 64 demonstrations, batch 8 (2 per micro-batch x 4 accumulated: a micro-batch of 8 tool-calling
# examples peaks at ~17 GB of activations on CPU, 2 at ~6 GB), lr 5e-5.
SFT_DEFAULTS: dict[str, Any] = {
    "max_steps": 3,
    "learning_rate": 5e-5,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 4,
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "max_length": None,  # never cut a prompt: the completion would lose its context
    "completion_only_loss": True,
    "activation_checkpointing": False,
    "bf16": torch.cuda.is_available(),
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "dataloader_pin_memory": torch.cuda.is_available(),
}


def sft_config(**overrides: Any) -> Any:
    """TRL's `SFTConfig` of `SFT_DEFAULTS` with `overrides` on top (what `mrtpo sft` parses from
    the same flags)."""
    from trl import SFTConfig

    return SFTConfig(**{**SFT_DEFAULTS, **overrides})


def cold_start_dataset(
    task: Any,
    split: str = "train",
    path: str | None = None,
    max_examples: int | None = None,
    seed: int = 0,
) -> Any:
    """Prompt-completion rows from the task's references: prompt = the task's chat messages,
    completion = [{"role": "assistant", "content": reference}]. Rows without a reference are
    skipped; a task with none raises ValueError."""
    from datasets import Dataset

    data = task.load(split, path=path).shuffle(seed=seed)
    rows = []
    for example in data:
        reference = task.reference_completion(example)
        if reference is None:
            continue
        rows.append(
            {
                "prompt": example["prompt"],
                "completion": [{"role": "assistant", "content": reference}],
            }
        )
        if max_examples is not None and len(rows) >= max_examples:
            break
    if not rows:
        raise ValueError(
            f"task {task.name!r} has no reference responses in its {split!r} split, so there is "
            "nothing to fine-tune on: pass --data with reference responses, or train with RL directly"
        )
    return Dataset.from_list(rows)


UNTRAINED_TOKEN_CHOICES = ("fit", "mean", "keep")


def build_sft_trainer(
    task: str,
    model_name_or_path: str,
    config: Any,
    data: str | None = None,
    split: str = "train",
    max_train_examples: int | None = 64,
    untrained_tokens: str = "fit",
) -> Any:
    """TRL's SFTTrainer on the task's references (keywords named as `mrtpo sft`'s arguments;
    `config` an `SFTConfig`), with the model and tokenizer loaded. `untrained_tokens`: what to
    do with the embedding rows of tokens the references use but the model never trained
    (`initialize_untrained_rows`: "fit" or "mean"; "keep" leaves them and only warns)."""
    from trl import SFTTrainer

    from mrtpo import tasks
    from mrtpo.models import load_model

    if untrained_tokens not in UNTRAINED_TOKEN_CHOICES:
        raise ValueError(
            f"untrained_tokens must be one of {UNTRAINED_TOKEN_CHOICES}, got {untrained_tokens!r}"
        )
    task_object = tasks.get(task)
    if data is not None and not Path(data).exists():
        raise FileNotFoundError(f"data path {data!r} does not exist")
    dataset = cold_start_dataset(task_object, split, data, max_train_examples, config.seed)
    model, tokenizer = load_model(model_name_or_path)
    untrained = untrained_reference_tokens(
        model, tokenizer, dataset, warn=untrained_tokens == "keep"
    )
    if untrained and untrained_tokens != "keep":
        fitted = initialize_untrained_rows(model, tokenizer, dataset, untrained, untrained_tokens)
        for token_id, (before, after) in fitted.items():
            print(
                f"sft: untrained token {tokenizer.convert_ids_to_tokens(token_id)!r} "
                f"({token_id}) initialized ({untrained_tokens}): mean log p where the references "
                f"write it {before:.2f} -> {after:.2f}"
            )
    return SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)


def untrained_reference_tokens(
    model: Any, tokenizer: Any, dataset: Any, warn: bool = True
) -> list[int]:
    """The tokens the references use whose embedding rows were never trained (a model that
    cannot write them; `mrtpo.models.untrained_token_ids`), with a warning when `warn`."""
    from mrtpo.models import untrained_token_ids

    used = {
        token_id
        for row in dataset
        for token_id in tokenizer(row["completion"][0]["content"], add_special_tokens=False)[
            "input_ids"
        ]
    }
    untrained = untrained_token_ids(model, used)
    if untrained and warn:
        names = ", ".join(f"{tokenizer.convert_ids_to_tokens(i)!r} ({i})" for i in untrained)
        warnings.warn(
            f"the references use tokens whose embedding rows this model never trained: {names}. "
            "The model gives them almost no probability, and a few fine-tuning steps at a small "
            "learning rate do not teach it to write them (docs/results/embedded-models.md); "
            "`mrtpo sft --untrained_tokens fit` initializes those rows first",
            stacklevel=2,
        )
    return untrained


def token_pieces(tokenizer: Any, token_id: int) -> list[int]:
    """The ids that `token_id`'s text splits into without the token itself: `<tool_call>` into
    `<`, `tool`, `_call`, `>`. A fast tokenizer's vocabulary model is asked directly, below its
    added tokens (which would match the text whole, special or not); a token the vocabulary
    itself holds, which would come back whole, is split into its characters. Empty when even
    those give only the token."""

    def split(text: str) -> list[int]:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        if backend.normalizer is not None:
            text = backend.normalizer.normalize_str(text)
        words = [(text, None)]
        if backend.pre_tokenizer is not None:
            words = backend.pre_tokenizer.pre_tokenize_str(text)
        return [piece.id for word, _ in words for piece in backend.model.tokenize(word)]

    text = tokenizer.decode([token_id])
    pieces = split(text)
    if token_id in pieces:
        pieces = [piece for character in text for piece in split(character)]
    return [piece for piece in pieces if piece != token_id]


# A token without trained pieces of its own starts at the mean of the trained rows plus this
# share of their per-coordinate standard deviation times a normal draw seeded by its id: the
# mean alone would give every such token one row (twins again: the model could neither read
# them apart nor write one rather than another, and `untrained_rows` would flag them still),
# while a tenth of the spread keeps each one near the typical row, distinct even in bf16.
PIECELESS_OFFSET_SCALE = 0.1


def pieceless_offset(token_id: int, spread: torch.Tensor) -> torch.Tensor:
    """The deterministic offset of a token without trained pieces from the trained rows' mean:
    a standard normal vector drawn from a CPU generator seeded by `token_id` (the same on every
    call and machine), times `PIECELESS_OFFSET_SCALE` times `spread` [d], the trained rows'
    per-coordinate standard deviation."""
    generator = torch.Generator().manual_seed(int(token_id))
    draw = torch.randn(spread.shape, generator=generator, dtype=torch.float32)
    return PIECELESS_OFFSET_SCALE * spread.float() * draw.to(spread.device)


def own_rows(weight: torch.Tensor, pieces: dict[int, list[int]]) -> dict[int, torch.Tensor]:
    """Per token of `pieces` (token id -> its pieces' ids), a float32 row of `weight` [V, d] of
    its own: the mean of its pieces' rows that were trained, or, for a token without such
    pieces (a single character), the mean of every trained row plus its `pieceless_offset`, so
    that no two tokens start as one row. Rows never trained (`untrained_rows`, and the tokens
    being initialized) are left out of the means and the spread: a dozen copies of one unused
    vector would pull the mean towards it."""
    from mrtpo.models import untrained_rows

    trained = ~untrained_rows(weight)
    trained[list(pieces)] = False
    rows = {}
    everything: tuple[torch.Tensor, torch.Tensor] | None = None  # (mean, std), computed once
    for token_id, ids in pieces.items():
        own = [piece for piece in ids if bool(trained[piece])]
        if own:
            rows[token_id] = weight[own].float().mean(dim=0)
            continue
        if everything is None:
            spread, mean = torch.std_mean(weight[trained].float(), dim=0)
            everything = mean, spread
        mean, spread = everything
        rows[token_id] = mean + pieceless_offset(token_id, spread)
    return rows


@torch.no_grad()
def initialize_untrained_rows(
    model: Any, tokenizer: Any, dataset: Any, token_ids: list[int], method: str = "fit"
) -> dict[int, tuple[float, float]]:
    """Give the untrained `token_ids` usable embedding rows before the cold start; returns, per
    token, its mean log-probability where the references write it, before and after.

    Each token starts from rows of its own (`own_rows`): the mean of the trained rows of the
    pieces its text splits into without it (`token_pieces`), so that `<tool_call>` and
    `</tool_call>`, initialized together, stay two different tokens to read and to write. Both
    methods set the input row so. The output row:
    - "mean": that own row too. The token then gets about its pieces' average logit: still
      far from its reference positions' top choice.
    - "fit": the ridge least-squares row closest to its own row whose logit, over every
      position of the prompts and references (teacher-forced, final hidden states h), is the
      best other token's logit where the next token is this one and the own row's logit
      elsewhere, the two kinds of position weighted equally. Adam moves a row about lr per
      coordinate a step, so a few steps at lr 1e-5 cannot teach a 24-nat gap; this closes it
      from the data in one solve, and fine-tuning goes on from there.
    Rows are float32 math; an untied output matrix gets its own row, a tied one follows the
    input row ("fit" then fits nothing and says so in the figures it returns).
    """
    from mrtpo.generation import render_prompt_ids

    if method not in ("fit", "mean"):
        raise ValueError(f"method must be 'fit' or 'mean', got {method!r}")
    ids = sorted(set(token_ids))
    inputs = model.get_input_embeddings().weight
    outputs = model.get_output_embeddings().weight
    tied = outputs.data_ptr() == inputs.data_ptr()
    pieces = {token_id: token_pieces(tokenizer, token_id) for token_id in ids}
    own_inputs = own_rows(inputs, pieces)
    own_outputs = own_rows(outputs, pieces) if not tied else own_inputs
    # The model's head rounds its logits to its dtype (bf16 keeps 8 bits, float32 24), and a
    # product's rounding scales with the typical logit: both relative, never a bias's fixed 1.
    tolerance = max(1e-3, 4 * torch.finfo(outputs.dtype).eps)
    sequences = []
    for row in dataset:
        prompt = render_prompt_ids(tokenizer, [row["prompt"]])[0]
        completion = tokenizer(row["completion"][0]["content"], add_special_tokens=False)
        sequences.append((prompt, completion["input_ids"]))

    def reference_positions() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """At every position of the prompts and references (teacher-forced): the final hidden
        state, the next token, each id's log-probability and the best other token's logit
        (not the whole logits: 151,936 floats a position would not fit)."""
        states, targets, log_ps, best_others = [], [], [], []
        for prompt, completion in sequences:
            full = torch.tensor([prompt + completion], device=inputs.device)
            out = model(full, output_hidden_states=True)
            logits = out.logits[0, :-1].float()
            states.append(out.hidden_states[-1][0, :-1].float())
            if not states[1:] and method == "fit" and not tied:
                # The fit solves for logits = final hidden state . row: no bias, no soft cap.
                head = states[0][:8] @ outputs.float().T
                scale = float(logits[:8].abs().mean())
                if not torch.allclose(head, logits[:8], atol=tolerance * scale, rtol=tolerance):
                    raise ValueError(
                        "untrained_tokens='fit' needs logits = last hidden state x output "
                        "matrix, which this model's head does not compute; use 'mean'"
                    )
            targets.append(full[0, 1:])
            log_ps.append(torch.log_softmax(logits, dim=-1)[:, ids])
            logits[:, ids] = -torch.inf
            best_others.append(logits.max(dim=-1).values)
        return torch.cat(states), torch.cat(targets), torch.cat(log_ps), torch.cat(best_others)

    def mean_log_p(targets: torch.Tensor, log_ps: torch.Tensor) -> dict[int, float]:
        return {t: float(log_ps[targets == t, i].mean()) for i, t in enumerate(ids)}

    was_training = model.training
    model.eval()
    states, targets, log_ps, best_others = reference_positions()
    before = mean_log_p(targets, log_ps)
    for token_id in ids:
        inputs[token_id] = own_inputs[token_id].to(inputs.dtype)
    if not tied:
        for token_id in ids:
            row = own_outputs[token_id]
            positive = targets == token_id
            if method == "fit" and positive.any():
                goal = torch.where(positive, best_others, states @ own_outputs[token_id])
                weight = torch.where(positive, 0.5 / positive.sum(), 0.5 / (~positive).sum())
                # argmin_w sum_i weight_i (h_i.w - goal_i)^2 + ridge |w - own row|^2
                gram = states.T @ (weight[:, None] * states)
                ridge = 1e-3 * torch.trace(gram) / gram.shape[0]
                system = gram + ridge * torch.eye(gram.shape[0], device=gram.device)
                row = torch.linalg.solve(system, states.T @ (weight * goal) + ridge * row)
            outputs[token_id] = row.to(outputs.dtype)
    _, targets, log_ps, _ = reference_positions()
    model.train(was_training)
    after = mean_log_p(targets, log_ps)
    return {token_id: (before[token_id], after[token_id]) for token_id in ids}


def run_sft(trainer: Any, task: str) -> Path:
    """Train `trainer` (from `build_sft_trainer` on `task`), save the model and tokenizer into
    its output_dir and print one line; returns that folder."""
    started = time.perf_counter()
    result = trainer.train()
    output = Path(trainer.args.output_dir)
    trainer.save_model(str(output))
    trainer.processing_class.save_pretrained(str(output))
    seconds = time.perf_counter() - started
    print(
        f"sft: {trainer.state.global_step} steps on {len(trainer.train_dataset)} {task} "
        f"demonstrations, loss {result.training_loss:.4f}, {seconds:.0f} s -> {output}"
    )
    return output
