"""The ALiBi bias matrix.

For head h, query position i and key position j the bias added to the scaled
score is

    b[h, i, j] = -m_h * |i + (k_len - q_len) - j|

Queries sit at the *end* of the keys (as in FlashAttention-2): with q_len = 1 and
k_len = t + 1 the single query is position t, so one decoding step against a KV
cache gets the same bias row as the last row of the full matrix. With
``causal=True`` entries with j > i + (k_len - q_len) (the future) are -inf.

Precision: the magnitudes are built from integer distances, in at least float32,
and only then cast. A key-only bias +m*j (equal under a causal mask, see
``key_only_bias``) reaches m*k_len; rounded to bfloat16 at k_len = 2048 its
neighbouring entries are off by up to ~4 and the attention output by ~3.
"""

from __future__ import annotations

import numbers
import sys

import numpy as np

from ._backend import arange, broadcast_to, cast, float_dtypes, is_jax, is_tensor, masked, where_negative, xp


def check_lengths(q_len, k_len, causal: bool) -> tuple[int, int]:
    k_len = q_len if k_len is None else k_len
    for name, n in (("q_len", q_len), ("k_len", k_len)):
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {n!r}")
    if causal and q_len > k_len:
        raise ValueError(
            "causal attention needs q_len <= k_len (the queries are the last q_len "
            f"positions of the keys), got q_len={q_len}, k_len={k_len}"
        )
    return int(q_len), int(k_len)


def check_slopes(slopes):
    """Slopes as a 1-D NumPy array, tensor or JAX array, or a ValueError saying what came."""
    if is_jax(slopes):
        import jax.numpy as jnp

        if not (jnp.issubdtype(slopes.dtype, jnp.floating) or jnp.issubdtype(slopes.dtype, jnp.integer)):
            raise ValueError(f"slopes must be real numbers, got dtype {slopes.dtype}")
    elif not is_tensor(slopes):
        slopes = np.asarray(slopes)
        if slopes.dtype.kind not in "fiu":
            raise ValueError(f"slopes must be real numbers, got dtype {slopes.dtype}")
    if slopes.ndim != 1 or slopes.shape[0] < 1:
        raise ValueError(f"slopes must have shape (H,) with H >= 1, got shape {tuple(slopes.shape)}")
    return slopes


def check_window(window) -> tuple[int | None, int | None] | None:
    """A sliding window (left, right) as FlashAttention-2's ``window_size``: how many keys before and after
    each query it may see; None or -1 for no limit on that side. None for no window at all."""
    if window is None:
        return None
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(f"window must be a pair (left, right) of whole numbers >= 0 (or -1/None: no limit), "
                         f"got {window!r}") from None
    sides = []
    for name, n in (("left", left), ("right", right)):
        if n is None or (isinstance(n, numbers.Integral) and not isinstance(n, bool) and n == -1):
            sides.append(None)
        elif isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 0:
            sides.append(int(n))
        else:
            raise ValueError(f"window's {name} side must be a whole number >= 0, or -1/None for no limit, got {n!r}")
    return sides[0], sides[1]


def relative_positions(q_len: int, k_len: int, like=None):
    """(q_len, k_len) integers i + (k_len - q_len) - j: how far key j lies behind query i."""
    i = arange(q_len, like)[:, None] + (k_len - q_len)
    j = arange(k_len, like)[None, :]
    return i - j


def alibi_bias(slopes, q_len: int, k_len: int | None = None, *, causal: bool = False, dtype=None, device=None,
               window=None):
    """The additive ALiBi bias, shape (H, q_len, k_len).

    ``slopes``: (H,) NumPy array or list (NumPy out, float64 unless a float array
    of another width comes in), torch tensor (tensor out, on its device and dtype) or
    JAX array (JAX out, on its device and dtype; jit-able, differentiable in the slopes).
    ``device`` or a torch ``dtype`` ask for a tensor whatever the slopes are; ``dtype`` sets the
    output's dtype (the bias is still built in at least float32 and cast last). ``window`` (left, right):
    -inf on the keys more than ``left`` before or ``right`` after each query (``check_window``).
    """
    slopes = _placed(check_slopes(slopes), dtype, device)
    q_len, k_len = check_lengths(q_len, k_len, causal)
    out_dtype, _ = float_dtypes(slopes)
    rel = relative_positions(q_len, k_len, like=slopes)  # (i, j)
    bias = bias_from_distances(slopes, rel, causal, check_window(window))  # (H, i, j)
    return cast(bias, out_dtype if dtype is None else dtype)


def _placed(slopes, dtype, device):
    """The slopes as a tensor on ``device`` when a device or a torch dtype is asked for; as they came otherwise."""
    torch = sys.modules.get("torch")
    if device is None and not (torch is not None and isinstance(dtype, torch.dtype)):
        return slopes
    import torch

    slopes = torch.as_tensor(slopes, device=device)
    return slopes if slopes.is_floating_point() else slopes.double()


def bias_from_distances(slopes, rel, causal: bool, window=None):
    """-m_h * |rel| for integer distances ``rel`` of any shape, (H, *rel.shape), in >= float32.

    rel = i' - j, how far the key lies behind the query; with ``causal`` the keys ahead
    (rel < 0) get -inf, and with a ``window`` (left, right) from ``check_window`` so do the keys
    with rel > left or rel < -right. The minus sits on the integers, so a zero distance is +0.0.
    """
    _, work = float_dtypes(slopes)
    per_head = cast(slopes, work).reshape((-1,) + (1,) * rel.ndim)  # (H, 1, ...)
    bias = per_head * cast(-abs(rel), work)  # (H, *rel.shape)
    if causal:
        bias = where_negative(rel, bias, float("-inf"))
    left, right = window or (None, None)
    if left is not None:
        bias = masked(bias, rel > left, float("-inf"))  # too far behind the query
    if right is not None:
        bias = masked(bias, rel < -right, float("-inf"))  # too far ahead of it
    return bias


def positional_bias(slopes, q_positions, k_positions, *, causal: bool = False, key_padding_mask=None,
                    window=None):
    """The ALiBi bias from explicit token positions, shape (..., H, q_len, k_len).

    ``q_positions`` (..., q_len) and ``k_positions`` (..., k_len) are integer positions per batch row:
    left padding (BLOOM takes them from ``attention_mask.cumsum(-1) - 1``), packed sequences and
    KV caches with gaps all give each token its true distance. The bias is -m_h * |p_i - p_j|;
    with ``causal`` a key whose position is after the query's is -inf. ``key_padding_mask``
    (..., k_len), True where a key exists, puts -inf on the others; ``window`` limits each query to the
    keys within (left, right) positions of its own. Tensors in give tensors on
    their device; the dtype follows ``float_dtypes(slopes)``, built in at least float32.
    """
    rel = q_positions[..., :, None] - k_positions[..., None, :]  # (..., i, j): how far key j lies behind query i
    out_dtype, _ = float_dtypes(slopes)
    bias = bias_from_distances(slopes, rel, causal, check_window(window))  # (H, ..., i, j)
    bias = bias.moveaxis(0, -3) if is_tensor(bias) else xp(bias).moveaxis(bias, 0, -3)  # (..., H, i, j)
    if key_padding_mask is not None:
        keep = key_padding_mask[..., None, None, :]  # (..., 1, 1, j)
        bias = bias.masked_fill(~keep, float("-inf")) if is_tensor(bias) else xp(bias).where(keep, bias, -np.inf)
    return cast(bias, out_dtype)


def key_only_bias(slopes, q_len: int, k_len: int | None = None):
    """The causal bias as the official code, BLOOM and labml write it: +m_h * j, masked.

    Row i of -m*(i' - j) and of +m*j differ by the constant m*i' (i' = i + k_len - q_len),
    and softmax ignores a constant per row, so under a causal mask both give the
    same weights. Without the mask they do not: +m*j favours the farthest key, so
    this form is only ever causal. ``alibi_bias`` is the one to use: in bfloat16
    this form rounds m*j, which grows to m*k_len, and loses the small differences
    between neighbouring keys that the softmax depends on. Kept for teaching and tests.
    """
    slopes = check_slopes(slopes)
    q_len, k_len = check_lengths(q_len, k_len, causal=True)
    out_dtype, work = float_dtypes(slopes)
    rel = relative_positions(q_len, k_len, like=slopes)  # (i, j)
    j = cast(arange(k_len, like=slopes), work)
    # +m_h * j, the same for every query row: the row's constant m_h * i' is dropped
    bias = cast(slopes, work)[:, None, None] * j  # (H, 1, j)
    bias = broadcast_to(bias, (bias.shape[0], q_len, k_len))  # (H, i, j)
    return cast(where_negative(rel, bias, float("-inf")), out_dtype)
