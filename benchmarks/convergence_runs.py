"""The convergence studies' runs (`benchmarks/convergence.py` runs them as a grid): the
settings and each method's `MRTPOConfig`, the study's data, one run trained to its last step
(resumable from its last checkpoint, `run.json` written at each start of training, a step's
policy kept on request) and its final evaluation (the test split sampled with the run's own
seed, BFCL's simple_python greedy). Used by every training study in `benchmarks/`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

TASK = "tool_calling"
RESULTS = Path("benchmarks/results/convergence")
CHECKPOINTS = "checkpoints"  # ignored by git
METRICS_FILE, EVAL_FILE, RUN_FILE, STUDY_FILE = (
    "metrics.jsonl",
    "final_eval.json",
    "run.json",
    "study.json",
)
# Method name -> MRTPOConfig overrides: the only thing that differs between methods. MRTPO's
# beta is the paper's 0.5, fixed, as these runs measured it (`mrtpo train` now defaults to auto).
FIXED_BETA = {"advantage_estimator": "mrtpo", "mrtpo_beta": 0.5}
METHODS: dict[str, dict[str, Any]] = {
    "grpo": {"advantage_estimator": "grpo"},
    "gdpo": {"advantage_estimator": "gdpo"},
    "mrtpo": FIXED_BETA,
    "mrtpo_shuffled": {**FIXED_BETA, "shuffle_token_weights": True},
    # Replayed with the verifier information of a row of another prompt (the placebo control).
    "mrtpo_placebo": {**FIXED_BETA, "replay_information": "placebo"},
}
BASELINE, PROPOSED = "gdpo", "mrtpo"  # the paired difference PROPOSED - BASELINE
THRESHOLD, WINDOW = 0.8, 3  # steps to a training format reward of 0.8, rolling mean of 3
COLD_START_EVAL = "cold_start_eval"  # the worker that evaluates the cold start (step 0)
POSITIVE_OPTIONS = ("steps", "prompts", "generations", "micro_batch", "max_completion_length", "jobs", "threads", "save_steps")  # fmt: skip
TOP_SHARE_KEY = "top10_share"


# ----------------------------------------------------------------------------- settings


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """`NAME=JSON` (a JSON object of MRTPOConfig overrides) -> (name, overrides)."""
    name, separator, overrides = text.partition("=")
    if not separator or not name.strip():
        raise argparse.ArgumentTypeError(f"--variant must be NAME=JSON, got {text!r}")
    try:
        parsed = json.loads(overrides)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(
            f"--variant {name}: the overrides are not JSON ({error})"
        ) from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(
            f"--variant {name}: the overrides must be a JSON object, got {overrides}"
        )
    return name.strip(), parsed


def parse_seeds_for(text: str) -> tuple[str, list[int]]:
    """`METHOD=0,1,2` -> (method, [0, 1, 2])."""
    name, separator, seeds = text.partition("=")
    try:
        parsed = [int(seed) for seed in seeds.split(",") if seed.strip()]
    except ValueError:
        parsed = []
    if not separator or not parsed:
        raise argparse.ArgumentTypeError(f"--seeds_for must be METHOD=0,1,2, got {text!r}")
    return name.strip(), parsed


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--results", type=Path, default=RESULTS, help="results folder")
    add(
        "--task",
        default=TASK,
        help="the task's results go into <results>/<task> (tool_calling from the cold start on "
        "the study's rows; another task trains from the policy `train_run` is given)",
    )
    add("--model_name_or_path", default=None, help="base model (default: the embedded one)")
    add("--cold_start", type=Path, help="an existing cold-start model (default: built once)")
    add("--sft_max_steps", type=int, default=3, help="cold-start steps (the demo's 3)")
    add("--methods", nargs="+", default=list(METHODS))
    add("--seeds", nargs="+", type=int, default=[0, 1, 2])
    add("--seeds_for", action="append", default=[], type=parse_seeds_for, metavar="METHOD=0,1,2")
    add("--variant", action="append", default=[], type=parse_variant, metavar="NAME=JSON")
    add("--steps", type=int, default=15, help="optimizer steps per run")
    add("--prompts", type=int, default=4, help="prompts per step")
    add("--generations", type=int, default=4, help="completions per prompt")
    add("--micro_batch", type=int, default=2, help="completions per forward/backward pass")
    add("--max_completion_length", type=int, default=96)
    add(
        "--max_reference_tokens",
        type=int,
        help="rows whose reference response is longer are left out (default: the completion "
        "length - 16)",
    )
    add("--learning_rate", type=float, default=1e-5)
    add("--save_steps", type=int, default=1, help="checkpoint every N steps")
    add("--eval_samples", type=int, default=6, help="samples per test prompt (0: no eval)")
    add("--eval_temperature", type=float, default=1.0)
    add("--eval_rows", type=int, help="the first N test rows only (default: all that fit)")
    add("--bfcl_examples", type=int, default=100, help="first N BFCL simple_python ids")
    add("--eval_batch", type=int, default=16, help="generation batch of the evaluation")
    add("--device", choices=("auto", "cpu", "cuda"), default="auto")
    add("--jobs", type=int, default=2, help="runs at once")
    add("--threads", type=int, default=1, help="torch threads per run")
    add(
        "--eval_cold_start",
        action="store_true",
        help="also evaluate the cold-start model (step 0) as every run is evaluated",
    )
    add("--report", action="store_true", help="only regenerate the report")
    add("--worker", nargs="+", help=argparse.SUPPRESS)  # internal: "cold_start" or METHOD SEED
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    args = build_parser().parse_args(list(argv))
    args.argv = list(argv)
    args.variants = {**METHODS, **dict(args.variant)}
    unknown = [method for method in args.methods if method not in args.variants]
    unknown += [method for method, _ in args.seeds_for if method not in args.methods]
    if unknown:
        raise SystemExit(
            f"unknown method(s) {unknown}: choose among {sorted(args.variants)} (or add one with --variant)"
        )
    for name in POSITIVE_OPTIONS:
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be >= 1, got {getattr(args, name)}")
    if (args.prompts * args.generations) % args.micro_batch:
        raise SystemExit(
            f"--micro_batch {args.micro_batch} must divide prompts x generations = "
            f"{args.prompts * args.generations}"
        )
    if args.max_reference_tokens is None:
        args.max_reference_tokens = args.max_completion_length - 16
    return args


def seeds_of(args: argparse.Namespace) -> dict[str, list[int]]:
    """Each method's seeds: `--seeds`, or its `--seeds_for`."""
    overrides = dict(args.seeds_for)
    return {method: overrides.get(method, list(args.seeds)) for method in args.methods}


def study_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What every run of the study shares (a rerun with other values is refused)."""
    return {
        "task": args.task,
        "model_name_or_path": args.model_name_or_path or _default_model(),
        "cold_start": str(args.cold_start) if args.cold_start else None,
        "sft_max_steps": args.sft_max_steps,
        "steps": args.steps,
        "prompts": args.prompts,
        "generations": args.generations,
        "micro_batch": args.micro_batch,
        "max_completion_length": args.max_completion_length,
        "max_reference_tokens": args.max_reference_tokens,
        "learning_rate": args.learning_rate,
        "eval_samples": args.eval_samples,
        "eval_temperature": args.eval_temperature,
        "eval_rows": args.eval_rows,
        "bfcl_examples": args.bfcl_examples,
        "device": args.device,
    }


def device_of(args: argparse.Namespace) -> str:
    """The torch device `--device` names ("auto": CUDA when torch sees it)."""
    import torch

    if args.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return args.device


def _default_model() -> str:
    from mrtpo.models import DEFAULT_MODEL

    return DEFAULT_MODEL


def task_root(args: argparse.Namespace) -> Path:
    # Namespaces other scripts build for the cold start alone (update_quality's) carry no task.
    return Path(args.results) / getattr(args, "task", TASK)


def run_dir(args: argparse.Namespace, method: str, seed: int) -> Path:
    return task_root(args) / method / f"seed{seed}"


def cold_start_dir(args: argparse.Namespace) -> Path:
    return (
        Path(args.cold_start) if args.cold_start else task_root(args) / "cold_start" / CHECKPOINTS
    )


def method_config(args: argparse.Namespace, method: str, seed: int, output_dir: Path) -> Any:
    """The run's `MRTPOConfig`: the CPU defaults, the study's shared settings, then the
    method's overrides (raises on an override MRTPOConfig does not know)."""
    from mrtpo.training import train_config

    shared: dict[str, Any] = {
        "output_dir": str(output_dir),
        "seed": seed,
        "max_steps": args.steps,
        "num_generations": args.generations,
        "per_device_train_batch_size": args.micro_batch,
        "gradient_accumulation_steps": args.prompts * args.generations // args.micro_batch,
        "max_completion_length": args.max_completion_length,
        "learning_rate": args.learning_rate,
        "save_steps": args.save_steps,
        "save_total_limit": 1,
        "disable_tqdm": True,
    }
    if args.device == "cpu":
        shared.update(use_cpu=True, bf16=False, dataloader_pin_memory=False)
    try:
        return train_config(**{**shared, **args.variants[method]})
    except TypeError as error:
        raise ValueError(f"method {method!r}: {error}") from None


# ----------------------------------------------------------------------------- data


def fitting_ids(tokenizer: Any, split: str, limit: int) -> list[str]:
    """Ids of the bundled split's rows whose reference response (plus eos) has at most
    `limit` tokens."""
    from mrtpo import tasks

    task = tasks.get(TASK)
    ids = []
    for row in task.load(split):
        reference = task.reference_completion(row)
        if len(tokenizer(reference, add_special_tokens=False)["input_ids"]) + 1 <= limit:
            ids.append(row["id"])
    return ids


def write_study_data(args: argparse.Namespace, tokenizer: Any) -> Path:
    """The bundled train and test files cut to the fitting rows, in BFCL's layout, in
    `<results>/tool_calling/data/` (the rows as bundled, so they load identically)."""
    from mrtpo.tasks.tool_calling.data import BUNDLED_DIR, read_json_lines

    folder = task_root(args) / "data"
    limit = args.max_reference_tokens
    for split in ("train", "test"):
        keep = set(fitting_ids(tokenizer, split, limit))
        for source, target in (
            (BUNDLED_DIR / f"{split}.jsonl", folder / f"{split}.jsonl"),
            (
                BUNDLED_DIR / "possible_answer" / f"{split}.jsonl",
                folder / "possible_answer" / f"{split}.jsonl",
            ),
        ):
            target.parent.mkdir(parents=True, exist_ok=True)
            rows = [row for row in read_json_lines(source) if row["id"] in keep]
            text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
            # A second grid process rewrites the files its first is training from: same rows,
            # replaced whole, never truncated under a reader.
            if not target.is_file() or target.read_text() != text:
                temporary = target.with_name(target.name + ".tmp")
                temporary.write_text(text)
                os.replace(temporary, target)
    return folder


def commit_files(paths: Sequence[Path], message: str, attempts: int = 60) -> bool:
    """`git add` and `git commit` of `paths` only (other staged or changed files are left as
    they are), retried while another git process holds the index; False when it fails."""
    existing = [str(path) for path in paths if Path(path).is_file()]
    if not existing:
        return False
    where = Path(existing[0]).resolve().parent
    for _ in range(attempts):
        add = subprocess.run(["git", "-C", str(where), "add", "--", *map(os.path.abspath, existing)], capture_output=True, text=True)  # fmt: skip
        commit = add.returncode == 0 and subprocess.run(
            ["git", "-C", str(where), "commit", "-q", "-m", message, "--", *map(os.path.abspath, existing)],
            capture_output=True, text=True,
        )  # fmt: skip
        if commit and commit.returncode == 0:
            return True
        error = (commit.stderr if commit else add.stderr) or ""
        if "index.lock" not in error:
            print(f"commit of {len(existing)} file(s) failed: {error.strip()}", flush=True)
            return False
        time.sleep(5)
    return False


# ----------------------------------------------------------------------------- one run


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(value, indent=1) + "\n")
    os.replace(temporary, path)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The training records (lines with rewards) of a metrics.jsonl, one per step."""
    if not path.is_file():
        return []
    records = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
        if isinstance(record, dict) and any(key.startswith("rewards/") for key in record):
            records[record["step"]] = record
    return [records[step] for step in sorted(records)]


def drop_resume_checkpoints(folder: Path) -> int:
    """Delete the `checkpoint-<step>` folders of a finished run's `folder` (its checkpoints
    folder): weights, optimizer and scheduler states kept only to resume, about 7 GB each for
    Qwen2.5-0.5B. The final model and any policy kept by `keep_steps` stay. Returns the bytes
    freed."""
    freed = 0
    for checkpoint in sorted(Path(folder).glob("checkpoint-*")):
        if checkpoint.is_dir():
            freed += sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file())
            shutil.rmtree(checkpoint)
    return freed


def is_finished(folder: Path, evaluate: bool) -> bool:
    """A run is finished when its final evaluation is written (or, without evaluation, its
    run.json says training finished)."""
    if evaluate:
        return (folder / EVAL_FILE).is_file()
    return bool((_read_json(folder / RUN_FILE) or {}).get("trained"))


@contextlib.contextmanager
def run_lock(folder: Path, wait: bool = False) -> Any:
    """Yields whether this process holds `folder`'s run lock (an exclusive flock on
    `checkpoints/run.lock`, released when the process ends however it ends): a run is trained
    and evaluated by one grid process at a time. `wait`: block until the lock is free (the
    cold start, which every process needs) instead of yielding False at once."""
    path = folder / CHECKPOINTS / "run.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def machine(args: argparse.Namespace) -> dict[str, Any]:
    """Where and when a run (or its resumption) trains: CPU model, logical CPUs, torch threads,
    the start time (UTC) and the load average then."""
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "threads": args.threads,
        "device": args.device,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _has_saved_state(checkpoints: Path) -> bool:
    """Whether `checkpoints` holds a step checkpoint or the trained model (its config.json)."""
    from transformers.trainer_utils import get_last_checkpoint

    return checkpoints.is_dir() and (
        (checkpoints / "config.json").is_file() or get_last_checkpoint(str(checkpoints)) is not None
    )


def weights_digest(folder: Path) -> str:
    """sha256 over a model folder's safetensors files, in name order: which cold start a run
    trained from (it is rebuilt on every fresh machine, and another CPU may round otherwise)."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def build_cold_start(args: argparse.Namespace) -> Path:
    """The demo's cold start (`mrtpo sft --task tool_calling`, `--sft_max_steps` steps of the
    SFT defaults) into the results folder, once."""
    from mrtpo.cold_start import build_sft_trainer, run_sft, sft_config

    folder = cold_start_dir(args)
    if (folder / "config.json").is_file():
        return folder
    options: dict[str, Any] = {"output_dir": str(folder), "max_steps": args.sft_max_steps}
    if args.device == "cpu":
        options.update(use_cpu=True, bf16=False, dataloader_pin_memory=False)
    trainer = build_sft_trainer(
        TASK, args.model_name_or_path or _default_model(), sft_config(**options)
    )
    return run_sft(trainer, TASK)


# A kept policy holds what loading and sampling need, not the optimizer's state (~5 GB on Qwen).
KEPT_POLICY_FILES = ("*.safetensors", "*.json", "*.jinja", "*.txt", "*.model")


def kept_policy_dir(checkpoints: Path, step: int) -> Path:
    """Where a run keeps its policy after `step` optimizer steps (beside the rotated step
    checkpoints, which it outlives: checkpoint rotation only removes `checkpoint-*`)."""
    return Path(checkpoints) / f"policy-step{step}"


def keep_policy(checkpoints: Path, step: int) -> Path | None:
    """Copy the policy of `checkpoints/checkpoint-{step}` (weights, config, tokenizer) to
    `kept_policy_dir`, once; None while that checkpoint does not exist."""
    source, target = Path(checkpoints) / f"checkpoint-{step}", kept_policy_dir(checkpoints, step)
    if (target / "config.json").is_file():
        return target
    if not source.is_dir():
        return None
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for pattern in KEPT_POLICY_FILES:
        for path in sorted(source.glob(pattern)):
            shutil.copy2(path, partial / path.name)
    partial.rename(target)  # whole or absent: a copy cut short is never taken for a policy
    return target


def keep_policy_callback(checkpoints: Path, steps: Sequence[int]) -> Any:
    """A `TrainerCallback` that keeps the policy of each of `steps` as its checkpoint is saved
    (the run's `save_steps` must divide each)."""
    from transformers import TrainerCallback

    class KeepPolicy(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.is_world_process_zero and state.global_step in steps:
                keep_policy(checkpoints, state.global_step)

    return KeepPolicy()


def stop_callback(step: int) -> Any:
    """A `TrainerCallback` that ends training after optimizer step `step` (its save included):
    a run stopped there took exactly the steps the whole run took up to it (the schedule and the
    data order are the whole run's)."""
    from transformers import TrainerCallback

    class Stop(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step >= step:
                control.should_training_stop = True

    return Stop()


# Logged values that differ between two runs of the same steps: the clock's.
CLOCK_KEYS = ("step_time",)


def rebuild_kept_policy(
    args: argparse.Namespace,
    method: str,
    seed: int,
    step: int,
    scratch: Path,
    start: str | None = None,
    provenance: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A run's kept policy (`keep_steps`) on a machine that did not keep it: the run trained
    again from the start in `scratch` (its settings, stopped after `step`), each logged step up
    to `step` compared with the run's committed metrics.jsonl (every value but the clock's),
    the policy moved to `kept_policy_dir` of the run's checkpoints and the scratch run's
    checkpoints deleted (its run.json and metrics.jsonl stay). Returns the rebuild's record."""
    target = kept_policy_dir(run_dir(args, method, seed) / CHECKPOINTS, step)
    if (target / "config.json").is_file():
        return {"rebuilt": False, "policy_sha256": weights_digest(target)}
    study = read_metrics(run_dir(args, method, seed) / METRICS_FILE)
    if len(study) < step:
        raise SystemExit(f"{run_dir(args, method, seed)}: {len(study)} logged steps, not {step}")
    again = argparse.Namespace(**{**vars(args), "results": Path(scratch), "eval_samples": 0})
    earlier = run_dir(again, method, seed)
    if is_finished(earlier, False) and not kept_policy_dir(earlier / CHECKPOINTS, step).is_dir():
        shutil.rmtree(earlier)  # an earlier rebuild here, its policy moved away since: again
    folder = train_run(again, method, seed, start, provenance=provenance, keep_steps=[step], stop_at=step)  # fmt: skip
    rebuilt = read_metrics(folder / METRICS_FILE)
    first = None
    for mine, theirs in zip(rebuilt[:step], study[:step], strict=False):
        for key in sorted(set(mine) | set(theirs)):
            if key not in CLOCK_KEYS and mine.get(key) != theirs.get(key):
                first = {"step": mine["step"], "key": key, "run": theirs.get(key), "rebuilt": mine.get(key)}  # fmt: skip
                break
        if first:
            break
    source = kept_policy_dir(folder / CHECKPOINTS, step)
    target.parent.mkdir(parents=True, exist_ok=True)
    source.rename(target)
    shutil.rmtree(folder / CHECKPOINTS)  # the scratch run's model and checkpoints: copies
    return {
        "rebuilt": True,
        "steps_logged": len(rebuilt),
        "identical_steps": step if first is None and len(rebuilt) >= step else None,
        "first_difference": first,
        "policy_sha256": weights_digest(target),
        "train_seconds": _read_json(folder / RUN_FILE)["train_seconds"],
    }


def train_run(
    args: argparse.Namespace,
    method: str,
    seed: int,
    start: str | None = None,
    evaluate: Callable[[argparse.Namespace, Path, int], dict[str, Any]] | None = None,
    provenance: Mapping[str, Any] | None = None,
    keep_steps: Sequence[int] = (),
    stop_at: int | None = None,
) -> Path:
    """Train one run to its last step (resuming from its last checkpoint), then evaluate it.

    start: the policy to train from, on the task's bundled train split (default: the cold
    start, on the study's rows); evaluate(args, model folder, seed): the final evaluation
    (default `evaluate_policy`); provenance: more that each start of training records in
    run.json (e.g. the commit of the code); keep_steps: steps whose policy is kept (in
    `kept_policy_dir`) for a later measurement, each a multiple of `--save_steps`; stop_at:
    end training after this step (`rebuild_kept_policy`)."""
    from transformers.trainer_utils import get_last_checkpoint

    from mrtpo.models import resolve_model_path
    from mrtpo.training import run_training

    folder = run_dir(args, method, seed)
    checkpoints = folder / CHECKPOINTS
    for step in keep_steps:
        if step % args.save_steps or not 0 < step <= args.steps:
            raise ValueError(
                f"keep_steps: {step} is not a saved step (a multiple of --save_steps "
                f"{args.save_steps} up to --steps {args.steps})"
            )
        keep_policy(checkpoints, step)  # a run killed between the save and the copy
    if is_finished(folder, args.eval_samples > 0):
        return folder
    record = _read_json(folder / RUN_FILE)
    if record is not None and not _has_saved_state(checkpoints):
        # Checkpoints are never committed: after a machine restart a run.json may outlive the
        # state it describes (a trained model to evaluate, steps to resume). Start it over.
        print(f"{folder}: run.json but no checkpoint under {checkpoints}; training from scratch")
        record = None
    record = record or {
        "method": method,
        "seed": seed,
        "overrides": args.variants[method],
        "settings": study_settings(args),
        "train_seconds": 0.0,
        # CPU time of this process (all its threads): machine time, whatever else runs.
        "train_cpu_seconds": 0.0,
        "resumed_from": [],
        "trained": False,
    }
    if not record["trained"]:
        config = method_config(args, method, seed, checkpoints)
        last = get_last_checkpoint(str(checkpoints)) if checkpoints.is_dir() else None
        if last is not None:
            config.resume_from_checkpoint = last
            record["resumed_from"].append(Path(last).name)
        # One entry per start of training: the first, then each resumption.
        digest = (
            {"cold_start_sha256": weights_digest(cold_start_dir(args))}
            if start is None
            else {"start_sha256": weights_digest(Path(resolve_model_path(start)))}
        )
        record.setdefault("sessions", []).append(
            {
                **machine(args),
                "checkpoint": Path(last).name if last else None,
                **digest,
                **(provenance or {}),
            }
        )
        # On disk before training: a process killed without its `finally` (the machine going
        # away) still leaves the starts of training for the resumption to add to.
        _write_json(folder / RUN_FILE, record)
        started, cpu_started = time.perf_counter(), time.process_time()
        try:
            run_training(
                args.task,
                str(cold_start_dir(args)) if start is None else start,
                config,
                data=str(task_root(args) / "data" / "train.jsonl") if start is None else None,
                callbacks=[
                    *([keep_policy_callback(checkpoints, keep_steps)] if keep_steps else []),
                    *([stop_callback(stop_at)] if stop_at else []),
                ],
            )
        finally:
            record["train_seconds"] += time.perf_counter() - started
            record["train_cpu_seconds"] += time.process_time() - cpu_started
            record["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            if (checkpoints / METRICS_FILE).is_file():
                shutil.copyfile(checkpoints / METRICS_FILE, folder / METRICS_FILE)
            _write_json(folder / RUN_FILE, record)
        record["trained"] = True
        _write_json(folder / RUN_FILE, record)
    if args.eval_samples > 0:
        timed_evaluation(args, checkpoints, folder, record, evaluation_seed(seed), evaluate)
    return folder


# The cold start's evaluation draws its samples with seed 0, as it always has; a run's draw
# is its own, from its training seed (`evaluation_seed`), never the cold start's. With one
# seed for every run, the runs' test evaluations shared one sampling draw, and the spread
# over seeds understated the evaluation's noise.
COLD_START_EVAL_SEED = 0
EVAL_SEED_OFFSET = 1000


def evaluation_seed(training_seed: int) -> int:
    """The seed of a run's final evaluation sampling: `EVAL_SEED_OFFSET` + its training seed
    (runs of two methods with the same training seed share it, as they share data order)."""
    return EVAL_SEED_OFFSET + training_seed


def timed_evaluation(
    args: argparse.Namespace,
    model: Path,
    folder: Path,
    record: dict[str, Any],
    seed: int,
    evaluate: Callable[[argparse.Namespace, Path, int], dict[str, Any]] | None = None,
) -> None:
    """Evaluate `model` as the study evaluates every policy (`evaluate`, default
    `evaluate_policy`), its test samples drawn with `seed`: `record` gains the seed, the
    machine and the wall and CPU seconds and goes to `folder`'s run.json, the result to its
    final_eval.json."""
    record["eval_seed"] = seed
    record["eval_session"] = machine(args)
    started, cpu_started = time.perf_counter(), time.process_time()
    result = (evaluate or evaluate_policy)(args, model, seed)
    record["eval_seconds"] = time.perf_counter() - started
    record["eval_cpu_seconds"] = time.process_time() - cpu_started
    _write_json(folder / RUN_FILE, record)
    _write_json(folder / EVAL_FILE, result)


def cold_start_eval_dir(args: argparse.Namespace) -> Path:
    return task_root(args) / "cold_start"


def evaluate_cold_start(args: argparse.Namespace) -> Path:
    """The cold-start model (step 0) evaluated as every run's final policy is, once:
    `cold_start/final_eval.json` and its `run.json` (timing, machine)."""
    folder = cold_start_eval_dir(args)
    if (folder / EVAL_FILE).is_file():
        return folder
    record = {"evaluated": str(cold_start_dir(args))}
    timed_evaluation(args, cold_start_dir(args), folder, record, COLD_START_EVAL_SEED)
    return folder


def proportion_summary(values: Sequence[float]) -> dict[str, float]:
    """Mean and its standard error (sqrt(mean(1 - mean) / n) for 0/1 values, else the sample
    standard deviation over sqrt(n)) of per-sample values."""
    array = np.asarray(values, dtype=float)
    mean = float(array.mean())
    if np.isin(array, (0.0, 1.0)).all():
        error = math.sqrt(mean * (1 - mean) / len(array))
    else:
        error = float(array.std(ddof=1) / math.sqrt(len(array))) if len(array) > 1 else 0.0
    return {"mean": mean, "se": error, "n": len(array)}


def score_summary(result: Mapping[str, Any]) -> dict[str, Any]:
    """Format rate, correctness and exact calls (correctness = 1) of one `evaluate` result."""
    scores = [
        (
            example["verdicts"]["tool_format"]["score"],
            example["verdicts"]["tool_correctness"]["score"],
        )
        for example in result["examples"]
    ]
    return {
        "format": proportion_summary([fmt for fmt, _ in scores]),
        "correctness": proportion_summary([correct for _, correct in scores]),
        "exact": proportion_summary([float(correct == 1.0) for _, correct in scores]),
    }


def sample_test_rows(
    args: argparse.Namespace, task: Any, model: Any, tokenizer: Any, test: Any, seed: int
) -> tuple[Any, dict[str, Any]]:
    """The test rows (the first `--eval_rows`, when given) and `evaluate`'s result on them:
    `--eval_samples` samples each at `--eval_temperature`, drawn with `seed`."""
    from mrtpo.evaluation import evaluate

    if args.eval_rows is not None:
        test = test.select(range(min(args.eval_rows, len(test))))
    sampled = evaluate(
        model,
        tokenizer,
        task,
        test,
        args.eval_batch,
        args.max_completion_length,
        temperature=args.eval_temperature,
        num_samples=args.eval_samples,
        seed=seed,
    )
    return test, sampled


def evaluate_policy(args: argparse.Namespace, model_dir: Path, seed: int) -> dict[str, Any]:
    """The final policy on the study's test rows (`--eval_samples` samples each at
    `--eval_temperature`, drawn with `seed`) and on BFCL v4 simple_python's first
    `--bfcl_examples` ids (greedy)."""
    from mrtpo import tasks
    from mrtpo.evaluation import evaluate
    from mrtpo.models import load_model
    from mrtpo.tasks.tool_calling.data import bfcl_data_dir

    task = tasks.get(TASK)
    model, tokenizer = load_model(str(model_dir))
    model = model.to(device_of(args))
    length = args.max_completion_length
    test = task.load(path=str(task_root(args) / "data" / "test.jsonl"))
    test, sampled = sample_test_rows(args, task, model, tokenizer, test, seed)
    result: dict[str, Any] = {
        "test": {
            "rows": len(test),
            "samples_per_row": args.eval_samples,
            "temperature": args.eval_temperature,
            **score_summary(sampled),
        }
    }
    folder = bfcl_data_dir()
    if args.bfcl_examples and folder is not None:
        bfcl = task.load(path=str(folder / "BFCL_v4_simple_python.json"))
        bfcl = bfcl.select(range(min(args.bfcl_examples, len(bfcl))))
        greedy = evaluate(model, tokenizer, task, bfcl, args.eval_batch, length)
        result["bfcl_simple_python"] = {
            "rows": len(bfcl),
            "decoding": "greedy",
            **score_summary(greedy),
        }
    elif args.bfcl_examples:
        result["bfcl_simple_python"] = {"unavailable": "bfcl-eval is not installed"}
    return result
