"""Kernel-side adapters: how a check calls answers that are not plain functions of arrays.

They run in the student's kernel, inside the guard against calling the reference, so they live
apart from ``exercises`` (which holds the references and counts as the reference itself).
"""

from __future__ import annotations

import tracemalloc


def score_mod_outputs(answer, slopes, causal=False, q=None, k=None, v=None):
    """Kernel side: the student's score_mod, applied to a zero score on every (h, i, j), or run in flex_attention."""
    import torch

    mod = answer(slopes, causal=causal)
    if q is not None:
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q, k, v, score_mod=mod)
    n = 10
    h, i, j = torch.meshgrid(*(torch.arange(x, device=slopes.device) for x in (len(slopes), n, n)), indexing="ij")
    return mod(torch.zeros(len(slopes), n, n, dtype=slopes.dtype, device=slopes.device), torch.tensor(0), h, i, j)


def peak_and_output(answer, q, k, v, slopes, causal=True, block=64):
    """Kernel side: the peak memory numpy allocated while ``answer`` ran (tracemalloc), and its output."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        out = answer(q, k, v, slopes, causal=causal, block=block)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return float(peak), out


def warm_up_flex(device) -> None:
    """FlexAttention's first call sets itself up (seconds, and several times that under the guard's
    profile hook); do it once, outside the guard, on a trivial problem."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    x = torch.zeros(1, 1, 16, 8, device=device or "cpu")
    flex_attention(x, x, x, score_mod=lambda score, b, h, q_idx, kv_idx: score)
