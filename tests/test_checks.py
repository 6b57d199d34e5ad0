"""The notebooks' checks: values handed back as data, verdicts reached apart from the answer, mistakes named."""

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from alibi_ref import get_slopes
from alibi_ref.course import checks, exercises, model
from alibi_ref.course import judge as judging
from alibi_ref.course.checks import run
from alibi_ref.course.judge import judge
from alibi_ref.course.model import EXERCISES, Case
from alibi_ref.course.wire import MAX_SEQUENCE, MIME, decode, encode
from autograder.screen import screen_notebook
from autograder.verdicts import JudgeChecks, check_calls, source_check_calls

SOLUTION = {
    "alibi_bias_torch": '''
def alibi_bias_torch(slopes, q_len, k_len, causal=False):
    i = torch.arange(q_len, device=slopes.device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=slopes.device)[None, :]
    bias = -slopes.float()[:, None, None] * (i - j).abs()
    if causal:
        bias = bias.masked_fill(j > i, float("-inf"))
    return bias.to(slopes.dtype)
''',
    "paper_slopes": '''
def paper_slopes(n_heads, max_bias=8.0):
    def geometric(n):
        return 2.0 ** (-max_bias * np.arange(1, n + 1) / n)
    p = 2 ** int(np.floor(np.log2(n_heads)))
    if p == n_heads:
        return geometric(n_heads)
    return np.concatenate([geometric(p), geometric(2 * p)[0::2][: n_heads - p]])
''',
    "alibi_bias": '''
def alibi_bias(slopes, q_len, k_len=None, causal=False):
    slopes = np.asarray(slopes, dtype=np.float64)
    k_len = q_len if k_len is None else k_len
    i = np.arange(q_len)[:, None] + (k_len - q_len)
    j = np.arange(k_len)[None, :]
    bias = -slopes[:, None, None] * np.abs(i - j)
    if causal:
        bias = np.where(j > i, -np.inf, bias)
    return bias
''',
    "softmax": '''
def softmax(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
''',
    "alibi_head": '''
def alibi_head(Qh, Kh, Vh, slope):
    N, d_k = Qh.shape
    distance = np.abs(np.arange(N)[:, None] - np.arange(N)[None, :])
    weights = softmax(Qh @ Kh.T / np.sqrt(d_k) - slope * distance)
    return weights, weights @ Vh
''',
    "decode_step": '''
def decode_step(q_new, K_cache, V_cache, slope):
    t = K_cache.shape[0] - 1
    scores = K_cache @ q_new / np.sqrt(q_new.shape[0]) - slope * (t - np.arange(t + 1))
    e = np.exp(scores - scores.max())
    return e / e.sum() @ V_cache
''',
    "causal_alibi_scores": '''
def causal_alibi_scores(Qh, Kh, slope):
    N, d_k = Qh.shape
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    return np.where(j > i, -np.inf, Qh @ Kh.T / np.sqrt(d_k) - slope * (i - j))
''',
}


def answer(name: str, *edits, extra: str = ""):
    """A notebook namespace holding the solution of ``name`` with ``edits`` (old, new) applied."""
    source = SOLUTION[name]
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    namespace = {"np": np, "torch": torch}
    exec(SOLUTION["softmax"] + extra + source, namespace)
    return namespace[name], namespace


def verdict(name, fn, seed=None):
    payload = json.loads(json.dumps(run(name, fn, seed)))  # through JSON, as it crosses from the kernel
    return judge(payload)


# ----------------------------------------------------------------------------- values as data

def test_values_cross_as_data_with_their_dtype_and_device():
    tensor = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    value = (tensor, {"a": np.float32(1.5), "b": [1.0, np.inf]}, "alibi", None)
    got = decode(json.loads(json.dumps(encode(value))))
    leaf = got[0]
    assert (leaf.kind, leaf.dtype, leaf.device, leaf.shape) == ("tensor", "bfloat16", "cpu", (2, 3))
    assert np.array_equal(leaf.values, np.arange(6.0).reshape(2, 3))
    assert got[1]["a"].dtype == "float32" and float(got[1]["a"].values) == 1.5
    assert np.array_equal(got[1]["b"].values, [1.0, np.inf])
    assert got[2:] == ("alibi", None)
    meta = decode(encode(torch.ones(4, 5, device="meta")))
    assert (meta.values, meta.device, meta.shape) == (None, "meta", (4, 5))


@pytest.mark.parametrize("bad", [{}, {"array": "!!", "shape": [1], "dtype": "f", "device": "cpu"},
                                 {"array": "AAAAAAAAAAA=", "shape": [3], "dtype": "f", "device": "cpu"},
                                 {"scalar": [1]}, {"array": "", "shape": [-1], "dtype": "f", "device": "cpu"}])
def test_malformed_values_are_refused(bad):
    with pytest.raises((ValueError, TypeError)):
        decode(bad)


def test_the_judge_reads_only_values_and_refuses_a_wrong_count():
    fn, _ = answer("paper_slopes")
    payload = run("paper_slopes", fn)
    payload["passed"] = True  # claims are not read
    assert judge(payload).passed
    payload["results"] = payload["results"][:-1]
    with pytest.raises(ValueError, match="results for"):
        judge(payload)


# ----------------------------------------------------------------------------- verdicts

def test_the_solutions_pass_visible_and_hidden():
    for name in ("paper_slopes", "alibi_bias", "softmax", "alibi_head", "decode_step", "causal_alibi_scores",
                 "alibi_bias_torch"):  # its hidden cases read part of the value (a pick) inside the guard
        fn, _ = answer(name)
        for seed in (None, 3):
            v = verdict(name, fn, seed)
            assert v.passed, v.message


def test_float32_answers_earn_the_points_and_a_real_error_does_not():
    fn, _ = answer("alibi_head", ("return weights, weights @ Vh",
                                  "return weights.astype(np.float32), (weights @ Vh).astype(np.float32)"))
    assert verdict("alibi_head", fn, 1).passed
    off, _ = answer("alibi_head", ("return weights, weights @ Vh", "return weights + 1e-3, weights @ Vh"))
    v = verdict("alibi_head", off, 1)
    assert not v.passed and "entries are off" in v.message and "Worst:" in v.message
    assert "\n" not in v.message.split("Hint:")[0].strip(), "one short message, no numpy report"


def test_exact_cases_allow_no_slack():
    case = Case("c", atol=0.0, exact=True)
    assert judging.compare_arrays(np.array([1e-7]), np.array([0.0]), case) is not None
    assert judging.compare_arrays(np.array([1e-7]), np.array([0.0]), Case("c", atol=0.0)) is None


@pytest.mark.parametrize(("name", "edits", "hint"), [
    ("paper_slopes", [("    if p == n_heads:\n        return geometric(n_heads)\n", "    return geometric(n_heads)\n")],
     "one geometric sequence"),
    ("alibi_bias", [("bias = -slopes", "bias = slopes")], "wrong sign"),
    ("alibi_bias", [("+ (k_len - q_len)", "")], "start of the keys"),
    ("alibi_bias", [("np.where(j > i", "np.where(j < i")], "wrong triangle"),
    ("alibi_bias", [("np.abs(i - j)", "(i - j)")], "distance is signed"),
    ("alibi_head", [("np.abs(np.arange(N)[:, None] - np.arange(N)[None, :])",
                     "np.arange(N)[:, None] - np.arange(N)[None, :]")], "distance is signed"),
    ("alibi_head", [("/ np.sqrt(d_k)", "")], "not divided by sqrt(d)"),
    ("alibi_head", [("softmax(Qh @ Kh.T / np.sqrt(d_k) - slope * distance)",
                     "softmax(Qh @ Kh.T / np.sqrt(d_k) - slope * distance / np.sqrt(d_k))")], "divided by sqrt(d) too"),
    ("causal_alibi_scores", [("np.where(j > i, -np.inf, Qh @ Kh.T / np.sqrt(d_k) - slope * (i - j))",
                              "Qh @ Kh.T / np.sqrt(d_k) - slope * np.abs(i - j)")], "symmetric"),
    ("decode_step", [("(t - np.arange(t + 1))", "np.arange(t + 1)")], "position 0"),
    # the same weights by softmax's shift invariance: one hint names both
    ("decode_step", [("- slope * (t", "+ slope * (t")], "flipping the bias's sign"),
    ("softmax", [("np.exp(x - x.max(axis=-1, keepdims=True))", "np.exp(x)")], "exp overflows"),
])
def test_classic_mistakes_are_named(name, edits, hint):
    fn, _ = answer(name, *edits)
    v = verdict(name, fn, 5)
    assert not v.passed
    assert "Hint:" in v.message and hint in v.message, v.message


def test_the_mistakes_of_the_tiled_pass_switch_off_to_the_right_answer():
    """The backward pass's mistakes are flags on FlashAttention-2's equations built whole: at their defaults they
    are autograd's gradients. The online softmax without rescaling is right wherever one key tile holds every key."""
    for case in model.cases("tiled_backward", 11):
        got = exercises.backward_variant(*case.args, **case.kwargs)
        for mine, autograd in zip(got, exercises.tiled_backward_reference(*case.args, **case.kwargs), strict=True):
            np.testing.assert_allclose(mine, autograd, atol=1e-10, err_msg=case.label)
    q, k, v = np.random.default_rng(0).normal(size=(3, 2, 9, 4))
    for causal in (False, True):
        right = exercises.tiled_reference(q, k, v, get_slopes(2), causal=causal)
        np.testing.assert_allclose(exercises._tiled_without_rescaling(q, k, v, get_slopes(2), causal, block=9), right)
        assert not np.allclose(exercises._tiled_without_rescaling(q, k, v, get_slopes(2), causal, block=2), right)
    # a wrong gradient is named as the prompt names it, with the mistake's hint
    v = verdict("tiled_backward", lambda *args, **kwargs: exercises.backward_variant(*args, **kwargs, scaled=False))
    assert not v.passed and ": dq: " in v.message and "miss the 1/sqrt(d)" in v.message, v.message


def _as_an_answer_returns(value, ex, case):
    """A NumPy value as an answer to ``ex`` returns it: a tensor (the case's dtype, else float64) where the
    exercise hands its answers tensors, a JAX array (float32 unless the case says) where JAX arrays. Of the
    values an exercise accepts (``AnyOf``), the first."""
    if isinstance(value, exercises.AnyOf):
        value = value.values[0]
    if isinstance(value, (tuple, list)):
        return type(value)(_as_an_answer_returns(v, ex, case) for v in value)
    if not isinstance(value, np.ndarray):
        return value
    if ex.torch_inputs:
        return torch.tensor(value, dtype=getattr(torch, case.dtype or "float64") if value.dtype.kind == "f" else None)
    if ex.jax_inputs:
        import jax.numpy as jnp

        return jnp.asarray(value, dtype=case.dtype or "float32")
    return value


def _given(case, packed, ex, spec):
    """What a right answer hands back for a case whose value the exercise gives (a literal, a shape on the meta
    device): that value, as the kernel encodes it."""
    if isinstance(case.expected, exercises.MetaShape):
        return {"value": encode(torch.empty(case.expected.shape, device="meta")), "device": "meta"}
    if isinstance(case.expected, np.ndarray):
        return {"value": encode(torch.tensor(case.expected, dtype=getattr(torch, case.dtype or "float64"))),
                "device": "cpu"}
    return checks._call(ex.reference, packed, spec, None)


@pytest.mark.parametrize("name", sorted(name for name, ex in EXERCISES.items() if ex.mistakes))
def test_every_classic_mistake_fails_the_hidden_checks_and_is_named_whatever_the_graders_secret(name):
    """The hidden cases are drawn from the grader's secret, different for every class: each draw must tell
    every named mistake from the right answer (and from the other mistakes, so its hint is the right one).
    The mistaken answer returns the mistake's values where the reference computes the expected ones, and
    the given value where a case's value is given (a mistake is named only where the answer ran on every case)."""
    ex = EXERCISES[name]
    for secret in (bytes(range(i, i + 32)) for i in (1, 77, 190)):
        for mistake in ex.mistakes:
            try:
                v = judge({"exercise": name, "seed": 7, "results": _mistaken(ex, mistake, 7, secret)}, secret)
            except ValueError:  # the mistaken code raises on a hidden shape, as the student's does (softmax without
                # keepdims): that case fails the check and names nothing; the visible cases name it
                results = _mistaken(ex, mistake, 7, secret, raising=True)
                assert not judge({"exercise": name, "seed": 7, "results": results}, secret).passed
                v = judge({"exercise": name, "seed": None, "results": _mistaken(ex, mistake, None, None)})
            assert not v.passed and mistake.hint in v.message, (secret.hex()[:8], mistake.hint, v.message)


def _mistaken(ex, mistake, seed, secret, raising=False) -> list:
    """What a kernel hands back for an answer that makes ``mistake``, on one check call's cases: the mistake's
    values where the reference computes the expected ones, the given value where a case's value is given; with
    ``raising``, the error where the mistaken code raises, as the kernel reports it."""
    chosen = model.cases(ex.name, seed, secret)
    spec = json.loads(json.dumps(model.kernel_cases(ex.name, seed, secret)))  # what a graded kernel reads
    results = []
    for c, k in zip(chosen, spec["cases"], strict=True):
        if c.expected is not None or c.raises:
            results.append(_given(c, k, ex, spec))
        elif raising:
            results.append(checks._call(mistake.variant, k, spec, None))
        else:
            with np.errstate(all="ignore"):  # the mistakes overflow as such answers do
                results.append({"value": encode(_as_an_answer_returns(mistake.variant(*c.args, **c.kwargs), ex, c)),
                                "device": "cpu" if ex.torch_inputs else None})
    return results


SCORE_MOD = """
def alibi_score_mod(slopes, causal=False):
    def score_mod(score, b, h, q_idx, kv_idx):
        biased = score - slopes[h] * (q_idx - kv_idx).abs()
        return torch.where(kv_idx <= q_idx, biased, -float("inf")) if causal else biased
    return score_mod
"""


@pytest.mark.parametrize(("edit", "expect"), [
    (None, None),
    (("score - slopes[h]", "score + slopes[h]"), "wrong sign"),
    (("biased = score - ", "biased = 0 * score - "), "entries are off"),  # drops the score: caught visibly
    (("kv_idx <= q_idx", "kv_idx >= q_idx"), "wrong triangle"),
])
def test_score_mod_is_judged_as_flex_attention_calls_it(edit, expect):
    source = SCORE_MOD if edit is None else SCORE_MOD.replace(*edit)
    namespace = {"torch": torch}
    exec(source, namespace)
    for seed in (None, 15):
        v = verdict("alibi_score_mod", namespace["alibi_score_mod"], seed)
        if expect is None:
            assert v.passed, v.message
        elif seed is None:  # every one of these shows in the visible checks already
            assert not v.passed and expect in v.message, v.message


def test_softmax_over_the_wrong_axis_is_named():
    fn, _ = answer("softmax", ("x.max(axis=-1", "x.max(axis=0"), ("e.sum(axis=-1", "e.sum(axis=0"))
    v = verdict("softmax", fn, 1)
    assert "wrong axis" in v.message, v.message


def test_a_wrong_upstream_costs_only_its_own_exercise():
    fn, namespace = answer("alibi_head")
    namespace["softmax"] = lambda x: np.zeros_like(np.asarray(x, float))  # the student's own, wrong
    v = verdict("alibi_head", fn, 2)
    assert v.passed and "with a correct softmax in place of yours" in v.message
    assert namespace["softmax"](np.ones(2)).sum() == 0, "the student's namespace is left as it was"
    wrong_too, namespace = answer("alibi_head", ("/ np.sqrt(d_k)", ""))
    namespace["softmax"] = lambda x: np.zeros_like(np.asarray(x, float))
    assert not verdict("alibi_head", wrong_too, 2).passed, "a correct softmax does not rescue a wrong head"


def test_an_answer_tied_to_the_cpu_is_told_why_the_meta_device_fails_it():
    """07.1's meta case: a bias built with device="cpu" is right on the CPU and raises on meta, where no mistake
    can be named (it ran on no value); the message says what ties a function to one device."""
    fn, _ = answer("alibi_bias_torch", ("device=slopes.device)[:, None]", 'device="cpu")[:, None]'),
                   ("device=slopes.device)[None, :]", 'device="cpu")[None, :]'))
    v = verdict("alibi_bias_torch", fn)
    assert not v.passed and "meta device" in v.message and "device='cpu'" in v.message, v.message


MHA_SEEDED_AFTER_BUILDING = '''
def mha_alibi(seed, x, num_heads, qkv_features):
    mha = nn.MultiheadAttention(qkv_features, num_heads).to(device=x.device, dtype=x.dtype)
    torch.manual_seed(seed)  # too late: the weights were drawn from whatever the generator held
    slopes = torch.as_tensor(get_slopes(num_heads), device=x.device, dtype=x.dtype)
    return mha(x, x, x, attn_mask=alibi_bias_torch(slopes, x.shape[0], x.shape[0]), need_weights=False)[0].flatten()
'''


def test_a_correct_upstream_is_never_blamed_nor_a_failing_exercise_called_right_in_the_session():
    """07's pitfall: a layer built before seeding differs on each call, so a second run (once the first has seeded)
    can pass where the first failed. Its upstream, alibi_bias_torch, passes its own check: nothing is lent, the
    exercise fails as grading fails it, and the message blames no other piece. Lent where the upstream fails."""
    from torch import nn

    namespace = {"torch": torch, "nn": nn, "get_slopes": get_slopes}
    exec(SOLUTION["alibi_bias_torch"] + MHA_SEEDED_AFTER_BUILDING, namespace)
    torch.manual_seed(123)  # what the generator holds before the check: not the seed the case asks for
    v = verdict("mha_alibi", namespace["mha_alibi"])
    assert not v.passed and "alibi_bias_torch" not in v.message, v.message
    assert run("mha_alibi", namespace["mha_alibi"]).get("upstream") is None
    fn, namespace = answer("alibi_head")
    namespace["softmax"] = lambda x: np.zeros_like(np.asarray(x, float))
    assert run("alibi_head", fn)["upstream"] == ["softmax"]  # the student's softmax fails its own check: lent


def _mha_alibi(built_in_dtype: bool, as_bool: bool = False):
    from torch import nn

    def mha_alibi(seed, x, num_heads, qkv_features):
        if x.shape[-1] != qkv_features:
            raise ValueError("features")
        torch.manual_seed(seed)
        if built_in_dtype:  # "on x's device and dtype", as PyTorch's factory arguments say it
            mha = nn.MultiheadAttention(qkv_features, num_heads, device=x.device, dtype=x.dtype)
        else:
            mha = nn.MultiheadAttention(qkv_features, num_heads).to(device=x.device, dtype=x.dtype)
        slopes = torch.as_tensor(get_slopes(num_heads), device=x.device, dtype=x.dtype)
        i = torch.arange(x.shape[0], device=x.device)
        bias = -slopes[:, None, None] * (i[:, None] - i[None, :]).abs()
        return mha(x, x, x, attn_mask=bias.bool() if as_bool else bias, need_weights=False)[0].flatten()

    return mha_alibi


@pytest.mark.parametrize("built_in_dtype", [False, True])
def test_mha_alibi_built_either_way_earns_the_points_and_its_pitfall_is_named(built_in_dtype):
    # built in float64, the layer's weights are drawn in float64: every entry differed from the float32 draw's
    for seed in (None, 14):
        v = verdict("mha_alibi", _mha_alibi(built_in_dtype), seed)
        assert v.passed, v.message
    v = verdict("mha_alibi", _mha_alibi(built_in_dtype, as_bool=True))
    assert not v.passed and "boolean mask" in v.message, v.message


def test_an_answer_that_raises_is_shown_its_own_line_not_the_libraries(tmp_path):
    cell = tmp_path / "cell.py"  # a notebook cell's code has a file of its own, as IPython compiles it
    cell.write_text("import numpy as np\n\ndef paper_slopes(n):\n    return np.ones(n) @ np.ones(n + 1)\n")
    namespace = {}
    exec(compile(cell.read_text(), str(cell), "exec"), namespace)
    v = verdict("paper_slopes", namespace["paper_slopes"])
    assert "raised ValueError: matmul" in v.message, v.message
    assert "(in paper_slopes, line 4: return np.ones(n) @ np.ones(n + 1))" in v.message, v.message


def test_an_answer_that_raises_gets_its_error():
    fn, _ = answer("paper_slopes", ("    def geometric(n):", "    raise RuntimeError('not yet')\n\n"
                                                         "    def geometric(n):"))
    assert "raised RuntimeError: not yet" in verdict("paper_slopes", fn).message
    # the stub itself says it is not answered yet, the first thing every student sees
    stub = "    raise NotImplementedError()\n\n    def geometric(n):"
    fn, _ = answer("paper_slopes", ("    def geometric(n):", stub))
    assert verdict("paper_slopes", fn).message.startswith(
        "paper_slopes(8): raised NotImplementedError, as the answer cell does before it is answered: not answered yet")


def test_an_answer_that_changes_its_inputs_in_place_changes_no_other_case():
    # the visible cases share the chapter's K and V, the hidden ones their caches: scaling q_new or the keys in
    # place is sloppy but right, and must not move the next case's inputs (nor the example later cells use)
    example_K = exercises.K.copy()
    fn, _ = answer("decode_step", ("    scores = K_cache @ q_new / np.sqrt(q_new.shape[0])",
                                   "    K_cache /= np.sqrt(q_new.shape[0])\n    scores = K_cache @ q_new"))
    for seed in (None, 4):
        v = verdict("decode_step", fn, seed)
        assert v.passed, v.message
    assert np.array_equal(exercises.K, example_K)


def _inputs_key(args, kwargs) -> str:
    """The inputs of a call as text: arrays, tensors and JAX arrays by their values (a meta tensor by its
    shape), so a copy of the case's array finds its entry."""
    def text(x):
        if isinstance(x, torch.Tensor):
            return f"meta{tuple(x.shape)}" if x.is_meta else text(x.detach().double().numpy())
        if "jax" in sys.modules and isinstance(x, sys.modules["jax"].Array):
            return text(np.asarray(x))
        if isinstance(x, np.ndarray):
            return f"array{x.shape}{x.astype(float).tobytes().hex() if x.dtype.kind in 'fiub' else repr(x)}"
        if isinstance(x, (list, tuple)):
            return "[" + ",".join(map(text, x)) + "]"
        if isinstance(x, dict):
            return "{" + ",".join(f"{k}:{text(v)}" for k, v in sorted(x.items())) + "}"
        return repr(x)
    return text((args, kwargs))


def _in_float32(value):
    return value.astype(np.float32) if isinstance(value, np.ndarray) and value.dtype.kind == "f" else value


HONEST_FORMS = {  # name -> what it does to the reference's value, and whether it changes the inputs in place
    "as is": (lambda v: v, False),
    "float32": (lambda v: tuple(map(_in_float32, v)) if isinstance(v, tuple) else _in_float32(v), False),
    "nested lists": (lambda v: tuple(x.tolist() if isinstance(x, np.ndarray) else x for x in v)
                     if isinstance(v, tuple) else v.tolist() if isinstance(v, np.ndarray) else v, False),
    "read-only": (lambda v: np.broadcast_to(v, v.shape) if isinstance(v, np.ndarray) else v, False),
    "Fortran order": (lambda v: np.asfortranarray(v) if isinstance(v, np.ndarray) and v.ndim > 1 else v, False),
    "a list for a tuple": (lambda v: list(v) if isinstance(v, tuple) else v, False),
    "inputs changed in place": (lambda v: v, True),
}


# hidden-only checks (tiled_backward_long: tiled_backward's answer at N = 32768) hand back what a checked twin does
@pytest.mark.parametrize("name", sorted(name for name, ex in EXERCISES.items() if not (
    ex.adapter or ex.torch_inputs or ex.jax_inputs or any(c.expected is not None for c in model.cases(name, None))
    or not ex.visible()
)))
def test_the_right_values_in_every_form_an_honest_answer_returns_them_earn_the_points(name):
    """Each NumPy exercise, answered with the reference's own values (looked up by the inputs, made outside
    the check) in the forms students hand them back: the judge must pass every one, visible and hidden. Two
    of these failed before: inputs changed in place (the cases share arrays) and nested lists."""
    ex = EXERCISES[name]
    for seed in (None, 5):
        values = {_inputs_key(c.args, c.kwargs): ex.reference(*c.args, **c.kwargs) for c in model.cases(name, seed)}
        for form, (returned, in_place) in HONEST_FORMS.items():
            def honest(*args, values=values, returned=returned, in_place=in_place, **kwargs):
                value = values[_inputs_key(args, kwargs)]
                for x in [*args, *kwargs.values()] if in_place else ():
                    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
                        x += 1.0
                return returned(value)

            v = verdict(name, honest, seed)
            assert v.passed, (form, seed, v.message)


TENSOR_FORMS = {  # what honest torch code hands back: none of it changes the values
    "as is": lambda t: t,
    "non-contiguous (a transpose's view)": lambda t: t.mT.contiguous().mT if t.ndim >= 2 else t,
    "still on the autograd graph": lambda t: t.detach().requires_grad_(True) * 1.0 if not t.is_meta else t,
    "an nn.Parameter": lambda t: torch.nn.Parameter(t.detach().clone()),
    "a view of a larger tensor": lambda t: t[None].expand(2, *t.shape)[1],
    "a list of tensors (one per head or batch row)": lambda t: list(t.unbind(0)) if not t.is_meta else t,
}


@pytest.mark.parametrize("name", sorted(name for name, ex in EXERCISES.items() if ex.torch_inputs and not ex.adapter))
def test_torch_answers_in_every_form_honest_code_returns_a_tensor_earn_the_points(name):
    """Each torch exercise, answered with the reference's values as a tensor on the inputs' device and in
    their dtype, in the forms honest torch code hands back (a transpose's view, a result that still
    requires grad, a Parameter, an expanded view, a list of per-head tensors), changing its inputs in
    place as it goes (``q.mul_(scale)``): the judge passes every one, visible and hidden."""
    from alibi_ref.course.exercises import AnyOf, MetaShape

    def as_tensor(case, expected, args):
        like = next(a for a in args if isinstance(a, torch.Tensor))
        dtype = getattr(torch, case.dtype) if case.dtype else like.dtype
        if isinstance(expected, MetaShape):
            return torch.empty(expected.shape, dtype=dtype, device="meta")
        expected = expected.values[0] if isinstance(expected, AnyOf) else expected
        tensor = torch.as_tensor(np.asarray(expected), dtype=dtype, device=like.device)
        if case.pick is not None:  # the check slices the whole bias itself: hand back one it slices to this
            whole = torch.zeros((1, 1, case.args[2]), dtype=dtype, device=like.device)
            whole[0, 0, -3:] = tensor
            return whole
        return tensor

    for seed in (None, 5):
        values = {}
        for case, expected in zip(model.cases(name, seed), judging.expected_values(name, seed), strict=True):
            device = case.device or "cpu"
            args = tuple(checks._to_torch(a, device, case.input_dtype) for a in case.args)
            kwargs = {k: checks._to_torch(v, device, case.input_dtype) for k, v in case.kwargs.items()}
            values[_inputs_key(args, kwargs)] = (case, None if case.raises else as_tensor(case, expected, args))
        for form, returned in TENSOR_FORMS.items():
            def honest(*args, values=values, returned=returned, **kwargs):
                case, tensor = values[_inputs_key(args, kwargs)]
                if case.raises:
                    raise ValueError("x's features do not match qkv_features")
                for x in [*args, *kwargs.values()]:
                    if isinstance(x, torch.Tensor) and x.is_floating_point() and not x.is_meta:
                        x.mul_(0.5)
                return returned(tensor)

            v = verdict(name, honest, seed)
            assert v.passed, (form, seed, v.message)


@pytest.mark.parametrize("name", sorted(name for name, ex in EXERCISES.items() if ex.jax_inputs and not ex.adapter))
def test_flax_answers_as_a_jax_array_a_numpy_array_or_a_list_earn_the_points(name):
    """The Flax layers' outputs (float32, flattened), handed back as the layer gives them (a JAX array),
    through np.asarray, or as a list: each passes, visible and hidden."""
    import jax.numpy as jnp

    forms = {"a JAX array": jnp.asarray, "a NumPy array": np.asarray, "a list": lambda v: np.asarray(v).tolist()}
    for seed in (None, 5):
        values = {}
        for case, expected in zip(model.cases(name, seed), judging.expected_values(name, seed), strict=True):
            jax_args = tuple(checks._to_jax(a, case.input_dtype) for a in case.args)
            values[_inputs_key(jax_args, {})] = np.asarray(expected, np.float32)
        for form, returned in forms.items():
            def honest(*args, values=values, returned=returned):
                return returned(values[_inputs_key(args, {})])

            v = verdict(name, honest, seed)
            assert v.passed, (form, seed, v.message)


def test_numbers_handed_back_as_lists_are_the_array_they_make():
    # nested lists (a bias built with loops), a list of numpy scalars, a list of per-head arrays: as
    # np.asarray reads them; a ragged list is named as what it is
    fn, _ = answer("alibi_bias", ("    return bias", "    return [[list(row) for row in head] for head in bias]"))
    assert verdict("alibi_bias", fn, 2).passed
    fn, _ = answer("alibi_bias", ("    return bias", "    return [np.float32(x) for x in bias.ravel()]"))
    assert "expected shape (2, 5, 5), got (50,)" in verdict("alibi_bias", fn).message
    fn, _ = answer("alibi_head", ("return weights, weights @ Vh", "return list(weights), [r for r in weights @ Vh]"))
    assert verdict("alibi_head", fn, 1).passed
    fn, _ = answer("alibi_bias", ("    return bias", "    return [list(head[:, :-1]) if h else head for h, head in "
                                                   "enumerate(bias)]"))
    assert "got a list or tuple of 2 items that do not make one array of numbers" in verdict("alibi_bias", fn).message
    halves = decode(encode([np.float32(0.25), np.float32(0.75)]))  # an expectation reads them as numbers too
    assert judging.compare(halves, exercises.SumsTo(1.0), Case("the sum")) is None
    long = [[0.0]] * (MAX_SEQUENCE + 1)
    assert decode(encode(long)).what.startswith(f"a sequence of {MAX_SEQUENCE + 1} items")
    # inside a list of heads too, the feedback says what the wire could not carry, and what to return instead
    message = judging.compare(decode(encode([long])), np.zeros((1, MAX_SEQUENCE + 1, 1)), Case("deep"))
    assert f"in it a sequence of {MAX_SEQUENCE + 1} items (at most {MAX_SEQUENCE}: return an array)" in message


# ----------------------------------------------------------------------------- the guard

def test_a_table_of_the_references_values_made_before_the_check_cannot_pass_the_hidden_checks():
    """The guard watches only the check; a table filled with the reference beforehand (an answer cell may call
    a course helper that holds it, like plots.get_slopes) would pass hidden cases drawn from a small set.
    Inputs drawn from a continuum make that table impossible: here a table over every head count to 128 and
    every whole max_bias to 16, which holds all the visible cases, fails the hidden ones."""
    table = {(n, float(mb)): get_slopes(n, max_bias=float(mb)) for n in range(1, 129) for mb in range(1, 17)}

    def from_the_table(n, max_bias=8.0):
        return table[n, float(max_bias)]

    assert verdict("paper_slopes", from_the_table).passed
    v = verdict("paper_slopes", from_the_table, seed=2022)
    assert not v.passed and "raised KeyError" in v.message, v.message
    # constant_slopes' value likewise: a table over every hundredth up to 2
    constants = {(n, round(c / 100, 2)): get_slopes(n, "constant", constant=c / 100) for n in range(1, 33)
                 for c in range(1, 201)}

    def constant_from_the_table(n, value=0.25):
        return constants[n, value]

    assert verdict("constant_slopes", constant_from_the_table).passed
    v = verdict("constant_slopes", constant_from_the_table, seed=2022)
    assert not v.passed and "raised KeyError" in v.message, v.message
    assert verdict("constant_slopes", lambda n, value=0.25: np.full(n, value), seed=2022).passed  # the one line


# ----------------------------------------------------------------------------- what a graded kernel sees

VIEW_PROBE = """
import json, sys, sysconfig
sys.path[:0] = [sys.argv[1], sysconfig.get_paths()["purelib"]]  # no .pth: no editable install's finder
found = {}
for name in ("alibi_ref.attention", "alibi_ref.bias", "alibi_ref.slopes", "alibi_ref.course.exercises",
             "alibi_ref.course.judge", "alibi_ref.course.upstream", "alibi_ref.course.chapter"):
    try:
        __import__(name)
        found[name] = True
    except ImportError:
        found[name] = False
try:
    from alibi_ref import get_slopes
    found["get_slopes"] = True
except ImportError as err:
    found["get_slopes"] = str(err)
from alibi_ref.course import plots
found["plots"] = repr(plots.bias_heatmap([0.5], 4, **plots.shared_scale([0.5])))
found["lent"] = sorted(__import__("alibi_ref.course.upstream").course.upstream.LENT) if found[
    "alibi_ref.course.upstream"] else []
from alibi_ref.course.checks import run


def paper_slopes(n_heads, max_bias=8.0):
    def geometric(n):
        return [2.0 ** (-max_bias * (h + 1) / n) for h in range(n)]

    p = 2 ** (n_heads.bit_length() - 1)
    return geometric(p) + geometric(2 * p)[0::2][: n_heads - p]


found["payload"] = run("paper_slopes", paper_slopes, 2022)
print(json.dumps(found))
"""


@pytest.mark.parametrize(("helpers", "lent", "present"), [
    ((), (), set()),
    (("get_slopes",), (), {"alibi_ref.slopes", "get_slopes"}),
    (("multi_head_alibi",), (), {"alibi_ref.attention", "alibi_ref.bias", "alibi_ref.slopes", "get_slopes",
                                 "alibi_ref.course.chapter"}),
    ((), ("alibi_head",), {"alibi_ref.course.upstream"}),
])
def test_a_graded_kernel_imports_only_what_its_view_holds_and_reads_the_cases_the_grader_drew(
        tmp_path, helpers, lent, present):
    """A view of the package (view.py), as the sandbox binds it in place of alibi_ref: the checks and only the helpers
    and lent answers asked for; never the exercises or the judge. The check runs on the inputs of the grader's file
    (GRADING_ENV), hidden ones drawn with a secret the kernel does not hold, and hands back values alone."""
    from alibi_ref.course import grading

    grading.write_view(tmp_path / "view", helpers, lent)
    secret = bytes(range(32))
    grading.write_cases(tmp_path / "cases.json", [("paper_slopes", 2022)], secret)
    env = {**os.environ, grading.GRADING_ENV: str(tmp_path / "cases.json"), "PYTHONPATH": ""}
    done = subprocess.run([sys.executable, "-I", "-S", "-c", VIEW_PROBE, str(tmp_path / "view")], env=env,
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    modules = {k for k, v in found.items() if v is True}
    assert modules == present, modules
    if "get_slopes" not in present:
        assert "not available while grading" in found["get_slopes"]
    assert found["plots"] == "None", "a graded kernel's plots draw nothing"
    assert found["lent"] == sorted(lent)
    payload = found["payload"]
    assert grading.judge(payload, secret).passed, "the values of the cases drawn with the secret"
    assert not grading.judge(payload, bytes(32)).passed, "drawn with another secret, they are other cases"
    assert set(payload) == {"exercise", "seed", "results"}


def _graded_cell(source, outputs):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": "test_x", "points": 1, "solution": False,
                                 "locked": True, "schema_version": 3}
    cell.outputs = outputs
    return cell


def _payload_output(payload):
    return nbformat.v4.new_output("display_data", data={MIME: payload, "text/plain": "handed back"})


def test_judge_checks_decides_each_test_cell_from_the_values_alone():
    fn, _ = answer("paper_slopes")
    good = run("paper_slopes", fn)
    wrong = run("paper_slopes", lambda n, max_bias=8.0: np.zeros(n))
    source = ('check("paper_slopes", paper_slopes)\n### BEGIN HIDDEN TESTS\n'
              'check("paper_slopes", paper_slopes, hidden=2)')
    hidden = run("paper_slopes", fn, 2)
    cells = [
        _graded_cell(source, [_payload_output(good), _payload_output(hidden)]),  # passes
        _graded_cell(source, [_payload_output(good)]),  # the hidden check's values never came back
        _graded_cell(source, [_payload_output(good), _payload_output(hidden), _payload_output(wrong)]),  # a forgery
        _graded_cell(source, [_payload_output(good), _payload_output(hidden),
                              nbformat.v4.new_output("error", ename="GradingStopped", evalue="crash", traceback=[])]),
        _graded_cell(source, [_payload_output({"exercise": "paper_slopes", "seed": None, "results": "x"}),
                              _payload_output(hidden)]),
    ]
    nb = nbformat.v4.new_notebook(cells=cells)
    JudgeChecks(checks_module="alibi_ref.course.grading").preprocess(nb, {})
    errors = [[o for o in c.outputs if o.output_type == "error"] for c in nb.cells]
    assert errors[0] == [] and "4 visible checks pass" in nb.cells[0].outputs[0].text
    assert "no results came back" in errors[1][0].evalue
    assert "entries are off" in errors[2][0].evalue
    assert [e.ename for e in errors[3]] == ["GradingStopped"]
    assert "could not be read" in errors[4][0].evalue
    assert not any(MIME in o.get("data", {}) for c in nb.cells for o in c.outputs), "the values are removed"


def test_the_visible_checks_catch_what_only_the_hidden_ones_caught():
    """A head-2 row at head 1's slope, and constant slopes that ignore their value, fail in the student's own
    session (they passed it and lost hidden points), without the visible check showing head 2's row."""
    row = lambda start, slope: exercises.alibi_head_reference(*exercises._columns(start, start + 2), slope)[0][2]  # noqa: E731
    at_head1_slope = judge(run("sat_rows", {"sat_head1": row(0, 0.5), "sat_head2": row(2, 0.5)}))
    assert not at_head1_slope.passed and "head 2's slope is 1/4" in at_head1_slope.message
    assert judge(run("sat_rows", {"sat_head1": row(0, 0.5), "sat_head2": row(2, 0.25)})).passed
    assert not judge(run("constant_slopes", lambda n, value=0.25: np.full(n, 0.25))).passed

    def bias_from_a_list(slopes, q_len, k_len, causal=False):  # right on the CPU; .tolist() has no data on meta
        i = torch.arange(k_len - q_len, k_len)[:, None]
        j = torch.arange(k_len)[None, :]
        rows = [-m * (i - j).abs().double() for m in slopes.tolist()]
        bias = torch.stack(rows).masked_fill(causal & (j > i), float("-inf"))
        return bias.to(slopes.dtype)

    on_meta = judge(run("alibi_bias_torch", bias_from_a_list))
    assert not on_meta.passed and "meta device" in on_meta.message, on_meta.message

    def attention_in_numpy(q, k, v, slopes, causal=False):  # the right numbers on the CPU, and no gradient
        return torch.as_tensor(exercises.torch_attention_reference(
            q.detach().cpu().numpy(), k.cpu().numpy(), v.cpu().numpy(), slopes.cpu().numpy(), causal))

    assert "on the meta device" in judge(run("alibi_attention_torch", attention_in_numpy)).message
    no_gradient = judge(run("attention_gradient", attention_in_numpy))
    assert not no_gradient.passed and "carries no gradient back to q" in no_gradient.message


def test_a_causal_triangle_aligned_top_left_fails_the_visible_decoding_step():
    """SDPA's is_causal puts query i at position i; ALiBi's queries are the last q_len positions of the keys."""
    import torch.nn.functional as F

    def aligned(start_of_keys: bool):
        def sdpa_alibi(q, k, v, slopes, causal=False):
            n_q, n_k = q.shape[-2], k.shape[-2]
            i = torch.arange(n_q)[:, None] + (0 if start_of_keys else n_k - n_q)
            j = torch.arange(n_k)[None, :]
            bias = -torch.as_tensor(slopes, dtype=q.dtype)[:, None, None] * (i - j).abs()
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(causal & (j > i), float("-inf")))
        return sdpa_alibi

    assert judge(run("sdpa_alibi", aligned(start_of_keys=False))).passed
    top_left = judge(run("sdpa_alibi", aligned(start_of_keys=True)))
    assert not top_left.passed and "decoding step" in top_left.message


def test_the_slope_zero_check_takes_a_zero_found_beside_a_difference_not_a_zero_typed():
    from alibi_ref.course.chapter import multi_head_alibi

    Q, K, V = exercises.Q, exercises.K, exercises.V
    zero = multi_head_alibi(Q, K, V, 2, slopes=[0.0, 0.0])[0]
    apart = float(np.abs(zero - multi_head_alibi(Q, K, V, 2)[0]).max())
    assert apart > 1e-3, "at the chapter's slopes ALiBi is not standard attention"
    named = {"alibi_zero_output": zero, "max_difference": 0.0}
    assert judge(run("slope_zero", {**named, "chapter_difference": apart})).passed
    typed = judge(run("slope_zero", {**named, "chapter_difference": 0.0}))
    assert not typed.passed and "chapter_difference" in typed.message


def test_the_hidden_memory_case_cannot_be_built_whole_in_a_graded_kernel():
    """08's memory bound holds by what the sandbox is: the hidden case's (N, N) scores, even in float32, are more
    than one graded process may map and than all of a sandbox's processes may hold (the default limits); its
    reference, in row blocks, is the library's attention."""
    from autograder.sandbox import SandboxPolicy

    policy, n = SandboxPolicy(), exercises.HIDDEN_MEMORY_N
    assert n * n * 4 > policy.memory_bytes and n * n * 4 >= policy.sandbox_memory_bytes
    [case] = model.cases("tiled_memory", 1, b"grader's secret")
    assert case.args[0].shape[1] == n and case.kwargs["causal"]
    q, k, v, slopes = (a[:, :300] if a.ndim == 3 else a for a in case.args)
    _, blocks = exercises.tiled_memory_reference(q, k, v, slopes, causal=True, rows=64)
    np.testing.assert_allclose(blocks, exercises.alibi_attention(q, k, v, slopes, causal=True), atol=1e-13)


def test_the_long_backward_case_is_exact_in_its_band_of_keys():
    """08's backward at the hidden length (where no N x N array fits a graded kernel, as above): its forward and
    reference weigh only the keys within ``negligible_beyond`` of each query. Banded equals whole, to rounding,
    at a length where whole fits, causal or not; and the case is drawn at that length with its steep slope."""
    q, k, v, d_out = np.random.default_rng(5).normal(size=(4, 2, 1500, 8))
    slopes = np.array([exercises.LONG_BACKWARD_SLOPE, 0.3])
    window = exercises.negligible_beyond(q, k, slopes)
    assert window < 1500 / 2, window  # a band, not every key: else this test shows nothing
    for causal in (True, False):
        banded = exercises._attention_in_row_blocks(q, k, v, slopes, causal, rows=200, d_out=d_out, window=window)
        whole = exercises._attention_in_row_blocks(q, k, v, slopes, causal, rows=1500, d_out=d_out)
        for a, b in zip(banded[:2] + banded[2], whole[:2] + whole[2], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    [case] = model.cases("tiled_backward_long", 1, b"grader's secret")
    assert case.args[0].shape[1] == exercises.HIDDEN_MEMORY_N and case.kwargs["causal"]
    assert case.args[5].dtype == np.float64, "the log-sum-exp the answer is handed is float64"


def test_the_memory_check_judges_the_peak_the_grader_measured_not_the_kernels():
    """08's peak: in the student's session what tracemalloc saw; when graded, how far the sandbox's memory rose
    while the cell ran (the cell's metadata, written by the grader's meter), whatever the kernel reports."""
    from autograder.verdicts import PEAK_RISE

    H, N, _ = exercises.MEMORY_SHAPE
    one = H * N * N * 8

    def claims(peak):  # the reference's output, and a peak of the kernel's choosing
        return lambda q, k, v, slopes, causal=False, block=64: (float(peak), exercises.alibi_attention(
            q, k, v, slopes, causal=causal))

    def graded(claimed, measured):
        payload = run("tiled_memory", lambda *a, **kw: None)
        payload["results"] = [{"value": encode(claims(claimed)(*map(np.asarray, c.args), **c.kwargs)),
                               "device": None} for c in model.cases("tiled_memory", None)]
        cell = _graded_cell('check("tiled_memory", tiled_alibi_attention)', [_payload_output(payload)])
        if measured is not None:
            cell.metadata[PEAK_RISE] = measured
        nb = nbformat.v4.new_notebook(cells=[cell])
        JudgeChecks(checks_module="alibi_ref.course.grading").preprocess(nb, {})
        assert PEAK_RISE not in nb.cells[0].metadata, "the measurement is read, not kept in the notebook"
        return [o.output_type for o in nb.cells[0].outputs]

    assert graded(0, one) == ["error"], "the kernel said 0 bytes; its memory rose by a whole (H, N, N) array"
    assert graded(one, 2**20) == ["stream"], "the kernel's word counts for nothing where the grader measured"
    assert graded(0, None) == ["stream"] and graded(one, None) == ["error"], "no meter: what the kernel says"


def test_results_made_with_lent_upstream_answers_count_only_from_a_rescue_run():
    """In a student's session a wrong alibi_head is lent the reference's, and multi_head is right with it. When
    grading, those results are read only from a rescue run, whose view lent them: in any other run they are the
    student's to make up (a cell can display any payload), so the grader does not read them there."""
    namespace = {"np": np}
    exec(textwrap.dedent('''
        def alibi_head(Qh, Kh, Vh, slope):
            return np.zeros((len(Qh), len(Kh))), np.zeros((len(Qh), Vh.shape[1]))

        def multi_head(Q, K, V, slopes):
            H = len(slopes)
            d_k, d_v = Q.shape[1] // H, V.shape[1] // H
            heads = [alibi_head(Q[:, h * d_k:(h + 1) * d_k], K[:, h * d_k:(h + 1) * d_k], V[:, h * d_v:(h + 1) * d_v],
                                m) for h, m in enumerate(slopes)]
            return np.hstack([o for _, o in heads]), np.stack([w for w, _ in heads])
    '''), namespace)
    payload = json.loads(json.dumps(run("multi_head", namespace["multi_head"], 4)))
    assert payload["upstream"] == ["alibi_head"] and judge(payload).passed, "rescued in the student's session"
    source = 'check("multi_head", multi_head, hidden=4)'
    nb = nbformat.v4.new_notebook(cells=[_graded_cell(source, [_payload_output(payload)])])
    JudgeChecks(checks_module="alibi_ref.course.grading").preprocess(nb, {})
    assert [o.ename for o in nb.cells[0].outputs] == ["CheckFailed"], nb.cells[0].outputs
    assert judge(payload, rescue=True).passed, "what a rescue run hands back is judged by what it lent"
    # in a rescue run too, a cell that shows one payload per guess wins nothing: every payload for a call must pass
    from alibi_ref.course import grading

    wrong = {**payload, "with_reference_upstream": payload["results"]}
    for shown, passes in (([payload], True), ([wrong, payload], False)):
        cell = _graded_cell(source, [_payload_output(p) for p in shown])
        verdict = JudgeChecks._verdict("multi_head", 4, JudgeChecks._payloads(cell, grading, rescue_run=True),
                                       grading, False, None, rescue=True)
        assert verdict.passed == passes, (len(shown), verdict.message)


def test_a_rescue_run_that_runs_out_of_time_has_the_notebook_graded_again():
    """A run in another view (here the rescue run of multi_head, whose alibi_head is wrong) owes verdicts; when it
    runs out of time they are missing. The notebook's outcome is then a timeout, so the job grades it again alone
    with limits scaled to the solution's time now (timeouts.py): a busy machine costs time, never points."""
    from alibi_ref.course import grading

    def wrong_head(Qh, Kh, Vh, slope):
        return np.zeros((len(Qh), len(Kh))), np.zeros((len(Qh), Vh.shape[1]))

    def multi(Q, K, V, slopes):
        H = len(slopes)
        heads = [wrong_head(Q[:, h::H], K[:, h::H], V[:, h::H], m) for h, m in enumerate(slopes)]
        return np.hstack([o for _, o in heads]), np.stack([w for w, _ in heads])

    cells = [_graded_cell('check("alibi_head", alibi_head)', [_payload_output(run("alibi_head", wrong_head))]),
             _graded_cell('check("multi_head", multi_head, hidden=4)',
                          [_payload_output(json.loads(json.dumps(run("multi_head", multi, 4))))])]
    lent = []

    def run_again(helpers, upstream=()):
        lent.append(upstream)
        return nbformat.v4.new_notebook(cells=[_graded_cell(c.source, []) for c in cells]), {
            "status": "timeout", "reason": "cell 1 ran past its time limit"}

    views = grading.views_of([("alibi_head", None), ("multi_head", 4)])
    resources = {"autograder_outcome": {"status": "graded", "reason": "", "seconds": 1.0},
                 "autograder_run_again": run_again, "autograder_view": views["multi_head", 4]}
    JudgeChecks(checks_module="alibi_ref.course.grading").preprocess(nbformat.v4.new_notebook(cells=cells), resources)
    assert lent == [("alibi_head",)], lent
    assert resources["autograder_outcome"]["status"] == "timeout", resources["autograder_outcome"]
    assert "cell 1 ran past its time limit" in resources["autograder_outcome"]["reason"]


def test_the_reference_values_are_computed_once_and_judged_from_the_stored_copy(tmp_path, monkeypatch):
    calls = source_check_calls(Path("solutions/alibi"))
    assert ("paper_slopes", None) in calls and ("mha_alibi_flax", 22) in calls, calls
    fn, _ = answer("paper_slopes")
    payload = json.loads(json.dumps(run("paper_slopes", fn, 2)))
    monkeypatch.setattr(judging, "_EXPECTED", {})
    path = tmp_path / "alibi.pickle"
    judging.save_expected(path, [("paper_slopes", 2)])
    assert judge(payload).passed
    # what a judging process loads is what it judges against: a tampered copy fails the right answer
    with open(path, "rb") as f:
        stored = pickle.load(f)
    stored["paper_slopes", 2, None] = [np.asarray(value) + 1.0 for value in stored["paper_slopes", 2, None]]
    with open(path, "wb") as f:
        pickle.dump(stored, f)
    monkeypatch.setattr(judging, "_EXPECTED", {})
    judging.load_expected(path)
    assert not judge(payload).passed
    monkeypatch.setattr(judging, "_EXPECTED", {})  # without it, computed afresh
    assert judge(payload).passed


def test_check_calls_are_read_from_the_cell_source():
    assert check_calls('check("a", f)\nx = 1\ncheck("b", g, hidden=7)\nprint(check)') == [("a", None), ("b", 7)]
    assert check_calls("this is not python (") == []


# ----------------------------------------------------------------------------- the screen

def _notebook_with_answer(source):
    nb = nbformat.read("solutions/alibi/02_worked_example.ipynb", as_version=4)
    next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax").source = source
    return nb


@pytest.mark.parametrize("source", [
    "import sys, warnings\nprint('note', file=sys.stderr)\n\ndef softmax(x):\n    return x",
    "import os, math, functools\n\ndef _helper(x):\n    return x\n\ndef softmax(x):\n    return _helper(x)",
    "Q = Q * 1.0\nweights, output = 1, 2\n\ndef softmax(x):\n    return x",
    "np.testing.assert_allclose = print\n\ndef softmax(x):\n    return x",  # harmless now: nothing judges there
    "from alibi_ref.course import plots\nfrom alibi_ref.course.checks import check\n\ndef softmax(x):\n    return x",
    "def check(x):\n    return x\n\ndef softmax(x):\n    return x",  # a helper named check: the tests import their own
    # names that only look like the flagged ones
    "import torch.nn as nn\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
    "        setattr(self, 'w', nn.Linear(2, 2))\n\ndef softmax(x):\n    return torch.stack([x]).sum(0) + len("
    "list(Net().modules()))",
    "import inspect, os\n\ndef softmax(x):\n    assert 'x' in inspect.signature(softmax).parameters\n"
    "    return getattr(np, 'exp')(x) / os.path.basename('a') + len(vars())",
    "import torch\n\nclass Scaled(torch.nn.Module):\n    def __init__(self, dtype_name):\n        super().__init__()\n"
    "        self._dtype = getattr(torch, dtype_name)\n        self.cache = {'_last': None}\n\n"
    "def softmax(x):\n    return x",
    # private keys and attributes of objects the notebook makes itself: its own state
    "softmax_cache = {}\nsoftmax_cache['_last'] = None\n\nclass Box:\n    pass\n\nbox = Box()\nbox._seen = 0\n"
    "setattr(box, 'axis', -1)\n\ndef softmax(x):\n    return x",
    # what only a guard inside the kernel had to fear: nothing judged lives there now, and none is flagged
    "import alibi_ref.course.checks as c\nc.judge = print\n\ndef softmax(x):\n    return x",
    "import sys, threading, subprocess, gc\nsys.setprofile(None)\nm = sys.modules\nt = threading.Thread(target=print)"
    "\nexec('y = 1')\n\ndef softmax(x):\n    return x",
])
def test_honest_answers_are_not_flagged(source):
    assert screen_notebook(_notebook_with_answer(source)) == []


@pytest.mark.parametrize(("source", "reason"), [
    ("from alibi_ref import get_slopes", "imports alibi_ref.get_slopes"),
    ("import alibi_ref.course.exercises as e", "imports alibi_ref.course.exercises"),
    ("from alibi_ref.course import multi_head_alibi", "imports alibi_ref.course.multi_head_alibi"),  # not in 02
    ("from alibi_ref.attention import alibi_attention as mine", "imports alibi_ref.attention.alibi_attention"),
])
def test_an_answer_that_imports_the_reference_is_flagged(source, reason):
    findings = screen_notebook(_notebook_with_answer(source))
    assert [reason in str(f) and "a graded kernel does not have it" in str(f) for f in findings] == [True], findings
    assert not findings[0].lasting, "it costs its own exercise"


def test_a_cell_of_the_students_own_may_import_the_reference_to_study_it():
    nb = _notebook_with_answer("def softmax(x):\n    return x")
    at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    nb.cells.insert(at, nbformat.v4.new_code_cell("from alibi_ref import get_slopes\nprint(get_slopes(8), vars(Q))"))
    assert screen_notebook(nb) == []


def test_the_modules_a_notebook_imports_are_screened_as_cells_of_its_own_and_no_other_module_is_handed_over():
    from autograder.screen import flagged_test_cells, imported_modules

    nb = _notebook_with_answer("from helpers import softmax")
    sources = {"helpers": "import numpy as np\nfrom rows import shift\n\ndef softmax(x):\n    return shift(x)\n",
               "rows": "def shift(x):\n    return x - x.max()\n",
               "notes": "import numpy as np\nfrom alibi_ref import get_slopes\n", "broken": "def f(:\n"}
    used = imported_modules(nb, sources)
    assert sorted(used) == ["helpers", "rows"], "what the cells import and what that imports; nothing else"
    assert screen_notebook(nb, used) == []
    # a module that imports the reference fails every test cell of the notebook, wherever it is first imported
    nb.cells.insert(0, nbformat.v4.new_code_cell("import notes"))
    used = imported_modules(nb, sources)
    findings = screen_notebook(nb, used)
    assert [(f.cell, f.line, f.lasting) for f in findings] == [("a module you handed in (notes.py)", 2, True)]
    tests = [i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"]
    assert tests and sorted(flagged_test_cells(nb, findings)) == tests
    nb.cells.insert(0, nbformat.v4.new_code_cell("import broken"))  # fails when imported, as in Jupyter
    assert [f.cell for f in screen_notebook(nb, imported_modules(nb, sources))] == [findings[0].cell]


def test_a_package_a_notebook_imports_is_handed_over_whole_and_screened_file_by_file():
    """A package of the student's (mylib/__init__.py, mylib/core.py) was not handed over: ``import mylib`` failed
    when graded while it ran in the student's Jupyter. It goes whole (its files reach each other by relative
    imports), with what it imports of the student's, and each of its files is screened as a module is."""
    from autograder.screen import imported_modules

    nb = _notebook_with_answer("from mylib import softmax")
    sources = {"mylib/__init__": "from .core import softmax\n", "mylib/core": "import rows\n\ndef softmax(x):\n"
               "    return rows.shift(x)\n", "mylib/sub/deep": "x = 1\n", "rows": "def shift(x):\n    return x\n",
               "other/__init__": "import numpy\nimport alibi_ref.bias\n", "mylib_too": "x = 2\n"}
    used = imported_modules(nb, sources)
    assert sorted(used) == ["mylib/__init__", "mylib/core", "mylib/sub/deep", "rows"]
    assert screen_notebook(nb, used) == []
    nb.cells.insert(0, nbformat.v4.new_code_cell("%run -m other.tool"))  # runs the package's module: imports it
    findings = screen_notebook(nb, imported_modules(nb, sources))
    assert [(f.cell, f.line, f.lasting) for f in findings] == [("a module you handed in (other/__init__.py)", 2, True)]


def test_the_scripts_a_notebook_runs_with_percent_run_are_handed_over_and_screened_like_modules():
    """``%run helpers.py`` (IPython runs the script in the notebook's namespace): grading had no copy of it in
    the kernel's folder, so an answer using what it defines raised NameError. The scripts run by file name
    (beside the notebook), or by module name with -m, are handed over and screened as modules are."""
    from autograder.screen import imported_modules, run_scripts

    nb = _notebook_with_answer("y = head(1)")
    nb.cells[0:0] = [nbformat.v4.new_code_cell(source) for source in (
        "%run hw1-helpers.py", "%run -i -t more --an argv.py", "x = 1\n  %run -m by_name", "%run ../elsewhere.py",
        "%run 'unbalanced", "print('%run not_a_magic.py')")]
    assert run_scripts(nb) == ({"hw1-helpers", "more"}, {"by_name"})
    sources = {name: "def head(x):\n    return x\n" for name in ("hw1-helpers", "more", "by_name", "elsewhere",
                                                                     "not_a_magic", "argv")}
    assert sorted(imported_modules(nb, sources)) == ["by_name", "hw1-helpers", "more"]
    assert screen_notebook(nb, imported_modules(nb, sources)) == []
    # a script is code of the student's own, held to the rule as a module is
    sources["more"] = "import sys\nfrom alibi_ref import alibi_bias\n"
    findings = screen_notebook(nb, imported_modules(nb, sources))
    assert [(f.cell, f.line, f.lasting) for f in findings] == [("a module you handed in (more.py)", 2, True)]


FLAX_MHA = """
import jax, jax.numpy as jnp
from flax import linen as nn
from flax.linen.attention import dot_product_attention

def mha_alibi(seed, x, num_heads, qkv_features):
    slopes = 2.0 ** (-8 * (jnp.arange(num_heads) + 1) / num_heads)
    T = x.shape[0]
    bias = -slopes[:, None, None] * jnp.abs(jnp.arange(T)[:, None] - jnp.arange(T)[None, :])
    def alibi_fn(query, key, value, mask=None, **kwargs):
        return dot_product_attention(query, key, value, bias=bias, mask=mask, **kwargs)
    layer = nn.MultiHeadDotProductAttention(num_heads=num_heads, qkv_features=qkv_features, attention_fn=alibi_fn)
    return layer.apply(layer.init(jax.random.key(seed), x), x).ravel()
"""


@pytest.mark.parametrize(("edit", "hint"), [
    (None, None),
    (("bias = -slopes", "bias = slopes"), "wrong sign"),
    (("(jnp.arange(num_heads) + 1)", "jnp.arange(num_heads)"), "shifted by one head"),
    (("bias=bias, mask=mask", "mask=mask"), "plain attention"),
])
def test_the_flax_exercise_names_the_sources_pitfalls(edit, hint):
    namespace = {}
    exec(FLAX_MHA if edit is None else FLAX_MHA.replace(*edit), namespace)
    v = verdict("mha_alibi_flax", namespace["mha_alibi"], 22)
    if hint is None:
        assert v.passed, v.message
    else:
        assert not v.passed and "Hint:" in v.message and hint in v.message, v.message


def test_an_exercise_name_is_taken_once():
    from alibi_ref.course.model import Exercise, exercise

    with pytest.raises(ValueError, match="two exercises are called 'mha_alibi'"):
        exercise(Exercise("mha_alibi", visible=list, hidden=lambda rng: [], reference=None))
