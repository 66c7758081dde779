"""Benchmark: the training forward + backward with each group's prompt run once, against TRL's
per-row forward, side by side in one process.

SmolLM2-135M's architecture (Llama: hidden 576, 30 layers, 9 heads, 3 key/value heads,
intermediate 1536, vocabulary 49,152, tied embeddings) with seeded random weights, built here
(nothing is downloaded), fp32, in train mode, with TRL's fused LM head (what GRPOTrainer
installs) and, by default, TRL's gradient checkpointing (non-reentrant). Tool-task shapes:
4 groups x 4 completions, prompts of about 390 tokens (each group its own length, left-padded
to the longest as TRL pads), completions of about 53 tokens (right-padded to the longest).
One call: per-token log-probs of the completions, then the backward of
sum(logps * fixed random weights).

- per-row: TRL's own `GRPOTrainer._get_per_token_logps_and_entropies` on the 16 rows;
- shared: `mrtpo.shared_prompt.shared_prompt_logps` (the 4 prompts run once each).

Times: the two take turns, `--repeats` times (after `--warmup` untimed calls each); medians;
one torch thread by default (on a shared CPU, one thread keeps the ratio steady). Memory: each path runs
alone in a fresh subprocess that builds the same model and inputs, resets the resident-set
high-water mark (`resident_memory.py`: checked, an error where the kernel keeps the old
peak), makes one call and reads `VmHWM`: the call's peak
resident memory above its start (the gradients included) (CPU tensors are malloc'd memory, so
tracemalloc would see none of it). The script also checks that both paths give the same
log-probs.

    .venv/bin/python benchmarks/shared_prompt_forward.py              # tool-task shapes
    .venv/bin/python benchmarks/shared_prompt_forward.py --quick      # 4 layers, 1 repeat
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

import resident_memory
import torch

PATHS = ("per-row", "shared")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--completions", type=int, default=4, help="rows per group (G)")
    parser.add_argument("--prompt-length", type=int, default=390, help="mean prompt length")
    parser.add_argument("--completion-length", type=int, default=53, help="mean completion")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per path")
    parser.add_argument("--warmup", type=int, default=0, help="untimed calls per path first")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--no-checkpointing", action="store_true", help="without gradient checkpointing"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--quick", action="store_true", help="4 layers, 1 repeat")
    parser.add_argument("--memory-child", choices=PATHS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.repeats = 4, 1
    return args


def build(args: argparse.Namespace) -> SimpleNamespace:
    """The model (fused head, shared-prompt attention installed) and one micro-batch."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from mrtpo.shared_prompt import install_shared_prompt_attention

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=args.layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        pad_token_id=2,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config)
    add_fused_lm_head(model, temperature=1.0, outputs=("log_probs", "entropy"))
    install_shared_prompt_attention(model)
    model.train()
    if not args.no_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    generator = torch.Generator().manual_seed(1)
    rows = args.groups * args.completions
    spread = max(1, args.prompt_length // 20)
    prompt_lengths = torch.randint(
        args.prompt_length - spread,
        args.prompt_length + spread + 1,
        (args.groups,),
        generator=generator,
    )
    completion_lengths = torch.randint(
        args.completion_length // 2,
        args.completion_length * 3 // 2 + 1,
        (rows,),
        generator=generator,
    )
    width, columns = int(prompt_lengths.max()), int(completion_lengths.max())
    prompt_ids = torch.full((rows, width), config.pad_token_id)
    prompt_mask = torch.zeros(rows, width, dtype=torch.long)
    completion_ids = torch.full((rows, columns), config.pad_token_id)
    completion_mask = torch.zeros(rows, columns, dtype=torch.long)
    for group, length in enumerate(prompt_lengths.tolist()):
        prompt = torch.randint(3, config.vocab_size, (length,), generator=generator)
        for row in range(group * args.completions, (group + 1) * args.completions):
            prompt_ids[row, width - length :], prompt_mask[row, width - length :] = prompt, 1
    for row, length in enumerate(completion_lengths.tolist()):
        completion_ids[row, :length] = torch.randint(
            3, config.vocab_size, (length,), generator=generator
        )
        completion_mask[row, :length] = 1
    return SimpleNamespace(
        model=model,
        batch=(prompt_ids, prompt_mask, completion_ids, completion_mask),
        weights=torch.randn(rows, columns, generator=generator),
        prompt_lengths=prompt_lengths.tolist(),
        completion_lengths=completion_lengths.tolist(),
    )


def per_row_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """TRL's per-row forward itself (its profiling wrapper removed; no accelerator needed)."""
    from trl import GRPOTrainer

    trainer = SimpleNamespace(accelerator=SimpleNamespace(autocast=contextlib.nullcontext))
    logps, _, _ = GRPOTrainer._get_per_token_logps_and_entropies.__wrapped__(
        trainer,
        model,
        torch.cat([prompt_ids, completion_ids], dim=1),
        torch.cat([prompt_mask, completion_mask], dim=1),
        completion_ids.size(1),
        compute_entropy=True,
    )
    return logps


def shared_logps(model, *batch):
    from mrtpo.shared_prompt import shared_prompt_logps

    result = shared_prompt_logps(model, *batch, compute_entropy=True)
    if result.fallback is not None:
        raise RuntimeError(f"the shared path fell back: {result.fallback}")
    return result.logps


LOGPS = {"per-row": per_row_logps, "shared": shared_logps}


def call(setup: SimpleNamespace, path: str) -> torch.Tensor:
    """One forward + backward; returns the log-probs (detached)."""
    setup.model.zero_grad(set_to_none=True)
    logps = LOGPS[path](setup.model, *setup.batch)
    (logps * setup.weights).sum().backward()
    return logps.detach()


def memory_child(args: argparse.Namespace) -> None:
    """In a fresh process: the peak resident memory (MiB) of one call above its start."""
    import gc

    setup = build(args)
    gc.collect()
    peak_mib = resident_memory.peak_above_start_mib(lambda: call(setup, args.memory_child))
    print(json.dumps({"peak_mib": peak_mib}))


def peak_memory(path: str, argv: list[str]) -> float:
    command = [sys.executable, __file__, *argv, "--memory-child", path]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"memory measurement of {path} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])["peak_mib"]


def main() -> None:
    argv = sys.argv[1:]
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.memory_child:
        memory_child(args)
        return
    setup = build(args)
    prompt_ids, _, completion_ids, completion_mask = setup.batch
    rows, tokens = prompt_ids.size(0), prompt_ids.size(1) + completion_ids.size(1)
    shared_tokens = sum(setup.prompt_lengths) - args.groups + rows * (completion_ids.size(1) + 1)
    print(
        f"{args.groups} groups x {args.completions}, {args.layers} layers, prompts "
        f"{setup.prompt_lengths} (padded to {prompt_ids.size(1)}), completions mean "
        f"{statistics.mean(setup.completion_lengths):.1f} (padded to {completion_ids.size(1)}), "
        f"checkpointing {'off' if args.no_checkpointing else 'on'}, {args.threads} thread(s)"
    )
    print(f"positions run: per-row {rows * tokens}, shared {shared_tokens}")
    for _ in range(args.warmup):
        for path in PATHS:
            call(setup, path)
    times: dict[str, list[float]] = {path: [] for path in PATHS}
    outputs = {}
    for repeat in range(args.repeats):
        for path in PATHS if repeat % 2 == 0 else PATHS[::-1]:
            started = time.perf_counter()
            outputs[path] = call(setup, path)
            times[path].append(time.perf_counter() - started)
            print(f"  {path}: {times[path][-1]:.2f} s", flush=True)
    error = (outputs["shared"] - outputs["per-row"]).abs().max().item()
    print(f"max |shared - per-row| log-prob: {error:.2e}")
    medians = {path: statistics.median(values) for path, values in times.items()}
    memory = {} if args.no_memory else {path: peak_memory(path, argv) for path in PATHS}
    print()
    print("| path | median forward + backward (s) | positions run | peak memory (MiB) |")
    print("|---|---|---|---|")
    for path, positions in (("per-row", rows * tokens), ("shared", shared_tokens)):
        peak = f"{memory[path]:.0f}" if memory else "-"
        print(f"| {path} | {medians[path]:.2f} | {positions} | {peak} |")
    print()
    print(f"shared / per-row time: {medians['shared'] / medians['per-row']:.3f}x (target <= 0.45x)")
    if memory:
        print(f"shared / per-row peak memory: {memory['shared'] / memory['per-row']:.3f}x")


if __name__ == "__main__":
    main()
