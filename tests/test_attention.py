import math

import chapter_values as ch
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from loop_reference import loop_alibi_attention

from alibi_ref import alibi_attention, alibi_bias, get_slopes, key_only_bias
from alibi_ref._backend import softmax
from alibi_ref.attention import naive_attention
from alibi_ref.course import cat_sat_on_mat, multi_head_alibi


@st.composite
def problems(draw, causal=None, max_len=7):
    """A random, valid ALiBi attention problem as float64 NumPy arrays."""
    n_kv_heads, groups = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    causal = draw(st.booleans()) if causal is None else causal
    q_len = draw(st.integers(1, max_len))
    k_len = q_len + draw(st.integers(0, max_len)) if causal else draw(st.integers(1, max_len))
    d, d_v = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    batch = tuple(draw(st.lists(st.integers(1, 2), max_size=2)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    H = n_kv_heads * groups
    q = rng.normal(size=(*batch, H, q_len, d))
    k = rng.normal(size=(*batch, n_kv_heads, k_len, d))
    v = rng.normal(size=(*batch, n_kv_heads, k_len, d_v))
    slopes = draw(st.sampled_from([get_slopes(H), get_slopes(H, "textbook"), rng.uniform(0, 1.5, H)]))
    return q, k, v, slopes, causal


def to_torch(*arrays, device="cpu", dtype=torch.float64):
    return [torch.tensor(a, device=device, dtype=dtype) for a in arrays]


def as_float64(x) -> np.ndarray:
    return np.asarray(x.detach().cpu().double() if isinstance(x, torch.Tensor) else x, dtype=np.float64)


# ----------------------------------------------------------------------------- the chapter's numbers

@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_chapter_tables(backend):
    ex = cat_sat_on_mat()
    Q, K, V = (ex.Q, ex.K, ex.V) if backend == "numpy" else to_torch(ex.Q, ex.K, ex.V)
    output, weights = multi_head_alibi(Q, K, V, n_heads=2)
    output, weights = as_float64(output), as_float64(weights)
    assert output.shape == (5, 4) and weights.shape == (2, 5, 5)
    np.testing.assert_allclose(weights[0], ch.HEAD1_WEIGHTS, atol=ch.PRINTED_ATOL, rtol=0)
    np.testing.assert_allclose(weights[1], ch.HEAD2_WEIGHTS, atol=ch.PRINTED_ATOL, rtol=0)
    np.testing.assert_allclose(weights.mean(0), ch.AVERAGED_WEIGHTS, atol=ch.PRINTED_ATOL, rtol=0)
    np.testing.assert_allclose(output, ch.OUTPUT, atol=ch.PRINTED_ATOL, rtol=0)


def test_chapter_exercise_1_row_for_sat():
    ex = cat_sat_on_mat()
    _, weights = multi_head_alibi(ex.Q, ex.K, ex.V, 2)
    np.testing.assert_allclose(weights[0, 2], [0.1003, 0.1653, 0.5527, 0.0815, 0.1003], atol=ch.PRINTED_ATOL)


def test_chapter_standard_attention_is_slope_zero():
    ex = cat_sat_on_mat()
    _, weights = multi_head_alibi(ex.Q, ex.K, ex.V, 2, slopes=[0.0, 0.0])
    np.testing.assert_allclose(weights[0, 0], ch.STANDARD_HEAD1_THE, atol=ch.PRINTED_ATOL)
    np.testing.assert_allclose(weights[0, 3], np.full(5, 0.2), atol=1e-12)  # "on" has a zero query in head 1


# ----------------------------------------------------------------------------- the specification

@given(problems())
def test_naive_path_equals_the_loop_reference(problem):
    q, k, v, slopes, causal = problem
    out = alibi_attention(q, k, v, slopes, causal=causal)
    assert isinstance(out, np.ndarray) and out.shape == (*q.shape[:-1], v.shape[-1])
    flat = [x.reshape(-1, *x.shape[-3:]) for x in (q, k, v)]
    expected = [loop_alibi_attention(*(x[b] for x in flat), slopes, causal) for b in range(len(flat[0]))]
    np.testing.assert_allclose(out.reshape(-1, *out.shape[-3:]), expected, rtol=1e-10, atol=1e-12)


@given(problems(), st.floats(0.01, 4.0))
def test_explicit_scale_multiplies_the_dot_product_only(problem, scale):
    q, k, v, slopes, causal = problem
    d = q.shape[-1]
    # a scale s on q.k is the default 1/sqrt(d) applied to q * s * sqrt(d); the bias must not move
    expected = alibi_attention(q * scale * math.sqrt(d), k, v, slopes, causal=causal)
    np.testing.assert_allclose(alibi_attention(q, k, v, slopes, causal=causal, scale=scale), expected,
                               rtol=1e-9, atol=1e-12)


@given(st.lists(st.floats(-50, 50), min_size=1, max_size=9), st.floats(-100, 100))
def test_softmax_ignores_a_constant_added_to_a_row(row, c):
    row = np.array(row)
    np.testing.assert_allclose(softmax(row + c), softmax(row), rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(softmax(torch.tensor(row) + c).numpy(), softmax(row), rtol=1e-9, atol=1e-15)


@given(problems(causal=True))
def test_key_only_causal_bias_gives_the_same_weights(problem):
    q, k, v, slopes, _ = problem
    out, weights = alibi_attention(q, k, v, slopes, causal=True, return_weights=True)
    groups = q.shape[-3] // k.shape[-3]
    k, v = (np.repeat(x, groups, axis=-3) for x in (k, v))
    bias = key_only_bias(slopes, q.shape[-2], k.shape[-2])
    out_key_only, weights_key_only = naive_attention(q, k, v, bias, 1 / math.sqrt(q.shape[-1]))
    np.testing.assert_allclose(weights_key_only, weights, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(out_key_only, out, rtol=1e-9, atol=1e-12)


def test_key_only_bias_is_wrong_without_the_mask(rng):
    q, k, v = rng.normal(size=(3, 1, 6, 4))
    slopes = get_slopes(1)
    bias = key_only_bias(slopes, 6)
    unmasked = np.where(np.isfinite(bias), bias, slopes[0] * np.arange(6))
    wrong, _ = naive_attention(q, k, v, unmasked, 0.5)
    assert np.abs(wrong - alibi_attention(q, k, v, slopes)).max() > 1e-3


@given(problems())
def test_slope_zero_is_plain_scaled_dot_product_attention(problem):
    q, k, v, slopes, causal = problem
    q_len, k_len = q.shape[-2], k.shape[-2]
    groups = q.shape[-3] // k.shape[-3]
    out = alibi_attention(q, k, v, np.zeros_like(slopes), causal=causal)
    tq, tk, tv = to_torch(q, k, v)
    tk, tv = (x.repeat_interleave(groups, dim=-3) for x in (tk, tv))
    # torch's own attention, with its own causal mask aligned to the end of the keys
    mask = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len) if causal else None
    expected = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask)
    np.testing.assert_allclose(out, expected.numpy(), rtol=1e-9, atol=1e-12)


@given(problems(causal=True, max_len=6), st.integers(1, 6))
def test_queries_sit_at_the_end_of_the_keys(problem, n_last):
    # the last n queries against all keys (decoding with a KV cache) = the last rows of the full run
    q, k, v, slopes, _ = problem
    k_len = k.shape[-2]
    full_q = np.random.default_rng(1).normal(size=(*q.shape[:-2], k_len, q.shape[-1]))  # (..., H, k_len, d)
    full = alibi_attention(full_q, k, v, slopes, causal=True)
    n = min(n_last, k_len)
    last = alibi_attention(full_q[..., k_len - n:, :], k, v, slopes, causal=True)
    np.testing.assert_allclose(last, full[..., k_len - n:, :], rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------- torch: paths and devices

@given(problems())
def test_numpy_and_torch_agree(problem):
    q, k, v, slopes, causal = problem
    expected = alibi_attention(q, k, v, slopes, causal=causal)
    for impl in ("naive", "sdpa", "strided"):
        out = alibi_attention(*to_torch(q, k, v), torch.tensor(slopes), causal=causal, impl=impl)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-9, atol=1e-12, err_msg=impl)


@pytest.mark.parametrize("impl", ["auto", "sdpa", "strided"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-10), (torch.float32, 2e-5), (torch.bfloat16, 3e-2)])
def test_fast_path_equals_naive_on_device(device, causal, dtype, tol, impl):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 12, 33, 16, generator=gen)
    k, v = torch.randn(2, 2, 2, 40, 16, generator=gen)  # GQA: 12 query heads, 2 KV heads
    q, k, v = (x.to(device=device, dtype=dtype) for x in (q, k, v))
    slopes = get_slopes(12)
    naive = alibi_attention(q, k, v, slopes, causal=causal, impl="naive")
    fast = alibi_attention(q, k, v, slopes, causal=causal, impl=impl)
    assert fast.dtype == dtype and fast.device == q.device and fast.shape == (2, 12, 33, 16)
    torch.testing.assert_close(fast, naive, rtol=tol, atol=tol)


@pytest.mark.parametrize("impl", ["auto", "sdpa", "strided"])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-4), (torch.bfloat16, 6e-2)])
def test_output_and_gradients_are_right_at_a_length_of_128_k_plus_64(device, impl, dtype, tol):
    """576 = 4 * 128 + 64 queries and keys: torch 2.11's fused GPU kernels were seen giving NaN grad_q with
    any mask at lengths that are 64 more than a multiple of 128 (H100). On CUDA "auto" is FlexAttention
    here (576 >= FLEX_MIN_KEYS); every path is held to float64's naive path, output and gradients.
    Bounds (values reach 4.6 here): float32 1e-4, bfloat16 6e-2; the CPU paths are off by at most 1.9e-6 and
    2.7e-2."""
    gen = torch.Generator().manual_seed(2)
    q, k, v, grad = (torch.randn(1, 4, 576, 64, generator=gen) for _ in range(4))
    slopes = get_slopes(4)
    for causal in (False, True):
        exact = [x.to(device, torch.float64).requires_grad_() for x in (q, k, v)]
        reference = alibi_attention(*exact, slopes, causal=causal, impl="naive")
        expected = (reference, *torch.autograd.grad(reference, exact, grad.to(device, torch.float64)))
        leaves = [x.to(device, dtype).requires_grad_() for x in (q, k, v)]
        out = alibi_attention(*leaves, slopes, causal=causal, impl=impl)
        got = (out, *torch.autograd.grad(out, leaves, grad.to(device, dtype)))
        for name, ours, theirs in zip(("output", "dq", "dk", "dv"), got, expected, strict=True):
            assert ours.dtype == dtype and ours.device == q.to(device).device
            assert torch.isfinite(ours).all(), f"{name} has non-finite entries (causal={causal})"
            error = (ours.double() - theirs).abs().max().item()
            assert error < tol, f"{name} off by {error:.2e} (causal={causal})"


@pytest.mark.parametrize("impl", ["naive", "sdpa", "strided"])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_finite_differences(device, impl, causal):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 3, 5, generator=gen, dtype=torch.float64)
    k, v = torch.randn(2, 1, 2, 6, 5, generator=gen, dtype=torch.float64)
    q, k, v = (x.to(device).requires_grad_() for x in (q, k, v))
    slopes = torch.tensor(get_slopes(4), dtype=torch.float64, device=device)
    assert torch.autograd.gradcheck(
        lambda q, k, v: alibi_attention(q, k, v, slopes, causal=causal, impl=impl), (q, k, v)
    )


def test_bfloat16_output_stays_close_at_length_2048():
    """The relative bias built in float32 then cast keeps bf16 attention within 0.05 of float64.

    The key-only bias +m*j rounded to bf16, the mistake this guards against, is off by more than 0.5.
    """
    gen = torch.Generator().manual_seed(0)
    n, H = 2048, 8
    q, k, v = (torch.randn(1, H, n, 64, generator=gen).bfloat16() for _ in range(3))
    slopes = torch.tensor(get_slopes(H))
    reference = alibi_attention(*(x.double() for x in (q, k, v)), slopes.double(), causal=True)
    ours = alibi_attention(q, k, v, slopes.bfloat16(), causal=True)
    error = (ours.double() - reference).abs().max().item()
    assert error < 0.05, f"bf16 ALiBi attention is off by {error:.3g} at length {n}"

    key_only = key_only_bias(slopes.bfloat16(), n)  # built in fp32, rounded to bf16: the mistake
    naive_key_only = F.scaled_dot_product_attention(q, k, v, attn_mask=key_only)
    error_key_only = (naive_key_only.double() - reference).abs().max().item()
    assert error_key_only > 0.5, f"key-only bf16 bias should be visibly wrong, was off by only {error_key_only:.3g}"


def test_output_follows_input_dtypes_and_keeps_the_graph():
    q = torch.randn(1, 2, 3, 4, requires_grad=True)
    out = alibi_attention(q, q.detach(), q.detach(), [0.5, 0.25])
    assert out.dtype == torch.float32 and out.requires_grad
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    x32 = np.ones((2, 3, 4), dtype=np.float32)
    assert alibi_attention(x32, x32, x32, [0.5, 0.25]).dtype == np.float32
    xint = np.ones((2, 3, 4), dtype=np.int64)
    assert alibi_attention(xint, xint, xint, [0.5, 0.25]).dtype == np.float64


# ----------------------------------------------------------------------------- bad input

def _qkv(H=4, H_kv=4, q_len=3, k_len=3, d=8, d_k=None):
    return np.zeros((H, q_len, d)), np.zeros((H_kv, k_len, d_k or d)), np.zeros((H_kv, k_len, d))


@pytest.mark.parametrize(("inputs", "slopes", "kwargs", "message"), [
    (_qkv(d_k=6), 4, {}, r"same head dimension d, got q \(4, 3, 8\) and k \(4, 3, 6\)"),
    (_qkv(H=4, H_kv=3), 4, {}, "the 4 query heads must be a multiple of the 3 key/value heads"),
    (_qkv(), 3, {}, "need one slope per query head: 4 heads, got 3 slopes"),
    ((np.zeros((3, 8)), np.zeros((3, 8)), np.zeros((3, 8))), 4, {}, "same rank >= 3"),
    ((np.zeros((4, 3, 8)), np.zeros((1, 4, 3, 8)), np.zeros((1, 4, 3, 8))), 4, {}, "same rank >= 3"),
    ((np.zeros((2, 4, 3, 8)), np.zeros((3, 4, 3, 8)), np.zeros((3, 4, 3, 8))), 4, {}, "leading"),
    ((np.zeros((4, 3, 8)), np.zeros((4, 3, 8)), np.zeros((4, 5, 8))), 4, {}, "k and v must have the same heads"),
    (_qkv(q_len=5, k_len=3), 4, {"causal": True}, "causal attention needs q_len <= k_len"),
    (_qkv(), 4, {"impl": "flash"}, "unknown impl 'flash'; expected one of auto, naive, sdpa"),
    (_qkv(), 4, {"impl": "sdpa"}, "impl='sdpa' needs torch tensors"),
])
def test_bad_input_says_what_was_expected_and_what_came(inputs, slopes, kwargs, message):
    with pytest.raises(ValueError, match=message):
        alibi_attention(*inputs, np.full(slopes, 0.5), **kwargs)


def test_mixed_backends_and_devices_are_refused():
    q = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match="all torch tensors, all JAX arrays or all NumPy arrays, got numpy, torch"):
        alibi_attention(torch.zeros(2, 3, 4), q, q, [0.5, 0.5])
    with pytest.raises(ValueError, match="share device and dtype"):
        alibi_attention(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4, dtype=torch.float64), torch.zeros(2, 3, 4),
                        [0.5, 0.5])


def test_multi_head_alibi_refuses_indivisible_width():
    x = np.zeros((5, 6))
    with pytest.raises(ValueError, match="d_model must be divisible by n_heads=4"):
        multi_head_alibi(x, x, x, 4)


def test_bias_and_attention_agree_on_one_layout():
    # the bias returned by alibi_bias is exactly what the attention adds
    q, k, v = np.random.default_rng(3).normal(size=(3, 2, 4, 3))
    slopes = get_slopes(2)
    _, weights = alibi_attention(q, k, v, slopes, return_weights=True)
    np.testing.assert_allclose(weights, softmax(q @ k.swapaxes(-1, -2) / math.sqrt(3) + alibi_bias(slopes, 4)))
