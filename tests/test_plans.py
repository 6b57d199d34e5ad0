"""alibi_attention caches a torch call's plan (what its checks found and the path it took) for the next call like it
(``alibi_ref.attention._PLANS``), so that a model calling with the same shapes again skips the checks. A call that
differs in anything the plan follows from is checked again: these tests make the second call differ in one thing
each, and would pass it a plan that is wrong for it if the key left that thing out."""

import pytest
import torch

from alibi_ref import alibi_attention, alibi_bias, attention, fused, get_slopes
from alibi_ref.attention import naive_attention


def problem(q_len=6, k_len=4, d=8, heads=4, dtype=torch.float64, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, q_len, d, generator=gen, dtype=torch.float64).to(device, dtype)
    k, v = (torch.randn(2, heads, k_len, d, generator=gen, dtype=torch.float64).to(device, dtype) for _ in range(2))
    return q, k, v, torch.tensor(get_slopes(heads), dtype=torch.float32, device=device)


def plan_cached(q, k, v, slopes, causal=False, scale=None, impl="auto") -> bool:
    """Whether the plan of this call is cached: the test's first call must have left one for its second to meet."""
    return attention._PLANS.get(attention._plan_key(q, k, v, slopes, causal, scale, impl)) is not None


# each second call differs from a valid first call in one thing, which makes it wrong
CHANGES = {
    "k's head size": (lambda q, k, v, s: (q, k[..., :4], v, s, {}), "same head dimension d"),
    "v's dtype": (lambda q, k, v, s: (q, k, v.float(), s, {}), "share device and dtype"),
    "v's length": (lambda q, k, v, s: (q, k, v[..., :3, :], s, {}), "k and v must have the same heads and length"),
    "the slopes' count": (lambda q, k, v, s: (q, k, v, s[:3], {}), "one slope per query head"),
    "causal, with more queries than keys": (lambda q, k, v, s: (q, k, v, s, {"causal": True}),
                                            "causal attention needs q_len <= k_len"),
}


@pytest.mark.parametrize("impl", ["sdpa", "naive", "strided"])
@pytest.mark.parametrize("change", CHANGES)
def test_a_call_that_differs_from_one_seen_before_is_checked_again(impl, change, device):
    q, k, v, slopes = problem(device=device)
    alibi_attention(q, k, v, slopes, impl=impl)
    assert plan_cached(q, k, v, slopes, impl=impl)
    second, message = CHANGES[change]
    *inputs, kwargs = second(q, k, v, slopes)
    with pytest.raises(ValueError, match=message):
        alibi_attention(*inputs, impl=impl, **kwargs)


def test_calls_of_one_shape_each_get_their_own_causal_scale_and_slopes(device):
    """Same shapes, on "auto"'s path for them (the fused kernel where it is built; sdpa on CUDA): each call equals
    the naive path, the specification, on its own arguments; a plan cached with the first call's scale, or its causal
    mask, would give the later calls the first one's answer."""
    q, k, v, slopes = problem(q_len=96, k_len=96, d=16, device=device)
    calls = [{}, {"causal": True}, {"scale": 0.3}, {"causal": True, "scale": 0.3}, {"slopes": slopes * 3}, {}]
    for call in calls:
        call = {"slopes": slopes, "causal": False, "scale": 16**-0.5, **call}
        out = alibi_attention(q, k, v, call["slopes"], causal=call["causal"], scale=None if call["scale"] == 0.25
                              else call["scale"])
        bias = alibi_bias(call["slopes"].double(), 96, 96, causal=call["causal"])  # the specification, no plan
        torch.testing.assert_close(out, naive_attention(q, k, v, bias, call["scale"])[0], rtol=1e-9, atol=1e-12)
    # cached: the fused plan, and CUDA's; not the CPU's choice between sdpa and strided
    assert plan_cached(q, k, v, slopes) == (device.type == "cuda" or fused.available())


@pytest.mark.skipif(not fused.available(), reason="the fused kernel is not built here")
def test_a_call_that_takes_a_gradient_after_one_that_took_none_gets_a_backward_pass():
    """bfloat16 takes the fused kernel forward only: a plan cached from a call without a gradient would send the
    call with one to a kernel that has no bfloat16 backward."""
    q, k, v, slopes = problem(q_len=256, k_len=256, d=64, dtype=torch.bfloat16)
    alibi_attention(q, k, v, slopes)
    key = attention._plan_key(q, k, v, slopes, False, None, "auto")
    assert plan_cached(q, k, v, slopes) and attention._PLANS[key].chosen == "fused"
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = alibi_attention(*leaves, slopes)
    out.float().sum().backward()
    exact = [x.detach().double().requires_grad_() for x in (q, k, v)]
    naive_attention(*exact, alibi_bias(slopes.double(), 256, 256), 64**-0.5)[0].sum().backward()
    for ours, theirs in zip(leaves, exact, strict=True):  # bfloat16's rounding of the inputs' gradients
        torch.testing.assert_close(ours.grad.double(), theirs.grad, rtol=0.05, atol=0.05)


@pytest.mark.skipif(not fused.available(), reason="the fused kernel is not built here")
def test_alibi_ref_fused_0_turns_off_a_cached_fused_plan(monkeypatch):
    q, k, v, slopes = problem(q_len=96, k_len=96, d=16)
    calls = []
    kernel_path = fused.fused_alibi_attention
    monkeypatch.setattr(fused, "fused_alibi_attention", lambda *args: calls.append(args) or kernel_path(*args))
    alibi_attention(q, k, v, slopes)
    assert len(calls) == 1 and plan_cached(q, k, v, slopes)
    monkeypatch.setenv("ALIBI_REF_FUSED", "0")
    out = alibi_attention(q, k, v, slopes)
    assert len(calls) == 1  # the second call went elsewhere
    expected = naive_attention(q, k, v, alibi_bias(slopes.double(), 96, 96), 16**-0.5)[0]
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-12)


def test_shapes_that_keep_changing_cache_at_most_plan_cache_size_plans():
    """A KV cache that grows by one key a step is a new shape at every step."""
    q, k, v, slopes = problem(q_len=1, k_len=attention.PLAN_CACHE_SIZE + 20, d=4)
    for k_len in range(1, attention.PLAN_CACHE_SIZE + 20):
        alibi_attention(q, k[..., :k_len, :], v[..., :k_len, :], slopes, impl="naive")
        assert len(attention._PLANS) <= attention.PLAN_CACHE_SIZE
    assert plan_cached(q, k[..., :k_len, :], v[..., :k_len, :], slopes, impl="naive")
