import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from alibi_ref import SCHEDULES, get_slopes

# Literal vectors: the official code's recursion, written out by hand.
PAPER = {
    8: [2.0**-k for k in range(1, 9)],
    # 12 is not a power of two: the 8-set, then every other slope of the 16-set
    12: [2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5],
    # 6: the 4-set (2^-2, 2^-4, 2^-6, 2^-8), then 2^-1 and 2^-3 from the 8-set
    6: [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3],
    1: [2.0**-8],
    2: [2.0**-4, 2.0**-8],
}


@pytest.mark.parametrize("n_heads", sorted(PAPER))
def test_paper_slopes_are_the_official_sets(n_heads):
    slopes = get_slopes(n_heads)
    assert slopes.dtype == np.float64 and slopes.shape == (n_heads,)
    np.testing.assert_allclose(slopes, PAPER[n_heads], rtol=1e-15, atol=0)


def test_slopes_for_12_heads_are_not_monotonic_on_purpose():
    slopes = get_slopes(12)
    assert slopes[8] > slopes[0], "head 9 (2^-0.5) must be steeper than head 1 (2^-1)"


def test_textbook_is_one_over_two_to_the_h_and_equals_paper_only_at_8():
    np.testing.assert_array_equal(get_slopes(2, "textbook"), [0.5, 0.25])
    np.testing.assert_array_equal(get_slopes(5, "textbook"), [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32])
    np.testing.assert_allclose(get_slopes(8, "textbook"), get_slopes(8), rtol=1e-15)
    for n in (2, 4, 6, 12, 16):
        assert not np.allclose(get_slopes(n, "textbook"), get_slopes(n)), n


def test_exercise_4_schedules():
    np.testing.assert_allclose(get_slopes(2, "linear"), [1.0, 0.5], rtol=1e-15)
    np.testing.assert_allclose(get_slopes(4, "linear"), [1.0, 0.75, 0.5, 0.25], rtol=1e-15)
    np.testing.assert_array_equal(get_slopes(3, "constant"), [0.25, 0.25, 0.25])
    np.testing.assert_array_equal(get_slopes(2, "constant", constant=0.0), [0.0, 0.0])


def test_max_bias_replaces_the_eight():
    np.testing.assert_allclose(get_slopes(4, max_bias=4.0), [2**-1, 2**-2, 2**-3, 2**-4], rtol=1e-15)
    np.testing.assert_allclose(get_slopes(8, max_bias=8.0), get_slopes(8), rtol=0)


@given(st.integers(1, 300), st.floats(0.5, 16.0))
def test_paper_matches_mpt_formulation_for_any_head_count(n_heads, max_bias):
    # MPT: round up to N = 2^ceil(log2 n), slopes 2^(-max_bias k / N), odd-indexed then even-indexed
    N = 1 << (n_heads - 1).bit_length()
    m = 2.0 ** (-max_bias * np.arange(1, N + 1) / N)
    mpt = m if N == n_heads else np.concatenate([m[1::2], m[::2]])[:n_heads]
    np.testing.assert_allclose(get_slopes(n_heads, max_bias=max_bias), mpt, rtol=1e-13)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8", None])
def test_bad_head_count_is_refused(bad):
    with pytest.raises(ValueError, match="n_heads must be a whole number >= 1"):
        get_slopes(bad)


def test_unknown_schedule_names_the_valid_ones():
    with pytest.raises(ValueError) as err:
        get_slopes(8, "geometric")
    for name in SCHEDULES:
        assert name in str(err.value)


@pytest.mark.parametrize("kwargs", [{"max_bias": 0.0}, {"max_bias": float("nan")}, {"max_bias": -1.0}])
def test_bad_max_bias_is_refused(kwargs):
    with pytest.raises(ValueError, match="max_bias"):
        get_slopes(8, **kwargs)
