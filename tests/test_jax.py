"""JAX arrays through alibi_ref, and the Flax layers: held to the NumPy specification and to torch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import linen, nnx
from hypothesis import given, settings
from test_attention import as_float64, problems, to_torch

from alibi_ref import alibi_attention, alibi_bias, get_slopes
from alibi_ref.flax_layers import alibi_attention_fn


def to_jax(*arrays, dtype=None):
    return [jnp.asarray(a, dtype=dtype) for a in arrays]


@pytest.fixture(autouse=True)
def full_float32_products():
    """On a GPU, JAX multiplies float32 matrices in TF32 unless told otherwise (its documented default): on an
    H100 the Flax layers and the float32 paths then differ from the float64 references by up to 9e-4, past
    float32's tolerances here. These tests hold the ALiBi arithmetic to float32's rounding, so they
    ask for full float32 products, as torch's matmuls give by default; on the CPU nothing changes."""
    with jax.default_matmul_precision("highest"):
        yield


# ----------------------------------------------------------------------------- the library on JAX arrays

@settings(max_examples=40, deadline=None)
@given(problems())
def test_numpy_torch_and_jax_agree_in_float64(problem):
    q, k, v, slopes, causal = problem
    expected = alibi_attention(q, k, v, slopes, causal=causal)
    from_torch = alibi_attention(*to_torch(q, k, v, slopes), causal=causal, impl="naive")
    np.testing.assert_allclose(as_float64(from_torch), expected, atol=1e-12, rtol=0)
    with jax.enable_x64(True):
        out = alibi_attention(*to_jax(q, k, v, slopes), causal=causal)  # float64: the naive path
        assert isinstance(out, jax.Array) and out.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(out), expected, atol=1e-12, rtol=0)


@settings(max_examples=40, deadline=None)
@given(problems())
def test_jax_fused_path_in_float32(problem):
    q, k, v, slopes, causal = problem
    v = v[..., :1].repeat(q.shape[-1], -1)  # jax.nn.dot_product_attention wants d_v = d
    expected = alibi_attention(q, k, v, slopes, causal=causal)
    out = alibi_attention(*to_jax(q, k, v, dtype=jnp.float32), jnp.asarray(slopes, jnp.float32), causal=causal,
                          impl="sdpa")
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5, rtol=0)  # float32 rounding, |v| < 5


def test_auto_picks_the_fused_path_only_where_it_fits():
    from alibi_ref.dispatch import Dims, choose_impl

    x32, x16 = jnp.zeros((1, 2, 3, 4)), jnp.zeros((1, 2, 3, 4), jnp.bfloat16)
    dims = Dims(2, 2, 3, 3, 4)
    assert choose_impl("auto", x32, dims, False, v=x32) == "sdpa"
    assert choose_impl("auto", x16, dims, False, v=x16) == "sdpa"
    assert choose_impl("auto", x32, dims, True, v=x32) == "naive"  # the weights
    assert choose_impl("auto", x32, dims, False, v=jnp.zeros((1, 2, 3, 5))) == "naive"  # d_v != d
    with jax.enable_x64(True):
        x64 = jnp.zeros((1, 2, 3, 4))
        assert choose_impl("auto", x64, dims, False, v=x64) == "naive"  # the fused path would round to float32


@pytest.mark.parametrize("causal", [False, True])
def test_jax_bias_matches_numpy_and_keeps_dtype(causal):
    slopes = get_slopes(6)
    for dtype in (jnp.float32, jnp.bfloat16):
        bias = alibi_bias(jnp.asarray(slopes, dtype), 5, 9, causal=causal)
        assert isinstance(bias, jax.Array) and bias.dtype == dtype and bias.shape == (6, 5, 9)
        expected = alibi_bias(slopes, 5, 9, causal=causal).astype(np.float32).astype(jnp.bfloat16 if dtype ==
                                                                                       jnp.bfloat16 else np.float32)
        # built in float32 and rounded once: equal to NumPy's float64 bias rounded to the same dtype
        np.testing.assert_array_equal(np.asarray(bias, np.float32), np.asarray(expected, np.float32))


def test_bfloat16_attention_within_its_rounding():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(3, 2, 8, 128, 32))
    slopes = get_slopes(8)
    expected = alibi_attention(q, k, v, slopes, causal=True)
    for impl in ("naive", "sdpa"):
        out = alibi_attention(*to_jax(q, k, v, dtype=jnp.bfloat16), jnp.asarray(slopes, jnp.float32),
                              causal=True, impl=impl)
        assert out.dtype == jnp.bfloat16
        # bfloat16 keeps 8 bits: inputs, weights and output each round by up to 2^-8 relative
        assert np.abs(np.asarray(out, np.float64) - expected).max() < 0.05


def test_jit_and_grad_through_slopes_match_torch():
    rng = np.random.default_rng(2)
    q, k, v = rng.normal(size=(3, 1, 4, 6, 5))
    slopes = get_slopes(4)

    def loss_jax(q, k, v, s):
        return (alibi_attention(q, k, v, s, causal=True) ** 2).sum()

    with jax.enable_x64(True):
        jq, jk, jv, js = to_jax(q, k, v, slopes)
        grads = jax.jit(jax.grad(loss_jax, argnums=(0, 3)))(jq, jk, jv, js)  # float64: the naive path
    tq, tk, tv, ts = to_torch(q, k, v, slopes)
    tq.requires_grad_(True)
    ts.requires_grad_(True)
    (alibi_attention(tq, tk, tv, ts, causal=True, impl="naive") ** 2).sum().backward()
    np.testing.assert_allclose(np.asarray(grads[0]), tq.grad.numpy(), atol=1e-10)
    np.testing.assert_allclose(np.asarray(grads[1]), ts.grad.numpy(), atol=1e-10)
    assert np.abs(np.asarray(grads[1])).min() > 0, "every slope gets a gradient"


def test_padding_and_positions_on_jax_equal_numpy():
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(3, 2, 4, 6, 8))
    mask = np.ones((2, 6), bool)
    mask[0, :2] = False  # left padding: the first row's sequence starts at 2
    mask[1, :] = False  # a row with no key at all: its queries give zeros
    positions = np.clip(np.cumsum(mask, -1) - 1, 0, None)
    expected = alibi_attention(q, k, v, get_slopes(4), causal=True, key_padding_mask=mask,
                               q_positions=positions, k_positions=positions)
    with jax.enable_x64(True):
        out = jax.jit(lambda *a: alibi_attention(*a[:4], causal=True, key_padding_mask=a[4], q_positions=a[5],
                                                 k_positions=a[5]))(*to_jax(q, k, v, get_slopes(4), mask, positions))
        np.testing.assert_allclose(np.asarray(out), expected, atol=1e-12)
        assert not np.asarray(out)[1].any(), "queries that see no key give zeros"
        # and no gradient flows through them (the softmax of a row with no key is 0/0): finite, zero for that
        # row, as torch's autograd gives it for the same call
        loss = jax.grad(lambda *a: (alibi_attention(*a[:3], a[3], causal=True, key_padding_mask=mask,
                                                    q_positions=positions, k_positions=positions) ** 2).sum(),
                        argnums=(0, 1, 2))
        grads = loss(*to_jax(q, k, v, get_slopes(4)))
    leaves = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    (alibi_attention(*leaves, get_slopes(4), causal=True, key_padding_mask=torch.tensor(mask),
                     q_positions=torch.tensor(positions), k_positions=torch.tensor(positions)) ** 2).sum().backward()
    for ours, theirs in zip(grads, leaves, strict=True):
        assert np.isfinite(np.asarray(ours)).all() and not np.asarray(ours)[1].any()
        np.testing.assert_allclose(np.asarray(ours), theirs.grad.numpy(), atol=1e-10)


def test_jax_errors_say_what_came():
    x = jnp.zeros((1, 2, 3, 4))
    with pytest.raises(ValueError, match="all torch tensors, all JAX arrays or all NumPy arrays"):
        alibi_attention(x, np.zeros((1, 2, 3, 4)), x, get_slopes(2))
    with pytest.raises(ValueError, match="torch path"):
        alibi_attention(x, x, x, get_slopes(2), impl="strided")
    with pytest.raises(ValueError, match="cannot return the weights"):
        alibi_attention(x, x, x, get_slopes(2), impl="sdpa", return_weights=True)


# ----------------------------------------------------------------------------- Flax

@pytest.mark.parametrize("flavour", ["linen", "nnx"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_fn_equals_alibi_attention(flavour, causal):
    rng = np.random.default_rng(4)
    q, k, v = rng.normal(size=(3, 2, 7, 4, 8)).astype(np.float32)  # Flax's (B, N, H, d)
    out = alibi_attention_fn(get_slopes(4), causal=causal, flavour=flavour)(*to_jax(q, k, v))
    expected = alibi_attention(*(x.swapaxes(1, 2).astype(np.float64) for x in (q, k, v)), get_slopes(4),
                               causal=causal).swapaxes(1, 2)
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5)


def _projections(params):
    """The linen layer's q, k, v and output kernels as (D, H, d) / (H, d, D) arrays."""
    return [np.asarray(params[name]["kernel"], np.float64) for name in ("query", "key", "value", "out")]


def test_linen_layer_equals_alibi_attention_on_its_projections():
    H, D, T = 4, 16, 9
    x = np.random.default_rng(5).normal(size=(2, T, D)).astype(np.float32)
    layer = linen.MultiHeadDotProductAttention(num_heads=H, qkv_features=D, use_bias=False,
                                               attention_fn=alibi_attention_fn(get_slopes(H), causal=True))
    params = layer.init(jax.random.key(0), jnp.asarray(x))["params"]
    wq, wk, wv, wo = _projections(params)
    q, k, v = (np.einsum("btD,Dhd->bhtd", x.astype(np.float64), w) for w in (wq, wk, wv))  # (B, H, T, d)
    expected = np.einsum("bhtd,hdD->btD", alibi_attention(q, k, v, get_slopes(H), causal=True), wo)
    np.testing.assert_allclose(np.asarray(layer.apply({"params": params}, jnp.asarray(x))), expected, atol=1e-5)


@pytest.mark.parametrize("flavour", ["linen", "nnx"])
def test_decoding_with_flax_cache_gives_the_full_pass(flavour):
    H, D, T = 4, 16, 6
    x = jnp.asarray(np.random.default_rng(6).normal(size=(1, T, D)).astype(np.float32))
    if flavour == "linen":
        fn = alibi_attention_fn(get_slopes(H), causal=True)
        layer = linen.MultiHeadDotProductAttention(num_heads=H, qkv_features=D, attention_fn=fn)
        params = layer.init(jax.random.key(0), x)["params"]
        full = layer.apply({"params": params}, x)
        decoder = linen.MultiHeadDotProductAttention(num_heads=H, qkv_features=D, attention_fn=fn, decode=True)
        cache = decoder.init(jax.random.key(0), x)["cache"]
        steps = []
        for t in range(T):
            out, changed = decoder.apply({"params": params, "cache": cache}, x[:, t:t + 1], mutable=["cache"])
            cache = changed["cache"]
            steps.append(out)
    else:
        layer = nnx.MultiHeadAttention(num_heads=H, in_features=D, decode=False, rngs=nnx.Rngs(0),
                                       attention_fn=alibi_attention_fn(get_slopes(H), causal=True, flavour="nnx"))
        full = layer(x)
        layer.init_cache(x.shape)
        steps = [layer(x[:, t:t + 1], decode=True) for t in range(T)]
    # the cache places the query at its last slot: a constant per row, which softmax ignores
    np.testing.assert_allclose(np.asarray(jnp.concatenate(steps, 1)), np.asarray(full), atol=1e-5)


def test_flax_dropout_passes_through():
    H, D = 2, 8
    x = jnp.asarray(np.random.default_rng(7).normal(size=(1, 5, D)), jnp.float32)
    layer = linen.MultiHeadDotProductAttention(num_heads=H, qkv_features=D, dropout_rate=0.5,
                                               attention_fn=alibi_attention_fn(get_slopes(H)))
    params = layer.init(jax.random.key(0), x, deterministic=True)
    train = layer.apply(params, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
    evaluation = layer.apply(params, x, deterministic=True)
    assert not np.allclose(np.asarray(train), np.asarray(evaluation)), "the module's own dropout reached the weights"


def test_attention_fn_refuses_a_wrong_head_count():
    fn = alibi_attention_fn(get_slopes(3))
    with pytest.raises(ValueError, match="one slope per head: the layer has 4 heads, got 3"):
        fn(*(jnp.zeros((1, 5, 4, 2)),) * 3)
    with pytest.raises(ValueError, match="flavour"):
        alibi_attention_fn(get_slopes(2), flavour="haiku")


def test_torch_tensors_still_come_back_as_tensors():
    out = alibi_attention(*to_torch(*np.zeros((3, 1, 2, 3, 4))), torch.tensor(get_slopes(2)))
    assert isinstance(out, torch.Tensor)


def test_a_sliding_window_on_jax_equals_numpy():
    q, k, v = np.random.default_rng(8).normal(size=(3, 1, 2, 9, 4))
    expected = alibi_attention(q, k, v, get_slopes(2), causal=True, window=(3, 0))
    for impl in ("naive", "sdpa"):
        out = alibi_attention(*to_jax(q, k, v, dtype=jnp.float32), jnp.asarray(get_slopes(2), jnp.float32),
                              causal=True, window=(3, 0), impl=impl)
        np.testing.assert_allclose(np.asarray(out), expected, atol=2e-6)
