import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from alibi_ref.lab.extrapolation import (
    METHODS,
    QUICK,
    Settings,
    TinyLM,
    corpus,
    perplexity,
    rotate,
    run,
    sinusoidal,
    train,
)

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "solutions" / "alibi" / "extrapolation_results.json"
TINY = replace(QUICK, steps=3, eval_chunks=2, d_model=32, n_head=4, eval_multiples=(1, 2, 4))


def test_corpus_is_deterministic_and_held_out_is_disjoint():
    train, held_out = corpus()
    train2, held_out2 = corpus()
    assert torch.equal(train, train2) and torch.equal(held_out, held_out2)
    assert len(train) > 1_000_000 and len(held_out) > 100_000
    assert train.min() >= 0 and train.max() < 256
    # no held-out 200-byte window appears in the training bytes
    probe = bytes(held_out[5000:5200].tolist())
    assert probe not in bytes(train.tolist())


def test_rotary_scores_depend_on_the_offset_only():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 1, 1, 16, generator=gen)
    T = 40
    rq, rk = rotate(q.expand(1, 1, T, 16)), rotate(k.expand(1, 1, T, 16))
    scores = rq[0, 0] @ rk[0, 0].T  # (T, T): same q and k at every position
    for offset in (0, 3, -5):
        diagonal = torch.diagonal(scores, offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=1e-4, atol=1e-4)


def test_sinusoidal_encoding_matches_the_formula():
    pe = sinusoidal(10, 8, "cpu")
    assert pe.shape == (10, 8)
    assert pe[3, 2].item() == pytest.approx(math.sin(3 / 10000 ** (2 / 8)), rel=1e-6)
    assert pe[3, 3].item() == pytest.approx(math.cos(3 / 10000 ** (2 / 8)), rel=1e-6)


def test_learned_positions_refuse_lengths_past_training_and_others_accept_them():
    s = Settings(context=8, d_model=16, n_head=2, n_layer=1)
    idx = torch.randint(0, 256, (2, 20))
    with pytest.raises(ValueError, match="learned absolute positions end at 8"):
        TinyLM(s, "learned")(idx)
    for method in ("alibi", "sinusoidal", "rotary", "none"):
        assert TinyLM(s, method)(idx).shape == (2, 20, 256)
    with pytest.raises(ValueError, match="unknown position method 'absolute'"):
        TinyLM(s, "absolute")


def test_alibi_model_is_causal():
    s = Settings(context=8, d_model=16, n_head=2, n_layer=2)
    model = TinyLM(s, "alibi").eval()
    idx = torch.randint(0, 256, (1, 12))
    changed = idx.clone()
    changed[0, 7:] = (changed[0, 7:] + 1) % 256
    torch.testing.assert_close(model(idx)[0, :7], model(changed)[0, :7])


@pytest.mark.parametrize("method", ["alibi", "rotary", "none"])
def test_the_attention_weights_read_out_are_the_ones_each_block_attends_with(method):
    """TinyLM.attention_weights, the instrument 09's experiment reads heads with: each block's weights times its
    values are the attention the block computes (its fused path for ALiBi), causal, rows summing to 1."""
    s = Settings(context=8, d_model=16, n_head=4, n_layer=2)
    torch.manual_seed(0)
    model = TinyLM(s, method).eval()
    idx = torch.randint(0, 256, (2, 11))
    weights = model.attention_weights(idx)
    x = model.embedded(idx)
    with torch.no_grad():
        for block, w in zip(model.blocks, weights, strict=True):
            assert w.shape == (2, 4, 11, 11) and bool((w.triu(1) == 0).all())
            torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 11))
            _, _, v = block.heads(block.ln1(x))
            expected = block.attention(block.ln1(x))
            got = block.proj((w @ v).transpose(1, 2).reshape(x.shape))
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
            x = block(x)


def test_slopes_given_are_the_ones_attended_with_and_learned_ones_train_and_stay_positive():
    """09's ablation: a schedule of one's own is what the heads use; learned slopes get gradients, move, stay
    positive; a schedule that is not one slope per head, or not positive, is refused saying what was expected."""
    s = Settings(context=8, d_model=16, n_head=4, n_layer=1)
    torch.manual_seed(0)
    flat = TinyLM(replace(s, slopes=(0.5,) * 4), "alibi").eval()
    weights = flat.attention_weights(torch.zeros(1, 6, dtype=torch.long))[0]  # equal tokens: the bias alone decides
    torch.testing.assert_close(weights[0, 0], weights[0, 3])
    torch.testing.assert_close(weights[0, 0, 5, 4] / weights[0, 0, 5, 3], torch.tensor(math.exp(0.5)))
    learned = TinyLM(replace(s, learn_slopes=True, steps=5), "alibi")
    before = learned.blocks[0].slopes.detach().clone()
    assert [n for n, _ in learned.named_parameters() if "slopes" in n] == ["blocks.0.log_slopes"]
    train(learned, corpus()[0], replace(s, learn_slopes=True, steps=5, batch=4, lr=0.1))
    after = learned.blocks[0].slopes.detach()
    assert not torch.allclose(after, before) and bool((after > 0).all()), (before, after)
    for wrong in ((0.5,) * 3, (0.5, 0.25, -0.125, 0.0625)):
        with pytest.raises(ValueError, match="expected 4 positive numbers, one per head"):
            TinyLM(replace(s, slopes=wrong), "alibi")


def test_perplexity_of_a_uniform_model_is_256():
    class Uniform(torch.nn.Module):
        def eval(self):
            return self

        def forward(self, idx):
            return torch.zeros(*idx.shape, 256)

    # float32 cross-entropy: log(256) is rounded once, so the tolerance is float32's
    assert perplexity(Uniform(), torch.randint(0, 256, (1000,)), 50, "cpu") == pytest.approx(256, rel=1e-5)


def test_a_tiny_run_writes_deterministic_results(tmp_path):
    first = run(TINY, output=tmp_path, progress=False)
    second = run(TINY, progress=False)
    assert first["perplexity"] == second["perplexity"]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["perplexity"]) == set(METHODS)
    L = TINY.context
    assert saved["perplexity"]["learned"][str(2 * L)].startswith("error: learned absolute positions end at")
    assert isinstance(saved["perplexity"]["learned"][str(L)], float)
    for method in ("alibi", "sinusoidal", "rotary", "none"):
        assert all(1 < v < 1000 for v in saved["perplexity"][method].values()), method
    assert (tmp_path / "extrapolation.png").stat().st_size > 10_000


def test_quick_command_runs_end_to_end(tmp_path):
    """The --quick run, cut to 20 steps and two methods (the tiny run above trains all five): its numbers are
    noise, so only their form is checked here."""
    cmd = [sys.executable, "-m", "alibi_ref", "extrapolate", "--quick", "--steps", "20", "--methods", "alibi",
           "learned", "--output", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "perplexity per byte" in done.stdout and "alibi" in done.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["settings"]["steps"] == 20 and results["settings"]["eval_chunks"] == QUICK.eval_chunks
    assert set(results["perplexity"]) == {"alibi", "learned"}
    L = results["settings"]["context"]
    assert results["perplexity"]["learned"][str(2 * L)].startswith("error: learned absolute positions end at")


def test_bundled_default_run_shows_what_the_readme_says():
    """The bundled results.json (the default run) holds the paper's shape, as docs/extrapolation.md reports it."""
    results = json.loads(BUNDLED.read_text())
    ppl, L = results["perplexity"], results["settings"]["context"]
    assert results["settings"]["steps"] > QUICK.steps, "the bundled results must come from the default run"
    alibi = ppl["alibi"]
    assert alibi[str(8 * L)] <= 1.05 * alibi[str(L)]
    assert alibi[str(8 * L)] < ppl["sinusoidal"][str(8 * L)]
    assert alibi[str(8 * L)] < ppl["rotary"][str(8 * L)]
    assert isinstance(ppl["learned"][str(2 * L)], str)
