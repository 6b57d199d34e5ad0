"""Padded batches on the strided path: each batch row's tokens as one span of plain ALiBi.

With key padding and positions the bias depends on the batch row, so no strided view of one row
holds it, and the sdpa path builds it whole: (B, H, i, j) numbers, and a float mask over every key,
which on the CPU made a left-padded causal batch 6-14x plain SDPA (README, "What ALiBi costs").
But the usual padding leaves most of each row plain. Where a batch row's keys that exist form one
span s .. e - 1 whose positions count up by one, and a run of its queries a .. c - 1 counts up by one
to the last key's position, the distances between them are those of an unpadded call:

    p_i - p_j = (i - a) + (e - s) - (c - a) - (j - s)     for a <= i < c, s <= j < e

which is i' - j of queries aligned to the end of the keys. So those queries against those keys are
``strided_alibi_attention`` on slices, no bias built; the keys outside the span are padding, which
those queries never see anyway. The other queries of the row (left padding's pad rows, at position 0;
the pad rows after a right-padded prompt) are few and run with their rows of the bias. Left padding
(BLOOM's ``cumsum - 1`` positions), right padding and no padding are all one span; a row whose keys
or positions are not one span (packed sequences, a cache with gaps) runs wholly with its bias rows.

Finding the spans reads the mask and positions (a few small operations per batch row): cheap on
the CPU, a device sync on CUDA, where ``auto`` never takes this path.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .bias import positional_bias
from .strided import strided_alibi_attention


class Span(NamedTuple):
    keys: slice  # s .. e - 1: the keys that exist, positions counting up by one
    queries: slice  # a .. c - 1: queries counting up by one to the position of key e - 1


def plain_span(q_positions, k_positions, key_padding_mask) -> Span | None:
    """One batch row's span (module docstring): q_positions (i,), k_positions (j,), key_padding_mask (j,) or
    None. None where the keys that exist are not one span with consecutive positions, or no query stands on
    the span's last position."""
    if key_padding_mask is None:
        s, e = 0, k_positions.shape[0]
    else:
        kept = key_padding_mask.nonzero().flatten()
        if kept.numel() == 0 or int(kept[-1]) + 1 - int(kept[0]) != kept.numel():
            return None  # no key, or a gap among the keys
        s, e = int(kept[0]), int(kept[-1]) + 1
    if not bool((k_positions[s + 1:e] - k_positions[s:e - 1] == 1).all()):
        return None
    last = k_positions[e - 1]
    on_last = (q_positions == last).nonzero().flatten()
    if on_last.numel() == 0:
        return None
    c = int(on_last[-1]) + 1
    # from query c - 1 back: how far the positions count down by one (at most the span's length)
    steps = q_positions[:c].flip(0) - (last - torch.arange(c, device=q_positions.device))
    off = (steps != 0).nonzero().flatten()
    run = min(c if off.numel() == 0 else int(off[0]), e - s)
    return Span(slice(s, e), slice(c - run, c))


def _reach(q_positions, span_positions, span: slice, causal: bool) -> slice:
    """The span's keys that queries outside it may see: all of them, or under a causal mask those up to the
    queries' latest position (left padding's pad rows, at position 0, see the span's first key only). At
    least one key: a query that sees none gets a row of -inf, which the bias path zeroes."""
    if not causal or q_positions.numel() == 0:
        return span
    seen = int((q_positions.amax(-1) - span_positions[:, 0]).amax()) + 1  # span positions count up by one
    return slice(span.start, span.start + min(max(seen, 1), span.stop - span.start))


def padded_strided_attention(q, k, v, slopes, scale: float, causal: bool, groups: int, per_row, window,
                             dropout_p: float, bias_rows):
    """Attention with key padding and positions, each batch row's span on the strided path (module docstring).

    q (..., H, i, d); k, v (..., H_kv, j, d); ``per_row`` (q_positions, k_positions, key_padding_mask or None),
    each (n,) or (*batch, n) as ``alibi_attention``'s ``_per_row`` gives them. ``bias_rows(q, k, v, bias)``
    runs the queries outside a span with their rows of the bias, bias (b, H, rows, j) (``alibi_attention``'s
    sdpa path, which zeroes a query that sees no key). Consecutive batch rows with the same span share
    each call.
    """
    batch = q.shape[:-3]
    q, k, v = (x.reshape(-1, *x.shape[-3:]) for x in (q, k, v))  # (B, H, n, d)
    q_positions, k_positions, keep = (None if x is None else x.expand(*batch, x.shape[-1]).reshape(-1, x.shape[-1])
                                      for x in per_row)  # (B, n)
    spans = [plain_span(q_positions[b], k_positions[b], None if keep is None else keep[b]) for b in range(len(q))]
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))  # (B, H, i, d_v)
    start = 0
    while start < len(q):
        stop = start + 1
        while stop < len(q) and spans[stop] == spans[start]:
            stop += 1
        rows, span = slice(start, stop), spans[start]
        others = torch.arange(q.shape[-2], device=q.device)  # the queries outside the span
        keys, keys_kept = slice(0, k.shape[-2]), None if keep is None else keep[rows]  # what the others may see
        if span is not None:
            s, a = span.keys, span.queries
            out[rows, :, a] = strided_alibi_attention(q[rows, :, a], k[rows, :, s], v[rows, :, s], slopes, scale,
                                                      causal, groups, dropout_p=dropout_p, window=window)
            others = torch.cat([others[:a.start], others[a.stop:]])
            keys, keys_kept = _reach(q_positions[rows, others], k_positions[rows, s], s, causal), None
        if others.numel():
            bias = positional_bias(slopes, q_positions[rows, others], k_positions[rows, keys], causal=causal,
                                   key_padding_mask=keys_kept, window=window)  # (b, H, rows, j)
            out[rows, :, others] = bias_rows(q[rows, :, others], k[rows, :, keys], v[rows, :, keys], bias)
        start = stop
    return out.reshape(*batch, *out.shape[-3:])
