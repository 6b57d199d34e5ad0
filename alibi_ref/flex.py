"""ALiBi as a FlexAttention score_mod: the bias computed inside the fused kernel, element by element.

FlexAttention (torch >= 2.5) compiles attention with a user function applied to each score, so
the kernel evaluates -m_h |i' - j| from the tile's indices and no bias tensor ever exists. With
torch.compile it runs fused on CUDA (Triton) and on CPU; uncompiled it would materialise the
scores, so it is only ever called compiled. The causal mask is a block mask: whole tiles above
the diagonal are skipped, not computed and thrown away.
"""

from __future__ import annotations

import functools


def alibi_score_mod(slopes, offset):
    """The score_mod: ALiBi exactly as the paper writes it. ``offset`` = k_len - q_len (a tensor)."""

    def alibi(score, b, h, q_idx, kv_idx):
        # queries sit at the end of the keys: query i is at key position i' = i + offset
        return score - slopes[h] * (q_idx + offset - kv_idx).abs()

    return alibi


def causal_mask(offset):
    def causal(b, h, q_idx, kv_idx):
        return q_idx + offset >= kv_idx

    return causal


@functools.cache
def _compiled_flex_attention():
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=64)
def _causal_block_mask(q_len: int, k_len: int, device):
    """Which tiles the causal mask leaves whole, partial or empty: built once per shape. On CUDA it
    is built compiled, holding no (q_len, k_len) tensor (uncompiled, N = 16384 took 2.5 GiB on
    an H100); torch 2.13's CPU compiler fails on it for q_len = 1, so the CPU builds it eagerly."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    offset = torch.tensor(k_len - q_len, device=device, dtype=torch.int32)
    return create_block_mask(causal_mask(offset), None, None, q_len, k_len, device=device,
                             _compile=torch.device(device).type == "cuda")


def flex_alibi_attention(q, k, v, slopes, scale: float, causal: bool, groups: int):
    """ALiBi attention through compiled FlexAttention. q (..., H, i, d); k, v (..., H_kv, j, d | d_v)."""
    import torch

    lead = q.shape[:-3]
    q4, k4, v4 = (x.reshape(-1, *x.shape[-3:]) for x in (q, k, v))  # (B, H, n, d)
    q_len, k_len = q4.shape[-2], k4.shape[-2]
    # a tensor, not an int: a decoding loop's growing offset then needs no recompilation;
    # int32 like the kernel's indices (an int64 would turn the index arithmetic into 64-bit)
    offset = torch.tensor(k_len - q_len, device=q.device, dtype=torch.int32)
    block_mask = _causal_block_mask(q_len, k_len, q.device) if causal else None
    out = _compiled_flex_attention()(q4, k4, v4, score_mod=alibi_score_mod(slopes.float(), offset),
                                     block_mask=block_mask, scale=scale, enable_gqa=groups > 1)
    return out.reshape(*lead, *out.shape[-3:])
