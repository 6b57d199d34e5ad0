"""ALiBi as a FlexAttention score_mod: the bias computed inside the fused kernel, element by element.

FlexAttention (torch >= 2.5) compiles attention with a user function applied to each score, so
the kernel evaluates -m_h |i' - j| from the tile's indices and no bias tensor ever exists. With
torch.compile it runs fused on CUDA (Triton) and on CPU; uncompiled it would materialise the
scores, so it is only ever called compiled. The causal mask is a block mask: whole tiles above
the diagonal are skipped, not computed and thrown away.
"""

from __future__ import annotations

import functools

from ._backend import over_flat_batch


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
    """Compiled for the first shape it sees, and once more with its lengths as symbols where a second comes
    (torch.compile's automatic dynamic shapes): with ``dynamic=False`` every new length compiled again, for
    seconds, and from the ninth on torch gave up and ran FlexAttention uncompiled (scores materialised), so
    a decoding loop slowed to that after eight tokens."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


@functools.lru_cache(maxsize=64)
def _causal_block_mask(q_len: int, k_len: int, device):
    """Which tiles the causal mask leaves whole, partial or empty: built once per shape. On CUDA it
    is built compiled, holding no (q_len, k_len) tensor (uncompiled it took gigabytes at
    N = 16384: README, "CUDA"); torch 2.13's CPU compiler fails on it
    for q_len = 1, so the CPU builds it eagerly."""
    import torch

    return _block_mask(q_len, k_len, device, _offset(q_len, k_len, device), torch.device(device).type == "cuda")


def _block_mask(q_len: int, k_len: int, device, offset, compiled: bool = False):
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(causal_mask(offset), None, None, q_len, k_len, device=device, _compile=compiled)


def _offset(q_len: int, k_len: int, device):
    """k_len - q_len as a tensor, not an int, so that a decoding loop's growing offset needs no
    recompilation; int32 like the kernel's indices (int64 made its index arithmetic 64-bit).

    Filled on the device, not copied from the host: ``torch.tensor(..., device="cuda")`` copies
    from pageable memory and waits for the stream, which stalls a model's queued kernels at every
    attention call (and is not allowed while a CUDA graph is captured)."""
    import torch

    return torch.full((), k_len - q_len, device=device, dtype=torch.int32)


@over_flat_batch
def flex_alibi_attention(q, k, v, slopes, scale: float, causal: bool, groups: int):
    """ALiBi attention through compiled FlexAttention. q (..., H, i, d); k, v (..., H_kv, j, d | d_v)."""
    import torch

    q_len, k_len = q.shape[-2], k.shape[-2]
    causal = causal and q_len > 1  # one query is the last position: it sees every key, no mask to build
    if torch.compiler.is_compiling():
        # inside a model being compiled the trace builds the mask, and the offset stays a number of the trace
        # (an int, or a symbol where lengths vary): CPU's flex kernel cannot read a tensor made inside the
        # graph (InductorError: NoValidChoicesError), and the model's own compilation fuses the call
        from torch.nn.attention.flex_attention import flex_attention as attend

        offset = k_len - q_len
        block_mask = _block_mask(q_len, k_len, q.device, offset) if causal else None
    else:
        attend, offset = _compiled_flex_attention(), _offset(q_len, k_len, q.device)
        block_mask = _causal_block_mask(q_len, k_len, q.device) if causal else None
    return attend(q, k, v, score_mod=alibi_score_mod(slopes.float(), offset), block_mask=block_mask, scale=scale,
                  enable_gqa=groups > 1)
