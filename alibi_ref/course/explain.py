"""The chapter's per-query trace: every number between a query's scores and its output."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..bias import alibi_bias
from ..slopes import get_slopes
from .chapter import multi_head_alibi


@dataclass(frozen=True)
class HeadTrace:
    head: int  # 1-based, as in the chapter
    slope: float
    scaled: np.ndarray  # q_i . k_j / sqrt(d_k), per key j
    penalty: np.ndarray  # -m_h * |i - j|
    alibi: np.ndarray  # scaled + penalty: what enters the softmax
    weights: np.ndarray  # the softmax row
    output: np.ndarray  # this head's d_k output columns


@dataclass(frozen=True)
class Trace:
    tokens: list[str]
    query: int
    heads: list[HeadTrace]

    def __str__(self) -> str:
        width = max(6, *(len(t) for t in self.tokens))
        lines = [f"=== ALiBi trace for {self.tokens[self.query]!r} (row {self.query}) ==="]
        for h in self.heads:
            lines += [
                f"--- Head {h.head} (slope m = {h.slope:g}) ---",
                f"{'key':<{width}}  {'score':>8}  {'penalty':>8}  {'alibi':>8}  {'weight':>8}",
            ]
            for j, tok in enumerate(self.tokens):
                row = (h.scaled[j], h.penalty[j], h.alibi[j], h.weights[j])
                lines.append(f"{tok:<{width}}  " + "  ".join(f"{x:8.4f}" for x in row))
            lines.append("output = [" + ", ".join(f"{x:.4f}" for x in h.output) + "]")
        return "\n".join(lines)


def _attend(Q, K, V, n_heads, slopes, device):
    if device is None:
        return multi_head_alibi(Q, K, V, n_heads, slopes)
    import torch

    Q, K, V = (torch.as_tensor(x, device=device) for x in (Q, K, V))
    return tuple(x.cpu().numpy() for x in multi_head_alibi(Q, K, V, n_heads, slopes))


def explain(Q, K, V, tokens, query=0, *, n_heads: int = 2, slopes=None, device=None) -> Trace:
    """Trace query ``query`` (a row index or a token) through every head, as the chapter does.

    Q, K, V are (N, d_model) with the chapter's column split; slopes default to 1/2^h.
    With a torch ``device`` the attention itself runs there; the trace holds NumPy arrays.
    """
    Q, K, V = (np.asarray(x, dtype=np.float64) for x in (Q, K, V))
    tokens = list(tokens)
    if len(tokens) != Q.shape[0]:
        raise ValueError(f"need one token per row of Q: {Q.shape[0]} rows, got {len(tokens)} tokens")
    if isinstance(query, str):
        if query not in tokens:
            raise ValueError(f"unknown token {query!r}; expected one of {tokens}")
        query = tokens.index(query)
    if not -len(tokens) <= query < len(tokens):
        raise ValueError(f"query row must be in 0..{len(tokens) - 1}, got {query}")
    query %= len(tokens)
    slopes = get_slopes(n_heads, "textbook") if slopes is None else np.asarray(slopes, dtype=np.float64)

    output, weights = _attend(Q, K, V, n_heads, slopes, device)  # (N, d_model), (H, N, N)
    penalty = alibi_bias(slopes, len(tokens))[:, query]  # (H, N)
    d_k, d_v = Q.shape[1] // n_heads, V.shape[1] // n_heads
    heads = []
    for h in range(n_heads):
        cols = slice(h * d_k, (h + 1) * d_k)
        scaled = K[:, cols] @ Q[query, cols] / math.sqrt(d_k)
        heads.append(HeadTrace(
            head=h + 1, slope=float(slopes[h]), scaled=scaled, penalty=penalty[h],
            alibi=scaled + penalty[h], weights=weights[h, query],
            output=output[query, h * d_v:(h + 1) * d_v],
        ))
    return Trace(tokens, query, heads)
