"""ALiBiMultiheadAttention: a drop-in attention layer for a transformer block."""

from __future__ import annotations

import torch
from torch import nn

from .attention import alibi_attention
from .bias import check_window
from .dispatch import check_impl
from .slopes import get_slopes


class ALiBiMultiheadAttention(nn.Module):
    """Multi-head attention with ALiBi and no position embedding anywhere.

    x (B, T, d_model) -> (B, T, d_model). ``n_kv_heads`` < ``n_heads`` gives GQA
    (1 gives MQA). The slopes live in a non-persistent buffer: they follow
    ``.to(device)``, stay float32 and exact under ``.to(torch.bfloat16)`` (float64 in
    a float64 layer), are not in the state dict and are never trained. The bias is built for the lengths of each
    call, on the inputs' device and dtype; nothing is cached, so nothing goes stale.

    With ``past_kv=(k, v)`` from an earlier call (``use_cache=True``) the new
    queries are placed after the cached keys: one-token decoding steps give the
    same result as running the whole sequence at once.

    Padded batches: ``attention_mask`` (B, T_past + T), True (or 1) where a token exists, as in
    Hugging Face. Positions then default to BLOOM's ``attention_mask.cumsum(-1) - 1`` (pads at 0),
    so a left-padded prompt gets the same distances as alone; ``positions`` (B, T_past + T) sets
    them explicitly (packed sequences). ``softmax_scale`` replaces 1/sqrt(head_dim); ``dropout`` is
    attention dropout on the weights, in training mode only; ``window`` (left, right) a sliding window
    (``alibi_attention``'s). ``impl``: the attention path, ``alibi_attention``'s (on the CPU the default runs a
    padded batch's prompts on the strided path, ``alibi_ref.padded``; ``"flex"`` takes padding and positions on
    CUDA without building the (B, H, i, j) bias).
    """

    slopes: torch.Tensor

    def __init__(
        self, d_model: int, n_heads: int, *, n_kv_heads: int | None = None, causal: bool = False,
        schedule: str = "paper", max_bias: float = 8.0, slopes=None, bias: bool = True,
        softmax_scale: float | None = None, dropout: float = 0.0, window=None, impl: str = "auto", device=None,
        dtype=None,
    ):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads < 1 or d_model % n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads >= 1, got d_model={d_model}, n_heads={n_heads}")
        if n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(f"n_heads must be a multiple of n_kv_heads, got {n_heads} and {n_kv_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        check_impl(impl, dropout > 0)  # refused here, not at the first call
        if slopes is None:
            slopes = get_slopes(n_heads, schedule, max_bias=max_bias)
        slopes = torch.as_tensor(slopes, dtype=torch.float64).flatten()
        if slopes.numel() != n_heads:
            raise ValueError(f"need one slope per head: {n_heads} heads, got {slopes.numel()} slopes")
        self.d_model, self.n_heads, self.n_kv_heads, self.causal = d_model, n_heads, n_kv_heads, causal
        self.head_dim = d_model // n_heads
        self.softmax_scale = softmax_scale
        self.window = check_window(window)
        self.dropout = dropout
        self.impl = impl
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.q_proj = nn.Linear(d_model, d_model, **kw)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, **kw)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, **kw)
        self.out_proj = nn.Linear(d_model, d_model, **kw)
        self._slope_values = tuple(slopes.tolist())
        self.register_buffer("slopes", slopes.to(device=device, dtype=torch.float32), persistent=False)

    def _apply(self, fn, *args, **kwargs):
        # .to(dtype) / .half() cast every float buffer; the slopes are rebuilt from their
        # exact values instead: float32 (FlashAttention's convention), float64 in a float64 layer
        super()._apply(fn, *args, **kwargs)
        dtype = torch.promote_types(self.q_proj.weight.dtype, torch.float32)
        self.slopes = torch.tensor(self._slope_values, dtype=dtype, device=self.slopes.device)
        return self

    def _heads(self, x, proj, n):
        B, T, _ = x.shape
        return proj(x).view(B, T, n, self.head_dim).transpose(1, 2)  # (B, n, T, hs)

    def forward(self, x: torch.Tensor, *, attention_mask=None, positions=None, past_kv=None, use_cache: bool = False):
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (B, T, {self.d_model}), got {tuple(x.shape)}")
        q = self._heads(x, self.q_proj, self.n_heads)  # (B, nh, T, hs)
        k = self._heads(x, self.k_proj, self.n_kv_heads)  # (B, nkv, T, hs)
        v = self._heads(x, self.v_proj, self.n_kv_heads)  # (B, nkv, T, hs)
        if past_kv is not None:
            k = torch.cat([past_kv[0], k], dim=2)  # (B, nkv, T_past + T, hs)
            v = torch.cat([past_kv[1], v], dim=2)
        y = alibi_attention(q, k, v, self.slopes, causal=self.causal, scale=self.softmax_scale, impl=self.impl,
                            dropout_p=self.dropout if self.training else 0.0, window=self.window,
                            **_padding(attention_mask, positions, x.shape[0], k.shape[2], x.shape[1]))  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(x.shape)  # (B, T, C)
        out = self.out_proj(y)
        return (out, (k, v)) if use_cache else out

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                f"causal={self.causal}" + (f", impl={self.impl!r}" if self.impl != "auto" else ""))


def _padding(attention_mask, positions, batch: int, n_keys: int, n_queries: int) -> dict:
    """alibi_attention's key_padding_mask and positions from a layer's (B, T_past + T) mask and positions."""
    if attention_mask is None and positions is None:
        return {}
    for name, given in (("attention_mask", attention_mask), ("positions", positions)):
        if given is not None and tuple(given.shape) != (batch, n_keys):
            raise ValueError(f"{name} must be (B, T_past + T) = {(batch, n_keys)}, got {tuple(given.shape)}")
    keep = None if attention_mask is None else attention_mask.bool()
    if positions is None:  # BLOOM's convention: count the real tokens; pads sit at 0
        positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
    return {"key_padding_mask": keep, "k_positions": positions, "q_positions": positions[:, -n_queries:]}
