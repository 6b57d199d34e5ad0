"""Per-head ALiBi slopes m_h.

Press, Smith & Lewis (ICLR 2022) give head h of H the slope m_h from a geometric
sequence that starts at 2^(-8/H) and has that same ratio:

    m_h = 2^(-8 h / H),  h = 1 .. H           (H a power of two)

Worked example, H = 8:  1/2, 1/4, 1/8, ..., 1/256.

For an H that is not a power of two the official code (and with it BLOOM, MPT,
labml, x-transformers and FlashAttention's helper) does not stretch the sequence;
it takes the set for p = 2^floor(log2 H) and then every other slope of the set
for 2p, which interleaves new slopes between the old ones:

    H = 12:  2^-1, 2^-2, ..., 2^-8,  2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5

The vector is not monotonic, on purpose: the first p heads are exactly those of a
p-head model. The paper's prose (one sequence from 2^(-8/H)) and attention-gym's
``exp2(-8 (h+1) / H)`` disagree with this for such H; we follow the code.

The chapter's worked example uses 1/2^h, h = 1 .. H ("textbook"), which equals
the paper's schedule only at H = 8 (at H = 2 the paper gives 1/16 and 1/256,
the chapter 1/2 and 1/4). "linear" and "constant" are the chapter's Exercise 4.
"""

from __future__ import annotations

import numbers

import numpy as np

SCHEDULES = ("paper", "textbook", "linear", "constant")


def _geometric(n: int, max_bias: float) -> np.ndarray:
    """2^(-max_bias * k / n) for k = 1..n: the paper's set for a power-of-two n."""
    k = np.arange(1, n + 1, dtype=np.float64)
    return 2.0 ** (-max_bias * k / n)


def _paper(n_heads: int, max_bias: float) -> np.ndarray:
    # p = 2^floor(log2 n), computed exactly on integers
    p = 1 << (n_heads.bit_length() - 1)
    if p == n_heads:
        return _geometric(n_heads, max_bias)
    # the p-set, then every other slope of the 2p-set (its odd powers of 2^(-max_bias/2p))
    extra = _geometric(2 * p, max_bias)[0::2][: n_heads - p]
    return np.concatenate([_geometric(p, max_bias), extra])


def get_slopes(
    n_heads: int,
    schedule: str = "paper",
    *,
    max_bias: float = 8.0,
    constant: float = 0.25,
) -> np.ndarray:
    """Slopes m_h for ``n_heads`` heads as a float64 array of shape (n_heads,).

    schedule:
      "paper"    the official recursion above; ``max_bias`` replaces the 8
                 (MPT's ``alibi_bias_max``; 8 gives the official set).
      "textbook" 1/2^h, h = 1..H: the chapter's worked example (= "paper" only at H = 8).
      "linear"   (H - h + 1) / H, h = 1..H: Exercise 4(a).
      "constant" ``constant`` (0.25) for every head: Exercise 4(b).

    >>> get_slopes(8)
    array([0.5       , 0.25      , 0.125     , 0.0625    , 0.03125   ,
           0.015625  , 0.0078125 , 0.00390625])
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, numbers.Integral) or n_heads < 1:
        raise ValueError(f"n_heads must be a whole number >= 1, got {n_heads!r}")
    n_heads = int(n_heads)
    if schedule == "paper":
        if not np.isfinite(max_bias) or max_bias <= 0:
            raise ValueError(f"max_bias must be a finite number > 0, got {max_bias!r}")
        return _paper(n_heads, float(max_bias))
    if schedule == "textbook":
        return 2.0 ** -np.arange(1, n_heads + 1, dtype=np.float64)
    if schedule == "linear":
        h = np.arange(1, n_heads + 1, dtype=np.float64)
        return (n_heads - h + 1) / n_heads
    if schedule == "constant":
        if not np.isfinite(constant) or constant < 0:
            raise ValueError(f"constant must be a finite number >= 0, got {constant!r}")
        return np.full(n_heads, float(constant))
    raise ValueError(f"unknown schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")
