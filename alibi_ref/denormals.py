"""Subnormal numbers, and why ALiBi on a CPU wants them flushed to zero.

ALiBi puts far keys hundreds of logits below a row's best key. Inside a fused attention
kernel their terms (e^(-m |i - j|) times a value, rescaled block after block as the running
maximum grows) sink below float32's smallest normal number, 1.2e-38. x86 cores compute
with such subnormal numbers in microcode, many times slower: on a CPU the default path
runs a good deal slower with them than flushed (measured: docs/performance.md, "Subnormal numbers").

Flushing them to zero changes no weight that float32 can tell from zero next to the row's
best key (1e-38 against 1). PyTorch's switch for it, ``torch.set_flush_denormal``, sets the
flag of the calling thread only, while the kernels run on OpenMP's worker threads, which
copied the flag when they were started. So ``flush_denormals`` sets it, then asks OpenMP to
release its workers (``omp_pause_resource_all``, OpenMP 5.0): the next parallel region starts
new ones, and they inherit the flag.
"""

from __future__ import annotations

import ctypes
import os

_OPENMP_NAMES = ("libgomp", "libiomp5", "libomp")
_OMP_PAUSE_HARD = 2


def flush_denormals() -> bool:
    """Flush subnormal floats to zero in this process, on every thread torch computes with.

    Returns False (and changes nothing) where the CPU cannot. Call it once, at start-up.
    """
    import torch

    if not torch.set_flush_denormal(True):
        return False
    openmp = _loaded_openmp()
    if openmp is not None:
        ctypes.CDLL(openmp).omp_pause_resource_all(_OMP_PAUSE_HARD)
    return True


def subnormals_flushed() -> bool:
    """Whether this thread flushes subnormal floats to zero (after ``flush_denormals``, or torch's own switch):
    half of float32's smallest normal number comes out 0 where it does."""
    import torch

    smallest_normal = torch.tensor(torch.finfo(torch.float32).tiny)
    return bool(smallest_normal / 2 == 0)


def _loaded_openmp() -> str | None:
    """The OpenMP runtime torch loaded, from this process's memory map (None if there is none)."""
    try:
        with open(f"/proc/{os.getpid()}/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:  # not Linux
        return None
    return next((p for p in sorted(paths) if os.path.basename(p).startswith(_OPENMP_NAMES)), None)
