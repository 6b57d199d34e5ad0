"""How much ALiBi costs on top of plain attention: time and peak memory of each path.

    python -m alibi_ref bench [--device cuda] [--sizes 1024 4096] [--dtype bfloat16] [--output DIR]

For each sequence length N and causal flag it runs, each in a fresh process so that one path's
memory never shows up in another's: plain scaled_dot_product_attention with no bias at all
(the floor), alibi_attention as it chooses by itself, the naive path, SDPA with the bias as a
float mask, SDPA with the bias as a strided view (alibi_ref.strided), FlexAttention compiled
with ALiBi as a score_mod, and the fused CPU kernel (alibi_ref.fused; a row that says why on CUDA)
(and, asked for by name, FlexAttention with no bias:
``flex_no_bias``). It prints the median time, the ratio to the floor (timed in turn
with the path, in the same process), GFLOP/s and the peak memory beyond the inputs, then the
fastest ALiBi path of each setting beside what alibi_default ran at (``fastest``), and writes
bench.json and bench.png. Every process flushes subnormal floats to zero before it starts (alibi_ref.denormals
says why ALiBi needs that on a CPU); --keep-denormals measures without. Timing processes keep
freed memory mapped (see measure_in_fresh_process); --default-malloc measures without. --window LEFT RIGHT
gives every ALiBi path a sliding window (``alibi_attention``'s ``window``), --left-padded a batch of prompts
(``left_padding``); the floors still attend to every key, and GFLOP/s still counts the work of the whole (causal)
matrix.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

# each path but the floors is alibi_attention with this impl ("auto": what it picks by itself)
IMPL_OF_PATH = {"alibi_default": "auto", "naive": "naive", "sdpa_float_bias": "sdpa", "strided_mask": "strided",
                "flex_compiled": "flex", "fused_kernel": "fused"}
# no bias at all: plain SDPA, the floor every ratio is taken to; and FlexAttention's own kernel with
# nothing to add, asked for by name, which splits flex_compiled's ratio into the kernel's gap to
# plain SDPA and what ALiBi's score_mod adds to it
FLOORS = ("plain_sdpa", "flex_no_bias")
PATHS = (*FLOORS, *IMPL_OF_PATH)
DEFAULT_PATHS = ("plain_sdpa", *IMPL_OF_PATH)
DTYPES = ("float32", "bfloat16", "float16")


def left_padding(batch: int, n: int, device):
    """A batch of prompts left-padded to n tokens, row b by b n / (2 B) (none, ..., nearly half), as a
    generation batch is: {key_padding_mask, q_positions, k_positions} with BLOOM's positions."""
    import torch

    pads = torch.arange(batch, device=device) * n // (2 * batch)
    keep = torch.arange(n, device=device) >= pads[:, None]  # (B, n)
    positions = (keep.cumsum(-1) - 1) * keep
    return {"key_padding_mask": keep, "q_positions": positions, "k_positions": positions}


def _path(name: str, slopes, causal: bool, window=None, padding=None):
    import torch.nn.functional as F

    from ..attention import alibi_attention

    if name == "plain_sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if name == "flex_no_bias":
        from ..flex import _causal_block_mask, _compiled_flex_attention

        def flex(q, k, v):  # the block mask that flex_compiled's causal calls use too
            mask = _causal_block_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
            return _compiled_flex_attention()(q, k, v, block_mask=mask)

        return flex
    if name not in IMPL_OF_PATH:
        raise ValueError(f"unknown path {name!r}; expected one of {', '.join(PATHS)}")
    return lambda q, k, v: alibi_attention(q, k, v, slopes, causal=causal, impl=IMPL_OF_PATH[name], window=window,
                                           **(padding or {}))


def call_seconds(fn, q, k, v, upstream=None) -> float:
    """Seconds for one call ``fn(q, k, v)``, and with ``upstream`` its backward pass from that gradient (q, k and
    v's gradients cleared first); a CUDA call waited for."""
    import torch

    start = time.perf_counter()
    out = fn(q, k, v)
    if upstream is not None:
        q.grad = k.grad = v.grad = None
        out.backward(upstream)
    if q.device.type == "cuda":
        torch.cuda.synchronize(q.device)
    return time.perf_counter() - start


def measure(path: str, n: int, causal: bool, heads: int, head_dim: int, device: str, repeat: int,
            keep_denormals: bool = False, dtype: str = "float32", against_plain: bool = False,
            backward: bool = False, batch: int = 1, window=None, left_padded: bool = False) -> dict:
    """One path at one size, in this process: median seconds and peak bytes beyond the inputs.

    ``backward``: time the forward and the backward pass together (what training costs), the
    gradient of every input; ``batch``: the batch size B of (B, H, N, d).

    ``against_plain``: time plain SDPA too, call for call in turn with the path, so that the
    ratio compares the two under the same conditions (on shared cores one process can run measurably
    slower than the next, which a ratio between two processes would count against the path);
    and sample no memory, since the sampling thread takes CPU time from the kernels' threads.
    """
    import torch

    from .. import bias_cache
    from ..denormals import flush_denormals
    from ..slopes import get_slopes

    if not keep_denormals:
        flush_denormals()  # for every path alike, before torch starts its threads: see alibi_ref.denormals
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device=dev, generator=gen).to(getattr(torch, dtype))
               .requires_grad_(backward) for _ in range(3))
    upstream = torch.randn(batch, heads, n, head_dim, device=dev, generator=gen).to(getattr(torch, dtype))
    slopes = torch.tensor(get_slopes(heads), dtype=torch.float32, device=dev)
    fn = _path(path, slopes, causal, window, left_padding(batch, n, dev) if left_padded else None)

    def seconds(f) -> float:
        return call_seconds(f, q, k, v, upstream if backward else None)

    plain = _path("plain_sdpa", slopes, causal) if against_plain and path != "plain_sdpa" else None
    for f in (fn, plain) if plain else (fn,):
        seconds(f)  # warm-up (and compilation)
    if not against_plain:
        bias_cache.clear()  # a bias cached between calls (alibi_ref.bias_cache) is the path's memory too: built again
    with contextlib.nullcontext() if against_plain else _PeakMemory(dev) as memory:
        times, plain_times = [], []
        for _ in range(repeat):
            times.append(seconds(fn))
            if plain:
                plain_times.append(seconds(plain))
    median = statistics.median(times)
    # forward: two (N x N x d) products per head; the backward pass does about 2.5 times that
    flops = 4 * batch * heads * n * n * head_dim * (0.5 if causal else 1.0) * (3.5 if backward else 1.0)
    row = {"path": path, "n": n, "causal": causal, "seconds": median, "gflops": flops / median / 1e9,
           "pass": "fwd+bwd" if backward else "fwd", "batch": batch, "window": window, "left_padded": left_padded}
    if plain:
        row["plain_seconds"] = statistics.median(plain_times)
    if not against_plain:
        return {**row, "peak_bytes": memory.peak}
    if dev.type == "cuda":
        # the caching allocator's peak is exact and costs no time: one more call gives it, no second process
        with _PeakMemory(dev) as memory:
            seconds(fn)
        row["peak_bytes"] = memory.peak
    return row


class _PeakMemory:
    """Peak memory allocated while the block runs, beyond what was allocated when it started.

    CUDA: the caching allocator's own peak. CPU: the process's resident memory at its highest (large
    tensors are mmapped, so freeing them returns the memory and a later allocation shows up again):
    Linux's own high-water mark, reset as the block starts, which misses nothing; where that cannot
    be reset, samples every half millisecond by a thread, which can miss a buffer that lives shorter.
    """

    def __init__(self, device):
        self.device, self.peak = device, 0

    def __enter__(self):
        import threading

        if self.device.type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        self._base = self._highest = _resident_bytes()
        self._thread = None
        if _reset_high_water_mark():
            return self
        self._stop = threading.Event()

        def sample():
            while not self._stop.is_set():
                self._highest = max(self._highest, _resident_bytes())
                time.sleep(0.0005)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            import torch

            self.peak = torch.cuda.max_memory_allocated(self.device) - self._base
        else:
            if self._thread is None:
                self._highest = _high_water_mark()
            else:
                self._stop.set()
                self._thread.join()
            self.peak = max(0, self._highest - self._base)
        return False


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _reset_high_water_mark() -> bool:
    """Set the kernel's peak resident memory (VmHWM) to the present one; False where Linux does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _high_water_mark() -> int:
    with open("/proc/self/status") as f:
        kib = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    return int(kib) * 1024


def _fresh(spec: dict, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-m", "alibi_ref.lab.bench", json.dumps(spec)],
                          capture_output=True, text=True, check=False, env={**os.environ, **env})
    if done.returncode != 0:
        return {**spec, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# glibc malloc told to keep what is freed: large buffers come back from the heap, already mapped
_KEPT_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def measure_in_fresh_process(spec: dict, default_malloc: bool = False) -> dict:
    """``measure(**spec)`` in new interpreters: no other path's memory or compiled code around.

    Time and memory come from two processes. glibc's malloc raises its mmap threshold as a
    process frees large blocks, after which big tensors come from the heap and reuse freed memory
    unseen; the memory run fixes the threshold so every large tensor is mmapped and the
    resident-memory samples see it. The timing run, unless ``default_malloc``, keeps freed memory
    mapped (_KEPT_MALLOC, what tcmalloc or jemalloc would do): with glibc's defaults, two paths
    timed in turn return their buffers to the system and fault every page back in on the next
    call (measured: about 600 page faults per call for either at N = 1024), an allocator cost
    that weighs on each path by the number of buffers it allocates, not by its arithmetic.
    """
    timed = _fresh({**spec, "against_plain": True}, {} if default_malloc else _KEPT_MALLOC)
    if "error" in timed or "peak_bytes" in timed:  # a CUDA run reads its peak itself (measure)
        return timed
    memory = _fresh({**spec, "repeat": 1}, {"MALLOC_MMAP_THRESHOLD_": "131072"})
    return {**timed, "peak_bytes": memory.get("peak_bytes", float("nan"))}


def run(sizes, device: str = "cpu", heads: int = 8, head_dim: int = 64, repeat: int = 10, paths=DEFAULT_PATHS,
        output: Path | None = None, progress: bool = True, keep_denormals: bool = False,
        dtype: str = "float32", default_malloc: bool = False, backward: bool = False, batch: int = 1,
        window=None, left_padded: bool = False) -> list[dict]:
    """Every path at every size, both masks; with ``backward`` a forward+backward row beside each forward one.

    Each row is printed (with ``progress``) and bench.json rewritten as it finishes, so that a run cut
    short (a time limit on a lent machine) still leaves what it measured; the plot comes at the end.
    """
    from tqdm import tqdm

    passes = (False, True) if backward else (False,)
    jobs = [(n, causal, path, bwd) for n in sizes for causal in (False, True) for bwd in passes for path in paths]
    settings = {"device": device, "dtype": dtype, "heads": heads, "head_dim": head_dim, "repeat": repeat,
                "keep_denormals": keep_denormals, "default_malloc": default_malloc, "backward": backward,
                "batch": batch, "window": window, "left_padded": left_padded}
    rows = []
    bar = tqdm(jobs, desc="bench", disable=None if progress else True)
    for n, causal, path, bwd in bar:
        spec = {"path": path, "n": n, "causal": causal, "heads": heads, "head_dim": head_dim, "device": device,
                "repeat": repeat if path != "naive" or n <= 4096 else 1, "keep_denormals": keep_denormals,
                "dtype": dtype, "backward": bwd, "batch": batch, "window": window, "left_padded": left_padded}
        row = measure_in_fresh_process(spec, default_malloc)
        if "seconds" in row:
            row["ratio"] = row["seconds"] / row.get("plain_seconds", row["seconds"])
        rows.append(row)
        if progress:
            bar.write(table([row]).splitlines()[-1])
            sys.stdout.flush()  # a run killed at a time limit has printed what it measured
        if output is not None:
            write(rows, Path(output), settings, plot=False)
    if output is not None:
        write(rows, Path(output), settings)
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'N':>6} {'causal':>6} {'pass':>7} {'path':<16} {'median ms':>10} {'x plain':>8} {'GFLOP/s':>8} "
             f"{'peak MiB':>9}"]
    for r in rows:
        kind = "fwd+bwd" if r.get("backward") or r.get("pass") == "fwd+bwd" else "fwd"
        if "error" in r:
            lines.append(f"{r['n']:>6} {r['causal']!s:>6} {kind:>7} {r['path']:<16} error: {r['error'][:60]}")
            continue
        lines.append(f"{r['n']:>6} {r['causal']!s:>6} {kind:>7} {r['path']:<16} {1e3 * r['seconds']:>10.2f} "
                     f"{r.get('ratio', math.nan):>8.2f} {r['gflops']:>8.1f} {r['peak_bytes'] / 2**20:>9.1f}")
    return "\n".join(lines)


def _setting(row: dict) -> tuple[int, bool, str]:
    """What a row was measured at: (N, causal, pass)."""
    return row["n"], row["causal"], row.get("pass", "fwd")


def fastest(rows: list[dict]) -> str:
    """For each size, mask and pass: the fastest ALiBi path and its time against plain SDPA, beside what
    ``alibi_default`` (``auto``) ran at: how far ``auto``'s choice is from the best there is on this machine.
    (Whether a path is correct is the tests' business: tests/test_fused_paths.py holds each to the naive one.)"""
    lines = []
    for key in dict.fromkeys(map(_setting, rows)):
        timed = [r for r in rows if _setting(r) == key and "ratio" in r and r["path"] not in FLOORS]
        if not timed:
            continue
        best = min(timed, key=lambda r: r["ratio"])
        auto = next((r for r in timed if r["path"] == "alibi_default"), None)
        line = f"N = {key[0]}, {'causal' if key[1] else 'symmetric'}, {key[2]}: {best['path']} {best['ratio']:.2f}x"
        lines.append(line + (f" (alibi_default {auto['ratio']:.2f}x)" if auto not in (None, best) else ""))
    return "\n".join(["fastest ALiBi path, x plain SDPA:", *lines]) if lines else ""


def write(rows: list[dict], output: Path, settings: dict, plot: bool = True) -> None:
    from matplotlib.figure import Figure

    output.mkdir(parents=True, exist_ok=True)
    partial = output / "bench.json.partial"  # replaced whole: a reader never sees half a file
    partial.write_text(json.dumps({"settings": settings, "rows": rows}, indent=2) + "\n")
    partial.replace(output / "bench.json")
    if not plot:
        return
    fig = Figure(figsize=(11, 8), layout="constrained")
    top, bottom = fig.subfigures(2, 1)
    ax_time, ax_mem = top.subplots(1, 2)
    ratio_bars(bottom.subplots(), rows)
    for index, path in enumerate(dict.fromkeys(r["path"] for r in rows)):  # a colour per path, a line style per mask
        for causal, style in ((False, "-"), (True, "--")):
            pts = [r for r in rows if r["path"] == path and r["causal"] == causal and "seconds" in r
                   and r.get("pass", "fwd") == "fwd"]
            if pts:
                label = f"{path} ({'causal' if causal else 'symmetric'})"
                line = {"linestyle": style, "marker": "o", "color": f"C{index % 10}"}
                ax_time.plot([r["n"] for r in pts], [1e3 * r["seconds"] for r in pts], label=label, **line)
                ax_mem.plot([r["n"] for r in pts], [r["peak_bytes"] / 2**20 for r in pts], **line)
    for ax, ylabel in ((ax_time, "median time (ms)"), (ax_mem, "peak memory beyond inputs (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(ylabel)
    ax_time.legend(fontsize="x-small")
    given = ([f"window (left, right) = {tuple(settings['window'])}"] if settings.get("window") else []) + \
        (["a left-padded batch"] if settings.get("left_padded") else [])
    if given:
        fig.suptitle(f"every ALiBi path with {' and '.join(given)}; the floors without")
    fig.savefig(output / "bench.png", dpi=110)


def ratio_bars(ax, rows: list[dict]):
    """Each path's time as a multiple of plain SDPA's, a group of bars per size, mask and pass; returns the figure."""
    settings = list(dict.fromkeys(_setting(r) for r in rows if "ratio" in r))
    paths = [p for p in dict.fromkeys(r["path"] for r in rows) if p != "plain_sdpa"]
    width = 0.8 / max(len(paths), 1)
    for index, path in enumerate(paths):
        ratio = {_setting(r): r["ratio"] for r in rows if r["path"] == path and "ratio" in r}
        ax.bar([x + (index - (len(paths) - 1) / 2) * width for x in range(len(settings))],
               [ratio.get(key, math.nan) for key in settings], width, label=path, color=f"C{index + 1}")
    ax.axhline(1.0, color="0.3", linewidth=1)  # plain SDPA itself
    ax.set_yscale("log")  # 1.1x and 1.5x stay apart beside a 15x
    ticks = [t for t in (1, 1.2, 1.5, 2, 3, 5, 10, 20, 50) if t <= max([r.get("ratio", 1) for r in rows] + [1]) * 1.2]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_xticks(range(len(settings)), [f"N={n}\n{'causal' if causal else 'symmetric'}\n{kind}"
                                         for n, causal, kind in settings], fontsize="small")
    ax.set_ylabel("time, x plain SDPA")
    ax.legend(fontsize="x-small", ncols=min(len(paths), 6))
    return ax.figure


if __name__ == "__main__":  # one measurement, in its own process (see run)
    print(json.dumps(measure(**json.loads(sys.argv[1]))))
