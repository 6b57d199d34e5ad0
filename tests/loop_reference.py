"""ALiBi attention written with plain Python loops and the math module.

Shares no code with alibi_ref, so a mistake in a vectorised helper there cannot
hide in both. Slow: only for small shapes.
"""

import math


def loop_alibi_attention(q, k, v, slopes, causal=False):
    """q (H, n_q, d), k and v (H_kv, n_k, d) as nested lists or arrays; returns (H, n_q, d_v) lists."""
    H, n_q, d = len(q), len(q[0]), len(q[0][0])
    H_kv, n_k = len(k), len(k[0])
    out = []
    for h in range(H):
        kv = h // (H // H_kv)
        rows = []
        for i in range(n_q):
            pos = i + n_k - n_q  # the query's own position among the keys
            scores = []
            for j in range(n_k):
                if causal and j > pos:
                    scores.append(-math.inf)
                    continue
                dot = sum(float(q[h][i][c]) * float(k[kv][j][c]) for c in range(d))
                scores.append(dot / math.sqrt(d) - float(slopes[h]) * abs(pos - j))
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            rows.append([
                sum(weights[j] / total * float(v[kv][j][c]) for j in range(n_k)) for c in range(len(v[0][0]))
            ])
        out.append(rows)
    return out
