"""The reference's version of each earlier answer that a later exercise calls (``Exercise.upstream``).

A downstream answer is run again with these in place of the student's own wrong ones, so that one
mistake costs one exercise. In a student's own session they are lent in the same kernel. When
grading, they are not in the kernel's view of the package: a notebook whose downstream check
failed beside a failed upstream one is run again in a sandbox of its own whose view holds only the
functions lent (``view.write_view``), and only the downstream verdicts are read from that run.

Each function stands alone (the view copies its source, with this module's imports): none calls
another or anything of alibi_ref's.
"""

from __future__ import annotations

import numpy as np


def softmax(x, axis=-1):
    """Softmax over ``axis``, the maximum subtracted first."""
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def alibi_head(Qh, Kh, Vh, slope):
    """One head of the chapter's ALiBi: (weights (N, N), output (N, d_v))."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (Qh, Kh, Vh))
    i = np.arange(len(q))[:, None] + (len(k) - len(q))  # queries aligned to the end of the keys
    scores = q @ k.T / np.sqrt(q.shape[-1]) - float(slope) * np.abs(i - np.arange(len(k))[None, :])
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = e / e.sum(axis=-1, keepdims=True)
    return weights, weights @ v


def alibi_bias_torch(slopes, q_len, k_len=None, causal=False):
    """The (H, q_len, k_len) bias -m_h |i - j| as a tensor on the slopes' device and in their dtype (float64 for
    slopes that are not a tensor); -inf where j > i when causal."""
    import torch

    slopes = slopes if torch.is_tensor(slopes) else torch.as_tensor(np.asarray(slopes, dtype=np.float64))
    k_len = q_len if k_len is None else k_len
    i = torch.arange(k_len - q_len, k_len, device=slopes.device)[:, None]  # the queries' positions
    j = torch.arange(k_len, device=slopes.device)[None, :]
    bias = -slopes[:, None, None] * (i - j).abs().to(slopes.dtype)  # (H, q_len, k_len)
    return bias.masked_fill(j > i, float("-inf")) if causal else bias


def alibi_attention_torch(q, k, v, slopes, causal=False):
    """Batched ALiBi attention (B, H, q_len, d) -> (B, H, q_len, d_v) in the inputs' dtype, on their device."""
    import torch

    slopes = torch.as_tensor(np.asarray(slopes.cpu() if torch.is_tensor(slopes) else slopes, dtype=np.float64))
    q_len, k_len = q.shape[-2], k.shape[-2]
    i = torch.arange(k_len - q_len, k_len)[:, None]  # the queries' positions, aligned to the end of the keys
    j = torch.arange(k_len)[None, :]
    bias = -slopes[:, None, None] * (i - j).abs()  # (H, q_len, k_len)
    bias = bias.masked_fill(j > i, float("-inf")) if causal else bias
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias.to(q.dtype).to(q.device)
    return torch.softmax(scores, dim=-1) @ v


def alibi_bias_jax(slopes, T):
    """The symmetric (H, T, T) bias -m_h |i - j| as a JAX array in the slopes' dtype; ``T`` static under jit."""
    import jax.numpy as jnp

    slopes = jnp.asarray(slopes)
    distance = jnp.abs(jnp.arange(T)[:, None] - jnp.arange(T)[None, :])  # (T, T)
    return -slopes[:, None, None] * distance.astype(slopes.dtype)


LENT = {"softmax": softmax, "alibi_head": alibi_head, "alibi_bias_torch": alibi_bias_torch,
        "alibi_attention_torch": alibi_attention_torch, "alibi_bias_jax": alibi_bias_jax}
