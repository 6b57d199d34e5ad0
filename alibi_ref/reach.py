"""How far each head looks: the distance beyond which ALiBi leaves a key less weight than float32 can hold.

ALiBi takes m_h d from the logit of a key d positions away, so a steep head's far keys get weights
like e^(-m d): at m = 1/2 a key 200 positions away gets e^-100, zero beside the row's best key. A
kernel still computes them, and on an x86 CPU it computes them slowly, since e^-100 is a subnormal
float32 (``alibi_ref.denormals``). How far is far enough to skip, whatever q and k hold:

A query i sees its own position i' (distance 0, no bias) whenever q_len <= k_len, so its best logit is
at least scale q_i . k_i' >= -scale |q_i| |k_i'|. A key d positions away scores at most
scale |q_i| |k_j| - m d. With Q = max_i |q_i| and K = max_j |k_j| over the head (every batch row),
that key's softmax weight is at most

    p_ij <= exp(2 scale Q K - m d)

and the keys beyond a distance D hold together at most N exp(2 scale Q K - m D) of the row's weight
(N keys). Taking

    D = (2 scale Q K + ln N + ln(8 / eps)) / m,        eps: float32's, or the inputs' if finer,

leaves them at most eps / 8 of it: dropping them moves the output by at most eps / 4 max |v|, under
the float32 rounding of the output itself. The bound holds for any q and k (Cauchy-Schwarz), so a
head whose queries and keys are long gets a long reach, or none.

Worked example: H = 8 (slopes 1/2 .. 1/256), d = 64, unit-variance q and k, N = 8192. The longest
q and k are about 11 long, so scale Q K is about 11 * 11 / 8 = 15 and D about (30 + 9 + 18) / m:
about 115 keys for m = 1/2, then 230, 450, 900, 1800, 3600, ... (each head's own longest q and k
set its figure): the first five or six heads each see a window of 2 D + 1 keys instead of 8192.

``strided_alibi_attention`` runs those heads as a sliding window (its ``window`` path), each alone,
and the rest together as before, where that measured faster (``MIN_KEYS``, ``SHOWN_AT_MOST``): from
4096 keys (2048 without a causal mask) for a head whose window halves its work; or, where subnormal
floats are computed rather than flushed, from 1024 keys for such a head and for any head whose bias
falls below -87.3 within the keys (e^-87.3 is float32's smallest normal number), whose far keys' terms
would be subnormal. In float32 and float64, and in bfloat16 without a causal mask (a causal 16-bit call
runs as one kernel call, which the windowed heads' calls were slower than). Not where the slopes are
learned (the bound would have to hold for their gradient too), with dropout, or under torch.compile
(the bound reads the values).
"""

from __future__ import annotations

import math

import torch

from ._backend import grad_taken
from .denormals import subnormals_flushed

# Where the reach is taken, with subnormal floats flushed to zero ("flushed") and computed ("kept"): from
# MIN_KEYS keys (per state and mask), for the heads whose kernel calls are shown at most SHOWN_AT_MOST of
# all keys (each call: its WINDOW_ROWS reversed query rows and the window's width),
# where the window at least halves a head's work; and, with subnormals kept, for the heads whose bias
# falls below -SUBNORMAL_LOGIT within the keys: e^-87.3 is float32's smallest normal number, so their far
# keys' terms would be subnormal, which the window spares (figures: docs/performance.md, "Each head's reach")
MIN_KEYS = {("flushed", "causal"): 4096, ("flushed", "symmetric"): 2048,
            ("kept", "causal"): 1024, ("kept", "symmetric"): 1024}
SHOWN_AT_MOST = 0.5
# reversed query rows per strided kernel call under a window: each call is shown only the keys its rows' windows
# reach, block + left + right keys, of which a row sees left + right + 1 (docs/performance.md: windows)
WINDOW_ROWS = 256
SUBNORMAL_LOGIT = -math.log(torch.finfo(torch.float32).tiny)


def head_reach(q, k, slopes, scale: float, groups: int, longest=None) -> list[int | None]:
    """Per KV head, the distance D beyond which every key together holds at most eps / 8 of a row's
    weight (module docstring); None where the slope does not make the weights fall (m <= 0).

    q (B, H, i, d), k (B, H_kv, j, d); query heads h of KV head u: u * groups .. (u + 1) * groups - 1,
    which share one reach (the widest of theirs). ``longest``: a function giving each head's longest row
    (``longest_rows``, or the fused kernel's own)."""
    longest = longest or longest_rows
    n_keys = k.shape[-2]
    eps = min(torch.finfo(torch.float32).eps, torch.finfo(q.dtype).eps)
    q_longest = longest(q).view(-1, groups).amax(-1)  # (H_kv,)
    k_longest = longest(k)  # (H_kv,)
    reach = []
    for m, q_max, k_max in zip(_flattest(slopes, groups), q_longest.tolist(), k_longest.tolist(), strict=True):
        if not m > 0:
            reach.append(None)
            continue
        logits = 2 * abs(scale) * q_max * k_max + math.log(n_keys) + math.log(8 / eps)
        reach.append(math.ceil(logits / m) if math.isfinite(logits) else None)
    return reach


def longest_rows(x):
    """(H,): each head's longest row of x (B, H, n, d), max over b and i of |x_bhi|."""
    return x.detach().float().norm(dim=-1).amax(dim=(0, 2))


def _flattest(slopes, groups: int) -> list[float]:
    """Per KV head, the flattest slope of its query heads: the one that reaches furthest."""
    return slopes.detach().float().view(-1, groups).amin(-1).tolist()


def reach_windows(q, k, slopes, scale: float, causal: bool, groups: int, window) -> list | None:
    """Per KV head, the window (left, right) its reach narrows ``window`` to, or None for a head that runs
    with ``window`` as it is; None for the whole call where the reach does not pay or does not apply."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    # bfloat16 symmetric only: causal 16-bit calls run as one kernel call (strided.last_row_fits), which the
    # windowed heads' calls were slower than (docs/performance.md, "Each head's reach")
    measured = q.dtype in (torch.float32, torch.float64) or (q.dtype == torch.bfloat16 and not causal)
    if (k_len < min(MIN_KEYS.values()) or q_len > k_len or q.device.type != "cpu" or not measured
            or torch.compiler.is_compiling() or grad_taken(slopes)):
        return None
    subnormals = "flushed" if subnormals_flushed() else "kept"
    if k_len < MIN_KEYS[subnormals, "causal" if causal else "symmetric"]:
        return None
    left, right = window or (None, None)
    windows = []
    for reach, m in zip(head_reach(q, k, slopes, scale, groups), _flattest(slopes, groups), strict=True):
        if reach is None:
            windows.append(None)
            continue
        hides_a_key = reach < k_len - 1  # a window hides no key where no distance exceeds it
        narrows = hides_a_key and (left is None or reach < left or (not causal and (right is None or reach < right)))
        narrowed = (reach if left is None else min(left, reach),
                    0 if causal else reach if right is None else min(right, reach))
        halves_the_work = WINDOW_ROWS + narrowed[0] + narrowed[1] <= SHOWN_AT_MOST * k_len  # keys a call is shown
        spares_subnormals = subnormals == "kept" and m * (k_len - 1) > SUBNORMAL_LOGIT
        windows.append(narrowed if narrows and (halves_the_work or spares_subnormals) else None)
    return windows if any(w is not None for w in windows) else None
