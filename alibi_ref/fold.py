"""ALiBi on the CPU with no (H, N, N) tensor: the bias folded into the dot product, tile by tile.

On either side of the diagonal the ALiBi bias is linear in the key position j. With a
centre c, and s = +1 for keys at or left of the query (j <= i), s = -1 right of it (j > i):

    -m |i - j|  =  s m (j - c)  -  s m (i - c)

The last term is constant along a row, and softmax ignores a row constant; the first is
one more column in the dot product:

    q' = [q, s m / scale],   k' = [k, j - c]   =>   scale (q' . k') = scale (q . k) + s m (j - c)

so torch's fused flash kernel computes a tile of ALiBi attention with nothing but one extra
column. Its CPU build also returns each row's log-sum-exp, which lets tiles be merged.

Tiles. The queries are cut into blocks of B rows; the block at key positions [a, a + B) meets

    keys left of it    j < a        s = +1, no mask
    its diagonal       a <= j < a+B causal: s = +1 under the causal mask
                                    symmetric: s = 0, the (H, B, B) bias given as a mask
                                    (the same for every block, built once)
    keys right of it   j >= a + B   s = -1, no mask (symmetric only)

All tiles of a block share c = a + B // 2. The logits that matter (keys near the row) then
carry about m_max * B / 2 on top of q . k, so float32 rounds them by about that times 2^-24
whatever N is; far keys carry more, but their weights e^(-m |i - j|) are then so small that
their rounding moves nothing. ``block_size`` picks B so that m_max * B / 2 <= FOLD_LIMIT.
(Causal attention would run fastest as one block: the bound, not N, sets how many there are.)

Merging. Tile t returns out_t and lse_t, the log-sum-exp of its shifted logits; its true one
is lse_t - s m (i - c). With L = logsumexp_t(true lse_t), out = sum_t exp(true lse_t - L) out_t.

Backward. The gradient of the whole attention restricted to tile t's keys is the flash backward
of tile t given the merged out and L (shifted into t's frame): the identity ring attention
rests on. No (N, N) tensor is built, forward or backward.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from ._backend import over_flat_batch

# largest m |j - c| the fold lets a float32 logit carry where it matters: a rounding error of
# about FOLD_LIMIT * 2^-24 per logit (tests/test_fold.py bounds the output error it causes)
FOLD_LIMIT = 256.0
# the symmetric diagonal bias (H, B, B) is kept between calls: kept small
SYMMETRIC_MAX_BLOCK = 512
MIN_BLOCK = 16


class Tile(NamedTuple):
    keys: slice  # key positions j
    side: int  # +1: keys at or left of the rows, bias s m (j - c); -1: right of them; 0: bias as a mask
    causal: bool  # the block's own positions under the causal mask


class Block(NamedTuple):
    rows: slice  # query rows (indices into q)
    centre: int  # c, a key position
    tiles: tuple[Tile, ...]


def block_size(max_slope: float, q_len: int, causal: bool) -> int:
    """The largest power of two B with max_slope * B / 2 <= FOLD_LIMIT, capped at q_len."""
    size = q_len if causal else min(q_len, SYMMETRIC_MAX_BLOCK)
    if max_slope > 0:
        size = min(size, 1 << int(2 * FOLD_LIMIT / max_slope).bit_length() - 1)
    return size


def plan(q_len: int, k_len: int, block: int, causal: bool) -> list[Block]:
    """The tiles that cover the attention matrix; queries are the last q_len key positions."""
    offset = k_len - q_len
    blocks = []
    for start in range(0, q_len, block):
        rows = slice(start, min(start + block, q_len))
        first, end = rows.start + offset, rows.stop + offset  # key positions of the rows
        # (symmetric attention allows q_len > k_len: the first rows then sit before key 0)
        low, high = max(first, 0), max(end, 0)
        tiles = [Tile(slice(0, low), +1, False)] if low > 0 else []
        if high > low:
            tiles.append(Tile(slice(low, high), +1 if causal else 0, causal))
        if not causal and high < k_len:
            tiles.append(Tile(slice(high, k_len), -1, False))
        blocks.append(Block(rows, (first + end) // 2, tuple(tiles)))
    return blocks


@over_flat_batch
def folded_attention(q, k, v, slopes, scale: float, causal: bool, block: int):
    """ALiBi attention by folded tiles. q (..., H, i, d); k, v (..., H_kv, j, d | d_v); float32/64, CPU."""
    return _FoldedTiles.apply(q, k, v, slopes.to(q.dtype), scale, causal, block)


class _Frames:
    """q', k', v' with one head size W = max(d + 1, d_v), and each tile's view of them."""

    def __init__(self, q, k, v, slopes, scale: float, block: int, causal: bool):
        self.d, width = q.shape[-1], max(q.shape[-1] + 1, v.shape[-1])
        self.q, self.k, self.v = (_widened(x, width) for x in (q, k, v))  # (B, H | H_kv, n, W)
        self.m = (slopes / scale).view(-1, 1)  # (H, 1): q's extra column, before its sign
        self.q[..., self.d] = self.m
        if not causal:
            self.diagonal_bias = _diagonal_bias(tuple(slopes.tolist()), block, q.dtype, q.device)  # (H, B, B)

    def blocks(self, slopes, q_len: int, k_len: int, block: int, causal: bool):
        """Per block of the plan: its rows, m (i - c) for them (H, n), and each tile with its kernel
        inputs. k's extra column is rewritten for every block: use a block before taking the next."""
        offset = k_len - q_len
        for rows, centre, tiles in plan(q_len, k_len, block, causal):
            self.centre_keys(centre)
            shift = _row_shift(slopes, rows, offset, centre)
            yield rows, shift, [(tile, self.tile(rows, tile, rows.start + offset)) for tile in tiles]

    def centre_keys(self, centre: int):
        """k's extra column becomes j - c, for every key: one write per block, no copy."""
        import torch

        j = torch.arange(self.k.shape[-2], device=self.k.device)
        self.k[..., self.d] = (j - centre).to(self.k.dtype)

    def tile(self, rows: slice, tile: Tile, first: int):
        """(q', k', v', mask) for the kernel: q's extra column is s m / scale. ``first``: row 0's position."""
        q = self.q[:, :, rows]
        if tile.side != 1:
            q = q.clone()
            q[..., self.d] = tile.side * self.m
        mask = None
        if tile.side == 0:
            keys = slice(tile.keys.start - first, tile.keys.stop - first)  # positions within the block
            mask = self.diagonal_bias[:, : rows.stop - rows.start, keys].unsqueeze(0)  # (1, H, n, keys)
        return q, self.k[:, :, tile.keys], self.v[:, :, tile.keys], mask


@functools.lru_cache(maxsize=4)
def _diagonal_bias(slopes: tuple[float, ...], block: int, dtype, device):
    """The (H, B, B) bias of a diagonal block, the same for every block: built once and kept
    (a few MiB), since building it on every call cost as much as the block's attention."""
    import torch

    from .bias import alibi_bias

    return alibi_bias(torch.tensor(slopes, dtype=torch.float64, device=device), block, block).to(dtype)


def _widened(x, width: int):
    """x with zero columns up to ``width`` (one copy; zero columns change no dot product)."""
    import torch.nn.functional as F

    return F.pad(x, (0, width - x.shape[-1]))


def _merge(outs, lses):
    """A block's tiles into its rows: L = logsumexp_t(lse_t), out = sum_t exp(lse_t - L) out_t."""
    if len(outs) == 1:
        return outs[0], lses[0]
    import torch

    lse = torch.logsumexp(torch.stack(lses), dim=0)
    out = outs[0].mul_((lses[0] - lse).exp_().unsqueeze(-1))
    for out_t, lse_t in zip(outs[1:], lses[1:], strict=True):
        out.addcmul_(out_t, (lse_t - lse).exp_().unsqueeze(-1))
    return out, lse


def _row_shift(slopes, rows: slice, offset: int, centre: int):
    """m (i - c) for the block's query positions i: (H, n)."""
    import torch

    i = torch.arange(rows.start + offset, rows.stop + offset, device=slopes.device)
    return slopes.view(-1, 1) * (i - centre).to(slopes.dtype)


def _make_function():
    import torch

    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

    class FoldedTiles(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, slopes, scale, causal, block):
            frames = _Frames(q, k, v, slopes, scale, block, causal)
            outs, lses = [], []  # per block
            for _, shift, tiles in frames.blocks(slopes, q.shape[-2], k.shape[-2], block, causal):
                tile_outs, tile_lses = [], []
                for tile, (q_t, k_t, v_t, mask) in tiles:
                    out_t, lse_t = flash(q_t, k_t, v_t, 0.0, tile.causal, attn_mask=mask, scale=scale)
                    tile_outs.append(out_t)
                    tile_lses.append(lse_t - tile.side * shift)  # the kernel's logits carried + s m (i - c)
                out, lse = _merge(tile_outs, tile_lses)
                outs.append(out)
                lses.append(lse)
            out, lse = (x[0] if len(x) == 1 else torch.cat(x, dim=2) for x in (outs, lses))  # (B, H, i, W), (B, H, i)
            ctx.save_for_backward(q, k, v, slopes, out, lse)
            ctx.setup = (scale, causal, block, v.shape[-1])
            return out[..., : v.shape[-1]]

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad):
            q, k, v, slopes, out, lse = ctx.saved_tensors
            scale, causal, block, d_v = ctx.setup
            d = q.shape[-1]
            frames = _Frames(q, k, v, slopes, scale, block, causal)
            grad = torch.nn.functional.pad(grad, (0, out.shape[-1] - d_v)).contiguous()
            dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
            for rows, shift, tiles in frames.blocks(slopes, q.shape[-2], k.shape[-2], block, causal):
                for tile, (q_t, k_t, v_t, mask) in tiles:
                    lse_t = (lse[:, :, rows] + tile.side * shift).contiguous()  # L in the tile's frame
                    dq_t, dk_t, dv_t = flash_backward(
                        grad[:, :, rows], q_t, k_t, v_t, out[:, :, rows], lse_t, 0.0, tile.causal,
                        attn_mask=mask, scale=scale)
                    dq[:, :, rows] += dq_t[..., :d]
                    dk[:, :, tile.keys] += dk_t[..., :d]
                    dv[:, :, tile.keys] += dv_t[..., :d_v]
            return dq, dk, dv, None, None, None, None

    return FoldedTiles


class _FoldedTiles:
    """The autograd.Function, defined on first use so that importing alibi_ref never imports torch."""

    function = None

    @classmethod
    def apply(cls, *args):
        if cls.function is None:
            cls.function = _make_function()
        return cls.function.apply(*args)
