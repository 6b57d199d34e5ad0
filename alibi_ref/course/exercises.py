"""Every autograded exercise of the course: its cases, its reference, the classic mistakes it names.

Visible cases are the ones a student's test cell runs; hidden ones are drawn from a seed that
only the instructor's notebook holds and, when grading, the grader's secret. References and mistakes
run in the grader's process (and in a student's own session); a graded kernel never imports this
module. Tolerances are stated per case; ``judge.FLOAT32_SLACK`` comes on top unless a case is ``exact``.
"""

from __future__ import annotations

import numpy as np

from .. import alibi_attention, alibi_bias, get_slopes, key_only_bias
from .chapter import multi_head_alibi
from .examples import cat_sat_on_mat
from .harness import (
    NO_SLOPES_BUFFER,
    gradient_of_summed_output,
    jitted_with_static_length,
    module_facts,
    peak_and_output,
    score_mod_outputs,
)
from .judge import Expect, compare
from .model import Case, Exercise, Mistake, exercise
from .upstream import softmax
from .wire import Leaf

EXAMPLE = cat_sat_on_mat()
Q, K, V = EXAMPLE.Q, EXAMPLE.K, EXAMPLE.V


# ----------------------------------------------------------------------------- the mistakes, in one place

def variant_bias(slopes, q_len: int, k_len: int, causal: bool = False, *, sign=-1.0, align="end",
                 triangle="upper", key_only=False, signed=False):
    """The (H, q_len, k_len) bias with one classic mistake switched on; every flag at its default is ALiBi's."""
    slopes = np.asarray(slopes, dtype=np.float64)[:, None, None]  # (H, 1, 1)
    i = np.arange(q_len)[:, None] + (k_len - q_len if align == "end" else 0)  # the queries' positions
    j = np.arange(k_len)[None, :]
    bias = slopes * j + 0.0 * i if key_only else sign * slopes * ((i - j) if signed else np.abs(i - j))
    if causal:
        bias = np.where((j > i) if triangle == "upper" else (j < i), -np.inf, bias)
    return bias


def attention_variant(q, k, v, slopes, *, causal=False, scale=True, bias_scaled=False, axis=-1, bool_mask=False,
                      keep_mask=False, **bias_flags):
    """ALiBi attention with one classic mistake switched on: (output (..., H, i, d_v), weights (..., H, i, j)).

    q (..., H, i, d), k and v (..., H, j, d); every flag at its default is ALiBi's attention.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    root = np.sqrt(q.shape[-1])
    scores = q @ np.swapaxes(k, -1, -2) / (root if scale else 1.0)  # (..., H, i, j)
    bias = variant_bias(slopes, q.shape[-2], k.shape[-2], causal, **bias_flags)
    if bool_mask:  # nn.MultiheadAttention reads True as "may not attend": the bias as bool is True off the diagonal
        scores = np.where(bias != 0, -np.inf, scores)
    elif keep_mask:  # scaled_dot_product_attention reads True as "may attend": every key but the query's own
        scores = np.where(bias != 0, scores, -np.inf)
    else:
        scores = scores + (bias / root if bias_scaled else bias)
    weights = softmax(scores, axis=axis)
    return weights @ v, weights


ATTENTION_MISTAKES = {  # name -> (the hint a student reads, the flags of attention_variant / variant_bias that make it)
    "no_scale": ("the scores are not divided by sqrt(d) (the chapter's step 2)", {"scale": False}),
    "bias_scaled": ("the ALiBi bias is divided by sqrt(d) too: the bias goes in after the scaling, unscaled",
                    {"bias_scaled": True}),
    "sign": ("the bias has the wrong sign: it should penalise distance, -m * |i - j|", {"sign": 1.0}),
    "axis": ("softmax runs over the queries (axis -2): each query's weights over the keys (the last axis) should "
             "sum to 1", {"axis": -2}),
    "start": ("the queries sit at the start of the keys: with fewer queries than keys they are the last positions, "
              "i + (k_len - q_len)", {"align": "start"}),
    "triangle": ("the causal mask hides the wrong triangle: keys j > i are the future", {"triangle": "lower"}),
    "signed": ("the distance is signed, i - j: keys after the query then get a bonus that grows with distance; "
               "ALiBi penalises |i - j| both ways (causal rows cannot show it, the symmetric ones do)",
               {"signed": True}),
    "key_only": ("this is the key-only form +m * j: build the relative form -m * |i' - j| (section 7.1)",
                 {"key_only": True}),
    "sdpa_bool": ("the bias went in as a boolean mask (bias.bool()): scaled_dot_product_attention reads True as "
                  "'may attend', so every key but the query's own takes part, unpenalised, and the slopes are lost; "
                  "pass the float bias", {"keep_mask": True}),
}


def attention_mistakes(make, *names: str) -> tuple[Mistake, ...]:
    """The named classic mistakes, each computed by ``make(**flags)``: a function with the exercise's signature."""
    return tuple(Mistake(ATTENTION_MISTAKES[n][0], make(**ATTENTION_MISTAKES[n][1])) for n in names)


# ----------------------------------------------------------------------------- 01: slopes and the bias

def _paper_prose(n_heads, max_bias=8.0):
    return 2.0 ** (-max_bias * np.arange(1, n_heads + 1) / n_heads)


def _shifted(n_heads, max_bias=8.0):
    return get_slopes(n_heads, max_bias=max_bias) * 2.0 ** (max_bias / 2 ** int(np.floor(np.log2(n_heads))))


exercise(Exercise(
    "paper_slopes",
    visible=lambda: [*(Case(f"paper_slopes({n})", (n,), atol=1e-12) for n in (8, 2, 12)),
                     Case("paper_slopes(4, max_bias=4.0)", (4,), {"max_bias": 4.0}, atol=1e-12)],
    # max_bias drawn from a continuum: no table of the reference's slopes made before the check can hold it
    hidden=lambda rng: [Case(f"paper_slopes({n}, max_bias={mb})", (n,), {"max_bias": mb}, atol=1e-12, rtol=1e-10)
                        for n in (1, 3, 5, 6, 7, 10, 16, 24, 40, 64, 100)
                        for mb in (8.0, round(rng.uniform(2, 16), 4))],
    reference=lambda n, max_bias=8.0: get_slopes(n, max_bias=max_bias),
    mistakes=(
        Mistake("for a head count that is not a power of two this is one geometric sequence 2^(-8h/H); the official "
                "code takes the power of two below H, then every other slope of twice that (section 1.1)",
                _paper_prose),
        Mistake("the slopes are shifted by one head: h runs from 1 to H, so the first slope is 2^(-8/H), not 1",
                _shifted),
        Mistake("these are the chapter's 1/2^h, not the paper's schedule",
                lambda n, max_bias=8.0: 0.5 ** np.arange(1, n + 1)),
    ),
))

exercise(Exercise(
    "textbook_slopes",
    visible=lambda: [Case(f"textbook_slopes({n})", (n,), atol=1e-15) for n in (2, 8)],
    hidden=lambda rng: [Case(f"textbook_slopes({n})", (n,), atol=1e-15) for n in (1, 3, 12, int(rng.integers(20, 40)))],
    reference=lambda n: get_slopes(n, "textbook"),
    mistakes=(Mistake("the exponents start at 0: the chapter's first slope is 1/2^1", lambda n: 0.5 ** np.arange(n)),),
))


def _bias_variant(**flags):
    return lambda slopes, q_len, k_len=None, causal=False: variant_bias(slopes, q_len, k_len or q_len, causal, **flags)


def _bias_cases(rng):
    chosen = []
    for _ in range(12):
        H, q = int(rng.integers(1, 13)), int(rng.integers(1, 20))
        chosen.append((rng.uniform(0, 1, H), q, q + int(rng.integers(0, 20)), bool(rng.integers(0, 2))))
    chosen += [(get_slopes(12), 9, 9, False), (get_slopes(6), 1, 30, True)]
    return [Case(f"alibi_bias(<{len(s)} slopes>, {q}, {k}, causal={c})", (s, q, k), {"causal": c}, atol=1e-12)
            for s, q, k, c in chosen]



exercise(Exercise(
    "alibi_bias",
    visible=lambda: [
        Case("alibi_bias([0.5, 0.25], 5)", ([0.5, 0.25], 5), atol=1e-12),
        Case("alibi_bias([0.5], 4, causal=True)", ([0.5], 4), {"causal": True}, atol=1e-12),
        Case("alibi_bias([1.0], 1, 7): one decoding query against 7 keys", ([1.0], 1, 7), atol=1e-12),
        Case("alibi_bias([1.0], 2, 4, causal=True)", ([1.0], 2, 4), {"causal": True}, atol=1e-12),
    ],
    hidden=_bias_cases,
    reference=lambda slopes, q_len, k_len=None, causal=False: alibi_bias(np.asarray(slopes, float), q_len, k_len,
                                                                         causal=causal),
    mistakes=attention_mistakes(_bias_variant, "sign", "start", "triangle", "signed"),
))


# ----------------------------------------------------------------------------- 02: the worked example

def _large_scores(rng):
    """(2, 6) scores around 800-1000 on a grid of 1/64, so float32 holds them exactly: a float32 answer rounds
    nothing that a float64 one does not, and only an exp taken before subtracting the maximum overflows."""
    return np.round((rng.normal(scale=5, size=(2, 6)) + rng.uniform(800, 1000)) * 64) / 64


def _softmax_without_keepdims(x):
    """softmax's sums without keepdims: a row's exps divided by every row's sum, column by column (NumPy's
    broadcasting), or a ValueError where the shapes do not line up, as the student's code raises."""
    x = np.asarray(x, float)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1)


exercise(Exercise(
    "softmax",
    visible=lambda: [Case("softmax([0, 0])", ([0.0, 0.0],), atol=1e-12),
                     Case("softmax([1000, 1000, -inf]) (overflow? masked entry?)", ([1000.0, 1000.0, -np.inf],),
                          atol=1e-12),
                     Case("softmax of a 2x2 array (over each row)", ([[1.0, 2.0], [3.0, 3.0]],), atol=1e-12)],
    hidden=lambda rng: [Case("softmax of a (3, 4, 7) array", (rng.normal(scale=30, size=(3, 4, 7)),), atol=1e-12),
                        Case("softmax of scores near 900 (exp overflows past 709)", (_large_scores(rng),), atol=1e-12)],
    reference=lambda x: softmax(x),
    mistakes=(Mistake("softmax runs over the wrong axis: each row (the last axis) should sum to 1",
                      lambda x: softmax(x, axis=0)),
              Mistake("the sums lost their axis: e.sum(axis=-1) without keepdims=True divides each row by the "
                      "other rows' sums (broadcasting lines them up with the columns)", _softmax_without_keepdims),
              Mistake("exp overflows for large scores: subtract each row's maximum first (softmax does not change)",
                      lambda x: np.exp(np.asarray(x, float)) / np.exp(np.asarray(x, float)).sum(-1, keepdims=True))),
))


def _head(q, k, v, slope, **flags):
    out, weights = attention_variant(q[None], k[None], v[None], [slope], **flags)
    return weights[0], out[0]


def _columns(start: int, stop: int):
    """Qh, Kh, Vh: one head of the chapter's example."""
    return Q[:, start:stop], K[:, start:stop], V[:, start:stop]


def alibi_head_reference(Qh, Kh, Vh, slope):
    """One head of the chapter's ALiBi: (weights (N, N), output (N, d_v))."""
    out, weights = alibi_attention(np.asarray(Qh, float)[None], np.asarray(Kh, float)[None],
                                   np.asarray(Vh, float)[None], [float(slope)], return_weights=True)
    return weights[0], out[0]




def _head_cases(rng):
    chosen = []
    for N, d, dv, m in [(1, 3, 2, 0.5), (9, 4, 3, 0.0), (17, 8, 8, 0.125), (6, 1, 5, 2.0)]:
        chosen.append(Case(f"alibi_head on N={N}, d_k={d}, d_v={dv}, slope={m}",
                           (rng.normal(size=(N, d)), rng.normal(size=(N, d)), rng.normal(size=(N, dv)), m)))
    return chosen


exercise(Exercise(
    "alibi_head",
    visible=lambda: [Case("alibi_head(head 1 of the chapter's example, slope 1/2)", (*_columns(0, 2), 0.5)),
                     Case("alibi_head(head 2 of the chapter's example, slope 1/4)", (*_columns(2, 4), 0.25))],
    hidden=_head_cases,
    reference=alibi_head_reference,
    mistakes=attention_mistakes(lambda **f: lambda q, k, v, m: _head(q, k, v, m, **f),
                                "no_scale", "bias_scaled", "sign", "axis", "signed"),
    upstream=("softmax",),
))


def _multi_head_variant(**flags):
    def multi(Q_, K_, V_, slopes):
        H = len(slopes)
        def split(x):
            return np.asarray(x, float).reshape(x.shape[0], H, -1).swapaxes(0, 1)
        out, weights = attention_variant(split(Q_), split(K_), split(V_), slopes, **flags)
        return out.swapaxes(0, 1).reshape(Q_.shape[0], -1), weights

    return multi


def _multi_cases(rng):
    chosen = []
    for N, H, dk in [(7, 3, 2), (4, 8, 1), (12, 4, 5)]:
        q, k, v = (rng.normal(size=(N, H * dk)) for _ in range(3))
        chosen.append(Case(f"multi_head on N={N}, {H} heads, the paper's slopes", (q, k, v, get_slopes(H))))
    return chosen


exercise(Exercise(
    "multi_head",
    visible=lambda: [Case("multi_head(Q, K, V, [0.5, 0.25]): the chapter's example", (Q, K, V, [0.5, 0.25]))],
    hidden=_multi_cases,
    reference=lambda Q_, K_, V_, slopes: multi_head_alibi(Q_, K_, V_, len(slopes), slopes),
    mistakes=attention_mistakes(_multi_head_variant, "no_scale", "bias_scaled", "sign", "axis"),
    upstream=("alibi_head", "softmax"),
))


class SumsTo(Expect):
    def __init__(self, total: float):
        self.total = total

    def check(self, got, case, at):
        if not isinstance(got, Leaf) or got.values is None:
            return f"{at}expected numbers"
        total = float(got.values.sum())
        return None if abs(total - self.total) <= 1e-9 + 2e-5 else f"{at}sums to {total:.6g}, expected {self.total}"


class SumsToAndIsNot(SumsTo):
    """Sums to ``total`` and is not ``wrong`` (a classic mistake's value), without showing the right value."""

    def __init__(self, total: float, wrong, why: str):
        super().__init__(total)
        self.wrong, self.why = np.asarray(wrong, float), why

    def check(self, got, case, at):
        problem = super().check(got, case, at)
        if problem or got.values.shape != self.wrong.shape or not np.allclose(got.values, self.wrong, atol=1e-9):
            return problem
        return f"{at}{self.why}"


_SAT = 2  # "sat" is the third token

exercise(Exercise(
    "sat_rows",
    visible=lambda: [Case("sat_head1", ("sat_head1",), expected=alibi_head_reference(*_columns(0, 2), 0.5)[0][_SAT]),
                     Case("the sum of sat_head2", ("sat_head2",), expected=SumsToAndIsNot(
                         1.0, alibi_head_reference(*_columns(2, 4), 0.5)[0][_SAT],
                         "that is head 2's row at head 1's slope, 1/2: head 2's slope is 1/4"))],
    hidden=lambda rng: [Case("sat_head2", ("sat_head2",),
                             expected=alibi_head_reference(*_columns(2, 4), 0.25)[0][_SAT])],
    reference=None,
))


# ----------------------------------------------------------------------------- 03: slope zero

def _standard_cases(rng):
    return [Case(f"standard_attention on N={N}, {H} heads", (*(rng.normal(size=(N, H * dk)) for _ in range(3)), H))
            for N, H, dk in [(6, 3, 2), (11, 2, 4), (1, 1, 3)]]


def standard_reference(Q_, K_, V_, n_heads):
    return multi_head_alibi(Q_, K_, V_, n_heads, slopes=np.zeros(n_heads))


exercise(Exercise(
    "standard_attention",
    visible=lambda: [Case("standard_attention(Q, K, V, 2): the chapter's example", (Q, K, V, 2))],
    hidden=_standard_cases,
    reference=standard_reference,
    mistakes=attention_mistakes(lambda **f: lambda Q_, K_, V_, n: _multi_head_variant(**f)(Q_, K_, V_, np.zeros(n)),
                                "no_scale", "axis"),
))

exercise(Exercise(
    "slope_zero",
    visible=lambda: [Case("alibi_zero_output (ALiBi with both slopes 0)", ("alibi_zero_output",),
                          expected=standard_reference(Q, K, V, 2)[0]),
                     Case("max_difference", ("max_difference",), expected=0.0, atol=1e-12),
                     # what makes 0.0 a finding rather than a guess: at the chapter's slopes ALiBi differs
                     Case("chapter_difference (ALiBi at the chapter's slopes, 1/2 and 1/4)", ("chapter_difference",),
                          expected=float(np.abs(standard_reference(Q, K, V, 2)[0]
                                                - multi_head_alibi(Q, K, V, 2)[0]).max()), atol=1e-9)],
    hidden=lambda rng: [],
    reference=None,
    helpers=("multi_head_alibi",),  # the notebook lends it for this exercise
))


# ----------------------------------------------------------------------------- 04: causal

_HEAD1 = (Q[:, 0:2], K[:, 0:2])


def _scaled(Qh, Kh, scale=True):
    """One head's scores q_i . k_j / sqrt(d) (the chapter's steps 1 and 2), (N, N)."""
    q, k = np.asarray(Qh, float), np.asarray(Kh, float)
    return q @ k.T / (np.sqrt(q.shape[1]) if scale else 1.0)


def _scores_variant(scale=True, **flags):
    return lambda Qh, Kh, slope: _scaled(Qh, Kh, scale) + variant_bias([slope], len(Qh), len(Kh), True, **flags)[0]


def causal_scores_reference(Qh, Kh, slope):
    return _scaled(Qh, Kh) + alibi_bias([float(slope)], len(Qh), causal=True)[0]


def _symmetric(Qh, Kh, slope):
    return _scaled(Qh, Kh) + alibi_bias([float(slope)], len(Qh))[0]


def _score_cases(name, rng, shapes):
    return [Case(f"{name} on N={N}, d_k={d}, slope={m}", (rng.normal(size=(N, d)), rng.normal(size=(N, d)), m))
            for N, d, m in shapes]


exercise(Exercise(
    "causal_alibi_scores",
    visible=lambda: [Case("causal_alibi_scores(Qh, Kh, 0.5): head 1 of the chapter", (*_HEAD1, 0.5))],
    hidden=lambda rng: _score_cases("causal_alibi_scores", rng, [(1, 2, 0.5), (8, 3, 0.25), (13, 5, 0.7071)]),
    reference=causal_scores_reference,
    mistakes=(Mistake("this is the symmetric score: causal attention masks the future (-inf where j > i)", _symmetric),
              *attention_mistakes(_scores_variant, "no_scale", "sign", "triangle")),
))


def key_only_reference(Qh, Kh, slope):
    return _scaled(Qh, Kh) + key_only_bias([float(slope)], len(Qh))[0]


exercise(Exercise(
    "key_only_scores",
    visible=lambda: [Case("key_only_scores(Qh, Kh, 0.5): head 1 of the chapter", (*_HEAD1, 0.5))],
    hidden=lambda rng: _score_cases("key_only_scores", rng, [(1, 2, 0.5), (9, 4, 0.125), (16, 2, 1.0)]),
    reference=key_only_reference,
    mistakes=(Mistake("this is the relative form -m * (i - j); the key-only form adds +m * j", causal_scores_reference),
              Mistake("the key-only form needs the causal mask (-inf where j > i): without it the weights differ",
                      lambda Qh, Kh, m: _scaled(Qh, Kh) + variant_bias([m], len(Qh), len(Kh), key_only=True)[0])),
))


def decode_reference(q_new, K_cache, V_cache, slope):
    out = alibi_attention(np.asarray(q_new, float)[None, None], np.asarray(K_cache, float)[None],
                          np.asarray(V_cache, float)[None], [float(slope)], causal=True)
    return out[0, 0]


def _decode_from_start(q_new, K_cache, V_cache, slope):
    q, k, v = (np.asarray(x, float) for x in (q_new, K_cache, V_cache))
    return softmax(k @ q / np.sqrt(len(q)) - slope * np.arange(len(k))) @ v


def _decode_cases(rng):
    return [Case(f"decode_step with {T} cached tokens, d={d}, d_v={dv}, slope={m}",
                 (rng.normal(size=(d,)), rng.normal(size=(T, d)), rng.normal(size=(T, dv)), m))
            for T, d, dv, m in [(1, 2, 2, 0.5), (12, 4, 3, 0.25), (30, 8, 5, 0.0625)]]


exercise(Exercise(
    "decode_step",
    visible=lambda: [Case(f"decode_step for {EXAMPLE.tokens[t]!r} (row {t} of causal attention)",
                          (Q[t, 0:2], K[: t + 1, 0:2], V[: t + 1, 0:2], 0.5)) for t in range(5)],
    hidden=_decode_cases,
    reference=decode_reference,
    # the query put at position 0 (-m * j) and the bias's sign flipped (+m * (t - j)) differ by m * t on every
    # score, which softmax cannot see: one mistake, two ways to make it
    mistakes=(Mistake("the penalty grows toward the newest key: the new query is the last position t of the cache, "
                      "so the penalty is m * (t - j), largest for the oldest key. Putting the query at position 0 "
                      "(-m * j) and flipping the bias's sign (+m * (t - j)) both do this; they differ by the same "
                      "m * t on every score, which softmax cannot see", _decode_from_start),
              Mistake("the scores are not divided by sqrt(d)",
                      lambda q, k, v, m: decode_reference(np.asarray(q, float) * np.sqrt(len(q)), k, v, m))),
))


def padded_decode_reference(q_new, K_cache, V_cache, attention_mask, slope):
    """Each row's decode_step on its real tokens alone (the padding dropped): (B, d_v)."""
    return np.stack([decode_reference(q, k[real == 1], v[real == 1], slope)
                     for q, k, v, real in zip(q_new, K_cache, V_cache, np.asarray(attention_mask), strict=True)])


def _padded_variant(*, by_column=False, see_padding=False):
    def padded(q_new, K_cache, V_cache, attention_mask, slope):
        mask = np.asarray(attention_mask)
        T = mask.shape[-1]
        positions = np.broadcast_to(np.arange(T), mask.shape) if by_column else mask.cumsum(-1) - 1
        scores = (np.einsum("bd,btd->bt", q_new, K_cache) / np.sqrt(q_new.shape[-1])
                  - slope * (positions[:, -1:] - positions))
        return np.einsum("bt,btv->bv", softmax(scores if see_padding else np.where(mask == 1, scores, -np.inf)),
                         V_cache)
    return padded


def _padded_batch(label, rng, rows: list[tuple[int, int, int]], d: int, dv: int, slope: float):
    """One batch: each row (pads on the left, prompt length, pads on the right before the generated tokens), every
    row then ending with the same number of generated tokens, the newest last."""
    generated = 2
    T = max(left + prompt + right for left, prompt, right in rows) + generated
    mask = np.zeros((len(rows), T), dtype=np.int64)
    for b, (left, prompt, right) in enumerate(rows):
        lead = T - generated - (left + prompt + right)  # the row's share of the batch's left padding
        mask[b, lead + left:lead + left + prompt] = 1
        mask[b, T - generated:] = 1
    B = len(rows)
    q, k, v = rng.normal(size=(B, d)), rng.normal(size=(B, T, d)), rng.normal(size=(B, T, dv))
    return Case(f"padded_decode_step, {label}: attention_mask {mask.tolist()}, slope={slope}", (q, k, v, mask, slope))


exercise(Exercise(
    "padded_decode_step",
    visible=lambda: [_padded_batch("left padding", np.random.default_rng(4), [(0, 5, 0), (3, 2, 0), (1, 4, 0)], 2, 2,
                                   0.5),
                     _padded_batch("right padding before the generated tokens", np.random.default_rng(5),
                                   [(0, 5, 0), (0, 2, 3), (0, 3, 2)], 2, 2, 0.5)],
    hidden=lambda rng: [
        _padded_batch("mixed padding", rng, [(0, 1, 6), (4, 3, 0), (2, 2, 3), (0, 7, 0)], 4, 3, 0.25),
        _padded_batch("one row", rng, [(0, 3, 4)], 3, 2, 0.0625),
        _padded_batch("random padding", rng, [tuple(int(n) for n in rng.integers((0, 1, 1), (4, 6, 4)))
                                              for _ in range(5)], 8, 5, float(rng.choice([0.5, 0.125]))),
    ],
    reference=padded_decode_reference,
    mistakes=(Mistake("the distances count the padding: between a prompt and the tokens generated after it, column "
                      "indices put the prompt farther away than it is; use each token's place among the real ones, "
                      "attention_mask.cumsum(-1) - 1", _padded_variant(by_column=True)),
              Mistake("the padding is attended to: set the scores to -inf where attention_mask is 0",
                      _padded_variant(see_padding=True))),
))


# ----------------------------------------------------------------------------- 05: schedules

exercise(Exercise(
    "linear_slopes",
    visible=lambda: [Case(f"linear_slopes({n})", (n,), atol=1e-15) for n in (2, 4)],
    hidden=lambda rng: [Case(f"linear_slopes({n})", (n,), atol=1e-15) for n in (1, 5, 12, int(rng.integers(13, 30)))],
    reference=lambda n: get_slopes(n, "linear"),
    mistakes=(Mistake("the slopes run the wrong way: head 1 is the steepest, (H - h + 1) / H",
                      lambda n: get_slopes(n, "linear")[::-1]),),
))

exercise(Exercise(
    "constant_slopes",
    visible=lambda: [Case("constant_slopes(3)", (3,), atol=1e-15),
                     Case("constant_slopes(2, value=0.5)", (2,), {"value": 0.5}, atol=1e-15)],
    # values from a continuum: no table of the reference's answers made beforehand can hold them
    hidden=lambda rng: [Case(f"constant_slopes({n}, value={value})", (n,), {"value": value}, atol=1e-15)
                        for n, value in zip((1, 5, 12), rng.uniform(0.01, 2.0, 3).round(6).tolist(), strict=True)],
    reference=lambda n, value=0.25: get_slopes(n, "constant", constant=value),
))


def _first_row(slopes):
    return multi_head_alibi(Q, K, V, 2, slopes)[1][0, 0]


class Keys(Expect):
    def __init__(self, keys):
        self.keys = sorted(keys)

    def check(self, got, case, at):
        return None if isinstance(got, dict) and sorted(got) == self.keys else (
            f"{at}expected a dict with the keys {self.keys}")


exercise(Exercise(
    "the_head1",
    visible=lambda: [Case("the keys of the_head1", ("the_head1",), expected=Keys(["constant", "linear", "textbook"])),
                     Case("the_head1['textbook']", ("the_head1", "textbook"), expected=_first_row([0.5, 0.25]))],
    hidden=lambda rng: [Case(f"the_head1[{name!r}]", ("the_head1", name), expected=_first_row(get_slopes(2, name)))
                        for name in ("linear", "constant")],
    reference=None,
    helpers=("multi_head_alibi",),  # the notebook lends it for this exercise
))


# ----------------------------------------------------------------------------- 06: extrapolation

class Extension(Expect):
    """Ten rows: the chapter's five unchanged, then five invented ones, distinct and not all zero."""

    def __init__(self, original):
        self.original = np.asarray(original, dtype=np.float64)

    def check(self, got, case, at):
        if not isinstance(got, Leaf) or got.values is None:
            return f"{at}expected a (10, 4) array"
        x = got.values
        if x.shape != (10, 4):
            return f"{at}expected shape (10, 4), got {x.shape}"
        if not np.isfinite(x).all():
            return f"{at}holds inf or nan"
        if not np.array_equal(x[:5], self.original):
            return f"{at}the first five rows must be the chapter's own, unchanged"
        new = x[5:]
        if not np.abs(new).any(axis=1).all() or len({tuple(r) for r in new}) < 5:
            return f"{at}the five new tokens need vectors of their own: none all zero, no two the same"
        return None


exercise(Exercise(
    "ten_tokens",
    visible=lambda: [Case(name, (name,), expected=Extension(x)) for name, x in (("Q10", Q), ("K10", K), ("V10", V))],
    hidden=lambda rng: [],
    reference=None,
    helpers=("multi_head_alibi",),  # beside row_change, which uses it: no reference computes new tokens
))


def row_change_reference(Q10, K10, V10, causal=False):
    _, w5 = multi_head_alibi(Q10[:5], K10[:5], V10[:5], 2, [0.5, 0.25], causal=causal)
    _, w10 = multi_head_alibi(Q10, K10, V10, 2, [0.5, 0.25], causal=causal)
    return np.abs(w10[:, :5, :5] - w5).max(axis=(0, 2))


def _row_change_cases(rng):
    chosen = []
    for n in range(3):
        ext = [np.vstack([x, rng.normal(size=(5, 4))]) for x in (Q, K, V)]
        chosen += [Case(f"row_change of random extension {n + 1}, causal={c}", tuple(ext), {"causal": c}, atol=1e-12,
                        exact=c) for c in (False, True)]
    return chosen


_REPEATED = (np.vstack([Q, Q]), np.vstack([K, K]), np.vstack([V, V]))

exercise(Exercise(
    "row_change",
    visible=lambda: [Case("row_change of the example repeated twice, symmetric", _REPEATED, atol=1e-12),
                     Case("row_change of the example repeated twice, causal (exactly 0)", _REPEATED, {"causal": True},
                          atol=0.0, exact=True)],
    hidden=_row_change_cases,
    reference=row_change_reference,
    helpers=("multi_head_alibi",),  # the notebook lends it: this exercise is about what it shows
))


# ----------------------------------------------------------------------------- 06: going further, KERPLE

def kerple_log_reference(r1, r2, q_len, k_len=None, *, distance=None, end_aligned=True):
    """KERPLE's logarithmic bias (Chi et al., 2022), (H, q_len, k_len): -r1[h] log(1 + r2[h] |i - j|), with the
    queries at the end of the keys as everywhere in the course. ``distance`` and ``end_aligned`` make the classic
    mistakes (``_KERPLE_MISTAKES``) from the same code."""
    r1, r2 = np.asarray(r1, float), np.asarray(r2, float)
    k_len = q_len if k_len is None else k_len
    i = np.arange(q_len)[:, None] + (k_len - q_len if end_aligned else 0)  # (i, 1): each query's position
    d = np.abs(i - np.arange(k_len)[None, :]).astype(float)  # (i, j)
    shaped = (distance or (lambda r2_, d_: np.log1p(r2_ * d_)))(r2[:, None, None], d[None])  # (H, i, j)
    return -r1[:, None, None] * shaped


_KERPLE_MISTAKES = (
    Mistake("the bias is a penalty: -r1 log(1 + r2 |i - j|), at most 0",
            lambda r1, r2, q, k=None: -kerple_log_reference(r1, r2, q, k)),
    Mistake("r1 scales the log and r2 the distance inside it: -r1 log(1 + r2 |i - j|)",
            lambda r1, r2, q, k=None: kerple_log_reference(r2, r1, q, k)),
    Mistake("that is ALiBi with slope r1 r2 (the log's first-order term): KERPLE takes the log of the distance",
            lambda r1, r2, q, k=None: kerple_log_reference(r1, r2, q, k, distance=lambda r2_, d_: r2_ * d_)),
    Mistake("the queries sit at the end of the keys: query i is at position i + k_len - q_len",
            lambda r1, r2, q, k=None: kerple_log_reference(r1, r2, q, k, end_aligned=False)),
)


def _kerple_cases(rng):
    chosen = []
    for _ in range(8):
        H, q = int(rng.integers(1, 9)), int(rng.integers(1, 17))
        chosen.append((rng.uniform(0.1, 3, H), rng.uniform(0.05, 4, H), q, q + int(rng.integers(0, 17))))
    return [Case(f"kerple_log_bias(<{len(r1)} heads>, {q}, {k})", (r1, r2, q, k), atol=1e-12, rtol=1e-12)
            for r1, r2, q, k in chosen]


exercise(Exercise(
    "kerple_log_bias",
    visible=lambda: [
        Case("kerple_log_bias([1.0], [1.0], 4)", ([1.0], [1.0], 4), atol=1e-12),
        Case("kerple_log_bias([2.0, 0.5], [0.5, 2.0], 3)", ([2.0, 0.5], [0.5, 2.0], 3), atol=1e-12),
        Case("kerple_log_bias([1.0], [0.25], 1, 6): one decoding query against 6 keys", ([1.0], [0.25], 1, 6),
             atol=1e-12),
    ],
    hidden=_kerple_cases,
    reference=lambda r1, r2, q_len, k_len=None: kerple_log_reference(r1, r2, q_len, k_len),
    mistakes=_KERPLE_MISTAKES,
))


# ----------------------------------------------------------------------------- 07: PyTorch

def _torch_bias_reference(slopes, q_len, k_len, causal=False):
    return alibi_bias(np.asarray(slopes, float), q_len, k_len, causal=causal)


class MetaShape(Expect):
    def __init__(self, shape):
        self.shape = tuple(shape)

    def check(self, got, case, at):
        if not isinstance(got, Leaf) or got.kind != "tensor" or got.device != "meta":
            return (f"{at}the result should be made on the inputs' device (here 'meta'), got "
                    f"{getattr(got, 'device', type(got).__name__)}: is a tensor created without device=...?")
        return None if got.shape == self.shape else f"{at}expected shape {self.shape}, got {got.shape}"



def _bias_on_meta():
    return Case("alibi_bias_torch on the meta device (no data: only where the tensors are made)",
                (np.ones(4), 5, 8), {"causal": True}, device="meta", expected=MetaShape((4, 5, 8)))


exercise(Exercise(
    "alibi_bias_torch",
    visible=lambda: [
        Case("alibi_bias_torch([0.5, 0.25], 3, 5, causal=True)", (np.array([0.5, 0.25]), 3, 5), {"causal": True},
             atol=1e-7),
        Case("alibi_bias_torch(<bfloat16 slope 0.5>, 1, 1000)[0, 0, -3:]: next to the diagonal at length 1000",
             (np.array([0.5]), 1, 1000), input_dtype="bfloat16", dtype="bfloat16", exact=True, atol=0.0,
             # b[0] first: the first head, of a tensor or of a list of per-head tensors alike
             expected=np.array([-1.0, -0.5, 0.0]), pick="last_three_of_first_row"),
        _bias_on_meta(),
    ],
    hidden=lambda rng: [
        *(Case(f"alibi_bias_torch(<{len(s)} slopes>, {q}, {k}, causal={c})", (s, q, k), {"causal": c}, atol=1e-12)
          for s, q, k, c in [(get_slopes(12), 7, 7, False), (get_slopes(6), 1, 20, True),
                             (get_slopes(3), 4, 9, False), (rng.uniform(0, 1, 5), 9, 9, True)]),
        _bias_on_meta()],
    reference=_torch_bias_reference,
    mistakes=attention_mistakes(_bias_variant, "sign", "start", "triangle", "key_only"),
    torch_inputs=True,
    helpers=("get_slopes",),  # beside mha_alibi, which uses it: no slope computes this exercise
))


def _split_heads(x):  # (N, 4) -> (1, 2, N, 2): the chapter's column split
    return x.reshape(1, x.shape[0], 2, 2).swapaxes(1, 2)


def torch_attention_reference(q, k, v, slopes, causal=False):
    return alibi_attention(np.asarray(q, float), np.asarray(k, float), np.asarray(v, float),
                           np.asarray(slopes, float), causal=causal)


def _torch_attention_cases(rng):
    chosen = []
    for B, H, nq, nk, d, c in [(2, 3, 5, 5, 4, False), (1, 6, 1, 9, 8, True), (3, 4, 7, 11, 2, True),
                               (1, 12, 6, 6, 3, False)]:
        q, k, v = rng.normal(size=(B, H, nq, d)), rng.normal(size=(B, H, nk, d)), rng.normal(size=(B, H, nk, d))
        chosen.append(Case(f"B={B}, H={H}, q_len={nq}, k_len={nk}, causal={c}", (q, k, v, get_slopes(H)),
                           {"causal": c}))
    return chosen


def _attention_mistakes_4d(**flags):
    return lambda q, k, v, s, causal=False: attention_variant(q, k, v, s, causal=causal, **flags)[0]


_TORCH_ATTENTION_MISTAKES = attention_mistakes(_attention_mistakes_4d, "no_scale", "bias_scaled", "sign", "axis",
                                               "start", "triangle")

def _attention_on_meta():
    return Case("alibi_attention_torch on the meta device", (*(np.ones((1, 2, 3, 4)),) * 3, np.ones(2)),
                device="meta", expected=MetaShape((1, 2, 3, 4)))


exercise(Exercise(
    "alibi_attention_torch",
    visible=lambda: [Case("alibi_attention_torch on the chapter's example (two heads)",
                          (*(_split_heads(x) for x in (Q, K, V)), np.array([0.5, 0.25]))), _attention_on_meta()],
    hidden=lambda rng: [*(Case("alibi_attention_torch, " + c.label, c.args, c.kwargs)
                          for c in _torch_attention_cases(rng)), _attention_on_meta()],
    reference=torch_attention_reference,
    mistakes=_TORCH_ATTENTION_MISTAKES + attention_mistakes(_attention_mistakes_4d, "sdpa_bool"),
    upstream=("alibi_bias_torch",),
    torch_inputs=True,
    helpers=("get_slopes",),  # beside mha_alibi, which uses it: no slope computes this exercise
))


def attention_gradient_reference(q, k, v, slopes, causal=False):
    """The gradient of ALiBi attention's summed output with respect to q, by torch's autograd in float64."""
    import torch

    q_, k_, v_ = (torch.as_tensor(np.asarray(x, float)) for x in (q, k, v))
    q_.requires_grad_(True)
    bias = torch.as_tensor(alibi_bias(np.asarray(slopes, float), q_.shape[-2], k_.shape[-2], causal=causal))
    out = torch.softmax(q_ @ k_.transpose(-1, -2) / np.sqrt(q_.shape[-1]) + bias, dim=-1) @ v_
    (grad,) = torch.autograd.grad(out.sum(), q_)
    return grad.numpy()


# "gradients must flow through it": alibi_attention_torch's output, differentiated with respect to q
exercise(Exercise(
    "attention_gradient",
    visible=lambda: [Case("d(sum of alibi_attention_torch's output)/dq on the chapter's example, causal",
                          (*(_split_heads(x) for x in (Q, K, V)), np.array([0.5, 0.25])), {"causal": True})],
    hidden=lambda rng: [Case("d(sum of the output)/dq, " + c.label, c.args, c.kwargs)
                        for c in _torch_attention_cases(rng)[:2]],
    reference=attention_gradient_reference,
    upstream=("alibi_bias_torch",),
    torch_inputs=True,
    adapter=gradient_of_summed_output,
    helpers=("get_slopes",),  # in alibi_attention_torch's test cell, which sees it
))


# ----------------------------------------------------------------------------- 07: ALiBi as a module

def module_reference(q, k, v, causal=False, query=0, *, slopes_kept="buffer", **flags):
    """What ``harness.module_facts`` reports of a right ALiBiAttention with the paper's slopes, or of one with a
    classic mistake: the slopes kept as a trainable "parameter" or a plain "attribute", or attention_variant's
    ``flags``. ``explain``: query ``query`` of the first batch item, each (H, k_len)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    H, q_len, k_len = q.shape[1], q.shape[-2], k.shape[-2]
    slopes = get_slopes(H)
    out, weights = attention_variant(q, k, v, slopes, causal=causal, **flags)
    facts = {"trainable parameters": float(H if slopes_kept == "parameter" else 0),
             "the slopes buffer": slopes if slopes_kept == "buffer" else NO_SLOPES_BUFFER, "output": out}
    if q_len == k_len:
        bias_flags = {f: flags[f] for f in ("sign", "triangle") if f in flags}
        root = np.sqrt(q.shape[-1]) if flags.get("scale", True) else 1.0
        content = (q[0, :, query, None] @ np.swapaxes(k[0], -1, -2))[:, 0] / root  # (H, 1, d) @ (H, d, k_len)
        penalty = variant_bias(slopes, q_len, k_len, causal, **bias_flags)[:, query]  # (H, k_len)
        facts["explain"] = {"content": content, "penalty": penalty, "weights": weights[0, :, query]}
    return facts


def _module_cases(rng):
    chosen = []
    for c in _torch_attention_cases(rng):
        query = int(rng.integers(c.args[0].shape[-2]))  # the row explain is asked about (self-attention cases)
        chosen.append(Case(f"ALiBiAttention, {c.label}, explain for query {query}", c.args[:3],
                           {**c.kwargs, "query": query}))
    return chosen


MODULE_MISTAKES = (
    Mistake("the slopes are an nn.Parameter: the optimizer would train them, and ALiBi's slopes are fixed; keep them "
            "with register_buffer", lambda *a, **kw: module_reference(*a, **kw, slopes_kept="parameter")),
    Mistake("the slopes are a plain attribute: .to(device) leaves them behind and state_dict does not save them; "
            "keep them with register_buffer", lambda *a, **kw: module_reference(*a, **kw, slopes_kept="attribute")),
    *attention_mistakes(lambda **flags: lambda *a, **kw: module_reference(*a, **kw, **flags), "no_scale", "sign",
                        "triangle"),
)

exercise(Exercise(
    "alibi_module",
    visible=lambda: [Case(f"ALiBiAttention(2) on the chapter's example, causal={c}, explain for query {i}",
                          tuple(_split_heads(x) for x in (Q, K, V)), {"causal": c, "query": i})
                     for c, i in ((False, 2), (True, 4))],
    hidden=_module_cases,
    reference=module_reference,
    mistakes=MODULE_MISTAKES,
    upstream=("alibi_bias_torch", "alibi_attention_torch"),
    torch_inputs=True,
    adapter=module_facts,
    helpers=("get_slopes",),  # the module keeps the paper's slopes
))


class AnyOf(Expect):
    """Right if it is any one of ``values`` (each compared as a value is): where the exercise's wording allows
    more than one right answer. A wrong one is told how far it is from the first."""

    def __init__(self, *values):
        self.values = values

    def check(self, got, case, at):
        problems = [compare(got, value, case, at) for value in self.values]
        return None if None in problems else problems[0]


def mha_reference(seed, x, num_heads, qkv_features, drawn_in=None, **flags):
    """nn.MultiheadAttention's own projections, seeded as the exercise asks, around ALiBi attention. ``drawn_in``:
    the dtype the layer is built in (its weights drawn in it), or None: built in float32, then moved."""
    import torch
    from torch import nn

    x = torch.as_tensor(np.asarray(x, float))
    T, E = x.shape
    torch.manual_seed(int(seed))
    m = nn.MultiheadAttention(E, num_heads, dtype=drawn_in).double()
    wq, wk, wv = m.in_proj_weight.detach().chunk(3)
    bq, bk, bv = m.in_proj_bias.detach().chunk(3)
    q, k, v = ((x @ w.T + b).reshape(T, num_heads, E // num_heads).transpose(0, 1).numpy()
               for w, b in [(wq, bq), (wk, bk), (wv, bv)])
    out = attention_variant(q, k, v, get_slopes(num_heads), **flags)[0]  # (H, T, d)
    y = torch.as_tensor(out).transpose(0, 1).reshape(T, E)
    return m.out_proj(y).detach().flatten().numpy()


def _either_build(**flags):
    """The layer built "on x's device and dtype" either way a student builds it: in float32 then moved
    (``.to(x)``), or built in x's dtype (``dtype=x.dtype``), whose weights are drawn in float64 and so differ
    from the float32 draw in every digit past the seventh. (On a GPU, built with ``device=`` draws from the
    device's own generator: other weights altogether, which no reference on the CPU can match.)"""
    import torch

    return lambda *args: AnyOf(mha_reference(*args, **flags), mha_reference(*args, drawn_in=torch.float64, **flags))


def _mha_cases(rng):
    return [Case(f"mha_alibi(seed={s}, x of shape ({T}, {E}), num_heads={H}, qkv_features={E})",
                 (s, rng.normal(size=(T, E)), H, E)) for s, T, E, H in [(0, 6, 8, 2), (3, 11, 12, 3), (7, 1, 16, 4),
                                                                        (5, 9, 24, 12)]]


exercise(Exercise(
    "mha_alibi",
    visible=lambda: [Case("mha_alibi(0, x of shape (6, 8), num_heads=2, qkv_features=8)",
                          (0, np.random.default_rng(1).normal(size=(6, 8)), 2, 8)),
                     Case("mha_alibi(0, x of shape (6, 5), 2, 8): x's features do not match qkv_features",
                          (0, np.ones((6, 5)), 2, 8), raises="ValueError")],
    hidden=_mha_cases,
    reference=_either_build(),
    mistakes=(Mistake("the bias went in as a boolean mask: nn.MultiheadAttention reads True as 'may not attend', "
                      "so every key but the query's own is masked and the slopes are lost (section 7.3); pass the "
                      "float bias", _either_build(bool_mask=True)),
              Mistake("the bias has the wrong sign: attn_mask is added to the scores, so it must be -m * |i - j|",
                      _either_build(sign=1.0)),
              Mistake("this is attention without ALiBi: is the bias reaching attn_mask?", _either_build(sign=0.0)),
              *attention_mistakes(_either_build, "bias_scaled")),
    upstream=("alibi_bias_torch",),
    torch_inputs=True,
    helpers=("get_slopes",),  # the notebook imports it: the exercise is the layer, not the slopes
))


def _sdpa_cases(rng):
    return [Case(f"sdpa_alibi for H={H}, q_len={nq}, k_len={nk}, causal={c}",
                 (rng.normal(size=(1, H, nq, 4)), rng.normal(size=(1, H, nk, 4)), rng.normal(size=(1, H, nk, 4)),
                  get_slopes(H)), {"causal": c})
            for H, nq, nk, c in [(6, 1, 12, True), (3, 5, 8, False), (12, 9, 9, True)]]


def _sdpa_visible():
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(2, 4, 7, 8)) for _ in range(3))
    decode_q = rng.normal(size=(2, 4, 1, 8))  # one query, the last of 7 positions: a decoding step
    return [Case(f"sdpa_alibi on (2, 4, 7, 8), causal={c}", (q, k, v, get_slopes(4)), {"causal": c})
            for c in (False, True)] + [
        Case("sdpa_alibi for a decoding step: q_len=1, k_len=7, causal=True", (decode_q, k, v, get_slopes(4)),
             {"causal": True})]


exercise(Exercise(
    "sdpa_alibi",
    visible=_sdpa_visible,
    hidden=_sdpa_cases,
    reference=torch_attention_reference,
    mistakes=_TORCH_ATTENTION_MISTAKES + attention_mistakes(_attention_mistakes_4d, "sdpa_bool"),
    upstream=("alibi_bias_torch",),
    torch_inputs=True,
    helpers=("get_slopes",),  # beside mha_alibi, which uses it: no slope computes this exercise
))


def _score_mod_variant(**flags):
    """What a score_mod makes of ``score`` (zero, 10 x 10, if None): score + bias, right or with a mistake."""
    def applied(slopes, causal=False, score=None):
        n = 10 if score is None else score.shape[-1]
        bias = variant_bias(np.asarray(slopes, float), n, n, causal, **flags)
        return bias if score is None else np.asarray(score, float) + bias
    return applied


score_mod_reference = _score_mod_variant()


def _score_mod_visible():
    # what flex_attention does with a score_mod: call it on every (h, q_idx, kv_idx) of the scores
    score = np.random.default_rng(3).normal(size=(4, 16, 16))
    return [Case(f"your score_mod on random (4, 16, 16) scores, causal={c}", (get_slopes(4),),
                 {"causal": c, "score": score}, atol=1e-12) for c in (False, True)]


exercise(Exercise(
    "alibi_score_mod",
    visible=_score_mod_visible,
    hidden=lambda rng: [Case(f"your score_mod on a zero score, 6 heads, 10 x 10, causal={c}", (get_slopes(6),),
                             {"causal": c}, atol=1e-12) for c in (False, True)],
    reference=score_mod_reference,
    mistakes=attention_mistakes(_score_mod_variant, "sign", "triangle"),
    torch_inputs=True,
    adapter=score_mod_outputs,
    helpers=("get_slopes",),  # beside mha_alibi, which uses it: no slope computes this exercise
))


# ----------------------------------------------------------------------------- 08: tiled

def _tiled_cases(rng):
    chosen = []
    for H, N, d, dv, block, c in [(1, 1, 3, 2, 4, True), (5, 37, 4, 6, 8, True), (12, 50, 8, 3, 7, False),
                                  (3, 64, 2, 2, 64, True), (2, 9, 5, 5, 1, False)]:
        q, k = rng.normal(size=(2, H, N, d))
        chosen.append(Case(f"tiled, H={H}, N={N}, block={block}, causal={c}",
                           (q, k, rng.normal(size=(H, N, dv)), get_slopes(H)), {"causal": c, "block": block}))
    return chosen


def _tiled_visible():
    q, k, v = np.random.default_rng(0).normal(size=(3, 4, 100, 16))
    return [Case(f"tiled vs naive, N=100, block={b}, causal={c}", (q, k, v, get_slopes(4)), {"causal": c, "block": b})
            for c in (False, True) for b in (16, 33, 128)]


def tiled_reference(q, k, v, slopes, causal=False, block=64):
    return alibi_attention(q, k, v, slopes, causal=causal)


def _scores(q, k, slopes, causal):
    """The (H, N, N) scores with ALiBi's bias (masked with -inf where causal) and their log-sum-exp per row."""
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]) + variant_bias(slopes, q.shape[-2], k.shape[-2], causal)
    top = scores.max(axis=-1, keepdims=True)
    return scores, (top + np.log(np.exp(scores - top).sum(axis=-1, keepdims=True)))[..., 0]


def _tiled_without_rescaling(q, k, v, slopes, causal=False, block=64):
    """The online softmax with the factor e^(M - M') left out: what came before stays against its old maximum."""
    H, N, _ = q.shape
    scores, _ = _scores(q, k, slopes, causal)  # (H, N, N)
    out = np.empty((H, N, v.shape[-1]))
    for i0 in range(0, N, block):
        row_max, row_sum, acc = np.full((H, min(block, N - i0), 1), -np.inf), 0.0, 0.0
        for j0 in range(0, N, block):
            s = scores[:, i0:i0 + block, j0:j0 + block]
            row_max = np.maximum(row_max, s.max(axis=-1, keepdims=True))
            p = np.exp(s - row_max)
            row_sum, acc = row_sum + p.sum(axis=-1, keepdims=True), acc + p @ v[:, j0:j0 + block]
        out[:, i0:i0 + block] = acc / row_sum
    return out


TILED_MISTAKES = (
    *attention_mistakes(lambda **flags: lambda q, k, v, slopes, causal=False, block=64: attention_variant(
        q, k, v, slopes, causal=causal, **flags)[0], "no_scale", "sign", "triangle"),
    Mistake("the running sum and output are not rescaled by e^(M - M') when the maximum grows: each tile's terms "
            "are then against a different maximum", _tiled_without_rescaling),
)

exercise(Exercise("tiled", visible=_tiled_visible, hidden=_tiled_cases, reference=tiled_reference,
                  mistakes=TILED_MISTAKES))


# ----------------------------------------------------------------------------- 08: the backward pass

def _backward_case(label, rng, H, N, d, dv, block, causal):
    """Inputs of one backward call: q, k, v, slopes, the forward's output and log-sum-exp, and d_out."""
    q, k = rng.normal(size=(2, H, N, d))
    v, d_out = rng.normal(size=(2, H, N, dv))
    slopes = get_slopes(H)
    scores, lse = _scores(q, k, slopes, causal)
    out = np.exp(scores - lse[..., None]) @ v  # (H, N, d_v)
    return Case(f"{label}, H={H}, N={N}, block={block}, causal={causal}", (q, k, v, slopes, out, lse, d_out),
                {"causal": causal, "block": block}, atol=1e-9, parts=("dq", "dk", "dv", "d_slopes"))


def _attention_in_row_blocks(q, k, v, slopes, causal, rows=1024, d_out=None, window=None):
    """Naive ALiBi attention in float64 by torch, ``rows`` queries at a time, each block against the keys it can
    weigh (causal: none after its last query; with ``window``: none farther than that from its queries):
    ``(out, lse, None)``, or with ``d_out`` ``(out, lse, (dq, dk, dv, d_slopes))``, the gradients of
    sum(out * d_out) by autograd. A row depends on no other query, so the blocks' gradients add up."""
    import torch

    q_, k_, v_, m_ = (torch.tensor(np.asarray(x, dtype=np.float64)) for x in (q, k, v, slopes))
    grads = [torch.zeros_like(x) for x in (q_, k_, v_, m_)]
    N = q_.shape[-2]
    out = torch.empty(*q_.shape[:-1], v_.shape[-1], dtype=torch.float64)  # (H, N, d_v)
    lse = torch.empty(q_.shape[:-1], dtype=torch.float64)  # (H, N)
    for i0 in range(0, N, rows):
        i1 = min(i0 + rows, N)
        lo, hi = (0, N) if window is None else (max(0, i0 - window), min(N, i1 + window))
        hi = min(hi, i1) if causal else hi
        leaves = [x.clone().requires_grad_(d_out is not None) for x in (q_[:, i0:i1], k_[:, lo:hi], v_[:, lo:hi], m_)]
        qb, kb, vb, mb = leaves
        i = torch.arange(i0, i1, dtype=torch.float64)[:, None]  # (rows, 1)
        j = torch.arange(lo, hi, dtype=torch.float64)[None, :]  # (1, keys)
        scores = qb @ kb.transpose(-1, -2) / np.sqrt(qb.shape[-1]) - mb[:, None, None] * (i - j).abs()
        if causal:
            scores = scores.masked_fill(j > i, float("-inf"))
        block_out = torch.softmax(scores, dim=-1) @ vb  # (H, rows, d_v)
        out[:, i0:i1], lse[:, i0:i1] = block_out.detach(), torch.logsumexp(scores, -1).detach()
        if d_out is not None:
            block_out.backward(torch.tensor(np.asarray(d_out, dtype=np.float64)[:, i0:i1]))
            grads[0][:, i0:i1] += qb.grad
            grads[1][:, lo:hi] += kb.grad
            grads[2][:, lo:hi] += vb.grad
            grads[3] += mb.grad
    return out.numpy(), lse.numpy(), None if d_out is None else tuple(x.numpy() for x in grads)


def negligible_beyond(q, k, slopes, exponent: float = 60.0) -> int:
    """A distance past which every key's softmax weight is below e^-exponent for every query: a score is at most
    max|q| max|k| / sqrt(d) above or below any other before its bias, and the bias falls by m per position."""
    reach = np.linalg.norm(q, axis=-1).max() * np.linalg.norm(k, axis=-1).max() / np.sqrt(q.shape[-1])
    return int(np.ceil((2 * reach + exponent) / np.min(slopes)))


def tiled_backward_reference(q, k, v, slopes, out, lse, d_out, causal=False, block=64):
    """(dq, dk, dv, d_slopes) of sum(out * d_out), by torch's autograd through naive ALiBi attention in float64,
    over the keys within ``negligible_beyond`` of each query (every key, for the paper's gentle slopes)."""
    return _attention_in_row_blocks(q, k, v, slopes, causal, d_out=d_out, window=negligible_beyond(q, k, slopes))[2]


def backward_variant(q, k, v, slopes, out, lse, d_out, causal=False, block=64, *, row_term=True, slope_sign=-1.0,
                     scaled=True):
    """The backward pass built whole (FlashAttention-2's equations untiled), with one classic mistake switched on;
    every flag at its default is the right gradient."""
    scores, _ = _scores(q, k, slopes, causal)
    p = np.exp(scores - lse[..., None])  # (H, N, N): the softmax, from the saved log-sum-exp
    ds = p * (d_out @ np.swapaxes(v, -1, -2) - ((d_out * out).sum(axis=-1, keepdims=True) if row_term else 0.0))
    scale = 1 / np.sqrt(q.shape[-1]) if scaled else 1.0
    distance = np.abs(np.arange(q.shape[-2])[:, None] - np.arange(k.shape[-2]))
    return (scale * ds @ k, scale * np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ d_out,
            slope_sign * (ds * distance).sum(axis=(-2, -1)))


BACKWARD_MISTAKES = (
    Mistake("dS = P * (dP - D): the row term D = rowsum(dO * O) is missing (the softmax's Jacobian has two parts)",
            lambda *a, **kw: backward_variant(*a, **kw, row_term=False)),
    Mistake("the slopes' gradient has the wrong sign: the bias is -m |i - j|, so d(score)/dm = -|i - j|",
            lambda *a, **kw: backward_variant(*a, **kw, slope_sign=1.0)),
    Mistake("dq and dk miss the 1/sqrt(d) that scaled the scores",
            lambda *a, **kw: backward_variant(*a, **kw, scaled=False)),
)

exercise(Exercise(
    "tiled_backward",
    visible=lambda: [_backward_case("backward vs autograd", np.random.default_rng(3), 4, 100, 16, 16, b, c)
                     for c in (False, True) for b in (16, 33, 128)],
    hidden=lambda rng: [_backward_case("backward", rng, *shape) for shape in [
        (1, 1, 3, 2, 4, True), (5, 37, 4, 6, 8, True), (12, 50, 8, 3, 7, False), (3, 64, 2, 2, 64, True),
        (2, 9, 5, 5, 1, False)]],
    reference=tiled_backward_reference,
    mistakes=BACKWARD_MISTAKES,
))

MEMORY_SHAPE = (1, 4096, 8)  # H, N, d of the visible case: one (H, N, N) float64 array is 128 MiB; the inputs, 0.8 MiB
PEAK_SHARE = 0.25  # of one such array: float64, float32 and float16 scores all build more than this
# The hidden case's length. Its (N, N) scores are 4 GiB in float32 and 8 GiB in float64: more than one graded
# process may map (sandbox.SandboxPolicy.memory_bytes, 3 GiB) and more than all of a sandbox's processes may hold
# together (4 GiB with its tmpfs). Built whole, they cannot exist in a graded kernel, before the check or during
# it, whatever the notebook did first; float16 or bfloat16 scores lose the output's precision. The memory bound
# holds by what the sandbox is, not by what is measured (the peak below is the lesson, judged on both cases).
HIDDEN_MEMORY_N = 32768  # with block=128: a quarter of the Python loop's turns of block=64, the same arithmetic


class PeakBelow(Expect):
    def __init__(self, one_array: float):
        self.one_array = one_array

    def check(self, got, case, at):
        if not isinstance(got, Leaf) or got.values is None or got.values.shape != ():
            return f"{at}expected the peak in bytes"
        peak = float(got.values)
        return None if peak < PEAK_SHARE * self.one_array else (
            f"peaked at {peak / 2**20:.1f} MiB: {peak / self.one_array:.0%} of one (H, N, N) float64 array "
            f"({self.one_array / 2**20:.0f} MiB), where at most {PEAK_SHARE:.0%} passes; something of size N x N "
            "is being built")


def _memory_case(N: int, block: int, rng: np.random.Generator):
    H, _, d = MEMORY_SHAPE
    q, k, v = rng.normal(size=(3, H, N, d))
    return Case(f"tiled_alibi_attention's peak memory and output at H={H}, N={N}, causal, block={block}",
                (q, k, v, get_slopes(H)), {"causal": True, "block": block}, parts=("the peak", "the output"))


def tiled_memory_reference(q, k, v, slopes, causal=True, block=64, rows=4096):
    """(the peak's bound, the output). Causal, the output is computed ``rows`` queries at a time, each block
    against the keys up to its last query (queries aligned to the end of the keys), by the library's torch path."""
    import torch

    H, N, _ = q.shape
    if not causal:
        return PeakBelow(H * N * N * 8), alibi_attention(q, k, v, slopes)
    as_torch = lambda x: torch.from_numpy(np.ascontiguousarray(x))  # noqa: E731
    out = [alibi_attention(as_torch(q[:, i0:i0 + rows]), as_torch(k[:, :i0 + rows]), as_torch(v[:, :i0 + rows]),
                           slopes, causal=True).numpy()
           for i0 in range(0, N, rows)]  # (H, rows, d_v) each
    return PeakBelow(H * N * N * 8), np.concatenate(out, axis=1)


# the peak: in the student's own session what tracemalloc saw in the kernel; when graded, how far the sandbox's
# memory rose while the check's cell ran, measured by the grader from outside (the kernel's word is the student's)
exercise(Exercise("tiled_memory", visible=lambda: [_memory_case(MEMORY_SHAPE[1], 64, np.random.default_rng(2))],
                  hidden=lambda rng: [_memory_case(HIDDEN_MEMORY_N, 128, rng)], reference=tiled_memory_reference,
                  adapter=peak_and_output, peak_from_grader=True))


LONG_BACKWARD_SLOPE = 0.5  # steep: past a few hundred positions a key weighs below e^-60, so the reference is banded


def _long_backward_case(rng):
    """The backward at HIDDEN_MEMORY_N, causal. Its slope makes far keys' weights vanish in float64, so the
    grader's reference and this case's forward (out, lse) are exact in a band of keys around each query
    (``negligible_beyond``) and take a second; the answer still walks every tile."""
    H, N, d = 1, HIDDEN_MEMORY_N, MEMORY_SHAPE[2]
    q, k, v, d_out = rng.normal(size=(4, H, N, d))
    slopes = np.full(H, LONG_BACKWARD_SLOPE)
    out, lse, _ = _attention_in_row_blocks(q, k, v, slopes, True, window=negligible_beyond(q, k, slopes))
    return Case(f"tiled_alibi_backward at H={H}, N={N}, slope {LONG_BACKWARD_SLOPE}, causal, block=128: no (N, N) "
                "array fits in a graded kernel", (q, k, v, slopes, out, lse, d_out), {"causal": True, "block": 128},
                atol=1e-9, parts=("dq", "dk", "dv", "d_slopes"))


# The backward at the forward's hidden length: its (N, N) weights or their gradient cannot exist in a graded
# kernel (HIDDEN_MEMORY_N says why), so only a backward that keeps no N x N array passes, by what the sandbox is.
# No mistakes are named here: building a variant whole would take the grader 8 GiB (tiled_backward names them).
exercise(Exercise(
    "tiled_backward_long",
    visible=lambda: [],  # called only among the hidden tests: the visible checks are tiled_backward's
    hidden=lambda rng: [_long_backward_case(rng)],
    reference=tiled_backward_reference,
))


# ----------------------------------------------------------------------------- 09: reading the results

def read_results_reference(results):
    L = results["settings"]["context"]
    ppl = results["perplexity"]
    ratio = {m: ppl[m][str(8 * L)] / ppl[m][str(L)] for m in ("alibi", "sinusoidal")}
    finite = {m: r[str(8 * L)] for m, r in ppl.items() if isinstance(r[str(8 * L)], float)}
    return ratio["alibi"], ratio["sinusoidal"], min(finite, key=finite.get)


def run_results(rng):
    """A run's results in the lab's layout, with made-up numbers and L: an answer must read them, not copy them."""
    L = int(rng.choice([32, 64, 128]))
    return {"settings": {"context": L},
            "perplexity": {m: {str(L * f): (float(rng.uniform(1.5, 20)) if m != "learned" or f == 1 else
                                            "error: no position embedding past L") for f in (1, 2, 4, 8, 16)}
                           for m in ("alibi", "sinusoidal", "learned", "rotary", "none")}}


exercise(Exercise(
    "read_results",
    visible=lambda: [Case("read_results on a made-up run's results", (run_results(np.random.default_rng(0)),),
                          atol=1e-9)],
    hidden=lambda rng: [Case(f"read_results on another made-up run ({n + 1})", (run_results(rng),), atol=1e-9)
                        for n in range(3)],
    reference=read_results_reference,
))


# ----------------------------------------------------------------------------- 09: how far each head looks

def mean_lookback_reference(weights, *, sign=1.0, over_keys=np.sum):
    """Each head's mean distance looked back, (H,): sum_j w_ij (i - j) for each query row i, averaged over the
    rows (and any batch dimensions in front). ``sign`` -1 measures j - i; ``over_keys`` np.mean divides by N."""
    w = np.asarray(weights, dtype=np.float64)  # (..., H, N, N)
    N = w.shape[-1]
    distance = sign * (np.arange(N)[:, None] - np.arange(N)[None, :])  # (N, N): i - j
    per_row = over_keys(w * distance, axis=-1)  # (..., H, N)
    return np.moveaxis(per_row, -2, 0).reshape(w.shape[-3], -1).mean(axis=1)


def _causal_weights(rng, shape, slopes):
    """Causal attention weights (*shape, N, N) with heads that reach differently: random content, ALiBi's bias."""
    *front, H, N = shape
    scores = rng.normal(size=(*front, H, N, N)) + variant_bias(slopes, N, N, causal=True)
    return softmax(scores)


def _looking_back(N, distances):
    """(H, N, N) weights, head h putting all of row i on key max(i - distances[h], 0)."""
    rows = np.arange(N)
    weights = np.zeros((len(distances), N, N))
    for h, t in enumerate(distances):
        weights[h, rows, np.maximum(rows - t, 0)] = 1.0
    return weights


def _lookback_cases(rng):
    chosen = []
    for shape in [(4, 12), (2, 3, 9), (1, 1), (6, 40), (2, 2, 5, 7)]:
        slopes = rng.uniform(0.01, 2.0, size=shape[-2])
        chosen.append(Case(f"mean_lookback of causal weights of shape {(*shape, shape[-1])}",
                           (_causal_weights(rng, shape, slopes),), atol=1e-9))
    return chosen


exercise(Exercise(
    "mean_lookback",
    visible=lambda: [Case("mean_lookback of 3 heads that each look back 0, 1 and 2 tokens where the row allows "
                          "(N = 6: 0, 5/6 and 9/6)", (_looking_back(6, (0, 1, 2)),), atol=1e-12),
                     Case("mean_lookback of a batch of causal weights (2, 4, 16, 16)",
                          (_causal_weights(np.random.default_rng(9), (2, 4, 16), get_slopes(4)),), atol=1e-9)],
    hidden=_lookback_cases,
    reference=mean_lookback_reference,
    mistakes=(
        Mistake("the distance is j - i, which is negative for every key before the query: a head looking back "
                "looks back i - j tokens", lambda w: mean_lookback_reference(w, sign=-1.0)),
        Mistake("each row's weighted distances are averaged over the keys (a mean, divided by N again): the "
                "weights already sum to 1, so a row's mean distance is their weighted sum",
                lambda w: mean_lookback_reference(w, over_keys=np.mean)),
    ),
))


# ----------------------------------------------------------------------------- 10: JAX and Flax

def seed_slopes(n_heads: int) -> np.ndarray:
    """The Flax exercise's slopes, 2^(-8 (h + 1) / H) for h = 0 .. H-1: the paper's only for H a power of two."""
    return 2.0 ** (-8.0 * (np.arange(n_heads) + 1) / n_heads)


exercise(Exercise(
    "alibi_bias_jax",
    visible=lambda: [Case("alibi_bias_jax(<slopes 0.0625, 0.00390625>, 4): the exercise's example, under jax.jit",
                          (np.array([0.0625, 0.00390625]), 4), atol=1e-7)],
    # random slopes: with the exercise's own, a table of (H, T) made before the check would do under jit
    hidden=lambda rng: [Case(f"alibi_bias_jax(<{H} random slopes>, {T}) under jax.jit", (rng.uniform(0, 1, H), T),
                             atol=1e-7)
                        for H, T in [(1, 1), (8, 9), (4, 16), (16, 3),
                                     (int(rng.integers(2, 9)), int(rng.integers(2, 20)))]],
    reference=lambda slopes, T: alibi_bias(np.asarray(slopes, float), T),
    mistakes=(Mistake("the bias has the wrong sign: it should penalise distance, -m * |i - j|",
                      lambda slopes, T: alibi_bias(-np.asarray(slopes, float), T)),),
    jax_inputs=True,
    adapter=jitted_with_static_length,
))


def _flax_linen_output(seed, x, num_heads, qkv_features, *, slopes=None, sign=-1.0, as_mask=False, biased=True):
    """The seed's mha_alibi, right or with one of its pitfalls: Flax MHA, init from ``jax.random.key(seed)``."""
    import jax
    import jax.numpy as jnp
    from flax import linen

    x = jnp.asarray(x, jnp.float32)
    slopes = seed_slopes(num_heads) if slopes is None else slopes
    bias = jnp.asarray(alibi_bias(-sign * np.asarray(slopes, float), x.shape[-2]), jnp.float32)  # (H, T, T)

    def alibi_fn(query, key, value, mask=None, **kwargs):
        return linen.dot_product_attention(query, key, value, bias=bias if biased else None, mask=mask, **kwargs)

    layer = linen.MultiHeadDotProductAttention(num_heads=num_heads, qkv_features=qkv_features,
                                               attention_fn=linen.dot_product_attention if as_mask else alibi_fn)
    params = layer.init(jax.random.key(seed), x)
    return np.asarray(layer.apply(params, x, mask=bias if as_mask else None)).ravel()


def _flax_cases(rng):
    # powers of two only: there the exercise's slopes are the paper's, whichever an answer uses
    return [Case(f"mha_alibi({seed}, <x of shape {(T, D)}>, num_heads={H}, qkv_features={F})",
                 (seed, rng.normal(size=(T, D)), H, F), atol=1e-6)
            # two shapes: JAX compiles each operation of init and apply once per new shape (about a second)
            for seed, T, D, H, F in [(int(rng.integers(100)), 12, 6, 8, 16), (7, 9, 3, 4, 32)]]


_FLAX_MISTAKES = (
    Mistake("the bias has the wrong sign: it should penalise distance, -m * |i - j|",
            lambda *a: _flax_linen_output(*a, sign=1.0)),
    Mistake("the bias went in as mask=: Flax keeps a score where the mask is non-zero and drops it where it is 0, "
            "so ALiBi's zero diagonal was dropped and its penalties lost. Add it as bias= inside attention_fn",
            lambda *a: _flax_linen_output(*a, as_mask=True)),
    Mistake("this is plain attention: the bias never reached the scores (is attention_fn passed to the layer, "
            "and does it hand bias= on to dot_product_attention?)", lambda *a: _flax_linen_output(*a, biased=False)),
    Mistake("the slopes are shifted by one head: 2^(-8 h / H) with h from 0 gives the first head slope 1; "
            "use h + 1", lambda seed, x, H, F: _flax_linen_output(seed, x, H, F,
                                                                 slopes=2.0 ** (-8.0 * np.arange(H) / H))),
)

exercise(Exercise(
    "mha_alibi_flax",  # the source's function name, mha_alibi, is notebook 07's exercise already
    visible=lambda: [Case("mha_alibi(0, <x of shape (4, 8)>, num_heads=2, qkv_features=8)",
                          (0, np.random.default_rng(10).normal(size=(4, 8)), 2, 8), atol=1e-6)],
    hidden=_flax_cases,
    reference=_flax_linen_output,
    mistakes=_FLAX_MISTAKES,
    upstream=("alibi_bias_jax",),
    jax_inputs=True,
))


def _flax_nnx_output(seed, x, num_heads, qkv_features, biased=True):
    """The same layer in flax.nnx: nnx.MultiHeadAttention built with ``rngs=nnx.Rngs(seed)`` (without
    ``attention_fn`` where not ``biased``: plain attention)."""
    import jax.numpy as jnp
    from flax import nnx

    x = jnp.asarray(x, jnp.float32)
    bias = jnp.asarray(alibi_bias(seed_slopes(num_heads), x.shape[-2]), jnp.float32)

    def alibi_fn(query, key, value, mask=None, **kwargs):
        return nnx.dot_product_attention(query, key, value, bias=bias, mask=mask, **kwargs)

    layer = nnx.MultiHeadAttention(num_heads=num_heads, in_features=x.shape[-1], qkv_features=qkv_features,
                                   decode=False, rngs=nnx.Rngs(seed),
                                   attention_fn=alibi_fn if biased else nnx.dot_product_attention)
    return np.asarray(layer(x)).ravel()


exercise(Exercise(
    "mha_alibi_nnx",
    visible=lambda: [Case("mha_alibi_nnx(0, <x of shape (4, 8)>, num_heads=2, qkv_features=8)",
                          (0, np.random.default_rng(10).normal(size=(4, 8)), 2, 8), atol=1e-6)],
    hidden=lambda rng: [Case(c.label.replace("mha_alibi(", "mha_alibi_nnx("), c.args, atol=1e-6)
                        for c in _flax_cases(rng)],
    reference=_flax_nnx_output,
    mistakes=(Mistake("this is plain attention: the bias never reached the scores (is attention_fn passed to "
                      "nnx.MultiHeadAttention, and does it hand bias= on to nnx.dot_product_attention?)",
                      lambda *a: _flax_nnx_output(*a, biased=False)),),
    upstream=("alibi_bias_jax",),
    jax_inputs=True,
))

