import subprocess
import sys

import chapter_values as ch
import numpy as np
import pytest
import torch

from alibi_ref.__main__ import main
from alibi_ref.course import cat_sat_on_mat, explain, multi_head_alibi


def parse_table(text: str, title: str, n_rows: int) -> np.ndarray:
    """The numbers of the table printed under ``title``."""
    lines = text[text.index(title):].splitlines()[2:2 + n_rows]
    return np.array([[float(x) for x in line.split()[1:]] for line in lines])


def test_example_prints_the_chapter_tables(capsys):
    main(["example"])
    text = capsys.readouterr().out
    np.testing.assert_array_equal(parse_table(text, "Head 1 weights", 5), ch.HEAD1_WEIGHTS)
    np.testing.assert_array_equal(parse_table(text, "Head 2 weights", 5), ch.HEAD2_WEIGHTS)
    np.testing.assert_array_equal(parse_table(text, "Averaged weights", 5), ch.AVERAGED_WEIGHTS)
    np.testing.assert_array_equal(parse_table(text, "Final output", 5), ch.OUTPUT)


def test_example_on_a_torch_device_prints_the_same(device, capsys):
    main(["example"])
    numpy_text = capsys.readouterr().out
    main(["example", "--device", str(device)])
    torch_text = capsys.readouterr().out
    assert numpy_text.split("\n", 1)[1] == torch_text.split("\n", 1)[1]
    assert f"torch on {device.type}" in torch_text


def test_example_from_jax_prints_the_chapter_tables(capsys):
    main(["example", "--backend", "jax"])
    text = capsys.readouterr().out
    assert "(JAX on " in text.splitlines()[0]
    np.testing.assert_array_equal(parse_table(text, "Head 1 weights", 5), ch.HEAD1_WEIGHTS)
    np.testing.assert_array_equal(parse_table(text, "Averaged weights", 5), ch.AVERAGED_WEIGHTS)
    np.testing.assert_array_equal(parse_table(text, "Final output", 5), ch.OUTPUT)
    with pytest.raises(SystemExit, match="--device is torch's"):
        main(["example", "--backend", "jax", "--device", "cpu"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback where no GPU exists")
def test_cuda_without_a_gpu_is_one_line_and_a_cpu_run():
    run = subprocess.run([sys.executable, "-m", "alibi_ref", "example", "--device", "cuda"],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0
    assert run.stderr.strip().count("\n") == 0 and "no CUDA GPU" in run.stderr
    assert "0.5527" in run.stdout and "Traceback" not in run.stderr


def test_slopes_command(capsys):
    main(["slopes", "12"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    np.testing.assert_allclose([float(r[2]) for r in rows], [-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5, -2.5, -3.5])


@pytest.mark.parametrize(("argv", "message"), [
    (["slopes", "0"], "n_heads must be a whole number >= 1"),
    (["slopes", "4", "--schedule", "cubic"], "invalid choice"),
    (["explain", "dog"], "unknown token 'dog'"),
    (["example", "--device", "abacus"], "not a device torch knows"),
])
def test_bad_arguments_give_a_message_not_a_traceback(argv, message):
    run = subprocess.run([sys.executable, "-m", "alibi_ref", *argv], capture_output=True, text=True, check=False)
    assert run.returncode != 0 and message in run.stderr and "Traceback" not in run.stderr


def test_explain_command_traces_cat(capsys):
    main(["explain", "cat"])
    text = capsys.readouterr().out
    assert "=== ALiBi trace for 'cat' (row 1) ===" in text
    assert "output = [0.3961, 0.1689]" in text and "output = [0.2120, 0.2977]" in text


def test_explain_matches_the_chapter_step_by_step():
    ex = cat_sat_on_mat()
    trace = explain(ex.Q, ex.K, ex.V, ex.tokens, "The")
    head2 = trace.heads[1]
    assert head2.slope == 0.25
    np.testing.assert_allclose(head2.scaled, ch.HEAD2_THE_SCALED, atol=ch.PRINTED_3DP_ATOL)
    np.testing.assert_allclose(head2.alibi, ch.HEAD2_THE_ALIBI, atol=ch.PRINTED_3DP_ATOL)
    np.testing.assert_allclose(head2.weights, ch.HEAD2_WEIGHTS[0], atol=ch.PRINTED_ATOL)
    on = explain(ex.Q, ex.K, ex.V, ex.tokens, 3).heads[0]
    np.testing.assert_array_equal(on.scaled, 0.0)
    np.testing.assert_array_equal(on.alibi, ch.HEAD1_ON_ALIBI)


def test_explain_rows_are_the_attention_rows():
    rng = np.random.default_rng(0)
    Q, K, V = rng.normal(size=(3, 7, 12))
    tokens = list("abcdefg")
    output, weights = multi_head_alibi(Q, K, V, 3)
    for query in range(7):
        trace = explain(Q, K, V, tokens, query, n_heads=3)
        for h, head in enumerate(trace.heads):
            np.testing.assert_allclose(head.weights, weights[h, query])
            np.testing.assert_allclose(head.output, output[query, 4 * h:4 * h + 4])
            ex = np.exp(head.alibi - head.alibi.max())
            np.testing.assert_allclose(head.weights, ex / ex.sum())


def test_explain_refuses_bad_queries():
    ex = cat_sat_on_mat()
    with pytest.raises(ValueError, match=r"query row must be in 0..4, got 5"):
        explain(ex.Q, ex.K, ex.V, ex.tokens, 5)
    with pytest.raises(ValueError, match="need one token per row of Q: 5 rows, got 4 tokens"):
        explain(ex.Q, ex.K, ex.V, ex.tokens[:4], 0)
