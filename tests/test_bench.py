import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from alibi_ref import alibi_attention, get_slopes
from alibi_ref.lab import bench
from alibi_ref.lab.bench import measure_in_fresh_process, run, table

ROOT = Path(__file__).resolve().parents[1]


def test_a_measurement_reports_time_and_the_bias_memory():
    spec = {"n": 512, "causal": False, "heads": 4, "head_dim": 32, "device": "cpu", "repeat": 3}
    plain = measure_in_fresh_process({**spec, "path": "plain_sdpa"})
    biased = measure_in_fresh_process({**spec, "path": "sdpa_float_bias"})
    assert plain["seconds"] > 0 and plain["gflops"] > 0
    # the materialised (H, N, N) float32 bias alone is 4 MiB here: it must show up in the peak
    assert biased["peak_bytes"] >= 4 * 512 * 512 * 4 * 0.9, biased
    assert plain["peak_bytes"] < biased["peak_bytes"]


def test_bench_command_writes_a_table_json_and_plot(tmp_path):
    # each row is two fresh interpreters (time, then memory): one size and one path (timed against plain SDPA in
    # its own process) keep it to 8 of them
    cmd = [sys.executable, "-m", "alibi_ref", "bench", "--sizes", "128", "--heads", "2", "--head-dim", "16",
           "--repeat", "3", "--paths", "naive", "--output", str(tmp_path),
           "--keep-denormals", "--dtype", "bfloat16", "--default-malloc", "--backward", "--batch", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    written = json.loads((tmp_path / "bench.json").read_text())
    settings = written["settings"]
    assert settings["keep_denormals"] is True and settings["default_malloc"] is True and settings["dtype"] == "bfloat16"
    assert settings["backward"] is True and settings["batch"] == 2
    rows = written["rows"]
    assert len(rows) == 1 * 2 * 2 * 1, "sizes x masks x (forward, forward+backward) x paths"
    assert {r["pass"] for r in rows} == {"fwd", "fwd+bwd"} and {r["batch"] for r in rows} == {2}
    assert {r["path"] for r in rows} == {"naive"}
    for row in rows:  # against plain SDPA timed in the same process
        assert row["seconds"] > 0 and row["plain_seconds"] > 0, row
        assert row["ratio"] == pytest.approx(row["seconds"] / row["plain_seconds"]), row
    assert (tmp_path / "bench.png").stat().st_size > 10_000
    assert "x plain" in done.stdout and "fwd+bwd" in done.stdout
    # the fastest ALiBi path of each setting, as the rows say
    for n, causal, kind in {(r["n"], r["causal"], r["pass"]) for r in rows}:
        best = min((r for r in rows if (r["n"], r["causal"], r["pass"]) == (n, causal, kind)
                    and r["path"] != "plain_sdpa"), key=lambda r: r["ratio"])
        mask = "causal" if causal else "symmetric"
        assert f"N = {n}, {mask}, {kind}: {best['path']} {best['ratio']:.2f}x" in done.stdout, done.stdout



@pytest.mark.parametrize("backward", [False, True])
def test_the_backward_pass_runs_inside_each_timed_call(monkeypatch, backward):
    """fwd+bwd rows time the gradient too: the path's and plain SDPA's outputs get theirs back inside
    ``measure``'s timed calls (a hook on each output counts them; warm-up and 3 timed calls each)."""
    came_back, timed = [], []
    real_path, real_clock = bench._path, time.perf_counter

    def path_whose_gradient_is_counted(name, *args):
        attend = real_path(name, *args)

        def counted(q, k, v):
            out = attend(q, k, v)
            if out.requires_grad:
                out.register_hook(lambda grad: came_back.append((name, len(timed) % 2 == 1)))
            return out

        return counted

    def clock():  # the timer's start and stop alternate: odd count = inside a timed call
        timed.append(None)
        return real_clock()

    monkeypatch.setattr(bench, "_path", path_whose_gradient_is_counted)
    monkeypatch.setattr(bench.time, "perf_counter", clock)
    # keep_denormals: flushing them would change this whole test process (hypothesis then refuses floats)
    row = bench.measure("naive", 64, True, 2, 8, "cpu", repeat=3, keep_denormals=True, against_plain=True,
                        backward=backward)
    assert row["pass"] == ("fwd+bwd" if backward else "fwd")
    expected = [(name, True) for _ in range(4) for name in ("naive", "plain_sdpa")] if backward else []
    assert sorted(came_back) == sorted(expected)


def test_a_window_reaches_every_alibi_path_and_not_the_floor():
    """``--window``: each ALiBi path attends through it (the measured function's output is the windowed one), the
    floor does not; the rows, measured in their own processes, record it."""
    import torch

    slopes = torch.tensor(get_slopes(2), dtype=torch.float32)
    q, k, v = (torch.randn(1, 2, 200, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    windowed = alibi_attention(q, k, v, slopes, causal=True, window=(16, 0))
    assert not torch.allclose(windowed, alibi_attention(q, k, v, slopes, causal=True), atol=1e-3)
    for path in ("alibi_default", "naive", "sdpa_float_bias", "strided_mask"):
        torch.testing.assert_close(bench._path(path, slopes, True, (16, 0))(q, k, v), windowed, rtol=1e-4, atol=1e-5)
    plain = bench._path("plain_sdpa", slopes, True, (16, 0))(q, k, v)
    torch.testing.assert_close(plain, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    rows = run([200], heads=2, head_dim=8, repeat=1, paths=["plain_sdpa", "strided_mask"], progress=False,
               window=(16, 0))
    assert [r.get("window") for r in rows] == [[16, 0]] * 4 and all("error" not in r for r in rows), rows


def test_a_left_padded_batch_reaches_every_alibi_path_and_not_the_floor():
    """``--left-padded``: row b padded by b N / (2 B) keys with BLOOM's positions, for each ALiBi path; the
    floor attends to every key; the rows record it."""
    import torch

    padding = bench.left_padding(4, 200, "cpu")
    assert padding["key_padding_mask"].sum(-1).tolist() == [200, 175, 150, 125]
    slopes = torch.tensor(get_slopes(2), dtype=torch.float32)
    q, k, v = (torch.randn(4, 2, 200, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    padded = alibi_attention(q, k, v, slopes, causal=True, **padding)
    assert not torch.allclose(padded, alibi_attention(q, k, v, slopes, causal=True), atol=1e-3)
    for path in ("alibi_default", "naive", "sdpa_float_bias", "strided_mask"):
        torch.testing.assert_close(bench._path(path, slopes, True, padding=padding)(q, k, v), padded, rtol=1e-4,
                                   atol=1e-5)
    plain = bench._path("plain_sdpa", slopes, True, padding=padding)(q, k, v)
    torch.testing.assert_close(plain, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    rows = run([200], heads=2, head_dim=8, repeat=1, paths=["plain_sdpa", "strided_mask"], progress=False, batch=2,
               left_padded=True)
    assert [r.get("left_padded") for r in rows] == [True] * 4 and all("error" not in r for r in rows), rows

def test_a_failing_path_is_reported_not_fatal():
    rows = run([64], heads=2, head_dim=8, repeat=1, paths=["plain_sdpa"], progress=False)
    rows.append({"path": "flex_compiled", "n": 64, "causal": False, "error": "boom"})
    assert "error: boom" in table(rows)


def test_a_run_cut_short_leaves_the_rows_it_measured(tmp_path):
    """A lent GPU machine's time limit stops a run midway: each row is printed and saved as it finishes."""
    cmd = [sys.executable, "-m", "alibi_ref", "bench", "--sizes", "64", "128", "--heads", "2", "--head-dim", "8",
           "--repeat", "1", "--paths", "plain_sdpa", "naive", "--output", str(tmp_path)]
    buffered = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}  # as under `tee`
    run_ = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=buffered)
    saved = tmp_path / "bench.json"
    deadline = time.monotonic() + 120
    while not (saved.exists() and len(json.loads(saved.read_text())["rows"]) >= 2):
        assert run_.poll() is None and time.monotonic() < deadline, "no row saved while the run went on"
        time.sleep(0.2)
    run_.kill()
    printed, _ = run_.communicate()
    rows = json.loads(saved.read_text())["rows"]
    assert 2 <= len(rows) < 2 * 2 * 2, "saved as they finish, the run stopped before the end"
    assert rows[0]["path"] == "plain_sdpa" and rows[1]["path"] == "naive" and rows[1]["ratio"] > 0
    assert f"{rows[0]['n']:>6} {rows[0]['causal']!s:>6}     fwd plain_sdpa" in printed
    assert not (tmp_path / "bench.png").exists(), "the plot is drawn once, at the end"


def test_the_summary_names_the_fastest_path_beside_autos_choice():
    from alibi_ref.lab.bench import fastest

    def row(path, ratio, causal=False):
        return {"path": path, "n": 64, "causal": causal, "pass": "fwd", "ratio": ratio}

    rows = [row("plain_sdpa", 1.0), row("alibi_default", 1.3), row("strided_mask", 1.1),
            {**row("flex_compiled", 0.0), "error": "no compiler"},  # a failed path is no contender
            row("plain_sdpa", 1.0, True), row("alibi_default", 1.05, True), row("sdpa_float_bias", 2.0, True),
            row("flex_no_bias", 0.9, True)]  # a floor with no ALiBi in it, never "the fastest ALiBi path"
    del rows[3]["ratio"]
    assert fastest(rows).splitlines() == ["fastest ALiBi path, x plain SDPA:",
                                          "N = 64, symmetric, fwd: strided_mask 1.10x (alibi_default 1.30x)",
                                          "N = 64, causal, fwd: alibi_default 1.05x"]


@pytest.mark.parametrize("causal", [False, True])
def test_flex_with_no_bias_is_plain_attention(causal):
    """The floor that splits flex_compiled's cost into the kernel's own gap and ALiBi's: the same
    attention as plain SDPA, under the same causal block mask as the ALiBi calls."""
    import torch

    from alibi_ref.lab.bench import _path

    q, k, v = torch.randn(3, 1, 2, 128, 16, generator=torch.Generator().manual_seed(0))
    flex, plain = (_path(name, None, causal) for name in ("flex_no_bias", "plain_sdpa"))
    torch.testing.assert_close(flex(q, k, v), plain(q, k, v), rtol=1e-5, atol=1e-5)


def test_the_ratio_bars_show_each_paths_ratio_in_its_setting():
    from matplotlib.figure import Figure

    from alibi_ref.lab.bench import ratio_bars

    measured = [("plain_sdpa", 64, False, "fwd", 1.0), ("strided_mask", 64, False, "fwd", 1.3),
                ("flex_compiled", 64, False, "fwd", 2.0), ("strided_mask", 256, True, "fwd+bwd", 1.1)]
    rows = [{"path": path, "n": n, "causal": causal, "pass": kind, "ratio": ratio}
            for path, n, causal, kind, ratio in measured]
    ax = Figure().subplots()
    assert ratio_bars(ax, rows) is ax.figure
    heights = {}  # (path, the setting's place on the x axis): the bar's height
    for container in ax.containers:
        for bar in container:
            heights[container.get_label(), round(bar.get_x() + bar.get_width() / 2)] = bar.get_height()
    assert heights[("strided_mask", 0)] == 1.3 and heights[("flex_compiled", 0)] == 2.0
    assert heights[("strided_mask", 1)] == 1.1 and math.isnan(heights[("flex_compiled", 1)]), "no row: no bar"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["N=64\nsymmetric\nfwd", "N=256\ncausal\nfwd+bwd"]


def test_the_flex_tuning_script_checks_each_variant_against_the_library_and_times_it(tmp_path):
    """benchmarks/flex_tuning.py is run on a lent GPU's few minutes: it must work there the first time. On the
    CPU (forward only, no kernel options): one row per variant and mask, timed against plain SDPA, each
    variant's output held to the library's (a wrong score_mod form shows as a large difference)."""
    cmd = [sys.executable, "benchmarks/flex_tuning.py", "--sizes", "128", "--dtype", "float32", "--repeat", "2",
           "--queue", "2", "--variants", "direct", "key_term_only", "tma", "flex_reach", "--output", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "flex_tuning.jsonl").read_text().splitlines()]
    # tma is CUDA's; key_term_only takes the causal mask only
    assert sorted((r["variant"], r["causal"], r["pass"]) for r in rows) == [
        ("direct", False, "fwd"), ("direct", True, "fwd"), ("flex_reach", False, "fwd"), ("flex_reach", True, "fwd"),
        ("key_term_only", True, "fwd")]
    for row in rows:
        assert "error" not in row, row
        assert row["synced_ms"] > 0 and row["queued_plain_ms"] > 0
        assert math.isclose(row["queued_ratio"], row["queued_ms"] / row["queued_plain_ms"])
    diffs = {r["variant"]: r["max_diff_in_eps"] for r in rows if r["causal"]}
    assert diffs["direct"] == 0.0, diffs  # the library's own kernel and score_mod
    # the keys beyond each head's reach hold under eps / 8: what is left is the kernel's summing in other tiles
    assert all(r["max_diff_in_eps"] < 16 for r in rows if r["variant"] == "flex_reach"), rows
    # dropping the query's term moves each logit by m i' before the softmax, rounded in float32
    assert 0 < diffs["key_term_only"] < 200, diffs
    assert "key_term_only" in done.stdout and "max diff" in done.stdout
    assert (tmp_path / "flex_tuning.png").stat().st_size > 10_000, "the rows come as a plot too"
    replot = [sys.executable, "benchmarks/flex_tuning.py", "--plot-from", str(tmp_path / "flex_tuning.jsonl"),
              "--output", str(tmp_path / "again")]
    assert subprocess.run(replot, capture_output=True, check=False, cwd=ROOT).returncode == 0
    assert (tmp_path / "again" / "flex_tuning.png").stat().st_size > 10_000
    # a decoding step: one query (the last position) against N keys, a batch of 8; sdpa_bias reads the bias
    cmd = [*cmd[:cmd.index("--variants")], "--variants", "library", "sdpa_bias", "--decode", "--output",
           str(tmp_path / "decode")]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "decode" / "flex_tuning.jsonl").read_text().splitlines()]
    assert [(r["variant"], r["q_len"], r["batch"], r["causal"]) for r in rows] == [
        ("library", 1, 8, True), ("sdpa_bias", 1, 8, True)]
    assert rows[1]["max_diff_in_eps"] < 16, rows[1]  # the same attention by another kernel


def test_the_reach_benchmark_times_the_default_with_and_without_each_heads_reach(tmp_path):
    """benchmarks/reach.py: a row per size, mask and pass, each with both ratios, and the windows the reach gave
    (here from any length, every head whose window hides a key: the tuning options reach the library)."""
    cmd = [sys.executable, "benchmarks/reach.py", "--sizes", "512", "--repeat", "1", "--min-keys", "0",
           "--shown", "10", "--output", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "reach.jsonl").read_text().splitlines()]
    assert [(r["n"], r["causal"], r["backward"]) for r in rows] == [
        (512, False, False), (512, False, True), (512, True, False), (512, True, True)]
    for row in rows:
        assert row["plain_ms"] > 0 and row["reach"] > 0 and row["no_reach"] > 0, row
        narrowed = [w for w in row["windows"] if w is not None]
        assert narrowed and all(left < 511 for left, _ in narrowed), row  # the steep heads see windows
        assert all(right == 0 for _, right in narrowed) == row["causal"], row
    assert (tmp_path / "reach.png").stat().st_size > 10_000, "the rows come as a plot too"
