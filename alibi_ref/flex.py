"""ALiBi as a FlexAttention score_mod: the bias computed inside the fused kernel, element by element.

FlexAttention (torch >= 2.5) compiles attention with a user function applied to each score, so
the kernel evaluates -m_h |i' - j| from the tile's indices and no bias tensor ever exists. With
torch.compile it runs fused on CUDA (Triton) and on CPU; uncompiled it would materialise the
scores, so it is only ever called compiled. What a query may not see (the causal mask, key padding,
a sliding window) is a block mask: whole tiles nobody sees are skipped, not computed and thrown away.

Distances: rel = i' - j, how far key j lies behind query i, with the queries at the end of the keys
(i' = i + k_len - q_len); or, with explicit positions, rel = p_i - p_j from each batch row's own
(left padding, packed sequences, caches with gaps: ``alibi_attention``'s ``q_positions``).
"""

from __future__ import annotations

import functools

from ._backend import over_flat_batch
from .dispatch import FEW_QUERIES


def distance(offset, positions=None):
    """rel(b, q_idx, kv_idx): i + offset - j, or q_positions[b, i] - k_positions[b, j] where ``positions``
    = (q_positions (B, i), k_positions (B, j)) is given. ``offset`` = k_len - q_len."""
    if positions is None:
        return lambda b, q_idx, kv_idx: q_idx + offset - kv_idx
    q_positions, k_positions = positions
    return lambda b, q_idx, kv_idx: q_positions[b, q_idx] - k_positions[b, kv_idx]


def alibi_score_mod(slopes, offset, positions=None, behind_only: bool = False):
    """The score_mod: ALiBi exactly as the paper writes it, -m_h |rel| (``distance``). ``behind_only``: every key
    a query sees is at or behind it (causal), so rel >= 0 and the abs can go (a key ahead of the query gets a
    score here, but the mask replaces it with -inf). The kernel's one instruction less measured faster on an H100,
    forward and backward (docs/performance.md, "CUDA"), the outputs identical."""
    rel = distance(offset, positions)

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * rel(b, q_idx, kv_idx).abs()

    def alibi_behind(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * rel(b, q_idx, kv_idx)

    return alibi_behind if behind_only else alibi


def visibility(offset, causal: bool, positions=None, key_padding_mask=None, window=None):
    """The mask_mod of the keys each query sees, or None where it sees every key: with ``causal`` none
    ahead of it (rel < 0), with ``key_padding_mask`` (B, j) only the keys that exist, with ``window``
    (left, right) only those at most ``left`` behind it and ``right`` ahead."""
    rel = distance(offset, positions)
    left, right = window or (None, None)
    rules = [rule for rule, wanted in [
        (lambda b, q_idx, kv_idx: rel(b, q_idx, kv_idx) >= 0, causal),
        (lambda b, q_idx, kv_idx: key_padding_mask[b, kv_idx], key_padding_mask is not None),
        (lambda b, q_idx, kv_idx: rel(b, q_idx, kv_idx) <= left, left is not None),
        (lambda b, q_idx, kv_idx: rel(b, q_idx, kv_idx) >= -right, right is not None)] if wanted]
    if not rules:
        return None

    def visible(b, h, q_idx, kv_idx):
        seen = rules[0](b, q_idx, kv_idx)
        for rule in rules[1:]:
            seen = seen & rule(b, q_idx, kv_idx)
        return seen

    return visible


@functools.cache
def _compiled_flex_attention():
    """Compiled once per shape, the keys' length excepted in a decoding step (up to FEW_QUERIES queries and no
    block mask; ``_the_key_length_may_vary``): before, every new cache length compiled again, for seconds, and
    from the ninth on torch gave up and ran FlexAttention uncompiled (scores materialised), so a decoding loop
    slowed to that after eight tokens. Every other call compiles for its shape, the fast kernel (a block mask
    holds the lengths as numbers anyway)."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _the_key_length_may_vary(k, v) -> None:
    """Compile for the keys' length as a symbol, every other size as it is (``k``, ``v`` here are the
    kernels' own views, not the caller's tensors): a decoding loop, whose cache grows by a key a step,
    compiles once. Decoding only (up to FEW_QUERIES queries): on an H100 the kernel compiled for a symbolic
    length ran far slower than the one compiled for the length itself (docs/performance.md, "CUDA").
    Left to torch.compile's automatic dynamic shapes, every size that changed became a symbol, and torch
    2.13's CPU compiler wrote C++ that does not compile (``cur_kvSplitSize5 was not declared``) once the
    queries' and the keys' lengths were two symbols. "maybe": where a kernel needs the length as a number
    after all, torch compiles for that number instead of failing. A length of 1 is always a number to torch."""
    import torch

    if k.shape[-2] > 1:
        torch._dynamo.maybe_mark_dynamic(k, k.ndim - 2)
        torch._dynamo.maybe_mark_dynamic(v, v.ndim - 2)


@functools.lru_cache(maxsize=64)
def _shape_block_mask(q_len: int, k_len: int, device, causal: bool, window=None):
    """The block mask of the causal mask and a window, which depend on the shape only: built once per shape, from
    the tiles' corners (``_band_block_mask``) rather than by evaluating the mask at every (i, j) as torch's
    ``create_block_mask`` does. That took a (q_len, k_len) tensor uncompiled (gigabytes at N = 16384) and, compiled,
    more than 35 s on a fresh H100 process before the first causal call at N = 16384 could run
    (docs/performance.md, "CUDA")."""
    return _band_block_mask(q_len, k_len, device, *_band(causal, window),
                            visibility(_offset(q_len, k_len, device), causal, window=window))


def _rows_block_mask(q_len: int, k_len: int, device, causal: bool, window, positions, key_padding_mask, mask_mod):
    """A batch row's own block mask, per row, for its positions and the keys that exist (``_band_block_mask``):
    built at every call, since it follows the batch's values (8 ms for 8 rows of 4096 on a 2-core CPU, with no
    compilation, where torch's builder compiled for every new shape, stalling the first call)."""
    return _band_block_mask(q_len, k_len, device, *_band(causal, window), mask_mod, positions=positions,
                            key_padding_mask=key_padding_mask)


_UNBOUNDED = 1 << 62  # farther than any two positions apart (int64)


def _band(causal: bool, window) -> tuple[int, int]:
    """(lowest, highest) rel a query sees: causal none ahead of it, a window (left, right) at most left behind
    and right ahead."""
    left, right = window or (None, None)
    lowest = max(0 if causal else -_UNBOUNDED, -_UNBOUNDED if right is None else -right)
    return lowest, _UNBOUNDED if left is None else left


def _band_block_mask(q_len: int, k_len: int, device, lowest, highest, mask_mod, block: int = 128,
                     positions=None, key_padding_mask=None):
    """The BlockMask of the keys with lowest <= rel <= highest (rel = i' - j, i' = i + k_len - q_len), equal to
    ``create_block_mask(mask_mod, None, None, q_len, k_len)`` for the mask_mod of that band, tensor for tensor.
    ``lowest`` and ``highest`` are ints, or one per head (lists): then the mask is per head, as
    ``create_block_mask(mask_mod, None, H, ...)`` builds it (each head's reach, ``alibi_ref.reach``).

    Over a tile of real queries i0..i1 and keys j0..j1, rel takes every integer from i0' - j1 to i1' - j0, so
    the tile holds a visible score iff that range meets [lowest, highest], and is full iff the range lies inside
    it and the tile is a whole block (torch pads the last blocks with hidden scores). (q_blocks, k_blocks) here,
    where torch's builder evaluates q_len x k_len scores.

    Per batch row (``positions`` = (q_positions (B, i), k_positions (B, j)), ``key_padding_mask`` (B, j)): the
    same from each tile's least and greatest positions among its keys that exist. A full tile is still exactly
    torch's (every pair visible); a tile is called partial wherever its range meets the band, which between
    scattered positions or keys may hold no visible pair after all: computed, masked, the same output, where
    torch's builder would have skipped it."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    if positions is None:  # every row the same: i' and j
        q_pos = torch.arange(q_len, device=device)[None] + (k_len - q_len)  # (1, i)
        k_pos = torch.arange(k_len, device=device)[None]  # (1, j)
    else:
        q_pos, k_pos = (p.to(device=device, dtype=torch.int64) for p in positions)  # (B, i), (B, j)
    exists = torch.ones_like(k_pos, dtype=torch.bool) if key_padding_mask is None else key_padding_mask.to(device)
    q_least, q_greatest = _tile_bounds(q_pos, torch.ones_like(q_pos, dtype=torch.bool), block)  # (B | 1, q_blocks)
    k_least, k_greatest = _tile_bounds(k_pos, exists, block)  # (B | 1, k_blocks)
    k_exists = _blocks(exists, block, False)  # (B | 1, k_blocks, block); the last block's padding is not a key
    nearest = (q_least[:, :, None] - k_greatest[:, None, :])[:, None]  # the tile's smallest rel, (B | 1, 1, qb, kb)
    farthest = (q_greatest[:, :, None] - k_least[:, None, :])[:, None]  # its largest
    # whole: a whole block of queries, and of keys that all exist; some: any key there exists
    whole_q = (torch.arange(0, q_len, block, device=device) + block <= q_len)[:, None]  # (q_blocks, 1)
    whole = whole_q & k_exists.all(-1)[:, None, None, :]  # (B | 1, 1, q_blocks, k_blocks)
    some = k_exists.any(-1)[:, None, None, :]
    if not isinstance(lowest, int):  # one bound per head: (H, 1, 1) against the tiles' (q_blocks, k_blocks)
        lowest, highest = (torch.tensor(bound, device=device).view(-1, 1, 1) for bound in (lowest, highest))
    full = whole & (nearest >= lowest) & (farthest <= highest)
    partial = some & (farthest >= lowest) & (nearest <= highest) & ~full

    def ordered(tiles):  # as torch's _dense_to_ordered: per query block, the count and the key blocks seen first
        tiles = tiles.to(torch.int32)  # (B | 1, H | 1, q_blocks, k_blocks)
        return (tiles.sum(-1).to(torch.int32),
                torch.argsort(tiles, dim=-1, descending=True, stable=True).to(torch.int32))

    return BlockMask.from_kv_blocks(*ordered(partial), *ordered(full), BLOCK_SIZE=(block, block),
                                    mask_mod=mask_mod, seq_lengths=(q_len, k_len))


# what a block without a position holds (int64): never compared as one, its tiles hold no key that exists
_NO_VALUE = 1 << 40


def _blocks(x, block: int, fill):
    """x (..., n) as (..., blocks, block), the last block filled out with ``fill``."""
    import torch.nn.functional as F

    return F.pad(x, (0, -x.shape[-1] % block), value=fill).unflatten(-1, (-1, block))


def _tile_bounds(positions, exists, block: int):
    """Per block of ``block`` along the last dimension: the least and the greatest of the positions that exist,
    each (..., blocks); a block with none holds +-_NO_VALUE (its tiles are empty: no key there exists)."""
    least = _blocks(positions.masked_fill(~exists, _NO_VALUE), block, _NO_VALUE).amin(-1)
    greatest = _blocks(positions.masked_fill(~exists, -_NO_VALUE), block, -_NO_VALUE).amax(-1)
    return least, greatest


def _causal_block_mask(q_len: int, k_len: int, device):
    return _shape_block_mask(q_len, k_len, device, True)


def _block_mask(mask_mod, batch: int | None, q_len: int, k_len: int, device):
    """torch's own builder, inside a model being compiled: the trace builds the mask with the model."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(mask_mod, batch, None, q_len, k_len, device=device)


def _offset(q_len: int, k_len: int, device):
    """k_len - q_len as a tensor, not an int, so that a decoding loop's growing offset needs no
    recompilation; int32 like the kernel's indices (int64 made its index arithmetic 64-bit).

    Filled on the device, not copied from the host: ``torch.tensor(..., device="cuda")`` copies
    from pageable memory and waits for the stream, which stalls a model's queued kernels at every
    attention call (and is not allowed while a CUDA graph is captured)."""
    import torch

    return torch.full((), k_len - q_len, device=device, dtype=torch.int32)


@over_flat_batch
def flex_alibi_attention(q, k, v, slopes, scale: float, causal: bool, groups: int, positions=None,
                         key_padding_mask=None, window=None):
    """ALiBi attention through compiled FlexAttention. q (B, H, i, d); k, v (B, H_kv, j, d | d_v) (any leading
    dimensions: ``over_flat_batch``). ``positions`` (q_positions (B, i), k_positions (B, j)) and
    ``key_padding_mask`` (B, j), per row of the flattened batch; ``window`` (left, right) as ``check_window``
    gives it. A query that sees no key gets zeros, as FlexAttention gives them."""
    import torch

    q_len, k_len = q.shape[-2], k.shape[-2]
    behind_only = causal  # every key a query sees is at or behind it
    # one query with the default positions is the last position: it sees every key, no causal mask to build
    causal = causal and (q_len > 1 or positions is not None)
    per_row = positions is not None or key_padding_mask is not None  # what each batch row sees is its own
    compiling = torch.compiler.is_compiling()
    if positions is not None:  # int32 like the kernel's own indices
        positions = tuple(p.to(device=q.device, dtype=torch.int32) for p in positions)
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.to(q.device)
    # inside a model being compiled the trace builds the mask, and the offset stays a number of the trace (an
    # int, or a symbol where lengths vary): CPU's flex kernel cannot read a tensor made inside the graph
    # (InductorError: NoValidChoicesError), and the model's own compilation fuses the call
    offset = k_len - q_len if compiling else _offset(q_len, k_len, q.device)
    if not (compiling or per_row):
        block_mask = _shape_block_mask(q_len, k_len, q.device, causal, window) if causal or window else None
    elif (visible := visibility(offset, causal, positions, key_padding_mask, window)) is None:
        block_mask = None
    elif compiling:
        block_mask = _block_mask(visible, q.shape[0] if per_row else None, q_len, k_len, q.device)
    else:
        block_mask = _rows_block_mask(q_len, k_len, q.device, causal, window, positions, key_padding_mask, visible)
    if compiling:
        from torch.nn.attention.flex_attention import flex_attention as attend
    else:
        attend = _compiled_flex_attention()
        # a block mask holds the lengths as numbers: with one, each shape compiles
        if block_mask is None and q_len <= FEW_QUERIES:
            _the_key_length_may_vary(k, v)
    d_v = v.shape[-1]
    q, k, v = _wide_enough_heads(q, k, v)
    out = attend(q, k, v, score_mod=alibi_score_mod(slopes.float(), offset, positions, behind_only),
                 block_mask=block_mask, scale=scale, enable_gqa=groups > 1)
    return out[..., :d_v]  # (B, H, i, d_v)


# the least head size each device's FlexAttention takes. CUDA (Triton): tl.dot needs 16, and torch's compiler raises
# NotImplementedError below it ("NYI: embedding dimension ... must be at least 16") only after seconds of compiling,
# so unpadded, a call with heads of 4 stalls and then fails. The CPU: torch 2.13's compiled kernel gives wrong rows for
# head sizes of 8 and 16 on AVX2 CPUs without AVX-512 (an AMD EPYC): some rows of the last (b, h) at N = 40..136,
# with no score_mod and no mask too; 24 and up are right (docs/performance.md, "FlexAttention on the CPU"). Heads
# padded with zeros to these sizes avoid both.
CPU_FLEX_MIN_HEAD_DIM = 32
TRITON_MIN_HEAD_DIM = 16  # CUDA, and the other devices whose kernels torch writes in Triton


def _wide_enough_heads(q, k, v):
    """q, k, v with head sizes of at least the device's least (``CPU_FLEX_MIN_HEAD_DIM``, ``TRITON_MIN_HEAD_DIM``):
    zeros appended to q and k add nothing to q.k, and the columns appended to v come out as zeros the caller cuts
    off. The scale stays the caller's."""
    import torch.nn.functional as F

    least = CPU_FLEX_MIN_HEAD_DIM if q.device.type == "cpu" else TRITON_MIN_HEAD_DIM

    def wide(x):
        return x if x.shape[-1] >= least else F.pad(x, (0, least - x.shape[-1]))

    return wide(q), wide(k), wide(v)
