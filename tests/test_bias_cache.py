"""The biases cached between calls (``alibi_ref.bias_cache``): reused only where nothing could have changed them."""

import numpy as np
import pytest
import torch

import alibi_ref.bias_cache as bias_cache
from alibi_ref import alibi_attention, get_slopes
from alibi_ref.bias_cache import cached_bias
from alibi_ref.dispatch import CACHED_BIAS_NUMBERS, Dims, bias_is_cached
from alibi_ref.strided import bias_row


@pytest.fixture(autouse=True)
def empty_cache():
    bias_cache.clear()
    yield
    bias_cache.clear()


def problem(n=160, heads=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, heads, n, 16, generator=gen, dtype=torch.float64) for _ in range(3)]


def slopes_of(heads=4, dtype=torch.float64):
    return torch.tensor(get_slopes(heads), dtype=dtype)


def test_equal_slopes_and_lengths_get_the_cached_row_and_anything_else_a_new_one():
    row = cached_bias(bias_row, slopes_of(), 5, 9, True, None)
    torch.testing.assert_close(row, bias_row(slopes_of(), 5, 9, True, None), rtol=0, atol=0)
    assert cached_bias(bias_row, slopes_of(), 5, 9, True, None) is row  # another tensor, the same values: cached
    others = [cached_bias(bias_row, slopes_of() * 2, 5, 9, True, None),
              cached_bias(bias_row, slopes_of(), 5, 9, False, None),
              cached_bias(bias_row, slopes_of(), 5, 10, True, None),
              cached_bias(bias_row, slopes_of(), 5, 9, True, (2, None)),
              cached_bias(bias_row, slopes_of(dtype=torch.float32), 5, 9, True, None)]
    assert all(other is not row for other in others)
    torch.testing.assert_close(others[0], 2 * row, rtol=0, atol=0)


@pytest.mark.parametrize(("causal", "impl"), [(True, "strided"), (False, "strided"), (True, "sdpa")])
def test_slopes_changed_between_calls_are_read_anew(causal, impl):
    """A training loop's learned slopes change at every step, in place: a stale bias would be silently wrong."""
    q, k, v = problem()
    slopes = slopes_of().requires_grad_()
    optimizer = torch.optim.SGD([slopes], lr=0.5)
    for _ in range(3):
        out = alibi_attention(q, k, v, slopes, causal=causal, impl=impl)
        with torch.no_grad():  # the slopes need a gradient, but none is taken here: the row is cached
            torch.testing.assert_close(alibi_attention(q, k, v, slopes, causal=causal, impl=impl), out)
            expected = alibi_attention(q, k, v, slopes, causal=causal, impl="naive")
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
        (out * v).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    assert not torch.allclose(slopes, slopes_of())  # they did change
    assert bias_cache._cache, "nothing was cached"


def test_a_bias_that_needs_a_gradient_is_never_cached():
    slopes = slopes_of().requires_grad_()
    first = cached_bias(bias_row, slopes, 4, 4, False, None)
    assert first.requires_grad and cached_bias(bias_row, slopes, 4, 4, False, None) is not first
    assert not bias_cache._cache


def test_a_row_cached_in_inference_mode_serves_a_training_call_after_it():
    """A tensor made in inference mode cannot be saved for a backward pass: the split saves its row."""
    q, k, v = problem(n=300)
    with torch.inference_mode():
        alibi_attention(q, k, v, slopes_of(), causal=True, impl="strided")
    assert bias_cache._cache
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = alibi_attention(*leaves, slopes_of(), causal=True, impl="strided")
    (out * v).sum().backward()  # raised "Inference tensors cannot be saved for backward" when made in it
    assert all(x.grad is not None and x.grad.abs().sum() > 0 for x in leaves)


def test_the_cache_keeps_to_its_budget_newest_first(monkeypatch):
    monkeypatch.setattr(bias_cache, "CACHE_BYTES", 4 * 8 * 4 * 100)  # four rows of (4, 99) float64: 3168 bytes each
    rows = [cached_bias(bias_row, slopes_of(), 50, 50, False, None)]
    rows += [cached_bias(bias_row, slopes_of(), 50 + n, 50 - n, False, None) for n in range(1, 5)]
    sizes = [r.numel() * r.element_size() for r in bias_cache._cache.values()]
    assert sum(sizes) <= bias_cache.CACHE_BYTES and bias_cache._cached_bytes == sum(sizes)
    assert [r is k for r, k in zip(rows[1:], bias_cache._cache.values(), strict=True)] == [True] * 4  # the oldest left
    assert cached_bias(bias_row, slopes_of(), 50, 50, False, None) is not rows[0]
    assert cached_bias(bias_row, slopes_of(), 200, 200, False, None).numel() * 8 > bias_cache.CACHE_BYTES // 4
    assert bias_cache._cached_bytes <= bias_cache.CACHE_BYTES  # too large for the cache: built, not cached


def test_numpy_slopes_build_their_own():
    slopes = np.asarray(get_slopes(4))
    assert cached_bias(bias_row, torch.from_numpy(slopes), 3, 3, False, None) is not None and bias_cache._cache
    bias_cache.clear()
    out = alibi_attention(*(x.numpy() for x in problem(n=20)), slopes)
    assert isinstance(out, np.ndarray) and not bias_cache._cache


@pytest.mark.usefixtures("without_fused_kernel")
def test_auto_on_the_cpu_reads_a_cached_bias_while_it_is_small_and_the_strided_row_beyond():
    """Up to CACHED_BIAS_NUMBERS numbers (H i j) the cached (1, H, i, j) bias, at q's rank and in its dtype; beyond it,
    with slopes that take a gradient, with padding or a window, the strided path's row (docs/performance.md)."""
    heads = 8
    largest = int((CACHED_BIAS_NUMBERS / heads) ** 0.5)
    slopes = slopes_of(heads, torch.float32)

    def built(n, dtype=torch.float32, slopes=slopes, **options):
        bias_cache.clear()
        q, k, v = (x.to(dtype) for x in problem(n=n, heads=heads))
        alibi_attention(q, k, v, slopes, **options)
        return [(key[0].__name__, tuple(made.shape), made.dtype) for key, made in bias_cache._cache.items()]

    assert built(largest) == [("_plain_bias", (1, heads, largest, largest), torch.float32)]
    assert built(largest, torch.bfloat16, causal=True) == [("_plain_bias", (1, heads, largest, largest),
                                                            torch.bfloat16)]
    assert built(largest + 1) == [("bias_row", (heads, 2 * largest + 1), torch.float32)]
    assert built(200, window=(16, 16)) == [("bias_row", (heads, 399), torch.float32)]
    assert built(200, slopes=slopes.clone().requires_grad_()) == [("bias_row", (heads, 399), torch.float32)]
    assert built(200, key_padding_mask=torch.ones(1, 200, dtype=torch.bool)) == [("bias_row", (heads, 399),
                                                                                 torch.float32)]
    dims = Dims(heads, heads, largest, largest, 16)
    assert bias_is_cached(slopes, dims) and not bias_is_cached(slopes.double(), dims)  # 16 MiB in float64: too large
    with torch.no_grad():
        assert bias_is_cached(slopes.clone().requires_grad_(), dims)  # no gradient taken: cached
