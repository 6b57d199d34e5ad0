"""ALiBi in Flax: an ``attention_fn`` for ``linen.MultiHeadDotProductAttention`` and ``nnx.MultiHeadAttention``.

Flax's ``mask=`` is boolean (keep or drop a score), so it cannot carry ALiBi's graded
penalty -m_h * |i - j|. Its ``dot_product_attention`` does take an additive ``bias``, but the
layers never pass one: they call ``attention_fn(query, key, value, mask=..., dropout_rng=...,
deterministic=..., ...)``. So the bias goes in through a closure over the slopes, built per
call from the shapes it sees, and everything else (mask, dropout, dtype, ``module`` for
``sow_weights``) passes through untouched. (linen hands an ``attention_fn`` only the keywords
its signature names, so a wrapper written ``(query, key, value, mask=None, **kwargs)`` silently
loses dropout; this one carries ``dot_product_attention``'s signature.)

    attn = linen.MultiHeadDotProductAttention(num_heads=8, qkv_features=64,
                                              attention_fn=alibi_attention_fn(get_slopes(8), causal=True))
    attn = nnx.MultiHeadAttention(num_heads=8, in_features=64, decode=False, rngs=nnx.Rngs(0),
                                  attention_fn=alibi_attention_fn(get_slopes(8), causal=True, flavour="nnx"))

Flax's layout is (..., length, heads, head_dim); its scores are (..., heads, q_len, k_len), so the
(H, q_len, k_len) bias broadcasts over any batch dimensions.

The queries sit at the end of the keys, as everywhere in alibi_ref. With Flax's decode cache the
keys are the whole cache (its maximum length) and Flax's own mask hides the slots not yet
written: the one query is then placed at the last slot instead of its true position t. Every
key it may see is at or before t, where |i - j| = i - j, so that shift adds the same constant
to the whole row, and softmax ignores a constant per row: decoding gives the full pass's rows.
"""

from __future__ import annotations

import inspect

from .bias import alibi_bias, check_slopes


def alibi_attention_fn(slopes, *, causal: bool = False, flavour: str = "linen"):
    """An ``attention_fn`` that adds the ALiBi bias for ``slopes`` (H,) to Flax's dot-product attention.

    ``flavour``: "linen" (``flax.linen.dot_product_attention``) or "nnx" (``flax.nnx.dot_product_attention``).
    ``causal``: -inf on the keys after each query, folded into the bias (Flax's ``mask`` and
    ``is_causal`` keep working on top of it). The bias is built in at least float32 and cast to the
    query's dtype last, as in ``alibi_bias``.
    """
    import jax.numpy as jnp

    if flavour == "linen":
        from flax.linen import dot_product_attention
    elif flavour == "nnx":
        from flax.nnx import dot_product_attention
    else:
        raise ValueError(f"flavour must be 'linen' or 'nnx', got {flavour!r}")
    slopes = jnp.asarray(check_slopes(slopes))

    def attention_fn(query, key, value, bias=None, mask=None, **kwargs):
        # query (..., q_len, H, d), key (..., k_len, H_kv, d): Flax's layout
        n_heads, q_len, k_len = query.shape[-2], query.shape[-3], key.shape[-3]
        if slopes.shape[0] != n_heads:
            raise ValueError(f"need one slope per head: the layer has {n_heads} heads, got {slopes.shape[0]} slopes")
        alibi = alibi_bias(slopes.astype(jnp.promote_types(query.dtype, jnp.float32)), q_len, k_len,
                           causal=causal).astype(query.dtype)  # (H, i, j)
        bias = alibi if bias is None else bias + alibi
        return dot_product_attention(query, key, value, bias=bias, mask=mask, **kwargs)

    # linen passes an attention_fn only the keywords its signature names: with a bare **kwargs it would
    # drop dropout_rng, dropout_rate, deterministic and dtype without a word (dropout silently off)
    attention_fn.__signature__ = inspect.signature(dot_product_attention)
    return attention_fn
