"""Which path ``alibi_attention(impl="auto")`` takes: ``choose_impl``, with every size it decides by named here.

The rule, for torch tensors (JAX arrays: ``_choose_jax``; NumPy and the weights: naive):

- CPU: the fused kernel where it is built and takes the call (``_fused_takes``); else SDPA with the bias for
  short calls, a bias cached between calls or one cheaper than the strided path's copies; else strided.
- CUDA: FlexAttention from FLEX_MIN_KEYS keys and more than FEW_QUERIES queries; else SDPA with the bias
  (padded batches and windows included, until flex's are timed on a GPU).

Each threshold cites the measurement it comes from (docs/performance.md). Once chosen, the strided path still
shapes its own calls (``strided``: its rows per call; ``reach``: the keys each head can see).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ._backend import grad_taken, is_jax, is_tensor
from .bias_cache import cacheable, fits_in_cache

IMPLS = ("auto", "naive", "sdpa", "strided", "flex", "fused")
# below this many keys the (H, i, j) bias is small and FlexAttention's compilation outweighs it
FLEX_MIN_KEYS = 512
# on the CPU, below this many keys the materialised bias is small and SDPA with it beats the strided
# path, forward and backward (docs/performance.md, "Which path auto takes on the CPU", N = 64)
STRIDED_MIN_KEYS = 128
# on the CPU, from this many keys the fused kernel beats SDPA with the cached bias forward too; below it, only
# where a gradient is taken (docs/performance.md, "The fused CPU kernel")
FUSED_CPU_MIN_KEYS = 64
# in bfloat16 (forward only) with its products (brgemm) the kernel packs k and v at every call, which short
# sequences pay for: from this many keys it beats SDPA with the cached bias (at 128 the two trade places by case; at
# 64 the bias is faster). Without them (AVX2) it widens blocks to float32 as it reads them, and beat SDPA with the
# bias at every size measured, decoding steps included (docs/performance.md, "AVX2 without AVX-512")
FUSED_BF16_MIN_KEYS = 256
# on the CPU, a bias of up to this many numbers (H i j) that is cached between calls (``alibi_ref.bias_cache``) costs
# SDPA less to read than the strided path's copies of q and the output, forward and backward (docs/performance.md:
# the cached bias)
CACHED_BIAS_NUMBERS = 1 << 21
# up to this many queries (a decoding step, a few speculative tokens) the bias is a few rows and SDPA with
# it beats the strided path's fixed costs on the CPU and FlexAttention on CUDA (docs/performance.md: decoding on
# the CPU; "CUDA": one query against 16384 keys on an H100)
FEW_QUERIES = 4


class Dims(NamedTuple):
    n_heads: int  # H: query heads
    n_kv_heads: int  # H_kv: key/value heads (H for MHA, 1 for MQA, in between for GQA)
    q_len: int
    k_len: int
    head_dim: int


def flex_available() -> bool:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def choose_impl(impl: str, q, dims: Dims, return_weights: bool, positional: bool = False,
                dropout: bool = False, v=None, causal: bool = False, window: bool = False,
                slopes=None, grad: bool | None = None) -> str:
    """The path to run. ``positional``: the call has key padding or explicit positions (the strided path takes
    each batch row's plain span, ``alibi_ref.padded``; ``alibi_attention`` says where flex does). ``dropout``:
    attention dropout, which FlexAttention does not do. ``window``: a sliding window. ``slopes``: the call's, to
    ask whether its (H, i, j) bias would be cached between calls (``bias_is_cached``; asked only where it decides).
    ``grad``: whether a gradient will be taken through the call (None: asked of q and v)."""
    check_impl(impl, dropout)
    if is_jax(q):
        return _choose_jax(impl, q, q if v is None else v, return_weights)
    if impl not in ("naive", "auto") and (return_weights or not is_tensor(q)):
        raise ValueError(f"impl={impl!r} needs torch tensors and cannot return the weights; use impl='naive'")
    if impl == "flex" and not flex_available():
        raise ValueError("impl='flex' needs torch >= 2.5 (torch.nn.attention.flex_attention)")
    if impl != "auto":
        return impl
    if not is_tensor(q) or return_weights:
        return "naive"
    if window and dims.q_len > dims.k_len:
        return "sdpa"  # a window can leave the first queries no key: sdpa zeroes their rows (strided refuses them)
    if q.device.type != "cuda":
        if _fused_takes(q, v, dims, positional, dropout, grad):
            return "fused"
        bias_cached = slopes is not None and not positional and not window and bias_is_cached(slopes, dims)
        if dims.k_len < STRIDED_MIN_KEYS or bias_cached:
            return "sdpa"
        # with padding each batch row has its own bias: no bias shared by the batch to beat strided's copies of q
        cheaper = _bias_is_cheaper(q, dims, causal) if not positional else dims.q_len <= FEW_QUERIES
        return "sdpa" if cheaper else "strided"
    if positional or window:
        # flex takes them, but builds a padded batch's block mask at every call (no faster than the bias at 4096
        # keys on an H100 with torch's builder; its own builder since is untimed on a GPU: docs/performance.md,
        # "CUDA"), and with a window it has not been timed on a GPU
        return "sdpa"
    long_enough = dims.k_len >= FLEX_MIN_KEYS and dims.q_len > FEW_QUERIES
    return "flex" if long_enough and flex_available() and not dropout else "sdpa"


def _fused_takes(q, v, dims: Dims, positional: bool, dropout: bool, grad: bool | None) -> bool:
    """Whether "auto" takes the fused CPU kernel: where it is built (``alibi_ref.fused``) and takes the call;
    from FUSED_CPU_MIN_KEYS keys, and below that where a gradient will be taken (forward+backward it ran faster
    than plain SDPA there, forward alone slower: docs/performance.md); bfloat16 without a gradient from
    FUSED_BF16_MIN_KEYS with its products, at any length without them; not for a few queries (a decoding step),
    where the bias's few rows cost less than the kernel's blocks, but for bfloat16 without its products."""
    from . import fused

    v = q if v is None else v
    if grad is None:
        grad = grad_taken(q, v)
    if fused.why_not_fused(q, v, float(dropout), positional, grad=grad) is not None or not fused.available():
        return False
    if q.dtype == fused.torch.bfloat16 and fused.bfloat16_as_float32():
        return True
    min_keys = FUSED_BF16_MIN_KEYS if q.dtype == fused.torch.bfloat16 else FUSED_CPU_MIN_KEYS
    return dims.q_len > FEW_QUERIES and (dims.k_len >= min_keys or grad)


def check_impl(impl: str, dropout: bool = False) -> None:
    """A ValueError for an unknown path, or for flex with attention dropout, which it does not do."""
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; expected one of {', '.join(IMPLS)}")
    if dropout and impl in ("flex", "fused"):
        raise ValueError(f"impl={impl!r} has no attention dropout; use 'sdpa', 'strided' or 'naive'")


def bias_is_cached(slopes, dims: Dims) -> bool:
    """Whether the call's (H, i, j) bias, up to CACHED_BIAS_NUMBERS numbers, would be cached between calls."""
    numbers = dims.n_heads * dims.q_len * dims.k_len
    return numbers <= CACHED_BIAS_NUMBERS and cacheable(slopes) and fits_in_cache(numbers * slopes.element_size())


def _bias_is_cheaper(q, dims: Dims, causal: bool) -> bool:
    """A few queries (up to FEW_QUERIES: a decoding step) or symmetric attention over a batch: the
    materialised bias (H i j numbers, built once for the batch) costs less than the strided path,
    whose reversal copies q and the output (2 B H i d) and whose Python is a fixed cost per call.

    The rule, k_len <= B d / 4, picked the faster of the two in every float32 case measured on the
    CPU (B = 2 to 32, 128 to 2048 keys, d = 64) and in all but three in bfloat16, at most 2% slower
    there (figures: docs/performance.md). Causal calls of more queries keep the strided
    path: it skips the keys ahead and at these sizes ran faster than plain causal SDPA.
    """
    if dims.q_len <= FEW_QUERIES:
        return True
    batch = math.prod(q.shape[:-3])
    return not causal and 4 * dims.k_len <= batch * dims.head_dim


def _choose_jax(impl: str, q, v, return_weights: bool) -> str:
    """JAX arrays: "sdpa" is ``jax.nn.dot_product_attention``, the default where it fits.

    It computes the scores and softmax in float32 whatever comes in, and needs v's head
    dimension equal to q's; "auto" takes the naive path for float64 (which it would round)
    or another d_v, and for the weights.
    """
    if impl in ("strided", "flex"):
        raise ValueError(f"impl={impl!r} is a torch path; JAX arrays take 'sdpa' (jax.nn.dot_product_attention) "
                         "or 'naive'")
    sdpa_can_run = v.shape[-1] == q.shape[-1] and not return_weights
    if impl == "sdpa" and not sdpa_can_run:
        raise ValueError("impl='sdpa' on JAX arrays needs v's head dimension equal to q's and cannot return the "
                         f"weights (got q {tuple(q.shape)}, v {tuple(v.shape)}); use impl='naive'")
    if impl == "auto":
        import jax.numpy as jnp

        return "sdpa" if sdpa_can_run and jnp.finfo(q.dtype).bits <= 32 else "naive"
    return impl
