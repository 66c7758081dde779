"""This process's resident memory, read from Linux's `/proc/self/status`: the current size
(`VmRSS`), the peak since the start or the last reset (`VmHWM`), and a checked reset of the peak.

CPU tensors are malloc'd memory, so tracemalloc sees none of it; the kernel's counters see all
of it. The benchmarks that report a peak (the cost of `mrtpo_beta="auto"`, replay, the shared
prompt forward) reset the peak right before what they measure and read it right after.

A reset is written as "5" into `/proc/self/clear_refs`. Some kernels refuse the write, and one
(a CI machine) accepted it and kept the old peak, so a reset is checked by reading the peak back:
right after a real reset it is the current size, give or take what the process grew meanwhile.
"""

from __future__ import annotations

import gc

# What the process may grow between the write and the two reads (kB).
RESET_SLACK_KB = 16 * 1024


def status_kb(field: str) -> int | None:
    """One `kB` field of /proc/self/status ("VmHWM", "VmRSS"); None where it is not there."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak() -> bool:
    """Reset this process's peak resident size; False where the kernel refuses the write or
    accepts it and keeps the old peak (checked by reading the peak back)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    peak, current = status_kb("VmHWM"), status_kb("VmRSS")
    return peak is not None and current is not None and peak <= current + RESET_SLACK_KB


def peak_gb() -> float | None:
    """The peak resident size since the start or the last reset, in GB (1e9 bytes); None where
    /proc is not there."""
    peak = status_kb("VmHWM")
    return None if peak is None else peak * 1024 / 1e9


def peak_above_start_mib(call) -> float:
    """Run `call()` and return its peak resident memory above the size just before it, in MiB.
    Raises where the peak cannot be reset: a figure that might be an earlier call's peak is
    worse than none. Garbage is collected first: a collection that the call's allocations
    trigger would otherwise free earlier objects during the call and hide its peak. Anything
    else that shrinks the process meanwhile hides it too: on a machine near full, the kernel
    drops file-backed pages (mapped model files) from the resident size, so measure with
    memory to spare."""
    gc.collect()
    before = status_kb("VmRSS")
    if before is None or not reset_peak():
        raise RuntimeError(
            "cannot measure a peak here: /proc/self/clear_refs refused the reset or kept the old "
            "peak (VmHWM), or /proc/self/status is not there"
        )
    call()
    return (status_kb("VmHWM") - before) / 1024
