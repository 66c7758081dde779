"""The prepared GPU check: GDPO and MRTPO bf16 training steps side by side on one GPU.

What it measures, on a random-init model of realistic size (a Qwen2-style ~1.5B config built
in code; no weights travel) with SmolLM2's tokenizer (49,152 tokens; `tokenizer.json` ships
gzipped beside this script, 0.6 MB):
- each estimator's optimizer-step wall time (generation, verification, replay, loss, backward,
  optimizer; the first step is a warm-up and not counted) and the MRTPO / GDPO ratio;
- MRTPO's replay seconds per step and the share of rows replayed;
- each run's peak GPU memory (allocated);
- the replay's distances under bf16 autocast (as it trains: fp32 weights, `bf16=True`) against
  float32, on the last training batch, and what the difference does to the weights.
The three verifiers are coins (a hash of the completion) with verifier information of a
realistic length, so almost every group has varying rewards and almost every row is replayed:
the replay's full cost. Sized to finish in under 8 minutes on one H200 (about 3 measured
minutes plus start-up).

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
import types
import zlib
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
TOKENIZER_FILE = HERE / "gpu_check_tokenizer.json.gz"  # SmolLM2-135M-Instruct's, from its GGUF
STAND_IN_CANDIDATES = ("datasets", "pyarrow", "pandas", "matplotlib")

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


def train(estimator: str, options: argparse.Namespace, output_dir: str) -> dict[str, Any]:
    """`options.warmup + options.steps` training steps of one estimator; its measurements, the
    trainer (for the distance comparison) under "trainer"."""
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
    return options


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
    runs = {}
    with tempfile.TemporaryDirectory() as scratch:
        for estimator in ("gdpo", "mrtpo"):
            runs[estimator] = train(estimator, options, os.path.join(scratch, estimator))
            summary = {k: v for k, v in runs[estimator].items() if k != "trainer"}
            print(f"{estimator}: {json.dumps(summary)}", flush=True)
            if estimator == "gdpo":  # free its model and optimizer before the next run
                del runs[estimator]["trainer"]
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        report["precision"] = compare_precisions(runs["mrtpo"].pop("trainer"))
    report["gdpo"], report["mrtpo"] = runs["gdpo"], runs["mrtpo"]
    report["step_time_ratio"] = (
        runs["mrtpo"]["median_step_seconds"] / runs["gdpo"]["median_step_seconds"]
    )
    report["total_seconds"] = time.perf_counter() - started
    text = json.dumps(report, indent=1)
    print(text)
    print(
        f"\nMRTPO / GDPO step time: {report['step_time_ratio']:.2f}x; replay "
        f"{runs['mrtpo']['median_replay_seconds']:.2f} s per step; peak GiB gdpo "
        f"{runs['gdpo']['peak_gib']}, mrtpo {runs['mrtpo']['peak_gib']}; bf16 vs fp32 distances: "
        f"max |diff| {report['precision']['max_abs_difference']:.2e}, correlation "
        f"{report['precision']['correlation']:.4f}"
    )
    for path in filter(None, [options.json, os.environ.get("OUT")]):
        path = Path(path)
        (path / "gpu_check.json" if path.is_dir() else path).write_text(text)
    return report


if __name__ == "__main__":
    main()
