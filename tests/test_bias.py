import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from alibi_ref import alibi_bias, get_slopes, key_only_bias

slope_vectors = arrays(np.float64, st.integers(1, 6), elements=st.floats(0.0, 2.0))
lengths = st.integers(1, 24)


def test_chapter_bias_matrix_for_slope_one_half():
    # the chapter's 5x5 penalty matrix for m = 0.5
    expected = -0.5 * np.array([
        [0, 1, 2, 3, 4], [1, 0, 1, 2, 3], [2, 1, 0, 1, 2], [3, 2, 1, 0, 1], [4, 3, 2, 1, 0],
    ])
    bias = alibi_bias([0.5, 0.25], 5)
    assert bias.shape == (2, 5, 5) and bias.dtype == np.float64
    np.testing.assert_array_equal(bias[0], expected)
    np.testing.assert_array_equal(bias[1], expected / 2)
    assert not np.signbit(bias[0].diagonal()).any(), "the diagonal should be +0.0, not -0.0"


def test_causal_bias_is_minus_inf_exactly_above_the_diagonal():
    bias = alibi_bias([0.5], 4, causal=True)[0]
    assert np.isneginf(bias[np.triu_indices(4, 1)]).all()
    np.testing.assert_array_equal(bias[np.tril_indices(4)], alibi_bias([0.5], 4)[0][np.tril_indices(4)])


def test_decode_step_query_is_the_last_position():
    # one new query against 7 cached keys: it is position 6, so key 6 is at distance 0
    row = alibi_bias([1.0], 1, 7, causal=True)[0, 0]
    np.testing.assert_array_equal(row, [-6, -5, -4, -3, -2, -1, 0])


@given(slope_vectors, lengths, lengths)
def test_bias_depends_on_distance_only(slopes, q_len, k_len):
    bias = alibi_bias(slopes, q_len, k_len)
    i = np.arange(q_len)[:, None] + (k_len - q_len)
    j = np.arange(k_len)[None, :]
    np.testing.assert_array_equal(bias, -slopes[:, None, None] * np.abs(i - j))
    # Toeplitz: one step down and one step right is the same distance
    np.testing.assert_array_equal(bias[:, 1:, 1:], bias[:, :-1, :-1])


@given(slope_vectors, st.integers(1, 20), st.integers(0, 20), st.booleans())
def test_shorter_query_block_is_the_bottom_right_corner(slopes, q_len, extra, causal):
    k_len = q_len + extra
    full = alibi_bias(slopes, k_len, k_len, causal=causal)
    np.testing.assert_array_equal(alibi_bias(slopes, q_len, k_len, causal=causal), full[:, k_len - q_len:, :])


@given(slope_vectors, lengths)
def test_key_only_form_differs_by_a_constant_per_row(slopes, n):
    relative, key_only = alibi_bias(slopes, n, causal=True), key_only_bias(slopes, n)
    allowed = np.isfinite(relative)
    np.testing.assert_array_equal(allowed, np.isfinite(key_only))
    # key-only - relative = m_h * i on every allowed entry of row i
    diff = np.where(allowed, key_only - np.where(allowed, relative, 0), 0)
    expected = slopes[:, None, None] * np.arange(n)[None, :, None] * allowed
    np.testing.assert_allclose(diff, expected, rtol=1e-12, atol=1e-12)


def test_torch_in_gives_torch_out_on_its_device_and_dtype(device):
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        slopes = torch.tensor(get_slopes(12), dtype=dtype, device=device)
        bias = alibi_bias(slopes, 5, 9, causal=True)
        assert isinstance(bias, torch.Tensor) and bias.dtype == dtype and bias.device.type == device.type
        assert bias.shape == (12, 5, 9)
        expected = alibi_bias(slopes.double().cpu().numpy(), 5, 9, causal=True)
        torch.testing.assert_close(bias.double().cpu(), torch.from_numpy(expected), rtol=1e-2, atol=0)


def test_list_and_float32_inputs():
    assert alibi_bias([1, 2], 3).dtype == np.float64
    assert alibi_bias(np.array([0.5], dtype=np.float32), 3).dtype == np.float32


def test_bias_is_built_before_the_cast_at_long_lengths():
    # at distance 1 the bias of head 1 must be exactly -m, even when far down a 4096 matrix
    slopes = torch.tensor(get_slopes(8), dtype=torch.bfloat16)
    bias = alibi_bias(slopes, 4, 4096)
    assert bias[0, -1, -2].item() == -0.5 and bias[0, -1, -1].item() == 0.0


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    (([0.5], 0), {}, "q_len must be a whole number >= 1, got 0"),
    (([0.5], 3, 2.0), {}, "k_len must be a whole number >= 1, got 2.0"),
    (([0.5], 5, 3), {"causal": True}, "causal attention needs q_len <= k_len"),
    (([[0.5]], 3), {}, r"slopes must have shape \(H,\)"),
    (([], 3), {}, r"slopes must have shape \(H,\) with H >= 1"),
    ((["a"], 3), {}, "slopes must be real numbers"),
])
def test_bad_input_says_what_was_expected(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        alibi_bias(*args, **kwargs)
