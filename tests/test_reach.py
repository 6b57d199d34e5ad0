"""Each head's reach (alibi_ref.reach): the keys beyond it hold no weight float32 can hold, for any q and k;
and the strided path, which leaves them out, equals the naive one."""

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import alibi_ref.reach as reach
import alibi_ref.strided as strided
from alibi_ref import alibi_attention, alibi_bias, get_slopes
from alibi_ref.denormals import subnormals_flushed
from alibi_ref.reach import head_reach, reach_windows

EPS = torch.finfo(torch.float32).eps


def weight_beyond(q, k, slopes, scale, causal, distance):
    """Per head, the most weight any row puts on keys further than ``distance[h]`` from it: the float64
    softmax of the materialised bias. q, k (1, H, N, d) float32."""
    q, k = q.double(), k.double()
    bias = alibi_bias(slopes.double(), q.shape[-2], k.shape[-2], causal=causal)  # (H, i, j)
    probs = (q @ k.transpose(-1, -2) * scale + bias).softmax(-1)[0]  # (H, i, j)
    i = torch.arange(q.shape[-2])[:, None] + (k.shape[-2] - q.shape[-2])
    far = (i - torch.arange(k.shape[-2])[None, :]).abs()  # (i, j)
    return [float((probs[h] * (far > d)).sum(-1).max()) for h, d in enumerate(distance)]


@settings(max_examples=25, deadline=None)
@example(seed=0, length=2.5, aligned=True, causal=False)  # long enough that a bound from mean lengths fails
@given(seed=st.integers(0, 2**16), length=st.floats(0.2, 3.0), aligned=st.booleans(), causal=st.booleans())
def test_the_keys_beyond_each_heads_reach_hold_at_most_an_eighth_of_float32s_eps(seed, length, aligned, causal):
    """Random q and k, or the worst case of the bound: every query parallel to the first key and opposite
    to its own, so the first key outscores the query's own by scale |q| (|k_0| + |k_i|) before the bias
    (half the queries, nearest the first key, three times as long as the rest, and the first key
    twice as long as the others: the bound must take the longest of each)."""
    torch.manual_seed(seed)
    n, d = 512, 16
    slopes = torch.tensor([1.0, 0.5, 0.125])
    q, k = (torch.randn(1, 3, n, d) * length for _ in range(2))
    if aligned:
        direction = torch.nn.functional.normalize(torch.randn(d), dim=0) * length * math.sqrt(d)
        q[:] = direction
        q[..., :n // 2, :] *= 3  # the longest queries, nearest the first key
        k[:] = -direction
        k[..., 0, :] = 2 * direction  # the longest key
    scale = 1 / math.sqrt(d)
    distance = head_reach(q, k, slopes, scale, groups=1)
    assert all(w <= EPS / 8 for w in weight_beyond(q, k, slopes, scale, causal, distance)), distance
    if aligned:  # the bound is tight: at half the steepest head's reach the first key still holds far more
        half = distance[0] // 2  # (within the first rows, whose queries are nearly the longest)
        assert weight_beyond(q, k, slopes, scale, causal, [half])[0] > EPS / 8, half


def test_grouped_query_heads_share_the_reach_of_their_flattest_slope_and_longest_query():
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 64, 8), torch.randn(2, 2, 64, 8)
    q[1, 1] *= 3  # the longest query: head 1, of KV head 0
    slopes = torch.tensor([1.0, 0.5, 0.25, 0.0])
    apart = head_reach(q, k.repeat_interleave(2, 1), slopes, 0.3, groups=1)
    assert head_reach(q, k, slopes, 0.3, groups=2) == [max(apart[:2]), None]
    assert apart[3] is None  # slope 0: no key's weight falls with distance


@pytest.fixture
def reach_from_any_length(monkeypatch):
    for setting in reach.MIN_KEYS:
        monkeypatch.setitem(reach.MIN_KEYS, setting, 0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("groups, window", [(1, None), (2, None), (1, (300, 40)), (2, (300, None))])
def test_strided_leaving_out_keys_beyond_each_heads_reach_equals_naive(reach_from_any_length, monkeypatch, causal,
                                                                        groups, window):
    seen = []  # the window each run of heads is shown
    attention = strided._attention
    monkeypatch.setattr(strided, "_attention", lambda *args: seen.append(args[-1]) or attention(*args))
    torch.manual_seed(1)
    n, d = 1024, 16
    slopes = torch.tensor([1.0, 0.5, 0.05, 0.0], dtype=torch.float64)
    q = (torch.randn(2, 4, n, d, dtype=torch.float64) * 0.3).requires_grad_()
    k, v = ((torch.randn(2, 4 // groups, n, d, dtype=torch.float64) * 0.3).requires_grad_() for _ in range(2))
    windows = reach_windows(q, k, slopes, 1 / math.sqrt(d), causal, groups, window)
    assert windows is not None and windows[0] is not None and windows[-1] is None, windows  # the reach is taken
    out = alibi_attention(q, k, v, slopes, causal=causal, impl="strided", window=window)
    assert seen == [strided.effective_window(w or window, n, n, causal) for w in windows if w is not None] + [
        strided.effective_window(window, n, n, causal)]  # each narrowed head alone, the last heads together
    expected = alibi_attention(q, k, v, slopes, causal=causal, impl="naive", window=window)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    grad = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad),
                         strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_float32_with_the_worst_case_q_and_k_stays_as_close_to_float64_as_the_materialised_bias(
        reach_from_any_length):
    torch.manual_seed(2)
    n, d = 1024, 16
    slopes = torch.tensor([1.0, 0.5])
    direction = torch.nn.functional.normalize(torch.randn(d), dim=0) * 1.2
    q = direction.expand(1, 2, n, d).clone()
    k = -q
    k[..., ::97, :] = direction  # keys every 97 positions outscore each query's own by 2 scale |q| |k|
    v = torch.randn(1, 2, n, d)
    assert reach_windows(q, k, slopes, 1 / math.sqrt(d), False, 1, None) is not None
    exact = alibi_attention(*(x.double() for x in (q, k, v)), slopes.double(), impl="naive")
    for impl in ("strided", "naive"):
        error = (alibi_attention(q, k, v, slopes, impl=impl).double() - exact).abs().max()
        assert error < 4 * EPS * v.abs().max(), (impl, error)


def test_the_reach_is_taken_only_where_it_is_measured_and_exact():
    slopes = torch.tensor(get_slopes(8), dtype=torch.float32)
    n = reach.MIN_KEYS["flushed" if subnormals_flushed() else "kept", "causal"]  # this process's state
    q, k = torch.randn(1, 8, n, 64), torch.randn(1, 8, n, 64)
    windows = reach_windows(q, k, slopes, 0.125, True, 1, None)
    assert windows[0] is not None and windows[-1] is None, windows  # steep heads narrowed, flat ones not
    short = reach_windows(q[..., :-1, :], k[..., :-1, :], slopes, 0.125, True, 1, None)
    learned = reach_windows(q, k, slopes.clone().requires_grad_(), 0.125, True, 1, None)
    half = reach_windows(q.bfloat16(), k.bfloat16(), slopes, 0.125, True, 1, None)  # causal 16-bit: one call
    assert reach_windows(q.bfloat16(), k.bfloat16(), slopes, 0.125, False, 1, None) is not None
    more_queries = reach_windows(torch.randn(1, 8, n + 1, 64), k, slopes, 0.125, True, 1, None)
    narrow = reach_windows(q, k, slopes, 0.125, False, 1, (8, 8))  # the window already narrower than any reach
    assert (short, learned, half, more_queries, narrow) == (None,) * 5


@pytest.mark.parametrize("flushed", [True, False])
def test_with_subnormals_kept_a_head_whose_bias_falls_below_float32s_normals_is_narrowed_even_where_little_is_saved(
        reach_from_any_length, monkeypatch, flushed):
    monkeypatch.setattr(reach, "subnormals_flushed", lambda: flushed)
    q, k = torch.randn(1, 2, 1024, 64), torch.randn(1, 2, 1024, 64)
    # reach about 420 and 1700 keys: windows of 2 x 420 keys (plus a call's 256 rows) do not halve the work
    slopes = torch.tensor([1 / 8, 1 / 32])
    windows = reach_windows(q, k, slopes, 0.125, False, 1, None)
    # e^(-1023 / 8) is far below float32's smallest normal e^-87.3, e^(-1023 / 32) is not
    assert windows == (None if flushed else [(windows[0][0], windows[0][0]), None]), windows


def test_with_subnormals_flushed_the_reach_starts_at_fewer_keys_without_a_causal_mask(monkeypatch):
    monkeypatch.setattr(reach, "subnormals_flushed", lambda: True)
    n = reach.MIN_KEYS["flushed", "symmetric"]
    assert n < reach.MIN_KEYS["flushed", "causal"]
    q, k = torch.randn(1, 8, n, 64), torch.randn(1, 8, n, 64)
    slopes = torch.tensor(get_slopes(8), dtype=torch.float32)
    assert reach_windows(q, k, slopes, 0.125, False, 1, None) is not None
    assert reach_windows(q, k, slopes, 0.125, True, 1, None) is None
    assert reach_windows(q[..., 1:, :], k[..., 1:, :], slopes, 0.125, False, 1, None) is None
