"""`mrtpo eval`: generation on a task's split, each verifier's mean and the headline.

Prompts are rendered exactly as `mrtpo train` renders them: TRL's `GRPOTrainer` tokenizes the
`prompt` messages with `tokenizer.apply_chat_template(..., add_generation_prompt=True)` and the
same `chat_template_kwargs`, and decodes completions with `skip_special_tokens=True`. We do the
same, generate in left-padded batches (greedily by default; `--temperature T --num_samples N`
samples N completions per prompt as training does, seeded), and score with the task's verifiers.

Writes `eval.json` (per-example prompt, completion and verdicts, plus the summary) into
`output_dir` and prints a table.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mrtpo.models import DEFAULT_MODEL
from mrtpo.verifiers import Verdict


@dataclass
class EvalArguments:
    model_name_or_path: str = field(
        default=DEFAULT_MODEL,
        metadata={"help": "The embedded model's name, a local model folder, or a hub id."},
    )
    task: str = field(
        default="tool_calling", metadata={"help": "sql, tool_calling or instructions."}
    )
    data: str | None = field(
        default=None,
        metadata={
            "help": "The user's benchmark files (Spider/BIRD/BFCL/IFEval) for the task's loader."
        },
    )
    split: str = field(default="test", metadata={"help": "Which split to evaluate."})
    max_examples: int | None = field(
        default=None, metadata={"help": "Evaluate the first N examples only."}
    )
    output_dir: str | None = field(
        default=None, metadata={"help": "Where eval.json goes (default outputs/eval-<task>)."}
    )
    batch_size: int = field(default=8, metadata={"help": "Prompts generated at once."})
    max_new_tokens: int = field(
        default=256, metadata={"help": "Generation length limit (train's max_completion_length)."}
    )
    chat_template_kwargs: str | None = field(
        default=None,
        metadata={"help": "JSON dict passed to the chat template, as in `mrtpo train`."},
    )
    temperature: float = field(
        default=0.0,
        metadata={
            "help": "0: greedy. Above 0: sample (no top-k/top-p cut, as `mrtpo train` samples)."
        },
    )
    num_samples: int = field(
        default=1, metadata={"help": "Completions per prompt (more than 1 needs a temperature)."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the sampling."})


def render_prompt_ids(
    tokenizer: Any, prompts: Sequence[Any], chat_template_kwargs: dict | None = None
) -> list[list[int]]:
    """Token ids of each prompt, exactly as TRL's GRPOTrainer builds them before generation.

    Chat-message prompts go through the chat template with the generation prompt; plain-text
    prompts are tokenized as they are (TRL's `_tokenize_prompts`).
    """
    if not prompts:
        return []
    if isinstance(prompts[0], str):
        return [list(ids) for ids in tokenizer(text=list(prompts))["input_ids"]]
    tokenized = tokenizer.apply_chat_template(
        conversation=list(prompts),
        tools=None,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        **(chat_template_kwargs or {}),
    )
    return [list(ids) for ids in tokenized["input_ids"]]


@torch.no_grad()
def generate(
    model: Any,
    tokenizer: Any,
    prompt_ids: Sequence[Sequence[int]],
    max_new_tokens: int,
    batch_size: int = 8,
    temperature: float = 0.0,
    num_samples: int = 1,
    seed: int = 0,
) -> list[list[int]]:
    """Completions (token ids, cut after the first eos) for left-padded batches of prompts.

    ``temperature`` 0 decodes greedily; above 0 it samples from the whole distribution (no
    top-k/top-p cut, TRL's GRPO defaults), ``num_samples`` per prompt, seeded by ``seed``.
    Returns ``len(prompt_ids) * num_samples`` completions, each prompt's samples together.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if num_samples > 1 and temperature == 0:
        raise ValueError(
            f"num_samples is {num_samples} but temperature is 0: greedy decoding gives one "
            "completion per prompt; set a temperature above 0 to sample several"
        )
    eos_ids = model.generation_config.eos_token_id
    eos_ids = {eos_ids} if isinstance(eos_ids, int) else set(eos_ids or [tokenizer.eos_token_id])
    pad_id = tokenizer.pad_token_id
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
        if temperature > 0
        else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    )
    if temperature > 0:
        torch.manual_seed(seed)
    model.eval()
    rows = [ids for ids in prompt_ids for _ in range(num_samples)]
    completions: list[list[int]] = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        width = max(len(ids) for ids in batch)
        input_ids = torch.tensor([[pad_id] * (width - len(ids)) + list(ids) for ids in batch])
        attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])
        output = model.generate(
            input_ids=input_ids.to(model.device),
            attention_mask=attention_mask.to(model.device),
            max_new_tokens=max_new_tokens,
            pad_token_id=pad_id,
            **sampling,
        )
        for row in output[:, width:].tolist():
            cut = next((i + 1 for i, token in enumerate(row) if token in eos_ids), len(row))
            completions.append(row[:cut])
    return completions


def decoding(temperature: float, num_samples: int) -> str:
    """How completions were decoded, in words (for reports)."""
    if temperature == 0:
        return "greedy"
    return f"{num_samples} sample{'s' if num_samples > 1 else ''} per prompt at temperature {temperature:g}"


def mean_applicable(scores: Sequence[float | None]) -> float | None:
    """Mean over rows the verifier applies to (None is skipped); None when none applies."""
    applicable = [s for s in scores if s is not None]
    return sum(applicable) / len(applicable) if applicable else None


def evaluate(
    model: Any,
    tokenizer: Any,
    task: Any,
    dataset: Any,
    batch_size: int = 8,
    max_new_tokens: int = 256,
    chat_template_kwargs: dict | None = None,
    temperature: float = 0.0,
    num_samples: int = 1,
    seed: int = 0,
) -> dict[str, Any]:
    """Generate on every row of `dataset` (``num_samples`` per row) and score:
    {"verifiers": {name: mean}, "headline": {...}, "examples": [...]}."""
    dataset_prompts = list(dataset["prompt"])
    prompt_ids = render_prompt_ids(tokenizer, dataset_prompts, chat_template_kwargs)
    completion_ids = generate(
        model,
        tokenizer,
        prompt_ids,
        max_new_tokens,
        batch_size,
        temperature=temperature,
        num_samples=num_samples,
        seed=seed,
    )
    # Each row repeated for its samples (verifiers and headlines see every sample).
    prompts = [prompt for prompt in dataset_prompts for _ in range(num_samples)]
    columns = {
        name: [value for value in dataset[name] for _ in range(num_samples)]
        for name in dataset.column_names
        if name != "prompt"
    }
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    # TRL hands conversational prompts' completions to reward functions as messages.
    conversational = not isinstance(prompts[0], str)
    completions = (
        [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
    )

    verifiers = task.verifiers()
    verdicts_by_verifier = [v.verify_batch(prompts, completions, **columns) for v in verifiers]
    verdicts_by_example: list[list[Verdict]] = [
        list(row) for row in zip(*verdicts_by_verifier, strict=True)
    ]

    summary: dict[str, float | None] = {}
    for verifier, verdicts in zip(verifiers, verdicts_by_verifier, strict=True):
        summary[verifier.name] = mean_applicable([v.score for v in verdicts])
    headline = task.headline(verdicts_by_example)
    # Instruction following reports IFEval's/IFBench's loose mode and per-id accuracy too.
    following = getattr(task, "following_report", None)
    per_instruction = {}
    if following is not None:
        report = following(texts, columns)
        headline = {**headline, **report["headline"]}
        per_instruction = {"per_instruction": report["per_instruction"]}
    examples = [
        {
            "prompt": prompt,
            "completion": text,
            "completion_tokens": len(ids),
            "verdicts": {
                verifier.name: {"score": verdict.score, "info": verdict.info}
                for verifier, verdict in zip(verifiers, row, strict=True)
            },
        }
        for prompt, text, ids, row in zip(
            prompts, texts, completion_ids, verdicts_by_example, strict=True
        )
    ]
    return {"verifiers": summary, "headline": headline, **per_instruction, "examples": examples}


def summary_table(title: str | None, columns: dict[str, dict[str, Any]]) -> Any:
    """A rich table: one row per metric, one column per result (e.g. before / after)."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    for name in columns:
        table.add_column(name, justify="right")
    metrics: list[str] = []
    for result in columns.values():
        for key in [*result["verifiers"], *result["headline"]]:
            if key not in metrics:
                metrics.append(key)
    for metric in metrics:
        cells = []
        for result in columns.values():
            value = result["verifiers"].get(metric, result["headline"].get(metric))
            cells.append("-" if value is None or math.isnan(value) else f"{value:.3f}")
        table.add_row(metric, *cells)
    return table


def parse_args(argv: list[str]) -> EvalArguments:
    from trl import TrlParser

    (args,) = TrlParser(EvalArguments, prog="mrtpo eval").parse_args_and_config(argv)
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from rich.console import Console

    from mrtpo import tasks
    from mrtpo.models import load_model

    task = tasks.get(args.task)
    if args.data is not None and not Path(args.data).exists():
        raise FileNotFoundError(f"data path {args.data!r} does not exist")
    if args.max_examples is not None and args.max_examples < 1:
        raise ValueError(f"max_examples must be >= 1, got {args.max_examples}")
    chat_template_kwargs = (
        json.loads(args.chat_template_kwargs) if args.chat_template_kwargs else None
    )
    dataset = task.load(args.split, path=args.data)
    if args.max_examples is not None:
        dataset = dataset.select(range(min(args.max_examples, len(dataset))))
    if len(dataset) == 0:
        raise ValueError(f"split {args.split!r} of task {args.task!r} has no examples")
    model, tokenizer = load_model(args.model_name_or_path)

    started = time.perf_counter()
    result = evaluate(
        model,
        tokenizer,
        task,
        dataset,
        args.batch_size,
        args.max_new_tokens,
        chat_template_kwargs,
        temperature=args.temperature,
        num_samples=args.num_samples,
        seed=args.seed,
    )
    seconds = time.perf_counter() - started

    output_dir = Path(args.output_dir or f"outputs/eval-{args.task}")
    output_dir.mkdir(parents=True, exist_ok=True)
    report = {
        "model_name_or_path": args.model_name_or_path,
        "task": args.task,
        "split": args.split,
        "data": args.data,
        "num_examples": len(dataset),
        "max_new_tokens": args.max_new_tokens,
        "decoding": decoding(args.temperature, args.num_samples),
        "seconds": round(seconds, 1),
        **result,
    }
    (output_dir / "eval.json").write_text(json.dumps(report, indent=2, default=str))
    print(
        f"{args.model_name_or_path} on {args.task} {args.split} ({len(dataset)} examples, "
        f"{decoding(args.temperature, args.num_samples)})"
    )
    Console().print(summary_table(None, {"mean": result}))
    print(f"wrote {output_dir / 'eval.json'} in {seconds:.0f} s")
    return 0
