"""The chapter's interface: Q, K and V as (N, d_model) matrices, split into heads by columns.

The textbook chapter (and the notebooks that follow it) write multi-head attention this way;
the library's ``alibi_attention`` takes the heads as an axis. This is the bridge.
"""

from __future__ import annotations

import numpy as np

from .._backend import is_jax, is_tensor
from ..attention import alibi_attention
from ..slopes import get_slopes


def multi_head_alibi(Q, K, V, n_heads: int, slopes=None, *, causal: bool = False):
    """The chapter's interface: Q, K, V of shape (N, d_model), columns split per head.

    Head h uses columns h*d_k .. (h+1)*d_k - 1 (d_k = d_model / n_heads). Returns
    (output (N, d_model), weights (H, N, N)). ``slopes`` defaults to the chapter's
    1/2^h ("textbook"); pass ``get_slopes(n_heads)`` for the paper's.
    """
    if slopes is None:
        slopes = get_slopes(n_heads, "textbook")
    if not (is_tensor(Q) or is_jax(Q)):
        Q, K, V = (np.asarray(x) for x in (Q, K, V))
    if Q.ndim != 2 or K.ndim != 2 or V.ndim != 2:
        raise ValueError(
            f"Q, K and V must be 2-D (N, d_model), got shapes {tuple(Q.shape)}, {tuple(K.shape)}, {tuple(V.shape)}"
        )
    if Q.shape[1] % n_heads or V.shape[1] % n_heads:
        raise ValueError(f"d_model must be divisible by n_heads={n_heads}, got Q {tuple(Q.shape)}, V {tuple(V.shape)}")

    def split(x):  # (N, d_model) -> (H, N, d_k)
        return x.reshape(x.shape[0], n_heads, -1).swapaxes(0, 1)

    out, weights = alibi_attention(
        split(Q), split(K), split(V), slopes, causal=causal, return_weights=True, impl="naive"
    )  # (H, N, d_k), (H, N, N)
    return out.swapaxes(0, 1).reshape(out.shape[1], -1), weights  # (N, d_model)
