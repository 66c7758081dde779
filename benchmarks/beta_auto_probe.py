"""Benchmark: the automatic beta's probe, four backward passes against three, side by side.

The four-pass probe (commit `FOUR_PASSES`: R, U, U + R and P, the cross term <g_U, g_R> from
|g_U + g_R|^2) against today's three (R, U, P; g_R kept parameter by parameter until U's pass
takes its dot with it). Both versions' methods are bound to one trainer in one process (the
old module read from git history), on the tiny model's probed step of `tests/test_beta_auto.py`
(`one_probed_step`: 8 rows, 8 new tokens): the same micro-batch and reference, the versions
alternated `--repeats` times; the median time per micro-batch probe, their ratio, and the six
sums each version added (equal but the cross term, which the three-pass version takes without
the cancellation).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/beta_auto_probe.py --repeats 15
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
FOUR_PASSES = "63be657"  # the last commit whose probe ran the U + R pass


def four_pass_mixin(folder: Path) -> type:
    """`AutoBetaMixin` as it was at `FOUR_PASSES`, loaded from git history as its own module."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{FOUR_PASSES}:src/mrtpo/trainer_beta_auto.py"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    path = folder / "four_pass_trainer_beta_auto.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("four_pass_trainer_beta_auto", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.AutoBetaMixin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "tests"))
    import test_beta_auto

    from mrtpo.trainer_beta_auto import SUMS, AutoBetaMixin

    with tempfile.TemporaryDirectory() as folder:
        versions = {"four passes": four_pass_mixin(Path(folder)), "three passes": AutoBetaMixin}
        trainer = test_beta_auto.one_probed_step(Path(folder) / "run")
    inputs, uniform, reallocation, summed, _ = trainer.probes[1]
    saved = {i: ref.clone() for i, ref in trainer._auto_reference.items()}
    trainer._position_in_step = (trainer.state.global_step, 1)  # a later micro-batch: paired
    seconds: dict[str, list[float]] = {name: [] for name in versions}
    added: dict[str, list[float]] = {}
    for repeat in range(args.repeats):
        order = list(versions) if repeat % 2 == 0 else list(reversed(versions))
        for name in order:
            trainer._auto_reference = {i: ref.clone() for i, ref in saved.items()}
            trainer._auto_sums = torch.zeros(len(SUMS), dtype=torch.float64)
            trainer._backward_passes = types.MethodType(versions[name]._backward_passes, trainer)
            probe = types.MethodType(versions[name]._probe_gradients, trainer)
            started = time.perf_counter()
            probe(inputs, uniform, reallocation, summed)
            seconds[name].append(time.perf_counter() - started)
            added[name] = trainer._auto_sums.tolist()
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    for name, median in medians.items():
        print(f"{name:13s} median {median * 1000:.1f} ms per micro-batch probe")
    print(f"three / four: {medians['three passes'] / medians['four passes']:.3f}")
    for i, name in enumerate(SUMS):
        four, three = added["four passes"][i], added["three passes"][i]
        print(f"{name:17s} four {four:.10g}  three {three:.10g}  relative {abs(three - four) / abs(four):.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
