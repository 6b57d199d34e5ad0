"""A cache of biases between calls: a training loop asks for the same one at every layer and step.

The bias (or the strided path's one row) depends on the slopes' values and the lengths alone, so
``cached_bias`` hands a CPU call the tensor an earlier call with equal slopes and arguments built
(x-transformers caches its bias between calls the same way, and BLOOM builds one per forward pass
for all its layers). Building one is cheap; what costs is that a bias built just before the
kernel is memory one core has just written and torch's kernel then reads from every core, which
on the CPU made the kernel itself measurably slower (figures: docs/performance.md).

The key is the slopes' values, so slopes that change (learned ones, after an optimizer step) miss
and are built anew. Cached are only tensors nothing changes: built where no gradient is taken, outside
inference mode even within it (so that a later training call may save one for its backward pass),
and never handed to the caller of a public function. CUDA calls build theirs: reading the slopes'
values would wait for the device. The cache holds at most ``CACHE_BYTES``, least recently used out first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ._backend import grad_taken, is_tensor

CACHE_BYTES = 32 << 20  # in all; one tensor larger than a quarter of it is built and not cached
_cache: OrderedDict = OrderedDict()
_cached_bytes = 0
_lock = threading.Lock()


def cached_bias(build, slopes, *args):
    """``build(slopes, *args)``, or the tensor an earlier call with equal slopes values and ``args`` built.
    ``build`` must return a new tensor that depends on nothing else, and the caller must not write to it."""
    if not cacheable(slopes):
        return build(slopes, *args)
    import torch

    key = (build, tuple(slopes.tolist()), slopes.dtype, *args)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    with torch.inference_mode(False):  # a tensor made in inference mode could not be saved for a backward pass
        made = build(slopes, *args)
    _store(key, made)
    return made


def cacheable(slopes) -> bool:
    """Whether what is built from these slopes here may be cached: torch's, on the CPU (NumPy builds fast, JAX
    caches its own under jit, and reading a CUDA tensor's values would wait for the device), where no gradient
    is taken, outside torch.compile (the lookup reads the slopes' values)."""
    if not is_tensor(slopes):
        return False
    import torch

    return (slopes.device.type == "cpu" and not grad_taken(slopes)
            and not torch.compiler.is_compiling())


def fits_in_cache(n_bytes: int) -> bool:
    """Whether a tensor of ``n_bytes`` is small enough to cache."""
    return n_bytes <= CACHE_BYTES // 4


def _store(key, made) -> None:
    global _cached_bytes
    if not fits_in_cache(made.nbytes):
        return
    with _lock:
        if key in _cache:
            return
        _cache[key] = made
        _cached_bytes += made.nbytes
        while _cached_bytes > CACHE_BYTES:
            _, out = _cache.popitem(last=False)
            _cached_bytes -= out.nbytes


def clear() -> None:
    """Empty the cache (tests; a program that wants the memory back)."""
    global _cached_bytes
    with _lock:
        _cache.clear()
        _cached_bytes = 0
