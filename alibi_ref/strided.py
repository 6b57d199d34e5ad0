"""ALiBi through torch's own fused attention, the bias handed over as a strided view of one row.

The bias depends on i' - j alone (i' = i + k_len - q_len), so for each head it is a Toeplitz
matrix: constant along every diagonal. Read with the queries in reverse order, r = q_len - 1 - i,
it depends on r + j alone, a Hankel matrix, and a Hankel matrix is a view of a single row:

    b[h, i, j] = -m_h |i' - j| = row[h, r + j],      row[h, t] = -m_h |k_len - 1 - t|,
    t = 0 .. q_len + k_len - 2,   i.e.  row[h].as_strided((q_len, k_len), (1, 1))

(The Toeplitz matrix itself would be a view with stride -1 along i, which torch does not allow.)
The view holds H (q_len + k_len - 1) numbers; F.scaled_dot_product_attention's CPU flash kernel
reads its mask through the strides and adds it tile by tile, so no (H, N, N) tensor is ever
built, forward or backward. The bias is the materialised one, value for value: nothing is
folded into the dot product and nothing is lost to precision. The queries are reversed going in
and the output rows coming out: two copies of size (H, N, d).

On the CPU in float32 and float64 (bfloat16: without a causal mask), from 1024 or 4096 keys
(``reach.MIN_KEYS``), a steep head's far keys are not computed at all: ``alibi_ref.reach`` bounds,
from the longest query and key, the distance beyond which they hold less than eps / 8 of any row's
weight, and a head whose bound is short runs as a sliding window of that width.

Causal: the kernel's is_causal keeps the lower triangle of its own (r, j) grid, which after the
reversal is the wrong one, so the -inf sits in the row (row[h, t] = -inf for t > k_len - 1) and
each block of reversed rows r0 .. r1 - 1 is shown only the keys it can see,
j <= k_len - 1 - r0. Each block spends block / 2 keys per row on its own -inf triangle (torch's
CPU kernel skips no tile of a float mask); smaller blocks waste less but make the kernel's q tiles
smaller (below 768 rows it uses 64-row tiles). These blocks run off the CPU, with dropout, and
where ``block`` is given. A small causal call (up to ``ONE_CALL_LOGITS`` logits, B H i j) runs as
one block: there the fixed costs of more kernel calls outweigh the -inf triangle computed for
nothing.

A sliding window (FlashAttention-2's ``window_size``: each query sees the keys with -right <= i' - j <= left)
depends on i' - j alone as well: its -inf sits in the row beside the causal one, and each block of
``WINDOW_ROWS`` reversed rows r0 .. r1 - 1 (positions i' from k_len - r1 to k_len - 1 - r0) is shown only
the keys its windows reach, k_len - r1 - left .. k_len - 1 - r0 + right (``keys_seen``): block + left + right
keys, not k_len, so a narrow window costs its width. On the CPU without dropout these calls run through
the split's kernels (``CausalSplit``, below, each row in one call), whose backward adds each call's dk, dv
into one buffer: autograd's backward of the key slices would zero-fill a whole k and v per call.

Causal, split at the diagonal (the CPU's default for float32 and float64): here the *keys* are
reversed instead, j' = k_len - 1 - j, with their values. The bias then depends on i + j', Hankel
again, a view of the reversed row:

    b[h, i, j] = -m_h |i' - j| = row'[h, i + j'],    row'[h, t] = -m_h |t - (q_len - 1)|,

-inf for t < q_len - 1 under the causal mask (``reversed_keys_row``). Reversing k and v costs two
copies in all; the queries, the output and the log-sum-exp then stay in query order, and each
kernel call reads and writes slices of them, with no copy of its own. Where the queries are few
beside the keys (a decoding step against a KV cache, ``reversing_keys_is_cheaper``) each call's queries
are reversed instead, and its output and log-sum-exp back: copies of a few rows, not of the cache.
Each block of ``SPLIT_ROWS`` queries (reversed rows r0 .. r1 - 1 in ``split_calls``, which counts
from the last query) is cut into the keys all its rows see, j < k_len - r1, a rectangle with no
-inf in it (one call, 256-row tiles), and the diagonal band beyond, in calls of 64 to
``BAND_ROWS`` rows shown only the keys their last query sees (a -inf triangle of at most 128
rows, not of 768). Each call p returns its output o_p and the log-sum-exp l_p of its logits, and
the pieces of a row are one softmax again (a row has at most two, merged a block at a time):

    l = log sum_p exp(l_p),     o = sum_p exp(l_p - l) o_p

The backward pass runs torch's flash backward per call, handed the merged o and l: it recomputes
P = exp(S - l) (the full softmax's weights on this call's keys) and delta = dO . o, so each call
gives dk, dv for its keys and its share of dq. Both are torch's own CPU kernels, the ones
F.scaled_dot_product_attention runs (``aten::_scaled_dot_product_flash_attention_for_cpu``
and its backward), called directly because the public call returns no log-sum-exp; where they
are missing, or with dropout (whose mask the backward could not redraw), the blocks run. Exact as
the blocks are; figures: docs/performance.md.

Causal 16-bit inputs need neither the reversal nor the blocks. Under the causal mask query i sees
j <= i only, where its bias -m (i - j) is the last query's, -m (N - 1 - j), plus m (N - 1 - i):
a constant per row, which softmax ignores. So every query can read the last query's row, a
broadcast view (stride 0 along i), and the kernel's own is_causal hides the keys ahead, in one
call, in query order. The price is precision: the logits now reach m (N - 1), which the kernel's
float32 accumulator rounds to 2^-24 of that; far below a 16-bit output's rounding (taken while it
stays under a quarter of it, ``last_row_fits``), but 100 times the float32 error of the reversal at
N = 4096, so float32 keeps the reversal (split at the diagonal).

Learned slopes: torch's fused kernel refuses a mask that needs a gradient (its math path would
build the (B, H, N, N) weights). So the attention runs with the slopes detached, and
``SlopesGradient`` hands the slopes their gradient in the backward pass, from the softmax's
backward recomputed a block of query rows at a time:

    dL/dm_h = sum_{i,j} dS[h, i, j] * (-|i' - j|),     dS = P * (dP - delta),
    dP = dO V^T,     delta_i = sum_j P[i, j] dP[i, j] = dO_i . O_i

The same call runs on CUDA, correct there (the CUDA tests) but several times slower than
FlexAttention, which computes the bias instead of reading it (docs/performance.md, "CUDA"): ``alibi_attention``
picks it on the CPU only.
"""

from __future__ import annotations

import functools

import torch

from ._backend import grad_taken, over_flat_batch, repeat_heads
from .bias import bias_from_distances
from .bias_cache import cached_bias
from .reach import WINDOW_ROWS, reach_windows

# scores held at once while the slopes' gradient is recomputed: 16 MiB of float32 per tensor
SCORES_PER_BLOCK = 1 << 22
# the split causal form: reversed rows per rectangle (the kernel's 256-row tiles from 768 rows up), and at most
# per band call (``split_calls``)
SPLIT_ROWS, BAND_ROWS = 768, 128
# below this many logits (B H i j) a causal call runs as one kernel call, its -inf triangle computed for nothing:
# the fixed costs of more calls (Python, copies, the kernel's setup) outweigh the triangle (``one_call_is_cheaper``)
ONE_CALL_LOGITS = 1 << 21


def causal_block(q_len: int, n_keys: int) -> int:
    """Reversed query rows for the next kernel call under a causal mask, which shows it n_keys keys.

    Two costs pull apart: each call computes its own -inf triangle, block / 2 keys per row; and
    torch's CPU flash kernel works in 64-row query tiles below 768 rows (slower per row the
    fewer the rows) and in 256-row tiles from 768 up. So: 768 rows while the keys are many and
    the triangle a small part of the work, 256 after, a quarter of the length for short
    sequences (figures: docs/performance.md).
    """
    if n_keys >= 2560:
        return 768
    return min(256, max(64, q_len // 4))


def one_call_is_cheaper(q, k) -> bool:
    """Whether a causal call is small enough to run as one kernel call (``ONE_CALL_LOGITS``; figures:
    docs/performance.md)."""
    return q.shape[:-1].numel() * k.shape[-2] <= ONE_CALL_LOGITS  # (B H i) j


def bias_row(slopes, q_len: int, k_len: int, causal: bool, window=None):
    """(H, q_len + k_len - 1): the one row every entry of the reversed-query bias is read from; a ``window``
    (left, right) puts -inf on the distances beyond it, which depend on i' - j alone too."""
    t = torch.arange(q_len + k_len - 1, device=slopes.device)
    return bias_from_distances(slopes, (k_len - 1) - t, causal, window)  # (H, t)


def effective_window(window, q_len: int, k_len: int, causal: bool):
    """``window`` (left, right), or None where it hides no key from any query at these lengths: the distances
    i' - j run from -(q_len - 1) to k_len - 1, and a causal mask already hides the keys ahead."""
    left, right = window or (None, None)
    if left is not None and left >= k_len - 1:
        left = None
    if right is not None and (causal or right >= q_len - 1):
        right = None
    return None if left is None and right is None else (left, right)


def keys_seen(rows: range, k_len: int, causal: bool, window) -> range:
    """The keys some query of reversed rows ``rows`` sees: those rows are the positions i' = k_len - 1 - r, from
    k_len - rows.stop to k_len - 1 - rows.start, and each sees the keys j with i' - left <= j <= i' + right
    (causal: right = 0; no window: every key)."""
    left, right = window or (None, None)
    if causal:
        right = 0
    first = 0 if left is None else max(0, k_len - rows.stop - left)
    stop = k_len if right is None else min(k_len, k_len - rows.start + right)
    return range(first, stop)


def reversed_keys_row(slopes, q_len: int, k_len: int, causal: bool):
    """(H, q_len + k_len - 1): the row the bias is read from with the keys reversed, row'[h, i + j'] (module
    docstring); ``bias_row`` read backwards."""
    t = torch.arange(q_len + k_len - 1, device=slopes.device)
    return bias_from_distances(slopes, t - (q_len - 1), causal)  # (H, t)


def last_row_fits(q, v, slopes, causal: bool, dropout_p: float) -> bool:
    """Whether a causal call can run as one kernel call reading the last query's row (module docstring).

    Precision: the shift rounds each logit by up to max|m| (N - 1) 2^-24, kept under a quarter of the
    16-bit dtype's unit roundoff (bfloat16: max|m| (N - 1) <= 16384, float16: <= 2048). The kernel:
    only torch's CPU flash kernel has been seen to take a mask and is_causal together, and it takes
    them only without dropout, with v's head size equal to q's and with a mask that needs no gradient
    (else torch's math path runs, which refuses the pair: ``strided_alibi_attention`` detaches
    learned slopes); is_causal aligns the queries to the first keys, so q_len must equal k_len.
    """
    q_len, k_len = q.shape[-2], v.shape[-2]
    if not causal or q_len != k_len or q.device.type != "cpu" or dropout_p > 0 or v.shape[-1] != q.shape[-1]:
        return False
    if grad_taken(slopes):
        return False
    if q.dtype not in (torch.bfloat16, torch.float16):
        return False
    if torch.compiler.is_compiling():
        return False  # the bound reads the slopes' values, which would break torch.compile's graph: the split is exact
    unit_roundoff = torch.finfo(q.dtype).eps / 2
    largest_shift = float(slopes.detach().abs().max()) * (k_len - 1)
    return largest_shift * 2.0**-24 <= unit_roundoff / 4


def hankel_view(row, rows: range, keys: range):
    """row[h, r + j] for the rows r in ``rows`` and the keys j in ``keys``: (1, H, r, j). The rows are reversed
    queries (``bias_row``) or queries beside reversed keys (``reversed_keys_row``).

    ``row`` must own its storage from its first number on, as ``bias_row`` makes it (the view's offset
    counts from the storage's start: asking the row for its own offset would stop torch.compile).
    Four dimensions, like q: given as (H, r, j), torch 2.13 leaves its flash kernel for a path
    several times slower (figures: docs/performance.md).
    """
    H, length = row.shape
    return row.as_strided((1, H, len(rows), len(keys)), (0, length, 1, 1),
                          rows.start + keys.start)


@over_flat_batch
def strided_alibi_attention(q, k, v, slopes, scale: float, causal: bool, groups: int, block: int | None = None,
                            dropout_p: float = 0.0, window=None):
    """ALiBi through F.scaled_dot_product_attention with a strided bias. q (..., H, i, d); k, v (..., H_kv, j, d | d_v).

    ``slopes`` in the dtype the bias is built in (float32 for 16-bit inputs; off the CPU the bias is
    handed to the kernel in q's dtype, as CUDA's kernels need); ``block``: reversed
    query rows per kernel call under a causal mask or a window; unless given, a causal call runs as one kernel
    call where ``last_row_fits``, else split at the diagonal where ``split_fits``, else in blocks of
    ``causal_block`` rows. ``dropout_p``: the kernel's attention dropout. ``window`` (left, right) from
    ``check_window``, with q_len <= k_len (so that every query sees a key, its own position): blocks of
    ``WINDOW_ROWS`` reversed rows, each shown only the keys its rows' windows reach (``keys_seen``).
    """
    window = effective_window(window, q.shape[-2], k.shape[-2], causal)
    if window is not None and q.shape[-2] > k.shape[-2]:
        raise ValueError(f"impl='strided' takes a window with q_len <= k_len only (got {q.shape[-2]} queries against "
                         f"{k.shape[-2]} keys: the first queries could see no key); use 'sdpa' or 'naive'")
    windows = reach_windows(q, k, slopes, scale, causal, groups, window) if dropout_p == 0 else None
    if windows is not None:  # some heads' far keys hold no weight: those heads see a window (alibi_ref.reach)
        return _by_reach(q, k, v, slopes, scale, causal, groups, block, windows, window)
    if grad_taken(slopes) and dropout_p == 0:
        # the fused kernel refuses a mask that needs a gradient: the slopes get theirs beside it
        out = _attention(q, k, v, slopes.detach(), scale, causal, groups, block, 0.0, window)
        return SlopesGradient.apply(out, slopes, q.detach(), k.detach(), v.detach(), scale, causal, groups, window)
    return _attention(q, k, v, slopes, scale, causal, groups, block, dropout_p, window)


def _by_reach(q, k, v, slopes, scale: float, causal: bool, groups: int, block: int | None, windows: list, window):
    """Each KV head whose reach narrows ``window`` (``reach_windows``) alone, with its narrowed window; each
    run of heads between them together, with ``window``. Returns (B, H, i, d_v)."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    outs, u = [], 0
    while u < len(windows):
        end = u + 1
        while windows[u] is None and end < len(windows) and windows[end] is None:
            end += 1
        heads, kv = slice(u * groups, end * groups), slice(u, end)  # query heads of KV heads u .. end - 1
        seen = window if windows[u] is None else effective_window(windows[u], q_len, k_len, causal)
        outs.append(_attention(q[:, heads], k[:, kv], v[:, kv], slopes[heads], scale, causal, groups, block, 0.0,
                               seen))  # (B, (end - u) groups, i, d_v)
        u = end
    return torch.cat(outs, 1)  # (B, H, i, d_v)


def _attention(q, k, v, slopes, scale: float, causal: bool, groups: int, block: int | None, dropout_p: float,
               window=None):
    import torch.nn.functional as F

    q_len, k_len = q.shape[-2], k.shape[-2]
    if window is not None:
        block = block or WINDOW_ROWS  # the one-call forms below would show every row all the keys
    if block is None and last_row_fits(q, v, slopes, causal, dropout_p):
        last = cached_bias(bias_row, slopes, 1, k_len, False)  # (H, j): -m (k_len - 1 - j), the last query's row
        every_query = last.as_strided((1, last.shape[0], q_len, k_len), (0, k_len, 0, 1))  # (1, H, i, j)
        try:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=every_query, is_causal=True, scale=scale,
                                                  enable_gqa=groups > 1)  # (B, H, i, d_v)
        except RuntimeError as refused:
            # a torch whose fused CPU kernel turns the call down (older ones lack GQA there) sends it
            # to its math path, which refuses a mask with is_causal: the blocks below do it instead
            if "is_causal" not in str(refused):
                raise
    if causal and block is None and one_call_is_cheaper(q, k):
        block = q_len
    through_kernels = split_fits(q, v, dropout_p)
    if causal and block is None and through_kernels:
        calls = split_calls(q_len, k_len)
        keys_reversed = reversing_keys_is_cheaper(calls, k_len)
        row = cached_bias(reversed_keys_row if keys_reversed else bias_row, slopes, q_len, k_len, True)  # (H, t)
        return _split(q, k, v, row, scale, groups, calls, keys_reversed)
    row = cached_bias(bias_row, slopes, q_len, k_len, causal, window)  # (H, t), in >= float32
    if window is not None and through_kernels:
        # the blocks below, each row in one call, through the split's kernels: its backward adds each call's dk, dv
        # into one buffer, where autograd's backward of a slice zero-fills a whole k (and v) per call
        calls = [(rows, keys_seen(rows, k_len, causal, window))
                 for rows in (range(r, min(q_len, r + block)) for r in range(0, q_len, block))]
        return _split(q, k, v, row, scale, groups, calls, False)
    if q.device.type != "cpu":
        # 16-bit inputs: the CPU kernel adds a float32 bias in its float32 accumulator, but CUDA's
        # memory-efficient kernel refuses a bias in another dtype than q's and cuDNN misreads one
        row = row.to(q.dtype)
    reversed_q = q.flip(-2)  # (B, H, r, d), r = q_len - 1 - i
    blocks, start = [], 0
    while start < q_len:
        # reversed row r is query i = q_len - 1 - r, which sees keys j <= k_len - 1 - r under a causal mask
        size = (block or causal_block(q_len, k_len - start)) if causal or window else q_len
        rows = range(start, min(q_len, start + size))
        start = rows.stop
        keys = keys_seen(rows, k_len, causal, window)
        blocks.append(F.scaled_dot_product_attention(
            reversed_q[..., rows.start:rows.stop, :], k[..., keys.start:keys.stop, :], v[..., keys.start:keys.stop, :],
            attn_mask=hankel_view(row, rows, keys), scale=scale, enable_gqa=groups > 1, dropout_p=dropout_p,
        ))  # (B, H, r, d_v)
    # back to query order; one copy of the output (each fresh buffer costs page faults at this size)
    return torch.cat([b.flip(-2) for b in reversed(blocks)], -2) if len(blocks) > 1 else blocks[0].flip(-2)


def _split(q, k, v, row, scale: float, groups: int, calls, keys_reversed: bool):
    """``CausalSplit`` over ``calls``, with k and v repeated per query head where the kernel cannot read GQA."""
    if groups > 1 and not _kernel_takes_gqa():
        k, v = repeat_heads(k, groups), repeat_heads(v, groups)  # (B, H, j, d): copies, on older torch only
    return CausalSplit.apply(q, k, v, row, scale, calls, keys_reversed)


def split_fits(q, v, dropout_p: float) -> bool:
    """Whether a causal call can take the split form: torch's CPU flash kernels, with their log-sum-exp, are
    there (torch >= 2.3); the inputs are on the CPU; no dropout; v's head size equal to q's (the kernel's rule)."""
    return (hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward")
            and q.device.type == "cpu" and dropout_p == 0 and v.shape[-1] == q.shape[-1])


@functools.cache
def _kernel_takes_gqa() -> bool:
    """Whether torch's CPU flash kernel reads query head h from KV head h // groups itself (torch 2.13 does)."""
    q, kv = torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 1, 8)
    try:
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, kv, kv)
    except RuntimeError:
        return False
    return True


def split_calls(q_len: int, k_len: int) -> list[tuple[range, range]]:
    """(reversed query rows, keys) of each kernel call of the split causal form (module docstring).

    Reversed row r sees keys j <= k_len - 1 - r. A block of rows r0 .. r1 - 1 takes the keys all its
    rows see, j < k_len - r1, in one call, and the band of keys beyond in calls of ``band`` rows,
    each shown the keys its first row sees: every row is in exactly one band call. Bands of a
    quarter of the queries within 64 to BAND_ROWS rows: fewer rows waste less on -inf, but the
    kernel's fixed cost per call weighs more (figures: docs/performance.md). Rows that
    fit in one band (decoding one token against a cache) go in one call, the rectangle with them.
    """
    band = min(BAND_ROWS, max(64, q_len // 4))
    calls = []
    for r0 in range(0, q_len, SPLIT_ROWS):
        r1 = min(q_len, r0 + SPLIT_ROWS)
        seen_by_all = k_len - r1 if r1 - r0 > band else 0
        if seen_by_all > 0:
            calls.append((range(r0, r1), range(0, seen_by_all)))
        for b0 in range(r0, r1, band):
            calls.append((range(b0, min(r1, b0 + band)), range(seen_by_all, k_len - b0)))
    return calls


class CausalSplit(torch.autograd.Function):
    """Causal ALiBi as kernel calls split at the diagonal, merged by their log-sum-exp (module docstring); and a
    window's blocks, each row in one call.

    ``apply(q, k, v, row, scale, calls, keys_reversed)``: q (B, H, i, d); k, v (B, H_kv, j, d), H a multiple of
    H_kv (query head h reads KV head h // (H / H_kv), in the kernel); ``calls`` from ``split_calls``. With
    ``keys_reversed`` k and v are reversed once and ``row`` comes from ``reversed_keys_row``; else each
    call's queries are reversed as it runs, its output and log-sum-exp back after it, and ``row`` comes
    from ``bias_row`` (cheaper where the queries are few beside the keys, as in a decoding step against a
    KV cache: ``reversing_keys_is_cheaper``).
    Returns (B, H, i, d) in q's dtype; the merge is done in at least float32.
    """

    @staticmethod
    def forward(ctx, q, k, v, row, scale, calls, keys_reversed):
        forward_kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        work = torch.promote_types(q.dtype, torch.float32)
        if keys_reversed:
            k, v = k.flip(-2), v.flip(-2)  # (B, H_kv, j', d), j' = k_len - 1 - j
        calls = _in_kernel_order(calls, q.shape[-2], k.shape[-2], keys_reversed)
        rows_in, out_of = _query_order(keys_reversed)

        def attend(i, j):
            """The output and log-sum-exp of queries i against keys j (in the kernel's order), in query order."""
            o, lse = forward_kernel(rows_in(q[..., i, :]), k[..., j, :], v[..., j, :],
                                    attn_mask=_mask(row, i, j, q.shape[-2], keys_reversed), scale=scale)
            return out_of(o), out_of(lse.unsqueeze(-1)).squeeze(-1)  # (B, H, i, d), (B, H, i)

        out = q.new_empty(q.shape, dtype=work)  # (B, H, i, d)
        lse = q.new_empty(q.shape[:-1], dtype=work)  # (B, H, i)
        blocks = _by_block(calls)
        # one block's bands at a time, merged into its rectangle's rows: a buffer of one block's rows
        rows = max([0] + [i.stop - i.start for (i, _), bands in blocks if bands])  # (max's default stops dynamo)
        band_out = q.new_empty((*q.shape[:-2], rows, q.shape[-1]), dtype=work)  # (B, H, rows, d)
        band_lse = q.new_empty((*q.shape[:-2], rows), dtype=work)  # (B, H, rows)
        for (i, j), bands in blocks:
            out[..., i, :], lse[..., i] = attend(i, j)
            if not bands:  # the rows' only call
                continue
            o_2, l_2 = band_out[..., :i.stop - i.start, :], band_lse[..., :i.stop - i.start]
            for b, j_b in bands:
                local = slice(b.start - i.start, b.stop - i.start)
                o_2[..., local, :], l_2[..., local] = attend(b, j_b)
            # l = log(e^l_1 + e^l_2), o = e^(l_1 - l) o_1 + e^(l_2 - l) o_2: one softmax over both calls' keys
            o_1, l_1 = out[..., i, :], lse[..., i]
            merged = torch.logaddexp(l_1, l_2)  # (B, H, i)
            o_1.mul_((l_1 - merged).exp_().unsqueeze(-1)).add_(o_2.mul_((l_2 - merged).exp_().unsqueeze(-1)))
            l_1.copy_(merged)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, row, out, lse)  # k, v reversed or not: they replace the caller's in memory
        ctx.scale, ctx.calls, ctx.keys_reversed = scale, calls, keys_reversed
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        backward_kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        q, k, v, row, out, lse = ctx.saved_tensors
        rows_in, out_of = _query_order(ctx.keys_reversed)
        # written by each row's (key's) first call and added to after; keys no call showed get 0 at the end
        dq, dk, dv = (torch.empty_like(x, dtype=lse.dtype) for x in (q, k, v))
        keys_written = slice(0, 0)
        for i, j, first in ctx.calls:
            # the merged out and lse: P = exp(S - lse) is the whole softmax's weight on these keys
            dq_p, dk_p, dv_p = backward_kernel(
                *(rows_in(x[..., i, :]) for x in (grad_out, q)), k[..., j, :], v[..., j, :], rows_in(out[..., i, :]),
                rows_in(lse[..., i].unsqueeze(-1)).squeeze(-1), 0.0, False,
                attn_mask=_mask(row, i, j, q.shape[-2], ctx.keys_reversed), scale=ctx.scale)
            if first:
                dq[..., i, :] = out_of(dq_p)
            else:
                dq[..., i, :] += out_of(dq_p)
            keys_written = _write_or_add((dk, dv), (dk_p, dv_p), j, keys_written)
        for grad in (dk, dv):  # keys no call showed (a window's, behind every query's reach): no gradient
            grad[..., :keys_written.start, :] = 0
            grad[..., keys_written.stop:, :] = 0
        if ctx.keys_reversed:
            dk, dv = dk.flip(-2), dv.flip(-2)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def reversing_keys_is_cheaper(calls: list[tuple[range, range]], k_len: int) -> bool:
    """Whether the causal split should reverse the keys and values (copies of k_len rows, two each pass, held
    for the whole call) rather than each call's queries and output (copies of the call's rows, two each,
    held for one call): where the calls' rows add up to more than the keys (rows in a rectangle and a band)."""
    return k_len < sum(len(rows) for rows, _ in calls)


def _query_order(keys_reversed: bool):
    """(into the kernel, out of it) for a block of query rows (dim -2): as they are, or reversed both ways."""
    if keys_reversed:
        return (lambda x: x), (lambda x: x)
    return (lambda x: x.flip(-2)), (lambda x: x.flip(-2))


def _in_kernel_order(split: list[tuple[range, range]], q_len: int, k_len: int, keys_reversed: bool):
    """``split_calls``' calls as (queries i in query order, keys j in the order the kernel reads them, whether it
    is the rows' first call: rows no earlier call covered, as the calls come in the order of their rows)."""
    calls, covered = [], 0
    for rows, keys in split:
        j = slice(k_len - keys.stop, k_len - keys.start) if keys_reversed else slice(keys.start, keys.stop)
        calls.append((_query_rows(rows, q_len), j, rows.start >= covered))
        covered = max(covered, rows.stop)
    return calls


def _mask(row, i: slice, j: slice, q_len: int, keys_reversed: bool):
    """The bias of queries i against keys j, both as the kernel reads them: (1, H, i, j)."""
    rows = range(i.start, i.stop) if keys_reversed else range(q_len - i.stop, q_len - i.start)
    return hankel_view(row, rows, range(j.start, j.stop))


def _by_block(calls):
    """The calls as (first call's (i, j), [the (i, j) of the bands beside it]): a rectangle and the bands that
    tile its rows, or a band alone (split_calls: a block's rectangle comes before its bands)."""
    blocks = []
    for i, j, first in calls:
        if first:
            blocks.append(((i, j), []))
        else:
            blocks[-1][1].append((i, j))
    for (i, _), bands in blocks:
        edge = i.start
        for b, _ in sorted(bands, key=lambda band: band[0].start):
            if b.start != edge:
                raise AssertionError(f"split_calls' bands do not tile their rectangle's rows {i}: {bands}")
            edge = b.stop
        if bands and edge != i.stop:
            raise AssertionError(f"split_calls' bands do not tile their rectangle's rows {i}: {bands}")
    return blocks


def _write_or_add(grads, parts, j: slice, written: slice) -> slice:
    """Each grad[..., j, :] gets its part: written where no earlier call wrote, added where one did; returns the
    keys written once this call's are. The keys written so far are one span, ``written`` (empty: stop 0), which
    j overlaps or touches (split_calls: the keys seen grow from one end)."""
    if not written.stop:
        lo = hi = j.start
    elif j.stop < written.start or j.start > written.stop:
        raise AssertionError(f"keys {j} leave a gap beside the keys {written} already written")
    else:  # [lo, hi): written before
        lo = min(max(written.start, j.start), j.stop)
        hi = max(min(written.stop, j.stop), lo)
    for grad, part in zip(grads, parts, strict=True):
        grad[..., j.start:lo, :] = part[..., :lo - j.start, :]
        grad[..., lo:hi, :] += part[..., lo - j.start:hi - j.start, :]
        grad[..., hi:j.stop, :] = part[..., hi - j.start:, :]
    return slice(min(written.start, j.start), max(written.stop, j.stop)) if written.stop else j


def _query_rows(rows: range, q_len: int) -> slice:
    """The queries i = q_len - 1 - r of reversed rows r in ``rows``, as a slice in query order."""
    return slice(q_len - rows.stop, q_len - rows.start)


class SlopesGradient(torch.autograd.Function):
    """The attention output unchanged, and in the backward pass the slopes' gradient (module docstring).

    ``apply(out, slopes, q, k, v, scale, causal, groups, window)``: out (B, H, i, d_v) from the fused kernel
    with the slopes detached, which keeps its own gradient path to q, k and v. The scores are
    recomputed a block of query rows at a time (SCORES_PER_BLOCK), in the slopes' dtype (at least
    float32): memory of one block's (B, H, rows, j), never (B, H, i, j).
    """

    @staticmethod
    def forward(ctx, out, slopes, q, k, v, scale, causal, groups, window):
        ctx.save_for_backward(out, slopes, q, k, v)
        ctx.settings = scale, causal, groups, window
        return out.view_as(out)

    @staticmethod
    @torch.autograd.function.once_differentiable  # a second derivative would miss q, k, v's part: refused
    def backward(ctx, grad_out):
        out, slopes, q, k, v = ctx.saved_tensors
        scale, causal, groups, window = ctx.settings
        work = slopes.dtype
        q, k, v, out, d_out = (x.to(work) for x in (q, k, v, out, grad_out))
        k, v = repeat_heads(k, groups), repeat_heads(v, groups)  # (B, H, j, d)
        B, H, q_len, _ = q.shape
        k_len = k.shape[-2]
        delta = (d_out * out).sum(-1, keepdim=True)  # (B, H, i, 1): sum_j P dP = dO . O
        rows = max(1, SCORES_PER_BLOCK // (B * H * k_len))
        keys = torch.arange(k_len, device=q.device)
        grad = torch.zeros_like(slopes)
        for start in range(0, q_len, rows):
            i = slice(start, min(q_len, start + rows))
            j = slice(0, i.stop + (k_len - q_len) if causal else k_len)  # causal: the keys these rows see
            rel = (torch.arange(i.start, i.stop, device=q.device) + (k_len - q_len))[:, None] - keys[j]  # (i, j)
            bias = bias_from_distances(slopes, rel, causal, window)  # (H, i, j)
            scores = q[..., i, :] @ k[..., j, :].transpose(-1, -2) * scale + bias
            d_probs = d_out[..., i, :] @ v[..., j, :].transpose(-1, -2)  # (B, H, i, j)
            d_scores = scores.softmax(-1) * (d_probs - delta[..., i, :])  # the softmax's backward
            grad += (d_scores * -rel.abs().to(work)).sum((0, 2, 3))  # d bias / d m_h = -|i' - j|
        return grad_out, grad, None, None, None, None, None, None, None
