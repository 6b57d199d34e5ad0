"""Padded batches and explicit positions: alibi_attention and ALiBiMultiheadAttention, held to plain runs."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from alibi_ref import ALiBiMultiheadAttention, alibi_attention, alibi_bias, get_slopes
from alibi_ref.attention import naive_attention
from alibi_ref.bias import positional_bias


@given(st.integers(1, 3), st.integers(1, 6), st.integers(1, 6), st.booleans(), st.integers(0, 2**31 - 1))
def test_positional_bias_is_the_definition_entry_by_entry(batch, q_len, k_len, causal, seed):
    rng = np.random.default_rng(seed)
    slopes = get_slopes(3)
    q_pos, k_pos = rng.integers(0, 9, (batch, q_len)), rng.integers(0, 9, (batch, k_len))
    keep = rng.random((batch, k_len)) > 0.3
    bias = positional_bias(slopes, q_pos, k_pos, causal=causal, key_padding_mask=keep)
    assert bias.shape == (batch, 3, q_len, k_len)
    for b in range(batch):
        for h, m in enumerate(slopes):
            for i in range(q_len):
                for j in range(k_len):
                    hidden = not keep[b, j] or (causal and k_pos[b, j] > q_pos[b, i])
                    want = -np.inf if hidden else -m * abs(q_pos[b, i] - k_pos[b, j])
                    assert bias[b, h, i, j] == want, (b, h, i, j)


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("causal", [False, True])
def test_default_positions_and_an_all_true_mask_change_nothing(impl, causal):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 3, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 4, 7, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    plain = alibi_attention(q, k, v, get_slopes(4), causal=causal, impl=impl)
    explicit = alibi_attention(q, k, v, get_slopes(4), causal=causal, impl=impl, q_positions=torch.arange(4, 7),
                               k_positions=torch.arange(7), key_padding_mask=torch.ones(2, 7, dtype=torch.bool))
    torch.testing.assert_close(explicit, plain, rtol=0, atol=1e-12)


def _left_padded(lengths, width, d_model, gen):
    """Prompts of the given lengths, left-padded to ``width``: (x (B, width, d), mask (B, width), prompts)."""
    prompts = [torch.randn(1, n, d_model, generator=gen, dtype=torch.float64) for n in lengths]
    x = torch.zeros(len(lengths), width, d_model, dtype=torch.float64)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for b, p in enumerate(prompts):
        x[b, width - p.shape[1]:] = p[0]
        mask[b, width - p.shape[1]:] = True
    return x, mask, prompts


# float64 runs torch's math kernels, float32 its fused ones (on CUDA the memory-efficient kernel with a mask)
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lengths", [(5, 3, 1), (200, 150, 1)])  # the bias; on the CPU the strided path's spans
def test_a_left_padded_batch_equals_each_prompt_alone(lengths, causal, dtype, atol, device):
    gen = torch.Generator().manual_seed(1)
    layer = ALiBiMultiheadAttention(16, 4, n_kv_heads=2, causal=causal, dtype=torch.float64).to(device, dtype)
    width = lengths[0]
    x, mask, prompts = _left_padded(lengths, width, 16, gen)
    batched = layer(x.to(device, dtype), attention_mask=mask.to(device))
    for b, prompt in enumerate(prompts):
        alone = layer(prompt.to(device, dtype))
        torch.testing.assert_close(batched[b, width - prompt.shape[1]:], alone[0], rtol=0, atol=atol)


def test_a_left_padded_prompt_fed_in_chunks_through_the_cache_equals_the_full_run(device):
    """A long prompt in two chunks (the second, 50 queries against 200 keys, runs each prompt's span on the
    strided path on the CPU), then a decoding step: each equal to the whole batch run at once."""
    gen = torch.Generator().manual_seed(15)
    layer = ALiBiMultiheadAttention(16, 4, causal=True, dtype=torch.float64, device=device)
    x, mask, _ = _left_padded([200, 120, 60], 200, 16, gen)
    x, mask = x.to(device), mask.to(device)
    full = layer(x, attention_mask=mask)
    first, cache = layer(x[:, :150], attention_mask=mask[:, :150], use_cache=True)
    second, cache = layer(x[:, 150:], attention_mask=mask, past_kv=cache, use_cache=True)
    torch.testing.assert_close(torch.cat([first, second], 1), full, rtol=0, atol=1e-12)


def test_decoding_a_left_padded_batch_with_the_cache_equals_the_full_run(device):
    gen = torch.Generator().manual_seed(2)
    layer = ALiBiMultiheadAttention(16, 4, causal=True, dtype=torch.float64, device=device)
    x, mask, _ = _left_padded([4, 2], 4, 16, gen)
    step = torch.randn(2, 1, 16, generator=gen, dtype=torch.float64)
    x, mask, step = x.to(device), mask.to(device), step.to(device)
    full_mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.bool, device=device)], dim=1)
    full = layer(torch.cat([x, step], dim=1), attention_mask=full_mask)
    _, cache = layer(x, attention_mask=mask, use_cache=True)
    decoded = layer(step, attention_mask=full_mask, past_kv=cache)
    torch.testing.assert_close(decoded[:, 0], full[:, -1], rtol=0, atol=1e-12)


def test_bloom_left_padding_convention_gives_the_same_weights():
    """BLOOM's build_alibi_tensor: positions (mask.cumsum(-1) - 1) * mask, bias +m * position (key-only),
    added under the causal and padding masks. Its weights on real queries are alibi_ref's."""
    gen = torch.Generator().manual_seed(3)
    H, width = 4, 6
    slopes = torch.tensor(get_slopes(H), dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1]])
    q, k, v = (torch.randn(3, H, width, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    # BLOOM, as written in transformers' modeling_bloom.py
    arange_tensor = ((mask.cumsum(dim=-1) - 1) * mask)[:, None, :]  # (B, 1, T)
    alibi = slopes[None, :, None] * arange_tensor  # (B, H, T): +m * key position
    scores = q @ k.transpose(-1, -2) / 8**0.5 + alibi[:, :, None, :]
    hidden = torch.ones(width, width, dtype=torch.bool).triu(1) | ~mask.bool()[:, None, None, :]
    bloom = scores.masked_fill(hidden, -torch.inf).softmax(-1)
    positions = ((mask.cumsum(-1) - 1) * mask)
    _, ours = alibi_attention(q, k, v, slopes, causal=True, key_padding_mask=mask.bool(), q_positions=positions,
                              k_positions=positions, return_weights=True)
    real = mask.bool()[:, None, :, None].expand_as(ours)  # rows of real queries
    torch.testing.assert_close(ours[real], bloom[real], rtol=0, atol=1e-12)


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_a_row_that_sees_no_key_is_zero_and_sdpa_agrees_with_naive(dtype, atol, device):
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, 3, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    keep = torch.tensor([[True, True, False], [False, False, False]])
    numpy_out = alibi_attention(q.numpy(), k.numpy(), v.numpy(), get_slopes(2), key_padding_mask=keep.numpy())
    q, k, v, keep = (x.to(device) for x in (q.to(dtype), k.to(dtype), v.to(dtype), keep))
    leaves = [[x.clone().requires_grad_() for x in (q, k, v)] for _ in range(2)]
    outs = [alibi_attention(*xs, get_slopes(2), key_padding_mask=keep, impl=impl)
            for xs, impl in zip(leaves, ("naive", "sdpa"), strict=True)]
    assert torch.equal(outs[0][1], torch.zeros_like(outs[0][1])) and torch.isfinite(outs[1]).all()
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=atol)
    np.testing.assert_allclose(outs[0].detach().cpu().double().numpy(), numpy_out, atol=atol)
    # and no gradient through the row with no key (the naive path's softmax gave nan there, 0/0): the same
    # gradients on both paths, finite, and zero for that row's queries and keys
    grad = torch.randn_like(outs[0])
    grads = [torch.autograd.grad(out, xs, grad) for out, xs in zip(outs, leaves, strict=True)]
    for naive, sdpa in zip(*grads, strict=True):
        assert torch.isfinite(naive).all() and not naive[1].any()
        torch.testing.assert_close(sdpa, naive, rtol=0, atol=10 * atol)



# ----------------------------------------------------------------------------- padding on the strided path

def _padding_patterns(width: int, q_len: int):
    """(name, key_padding_mask (4, width), q_positions (4, q_len), k_positions (4, width)): a row of each kind."""
    left = torch.arange(width) >= torch.tensor([0, 3, width - 1, width])[:, None]  # none, some, all but one, all
    right = torch.arange(width) < torch.tensor([width, width - 4, 1, 2])[:, None]
    gaps = left.clone()
    gaps[1, 5] = gaps[2, -1] = False  # a hole among the keys; the only key gone
    bloom, right_bloom = ((mask.cumsum(-1) - 1) * mask for mask in (left, right))
    packed = torch.cat([torch.arange(7), torch.arange(width - 7)]).expand(4, width)  # two documents, positions reset
    return [("left, BLOOM's positions", left, bloom[:, -q_len:], bloom),
            ("right, BLOOM's positions", right, right_bloom[:, -q_len:], right_bloom),
            ("right, default positions", right, torch.arange(width - q_len, width).expand(4, q_len), None),
            ("pad queries inside the prompt", left, bloom.masked_fill(~left, 2)[:, -q_len:], bloom),
            ("gaps", gaps, bloom[:, -q_len:], bloom),
            ("packed", None, packed[:, -q_len:], packed)]


@pytest.mark.parametrize("pattern", range(6))
@pytest.mark.parametrize(("causal", "window", "q_len"), [(True, None, 20), (False, None, 20), (True, (4, 0), 20),
                                                         (False, (3, 5), 20), (True, None, 9)])
def test_padded_batches_run_their_spans_on_the_strided_path_and_equal_naive(pattern, causal, window, q_len, device):
    """Each batch row's plain span through the strided path, the other queries with their rows of the bias
    (alibi_ref.padded): output and gradients, learned slopes and GQA included, equal to naive, for left and
    right padding, a row with no key, pad queries that see part of the prompt, a hole among the keys and packed
    positions (no span: the bias)."""
    name, mask, q_positions, k_positions = _padding_patterns(20, q_len)[pattern]
    gen = torch.Generator().manual_seed(13)
    q = torch.randn(4, 4, q_len, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(4, 2, 20, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    slopes = torch.tensor(get_slopes(4), dtype=torch.float64)
    kwargs = {"causal": causal, "window": window, "key_padding_mask": mask, "q_positions": q_positions,
              "k_positions": k_positions}
    kwargs = {key: x.to(device) if isinstance(x, torch.Tensor) else x for key, x in kwargs.items()}
    leaves = [[x.to(device).clone().requires_grad_() for x in (q, k, v, slopes)] for _ in range(2)]
    outs = [alibi_attention(*xs, impl=impl, **kwargs) for xs, impl in zip(leaves, ("naive", "strided"), strict=True)]
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-9, atol=1e-12, msg=name)
    grad = torch.randn_like(outs[0])
    for ours, theirs in zip(*(torch.autograd.grad(out, xs, grad) for out, xs in zip(outs[::-1], leaves[::-1],
                                                                                    strict=True)), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-12, msg=name)


@given(st.integers(1, 12), st.integers(0, 12), st.integers(1, 24), st.integers(-3, 3), st.booleans(),
       st.integers(0, 2**31 - 1))
def test_a_span_is_plain_alibi_and_the_usual_padding_is_one(length, pads, q_len, shift, left, seed):
    """``plain_span``: the queries a .. c - 1 against the keys s .. e - 1 have an unpadded call's distances, and
    every key outside the span is padding; left and right padding give the whole prompt; a hole among the keys
    gives none."""
    from alibi_ref.padded import plain_span

    rng = np.random.default_rng(seed)
    width = length + pads
    real = slice(pads, width) if left else slice(0, length)
    keep = torch.zeros(width, dtype=torch.bool)
    keep[real] = True
    positions = (keep.cumsum(-1) - 1) * keep + shift  # BLOOM's, shifted: the pads all on the first real position
    span = plain_span(positions, positions, keep)
    assert span is not None and span.keys == real
    # right padding of a one-token prompt: the pads stand on its position too, and the last of them is the run
    assert span.queries == real or (not left and length == 1 and pads > 0)
    # any span found is plain: its distances are those of queries aligned to the end of the keys
    q_positions = torch.as_tensor(rng.integers(shift - 2, shift + width + 2, q_len))
    if rng.random() < 0.7:  # the queries end on the prompt's last positions, as a prefill or a decoding step
        tail = min(length, q_len)
        q_positions[q_len - tail:] = positions[real][length - tail:]
    for k_positions in (positions, torch.as_tensor(rng.permutation(width))):
        span = plain_span(q_positions, k_positions, keep)
        if span is None:
            continue
        (s, e), (a, c) = (span.keys.start, span.keys.stop), (span.queries.start, span.queries.stop)
        assert 0 < c - a <= e - s and keep[s:e].all() and not keep[:s].any() and not keep[e:].any()
        distances = q_positions[a:c, None] - k_positions[None, s:e]
        unpadded = torch.arange(c - a)[:, None] + (e - s) - (c - a) - torch.arange(e - s)[None, :]
        assert torch.equal(distances, unpadded)
    if length >= 3:
        hole = keep.clone()
        hole[real.start + 1] = False
        assert plain_span(positions, positions, hole) is None


def test_auto_takes_the_strided_path_for_a_padded_batch_on_the_cpu(monkeypatch):
    """From STRIDED_MIN_KEYS keys and more than FEW_QUERIES queries, as without padding (figures:
    docs/performance.md); the bias below and for decoding."""
    import alibi_ref.padded

    called = []
    real = alibi_ref.padded.padded_strided_attention
    monkeypatch.setattr(alibi_ref.padded, "padded_strided_attention",
                        lambda *args, **kwargs: called.append(True) or real(*args, **kwargs))
    gen = torch.Generator().manual_seed(14)
    q, k, v = (torch.randn(3, 2, 200, 8, generator=gen) for _ in range(3))
    mask = torch.arange(200) >= torch.tensor([0, 50, 199])[:, None]
    positions = (mask.cumsum(-1) - 1) * mask
    kwargs = {"causal": True, "key_padding_mask": mask, "q_positions": positions, "k_positions": positions}
    out = alibi_attention(q, k, v, get_slopes(2), **kwargs)
    assert called.pop()
    torch.testing.assert_close(out, alibi_attention(q, k, v, get_slopes(2), impl="sdpa", **kwargs), rtol=1e-4,
                               atol=1e-5)
    alibi_attention(q[..., -1:, :], k, v, get_slopes(2), causal=True, key_padding_mask=mask,
                    k_positions=positions, q_positions=positions[:, -1:])  # a decoding step: its rows of the bias
    alibi_attention(q[..., :100, :], k[..., :100, :], v[..., :100, :], get_slopes(2), key_padding_mask=mask[:, :100])
    assert called == []

@pytest.mark.parametrize(("kwargs", "message"), [
    ({"key_padding_mask": torch.ones(5, dtype=torch.bool)}, r"key_padding_mask must have shape \(4,\) or \(2, 4\)"),
    ({"k_positions": torch.arange(4.0)}, "k_positions must hold integers"),
    ({"key_padding_mask": torch.ones(2, 4)}, "key_padding_mask must hold booleans"),
    ({"q_positions": torch.zeros(3, 4, dtype=torch.long)}, r"q_positions must have shape \(4,\) or \(2, 4\)"),
])
def test_bad_padding_arguments_say_what_was_expected(kwargs, message):
    q = k = v = torch.zeros(2, 1, 4, 2)
    with pytest.raises(ValueError, match=message):
        alibi_attention(q, k, v, [0.5], **kwargs)


def test_the_layer_refuses_a_mask_of_the_wrong_length_and_takes_a_softmax_scale():
    layer = ALiBiMultiheadAttention(8, 2, dtype=torch.float64)
    x = torch.randn(1, 3, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"attention_mask must be \(B, T_past \+ T\) = \(1, 3\)"):
        layer(x, attention_mask=torch.ones(1, 4))
    scaled = ALiBiMultiheadAttention(8, 2, softmax_scale=0.1, dtype=torch.float64)
    scaled.load_state_dict(layer.state_dict())
    assert not torch.allclose(scaled(x), layer(x))
    layer.softmax_scale = 0.1
    torch.testing.assert_close(scaled(x), layer(x))


def test_alibi_bias_takes_a_dtype_and_a_device():
    slopes = get_slopes(4)
    as_tensor = alibi_bias(slopes, 3, 5, causal=True, device="cpu")
    assert isinstance(as_tensor, torch.Tensor) and as_tensor.dtype == torch.float64
    np.testing.assert_array_equal(as_tensor.numpy(), alibi_bias(slopes, 3, 5, causal=True))
    half = alibi_bias([0.5], 1, 1000, dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16 and half.device.type == "cpu"
    # built in float32 and cast last: the entries next to the diagonal are exact even at length 1000
    assert half[0, 0, -3:].tolist() == [-1.0, -0.5, 0.0]
    assert alibi_bias([0.5], 2, dtype=np.float32).dtype == np.float32
    meta = alibi_bias(torch.ones(2), 4, device="meta")
    assert meta.device.type == "meta" and meta.shape == (2, 4, 4)


# ----------------------------------------------------------------------------- attention dropout

@pytest.mark.parametrize("impl", ["naive", "sdpa", "strided"])
def test_dropout_keeps_the_output_in_expectation_and_is_reproducible(impl, device):
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=gen, dtype=torch.float64).to(device) for _ in range(3))
    slopes = get_slopes(2)
    plain = alibi_attention(q, k, v, slopes, causal=True, impl=impl)
    torch.testing.assert_close(alibi_attention(q, k, v, slopes, causal=True, impl=impl, dropout_p=0.0), plain)
    torch.manual_seed(0)
    samples = torch.stack([alibi_attention(q, k, v, slopes, causal=True, impl=impl, dropout_p=0.3)
                           for _ in range(2000)])
    assert not torch.allclose(samples[0], samples[1]), "each call draws its own mask"
    # inverted dropout keeps the mean: 2000 draws came within 0.015 (naive, sdpa) and 0.033 (strided)
    torch.testing.assert_close(samples.mean(0), plain, rtol=0, atol=0.06)
    torch.manual_seed(1)
    first = alibi_attention(q, k, v, slopes, causal=True, impl=impl, dropout_p=0.3)
    torch.manual_seed(1)
    assert torch.equal(alibi_attention(q, k, v, slopes, causal=True, impl=impl, dropout_p=0.3), first)


def test_the_layer_drops_out_in_training_only():
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    layer = ALiBiMultiheadAttention(8, 2, causal=True, dropout=0.5, dtype=torch.float64)
    still = ALiBiMultiheadAttention(8, 2, causal=True, dtype=torch.float64)
    still.load_state_dict(layer.state_dict())
    layer.eval()
    torch.testing.assert_close(layer(x), still(x), rtol=0, atol=0)
    layer.train()
    assert not torch.allclose(layer(x), still(x))
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1.0"):
        ALiBiMultiheadAttention(8, 2, dropout=1.0)


@pytest.mark.parametrize(("q", "kwargs", "message"), [
    (torch.zeros(1, 1, 2, 2), {"dropout_p": 1.0}, r"dropout_p must be in \[0, 1\)"),
    (np.zeros((1, 1, 2, 2)), {"dropout_p": 0.1}, "needs torch tensors"),
    (torch.zeros(1, 1, 2, 2), {"dropout_p": 0.1, "impl": "flex"}, "has no attention dropout"),
])
def test_bad_dropout_is_refused(q, kwargs, message):
    with pytest.raises(ValueError, match=message):
        alibi_attention(q, q, q, [0.5], **kwargs)


# ----------------------------------------------------------------------------- sliding window

def _windowed_loop(q, k, v, slopes, causal, left, right):
    """The window written out: query i (position i + k_len - q_len) sees key j only if j - left <= i' <= j + right."""
    H, nq, d = q.shape
    nk = k.shape[1]
    bias = np.empty((H, nq, nk))
    for h in range(H):
        for i in range(nq):
            for j in range(nk):
                rel = i + nk - nq - j
                hidden = (causal and rel < 0) or (left is not None and rel > left) or \
                    (right is not None and rel < -right)
                bias[h, i, j] = -np.inf if hidden else -slopes[h] * abs(rel)
    return naive_attention(q, k, v, bias, 1 / np.sqrt(d))[0]


@pytest.mark.parametrize(("window", "causal"), [((2, 1), False), ((3, 0), True), ((0, 0), False),
                                                 ((-1, 2), False), ((4, None), True)])
def test_a_sliding_window_sees_only_its_keys(window, causal, device):
    rng = np.random.default_rng(9)
    q, k, v = rng.normal(size=(3, 4, 7, 5))
    slopes = get_slopes(4)
    left, right = (None if w in (None, -1) else w for w in window)
    expected = _windowed_loop(q[:, 2:], k, v, slopes, causal, left, right)  # 5 queries against 7 keys
    np.testing.assert_allclose(alibi_attention(q[:, 2:], k, v, slopes, causal=causal, window=window), expected,
                               atol=1e-12)
    tq, tk, tv = (torch.tensor(x, device=device) for x in (q[:, 2:], k, v))
    on_sdpa = alibi_attention(tq, tk, tv, torch.tensor(slopes, device=device), causal=causal, window=window)  # sdpa
    np.testing.assert_allclose(on_sdpa.cpu().numpy(), expected, atol=1e-12)



def test_queries_before_the_first_key_see_nothing_in_a_window(device):
    """More queries than keys (symmetric): query i sits at position i - 3, before every key for i < 3, and a window
    of (1, 0) leaves those rows no key. Zeros there (the naive path gave nan, 0/0), and no gradient through them."""
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(2, 2, 6, 4, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 3, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    slopes = get_slopes(2)
    expected = torch.from_numpy(_windowed_loop(q[0].numpy(), k[0].numpy(), v[0].numpy(), slopes, False, 1, 0)[:, 3:])
    on_numpy = alibi_attention(q.numpy(), k.numpy(), v.numpy(), slopes, window=(1, 0))
    assert not on_numpy[:, :, :3].any()
    np.testing.assert_allclose(on_numpy[0, :, 3:], expected, atol=1e-12)
    leaves = {impl: [x.to(device).clone().requires_grad_() for x in (q, k, v)] for impl in ("naive", "sdpa")}
    outs = {impl: alibi_attention(*xs, slopes, window=(1, 0), impl=impl) for impl, xs in leaves.items()}
    grad = torch.randn_like(outs["naive"])
    grads = {impl: torch.autograd.grad(out, leaves[impl], grad) for impl, out in outs.items()}
    for impl, out in outs.items():
        assert not out[:, :, :3].any(), impl
        torch.testing.assert_close(out[0, :, 3:].cpu(), expected, rtol=0, atol=1e-12)
        dq = grads[impl][0]
        assert torch.isfinite(dq).all() and not dq[:, :, :3].any(), impl
    for naive, sdpa in zip(grads["naive"], grads["sdpa"], strict=True):
        torch.testing.assert_close(sdpa, naive, rtol=0, atol=1e-12)
    flex = alibi_attention(*(x.to(device, torch.float32) for x in (q, k, v)), slopes, window=(1, 0), impl="flex")
    torch.testing.assert_close(flex.double().cpu(), outs["naive"].detach().cpu(), rtol=1e-4, atol=1e-5)

def test_a_window_refuses_bad_sizes_and_strided_where_a_query_could_see_no_key():
    q = torch.zeros(1, 2, 4, 3)
    with pytest.raises(ValueError, match="impl='strided' takes a window with q_len <= k_len only"):
        alibi_attention(q, q[..., :3, :], q[..., :3, :], get_slopes(2), window=(1, 1), impl="strided")
    for bad in ((1,), (-2, 0), (1.5, 0), "wide"):
        with pytest.raises(ValueError, match="window"):
            alibi_attention(q, q, q, get_slopes(2), window=bad)


@pytest.mark.parametrize(("window", "causal"), [((5, 2), False), ((9, 0), True), ((0, None), False), ((None, 3), False),
                                                 ((12, None), True), ((300, 300), False)])
@pytest.mark.parametrize(("q_len", "block"), [(40, None), (40, 7), (13, 4)])
def test_the_strided_path_takes_a_window(window, causal, q_len, block, device):
    """The window's -inf sits in the strided bias row, and each block of reversed rows is shown only the keys its
    windows reach (``keys_seen``): equal to naive, output and gradients, learned slopes included; GQA, fewer
    queries than keys, blocks that do not divide the rows, a window wider than the call."""
    from alibi_ref.strided import strided_alibi_attention

    gen = torch.Generator().manual_seed(11)
    q = torch.randn(2, 4, q_len, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 40, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    slopes = torch.tensor(get_slopes(4), dtype=torch.float64)
    leaves = [[x.to(device).clone().requires_grad_() for x in (q, k, v, slopes)] for _ in range(2)]
    expected = alibi_attention(*leaves[0], causal=causal, window=window, impl="naive")
    out = strided_alibi_attention(*leaves[1][:3], leaves[1][3], 8 ** -0.5, causal, 2, block=block, window=window)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-12)
    grad = torch.randn_like(out)
    for ours, theirs in zip(torch.autograd.grad(out, leaves[1], grad), torch.autograd.grad(expected, leaves[0], grad),
                            strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-12)



@given(st.integers(1, 30), st.integers(0, 30), st.integers(1, 30), st.booleans(),
       st.one_of(st.none(), st.integers(0, 35)), st.one_of(st.none(), st.integers(0, 35)), st.data())
def test_a_window_block_is_shown_exactly_the_keys_its_rows_see(q_len, more_keys, size, causal, left, right, data):
    """``keys_seen`` is tight: the range runs from the first key some row of the block sees to the last, so a
    narrow window costs its width, not the call's length."""
    from alibi_ref.bias import relative_positions
    from alibi_ref.strided import effective_window, keys_seen

    k_len = q_len + more_keys
    window = effective_window((left, right), q_len, k_len, causal)
    start = data.draw(st.integers(0, q_len - 1))
    rows = range(start, min(q_len, start + size))  # reversed rows r: queries i = q_len - 1 - r
    bias = alibi_bias(np.ones(1), q_len, k_len, causal=causal, window=window)[0]  # (i, j)
    seen = np.flatnonzero(np.isfinite(bias[[q_len - 1 - r for r in rows]]).any(0))
    assert keys_seen(rows, k_len, causal, window) == range(seen[0], seen[-1] + 1)
    if window is None:  # it hides nothing at these lengths: no key is hidden but by the causal mask
        rel = relative_positions(q_len, k_len)
        assert (np.isfinite(alibi_bias(np.ones(1), q_len, k_len, causal=causal, window=(left, right))[0])
                == (rel >= 0 if causal else True)).all()

@pytest.mark.usefixtures("without_fused_kernel")
def test_auto_takes_the_strided_path_for_a_window_on_the_cpu(monkeypatch):
    """From STRIDED_MIN_KEYS keys, as without a window (the bias it replaces costs H i j numbers and computes every
    key: docs/performance.md); sdpa where a query could see no key, and for a decoding step."""
    import alibi_ref.strided

    called = []
    real = alibi_ref.strided.strided_alibi_attention
    monkeypatch.setattr(alibi_ref.strided, "strided_alibi_attention",
                        lambda *args, **kwargs: called.append(kwargs["window"]) or real(*args, **kwargs))
    gen = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(1, 2, 300, 8, generator=gen) for _ in range(3))
    slopes = get_slopes(2)
    for causal, window in ((True, (64, 0)), (False, (20, 30))):
        out = alibi_attention(q, k, v, slopes, causal=causal, window=window)
        assert called.pop() == window
        torch.testing.assert_close(out, alibi_attention(q, k, v, slopes, causal=causal, window=window, impl="sdpa"),
                                   rtol=1e-4, atol=1e-5)
    alibi_attention(q, k[..., :200, :], v[..., :200, :], slopes, window=(5, 5))  # more queries than keys
    alibi_attention(q[..., -1:, :], k, v, slopes, causal=True, window=(64, 0))  # one query: a few rows of bias
    assert called == []


def test_a_window_with_positions_and_in_the_layer():
    torch.manual_seed(0)
    layer = ALiBiMultiheadAttention(16, 4, causal=True, window=(2, 0)).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    full = layer(x)
    # the layer's window equals a shorter context: each token sees itself and two before
    for t in range(6):
        alone = layer(x[:, max(0, t - 2):t + 1])[:, -1]
        torch.testing.assert_close(full[:, t], alone)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]]).bool()
    padded = layer(x, attention_mask=mask)
    torch.testing.assert_close(padded[1, 2:], layer(x[1:, 2:])[0])


# ----------------------------------------------------------------------------- FlexAttention: no bias built

@pytest.mark.parametrize(("window", "causal"), [((5, 2), False), ((9, 0), True), ((0, None), False)])
def test_flex_takes_a_sliding_window_at_any_length(window, causal, device):
    """The window is a block mask of the shape alone: tiles outside it are skipped. Three lengths, as a model
    meets them: the second compiles FlexAttention with its lengths as symbols."""
    gen = torch.Generator().manual_seed(6)
    slopes = torch.tensor(get_slopes(4), dtype=torch.float64)
    for q_len, k_len in [(40, 40), (41, 41), (3, 57)]:
        q = torch.randn(2, 4, q_len, 16, generator=gen, dtype=torch.float64)
        k, v = (torch.randn(2, 4, k_len, 16, generator=gen, dtype=torch.float64) for _ in range(2))
        expected = alibi_attention(q, k, v, slopes, causal=causal, window=window, impl="naive")
        out = alibi_attention(*(x.to(device, torch.float32) for x in (q, k, v)), slopes.to(device), causal=causal,
                              window=window, impl="flex")
        torch.testing.assert_close(out.double().cpu(), expected, rtol=1e-4, atol=1e-5)


def test_flex_on_the_cpu_refuses_padding_and_positions_and_says_where_they_run():
    q = torch.zeros(2, 2, 4, 8)
    for kwargs in ({"key_padding_mask": torch.ones(2, 4, dtype=torch.bool)}, {"q_positions": torch.arange(4)}):
        with pytest.raises(ValueError, match="takes key_padding_mask and positions on CUDA only"):
            alibi_attention(q, q, q, get_slopes(2), impl="flex", **kwargs)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU on this machine")
@pytest.mark.parametrize("causal", [True, False])
def test_flex_takes_padding_and_positions_on_cuda_forward_and_backward(causal):
    """A left-padded batch (BLOOM's positions), the same with a window, and a batch row with no key at all
    (zeros, and no gradient through it), at three widths; output and gradients against naive in float64."""
    gen = torch.Generator().manual_seed(5)
    slopes = torch.tensor(get_slopes(4), dtype=torch.float64)
    for width in (130, 131, 200):
        mask = torch.arange(width)[None, :] >= width - torch.tensor([width, width // 2, 1])[:, None]
        positions = (mask.cumsum(-1) - 1) * mask
        nothing = mask.clone()
        nothing[2] = False  # the last row sees no key
        q, k, v = (torch.randn(3, 4, width, 16, generator=gen, dtype=torch.float64) for _ in range(3))
        for kwargs in ({"key_padding_mask": mask, "q_positions": positions, "k_positions": positions},
                       {"key_padding_mask": mask, "q_positions": positions, "k_positions": positions,
                        "window": (7, 3)}, {"key_padding_mask": nothing}):
            reference = [x.requires_grad_() for x in (q.clone(), k.clone(), v.clone())]
            leaves = [x.detach().cuda().float().requires_grad_() for x in reference]
            on_cuda = {name: x.cuda() if torch.is_tensor(x) else x for name, x in kwargs.items()}
            expected = alibi_attention(*reference, slopes, causal=causal, impl="naive", **kwargs)
            out = alibi_attention(*leaves, slopes.cuda(), causal=causal, impl="flex", **on_cuda)
            torch.testing.assert_close(out.double().cpu(), expected, rtol=1e-4, atol=1e-5)
            grad = torch.randn_like(expected)
            theirs = torch.autograd.grad(expected, reference, grad)
            ours = torch.autograd.grad(out, leaves, grad.cuda().float())
            for a, b in zip(ours, theirs, strict=True):
                torch.testing.assert_close(a.double().cpu(), b, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU on this machine")
@pytest.mark.parametrize("causal", [True, False])
def test_the_layer_on_flex_runs_a_left_padded_batch_as_each_prompt_alone(causal):
    """The README's example on the path that builds no bias: ``ALiBiMultiheadAttention(..., impl="flex")``."""
    gen = torch.Generator().manual_seed(1)
    layer = ALiBiMultiheadAttention(16, 4, n_kv_heads=2, causal=causal, impl="flex").to("cuda")
    x, mask, prompts = _left_padded([130, 60, 1], 130, 16, gen)
    batched = layer(x.to("cuda", torch.float32), attention_mask=mask.to("cuda"))
    for b, prompt in enumerate(prompts):
        alone = layer(prompt.to("cuda", torch.float32))
        torch.testing.assert_close(batched[b, 130 - prompt.shape[1]:], alone[0], rtol=1e-4, atol=1e-5)
