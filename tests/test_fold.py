"""The fused paths (fold on the CPU, FlexAttention) held to the naive path, and their memory bound."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_attention import problems, to_torch

from alibi_ref import alibi_attention, get_slopes
from alibi_ref.attention import FUSED_MIN_LEN, Dims, choose_impl
from alibi_ref.fold import FOLD_LIMIT, Tile, block_size, folded_attention, plan


@given(problems(max_len=9), st.integers(1, 9))
def test_fold_equals_naive_in_float64_for_any_block_size(problem, block):
    q, k, v, slopes, causal = problem
    expected = alibi_attention(q, k, v, slopes, causal=causal)
    q, k, v, slopes = to_torch(q, k, v, slopes)
    out = folded_attention(q, k, v, slopes, q.shape[-1] ** -0.5, causal, block)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("causal", "q_len", "block"), [(True, 7, 3), (False, 7, 3), (True, 2, 4), (False, 7, 7)])
def test_fold_gradients_match_finite_differences(causal, q_len, block):
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, q_len, 5, generator=gen, dtype=torch.float64)  # 4 query heads on 2 KV heads
    k, v = torch.randn(2, 1, 2, 7, 5, generator=gen, dtype=torch.float64)
    slopes = torch.tensor(get_slopes(4), dtype=torch.float64)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: folded_attention(q, k, v, slopes, 0.4, causal, block), (q, k, v))


def test_plan_covers_every_query_key_pair_once():
    for q_len, k_len, block, causal in [(10, 10, 3, False), (10, 10, 4, True), (3, 10, 2, True), (1, 9, 4, False)]:
        seen = np.zeros((q_len, k_len), dtype=int)
        for rows, centre, tiles in plan(q_len, k_len, block, causal):
            assert rows.start <= centre - (k_len - q_len) <= rows.stop, "the centre sits inside the block"
            for tile in tiles:
                seen[rows, tile.keys] += 1 if not tile.causal else np.tril(np.ones((rows.stop - rows.start,) * 2, int))
        i = np.arange(q_len)[:, None] + k_len - q_len
        expected = (np.arange(k_len) <= i) if causal else np.ones((q_len, k_len), bool)
        np.testing.assert_array_equal(seen, expected.astype(int), err_msg=str((q_len, k_len, block, causal)))
    assert Tile(slice(0, 4), 0, False) in plan(4, 4, 4, causal=False)[0].tiles  # symmetric diagonal: bias as a mask


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads", [8, 12])
def test_fold_float32_error_stays_within_its_bound_at_length_4096(causal, heads):
    """The fold's logits carry up to FOLD_LIMIT: float32 output within 4e-5 of float64 (materialised: ~1.5e-6)."""
    gen = torch.Generator().manual_seed(0)
    n = 4096
    q, k, v = (torch.randn(1, heads, n, 64, generator=gen) for _ in range(3))
    slopes = torch.tensor(get_slopes(heads))
    assert choose_impl("auto", q, slopes, Dims(heads, heads, n, n, 64), False) == "fold"
    assert block_size(float(slopes.max()), n, causal) * float(slopes.max()) / 2 <= FOLD_LIMIT
    reference = alibi_attention(*(x.double() for x in (q, k, v)), slopes.double(), causal=causal, impl="sdpa")
    error = (alibi_attention(q, k, v, slopes, causal=causal).double() - reference).abs().max().item()
    assert error < 4e-5, f"the folded path is off by {error:.2e} at N={n}"


def test_fold_runs_16_bit_inputs_in_float32_forward_and_backward():
    """16-bit in, folded in float32, 16-bit out: output and gradients within the inputs' own rounding.

    Stated bounds (gradients here reach about 4 in size): bfloat16 2e-2 on the output and 4e-2 on
    the gradients, float16 2e-3 and 5e-3 (measured 1.4e-2 and 1.9e-3 for the gradients).
    """
    gen = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(1, 8, 600, 32, generator=gen) for _ in range(4))
    slopes = torch.tensor(get_slopes(8))
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    reference = alibi_attention(*leaves, slopes.double(), causal=True)
    reference_grads = torch.autograd.grad(reference, leaves, grad.double())
    for dtype, bound, grad_bound in [(torch.bfloat16, 2e-2, 4e-2), (torch.float16, 2e-3, 5e-3)]:
        inputs = [x.to(dtype).requires_grad_() for x in (q, k, v)]
        out = alibi_attention(*inputs, slopes, causal=True, impl="fold")
        assert out.dtype == dtype
        error = (out.double() - reference).abs().max().item()
        assert error < bound, f"{dtype}: off by {error:.2e}"
        for name, ours, theirs in zip("qkv", torch.autograd.grad(out, inputs, grad.to(dtype)), reference_grads,
                                      strict=True):
            assert ours.dtype == dtype
            error = (ours.double() - theirs).abs().max().item()
            assert error < grad_bound, f"{dtype}: d{name} off by {error:.2e}"


def test_auto_picks_the_fused_path_for_long_sequences():
    slopes = torch.tensor(get_slopes(8))
    for n, expected in [(FUSED_MIN_LEN, "fold"), (FUSED_MIN_LEN - 1, "sdpa")]:
        q = torch.zeros(1, 8, n, 4)
        for causal in (True, False):
            assert choose_impl("auto", q, slopes, Dims(8, 8, n, n, 4), False) == expected, (n, causal)
    q = torch.zeros(1, 8, 1, 4)  # one decoding step against a long cache
    assert choose_impl("auto", q, slopes, Dims(8, 8, 1, 4096, 4), False) == "fold"
    assert choose_impl("auto", q, slopes, Dims(8, 8, 1, 4096, 4), True) == "naive"  # the weights were asked for
    assert choose_impl("auto", np.zeros((8, 4, 4)), slopes, Dims(8, 8, 4, 4, 4), False) == "naive"
    steep = torch.full((8,), 100.0)  # blocks of 16 rows would carry 800 > FOLD_LIMIT
    assert choose_impl("auto", torch.zeros(1, 8, 4096, 4), steep, Dims(8, 8, 4096, 4096, 4), False) == "sdpa"
    with pytest.raises(ValueError, match="impl='fold' needs CPU tensors and slopes >= 0"):
        alibi_attention(torch.zeros(1, 8, 4, 4), torch.zeros(1, 8, 4, 4), torch.zeros(1, 8, 4, 4), -steep, impl="fold")


# a fresh interpreter measures its own peak resident memory (VmHWM), reset after the inputs exist
_MEMORY_PROBE = textwrap.dedent("""
    import json, sys, torch
    from alibi_ref import alibi_attention, flush_denormals, get_slopes

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

    flush_denormals()  # for speed only
    n, heads, d = 16384, 8, 64
    q, k, v = (torch.randn(1, heads, n, d, requires_grad=True) for _ in range(3))
    slopes = torch.tensor(get_slopes(heads))
    alibi_attention(q[:, :, :600], k[:, :, :600], v[:, :, :600], slopes, causal=True).sum().backward()  # warm-up
    q.grad = k.grad = v.grad = None
    peaks = {}
    for name, causal, backward in (("causal, forward and backward", True, True), ("symmetric, forward", False, False)):
        base = status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak to the present
        out = alibi_attention(q, k, v, slopes, causal=causal)
        if backward:
            out.sum().backward()
        peaks[name] = status("VmHWM") - base
        q.grad = k.grad = v.grad = None
        del out
    print(json.dumps(peaks))
""")


def test_default_path_at_length_16384_stays_under_1_gib():
    """The (8, 16384, 16384) float32 bias alone would be 8 GiB; the default path must never build it."""
    done = subprocess.run([sys.executable, "-c", _MEMORY_PROBE], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    peaks = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(peaks) == 2
    for name, peak in peaks.items():
        print(f"{name}: {peak / 2**20:.0f} MiB beyond the inputs")
        assert peak < 2**30, f"{name}: {peak / 2**20:.0f} MiB at N=16384"


# ----------------------------------------------------------------------------- FlexAttention, compiled

@pytest.mark.parametrize(("causal", "q_len"), [(True, 128), (False, 128), (True, 1)])
def test_flex_equals_naive_forward_and_backward(device, causal, q_len):
    """The CUDA default path. torch.compile runs the same code on the CPU, forward only (torch 2.13
    has no FlexAttention backward on the CPU), so the CPU checks the forward and CUDA both."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, q_len, 16, generator=gen, dtype=torch.float64)
    k, v = torch.randn(2, 2, 2, 128, 16, generator=gen, dtype=torch.float64)  # GQA: 4 query heads on 2 KV heads
    slopes = torch.tensor(get_slopes(4))
    backward = device.type == "cuda"
    leaves = [x.to(device=device, dtype=torch.float32).requires_grad_(backward) for x in (q, k, v)]
    reference = [x.detach().to(device).requires_grad_(backward) for x in leaves]
    out = alibi_attention(*leaves, slopes.to(device), causal=causal, impl="flex")
    expected = alibi_attention(*reference, slopes.to(device), causal=causal, impl="naive")
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    if not backward:
        return
    grad = torch.randn_like(out)
    for ours, theirs in zip(torch.autograd.grad(out, leaves, grad), torch.autograd.grad(expected, reference, grad),
                            strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU on this machine")
def test_auto_uses_flex_on_cuda():
    q = torch.zeros(1, 8, FUSED_MIN_LEN, 16, device="cuda")
    slopes = torch.tensor(get_slopes(8), device="cuda")
    assert choose_impl("auto", q, slopes, Dims(8, 8, FUSED_MIN_LEN, FUSED_MIN_LEN, 16), False) == "flex"


# ----------------------------------------------------------------------------- subnormal floats

_SUBNORMAL_PROBE = textwrap.dedent("""
    import json, torch
    from alibi_ref import flush_denormals

    def subnormals():  # a multiplication large enough to run on every OpenMP thread
        return int((torch.full((1 << 22,), 1e-30) * 1e-10 != 0).sum())

    before = subnormals()
    flushed = flush_denormals()
    print(json.dumps({"threads": torch.get_num_threads(), "before": before, "after": subnormals(),
                      "flushed": flushed}))
""")


def test_flush_denormals_reaches_every_thread():
    done = subprocess.run([sys.executable, "-c", _SUBNORMAL_PROBE], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["flushed"] and result["before"] == 1 << 22, result  # 1e-40 is subnormal: kept before
    assert result["after"] == 0, f"{result['after']} subnormal results survived on some thread: {result}"
