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
import sys
from typing import NamedTuple

import numpy as np

from ._backend import as_like, cast, float_dtypes, grad_taken, is_jax, is_tensor, repeat_heads, softmax, xp
from .bias import alibi_bias, check_lengths, check_slopes, check_window, positional_bias
from .bias_cache import cached_bias
from .dispatch import Dims, choose_impl


def naive_attention(q, k, v, bias, scale: float, dropout_p: float = 0.0):
    """softmax(q k^T * scale + bias) v, returning (output, weights). The specification.

    q (..., H, i, d), k (..., H, j, d), v (..., H, j, d_v), bias (H, i, j) or (..., H, i, j).
    ``dropout_p`` (tensors only): dropout on the weights, as SDPA applies it.
    """
    scores = (q @ k.swapaxes(-1, -2)) * scale  # (..., H, i, j)
    # ALiBi: the bias goes in after the scaling, unscaled
    scores = scores + bias
    weights = softmax(scores)  # rows sum to 1 over the keys j
    if dropout_p:
        import torch.nn.functional as F

        weights = F.dropout(weights, dropout_p)
    return weights @ v, weights  # (..., H, i, d_v), (..., H, i, j)


def _jax_sdpa_attention(q, k, v, bias, scale: float):
    """``jax.nn.dot_product_attention`` (XLA, or cuDNN's fused kernel where JAX picks it) with the bias.

    It takes (B, N, heads, d), heads before the head dimension, and GQA as it comes; the bias
    goes in as (B or 1, H, i, j) in q's dtype.
    """
    import jax

    lead = q.shape[:-3]
    q, k, v = (x.reshape(-1, *x.shape[-3:]).swapaxes(-3, -2) for x in (q, k, v))  # (B, n, H, d)
    bias = bias.reshape(-1, *bias.shape[-3:]).astype(q.dtype)  # (B or 1, H, i, j)
    out = jax.nn.dot_product_attention(q, k, v, bias=bias, scale=scale).swapaxes(-3, -2)  # (B, H, i, d_v)
    return out.reshape(*lead, *out.shape[-3:])


def _sdpa_attention(q, k, v, bias, scale: float, groups: int, dropout_p: float = 0.0):
    """torch's fused scaled_dot_product_attention with the bias as a float mask.

    The -inf of a causal mask is already folded into the bias: SDPA refuses a float
    attn_mask together with is_causal=True. The bias gets q's rank, (1, H, i, j) for
    (B, H, i, d) queries: given as (H, i, j), torch 2.13's CPU kernel falls back to its
    unfused path, several times slower (figures: docs/performance.md).
    """
    import torch.nn.functional as F

    if bias.ndim < q.ndim:  # (H, i, j) -> (1.., H, i, j)
        bias = bias.reshape((1,) * (q.ndim - bias.ndim) + tuple(bias.shape))
    if bias.dtype != q.dtype:
        bias = bias.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale, enable_gqa=groups > 1,
                                          dropout_p=dropout_p)


def _as_arrays(q, k, v):
    kinds = {("torch" if is_tensor(x) else "jax" if is_jax(x) else "numpy") for x in (q, k, v)}
    if len(kinds) > 1:
        raise ValueError(f"q, k and v must be all torch tensors, all JAX arrays or all NumPy arrays, got "
                         f"{', '.join(sorted(kinds))}")
    if kinds == {"torch"}:
        if len({x.device for x in (q, k, v)}) > 1 or len({x.dtype for x in (q, k, v)}) > 1:
            raise ValueError(
                "q, k and v must share device and dtype, got "
                + ", ".join(f"{n}: {x.dtype} on {x.device}" for n, x in zip("qkv", (q, k, v), strict=True))
            )
        if not q.is_floating_point():
            raise ValueError(f"q, k and v must be floating point tensors, got {q.dtype}")
        return q, k, v
    if kinds == {"jax"}:
        import jax.numpy as jnp

        if len({x.dtype for x in (q, k, v)}) > 1 or not jnp.issubdtype(q.dtype, jnp.floating):
            raise ValueError("q, k and v must be JAX arrays of one floating dtype, got "
                             + ", ".join(f"{n}: {x.dtype}" for n, x in zip("qkv", (q, k, v), strict=True)))
        return q, k, v
    q, k, v = (np.asarray(x) for x in (q, k, v))
    dtype = np.result_type(q, k, v)
    if dtype.kind not in "fiu":
        raise ValueError(f"q, k and v must hold real numbers, got dtype {dtype}")
    dtype = dtype if dtype.kind == "f" else np.dtype(np.float64)
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def check_shapes(q, k, v, slopes, causal: bool) -> Dims:
    """The dimensions of a valid call, or a ValueError that says what was expected and what came."""

    def shapes(*names):  # "q (...), k (...) and v (...)", for a message: built where one is raised, not every call
        said = [f"{n} {tuple(x.shape)}" for n, x in zip("qkv", (q, k, v), strict=True) if n in names]
        return ", ".join(said[:-1]) + " and " + said[-1]

    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape  # read once: each .shape of a tensor builds a new Size
    if len(q_shape) < 3 or not (len(q_shape) == len(k_shape) == len(v_shape)):
        raise ValueError(
            "q, k and v must have the same rank >= 3, shaped (..., H, q_len, d), "
            f"(..., H_kv, k_len, d), (..., H_kv, k_len, d_v); got {shapes(*'qkv')}"
        )
    if not (q_shape[:-3] == k_shape[:-3] == v_shape[:-3]):
        raise ValueError(f"q, k and v must have the same leading (batch) dimensions, got {shapes(*'qkv')}")
    n_heads, q_len, head_dim = q_shape[-3:]
    n_kv_heads, k_len = k_shape[-3:-1]
    if k_shape[-1] != head_dim:
        raise ValueError(f"q and k must have the same head dimension d, got {shapes('q', 'k')}")
    if v_shape[-3:-1] != k_shape[-3:-1]:
        raise ValueError(f"k and v must have the same heads and length, got {shapes('k', 'v')}")
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"the {n_heads} query heads must be a multiple of the {n_kv_heads} key/value heads")
    if slopes.shape[0] != n_heads:
        raise ValueError(f"need one slope per query head: {n_heads} heads, got {slopes.shape[0]} slopes")
    check_lengths(q_len, k_len, causal)
    return Dims(n_heads, n_kv_heads, q_len, k_len, head_dim)


class Plan(NamedTuple):
    """What ``alibi_attention``'s checks decide for a call: its dimensions, scale, dtypes and path."""
    dims: Dims
    scale: float
    out_dtype: object
    work: object
    chosen: str
    valid_while: object = None  # None, or what a cached plan is valid only while, asked at reuse (``_cache_policy``)


# the plans of torch calls checked before, by what decided them (``_plan_key``), up to PLAN_CACHE_SIZE of them: a model
# calls with the same shapes step after step, and once a kernel has run, the checks' Python has left the CPU's
# caches and costs 60-90 microseconds a call, more than a 256-token bfloat16 call's whole gap to plain
# attention (docs/performance.md, "Per-call costs")
_PLANS: dict = {}
PLAN_CACHE_SIZE = 256


def _plan_key(q, k, v, slopes, causal, scale, impl):
    """Everything a torch call's plan follows from, hashable; None for a call whose plan is not cached (not all
    tensors, arguments of unusual types, or inside torch.compile, which traces the checks into its graph)."""
    torch = sys.modules.get("torch")
    tensor = torch.Tensor if torch is not None else ()
    if not (isinstance(q, tensor) and isinstance(k, tensor) and isinstance(v, tensor) and isinstance(slopes, tensor)):
        return None
    if torch.compiler.is_compiling() or type(causal) is not bool or type(impl) is not str or not (
            scale is None or type(scale) in (int, float)):
        return None
    grad = grad_taken(q, k, v, slopes)
    return (q.shape, k.shape, v.shape, slopes.shape, q.dtype, k.dtype, v.dtype, slopes.dtype, q.device, k.device,
            v.device, slopes.device, grad, causal, scale, impl)


def _cached_plan(key) -> Plan | None:
    """The plan cached for ``key``, where it is still valid."""
    plan = None if key is None else _PLANS.get(key)
    return plan if plan is None or plan.valid_while is None or plan.valid_while() else None


def _cache_policy(chosen: str, impl: str, q):
    """Whether a torch call's plan may be cached, and what it is then valid only while (None: for good). Asked
    by name, a path is cached for good. "auto" on the CPU also asks whether the call's bias is cached
    (``bias_is_cached``), which follows whether the slopes alone take a gradient, which the key does not tell
    apart from q's; so its plan is not cached, unless the fused kernel took the call: then it is valid while the
    kernel is available, which ALIBI_REF_FUSED can change at any time."""
    if impl != "auto":
        return True, None
    if chosen == "fused":
        from .fused import available

        return True, available
    return q.device.type == "cuda", None


def _cache_plan(key, plan: Plan) -> None:
    if len(_PLANS) >= PLAN_CACHE_SIZE:  # shapes that keep changing (a growing KV cache): start over
        _PLANS.clear()
    _PLANS[key] = plan


def alibi_attention(
    q, k, v, slopes, *, causal: bool = False, scale: float | None = None,
    return_weights: bool = False, impl: str = "auto",
    key_padding_mask=None, q_positions=None, k_positions=None, dropout_p: float = 0.0, window=None,
):
    """ALiBi attention; returns the output (..., H, q_len, d_v), and the weights if asked.

    q (..., H, q_len, d); k, v (..., H_kv, k_len, d) with H a multiple of H_kv
    (query head h reads key/value head h // (H / H_kv)); slopes (H,). The queries
    are the last q_len positions of the keys, so q_len = 1 against a KV cache is
    one decoding step. NumPy in gives NumPy out; tensors give tensors on the same
    device and dtype, differentiable; JAX arrays give JAX arrays (jit-able, ``jax.grad``
    reaches q, k, v and the slopes). ``scale`` defaults to 1/sqrt(d).

    impl: "naive" (``naive_attention``, the specification), "sdpa" (torch's fused kernel
    with the bias materialised as a float mask; for JAX arrays ``jax.nn.dot_product_attention``
    with it as ``bias``, the default there for float32 and 16-bit floats), "strided" (the same kernel, the bias a
    strided view of one row per head, see ``alibi_ref.strided``), "flex" (FlexAttention compiled, the bias
    computed inside the kernel; the CUDA path), "fused" (``alibi_ref.fused``: a CPU kernel of our own, the bias
    computed where the scores are; float32 and float64, bfloat16 forward only, no dropout or padding), or
    "auto": naive for NumPy or the weights; sdpa for a few queries (up to FEW_QUERIES: a decoding step); else
    on the CPU fused where it is built and takes the call (from FUSED_CPU_MIN_KEYS keys, or where a gradient is
    taken; bfloat16 from FUSED_BF16_MIN_KEYS); otherwise strided from STRIDED_MIN_KEYS keys, sdpa below, where
    the bias (up to CACHED_BIAS_NUMBERS numbers) is cached between calls (``bias_is_cached``), and for symmetric
    attention over a batch whose bias is small beside q (k_len <= B d / 4); on CUDA flex from FLEX_MIN_KEYS
    keys, sdpa below.
    strided, flex and fused never build an (H, N, N) tensor. On a CPU, call ``alibi_ref.flush_denormals()``
    once first: see ``alibi_ref.denormals`` for why ALiBi needs it to run at full speed. On the CPU the bias
    a call builds (or the strided path's row) is cached for the next call with equal slopes values and lengths,
    up to ``alibi_ref.bias_cache.CACHE_BYTES`` in all (``alibi_ref.bias_cache``; ``alibi_ref.bias_cache.clear()``
    empties it). A torch call's checks and choice of path are cached too, for the next call with the same shapes,
    dtypes, devices, gradients and arguments (``_PLANS``; docs/performance.md, "Per-call costs").

    Padded batches and explicit positions: ``key_padding_mask`` (..., k_len), True where a key
    exists; ``q_positions`` (..., q_len) and ``k_positions`` (..., k_len), integer positions per
    batch row (default: the keys 0..k_len-1, the queries the last q_len of them). Each token's
    distance is then |p_i - p_j| and causal masks keys with a later position: left padding
    (positions from ``mask.cumsum(-1) - 1``, as BLOOM does), packed sequences, caches with gaps.
    These run on the naive and sdpa paths, which build the (B, H, i, j) bias; on strided, which runs
    each batch row's keys that exist as one plain span where they are one (left and right padding:
    ``alibi_ref.padded``) and only the other queries with their rows of the bias ("auto"'s choice on the
    CPU where it takes strided without padding; sdpa elsewhere); and on flex on CUDA, which builds no bias
    (it builds the batch's block mask at every call instead, which on an H100 made it no faster than the
    bias at 4096 keys: not "auto"'s choice). A query row that sees no key at all gives zeros, and passes
    no gradient back.

    ``dropout_p``: attention dropout on the weights (torch only; pass 0 outside training).

    ``window`` (left, right): a sliding window as FlashAttention-2's ``window_size`` beside its
    ``alibi_slopes``: each query sees the keys at most ``left`` positions before it and ``right``
    after it (-1 or None: no limit; causal with (left, 0) is a causal sliding window). It runs on
    the naive and sdpa paths, with the bias materialised; on fused (the CPU's "auto" choice, as without a
    window), which skips the blocks outside it; on strided, whose bias row carries the window's -inf and whose
    kernel calls are shown only the keys their rows' windows reach; and on flex, whose block mask skips the
    tiles outside the window (on CUDA "auto" takes sdpa: flex with a window has not been timed on a GPU). With
    more queries than keys a window can leave the first queries no key: "auto" takes sdpa there (zeros for those
    rows) and strided and fused refuse it.
    """
    plain = (key_padding_mask is None and q_positions is None and k_positions is None and window is None
             and not return_weights and type(dropout_p) in (int, float) and dropout_p == 0)
    key = _plan_key(q, k, v, slopes, causal, scale, impl) if plain else None
    plan = _cached_plan(key)
    if plan is None:
        q, k, v = _as_arrays(q, k, v)
        slopes = check_slopes(slopes)
        dims = check_shapes(q, k, v, slopes, causal)
        scale = 1.0 / math.sqrt(dims.head_dim) if scale is None else float(scale)
        out_dtype, work = float_dtypes(q)
        slopes = as_like(slopes, q, work)
        dropout_p = _check_dropout(dropout_p, q)
        window = check_window(window)
        per_row = _per_row(q, dims, key_padding_mask, q_positions, k_positions)
        grad = is_tensor(q) and grad_taken(q, k, v, slopes)
        chosen = choose_impl(impl, q, dims, return_weights, per_row is not None, dropout_p > 0, v, causal,
                             window is not None, slopes, grad)
        if chosen == "fused" and impl == "fused":  # asked for by name; "auto" took it where it fits (_fused_takes)
            from .fused import why_not_fused

            why = why_not_fused(q, v, dropout_p, per_row is not None, return_weights, grad)
            if why is None and window is not None and dims.q_len > dims.k_len:
                why = "a window can leave the first queries, before the first key, no key at all"
            if why is not None:
                raise ValueError(f"impl='fused' cannot take this call: {why}; use 'strided', 'sdpa' or 'naive'")
        may_cache, valid_while = _cache_policy(chosen, impl, q) if key is not None else (False, None)
        plan = Plan(dims, scale, out_dtype, work, chosen, valid_while)
        if may_cache:
            _cache_plan(key, plan)
    else:  # a call like one checked before: only the slopes' values may differ (dropout_p is 0, window None)
        dims, scale, out_dtype, work, chosen, _ = plan
        slopes, dropout_p, per_row = as_like(slopes, q, work), 0.0, None
    groups = dims.n_heads // dims.n_kv_heads
    if chosen == "fused":
        from .fused import fused_alibi_attention

        return fused_alibi_attention(q, k, v, slopes, scale, causal, groups, window)
    if chosen == "flex":
        from .flex import flex_alibi_attention

        if per_row is not None and q.device.type != "cuda":
            raise ValueError("impl='flex' takes key_padding_mask and positions on CUDA only: torch's CPU compiler "
                             "fails on them once the lengths vary (torch 2.13); use 'sdpa' or 'naive' on the CPU")
        return flex_alibi_attention(q, k, v, slopes, scale, causal, groups, *_flat_rows(q, per_row), window=window)
    if per_row is not None and chosen == "strided":
        from .padded import padded_strided_attention

        def bias_rows(q, k, v, bias):  # the queries outside each batch row's span (alibi_ref.padded)
            return _with_bias(q, k, v, bias, scale, groups, "sdpa", False, (out_dtype, work), dropout_p,
                              rows_may_see_nothing=True)

        return padded_strided_attention(q, k, v, slopes, scale, causal, groups, per_row, window, dropout_p, bias_rows)
    if per_row is not None:
        bias = positional_bias(slopes, per_row[0], per_row[1], causal=causal, key_padding_mask=per_row[2],
                               window=window)  # (..., H, i, j)
        return _with_bias(q, k, v, bias, scale, groups, chosen, return_weights, (out_dtype, work), dropout_p,
                          rows_may_see_nothing=True)
    if chosen == "strided":
        from .strided import strided_alibi_attention

        return strided_alibi_attention(q, k, v, slopes, scale, causal, groups, dropout_p=dropout_p, window=window)
    # torch's kernel reads the bias in q's dtype: cached in it, not cast at every call (naive adds it in float32)
    dtype = q.dtype if chosen == "sdpa" and is_tensor(q) else None
    bias = cached_bias(_plain_bias, slopes, dims.q_len, dims.k_len, causal, window, dtype, q.ndim)  # (1.., H, i, j)
    # a window never hides a query's own position; but with more queries than keys the first queries' positions
    # lie before the first key, and a window can leave them none
    return _with_bias(q, k, v, bias, scale, groups, chosen, return_weights, (out_dtype, work), dropout_p,
                      rows_may_see_nothing=window is not None and dims.q_len > dims.k_len)


def _check_dropout(dropout_p, q) -> float:
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if dropout_p and not is_tensor(q):
        raise ValueError("attention dropout needs torch tensors (it is for training; in Flax, the layers of "
                         "alibi_ref.flax_layers take the module's own dropout)")
    return dropout_p


def _plain_bias(slopes, q_len: int, k_len: int, causal: bool, window, dtype, rank: int):
    bias = alibi_bias(slopes, q_len, k_len, causal=causal, window=window, dtype=dtype)  # (H, i, j)
    return bias.reshape((1,) * (rank - 3) + tuple(bias.shape))  # q's rank, as torch's kernel wants it


def _with_bias(q, k, v, bias, scale: float, groups: int, chosen: str, return_weights: bool, dtypes,
               dropout_p: float = 0.0, rows_may_see_nothing: bool = False):
    """Attention with a materialised bias, (H, i, j) or (..., H, i, j), on the sdpa or naive path.

    ``dtypes``: (output, working) dtypes. ``rows_may_see_nothing``: key padding can hide every key
    of a query; such rows are set to 0 (an ALiBi bias alone always leaves each query a key, so the
    scan is skipped there).
    """
    out_dtype, work = dtypes
    sees = _rows_seeing_a_key(bias) if rows_may_see_nothing else None

    def zeroed(x):  # x (..., H, i, n) with the rows that see no key set to 0
        if sees is None:
            return x
        return x.masked_fill(~sees, 0.0) if is_tensor(x) else xp(x).where(sees, x, 0.0)

    # a row that sees no key is all -inf, and its softmax 0/0: nan, forward and backward (JAX's fused kernel
    # and the naive path alike; zeroing the output after it still lets the nan of the softmax's gradient
    # through). Such rows get a finite bias of 0 instead and their output set to 0 afterwards
    bias = zeroed(bias)

    if chosen == "sdpa":
        if is_jax(q):
            return zeroed(_jax_sdpa_attention(q, k, v, bias, scale))
        return zeroed(_sdpa_attention(q, k, v, bias, scale, groups, dropout_p))
    # 16-bit inputs are computed in float32 and rounded once at the end
    k, v = (repeat_heads(cast(x, work), groups) for x in (k, v))  # (..., H, j, d)
    out, weights = naive_attention(cast(q, work), k, v, bias, scale, dropout_p)
    out = cast(zeroed(out), out_dtype)
    return (out, cast(zeroed(weights), out_dtype)) if return_weights else out


def _rows_seeing_a_key(bias):
    """(..., H, i, 1): whether each query row's bias is finite for some key; None where every row's is (checked
    for torch and NumPy; under JAX, which traces, always the array)."""
    if is_tensor(bias):
        import torch

        sees = torch.isfinite(bias).any(-1, keepdim=True)
        return None if bool(sees.all()) else sees
    sees = xp(bias).isfinite(bias).any(-1, keepdims=True)
    if is_jax(bias):  # no data-dependent branch: it would not trace under jit
        return sees
    return None if sees.all() else sees


def _per_row(q, dims: Dims, key_padding_mask, q_positions, k_positions):
    """(q_positions, k_positions, key_padding_mask or None), checked, each (length,) or (*batch, length), the
    positions' defaults filled in; or None when the call has neither padding nor positions."""
    if key_padding_mask is None and q_positions is None and k_positions is None:
        return None
    batch = tuple(q.shape[:-3])
    if k_positions is None:
        k_positions = np.arange(dims.k_len)
    if q_positions is None:
        q_positions = np.arange(dims.q_len) + (dims.k_len - dims.q_len)
    q_positions = _per_batch_row(q_positions, q, batch, dims.q_len, "q_positions", integer=True)
    k_positions = _per_batch_row(k_positions, q, batch, dims.k_len, "k_positions", integer=True)
    if key_padding_mask is not None:
        key_padding_mask = _per_batch_row(key_padding_mask, q, batch, dims.k_len, "key_padding_mask", integer=False)
    return q_positions, k_positions, key_padding_mask


def _flat_rows(q, per_row) -> tuple:
    """``_per_row``'s tensors for the kernels' flattened batch: ((q_positions (B, i), k_positions (B, j)),
    key_padding_mask (B, j) or None); (None, None) for a call without them."""
    if per_row is None:
        return None, None
    batch = tuple(q.shape[:-3])

    def flat(x):  # (n,) or (*batch, n) -> (B, n)
        return None if x is None else x.expand(*batch, x.shape[-1]).reshape(-1, x.shape[-1])

    q_positions, k_positions, key_padding_mask = per_row
    return (flat(q_positions), flat(k_positions)), flat(key_padding_mask)


def _per_batch_row(x, like, batch: tuple, length: int, name: str, integer: bool):
    """``x`` of shape (length,) or (*batch, length), as ``like``'s kind (integers or booleans), or a ValueError."""
    x = as_like(x, like, None)
    if tuple(x.shape) not in ((length,), (*batch, length)):
        raise ValueError(f"{name} must have shape ({length},) or {(*batch, length)} (the batch dimensions of q, "
                         f"then the length), got {tuple(x.shape)}")
    if is_tensor(x):
        import torch

        is_bool = x.dtype == torch.bool
        ok = (not is_bool and not x.is_floating_point() and not x.is_complex()) if integer else is_bool
    else:
        ok = x.dtype.kind in ("iu" if integer else "b")
    if not ok:
        raise ValueError(f"{name} must hold {'integers' if integer else 'booleans'}, got dtype {x.dtype}")
    return x
