"""The prepared GPU check: the shared-prompt path against TRL's per-row path, then GDPO and
MRTPO bf16 training steps side by side, on one GPU.

What it measures, on a random-init model of realistic size (a Qwen2-style ~1.5B config built
in code; no weights travel) with SmolLM2's tokenizer (49,152 tokens; `tokenizer.json` ships
gzipped beside this script, 0.6 MB). Part `shared_prompt` (`mrtpo.shared_prompt`, issue 27):
- exactness on a packed micro-batch (3 groups x 4 completions, prompts of 390, 254 and 118
  tokens left-padded, completions of 26 to 53): per-token log-probs against TRL's
  `_get_per_token_logps_and_entropies` on the rows, and parameter gradients (relative error),
  in fp32 (no TF32; passes at 1e-4 and 1e-3) and under bf16 autocast (passes when the shared
  path is no further from the fp32 numbers than 1.5x the per-row path's own distance; the
  per-row path against itself with more left padding is reported for scale);
- forward + backward seconds (bf16 autocast, gradient checkpointing: as the trainer runs) of
  both paths at the tool task's shape (4 x 4, prompts of 351 to 390 tokens, completions up to
  53) and a long one (8 x 8, up to 1,500 and 256), medians of 5 and 3 passes after a warm-up,
  peak memory (in all and above the model and gradients), and the shared / per-row ratios;
- which of torch's SDPA kernels (flash, mem-efficient, cuDNN, math; the flags in
  `torch.backends.cuda` are reported too) each attention runs, from torch's profiler: the
  per-row rows, and the shared attention's two halves (the prompt part, causal without a mask;
  the segments, with a boolean mask), with a note for each that falls back to the math kernel.
Part `training`:
- each run's optimizer-step wall time (generation, verification, replay, loss, backward,
  optimizer; the first step is a warm-up and not counted): GDPO with the shared prompt (the
  default) and without it (`share_prompt=False`), then MRTPO; the MRTPO / GDPO ratio and the
  shared-prompt on / off ratio (the training prompts are short, about 80 tokens: the kernel
  timings above are the long-prompt case);
- MRTPO's replay seconds per step and the share of rows replayed;
- each run's peak GPU memory (allocated);
- the replay's distances under bf16 autocast (as it trains: fp32 weights, `bf16=True`) against
  float32, on the last training batch, and what the difference does to the weights.
The three verifiers are coins (a hash of the completion) with verifier information of a
realistic length, so almost every group has varying rewards and almost every row is replayed:
the replay's full cost. Sized to finish in under 8 minutes on one H200 (about 5 measured
minutes plus start-up: the shared-prompt part about 1, each training run 1 to 2); `--parts`
runs some of them. On the GPU a part that fails is reported as its error and the others run.

Run it through `scripts/gpu_check.sh` (it installs the wheels in `.whl/` first), or on a CPU
with a tiny model to check the script itself:

    bash scripts/gpu_check.sh                 # the GPU check
    .venv/bin/python scripts/gpu_check.py --smoke

The GPU machine has PyTorch, transformers, accelerate and peft, nothing else can be installed
there from a registry, and at most 64 MiB travel with the code. TRL (and anything else missing)
comes as wheels in `.whl/`, filled on a machine with registry access, for the GPU machine's
Python (3.12):

    pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --platform manylinux2014_x86_64 -d .whl trl==1.16.0

(add `datasets dill multiprocess xxhash pyarrow pandas matplotlib ...` if they fit: pyarrow
alone is about 45 MB; add `transformers huggingface_hub` if the machine's transformers is older
than 5, which the check refuses). TRL and mrtpo import `datasets`, `pyarrow`, `pandas` and `matplotlib`
at module level but this check never uses them (its data is a list of rows, it writes no
completion tables and no plots): any of them that is still missing is replaced by an
import-time stand-in (``install_stand_ins``), and the check says which.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
import types
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
TOKENIZER_FILE = HERE / "gpu_check_tokenizer.json.gz"  # SmolLM2-135M-Instruct's, from its GGUF
STAND_IN_CANDIDATES = ("datasets", "pyarrow", "pandas", "matplotlib")
PARTS = ("shared_prompt", "training")

# A Qwen2.5-1.5B-shaped model with SmolLM2's vocabulary (tied embeddings): about 1.4B parameters.
REALISTIC = dict(
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)

INFORMATION = (
    "Format rule: the answer starts with a one-line summary, then at most five bullet points "
    "of the form '- <fact>: <evidence>', and ends with a line 'Confidence: <low|medium|high>'.",
    "Constraint: the response must not use the words 'very', 'really' or 'basically', must "
    "stay under 200 words, and must mention the city named in the question exactly once.",
    "Reference answer: Lyon sits at the confluence of the Rhone and the Saone; its old town "
    "is a UNESCO site, and it has been a centre of silk weaving since the sixteenth century.",
)
CITIES = ("Lyon", "Porto", "Krakow", "Ghent", "Bologna", "Seville", "Tartu", "Bergen")


# ---------------------------------------------------------------------- environment


class _StandIn(types.ModuleType):
    """A module whose every public attribute is a placeholder class that refuses to be built:
    enough for `from x import A`, `isinstance(obj, A)` and `A | B` annotations."""

    def __getattr__(self, attribute: str) -> type:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        package = self.__name__

        def refuse(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError(
                f"{package}.{attribute} is an import-time stand-in in the GPU check; put "
                f"{package.split('.')[0]}'s wheel in .whl/ to use it"
            )

        placeholder = type(attribute, (), {"__init__": refuse})
        setattr(self, attribute, placeholder)
        return placeholder


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the stand-in packages and any of their submodules (`pyarrow.compute`, ...)."""

    def __init__(self, packages: set[str]) -> None:
        self.packages = packages

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".")[0] not in self.packages:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StandIn(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install_stand_ins(forced: set[str]) -> list[str]:
    """Stand-ins for the candidates that cannot be imported (and for ``forced`` ones, to test
    this path where they are installed). Call before TRL or mrtpo's trainer is imported; no
    `__file__` or version, so transformers' availability checks read them as absent."""
    missing = set(forced)
    for name in STAND_IN_CANDIDATES:
        if name in missing:
            continue
        try:
            importlib.import_module(name)
        except ImportError:
            missing.add(name)
    if missing:
        sys.meta_path.insert(0, _StandInFinder(missing))
    return sorted(missing)


def versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "accelerate", "peft", "trl", "tokenizers"):
        try:
            found[name] = importlib.import_module(name).__version__
        except ImportError:
            found[name] = "missing"
    return found


# ---------------------------------------------------------------------- model and data


def load_tokenizer(smoke: bool) -> Any:
    """SmolLM2's tokenizer from the gzipped `tokenizer.json` (the tiny one under --smoke)."""
    if smoke:
        from mrtpo.testing import tiny_tokenizer

        return tiny_tokenizer()
    from transformers import PreTrainedTokenizerFast

    from mrtpo.models import SMOLLM2_CHAT_TEMPLATE

    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "tokenizer.json"
        path.write_bytes(gzip.decompress(TOKENIZER_FILE.read_bytes()))
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_file=str(path),
            bos_token="<|im_start|>",
            eos_token="<|im_end|>",
            pad_token="<|im_end|>",
            unk_token="<|endoftext|>",
        )
    tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    return tokenizer


def export_tokenizer() -> None:
    """Write SmolLM2's `tokenizer.json`, gzipped, from the embedded GGUF (run where mrtpo is
    installed; the GPU machine has no GGUF)."""
    from transformers import AutoTokenizer

    from mrtpo.models import embedded_gguf_path

    gguf = embedded_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer.save_pretrained(scratch)
        data = (Path(scratch) / "tokenizer.json").read_bytes()
    TOKENIZER_FILE.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    print(f"wrote {TOKENIZER_FILE} ({TOKENIZER_FILE.stat().st_size / 2**20:.2f} MiB)")


def build_model(tokenizer: Any, smoke: bool, device: torch.device) -> torch.nn.Module:
    """A random-init causal LM, the same weights for every call (seeded), float32 on device."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mrtpo.testing import tiny_model

    torch.manual_seed(0)
    if smoke:
        return tiny_model(len(tokenizer), seed=0).to(device)
    config = Qwen2Config(vocab_size=len(tokenizer), **REALISTIC)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def coin_verifiers() -> list[Any]:
    """Three verifiers scoring 0 or 1 by a hash of the completion, each with information."""
    from mrtpo.verifiers import Verdict, Verifier

    class Coin(Verifier):
        def __init__(self, name: str, info: str) -> None:
            self.name, self.info = name, info

        def verify(self, completion: str, example: Any) -> Verdict:
            score = float(zlib.crc32(f"{self.name}:{completion}".encode()) % 2)
            return Verdict(score, self.info, ((0, len(completion)),))

    return [Coin(f"coin_{k}", info) for k, info in enumerate(INFORMATION)]


def prompt_dataset(count: int) -> Any:
    """`count` chat prompts as a `datasets.Dataset` (TRL checks the type), or, where `datasets`
    is a stand-in, as a list of rows typed as one."""
    import datasets

    rows = prompt_rows(count)
    if not isinstance(datasets, _StandIn):
        return datasets.Dataset.from_list(rows)

    class Rows(datasets.Dataset):
        cache_files: list[Any] = []  # in memory (TRL's telemetry reads it)

        def __init__(self) -> None:
            self.rows = rows

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, index: int) -> dict[str, Any]:
            return self.rows[index]

    return Rows()


def prompt_rows(count: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(count):
        city = CITIES[i % len(CITIES)]
        question = (
            f"Question {i}: describe {city} for a traveller with one free day. Cover its history, "
            "what to see in the morning, where to eat at noon, and one thing locals do in the "
            "evening. Keep it practical and name the places."
        )
        rows.append({"prompt": [{"role": "user", "content": question}]})
    return rows


# ---------------------------------------------------------------------- runs


# (name, estimator, share_prompt), in the order they run; MRTPO last (its trainer is compared)
RUNS = (("gdpo", "gdpo", True), ("gdpo_per_row", "gdpo", False), ("mrtpo", "mrtpo", True))


def make_step_clock() -> Any:
    """A callback keeping each optimizer step's wall time (device synchronized)."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []

        def _now(self) -> float:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            return time.perf_counter()

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = self._now()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(self._now() - self.started)

    return StepClock()


def train(
    estimator: str, options: argparse.Namespace, output_dir: str, share_prompt: bool = True
) -> dict[str, Any]:
    """`options.warmup + options.steps` training steps of one estimator, with or without the
    shared prompt; its measurements, the trainer (for the distance comparison) under "trainer"."""
    from mrtpo.trainer import MRTPOConfig, MRTPOTrainer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = load_tokenizer(options.smoke)
    model = build_model(tokenizer, options.smoke, device)
    clock = make_step_clock()
    config = MRTPOConfig(
        output_dir=output_dir,
        advantage_estimator=estimator,
        mrtpo_beta=0.5,
        mrtpo_warmup_steps=0,  # the full beta from the first step: the replay runs every step
        per_device_train_batch_size=options.prompts * options.generations,
        num_generations=options.generations,
        max_completion_length=options.max_new_tokens,
        max_steps=options.warmup + options.steps,
        share_prompt=share_prompt,
        bf16=True,  # fp32 weights, bf16 autocast: the replay runs under it too
        use_cpu=device.type == "cpu",
        report_to=[],
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    trainer = MRTPOTrainer(
        model=model,
        reward_funcs=coin_verifiers(),
        args=config,
        train_dataset=prompt_dataset(options.prompts * (options.warmup + options.steps)),
        processing_class=tokenizer,
        callbacks=[clock],
    )
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trainer.train()
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    logs = [entry for entry in trainer.state.log_history if "step_time" in entry]
    timed = logs[options.warmup :]
    measured = clock.seconds[options.warmup :]
    result = {
        "share_prompt": trainer._shares_prompt,  # False where it fell back (the reason logged)
        "median_step_seconds": statistics.median(measured),
        "step_seconds": [round(value, 3) for value in clock.seconds],
        "trl_step_time": statistics.median(entry["step_time"] for entry in timed),
        "peak_gib": peak,
        "mean_completion_length": statistics.mean(
            entry["completions/mean_length"] for entry in timed
        ),
        "trainer": trainer,
    }
    if estimator == "mrtpo":
        result["median_replay_seconds"] = statistics.median(
            entry["mrtpo/replay_seconds"] for entry in timed
        )
        result["replayed_rows_share"] = statistics.mean(
            entry["mrtpo/replayed_rows_share"] for entry in timed
        )
    return result


def compare_precisions(trainer: Any) -> dict[str, float]:
    """The last batch replayed under bf16 autocast (as in training) and in float32."""
    from mrtpo import advantages
    from mrtpo.relevance import replay_distances

    scored = trainer._scored
    verdicts = scored.row_verdicts()
    inputs = (
        trainer.model,
        trainer.processing_class,
        scored.prompts,
        scored.completion_ids,
        [[verdict.info for verdict in row] for row in verdicts],
    )
    options = {k: v for k, v in trainer._replay_options().items() if k != "lm_head_fp32"}
    device_type = trainer.accelerator.device.type
    trainer.model.eval()
    started = time.perf_counter()
    with torch.autocast(device_type, dtype=torch.bfloat16):
        bf16, mask = replay_distances(*inputs, **options)
    bf16_seconds = time.perf_counter() - started
    started = time.perf_counter()
    fp32, _ = replay_distances(*inputs, **options)
    fp32_seconds = time.perf_counter() - started
    on = mask.bool().unsqueeze(1).expand_as(fp32)
    difference = (bf16 - fp32)[on].abs()
    pair = torch.stack([bf16[on], fp32[on]])
    weights_bf16 = advantages.token_weights(bf16, mask, 0.5)
    weights_fp32 = advantages.token_weights(fp32, mask, 0.5)
    weight_difference = (weights_bf16 - weights_fp32)[on].abs()
    return {
        "rows": len(scored.prompts),
        "fp32_mean_distance": fp32[on].mean().item(),
        "max_abs_difference": difference.max().item(),
        "mean_abs_difference": difference.mean().item(),
        "correlation": torch.corrcoef(pair)[0, 1].item(),
        "max_abs_weight_difference_beta_0.5": weight_difference.max().item(),
        "mean_abs_weight_difference_beta_0.5": weight_difference.mean().item(),
        "bf16_replay_seconds": bf16_seconds,
        "fp32_replay_seconds": fp32_seconds,
    }


# ---------------------------------------------------------------------- shared prompt

# prompt_ids, prompt_mask (B, P) left-padded; completion_ids, completion_mask (B, C) right-padded
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Shape:
    """A micro-batch of `groups` prompts x `generations` completions (TRL's padding: prompts
    left-padded to the longest, completions right-padded to the longest)."""

    name: str
    groups: int
    generations: int
    prompt_length: int  # the longest prompt; the others spread over `spread` below it
    completion_length: int  # the longest completion; the others drawn in [C / 2, C]
    spread: float = 0.1
    repeats: int = 5  # timed forward + backward passes (after one warm-up)


# Exactness: prompts far apart in length (lots of left padding). Timing: the tool task's shape
# (4 x 4, prompts ~390 tokens, completions ~53) and a long-context one.
CHECK_SHAPE = Shape("exactness", 3, 4, 390, 53, spread=0.7)
TIMED_SHAPES = (
    Shape("tool_task", 4, 4, 390, 53),
    Shape("large", 8, 8, 1500, 256, repeats=3),  # per-row: about 5 s a pass on an H200
)
SMOKE_CHECK_SHAPE = Shape("exactness", 3, 4, 20, 8, spread=0.7)
SMOKE_TIMED_SHAPES = (
    Shape("tool_task", 4, 4, 39, 6, repeats=2),
    Shape("large", 8, 8, 150, 26, repeats=2),
)
TEMPERATURE = 1.0  # GRPOConfig's default
FP32_LOGP_TOLERANCE = 1e-4
FP32_GRADIENT_TOLERANCE = 1e-3  # relative: 28 layers of fp32 sums in another order
BF16_NOISE_FACTOR = 1.5  # the shared path may be this much further from fp32 than per-row is
REPADDING = 8  # extra left-pad columns: the per-row path's own bf16 noise (positions shift)
KERNEL_MARK = "gpu_check_sdpa:"
# torch's SDPA kernel ops (`aten::_scaled_dot_product_<kernel>...`), by what they are
KERNELS = (
    ("flash_attention_for_cpu", "flash (cpu)"),
    ("flash", "flash"),
    ("efficient", "mem_efficient"),
    ("cudnn", "cudnn"),
    ("math", "math"),
    ("fused_attention_overrideable", "overrideable"),
)


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def grouped_batch(shape: Shape, vocab_size: int, device: torch.device, seed: int = 1) -> Batch:
    """(prompt_ids, prompt_mask, completion_ids, completion_mask) of random tokens in `shape`."""
    generator = torch.Generator().manual_seed(seed)
    rows = shape.groups * shape.generations
    step = int(shape.prompt_length * shape.spread) // max(shape.groups - 1, 1)
    prompt_lengths = [shape.prompt_length - step * group for group in range(shape.groups)]
    prompt_ids = torch.zeros(rows, shape.prompt_length, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompt_ids)
    completion_ids = torch.randint(
        3, vocab_size, (rows, shape.completion_length), generator=generator
    )
    lengths = torch.randint(
        max(shape.completion_length // 2, 1),
        shape.completion_length + 1,
        (rows,),
        generator=generator,
    )
    lengths[0] = shape.completion_length
    completion_mask = (torch.arange(shape.completion_length) < lengths[:, None]).long()
    completion_ids = completion_ids * completion_mask  # pad id 0 after the end
    for group, length in enumerate(prompt_lengths):
        prompt = torch.randint(3, vocab_size, (length,), generator=generator)
        group_rows = slice(group * shape.generations, (group + 1) * shape.generations)
        prompt_ids[group_rows, shape.prompt_length - length :] = prompt
        prompt_mask[group_rows, shape.prompt_length - length :] = 1
    return tuple(
        tensor.to(device) for tensor in (prompt_ids, prompt_mask, completion_ids, completion_mask)
    )


def per_row_logps(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """TRL's own per-row log-probs (B, C): `_get_per_token_logps_and_entropies` on the
    concatenated rows (its profiling wrapper removed; the caller's autocast applies)."""
    from trl import GRPOTrainer

    prompt_ids, prompt_mask, completion_ids, completion_mask = batch
    trainer = types.SimpleNamespace(
        accelerator=types.SimpleNamespace(autocast=contextlib.nullcontext)
    )
    logps, _, _ = GRPOTrainer._get_per_token_logps_and_entropies.__wrapped__(
        trainer,
        model,
        torch.cat([prompt_ids, completion_ids], dim=1),
        torch.cat([prompt_mask, completion_mask], dim=1),
        completion_ids.size(1),
    )
    return logps


def shared_logps(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """The trainer's shared-prompt log-probs (B, C): each group's prompt packed once."""
    from mrtpo.shared_prompt import shared_prompt_logps

    result = shared_prompt_logps(model, *batch)
    if result.fallback is not None:
        raise RuntimeError(f"the shared-prompt path fell back: {result.fallback}")
    return result.logps


PATHS = {"per_row": per_row_logps, "shared": shared_logps}


def precision(name: str, device: torch.device) -> Any:
    """bf16 as the trainer runs it (fp32 weights under bf16 autocast), or plain fp32."""
    if name == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def exact_fp32_matmuls() -> Any:
    """fp32 matmuls without TF32 (a comparison to 1e-4 needs full fp32), restored after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def shared_prompt_model(smoke: bool, device: torch.device) -> torch.nn.Module:
    """The check's model (the tiny Qwen2 under --smoke) as the trainer runs it: TRL's fused LM
    head, the shared-prompt attention installed, gradient checkpointing (GRPOConfig's default)."""
    from trl.trainer.utils import add_fused_lm_head

    from mrtpo.shared_prompt import install_shared_prompt_attention
    from mrtpo.testing import tiny_qwen2_model

    if smoke:
        model = tiny_qwen2_model(512, seed=0).to(device)
    else:
        model = build_model(load_tokenizer(smoke=False), smoke=False, device=device)
    add_fused_lm_head(model, temperature=TEMPERATURE, outputs=("log_probs", "entropy"))
    install_shared_prompt_attention(model)
    recompute = {"use_reentrant": False}  # as TRL and transformers 5 default
    if hasattr(model, "activation_checkpointing_enable"):  # its newer name (transformers 5.2x)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=recompute)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=recompute)
    model.train()
    return model


def logps_and_gradients(
    model: torch.nn.Module, path: str, batch: Batch, weights: torch.Tensor, dtype: str
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward (under `dtype`) and backward of sum(logps * weights): the log-probs (fp32)
    and a copy of every parameter gradient."""
    model.zero_grad(set_to_none=True)
    with precision(dtype, weights.device):
        logps = PATHS[path](model, batch)
    (logps * weights).sum().backward()
    gradients = {
        name: parameter.grad.detach().clone()
        for name, parameter in model.named_parameters()
        if parameter.grad is not None
    }
    model.zero_grad(set_to_none=True)
    return logps.detach().float(), gradients


def gradient_error(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> dict:
    """Relative error ||got - expected|| / ||expected||: over all parameters together, and the
    worst single parameter (those with a non-zero gradient)."""
    if got.keys() != expected.keys() or not expected:
        raise RuntimeError(
            f"gradients of different parameters: {sorted(got.keys() ^ expected.keys())}"
        )
    squared_difference = squared_norm = 0.0
    worst_name, worst = "", 0.0
    for name, gradient in expected.items():
        difference = torch.linalg.vector_norm((got[name] - gradient).float()).item()
        norm = torch.linalg.vector_norm(gradient.float()).item()
        squared_difference, squared_norm = (
            squared_difference + difference**2,
            squared_norm + norm**2,
        )
        if norm > 0 and difference / norm > worst:
            worst_name, worst = name, difference / norm
    return {
        "relative_error": (squared_difference / squared_norm) ** 0.5,
        "worst_parameter": worst_name,
        "worst_parameter_relative_error": worst,
    }


def differences(got: torch.Tensor, expected: torch.Tensor, scored: torch.Tensor) -> dict:
    difference = (got - expected)[scored].abs()
    return {"max_abs": difference.max().item(), "mean_abs": difference.mean().item()}


def compare_paths(model: torch.nn.Module, shape: Shape, vocab_size: int) -> dict[str, Any]:
    """Shared-prompt vs TRL's per-row log-probs and parameter gradients, in fp32 and in bf16.

    fp32 (no TF32): the two paths compute the same function, so they agree to fp32 rounding:
    log-probs within 1e-4, gradients to a relative 1e-3. bf16 (autocast, as in training): each
    path rounds its own way (the shared one in other shapes), so they cannot agree beyond bf16's
    resolution; the measure is each path's distance from the fp32 per-row numbers, and the
    shared path passes when it is no further than 1.5x the per-row path's own (max and mean
    log-prob error, gradient error). For scale, the per-row path against itself with 8 more
    left-pad columns (same numbers in exact arithmetic, positions shifted).
    """
    device = next(model.parameters()).device
    batch = grouped_batch(shape, vocab_size, device)
    scored = batch[3].bool()
    weights = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(2))
    weights = weights.to(device) / scored.sum()
    with exact_fp32_matmuls():
        reference, reference_gradients = logps_and_gradients(
            model, "per_row", batch, weights, "fp32"
        )
        shared, shared_gradients = logps_and_gradients(model, "shared", batch, weights, "fp32")
    fp32 = {
        "logp": differences(shared, reference, scored),
        "gradients": gradient_error(shared_gradients, reference_gradients),
    }
    fp32["passed"] = (
        fp32["logp"]["max_abs"] < FP32_LOGP_TOLERANCE
        and fp32["gradients"]["relative_error"] < FP32_GRADIENT_TOLERANCE
    )
    del shared_gradients
    per_row, per_row_gradients = logps_and_gradients(model, "per_row", batch, weights, "bf16")
    shared, shared_gradients = logps_and_gradients(model, "shared", batch, weights, "bf16")
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch
    repadded = (
        torch.nn.functional.pad(prompt_ids, (REPADDING, 0)),
        torch.nn.functional.pad(prompt_mask, (REPADDING, 0)),
        completion_ids,
        completion_mask,
    )
    with torch.no_grad(), precision("bf16", device):
        per_row_repadded = per_row_logps(model, repadded).float()
    bf16 = {
        "logp": differences(shared, per_row, scored),
        "per_row_logp_vs_fp32": differences(per_row, reference, scored),
        "shared_logp_vs_fp32": differences(shared, reference, scored),
        "per_row_repadded_logp": differences(per_row_repadded, per_row, scored),
        "gradients": gradient_error(shared_gradients, per_row_gradients),
        "per_row_gradients_vs_fp32": gradient_error(per_row_gradients, reference_gradients),
        "shared_gradients_vs_fp32": gradient_error(shared_gradients, reference_gradients),
    }
    bf16["passed"] = all(
        bf16["shared_logp_vs_fp32"][key] <= BF16_NOISE_FACTOR * bf16["per_row_logp_vs_fp32"][key]
        for key in ("max_abs", "mean_abs")
    ) and (
        bf16["shared_gradients_vs_fp32"]["relative_error"]
        <= BF16_NOISE_FACTOR * bf16["per_row_gradients_vs_fp32"]["relative_error"]
    )
    return {
        "batch": batch_summary(shape, batch),
        "reference_logp_mean": reference[scored].mean().item(),
        "reference_logp_std": reference[scored].std().item(),
        "fp32": fp32,
        "bf16": bf16,
    }


def batch_summary(shape: Shape, batch: Batch) -> dict[str, Any]:
    prompt_mask, completion_mask = batch[1], batch[3]
    first_rows = prompt_mask[:: shape.generations]
    per_row_tokens = prompt_mask.numel() + completion_mask.numel()
    shared_tokens = shape.groups * (
        int(first_rows.sum(dim=1).max()) - 1 + shape.generations * (completion_mask.size(1) + 1)
    )
    return {
        "groups": shape.groups,
        "generations": shape.generations,
        "prompt_lengths": first_rows.sum(dim=1).tolist(),
        "completion_lengths": completion_mask.sum(dim=1).tolist(),
        "per_row_tokens": per_row_tokens,  # what each forward runs, padding included
        "shared_tokens": shared_tokens,
    }


def sdpa_kernels(run: Any, names: dict[str, str]) -> dict[str, Any]:
    """Which of torch's SDPA kernels `run()` ran, from torch's profiler: each forward call
    labelled by its mask ("masked": a boolean mask, "causal": `is_causal` without one,
    "unmasked"), renamed by `names`: {"forward": {label: {kernel: calls}}, "backward":
    {kernel: calls}} (a math forward has no fused backward: autograd runs its matmuls)."""
    original = torch.nn.functional.scaled_dot_product_attention

    def labelled(query, key, value, attn_mask=None, *args, is_causal=False, **kwargs):
        kind = "masked" if attn_mask is not None else "causal" if is_causal else "unmasked"
        with torch.profiler.record_function(KERNEL_MARK + names.get(kind, kind)):
            return original(query, key, value, attn_mask, *args, is_causal=is_causal, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = labelled
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            run()
            synchronize()
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
    forward: dict[str, dict[str, int]] = {}
    backward: dict[str, int] = {}
    for event in profile.events():
        if event.name.startswith(KERNEL_MARK):
            label = forward.setdefault(event.name[len(KERNEL_MARK) :], {})
            kernel = _kernel_below(event)
            label[kernel] = label.get(kernel, 0) + 1
        elif event.name.startswith("aten::_scaled_dot_product_") and event.name.endswith(
            "_backward"
        ):
            kernel = _kernel(event.name.removesuffix("_backward"))
            backward[kernel] = backward.get(kernel, 0) + 1
    return {"forward": forward, "backward": backward}


def _kernel(op: str) -> str:
    name = op.removeprefix("aten::_scaled_dot_product_")
    return next((kernel for key, kernel in KERNELS if key in name), name)


def _kernel_below(event: Any) -> str:
    """The first SDPA kernel op under a profiler event (depth first)."""
    for child in event.cpu_children:
        if child.name.startswith("aten::_scaled_dot_product_"):
            return _kernel(child.name)
        found = _kernel_below(child)
        if found != "none":
            return found
    return "none"


def sdpa_flags() -> dict[str, bool]:
    """torch.backends.cuda's switches: which SDPA kernels torch may pick from."""
    flags = {}
    for kernel in ("flash", "mem_efficient", "math", "cudnn"):
        enabled = getattr(torch.backends.cuda, f"{kernel}_sdp_enabled", None)
        if enabled is not None:
            flags[kernel] = enabled()
    return flags


def path_kernels(model: torch.nn.Module, batch: Batch, dtype: str) -> dict[str, Any]:
    """The SDPA kernels of one forward and backward of each path under `dtype`."""
    device = next(model.parameters()).device

    def run(path: str) -> None:
        with precision(dtype, device):
            logps = PATHS[path](model, batch)
        logps.sum().backward()
        model.zero_grad(set_to_none=True)

    return {
        "per_row": sdpa_kernels(lambda: run("per_row"), {"masked": "rows", "causal": "rows"}),
        "shared": sdpa_kernels(lambda: run("shared"), {"masked": "segments", "causal": "prompt"}),
    }


def kernel_notes(kernels: dict[str, Any], where: str) -> list[str]:
    """A sentence for every attention that runs the math kernel (no fused kernel took it)."""
    notes = []
    for path, found in kernels.items():
        for label, counts in found["forward"].items():
            if "math" in counts:
                what = f"the shared attention's {label} half" if path == "shared" else path
                reason = " because of its boolean mask" if label == "segments" else ""
                notes.append(f"{where}: {what} falls back to the math kernel{reason} ({counts})")
    return notes


def time_forward_backward(
    model: torch.nn.Module, path: str, batch: Batch, repeats: int, warmup: int
) -> dict[str, Any]:
    """Median seconds of a bf16-autocast forward and backward of one micro-batch (device
    synchronized), and the peak memory over the timed repeats: in all, and above what was
    allocated before them (model, gradients: the activations' share)."""
    device = next(model.parameters()).device
    scored = batch[3].bool()
    weights = scored.float() / scored.sum()

    def step() -> None:
        with precision("bf16", device):
            logps = PATHS[path](model, batch)
        (logps * weights).sum().backward()  # gradients accumulate: the memory stays allocated

    for _ in range(warmup):
        step()
    synchronize()
    cuda = device.type == "cuda"
    if cuda:
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    seconds = []
    for _ in range(repeats):
        synchronize()
        started = time.perf_counter()
        step()
        synchronize()
        seconds.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    model.zero_grad(set_to_none=True)
    return {
        "median_seconds": statistics.median(seconds),
        "seconds": [round(value, 4) for value in seconds],
        "peak_gib": peak / 2**30 if cuda else None,
        "activation_peak_gib": (peak - before) / 2**30 if cuda else None,
    }


def time_paths(model: torch.nn.Module, shape: Shape, vocab_size: int) -> dict[str, Any]:
    """Both paths timed at `shape`, the shared / per-row ratios, and the SDPA kernels each ran."""
    device = next(model.parameters()).device
    batch = grouped_batch(shape, vocab_size, device)
    result: dict[str, Any] = {"batch": batch_summary(shape, batch)}
    for path in PATHS:
        result[path] = time_forward_backward(model, path, batch, shape.repeats, warmup=1)
    per_row, shared = result["per_row"], result["shared"]
    result["time_ratio"] = shared["median_seconds"] / per_row["median_seconds"]
    if per_row["peak_gib"] is not None:
        result["peak_ratio"] = shared["peak_gib"] / per_row["peak_gib"]
        result["activation_peak_ratio"] = (
            shared["activation_peak_gib"] / per_row["activation_peak_gib"]
        )
    result["kernels_bf16"] = path_kernels(model, batch, "bf16")
    return result


def check_shared_prompt(options: argparse.Namespace) -> dict[str, Any]:
    """Item 4 of issue 27 on one device: the shared-prompt path against TRL's per-row path
    (exactness in fp32 and bf16), their forward + backward times and peak memory at the tool
    task's shape and a long-context one, and the SDPA kernels each half of the attention runs."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    started = time.perf_counter()
    model = shared_prompt_model(options.smoke, device)
    vocab_size = model.config.vocab_size
    check_shape = SMOKE_CHECK_SHAPE if options.smoke else CHECK_SHAPE
    report: dict[str, Any] = {
        "model": "tiny Qwen2" if options.smoke else "Qwen2-style 1.5B config, random init",
        "gradient_checkpointing": True,
        "sdpa_flags": sdpa_flags(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "exactness": compare_paths(model, check_shape, vocab_size),
    }
    batch = grouped_batch(check_shape, vocab_size, device)
    with exact_fp32_matmuls():
        report["exactness"]["kernels_fp32"] = path_kernels(model, batch, "fp32")
    notes = kernel_notes(report["exactness"]["kernels_fp32"], "fp32")
    shapes = SMOKE_TIMED_SHAPES if options.smoke else TIMED_SHAPES
    report["timing"] = {}
    for shape in shapes:
        report["timing"][shape.name] = time_paths(model, shape, vocab_size)
        notes += kernel_notes(report["timing"][shape.name]["kernels_bf16"], f"bf16 {shape.name}")
    report["notes"] = notes or ["no attention falls back to the math kernel"]
    report["seconds"] = time.perf_counter() - started
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return report


# ---------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny model and sizes, any device")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per estimator")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"comma-separated parts to run, of {', '.join(PARTS)} (default: all)",
    )
    parser.add_argument(
        "--stand-ins",
        default="",
        help="comma-separated packages to replace by stand-ins even if installed (a test)",
    )
    parser.add_argument(
        "--export-tokenizer", action="store_true", help="write the gzipped tokenizer and exit"
    )
    options = parser.parse_args(argv)
    if options.smoke:
        options.prompts, options.generations, options.max_new_tokens = 2, 4, 12
        options.steps, options.warmup = 2, 1
    for name in ("prompts", "generations", "max_new_tokens", "steps"):
        if getattr(options, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if options.warmup < 0:
        parser.error("--warmup must be >= 0")
    options.parts = [part for part in options.parts.split(",") if part]
    unknown = sorted(set(options.parts) - set(PARTS))
    if unknown or not options.parts:
        parser.error(f"--parts: {unknown or 'none'} given; choose from {', '.join(PARTS)}")
    return options


def train_side_by_side(options: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """GDPO with and without the shared prompt, then MRTPO (with it), one after the other;
    the bf16-vs-fp32 replay comparison on MRTPO's last batch."""
    runs = {}
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, estimator, share_prompt in RUNS:
            runs[name] = train(estimator, options, os.path.join(scratch, name), share_prompt)
            summary = {k: v for k, v in runs[name].items() if k != "trainer"}
            print(f"{name}: {json.dumps(summary)}", flush=True)
            if name != "mrtpo":  # free its model and optimizer before the next run
                del runs[name]["trainer"]
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        report["precision"] = compare_precisions(runs["mrtpo"].pop("trainer"))
    report.update(runs)
    report["step_time_ratio"] = (
        runs["mrtpo"]["median_step_seconds"] / runs["gdpo"]["median_step_seconds"]
    )
    on, off = runs["gdpo"], runs["gdpo_per_row"]
    report["share_prompt_step"] = {
        "time_ratio": on["median_step_seconds"] / off["median_step_seconds"],
        "peak_ratio": on["peak_gib"] / off["peak_gib"] if on["peak_gib"] else None,
        "shared": on["share_prompt"] and not off["share_prompt"],  # both runs as named
    }
    return report


def mean_prompt_tokens(options: argparse.Namespace) -> float:
    """The training prompts' mean length in tokens, chat template included."""
    tokenizer = load_tokenizer(options.smoke)
    texts = [
        tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        for row in prompt_rows(options.prompts)
    ]
    return statistics.mean(
        len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts
    )


def guarded(part: Any, options: argparse.Namespace) -> dict[str, Any]:
    """`part(options)`, or on the GPU machine its error (printed), so that one failing part
    does not cost the others' results; --smoke lets the error through (its test fails)."""
    try:
        return part(options)
    except Exception as error:
        if options.smoke:
            raise
        traceback.print_exc()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return {"error": f"{type(error).__name__}: {error}"}


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The results in a few lines, after the JSON."""
    lines = []
    shared = report.get("shared_prompt")
    if shared and "error" in shared:
        lines.append(f"shared prompt: failed: {shared['error']}")
    elif shared:
        exactness = shared["exactness"]
        fp32, bf16 = exactness["fp32"], exactness["bf16"]
        verdict = {True: "pass", False: "FAIL"}
        lines.append(
            f"shared vs per-row, fp32: max |dlogp| {fp32['logp']['max_abs']:.2e}, gradients "
            f"rel. error {fp32['gradients']['relative_error']:.2e} ({verdict[fp32['passed']]}); "
            f"bf16: max |dlogp| {bf16['logp']['max_abs']:.2e}, from fp32: shared "
            f"{bf16['shared_logp_vs_fp32']['max_abs']:.2e}, per-row "
            f"{bf16['per_row_logp_vs_fp32']['max_abs']:.2e} ({verdict[bf16['passed']]})"
        )
        for name, timing in shared["timing"].items():
            peak = timing.get("activation_peak_ratio")
            memory = f", activation peak {peak:.2f}x" if peak is not None else ""
            ratio = timing["time_ratio"]
            lines.append(f"shared / per-row forward+backward, {name}: time {ratio:.2f}x{memory}")
        lines += shared["notes"]
    if "gdpo" in report:
        lines.append(
            f"GDPO step, shared prompt on / off: {report['share_prompt_step']['time_ratio']:.2f}x"
        )
        lines.append(
            f"MRTPO / GDPO step time: {report['step_time_ratio']:.2f}x; replay "
            f"{report['mrtpo']['median_replay_seconds']:.2f} s per step; peak GiB gdpo "
            f"{report['gdpo']['peak_gib']}, mrtpo {report['mrtpo']['peak_gib']}; bf16 vs fp32 "
            f"distances: max |diff| {report['precision']['max_abs_difference']:.2e}, "
            f"correlation {report['precision']['correlation']:.4f}"
        )
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    options = parse_args(argv)
    # The GPU machine reaches nothing outside: no hub calls, no telemetry.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if options.export_tokenizer:
        export_tokenizer()
        return {}
    forced = {name for name in options.stand_ins.split(",") if name}
    unknown = forced - set(STAND_IN_CANDIDATES)
    if unknown:
        raise SystemExit(
            f"--stand-ins: unknown {sorted(unknown)}; choose from {STAND_IN_CANDIDATES}"
        )
    stand_ins = install_stand_ins(forced)
    if "matplotlib" in stand_ins:  # the metrics file is still written; the curves are not drawn
        import mrtpo.logging_callbacks

        mrtpo.logging_callbacks.plot_reward_curves = lambda *args, **kwargs: False
    report: dict[str, Any] = {"versions": versions(), "stand_ins": stand_ins}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not options.smoke:
        raise SystemExit("no CUDA device: the full check needs one (use --smoke on a CPU)")
    if int(report["versions"]["transformers"].split(".")[0]) < 5:
        raise SystemExit(
            f"transformers {report['versions']['transformers']} is older than mrtpo needs (>= 5): "
            "put transformers' and huggingface_hub's wheels in .whl/"
        )
    report["device"] = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"versions: {report['versions']}\nstand-ins: {stand_ins or 'none'}", flush=True)
    report["setting"] = {
        "model": "tiny" if options.smoke else "Qwen2-style 1.5B config, random init",
        "prompts": options.prompts,
        "generations": options.generations,
        "max_new_tokens": options.max_new_tokens,
        "timed_steps": options.steps,
        "warmup_steps": options.warmup,
    }
    started = time.perf_counter()
    if "shared_prompt" in options.parts:
        report["shared_prompt"] = guarded(check_shared_prompt, options)
        print(f"shared_prompt: {json.dumps(report['shared_prompt'])}", flush=True)
    if "training" in options.parts:
        report["setting"]["mean_prompt_tokens"] = mean_prompt_tokens(options)
        report.update(train_side_by_side(options, device))
    report["total_seconds"] = time.perf_counter() - started
    text = json.dumps(report, indent=1)
    print(text)
    print("\n" + "\n".join(summary_lines(report)))
    for path in filter(None, [options.json, os.environ.get("OUT")]):
        path = Path(path)
        (path / "gpu_check.json" if path.is_dir() else path).write_text(text)
    return report


if __name__ == "__main__":
    main()
