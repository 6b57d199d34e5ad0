"""The fused paths (strided on the CPU, FlexAttention on CUDA) held to the naive path, and their memory bound."""

import functools
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from conftest import DEVICES
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_attention import problems, to_torch

import alibi_ref.reach as reach
import alibi_ref.strided as strided
from alibi_ref import alibi_attention, alibi_bias, get_slopes
from alibi_ref.dispatch import FEW_QUERIES, FLEX_MIN_KEYS, STRIDED_MIN_KEYS, Dims, choose_impl
from alibi_ref.strided import (
    bias_row,
    causal_block,
    hankel_view,
    last_row_fits,
    reversed_keys_row,
    strided_alibi_attention,
)


@pytest.fixture
def kernel_calls(monkeypatch) -> list[bool | str]:
    """torch's fused kernel, still run, each call noted (its is_causal flag; "split" for the split causal
    form, whose kernel calls are private): which form a path took."""
    calls = []
    kernel = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *args, **kwargs: calls.append(kwargs.get("is_causal", False)) or kernel(*args, **kwargs))
    split_calls = strided.split_calls
    monkeypatch.setattr(strided, "split_calls", lambda *args: calls.append("split") or split_calls(*args))
    return calls


@pytest.fixture
def split_always(monkeypatch):
    """The split causal form at any size: these tests' small calls would otherwise run as one kernel call."""
    monkeypatch.setattr(strided, "ONE_CALL_LOGITS", 0)


def test_the_bias_is_a_strided_view_of_one_row_once_the_queries_are_reversed():
    slopes = torch.tensor([0.5, 0.25, -0.1, 1 / 3], dtype=torch.float64)
    for q_len, k_len, causal in [(6, 6, False), (6, 6, True), (2, 7, True), (7, 3, False), (1, 5, True)]:
        row = bias_row(slopes, q_len, k_len, causal)  # (H, q_len + k_len - 1)
        view = hankel_view(row, range(q_len), range(k_len))[0]  # (H, r, j)
        assert view.untyped_storage().nbytes() == row.numel() * row.element_size()
        # exactly the materialised bias, rows in reverse: same formula, same rounding
        assert torch.equal(view.flip(-2), alibi_bias(slopes, q_len, k_len, causal=causal)), (q_len, k_len, causal)
        rows = range(1, q_len)
        assert torch.equal(hankel_view(row, rows, range(k_len - 1))[0], view[:, 1:, : k_len - 1])
        assert torch.equal(hankel_view(row, rows, range(2, k_len))[0], view[:, 1:, 2:])  # keys from 2 on
        # or with the keys reversed instead (the causal split), queries in order
        keys_reversed = hankel_view(reversed_keys_row(slopes, q_len, k_len, causal), range(q_len), range(k_len))[0]
        assert torch.equal(keys_reversed.flip(-1), alibi_bias(slopes, q_len, k_len, causal=causal))


@given(problems(max_len=9), st.integers(1, 9))
def test_strided_equals_naive_in_float64_for_any_causal_block(problem, block):
    q, k, v, slopes, causal = problem
    expected = alibi_attention(q, k, v, slopes, causal=causal)
    q, k, v, slopes = to_torch(q, k, v, slopes)
    groups = q.shape[-3] // k.shape[-3]
    out = strided_alibi_attention(q, k, v, slopes, q.shape[-1] ** -0.5, causal, groups, block)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-9, atol=1e-12)
    # by keyword too: the batch-flattening wrapper once dropped keyword arguments
    by_keyword = strided_alibi_attention(q, k, v, slopes, scale=q.shape[-1] ** -0.5, causal=causal, groups=groups,
                                         block=block)
    assert torch.equal(by_keyword, out)


@pytest.mark.parametrize(("q_len", "k_len"), [(1, 1), (1, 9), (5, 5), (7, 7), (12, 12), (13, 30), (30, 30)])
def test_the_split_calls_show_each_row_each_key_it_sees_exactly_once(monkeypatch, q_len, k_len):
    """Reversed row r sees keys j <= k_len - 1 - r: its calls' keys must cover those once each, and each call
    must show each of its rows at least one key it sees (a row of only -inf has no softmax)."""
    monkeypatch.setattr(strided, "SPLIT_ROWS", 5)
    monkeypatch.setattr(strided, "BAND_ROWS", 2)
    seen = np.zeros((q_len, k_len), dtype=int)
    calls = strided.split_calls(q_len, k_len)
    for rows, keys in calls:
        for r in rows:
            assert keys.start <= k_len - 1 - r, (rows, keys, r)
            seen[r, keys.start:keys.stop] += 1
    visible = np.arange(k_len)[None, :] <= (k_len - 1 - np.arange(q_len))[:, None]
    assert (seen[visible] == 1).all()
    # keys shown to a row it cannot see (its -inf, computed for nothing): only in calls of at most BAND_ROWS
    # rows, at most BAND_ROWS - 1 per row; the rectangles of up to SPLIT_ROWS rows hold none
    unseen = {(rows, keys): [max(0, keys.stop - (k_len - r)) for r in rows] for rows, keys in calls}
    assert all(len(rows) <= 5 for rows, _ in calls)
    assert all(len(rows) <= 2 and max(waste) <= 1 for (rows, _), waste in unseen.items() if any(waste))


def test_split_bands_are_a_quarter_of_the_queries_within_64_to_128_rows_under_768_row_rectangles():
    def shape(n):
        return [(len(rows), len(keys)) for rows, keys in strided.split_calls(n, n)]

    assert shape(256) == [(64, 256), (64, 192), (64, 128), (64, 64)]
    assert shape(1024) == [(768, 256)] + [(128, 768 - 128 * b) for b in range(6)] + [(128, 256), (128, 128)]
    assert shape(100) == [(64, 100), (36, 36)]
    assert strided.split_calls(1, 4096) == [(range(1), range(4096))]  # decoding: one call
    assert [len(rows) for rows, _ in strided.split_calls(300, 4096)] == [300, 75, 75, 75, 75]
    rectangles = [(rows, keys) for rows, keys in shape(4096) if rows == 768]
    assert rectangles == [(768, 4096 - 768 * (b + 1)) for b in range(5)]


@given(problems(max_len=9, causal=True), st.integers(1, 4), st.integers(1, 3), st.booleans())
def test_the_split_causal_form_equals_naive_in_float64(problem, split_rows, band_rows, keys_reversed):
    """Calls split at the diagonal and merged by their log-sum-exp: the naive path's output and gradients, any
    split sizes, the keys reversed or the queries. The gradients' buffers start as NaN here: each key's and
    row's first call must write, not add."""
    q, k, v, slopes, _ = problem
    v = np.tile(v, q.shape[-1])[..., : q.shape[-1]]  # the kernel needs d_v == d
    q, k, v, slopes = to_torch(q, k, v, slopes)
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    expected = alibi_attention(*inputs, slopes, causal=True, impl="naive")
    grad_out = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, inputs, grad_out)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(strided, "SPLIT_ROWS", split_rows)
        patch.setattr(strided, "BAND_ROWS", band_rows)
        patch.setattr(strided, "reversing_keys_is_cheaper", lambda calls, k_len: keys_reversed)
        patch.setattr(strided, "ONE_CALL_LOGITS", 0)
        empty_like = torch.empty_like
        patch.setattr(torch, "empty_like", lambda *args, **kwargs: empty_like(*args, **kwargs).fill_(float("nan")))
        assert strided.split_fits(q, v, 0.0)
        out = strided_alibi_attention(*inputs, slopes, q.shape[-1] ** -0.5, True, q.shape[-3] // k.shape[-3])
        grads = torch.autograd.grad(out, inputs, grad_out)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-12)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("keys_reversed", [True, False])
@pytest.mark.parametrize(("q_len", "k_len", "n_calls"), [(9, 9, 7), (4, 9, 3), (1, 6, 1)])
def test_the_split_causal_form_passes_gradcheck(monkeypatch, kernel_calls, split_always, q_len, k_len, n_calls,
                                                keys_reversed):
    """Its backward pass (torch's flash backward per call, handed the merged output and log-sum-exp) against
    finite differences: GQA, a KV cache (q_len < k_len), rectangles and bands of several calls each, the keys
    reversed or the queries."""
    monkeypatch.setattr(strided, "SPLIT_ROWS", 4)
    monkeypatch.setattr(strided, "BAND_ROWS", 3)
    monkeypatch.setattr(strided, "reversing_keys_is_cheaper", lambda calls, k_len: keys_reversed)
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(2, 4, q_len, 5, generator=gen, dtype=torch.float64)  # 4 query heads on 2 KV heads
    k, v = torch.randn(2, 2, 2, k_len, 5, generator=gen, dtype=torch.float64)
    slopes = torch.tensor([0.5, 0.25, 0.7, 0.1], dtype=torch.float64, requires_grad=True)
    inputs = [x.requires_grad_() for x in (q, k, v)]
    assert torch.autograd.gradcheck(
        lambda q, k, v, m: strided_alibi_attention(q, k, v, m, 0.4, True, 2), [*inputs, slopes])
    assert set(kernel_calls) == {"split"}  # every call took the split form
    assert len(strided.split_calls(q_len, k_len)) == n_calls  # rectangles and bands; one call for one row


def test_the_split_reverses_the_keys_only_where_that_copies_less():
    """Reversing k and v copies k_len rows twice; reversing each call's queries and output copies its rows twice.
    So the keys where rows are in two calls (a rectangle and a band); never the cache of a decoding step."""
    def pays(q_len, k_len):
        return strided.reversing_keys_is_cheaper(strided.split_calls(q_len, k_len), k_len)

    assert pays(1024, 1024) and pays(4096, 4096)
    assert not pays(256, 256)  # bands only: each row in one call, copies of 64 rows at a time
    assert not pays(1, 4096) and not pays(512, 4096)


def test_the_split_reads_grouped_kv_heads_without_copying_them(monkeypatch):
    """torch 2.13's CPU flash kernel maps query head h to KV head h // groups itself: K and V stay H_kv heads."""
    assert strided._kernel_takes_gqa()
    monkeypatch.setattr(strided, "repeat_heads", lambda *args: pytest.fail("K and V were copied per query head"))
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(2, 8, 200, 16, generator=gen, dtype=torch.float64)
    k, v = torch.randn(2, 2, 2, 200, 16, generator=gen, dtype=torch.float64)  # 8 query heads on 2 KV heads
    slopes = torch.tensor(get_slopes(8), dtype=torch.float64)
    out = strided_alibi_attention(q, k, v, slopes, 0.25, True, 4)
    expected = alibi_attention(q, k, v, slopes, causal=True, scale=0.25, impl="naive")
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-12)


def test_dropout_and_a_narrower_v_take_the_blocks_instead_of_the_split(kernel_calls, split_always):
    gen = torch.Generator().manual_seed(9)
    q, k = (torch.randn(1, 2, 40, 8, generator=gen) for _ in range(2))
    slopes = torch.tensor(get_slopes(2), dtype=torch.float32)
    for v, dropout_p in [(torch.randn(1, 2, 40, 4, generator=gen), 0.0), (torch.randn(1, 2, 40, 8), 0.5)]:
        kernel_calls.clear()
        strided_alibi_attention(q, k, v, slopes, 0.3, True, 1, dropout_p=dropout_p)
        assert kernel_calls and "split" not in kernel_calls
    kernel_calls.clear()
    strided_alibi_attention(q, k, q, slopes, 0.3, True, 1)
    assert kernel_calls == ["split"]


def test_a_small_causal_call_runs_as_one_kernel_call_and_a_larger_one_split(monkeypatch, kernel_calls):
    """Up to ONE_CALL_LOGITS logits (B H i j) the split's fixed costs outweigh the -inf triangle it saves."""
    gen = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(3, 2, 40, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    slopes = torch.tensor(get_slopes(2), dtype=torch.float64)
    expected = alibi_attention(q, k, v, slopes, causal=True, impl="naive")
    for one_call_logits, form in [(3 * 2 * 40 * 40, [False]), (3 * 2 * 40 * 40 - 1, ["split"])]:
        monkeypatch.setattr(strided, "ONE_CALL_LOGITS", one_call_logits)
        kernel_calls.clear()
        out = strided_alibi_attention(q, k, v, slopes, 8**-0.5, True, 1)
        assert kernel_calls == form  # one call shown every key (its -inf in the row), or the split
        torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("dtype", "causal"), [(torch.float32, True), (torch.float32, False), (torch.bfloat16, True)])
def test_the_cpu_default_compiles_with_torch_compile(split_always, dtype, causal):
    """torch.compile of a model on the CPU goes through the strided path as one graph (causal 16-bit inputs
    take the split there: the one-call form's bound reads the slopes' values; and no bias is cached between
    calls, which would read them too, so this size takes strided where eager mode would take the cached bias).
    float32: output and gradients as eager mode's strided path; bfloat16 (another path, other roundings):
    within the bounds the 16-bit test states against float64, 2e-2 on the output and 4e-2 on the gradients."""
    gen = torch.Generator().manual_seed(10)
    slopes = torch.tensor(get_slopes(4), dtype=torch.float32)
    inputs = [torch.randn(2, 4, 300, 16, generator=gen) for _ in range(3)]
    upstream = torch.randn(2, 4, 300, 16, generator=gen)

    def attend(q, k, v, impl="auto"):
        return alibi_attention(q, k, v, slopes, causal=causal, impl=impl)

    def run(fn, dtype):
        leaves = [x.to(dtype).requires_grad_() for x in inputs]
        out = fn(*leaves)
        return (out, *torch.autograd.grad(out, leaves, upstream.to(dtype)))

    torch._dynamo.reset()
    compiled = run(torch.compile(attend, fullgraph=True), dtype)
    if dtype == torch.float32:
        for ours, theirs in zip(compiled, run(functools.partial(attend, impl="strided"), dtype), strict=True):
            torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
        return
    for ours, theirs, bound in zip(compiled, run(attend, torch.float64), (2e-2, 4e-2, 4e-2, 4e-2), strict=True):
        assert ours.dtype == dtype and (ours.double() - theirs).abs().max() < bound


def _one_call_whatever_the_dtype(q, v, slopes, causal, dropout_p):
    """last_row_fits without its precision bound: what the kernel needs, so float64 can run the one-call form."""
    return (causal and dropout_p == 0 and q.shape[-2] == v.shape[-2] and q.shape[-1] == v.shape[-1]
            and not slopes.requires_grad)


@given(problems(max_len=9, causal=True))
def test_the_one_call_causal_form_is_exact_algebra_in_float64(problem):
    """Shifting each row by a constant changes nothing: in float64 the last query's row with the kernel's
    is_causal equals the naive path, for any slopes, GQA and batch shape (16-bit inputs take it, for speed)."""
    q, k, v, slopes, _ = problem
    k, v = k[..., -q.shape[-2]:, :], v[..., -q.shape[-2]:, :]  # the form needs q_len == k_len
    v = np.tile(v, q.shape[-1])[..., : q.shape[-1]]  # and d_v == d
    expected = alibi_attention(q, k, v, slopes, causal=True)
    q, k, v, slopes = to_torch(q, k, v, slopes)
    calls = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(strided, "last_row_fits", lambda *args: calls.append(1) or _one_call_whatever_the_dtype(*args))
        out = strided_alibi_attention(q, k, v, slopes, q.shape[-1] ** -0.5, True, q.shape[-3] // k.shape[-3])
    assert calls and _one_call_whatever_the_dtype(q, v, slopes, True, 0.0)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-9, atol=1e-12)


def test_a_torch_that_refuses_the_one_call_form_gets_the_blocks(monkeypatch):
    """Where torch's fused kernel turns the call down (here: d_v != d, which last_row_fits knows of;
    older torch versions: GQA), its math path refuses a mask with is_causal, and the blocks run."""
    monkeypatch.setattr(strided, "last_row_fits", lambda *args: True)
    gen = torch.Generator().manual_seed(6)
    q, k = (torch.randn(2, 4, 9, 5, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 4, 9, 3, generator=gen, dtype=torch.float64)
    slopes = torch.tensor(get_slopes(4), dtype=torch.float64)
    with pytest.raises(RuntimeError, match="is_causal"):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros_like(q[0, 0, :, :9]),
                                                         is_causal=True)
    out = strided_alibi_attention(q, k, v, slopes, 0.4, True, 1)
    expected = alibi_attention(q, k, v, slopes, causal=True, scale=0.4, impl="naive")
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-12)


def test_the_one_call_causal_form_passes_gradcheck(monkeypatch):
    monkeypatch.setattr(strided, "last_row_fits", _one_call_whatever_the_dtype)
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 7, 5, generator=gen, dtype=torch.float64)  # 4 query heads on 2 KV heads
    k, v = torch.randn(2, 1, 2, 7, 5, generator=gen, dtype=torch.float64)
    slopes = torch.tensor([0.5, 0.25, 0.7, 0.1], dtype=torch.float64)
    inputs = [x.requires_grad_() for x in (q, k, v)]
    assert torch.autograd.gradcheck(lambda q, k, v: strided_alibi_attention(q, k, v, slopes, 0.4, True, 2), inputs)


def test_learned_slopes_in_16_bit_run_in_one_kernel_call_and_get_their_gradient(kernel_calls, split_always):
    """torch's fused kernel refuses a mask that needs a gradient (its math path would build every weight):
    the attention runs with the slopes detached, one kernel call here, and SlopesGradient gives them theirs."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4, 300, 8, generator=gen) for _ in range(3))
    grads = {}
    for dtype in (torch.float64, torch.bfloat16):
        slopes = torch.tensor(get_slopes(4), dtype=torch.float64 if dtype == torch.float64 else torch.float32,
                              requires_grad=True)
        assert not last_row_fits(q.to(dtype), v.to(dtype), slopes, True, 0.0)  # as they come: refused
        kernel_calls.clear()
        out = alibi_attention(q.to(dtype), k.to(dtype), v.to(dtype), slopes, causal=True, impl="strided")
        assert kernel_calls == ([True] if dtype == torch.bfloat16 else ["split"])  # float64: split at the diagonal
        (grads[dtype],) = torch.autograd.grad((out.double() * v.double()).sum(), slopes)
    assert grads[torch.float64].abs().min() > 1e-2  # every slope matters here
    torch.testing.assert_close(grads[torch.bfloat16].double(), grads[torch.float64], rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize(("causal", "q_len", "block"), [(True, 7, 3), (False, 7, None), (True, 2, None)])
def test_learned_slopes_pass_gradcheck_block_by_block(monkeypatch, causal, q_len, block):
    """The slopes' gradient recomputed a few query rows at a time (SCORES_PER_BLOCK made tiny), with GQA."""
    monkeypatch.setattr(strided, "SCORES_PER_BLOCK", 2 * 4 * 7 * 2)  # 2 rows per block: 4 blocks of 7 rows
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(2, 4, q_len, 5, generator=gen, dtype=torch.float64)  # 4 query heads on 2 KV heads
    k, v = torch.randn(2, 2, 2, 7, 5, generator=gen, dtype=torch.float64)
    slopes = torch.tensor([0.5, 0.25, 0.7, 0.1], dtype=torch.float64)
    inputs = [x.requires_grad_() for x in (q, k, v, slopes)]
    assert torch.autograd.gradcheck(
        lambda q, k, v, m: strided_alibi_attention(q, k, v, m, 0.4, causal, 2, block), inputs)


@pytest.mark.parametrize(("causal", "q_len", "block"), [(True, 7, 3), (False, 7, 3), (True, 2, 4), (True, 7, 1)])
def test_strided_gradients_match_finite_differences(causal, q_len, block):
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, q_len, 5, generator=gen, dtype=torch.float64)  # 4 query heads on 2 KV heads
    k, v = torch.randn(2, 1, 2, 7, 5, generator=gen, dtype=torch.float64)
    slopes = torch.tensor(get_slopes(4), dtype=torch.float64)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    assert torch.autograd.gradcheck(
        lambda q, k, v: strided_alibi_attention(q, k, v, slopes, 0.4, causal, 2, block), (q, k, v))


@pytest.mark.usefixtures("without_fused_kernel")
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads", [8, 12])
def test_strided_float32_is_as_close_to_float64_as_the_materialised_bias_at_length_4096(causal, heads):
    """Nothing is folded: float32 output within 5e-6 of float64, as the (H, N, N) bias gives (~1.5e-6)."""
    gen = torch.Generator().manual_seed(0)
    n = 4096
    q, k, v = (torch.randn(1, heads, n, 64, generator=gen) for _ in range(3))
    slopes = torch.tensor(get_slopes(heads))
    assert choose_impl("auto", q, Dims(heads, heads, n, n, 64), False) == "strided"
    reference = alibi_attention(*(x.double() for x in (q, k, v)), slopes.double(), causal=causal, impl="sdpa")
    error = (alibi_attention(q, k, v, slopes, causal=causal).double() - reference).abs().max().item()
    assert error < 5e-6, f"the strided path is off by {error:.2e} at N={n}"


@pytest.mark.parametrize("block", [None, "split", 150, "reach"], ids=["default", "split", "blocks", "reach"])
def test_strided_runs_16_bit_inputs_forward_and_backward(monkeypatch, block):
    """16-bit in and out, the bias added in float32: output and gradients within the inputs' own rounding.

    Causal calls run as one kernel call reading the last query's row by default, split at the diagonal
    where that form is refused, through the blocks when ``block`` is given. Stated bounds (gradients
    here reach about 4 in size): bfloat16 2e-2 on the output and 4e-2 on the gradients, float16 2e-3
    and 1.2e-2. float16's gradient bound is torch's:
    its CPU kernel with is_causal and no bias at all is off by 7e-3 on dv here (keys near the start
    sum the gradient of hundreds of queries), and the one-call form is that kernel (measured 8.8e-3;
    the blocks and the split 2.7e-3).
    """
    if block == "split":
        monkeypatch.setattr(strided, "last_row_fits", lambda *args: False)
        block = None
    if block == "reach":  # bfloat16 symmetric: the steep heads as windows (alibi_ref.reach), at any length
        for setting in reach.MIN_KEYS:
            monkeypatch.setitem(reach.MIN_KEYS, setting, 0)
        monkeypatch.setattr(reach, "SHOWN_AT_MOST", 10)
        block = None
    gen = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(1, 8, 600, 32, generator=gen) for _ in range(4))
    slopes = torch.tensor(get_slopes(8), dtype=torch.float32)
    taken = reach.reach_windows(q.bfloat16(), k.bfloat16(), slopes, 32**-0.5, False, 1, None)
    assert (taken is not None) == (block is None and not any(reach.MIN_KEYS.values())), taken
    for causal in (True, False):
        leaves = [x.double().requires_grad_() for x in (q, k, v)]
        reference = alibi_attention(*leaves, slopes.double(), causal=causal)
        reference_grads = torch.autograd.grad(reference, leaves, grad.double())
        for dtype, bound, grad_bound in [(torch.bfloat16, 2e-2, 4e-2), (torch.float16, 2e-3, 1.2e-2)]:
            inputs = [x.to(dtype).requires_grad_() for x in (q, k, v)]
            out = strided_alibi_attention(*inputs, slopes, 32**-0.5, causal, 1, block)
            assert out.dtype == dtype
            error = (out.double() - reference).abs().max().item()
            assert error < bound, f"{dtype}, causal={causal}: off by {error:.2e}"
            for name, ours, theirs in zip("qkv", torch.autograd.grad(out, inputs, grad.to(dtype)), reference_grads,
                                          strict=True):
                assert ours.dtype == dtype
                error = (ours.double() - theirs).abs().max().item()
                assert error < grad_bound, f"{dtype}, causal={causal}: d{name} off by {error:.2e}"


@pytest.mark.usefixtures("without_fused_kernel")
def test_causal_16_bit_calls_run_as_one_kernel_call_while_the_shift_rounds_below_their_precision(kernel_calls):
    def fits(dtype=torch.bfloat16, n=600, k_len=None, d_v=32, dropout_p=0.0, causal=True, slope=0.5):
        q = torch.zeros(2, 8, n, 32, dtype=dtype)
        v = torch.zeros(2, 8, k_len or n, d_v, dtype=dtype)
        return last_row_fits(q, v, torch.tensor([slope] + [0.01] * 7), causal, dropout_p)

    assert fits() and fits(torch.float16)
    assert not fits(torch.float32)  # the shift would cost float32 100 times its error (module docstring)
    assert not fits(causal=False)
    assert not fits(k_len=700)  # is_causal aligns the queries to the first keys
    assert not fits(dropout_p=0.1) and not fits(d_v=16)  # torch's math path refuses a mask with is_causal
    # max |m| (N - 1) 2^-24 within a quarter of the unit roundoff: float16 up to 2048, bfloat16 up to 16384
    assert fits(torch.float16, n=4097) and not fits(torch.float16, n=4098)
    assert fits(torch.bfloat16, n=32769) and not fits(torch.bfloat16, n=32770)
    assert fits(torch.float16, n=4098, slope=0.25) and fits(torch.float16, n=4097, slope=-0.5)

    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 8, 1100, 16, generator=gen) for _ in range(3))
    slopes = torch.tensor(get_slopes(8), dtype=torch.float32)
    for dtype, expected in [(torch.bfloat16, [True]), (torch.float32, ["split"])]:
        kernel_calls.clear()
        alibi_attention(q.to(dtype), k.to(dtype), v.to(dtype), slopes, causal=True)
        assert kernel_calls == expected, dtype  # float32: split at the diagonal
    # grouped-query attention (8 query heads on 2 KV heads) in the one call, against float64's naive path
    k, v = k[:, :2], v[:, :2]
    reference = alibi_attention(q.double(), k.double(), v.double(), slopes.double(), causal=True, impl="naive")
    kernel_calls.clear()
    out = alibi_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), slopes, causal=True)
    assert kernel_calls == [True] and (out.double() - reference).abs().max() < 2e-2


def test_learned_slopes_get_the_same_gradient_through_the_strided_view():
    """Some ALiBi variants train the slopes: the gradient must flow back through as_strided to the row."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 4, 40, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    grads = {}
    for impl, block in (("naive", None), ("strided", 7)):
        slopes = torch.tensor(get_slopes(4), dtype=torch.float64, requires_grad=True)
        out = (alibi_attention(q, k, v, slopes, causal=True, impl=impl) if block is None
               else strided_alibi_attention(q, k, v, slopes, 8**-0.5, True, 1, block))
        (grads[impl],) = torch.autograd.grad((out * v).sum(), slopes)
    assert grads["naive"].abs().min() > 1e-3  # every slope matters here
    torch.testing.assert_close(grads["strided"], grads["naive"], rtol=1e-10, atol=1e-12)


def test_causal_blocks_are_768_rows_against_many_keys_else_a_quarter_of_the_queries_within_64_to_256():
    assert [causal_block(n, n) for n in (1, 100, 256, 600, 1024, 2559, 2560, 16384)] == [64, 64, 64, 150, 256, 256,
                                                                                         768, 768]
    assert causal_block(16384, 2000) == 256 and causal_block(1, 4096) == 768


@pytest.mark.usefixtures("without_fused_kernel")
def test_auto_picks_the_fused_path_for_its_device():
    for n, expected in [(1, "sdpa"), (STRIDED_MIN_KEYS - 1, "sdpa"), (STRIDED_MIN_KEYS, "strided"),
                        (FLEX_MIN_KEYS - 1, "strided"), (4096, "strided")]:
        q = torch.zeros(1, 8, n, 4)
        assert choose_impl("auto", q, Dims(8, 8, n, n, 4), False) == expected, n
    for q_len, expected in [(1, "sdpa"), (FEW_QUERIES, "sdpa"), (FEW_QUERIES + 1, "strided")]:
        q = torch.zeros(1, 8, q_len, 4)  # a decoding step against a long cache: its few rows of bias
        assert choose_impl("auto", q, Dims(8, 8, q_len, 4096, 4), False, causal=True) == expected, q_len
    # a symmetric batch whose bias (H i j) is small beside q (B H i d): k_len <= B d / 4 takes the bias
    for batch, n, causal, expected in [(32, 512, False, "sdpa"), (32, 513, False, "strided"),
                                       (32, 512, True, "strided"), (16, 256, False, "sdpa"),
                                       (8, 256, False, "strided"), (1, 128, False, "strided")]:
        q = torch.zeros(batch, 1, 8, n, 64)  # the batch may have several dimensions
        assert choose_impl("auto", q, Dims(8, 8, n, n, 64), False, causal=causal) == expected, (batch, n, causal)
    assert choose_impl("auto", q, Dims(8, 8, 1, 4096, 4), True) == "naive"  # the weights were asked for
    assert choose_impl("auto", np.zeros((8, 4, 4)), Dims(8, 8, 4, 4, 4), False) == "naive"
    with pytest.raises(ValueError, match="impl='strided' needs torch tensors"):
        alibi_attention(np.zeros((8, 4, 4)), np.zeros((8, 4, 4)), np.zeros((8, 4, 4)), get_slopes(8), impl="strided")


# a fresh interpreter measures its own peak resident memory (VmHWM), reset after the inputs exist
_MEMORY_PROBE = textwrap.dedent("""
    import json, sys, torch
    from alibi_ref import alibi_attention, flush_denormals, get_slopes

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

    flush_denormals()  # for speed only
    n, heads, d = 16384, 8, 64
    q, k, v = (torch.randn(1, heads, n, d, requires_grad=True) for _ in range(3))
    slopes = torch.tensor(get_slopes(heads))
    alibi_attention(q[:, :, :600], k[:, :, :600], v[:, :, :600], slopes, causal=True).sum().backward()  # warm-up
    q.grad = k.grad = v.grad = None
    learned = slopes.clone().requires_grad_()  # the slopes' own gradient, recomputed block by block
    peaks = {}
    for name, causal, m in (("causal", True, slopes), ("symmetric", False, slopes), ("learned, causal", True, learned)):
        base = status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak to the present
        out = alibi_attention(q, k, v, m, causal=causal)
        out.sum().backward()
        peaks[name] = status("VmHWM") - base
        q.grad = k.grad = v.grad = None
        del out
    print(json.dumps(peaks))
""")


def test_default_path_at_length_16384_stays_under_1_gib():
    """The (8, 16384, 16384) float32 bias alone would be 8 GiB; the default path must never build it,
    forward or backward (each case here runs both), learned slopes included."""
    done = subprocess.run([sys.executable, "-c", _MEMORY_PROBE], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    peaks = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(peaks) == 3
    for name, peak in peaks.items():
        print(f"{name}: {peak / 2**20:.0f} MiB beyond the inputs")
        assert peak < 2**30, f"{name}: {peak / 2**20:.0f} MiB at N=16384"


# ----------------------------------------------------------------------------- FlexAttention, compiled

# (dtype, output tolerance, gradient tolerance) against the naive path in float64; the bfloat16
# bounds are the strided path's, stated there
FLEX_TOLERANCES = [(torch.float32, 1e-5, 1e-4), (torch.bfloat16, 2e-2, 4e-2)]


BLOCK_MASK_FIELDS = ["kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                     "q_indices", "full_q_num_blocks", "full_q_indices"]
reaches = st.one_of(st.none(), st.integers(0, 400))


@pytest.mark.parametrize("device", DEVICES)
def test_the_shapes_block_mask_is_torchs_own_tensor_for_tensor(device):
    """The causal and window block masks come from the tiles' corners (flex._band_block_mask), not from evaluating
    the mask at every (i, j): they must equal what torch's create_block_mask builds from the same mask_mod, every
    tensor of it, for lengths around and between the 128-wide blocks, more queries than keys too."""
    from torch.nn.attention.flex_attention import create_block_mask

    from alibi_ref.flex import _offset, _shape_block_mask, visibility

    @settings(max_examples=40)
    @given(st.integers(1, 700), st.integers(1, 700), st.booleans(), st.one_of(st.none(), st.tuples(reaches, reaches)))
    @example(129, 256, True, None)  # a tile whose nearest key is exactly at the band's edge: full, not partial
    @example(256, 256, False, (None, 127))  # the same at the window's edge ahead
    @example(700, 5, False, (3, None))  # queries far before every key: rel down to 1 - q_len
    def check(q_len, k_len, causal, window):
        if not causal and window in (None, (None, None)):
            return  # no mask: flex runs without one
        ours = _shape_block_mask(q_len, k_len, torch.device(device), causal, window)
        mask_mod = visibility(_offset(q_len, k_len, device), causal, window=window)
        assert_same_block_mask(ours, create_block_mask(mask_mod, None, None, q_len, k_len, device=device))

    check()


@pytest.mark.parametrize("device", DEVICES)
def test_a_block_mask_per_head_is_torchs_own_tensor_for_tensor(device):
    """One band per head (each head's reach, alibi_ref.reach, as benchmarks/flex_tuning.py's flex_reach builds
    it): flex._band_block_mask with a bound per head equals create_block_mask over the heads."""
    from torch.nn.attention.flex_attention import create_block_mask

    from alibi_ref.flex import _band_block_mask

    @settings(max_examples=20)
    @given(st.integers(1, 600), st.integers(1, 600), st.lists(st.integers(0, 700), min_size=1, max_size=4),
           st.booleans())
    @example(256, 256, [127, 0, 300], False)  # tiles exactly at a head's edge
    def check(q_len, k_len, reach, causal):
        offset, limit = k_len - q_len, torch.tensor(reach, device=device)

        def near(b, h, q_idx, kv_idx):
            behind = q_idx + offset - kv_idx
            seen = (behind <= limit[h]) & (behind >= -limit[h])
            return seen & (behind >= 0) if causal else seen

        ours = _band_block_mask(q_len, k_len, torch.device(device), [0 if causal else -r for r in reach], reach, near)
        assert_same_block_mask(ours, create_block_mask(near, None, len(reach), q_len, k_len, device=device))

    check()


@pytest.mark.parametrize("device", DEVICES)
def test_a_padded_batchs_block_mask_skips_only_what_torchs_own_skips(device):
    """Each batch row's own block mask (padding, positions: flex._rows_block_mask), built from each tile's least
    and greatest positions among the keys that exist. Its full tiles are those of torch's create_block_mask from
    the same mask_mod, and it computes every tile torch computes. With contiguous positions (left padding, BLOOM's
    positions from the mask) it is torch's own, tensor for tensor; scattered positions or keys may leave a tile
    no visible pair within its range, computed and masked where torch skips it, the same output."""
    from torch.nn.attention.flex_attention import create_block_mask

    from alibi_ref.flex import _offset, _rows_block_mask, visibility

    @settings(max_examples=40)
    @given(st.integers(1, 3), st.integers(1, 400), st.integers(1, 400), st.booleans(),
           st.one_of(st.none(), st.tuples(reaches, reaches)), st.sampled_from(["none", "bloom", "scattered"]),
           st.lists(st.integers(0, 400), min_size=3, max_size=3), st.integers(0, 2**31 - 1))
    @example(2, 256, 256, True, None, "none", [0, 200, 0], 0)  # a row's keys start past its first tiles: empty ones
    @example(1, 129, 256, True, None, "none", [0, 0, 0], 0)  # a tile's nearest key at the band's edge: full
    @example(1, 129, 300, False, (5, 0), "bloom", [44, 0, 0], 0)  # a tile at a window's edge, a last block not whole
    def check(batch, q_len, k_len, causal, window, positions, starts, seed):
        if positions == "bloom" and q_len > k_len:
            positions = "none"
        g = torch.Generator().manual_seed(seed)
        if positions == "scattered":  # packed sequences, caches with gaps: positions rising by 1-40, keys anywhere
            exists = torch.rand(batch, k_len, generator=g) < 0.8
            k_pos = torch.randint(1, 40, (batch, k_len), generator=g).cumsum(-1)
            q_pos = torch.randint(1, 40, (batch, q_len), generator=g).cumsum(-1) + k_pos[:, -1:] // 2
        else:
            starts = torch.tensor(starts[:batch]).clamp(max=k_len)
            exists = torch.arange(k_len)[None] >= starts[:, None]  # left padding, (B, j)
            k_pos = (exists.cumsum(-1) - 1).clamp(min=0)  # BLOOM: attention_mask.cumsum(-1) - 1
            q_pos = k_pos[:, k_len - q_len:]
        rows = None if positions == "none" else (q_pos.to(device, torch.int32), k_pos.to(device, torch.int32))
        exists = exists.to(device)
        mask_mod = visibility(_offset(q_len, k_len, device), causal, rows, exists, window)
        ours = _rows_block_mask(q_len, k_len, torch.device(device), causal, window, rows, exists, mask_mod)
        theirs = create_block_mask(mask_mod, batch, None, q_len, k_len, device=device)
        if positions != "scattered":
            assert_same_block_mask(ours, theirs)
            return
        (our_partial, our_full), (their_partial, their_full) = dense_tiles(ours), dense_tiles(theirs)
        assert torch.equal(our_full, their_full)
        assert not (their_partial & ~our_partial).any(), "a tile torch computes is skipped"

    check()


def dense_tiles(block_mask):
    """(partial, full): which tiles a BlockMask computes with the mask_mod and without, (B, H, q_blocks, k_blocks)."""
    def dense(counts, indices):
        seen = torch.arange(indices.shape[-1], device=indices.device) < counts[..., None]
        return torch.zeros(indices.shape, dtype=torch.bool, device=indices.device).scatter_(-1, indices.long(), seen)

    return (dense(block_mask.kv_num_blocks, block_mask.kv_indices),
            dense(block_mask.full_kv_num_blocks, block_mask.full_kv_indices))


def assert_same_block_mask(ours, theirs):
    assert ours.seq_lengths == theirs.seq_lengths and ours.BLOCK_SIZE == theirs.BLOCK_SIZE
    for field in BLOCK_MASK_FIELDS:
        torch.testing.assert_close(getattr(ours, field), getattr(theirs, field), rtol=0, atol=0, msg=field)


@pytest.mark.parametrize(("dtype", "tol", "grad_tol"), FLEX_TOLERANCES, ids=["float32", "bfloat16"])
@pytest.mark.parametrize(("causal", "q_len"), [(True, 128), (False, 128), (True, 1)])
def test_flex_equals_naive_forward_and_backward(device, causal, q_len, dtype, tol, grad_tol):
    """The CUDA default path. torch.compile runs the same code on the CPU, forward only (torch 2.13
    has no FlexAttention backward on the CPU), so the CPU checks the forward and CUDA both."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, q_len, 16, generator=gen, dtype=torch.float64)
    k, v = torch.randn(2, 2, 2, 128, 16, generator=gen, dtype=torch.float64)  # GQA: 4 query heads on 2 KV heads
    slopes = torch.tensor(get_slopes(4))
    backward = device.type == "cuda"
    leaves = [x.to(device=device, dtype=dtype).requires_grad_(backward) for x in (q, k, v)]
    reference = [x.detach().to(device, torch.float64).requires_grad_(backward) for x in leaves]
    out = alibi_attention(*leaves, slopes.to(device), causal=causal, impl="flex")
    expected = alibi_attention(*reference, slopes.to(device), causal=causal, impl="naive")
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=tol)
    if not backward:
        return
    grad = torch.randn_like(expected)
    ours_all = torch.autograd.grad(out, leaves, grad.to(dtype))
    for ours, theirs in zip(ours_all, torch.autograd.grad(expected, reference, grad), strict=True):
        torch.testing.assert_close(ours.double(), theirs, rtol=1e-4, atol=grad_tol)


@pytest.mark.parametrize(("d", "d_v"), [(8, 16), (16, 8), (40, 24)])
def test_flex_with_narrow_heads_equals_naive(device, d, d_v):
    """Head sizes under CPU_FLEX_MIN_HEAD_DIM run the CPU's FlexAttention on zero-padded heads (torch 2.13's kernel
    gave wrong rows for 8 and 16 on an AVX2 machine), and under TRITON_MIN_HEAD_DIM CUDA's (torch's compiler refuses
    them): the output keeps v's own width and equals the naive path, for lengths around the kernel's blocks and a
    narrower or wider v than q."""
    gen = torch.Generator().manual_seed(3)
    slopes = torch.tensor(get_slopes(4))
    for n, causal in [(40, True), (72, False), (136, True)]:
        q, k = (torch.randn(2, 4, n, d, generator=gen, dtype=torch.float64) for _ in range(2))
        v = torch.randn(2, 4, n, d_v, generator=gen, dtype=torch.float64)
        out = alibi_attention(*(x.to(device, torch.float32) for x in (q, k, v)), slopes.to(device), causal=causal,
                              impl="flex")
        assert out.shape == (2, 4, n, d_v)
        expected = alibi_attention(q, k, v, slopes, causal=causal, impl="naive")
        torch.testing.assert_close(out.double().cpu(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("causal", "q_len"), [(False, 64), (True, 256), (True, 64)])
def test_flex_inside_a_model_compiled_whole_equals_naive(device, causal, q_len):
    """A model compiled whole traces alibi_attention: the kernel's offset was a tensor made inside the graph,
    which CPU's flex kernel cannot read (InductorError: NoValidChoicesError, every call). Static shapes: with
    lengths traced as symbols the CPU's flex kernel fails on the offset too (LoweringException), and causal
    with fewer queries than keys fails on the CPU in torch 2.13's C++ code for the traced block mask."""
    if device.type == "cpu" and causal and q_len < 256:
        pytest.skip("torch 2.13's CPU compiler fails on the traced causal block mask with an offset (VecMask types)")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, q_len, 32, generator=gen).to(device)
    k, v = torch.randn(2, 1, 8, 256, 32, generator=gen).to(device)
    slopes = torch.tensor(get_slopes(8), dtype=torch.float32, device=device)

    def model(q, k, v, slopes):
        return alibi_attention(q, k, v, slopes, causal=causal, impl="flex")

    out = torch.compile(model, fullgraph=True, dynamic=False)(q, k, v, slopes)
    expected = alibi_attention(q.double(), k.double(), v.double(), slopes, causal=causal, impl="naive")
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)

@pytest.mark.parametrize(("q_len", "causal"), [(1, True), (FEW_QUERIES, False)], ids=["decoding", "a few queries"])
def test_a_growing_cache_compiles_flex_once(device, q_len, causal):
    """A decoding loop (one query against a cache one key longer each step) meets a new length at every step.
    FlexAttention compiled again at each (seconds each, and from the ninth length on torch gave up and ran it
    uncompiled, the scores materialised). Now the keys' length is a symbol in a decoding step (up to
    FEW_QUERIES queries, no block mask): no step after the first compiles."""
    from torch._dynamo.utils import counters

    gen = torch.Generator().manual_seed(0)
    k, v = (torch.randn(1, 8, 320, 32, generator=gen).to(device) for _ in range(2))  # (B, H, j, d): the cache
    slopes = torch.tensor(get_slopes(8), dtype=torch.float32, device=device)
    torch._dynamo.reset()
    counters.clear()
    for step, k_len in enumerate(range(300, 312)):
        if step == 1:
            compiled = dict(counters["frames"])
        q = torch.randn(1, 8, q_len, 32, generator=gen).to(device)
        out = alibi_attention(q, k[..., :k_len, :], v[..., :k_len, :], slopes, causal=causal, impl="flex")
        expected = alibi_attention(q.double(), k[..., :k_len, :].double(), v[..., :k_len, :].double(), slopes,
                                   causal=causal, impl="naive")
        torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)
    assert dict(counters["frames"]) == compiled, "a step after the first compiled again"


def test_flex_compiles_for_each_key_length_outside_decoding(device):
    """Outside decoding the key length stays a number of the compiled kernel: compiled for a symbolic length,
    FlexAttention took 2.4x plain SDPA on an H100 against 1.4x (N = 16384, bf16, symmetric: docs/performance.md,
    "CUDA").
    So a second key length compiles anew, and both give naive's output (64 queries: prefilling in chunks)."""
    from torch._dynamo.utils import counters

    gen = torch.Generator().manual_seed(1)
    slopes = torch.tensor(get_slopes(8), dtype=torch.float32, device=device)
    torch._dynamo.reset()
    counters.clear()
    frames = []
    q = torch.randn(1, 8, 64, 32, generator=gen).to(device)
    for n in (300, 301):
        k, v = (torch.randn(1, 8, n, 32, generator=gen).to(device) for _ in range(2))
        out = alibi_attention(q, k, v, slopes, impl="flex")
        expected = alibi_attention(q.double(), k.double(), v.double(), slopes, impl="naive")
        torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)
        frames.append(counters["frames"]["ok"])
    assert frames[1] > frames[0], "the second length ran the kernel compiled for the first, its length a symbol"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU on this machine")
def test_auto_uses_flex_on_cuda_for_long_sequences_and_the_bias_for_decoding():
    for n, expected in [(FLEX_MIN_KEYS, "flex"), (FLEX_MIN_KEYS - 1, "sdpa")]:
        q = torch.zeros(1, 8, n, 16, device="cuda")
        assert choose_impl("auto", q, Dims(8, 8, n, n, 16), False) == expected
    # a decoding step reads a few rows of bias faster than FlexAttention runs (docs/performance.md, "CUDA")
    for q_len, expected in [(1, "sdpa"), (FEW_QUERIES, "sdpa"), (FEW_QUERIES + 1, "flex")]:
        q = torch.zeros(1, 8, q_len, 16, device="cuda")
        assert choose_impl("auto", q, Dims(8, 8, q_len, 4096, 16), False, causal=True) == expected


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU on this machine")
@pytest.mark.parametrize("causal", [False, True])
def test_the_flex_path_never_waits_for_the_gpu(causal):
    """A model queues its kernels ahead of the GPU; a call that copies a number from the host and
    waits (as the kernel's offset once did) stalls that queue at every layer. Once warm (compiled,
    block mask built), the CUDA default path must queue its work without one synchronisation."""
    q, k, v = (torch.randn(1, 8, FLEX_MIN_KEYS, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    slopes = torch.tensor(get_slopes(8), device="cuda")
    alibi_attention(q, k, v, slopes, causal=causal, impl="flex")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = alibi_attention(q, k, v, slopes, causal=causal, impl="flex")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.shape == q.shape


# ----------------------------------------------------------------------------- subnormal floats

_SUBNORMAL_PROBE = textwrap.dedent("""
    import json, torch
    from alibi_ref import flush_denormals
    from alibi_ref.denormals import subnormals_flushed

    def subnormals():  # a multiplication large enough to run on every OpenMP thread
        return int((torch.full((1 << 22,), 1e-30) * 1e-10 != 0).sum())

    before, seen_before = subnormals(), subnormals_flushed()
    flushed = flush_denormals()
    print(json.dumps({"threads": torch.get_num_threads(), "before": before, "after": subnormals(),
                      "flushed": flushed, "seen": [seen_before, subnormals_flushed()]}))
""")


def test_flush_denormals_reaches_every_thread():
    every_thread = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the suite's one (conftest.py)
    done = subprocess.run([sys.executable, "-c", _SUBNORMAL_PROBE], capture_output=True, text=True, check=False,
                          env=every_thread)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["flushed"] and result["before"] == 1 << 22, result  # 1e-40 is subnormal: kept before
    assert result["after"] == 0, f"{result['after']} subnormal results survived on some thread: {result}"
    assert result["seen"] == [False, True], result  # subnormals_flushed() tells the two states apart
