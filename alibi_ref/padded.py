"""Padded batches on the strided path: each batch row's tokens as one span of plain ALiBi.

With key padding and positions the bias depends on the batch row, so no strided view of one row
holds it, and the sdpa path builds it whole: (B, H, i, j) numbers, and a float mask over every key,
which on the CPU made a padded batch several times slower than plain SDPA (figures: docs/performance.md).
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

import itertools
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
        present = key_padding_mask.nonzero().flatten()
        if present.numel() == 0 or int(present[-1]) + 1 - int(present[0]) != present.numel():
            return None  # no key, or a gap among the keys
        s, e = int(present[0]), int(present[-1]) + 1
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


def _bias(slopes, q_positions, k_positions, key_padding_mask, causal: bool, window):
    """``positional_bias`` of these batch rows' queries (b, rows) and keys (b, j): (b, H, rows, j), or (b, H, 1, j)
    where each batch row's queries share one position (left padding's pads), broadcast over them."""
    if bool((q_positions == q_positions[:, :1]).all()):
        q_positions = q_positions[:, :1]
    return positional_bias(slopes, q_positions, k_positions, causal=causal, key_padding_mask=key_padding_mask,
                           window=window)


def _reach(q_positions, span_positions, causal: bool) -> int:
    """How many of the span's keys queries outside it may see: all of them, or under a causal mask those up to
    the queries' latest position (left padding's pad rows, at position 0, see the span's first key only). At
    least one: a query that sees none gets a row of -inf, which the bias path zeroes."""
    length = span_positions.shape[-1]
    if not causal:
        return length
    seen = int((q_positions.amax(-1) - span_positions[:, 0]).amax()) + 1  # span positions count up by one
    return min(max(seen, 1), length)


def padded_strided_attention(q, k, v, slopes, scale: float, causal: bool, groups: int, per_row, window,
                             dropout_p: float, bias_rows):
    """Attention with key padding and positions, each batch row's span on the strided path (module docstring).

    q (..., H, i, d); k, v (..., H_kv, j, d); ``per_row`` (q_positions, k_positions, key_padding_mask or None),
    each (n,) or (*batch, n) as ``alibi_attention``'s ``_per_row`` gives them. ``bias_rows(q, k, v, bias)``
    runs queries outside a span with their rows of the bias, bias (b, H, rows or 1, j) (``alibi_attention``'s
    sdpa path, which zeroes a query that sees no key). Consecutive batch rows with the same span share
    each call. The inputs are cut with ``split`` and the outputs joined with ``cat``, whose backward passes
    hand each piece its gradient in one buffer (slicing would zero-fill a whole input's gradient per slice).
    """
    batch = q.shape[:-3]
    q, k, v = (x.reshape(-1, *x.shape[-3:]) for x in (q, k, v))  # (B, H, n, d)
    q_positions, k_positions, keep = (None if x is None else x.expand(*batch, x.shape[-1]).reshape(-1, x.shape[-1])
                                      for x in per_row)  # (B, n)
    spans = [plain_span(q_positions[b], k_positions[b], None if keep is None else keep[b]) for b in range(len(q))]
    runs = [(span, len(list(group))) for span, group in itertools.groupby(spans)]  # batch rows with one span
    outs, first = [], 0
    for (span, size), q_g, k_g, v_g in zip(runs, *(x.split([size for _, size in runs]) for x in (q, k, v)),
                                           strict=True):
        rows = slice(first, first + size)
        first = rows.stop
        if span is None:
            bias = _bias(slopes, q_positions[rows], k_positions[rows], None if keep is None else keep[rows], causal,
                         window)
            outs.append(bias_rows(q_g, k_g, v_g, bias))
            continue
        s, a = span.keys, span.queries
        k_span, v_span = (x.split([s.start, s.stop - s.start, x.shape[-2] - s.stop], dim=-2)[1] for x in (k_g, v_g))
        q_before, q_run, q_after = q_g.split([a.start, a.stop - a.start, q_g.shape[-2] - a.stop], dim=-2)
        pieces = [strided_alibi_attention(q_run, k_span, v_span, slopes, scale, causal, groups, dropout_p=dropout_p,
                                          window=window)]  # (b, H, c - a, d_v)
        for queries, q_part in ((slice(0, a.start), q_before), (slice(a.stop, q_g.shape[-2]), q_after)):
            if q_part.shape[-2]:
                reach = _reach(q_positions[rows, queries], k_positions[rows, s], causal)
                bias = _bias(slopes, q_positions[rows, queries], k_positions[rows, s.start:s.start + reach], None,
                             causal, window)
                piece = bias_rows(q_part, k_span[..., :reach, :], v_span[..., :reach, :], bias)
                pieces.insert(0 if queries.start == 0 else len(pieces), piece)
        outs.append(torch.cat(pieces, -2) if len(pieces) > 1 else pieces[0])  # (b, H, i, d_v)
    out = torch.cat(outs) if len(outs) > 1 else outs[0]
    return out.reshape(*batch, *out.shape[-3:])
