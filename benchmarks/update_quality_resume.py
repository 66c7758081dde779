"""The update-quality benchmark's resuming (`update_quality_passes.run_lane`): the settings a
sample's passes must share, kept with each reference part and checked before a pass resumes
from it, the code's commit and digest, the machine."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import convergence_runs  # a sibling script: the machine
from update_quality_states import ALL_STATES, CHECKPOINTS


def sample_path(lane: Any, batch: int) -> Path:
    """A lane's (`update_quality_passes.Lane`) sample file of mini-batch `batch`."""
    return lane.folder / "samples" / f"batch{batch:03d}.json"


# ----------------------------------------------------------------------------- resuming

# The settings a sample's passes must share, kept in each reference part (and the total): the
# code, the policy, and the flags that make the computation (precision, storage of the
# references in the measure pass, layout, lanes). A resume with another value is refused. The
# threads and the machine are not among them: they change only the rounding, and a lane may
# resume on another machine. The sample files are checked by their digests, per mini-batch.
FLAGS = {"bf16": "--bf16", "store_dtype": "--store_dtype", "lanes": "--lanes",
         "rows_per_forward": "--rows_per_forward", "recompute": "--recompute",
         "folds": "--folds", "reward_references": "--reward_references"}  # fmt: skip
# A setting's value in a part made before the setting existed: what those parts did.
BEFORE = {"reward_references": "per_fold"}


def reference_settings(lane: Any, commit: str | None, digest: str | None) -> dict[str, Any]:
    """What a sample's reference parts must share. The policy: by its weights' `digest` where
    it is a built folder (the cold start, a training run's checkpoint), else its name or path."""
    policy = digest or lane.model_path or ALL_STATES[lane.state_name].model
    flags = {name: getattr(lane, name) for name in FLAGS}
    flags["folds"] = lane.fold_count  # the folds the sums are kept in
    return {"commit": commit, "code_sha256": code_digest(), "policy": policy, **flags}


def benchmark_files() -> list[Path]:
    """The benchmark's own sources: `update_quality.py`, its modules and the statistics."""
    here = Path(__file__).resolve().parent
    return [*sorted(here.glob("update_quality*.py")), here / "paired_stats.py"]


def code_digest() -> str:
    """sha256 of the benchmark's sources and the mrtpo package's: the code, committed or not."""
    import hashlib

    import mrtpo

    package = Path(mrtpo.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in benchmark_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check_part(part: Mapping[str, Any], path: Path, lane: Any, settings: Mapping[str, Any]) -> None:
    """Refuse a reference part made with other settings than `settings`, or from another
    sample file than the one now in the folder, naming the setting and how to go on."""
    checkpoints = lane.folder / CHECKPOINTS
    redo = f"or delete {checkpoints} to redo the reference pass"
    stored = part.get("settings")
    if stored is None:
        raise SystemExit(f"{path} was written before the settings were kept with it: {redo[3:]}")
    for name, new in settings.items():
        old = stored.get(name, BEFORE.get(name))
        if old == new:
            continue
        if name in FLAGS:
            flag = FLAGS[name]
            same = f"pass {flag}" if old is True else f"pass {flag} {old}"
            how = f"leave out {flag}" if old in (False, None) else same
            how += " as the reference pass did"
        elif name == "commit":
            how = f"run from a checkout of {old} (git worktree add --detach DIR {old})"
        elif name == "code_sha256":
            how = "run with the code as it was (src/mrtpo or the benchmark changed, uncommitted)"
        else:
            how = f"run with the policy the reference pass used ({old})"
        raise SystemExit(
            f"{path}: made with {name} = {old!r}, this run has {name} = {new!r}: to resume, "
            f"{how}; {redo} with {name} = {new!r}"
        )
    for batch in part["batches"]:
        sample = sample_path(lane, batch)
        now = file_digest(sample) if sample.is_file() else "missing"
        if part["samples"].get(batch) != now:
            raise SystemExit(
                f"{path}: mini-batch {batch}'s sample {sample} is not the one its reference part "
                f"was made from (sha256 {part['samples'].get(batch)}, now {now}): restore that "
                f"file, {redo}"
            )


def engine() -> dict[str, Any]:
    """The commit of the code measuring (this benchmark's checkout), and whether its src/ or the
    benchmark's files differed from it: a measurement runs on one engine."""
    import subprocess

    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "../src", *(p.name for p in benchmark_files())],
            cwd=here, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "uncommitted_changes": None}
    return {"commit": commit, "uncommitted_changes": bool(changed)}


def machine(lane: Any) -> dict[str, Any]:
    import torch

    return convergence_runs.machine(
        argparse.Namespace(threads=torch.get_num_threads(), device=lane.device)
    )
