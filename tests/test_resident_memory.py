"""The benchmarks' peak resident memory (benchmarks/resident_memory.py): a reset is checked, a
peak is a call's own, and a kernel that keeps the old peak gives no figure rather than a wrong one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import resident_memory  # noqa: E402


@pytest.fixture
def resettable() -> None:
    if not resident_memory.reset_peak():
        pytest.skip("this kernel does not allow resetting the peak resident set size")


def test_a_reset_brings_the_peak_back_to_the_current_size(resettable):
    """A large allocation lifts the kernel's peak (VmHWM); once it is freed, a reset brings the
    peak back down, so a trainer's peak is its own, not the largest of the ones before it.
    Measured against the resident size, not an earlier peak: in a long test process the
    allocator may hand back memory already resident."""
    import torch

    block = torch.ones(100_000_000)  # 0.4 GB, touched
    block += 1
    resident_with_block = resident_memory.status_kb("VmRSS") * 1024 / 1e9
    assert resident_memory.peak_gb() >= resident_with_block
    del block
    resident_without = resident_memory.status_kb("VmRSS") * 1024 / 1e9
    if resident_with_block - resident_without < 0.3:
        pytest.skip("the allocator kept the freed block resident")
    assert resident_memory.reset_peak()
    assert resident_memory.peak_gb() < resident_with_block - 0.3


def test_a_reset_the_kernel_ignores_is_reported_as_not_done(resettable, monkeypatch):
    """A kernel that accepts the write and keeps the old peak (a CI machine did): the reset says
    False, and a peak measurement raises rather than report an earlier call's peak."""
    sizes = {"VmHWM": 1_772_000, "VmRSS": 900_000}  # kB: the peak kept, 0.87 GB above now
    monkeypatch.setattr(resident_memory, "status_kb", sizes.get)
    assert resident_memory.reset_peak() is False
    with pytest.raises(RuntimeError, match="kept the old peak"):
        resident_memory.peak_above_start_mib(lambda: None)
    sizes["VmHWM"] = 905_000  # a peak within a few MB of the current size: a real reset
    assert resident_memory.reset_peak() is True


def _peaks_in_a_fresh_process(code: str) -> list[float]:
    """Run `code` (which prints peaks, one per line) in a new interpreter beside the
    benchmarks, as the benchmarks measure in fresh children: in a long test process the
    allocator may hand back memory already resident, and a call's peak then reads 0 (seen in
    `make test`'s workers, never alone)."""
    import subprocess

    prelude = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\nimport resident_memory\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, check=True
    )
    return [float(line) for line in done.stdout.split()]


def test_a_calls_peak_above_its_start_counts_what_it_touched(resettable):
    """A call that touches 0.4 GB and frees it: its peak above the start is about 381 MiB
    (1e8 float32), whatever the process held before; a call that touches nothing, near 0."""
    code = """
import torch

def touch():
    block = torch.ones(100_000_000)
    block += 1

print(resident_memory.peak_above_start_mib(touch))
print(resident_memory.peak_above_start_mib(lambda: None))
"""
    touched, nothing = _peaks_in_a_fresh_process(code)
    assert 370 <= touched <= 500
    assert nothing < 20


def test_garbage_left_by_earlier_work_does_not_hide_a_calls_peak(resettable):
    """0.6 GB held only by a reference cycle (earlier work's garbage), collected during the call
    (as a collection its allocations trigger would): the call's 381 MiB is still measured,
    since the garbage is collected before the start is read (without that: 0 MiB)."""
    code = """
import gc

import torch

class Holder:
    pass

garbage = Holder()
garbage.cycle, garbage.block = garbage, torch.ones(150_000_000)
del garbage

def collect_then_touch():
    gc.collect()
    block = torch.ones(100_000_000)
    block += 1

print(resident_memory.peak_above_start_mib(collect_then_touch))
"""
    (peak,) = _peaks_in_a_fresh_process(code)
    assert 370 <= peak <= 500


def test_the_shared_prompt_forward_benchmark_measures_each_path_in_a_fresh_process(resettable):
    """The benchmark's memory children (one layer, tiny shapes): each path's peak is positive
    and below what the model's weights and one backward could take at most."""
    import shared_prompt_forward

    argv = ["--layers", "1", "--groups", "1", "--completions", "2"]
    argv += ["--prompt-length", "16", "--completion-length", "4"]
    peaks = {path: shared_prompt_forward.peak_memory(path, argv) for path in ("per-row", "shared")}
    for path, peak in peaks.items():
        assert 1 < peak < 1500, (path, peak)
