"""What little differs between NumPy, torch and JAX, kept in one place.

torch and JAX are imported lazily: a NumPy-only user (most of the course) never
pays their import. An object can only be a tensor (a JAX array) if torch (jax) is
already imported. JAX arrays mostly take NumPy's own calls through ``jax.numpy``
(``xp``); only what differs is spelled out.
"""

from __future__ import annotations

import sys

import numpy as np


def is_tensor(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def grad_taken(*tensors) -> bool:
    """Whether autograd will record a call on these torch tensors. A loop, not ``any()`` over a generator:
    every torch call asks this, and the generator made it 0.9 us instead of 0.65 us (four tensors)."""
    if not sys.modules["torch"].is_grad_enabled():
        return False
    for x in tensors:
        if x.requires_grad:
            return True
    return False


def is_jax(x) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.Array)


def xp(x):
    """The array namespace of a NumPy or JAX array: ``numpy`` or ``jax.numpy``."""
    if is_jax(x):
        import jax.numpy as jnp

        return jnp
    return np


def softmax(scores):
    """Row-wise softmax over the last axis (the keys j).

    Shift-invariant: softmax(s + c) = softmax(s) for any constant c per row, so
    subtracting the row maximum changes nothing but keeps exp() from overflowing.
    Rows that hold -inf (causal mask) get weight exactly 0 there.
    """
    if is_tensor(scores):
        return scores.softmax(dim=-1)
    if is_jax(scores):
        import jax

        return jax.nn.softmax(scores, axis=-1)
    with np.errstate(invalid="ignore"):  # a row of only -inf (no key to see) gives nan: callers decide
        shifted = scores - scores.max(axis=-1, keepdims=True)
        e = np.exp(shifted)
        return e / e.sum(axis=-1, keepdims=True)


def repeat_heads(x, groups: int):
    """(..., H_kv, n, d) -> (..., H_kv * groups, n, d): query head h reads KV head h // groups."""
    if groups == 1:
        return x
    if is_tensor(x):
        return x.repeat_interleave(groups, dim=-3)
    return xp(x).repeat(x, groups, axis=-3)


def float_dtypes(x):
    """(output dtype, working dtype) for values derived from ``x``.

    The output keeps x's float dtype (float64 for integer input, or torch's default
    for integer tensors); the work is done in at least float32, so nothing is
    rounded to a 16-bit float before the last step.
    """
    if is_tensor(x):
        import torch

        out = x.dtype if x.is_floating_point() else torch.get_default_dtype()
        return out, torch.promote_types(out, torch.float32)
    if is_jax(x):
        import jax.numpy as jnp

        # float64 only where jax_enable_x64 is on: the default float of this JAX
        out = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.result_type(float)
        return out, jnp.promote_types(out, jnp.float32)
    out = x.dtype if np.issubdtype(x.dtype, np.floating) else np.dtype(np.float64)
    return out, np.promote_types(out, np.float32)


def cast(x, dtype):
    return x.to(dtype) if is_tensor(x) else x.astype(dtype)


def arange(n: int, like=None):
    """0 .. n-1 as integers, on ``like``'s device when it is a tensor."""
    if is_tensor(like):
        import torch

        return torch.arange(n, device=like.device)
    return xp(like).arange(n)


def masked(values, condition, fill: float):
    """``values`` with ``fill`` wherever ``condition`` holds."""
    if is_tensor(values):
        return values.masked_fill(condition, fill)
    return xp(values).where(condition, fill, values)


def where_negative(rel, values, fill: float):
    """``values`` with ``fill`` wherever ``rel`` < 0."""
    return masked(values, rel < 0, fill)


def broadcast_to(x, shape):
    return x.broadcast_to(shape) if is_tensor(x) else xp(x).broadcast_to(x, shape)


def as_like(x, like, dtype):
    """``x`` (array, list or tensor) as ``like``'s kind: a tensor on its device, a JAX array, or a NumPy array.

    ``dtype`` None keeps x's own dtype."""
    if is_tensor(like):
        import torch

        if is_tensor(x) and x.device == like.device and (dtype is None or x.dtype == dtype):
            return x  # as it is: each torch call before the kernel's costs some microseconds
        x = torch.as_tensor(x, device=like.device)
        return x if dtype is None else x.to(dtype)
    if is_jax(like):
        import jax.numpy as jnp

        return jnp.asarray(x, dtype=dtype)  # committed to like's device when an operation meets it
    if is_tensor(x):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


def over_flat_batch(fn):
    """Let ``fn(q, k, v, ...)``, written for the kernels' (B, H, n, d), take (..., H, n, d) of any rank >= 3."""
    import functools

    @functools.wraps(fn)
    def flat(q, k, v, *args, **kwargs):
        lead = q.shape[:-3]
        out = fn(*(x.reshape(-1, *x.shape[-3:]) for x in (q, k, v)), *args, **kwargs)  # (B, H, n, d)
        return out.reshape(*lead, *out.shape[-3:])

    return flat
