"""ALiBi attention.

For head h, query i and key j (Press, Smith & Lewis 2022, eq. 1 and footnote):

    S_h[i, j] = q_i . k_j / sqrt(d)  -  m_h * |i' - j|       i' = i + (k_len - q_len)
    A_h[i, :] = softmax(S_h[i, :])
    out_h[i]  = sum_j A_h[i, j] v_j

The bias is added *after* the 1/sqrt(d) scaling and is not scaled by it (Falcon's
Hugging Face code scales it; that is a different model). There is no position
embedding anywhere else: with m_h = 0 this is plain scaled dot-product attention.

``naive_attention`` is the specification, the formula line for line with the bias
materialised; every faster path is tested against it.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ._backend import as_like, cast, float_dtypes, is_tensor, repeat_heads, softmax
from .bias import alibi_bias, check_lengths, check_slopes

IMPLS = ("auto", "naive", "sdpa", "strided", "flex")
# below this many keys the (H, i, j) bias is small and FlexAttention's compilation outweighs it
FUSED_MIN_LEN = 512


class Dims(NamedTuple):
    n_heads: int  # H: query heads
    n_kv_heads: int  # H_kv: key/value heads (H for MHA, 1 for MQA, in between for GQA)
    q_len: int
    k_len: int
    head_dim: int


def naive_attention(q, k, v, bias, scale: float):
    """softmax(q k^T * scale + bias) v, returning (output, weights). The specification.

    q (..., H, i, d), k (..., H, j, d), v (..., H, j, d_v), bias (H, i, j).
    """
    scores = (q @ k.swapaxes(-1, -2)) * scale  # (..., H, i, j)
    # ALiBi: the bias goes in after the scaling, unscaled
    scores = scores + bias
    weights = softmax(scores)  # rows sum to 1 over the keys j
    return weights @ v, weights  # (..., H, i, d_v), (..., H, i, j)


def _sdpa_attention(q, k, v, bias, scale: float, groups: int):
    """torch's fused scaled_dot_product_attention with the bias as a float mask.

    The -inf of a causal mask is already folded into the bias: SDPA refuses a float
    attn_mask together with is_causal=True. The bias gets q's rank, (1, H, i, j) for
    (B, H, i, d) queries: given as (H, i, j), torch 2.13's CPU kernel falls back to its
    unfused path, several times slower (figures: the README, "What ALiBi costs").
    """
    import torch.nn.functional as F

    bias = bias.to(q.dtype).reshape((1,) * (q.ndim - 3) + tuple(bias.shape))  # (1.., H, i, j)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale, enable_gqa=groups > 1)


def flex_available() -> bool:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def _as_arrays(q, k, v):
    kinds = [is_tensor(x) for x in (q, k, v)]
    if any(kinds) and not all(kinds):
        raise ValueError("q, k and v must be all torch tensors or all NumPy arrays, got a mix")
    if all(kinds):
        if len({x.device for x in (q, k, v)}) > 1 or len({x.dtype for x in (q, k, v)}) > 1:
            raise ValueError(
                "q, k and v must share device and dtype, got "
                + ", ".join(f"{n}: {x.dtype} on {x.device}" for n, x in zip("qkv", (q, k, v), strict=True))
            )
        if not q.is_floating_point():
            raise ValueError(f"q, k and v must be floating point tensors, got {q.dtype}")
        return q, k, v
    q, k, v = (np.asarray(x) for x in (q, k, v))
    dtype = np.result_type(q, k, v)
    if dtype.kind not in "fiu":
        raise ValueError(f"q, k and v must hold real numbers, got dtype {dtype}")
    dtype = dtype if dtype.kind == "f" else np.dtype(np.float64)
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def check_shapes(q, k, v, slopes, causal: bool) -> Dims:
    """The dimensions of a valid call, or a ValueError that says what was expected and what came."""
    shapes = {n: tuple(x.shape) for n, x in zip("qkv", (q, k, v), strict=True)}
    if q.ndim < 3 or not (q.ndim == k.ndim == v.ndim):
        raise ValueError(
            "q, k and v must have the same rank >= 3, shaped (..., H, q_len, d), "
            f"(..., H_kv, k_len, d), (..., H_kv, k_len, d_v); got {shapes}"
        )
    if not (q.shape[:-3] == k.shape[:-3] == v.shape[:-3]):
        raise ValueError(f"q, k and v must have the same leading (batch) dimensions, got {shapes}")
    n_heads, q_len, head_dim = q.shape[-3:]
    n_kv_heads, k_len = k.shape[-3:-1]
    if k.shape[-1] != head_dim:
        raise ValueError(f"q and k must have the same head dimension d, got q {shapes['q']} and k {shapes['k']}")
    if v.shape[-3:-1] != k.shape[-3:-1]:
        raise ValueError(f"k and v must have the same heads and length, got k {shapes['k']} and v {shapes['v']}")
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"the {n_heads} query heads must be a multiple of the {n_kv_heads} key/value heads")
    if slopes.shape[0] != n_heads:
        raise ValueError(f"need one slope per query head: {n_heads} heads, got {slopes.shape[0]} slopes")
    check_lengths(q_len, k_len, causal)
    return Dims(n_heads, n_kv_heads, q_len, k_len, head_dim)


def choose_impl(impl: str, q, dims: Dims, return_weights: bool) -> str:
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; expected one of {', '.join(IMPLS)}")
    if impl not in ("naive", "auto") and (return_weights or not is_tensor(q)):
        raise ValueError(f"impl={impl!r} needs torch tensors and cannot return the weights; use impl='naive'")
    if impl == "flex" and not flex_available():
        raise ValueError("impl='flex' needs torch >= 2.5 (torch.nn.attention.flex_attention)")
    if impl == "auto":
        if not is_tensor(q) or return_weights:
            return "naive"
        if q.device.type != "cuda":
            return "strided"
        return "flex" if dims.k_len >= FUSED_MIN_LEN and flex_available() else "sdpa"
    return impl


def alibi_attention(
    q, k, v, slopes, *, causal: bool = False, scale: float | None = None,
    return_weights: bool = False, impl: str = "auto",
):
    """ALiBi attention; returns the output (..., H, q_len, d_v), and the weights if asked.

    q (..., H, q_len, d); k, v (..., H_kv, k_len, d) with H a multiple of H_kv
    (query head h reads key/value head h // (H / H_kv)); slopes (H,). The queries
    are the last q_len positions of the keys, so q_len = 1 against a KV cache is
    one decoding step. NumPy in gives NumPy out; tensors give tensors on the same
    device and dtype, differentiable. ``scale`` defaults to 1/sqrt(d).

    impl: "naive" (``naive_attention``, the specification), "sdpa" (torch's fused kernel
    with the bias materialised as a float mask), "strided" (the same kernel, the bias a
    strided view of one row per head, see ``alibi_ref.strided``; the CPU path), "flex"
    (FlexAttention compiled, the bias computed inside the kernel; the CUDA path), or "auto":
    naive for NumPy or the weights, strided on the CPU, and on CUDA flex from FUSED_MIN_LEN
    keys, sdpa below. strided and flex never build an (H, N, N) tensor. On a CPU, call
    ``alibi_ref.flush_denormals()`` once first: see ``alibi_ref.denormals`` for why ALiBi needs it
    to run at full speed.
    """
    q, k, v = _as_arrays(q, k, v)
    slopes = check_slopes(slopes)
    dims = check_shapes(q, k, v, slopes, causal)
    scale = 1.0 / math.sqrt(dims.head_dim) if scale is None else float(scale)
    groups = dims.n_heads // dims.n_kv_heads
    out_dtype, work = float_dtypes(q)
    slopes = as_like(slopes, q, work)
    chosen = choose_impl(impl, q, dims, return_weights)
    if chosen == "flex":
        from .flex import flex_alibi_attention

        return flex_alibi_attention(q, k, v, slopes, scale, causal, groups)
    if chosen == "strided":
        from .strided import strided_alibi_attention

        return strided_alibi_attention(q, k, v, slopes, scale, causal, groups)
    bias = alibi_bias(slopes, dims.q_len, dims.k_len, causal=causal)  # (H, i, j)
    if chosen == "sdpa":
        return _sdpa_attention(q, k, v, bias, scale, groups)
    # 16-bit inputs are computed in float32 and rounded once at the end
    k, v = (repeat_heads(cast(x, work), groups) for x in (k, v))  # (..., H, j, d)
    out, weights = naive_attention(cast(q, work), k, v, bias, scale)
    out = cast(out, out_dtype)
    return (out, cast(weights, out_dtype)) if return_weights else out

