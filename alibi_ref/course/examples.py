"""The chapter's shared example: "The cat sat on mat", d_model = 4, two heads of d_k = 2."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Example(NamedTuple):
    tokens: list[str]
    Q: np.ndarray  # (5, 4)
    K: np.ndarray  # (5, 4)
    V: np.ndarray  # (5, 4)


def cat_sat_on_mat() -> Example:
    """Fresh copies every call, so a caller that edits them changes nothing for anyone else."""
    tokens = ["The", "cat", "sat", "on", "mat"]
    Q = np.array([
        [1.0, 0.0, 1.0, 0.0],  # The
        [0.0, 2.0, 0.0, 1.0],  # cat
        [1.0, 1.0, 1.0, 0.0],  # sat
        [0.0, 0.0, 1.0, 1.0],  # on
        [1.0, 0.0, 0.0, 1.0],  # mat
    ])
    K = np.array([
        [0.0, 1.0, 0.0, 1.0],  # The
        [1.0, 0.0, 1.0, 0.0],  # cat
        [1.0, 1.0, 0.0, 0.0],  # sat
        [0.0, 0.0, 1.0, 1.0],  # on
        [1.0, 0.0, 0.5, 0.5],  # mat
    ])
    V = np.array([
        [1.0, 0.0, 0.0, 0.0],  # The
        [0.0, 1.0, 0.0, 0.0],  # cat
        [0.0, 0.0, 1.0, 0.0],  # sat
        [0.0, 0.0, 0.0, 1.0],  # on
        [0.5, 0.5, 0.5, 0.5],  # mat
    ])
    return Example(tokens, Q, K, V)
