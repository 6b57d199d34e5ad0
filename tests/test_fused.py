"""The fused CPU kernel (alibi_ref.fused): built where a C++ compiler is, equal to the naive path forward and
backward (q, k, v and the slopes), with windows, each head's reach, GQA, KV caches and strided inputs; and
taken by "auto" on the CPU exactly where it fits."""

import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from alibi_ref import alibi_attention, get_slopes
from alibi_ref import fused as fused_module
from alibi_ref.attention import check_shapes
from alibi_ref.dispatch import FUSED_BF16_MIN_KEYS, FUSED_CPU_MIN_KEYS, choose_impl

needs_kernel = pytest.mark.skipif(not fused_module.available(), reason="the fused kernel is not built here "
                                  "(test_the_kernel_is_built_wherever_a_compiler_is says whether it should be)")
as_float32 = pytest.mark.skipif(not fused_module.bfloat16_as_float32(), reason="bfloat16 runs as float32 only where "
                                "the kernel is built and the CPU has no bfloat16 products")


def test_the_kernel_is_built_wherever_a_compiler_is():
    """`make` builds it (python -m alibi_ref build-kernel): a build that broke must fail here, not skip the rest."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler on this machine: the library runs its other CPU paths")
    assert fused_module.available(), f"no fused kernel under {fused_module.kernel_dir()}: run make, or " \
                                     "python -m alibi_ref build-kernel, and see what the compiler says"


def against_naive(q, k, v, slopes, causal, window=None, scale=None):
    """Max |fused - naive| over the output and the gradients of q, k, v and the slopes, float64."""
    inputs = [x.detach().double().requires_grad_() for x in (q, k, v, slopes)]
    outs, grads = [], []
    for impl in ("fused", "naive"):
        out = alibi_attention(*inputs[:3], inputs[3], causal=causal, window=window, scale=scale, impl=impl)
        upstream = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
        outs.append(out)
        grads.append(torch.autograd.grad(out, inputs, upstream))
    fused, naive = [outs[0].detach(), *grads[0]], [outs[1].detach(), *grads[1]]
    return [float((a - b).abs().max()) for a, b in zip(fused, naive, strict=True)]


@needs_kernel
@pytest.mark.parametrize(("heads", "kv_heads", "q_len", "k_len", "causal", "window"), [
    (4, 4, 37, 37, False, None),
    (4, 2, 37, 300, True, None),  # GQA, a chunk of queries against a KV cache
    (8, 8, 600, 600, True, None),  # several query and key blocks, the diagonal inside them
    (8, 1, 5, 700, False, None),  # MQA, a few queries
    (4, 4, 130, 100, False, None),  # more queries than keys: the first ones sit before the first key
    (4, 2, 700, 700, False, (30, 100)),
    (4, 4, 600, 900, True, (250, -1)),
    (4, 4, 600, 900, False, (-1, 7)),
])
def test_fused_equals_naive_forward_and_backward_in_float64(heads, kv_heads, q_len, k_len, causal, window):
    torch.manual_seed(0)
    q = torch.randn(2, heads, q_len, 16)
    k, v = (torch.randn(2, kv_heads, k_len, 16) for _ in range(2))
    slopes = torch.tensor(get_slopes(heads))
    errors = against_naive(q, k, v, slopes, causal, window)
    assert max(errors[:4]) < 1e-12, errors  # out, dq, dk, dv
    assert errors[4] < 1e-10, errors  # the slopes' gradient sums every logit's: larger, and still float64's


@needs_kernel
@settings(max_examples=30, deadline=None)
@given(heads=st.sampled_from([(1, 1), (2, 1), (4, 2), (3, 3)]), q_len=st.integers(1, 140),
       extra_keys=st.integers(0, 140), d=st.sampled_from([1, 7, 16]), causal=st.booleans(),
       left=st.integers(-1, 60), right=st.integers(-1, 60), seed=st.integers(0, 2**16))
def test_fused_equals_naive_for_any_shape_and_window(heads, q_len, extra_keys, d, causal, left, right, seed):
    torch.manual_seed(seed)
    k_len = q_len + extra_keys
    q = torch.randn(1, heads[0], q_len, d)
    k, v = (torch.randn(1, heads[1], k_len, d) for _ in range(2))
    slopes = torch.rand(heads[0]) * 2 - 0.5  # any slopes, negative and zero ones too (learned ones can be)
    errors = against_naive(q, k, v, slopes, causal, (left, right), scale=0.3)
    assert max(errors) < 1e-10, errors


@needs_kernel
@settings(max_examples=30, deadline=None)
@given(heads=st.sampled_from([(1, 1), (4, 2)]), q_len=st.integers(1, 300), extra_keys=st.integers(0, 300),
       causal=st.booleans(), left=st.integers(-1, 90), right=st.integers(-1, 90), seed=st.integers(0, 2**16))
def test_float32_forward_is_as_close_to_float64_as_naive_float32_for_any_shape_and_window(
        heads, q_len, extra_keys, causal, left, right, seed):
    """float32 has score passes of its own (512-bit vectors where the CPU has them, 16 columns at a time with
    the row's ragged ends masked): any row length and window edge, against float64."""
    torch.manual_seed(seed)
    k_len = q_len + extra_keys
    q = torch.randn(1, heads[0], q_len, 32)
    k, v = (torch.randn(1, heads[1], k_len, 32) for _ in range(2))
    slopes = torch.rand(heads[0]) * 2 - 0.5
    options = dict(causal=causal, window=(left, right))
    exact = alibi_attention(q.double(), k.double(), v.double(), slopes.double(), impl="naive", **options)
    fused = alibi_attention(q, k, v, slopes, impl="fused", **options).double()
    naive = alibi_attention(q, k, v, slopes, impl="naive", **options).double()
    assert fused.isnan().equal(exact.isnan())  # rows that see no key are NaN in all three
    error, naive_error = (float((x - exact).nan_to_num(0).abs().max()) for x in (fused, naive))
    assert error < 2 * naive_error + 1e-6, (error, naive_error)


@needs_kernel
@settings(max_examples=30, deadline=None)
@given(heads=st.sampled_from([(1, 1), (4, 2), (3, 1)]), q_len=st.integers(1, 300), extra_keys=st.integers(0, 300),
       d=st.sampled_from([16, 32, 48, 80, 128]), causal=st.booleans(), left=st.integers(-1, 90),
       right=st.integers(-1, 90), seed=st.integers(0, 2**16))
def test_bfloat16_forward_is_as_close_to_float64_as_bfloat16_sdpa_for_any_shape_and_window(
        heads, q_len, extra_keys, d, causal, left, right, seed):
    """bfloat16 takes products of its own (oneDNN's brgemm on k and v packed in pairs, 64 columns at a time, so
    head sizes of 16, 48 and 80 leave part of a chunk) and rounds its weights to bfloat16 as SDPA does, or, on a
    CPU without bfloat16 products, runs as float32: within twice SDPA's distance from float64, with the bias
    materialised for SDPA."""
    torch.manual_seed(seed)
    k_len = q_len + extra_keys
    q = torch.randn(1, heads[0], q_len, d)
    k, v = (torch.randn(1, heads[1], k_len, d) for _ in range(2))
    slopes = torch.rand(heads[0]) * 2 - 0.5
    options = dict(causal=causal, window=(left, right))
    exact = alibi_attention(q.double(), k.double(), v.double(), slopes.double(), impl="naive", **options)
    q, k, v = (x.bfloat16() for x in (q, k, v))
    fused = alibi_attention(q, k, v, slopes, impl="fused", **options)
    assert fused.dtype == torch.bfloat16
    sdpa = alibi_attention(q, k, v, slopes, impl="sdpa", **options).double()
    error, sdpa_error = (float((x.double() - exact).abs().max()) for x in (fused, sdpa))
    assert error < 2 * sdpa_error + 2**-8, (error, sdpa_error)  # 2^-8: a bfloat16 unit at 1


@needs_kernel
def test_bfloat16_takes_the_fused_forward_only_where_no_gradient_is_taken():
    """A gradient of k alone (q and v take none) still sends the call to a path with a backward."""
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 2, FUSED_BF16_MIN_KEYS, 16, dtype=torch.bfloat16) for _ in range(3))
    slopes = torch.tensor(get_slopes(2))
    k.requires_grad_()
    alibi_attention(q, k, v, slopes).sum().backward()
    assert k.grad is not None and k.grad.abs().sum() > 0
    with torch.no_grad():
        assert alibi_attention(q, k, v, slopes).equal(alibi_attention(q, k, v, slopes, impl="fused"))


@as_float32
@pytest.mark.parametrize("options", [{"causal": True, "window": (600, 0)}, {"causal": False}],
                         ids=["causal-window", "symmetric"])
def test_bfloat16_without_its_products_is_the_float32_kernel_on_widened_blocks(options):
    """On a CPU without bfloat16 products (AVX2) the kernel widens each block of q, k and v to float32 as it reads
    it: the output is float32's on the same numbers, rounded to bfloat16 (bit for bit on the AMD EPYC where it
    was written; one bfloat16 unit allowed, for a BLAS whose rounding follows its operands' alignment). Any head
    size (brgemm's packing needs multiples of 16), GQA, a window, strided inputs, several blocks of queries (128)
    and keys (512)."""
    torch.manual_seed(6)
    q = torch.randn(2, 700, 4, 8).bfloat16().transpose(1, 2)  # (B, H, i, d), strided as ALiBiMultiheadAttention's
    k, v = (torch.randn(2, 700, 2, 8).bfloat16().transpose(1, 2) for _ in range(2))
    slopes = torch.tensor(get_slopes(4))
    whole = alibi_attention(q.float(), k.float(), v.float(), slopes, impl="fused", **options).bfloat16()
    widened = alibi_attention(q, k, v, slopes, impl="fused", **options)
    assert widened.dtype == torch.bfloat16
    torch.testing.assert_close(widened, whole, rtol=2**-7, atol=1e-6)
    empty = alibi_attention(q[:0], k[:0], v[:0], slopes, impl="fused")
    assert empty.shape == (0, 4, 700, 8) and empty.dtype == torch.bfloat16


@needs_kernel
def test_strided_inputs_and_a_leading_batch_shape_are_read_in_place():
    """(B, T, H, d) transposed to (B, H, T, d), as ALiBiMultiheadAttention makes them, and extra leading dims."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 3, 40, 4, 8).transpose(-2, -3) for _ in range(3))  # (2, 3, 4, 40, 8), strided
    slopes = torch.tensor(get_slopes(4))
    assert not q.is_contiguous()
    errors = against_naive(q, k, v, slopes, causal=True)
    assert max(errors) < 1e-10, errors


@needs_kernel
@pytest.mark.parametrize("causal", [False, True])
def test_float32_with_each_heads_reach_is_as_close_to_float64_as_the_materialised_bias(causal):
    """N = 2048: the steep heads run in windows of their reach (alibi_ref.reach); the output stays within
    float32's rounding of float64, as close as naive float32 with the whole bias."""
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 8, 2048, 64) for _ in range(3))
    slopes = torch.tensor(get_slopes(8), dtype=torch.float32)
    windows = fused_module.head_windows(q, k, slopes, 0.125, causal, 1, None)
    assert (windows[:4, 0] > 0).all() and (windows[:4, 0] < 1024).all(), windows  # the steep heads are narrowed
    exact = alibi_attention(q.double(), k.double(), v.double(), slopes.double(), causal=causal, impl="naive")
    fused = alibi_attention(q, k, v, slopes, causal=causal, impl="fused").double()
    naive = alibi_attention(q, k, v, slopes, causal=causal, impl="naive").double()
    assert float((fused - exact).abs().max()) < 2 * float((naive - exact).abs().max()) + 1e-7


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_the_kernels_longest_rows_are_torchs_norms(dtype):
    """The reach's bound reads each head's longest row of q and k through the kernel (torch's bfloat16 norm
    cost more than the reach saved at 1024 keys): the same numbers, strided (B, T, H, d) inputs included."""
    from alibi_ref.reach import longest_rows

    torch.manual_seed(5)
    x = (torch.randn(3, 70, 4, 48) * torch.linspace(0.5, 4, 4)[:, None]).to(dtype).transpose(1, 2)  # (3, 4, 70, 48)
    x[1, 2, 33] *= 3  # one long row, in the middle of a batch row
    ours, torchs = fused_module._loaded().longest_rows(x), longest_rows(x).double()
    assert ours.shape == (4,) and torch.allclose(ours, torchs, rtol=1e-6)  # reach.longest_rows takes float32
    assert int(ours.argmax()) == 2


@needs_kernel
def test_a_nan_in_a_query_stays_in_its_row():
    """As in plain SDPA: the row with the NaN is NaN, the others untouched (nothing turns it into a number)."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 2, 200, 8) for _ in range(3))
    q[0, 1, 17, 3] = float("nan")
    out = alibi_attention(q, k, v, torch.tensor(get_slopes(2)), impl="fused")
    assert out[0, 1, 17].isnan().all()
    assert not out[0, 1, :17].isnan().any() and not out[0, 0].isnan().any()


@needs_kernel
def test_auto_takes_the_fused_kernel_on_the_cpu_where_it_fits():
    """float32 and float64 from FUSED_CPU_MIN_KEYS keys, and below it where a gradient is taken, with or without a
    window; bfloat16 where no gradient is taken, from FUSED_BF16_MIN_KEYS with its products and at any length
    without them (a decoding step too); not for float16, dropout, padding, a few queries (a decoding step;
    bfloat16 without its products aside), or the weights."""
    def chosen(n, dtype=torch.float32, grad=False, q_len=None, **options):
        q = torch.zeros(1, 8, q_len or n, 16, dtype=dtype, requires_grad=grad)
        k = torch.zeros(1, 8, n, 16, dtype=dtype)
        slopes = torch.tensor(get_slopes(8))
        dims = check_shapes(q, k, k, slopes, False)
        return choose_impl("auto", q, dims, options.pop("return_weights", False), v=k, **options)

    assert chosen(FUSED_CPU_MIN_KEYS) == chosen(4096) == chosen(300, torch.float64) == chosen(1024, window=True) \
        == "fused"
    assert chosen(FUSED_CPU_MIN_KEYS - 1) != "fused" and chosen(FUSED_CPU_MIN_KEYS - 1, grad=True) == "fused"
    assert chosen(FUSED_BF16_MIN_KEYS, torch.bfloat16) == "fused"  # with its products, or widened to float32
    short_bfloat16 = (chosen(FUSED_BF16_MIN_KEYS - 1, torch.bfloat16), chosen(8, torch.bfloat16),
                      chosen(1024, torch.bfloat16, q_len=1))
    assert short_bfloat16 == ("fused",) * 3 if fused_module.bfloat16_as_float32() else "fused" not in short_bfloat16
    assert chosen(1024, torch.bfloat16, grad=True) != "fused" and chosen(1024, torch.float16) != "fused"
    assert chosen(1024, dropout=True) != "fused"
    assert chosen(1024, positional=True) != "fused"
    assert chosen(1024, q_len=1) == "sdpa"
    assert chosen(1024, return_weights=True) == "naive"


def test_the_fused_path_says_why_it_cannot_take_a_call():
    q = torch.zeros(1, 2, 8, 4, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"float32 and float64 \(bfloat16 forward only\), got torch\.float16"):
        alibi_attention(q, q, q, torch.tensor([0.5, 0.25]), impl="fused")
    q = torch.zeros(1, 2, 8, 16, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(ValueError, match="bfloat16 forward only, and this call takes a gradient"):
        alibi_attention(q, q, q, torch.tensor([0.5, 0.25]), impl="fused")
    if not fused_module.bfloat16_as_float32():  # brgemm's packing; float32 takes any head size
        with pytest.raises(ValueError, match="a head size that is a multiple of 16, got 8"):
            alibi_attention(*[q.detach()[..., :8]] * 3, torch.tensor([0.5, 0.25]), impl="fused")
    q = torch.zeros(1, 2, 8, 4)
    with pytest.raises(ValueError, match="no attention dropout"):
        alibi_attention(q, q, q, torch.tensor([0.5, 0.25]), impl="fused", dropout_p=0.1)
    with pytest.raises(ValueError, match="no key padding or positions"):
        alibi_attention(q, q, q, torch.tensor([0.5, 0.25]), impl="fused", key_padding_mask=torch.ones(1, 8) > 0)
    with pytest.raises(ValueError, match="first queries"):
        alibi_attention(q, q[..., :3, :], q[..., :3, :], torch.tensor([0.5, 0.25]), impl="fused", window=(1, 1))
