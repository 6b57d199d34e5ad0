import pytest
import torch

from alibi_ref import ALiBiMultiheadAttention, alibi_attention, get_slopes


def make(device, **kwargs):
    torch.manual_seed(0)
    return ALiBiMultiheadAttention(48, 12, **kwargs).to(device=device, dtype=torch.float64)


def reference_forward(m: ALiBiMultiheadAttention, x, causal):
    """The layer spelled out: project, split heads, naive ALiBi attention, merge, project."""
    B, T, C = x.shape
    hd = C // m.n_heads
    q = m.q_proj(x).view(B, T, m.n_heads, hd).transpose(1, 2)
    k = m.k_proj(x).view(B, T, m.n_kv_heads, hd).transpose(1, 2)
    v = m.v_proj(x).view(B, T, m.n_kv_heads, hd).transpose(1, 2)
    slopes = torch.tensor(get_slopes(m.n_heads), dtype=x.dtype, device=x.device)
    y = alibi_attention(q, k, v, slopes, causal=causal, impl="naive")
    return m.out_proj(y.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("n_kv_heads", [12, 4, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_equals_the_layer_spelled_out(device, n_kv_heads, causal):
    m = make(device, n_kv_heads=n_kv_heads, causal=causal)
    x = torch.randn(2, 9, 48, dtype=torch.float64, device=device)
    out = m(x)
    assert out.shape == x.shape and out.device == x.device
    torch.testing.assert_close(out, reference_forward(m, x, causal), rtol=1e-10, atol=1e-10)


def test_kv_cache_decoding_equals_the_full_sequence(device):
    m = make(device, n_kv_heads=4, causal=True)
    x = torch.randn(2, 10, 48, dtype=torch.float64, device=device)
    full = m(x)
    out, cache = m(x[:, :6], use_cache=True)  # prefill 6 tokens
    steps = [out]
    for t in range(6, 10):  # then decode one token at a time
        out, cache = m(x[:, t:t + 1], past_kv=cache, use_cache=True)
        steps.append(out)
    assert cache[0].shape == (2, 4, 10, 4)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-10)


def test_slopes_are_a_fixed_float32_buffer_that_follows_the_device(device):
    m = ALiBiMultiheadAttention(48, 12)
    assert "slopes" not in m.state_dict() and all("slopes" not in n for n, _ in m.named_parameters())
    m = m.to(device).to(torch.bfloat16)
    assert m.q_proj.weight.dtype == torch.bfloat16
    assert m.slopes.dtype == torch.float32 and m.slopes.device.type == device.type
    # 2^-0.5 etc. are not bf16 numbers: the buffer must hold them exactly in float32
    torch.testing.assert_close(m.slopes.cpu(), torch.tensor(get_slopes(12), dtype=torch.float32), rtol=0, atol=0)
    out = m(torch.randn(1, 5, 48, device=device, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16


def test_bias_is_rebuilt_for_each_length_and_dtype():
    # seed 001 cached its bias by length alone; after a dtype change it handed back the old one
    m = make("cpu", causal=True)
    for T in (7, 3, 7):
        x = torch.randn(1, T, 48, dtype=torch.float64)
        torch.testing.assert_close(m(x), reference_forward(m, x, True))
    m = m.float()
    x = torch.randn(1, 7, 48)
    torch.testing.assert_close(m(x), reference_forward(m, x, True), rtol=1e-5, atol=1e-5)


def test_slopes_are_never_trained():
    m = make("cpu")
    before = m.slopes.clone()
    optimizer = torch.optim.SGD(m.parameters(), lr=1.0)
    m(torch.randn(1, 4, 48, dtype=torch.float64)).pow(2).sum().backward()
    optimizer.step()
    torch.testing.assert_close(m.slopes, before, rtol=0, atol=0)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"d_model": 50, "n_heads": 12}, "d_model must be a multiple of n_heads"),
    ({"d_model": 48, "n_heads": 12, "n_kv_heads": 5}, "n_heads must be a multiple of n_kv_heads"),
    ({"d_model": 48, "n_heads": 12, "slopes": [0.5] * 3}, "need one slope per head: 12 heads, got 3"),
    ({"d_model": 48, "n_heads": 12, "impl": "fast"}, "unknown impl 'fast'; expected one of auto, naive"),
    ({"d_model": 48, "n_heads": 12, "impl": "flex", "dropout": 0.1}, "impl='flex' has no attention dropout"),
])
def test_bad_configuration_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ALiBiMultiheadAttention(**kwargs)


def test_bad_input_shape_is_refused():
    with pytest.raises(ValueError, match=r"x must be \(B, T, 48\), got \(5, 48\)"):
        make("cpu")(torch.randn(5, 48, dtype=torch.float64))


@pytest.mark.parametrize("impl", ["naive", "sdpa", "strided", "flex"])
def test_the_layer_runs_the_path_it_is_given(impl, monkeypatch):
    """``impl`` reaches alibi_attention (each path's output equal to the default's), and each takes the layer's
    window; padding on the CPU's flex is refused with alibi_attention's message."""
    import alibi_ref.nn

    torch.manual_seed(0)
    layer = ALiBiMultiheadAttention(48, 4, causal=True, window=(3, 0), impl=impl)
    default = ALiBiMultiheadAttention(48, 4, causal=True, window=(3, 0))
    default.load_state_dict(layer.state_dict())
    asked = []
    monkeypatch.setattr(alibi_ref.nn, "alibi_attention",
                        lambda *args, **kwargs: asked.append(kwargs["impl"]) or alibi_attention(*args, **kwargs))
    x = torch.randn(2, 40, 48)
    with torch.no_grad():  # the CPU's FlexAttention has no backward
        torch.testing.assert_close(layer(x), default(x), rtol=1e-4, atol=1e-5)
        assert asked == [impl, "auto"] and f"impl={impl!r}" in repr(layer)
        if impl == "flex":
            with pytest.raises(ValueError, match="takes key_padding_mask and positions on CUDA only"):
                layer(x, attention_mask=torch.ones(2, 40, dtype=torch.bool))
