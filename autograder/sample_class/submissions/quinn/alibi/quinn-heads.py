import numpy as np


def head(X, n_heads, h):
    d = X.shape[1] // n_heads
    return X[:, h * d:(h + 1) * d]
