"""Where FlexAttention's ALiBi time goes on a GPU, and what might cut it (issue 15, item 4).

    python benchmarks/flex_tuning.py [--sizes 16384 4096] [--variants ...] [--output DIR] [--device cuda]

On an H200 (docs/performance.md, "CUDA") ``alibi_attention(impl="flex")`` took 1.4-2.0x plain SDPA at N = 16384 and
2.3-3.0x at 4096, bf16, where the goal is 1.2x. This splits that time: FlexAttention's own kernel with
nothing to add (``flex_no_bias``), the library's Python around the call (``direct`` calls the same compiled
kernel without it; ``compiled_whole`` compiles the call as a model compiled whole would), and candidates
for a cheaper kernel (score_mod forms, FlexAttention's ``kernel_options``, autotuning). Each variant's
output is first compared with the library's (``max_diff``, in the dtype's units: a variant that is fast and
wrong shows), then timed call for call in turn with plain SDPA, forward and forward+backward, both masks:

    synced   a call and a synchronisation, as ``bench`` times it: the host's time counts in full
    queued   ``--queue`` calls back to back, then one synchronisation: the time a call adds in a model,
             where the host prepares the next call while the GPU runs this one

Each row is printed and appended to DIR/flex_tuning.jsonl as it is measured, so a run cut short keeps
what it measured; a variant that fails (a block size the kernel cannot take, an option this torch
lacks) gets a row with its error. On the CPU it runs too (small N; the kernel-option variants are
CUDA's and are skipped), which is how the test suite keeps it working.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from alibi_ref import alibi_attention, get_slopes
from alibi_ref.flex import _causal_block_mask, _compiled_flex_attention, _offset, alibi_score_mod

# a variant: (what it is, which masks it takes: None both, True causal only, whether it needs CUDA)
VARIANTS = {
    "flex_no_bias": ("FlexAttention's kernel with no score_mod, the same block mask", None, False),
    "library": ("alibi_attention(impl='flex'), as a user calls it", None, False),
    "direct": ("the same compiled kernel and score_mod, called without alibi_attention's checks", None, False),
    "compiled_whole": ("torch.compile(fullgraph) around the alibi_attention call, as in a model", None, False),
    "sdpa_bias": ("alibi_attention(impl='sdpa'): SDPA reading the bias built for the call", None, False),
    "positions": ("flex with explicit positions and a key padding mask (all real here): read in the kernel",
                  None, True),
    "sdpa_positions": ("the same on alibi_attention(impl='sdpa'), which builds the (B, H, i, j) bias", None, True),
    "flex_reach": ("the library's score_mod and a block mask per head that skips the tiles beyond each head's reach "
                   "(alibi_ref.reach; read from q and k at each call, the mask cached per reach)", None, False),
    "key_term_only": ("causal: + m j, the query's term -m i' dropped (softmax is shift-invariant per row)",
                      True, False),
    "rows_safe": ("kernel_options ROWS_GUARANTEED_SAFE (every query keeps a key); causal: BLOCKS_ARE_CONTIGUOUS",
                  None, True),
    "tma": ("kernel_options USE_TMA (Hopper and later)", None, True),
    "prescale": ("kernel_options PRESCALE_QK (q scaled once, log2 base: a little less precise)", None, True),
    "blocks_128x128_w8_s3": ("BLOCK_M 128, BLOCK_N 128, 8 warps, 3 stages", None, True),
    "blocks_128x64_w4_s3": ("BLOCK_M 128, BLOCK_N 64, 4 warps, 3 stages", None, True),
    "blocks_64x128_w4_s2": ("BLOCK_M 64, BLOCK_N 128, 4 warps, 2 stages", None, True),
    "autotune": ("torch.compile(mode='max-autotune-no-cudagraphs'): inductor tries the kernel's configurations",
                 None, True),
    "cudnn_alibi": ("cuDNN's flash SDPA with its own ALiBi (nvidia-cudnn-frontend, carried as a wheel: "
                    "gpu_check.sh): causal only, the paper's slopes only, forward only here", True, True),
    "cudnn_bias": ("alibi_attention(impl='sdpa') on torch's cuDNN SDPA backend (forced): cuDNN reading the bias "
                   "built for the call, in q's dtype (public anchor: about 1.13x plain on an H100)", None, True),
    "cudnn_strided": ("alibi_attention(impl='strided') on torch's cuDNN SDPA backend (forced): cuDNN reading the "
                      "strided view of one row per head", None, True),
}
# at most this multiple of plain SDPA, bf16, forward and forward+backward (issue 15, item 4): a line in the plot
GOAL = 1.2
# variants with no backward here: their fwd+bwd rows are left out
FORWARD_ONLY = {"cudnn_alibi"}


def key_term_only(slopes):
    """The causal form without the query's term: -m (i' - j) = -m i' + m j, and -m i' is the same for every key
    of the row, which softmax ignores. (The library's causal form is already -m (i' - j) without abs, which an H100
    runs faster than the form with abs, to the same output.)"""

    def key_term(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * kv_idx

    return key_term


def reach_block_mask(slopes, causal: bool):
    """A function (q, k) -> FlexAttention block mask hiding the keys beyond each head's reach (``alibi_ref.reach``:
    they hold under eps / 8 of any row's weight) and, causal, the keys ahead. The reach is read from q and k at
    each call (a device sync, counted in the time), rounded up to 128 keys, and a mask cached per rounded reach,
    built from the tiles' corners as the library's causal mask (``flex._band_block_mask``)."""
    from alibi_ref.flex import _band_block_mask
    from alibi_ref.reach import head_reach

    masks = {}

    def block_mask(q, k):
        q_len, k_len, groups = q.shape[-2], k.shape[-2], q.shape[-3] // k.shape[-3]
        reach = [k_len if r is None else min(k_len, -(-r // 128) * 128)
                 for r in head_reach(q, k, slopes, q.shape[-1] ** -0.5, groups)]
        key = (tuple(reach), q_len, k_len)
        if key not in masks:
            reach = [r for r in reach for _ in range(groups)]  # per query head
            limit = torch.tensor(reach, device=q.device)  # (H,)
            offset = k_len - q_len

            def near(b, h, q_idx, kv_idx):
                behind = q_idx + offset - kv_idx  # i' - j
                seen = (behind <= limit[h]) & (behind >= -limit[h])
                return seen & (behind >= 0) if causal else seen

            masks[key] = _band_block_mask(q_len, k_len, q.device, [0 if causal else -r for r in reach], reach, near)
        return masks[key]

    return block_mask


def kernel_options(variant: str, causal: bool) -> dict | None:
    if variant == "rows_safe":
        return {"ROWS_GUARANTEED_SAFE": True, **({"BLOCKS_ARE_CONTIGUOUS": True} if causal else {})}
    if variant == "tma":
        return {"USE_TMA": True}
    if variant == "prescale":
        return {"PRESCALE_QK": True}
    if variant.startswith("blocks_"):
        size, warps, stages = variant.removeprefix("blocks_").split("_")
        block_m, block_n = size.split("x")
        return {"BLOCK_M": int(block_m), "BLOCK_N": int(block_n), "num_warps": int(warps[1:]),
                "num_stages": int(stages[1:])}
    return None


def cudnn_alibi():
    """cuDNN's fused attention with ``use_alibi_mask``: it adds m_h (j - i) with m_h the paper's slopes for the number
    of heads, computed inside cuDNN, and only beside a causal mask (cuDNN refuses it otherwise), so it is ALiBi for
    causal attention with as many queries as keys. One cuDNN graph built per shape and dtype."""
    import cudnn

    graphs = {}

    def attend(q, k, v):
        q, k, v = (x.contiguous() for x in (q, k, v))  # the graph is built for these strides
        key = (tuple(q.shape), tuple(k.shape), q.dtype)
        if key not in graphs:
            with cudnn.Graph(handle="auto", io_data_type=q.dtype, intermediate_data_type=torch.float32,
                             compute_data_type=torch.float32, inputs=["sdpa::q", "sdpa::k", "sdpa::v"],
                             outputs=["out"]) as graph:
                out, _ = graph.sdpa(name="sdpa", q=q, k=k, v=v, attn_scale=q.shape[-1] ** -0.5, is_inference=True,
                                    use_causal_mask=True, use_alibi_mask=True)
                out.set_output(True).set_name("out").set_dim(list(q.shape)).set_stride(list(q.stride()))
            graphs[key] = graph
        return graphs[key](q, k, v)

    return attend


def on_cudnn(impl: str, slopes, causal: bool):
    """``alibi_attention(impl=impl)`` with torch's SDPA held to its cuDNN backend (it raises where cuDNN refuses the
    call). The backward runs the backend the forward chose."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def attend(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return alibi_attention(q, k, v, slopes, causal=causal, impl=impl)

    return attend


def attention(variant: str, slopes, causal: bool):
    """The variant as a function of (q, k, v)."""
    if variant == "cudnn_alibi":
        return cudnn_alibi()
    if variant in ("cudnn_bias", "cudnn_strided"):
        return on_cudnn("sdpa" if variant == "cudnn_bias" else "strided", slopes, causal)
    if variant in ("library", "sdpa_bias"):
        impl = "flex" if variant == "library" else "sdpa"
        return lambda q, k, v: alibi_attention(q, k, v, slopes, causal=causal, impl=impl)
    if variant in ("positions", "sdpa_positions"):
        impl = "flex" if variant == "positions" else "sdpa"

        def padded(q, k, v):  # the default positions, given explicitly: the same numbers by the per-row route
            k_positions = torch.arange(k.shape[-2], device=q.device).expand(q.shape[0], -1)
            return alibi_attention(q, k, v, slopes, causal=causal, impl=impl, k_positions=k_positions,
                                   q_positions=k_positions[:, k.shape[-2] - q.shape[-2]:],
                                   key_padding_mask=torch.ones_like(k_positions, dtype=torch.bool))

        return padded
    if variant == "compiled_whole":
        return torch.compile(lambda q, k, v: alibi_attention(q, k, v, slopes, causal=causal, impl="flex"),
                             fullgraph=True, dynamic=False)
    if variant == "autotune":
        from torch.nn.attention.flex_attention import flex_attention

        attend = torch.compile(flex_attention, dynamic=False, mode="max-autotune-no-cudagraphs")
    else:
        attend = _compiled_flex_attention()

    reach_mask = reach_block_mask(slopes, causal) if variant == "flex_reach" else None

    def flex(q, k, v):
        q_len, k_len = q.shape[-2], k.shape[-2]
        offset = _offset(q_len, k_len, q.device)
        score_mod = (None if variant == "flex_no_bias" else key_term_only(slopes) if variant == "key_term_only"
                     else alibi_score_mod(slopes, offset, behind_only=causal))
        if reach_mask is not None:
            mask = reach_mask(q, k)
        else:
            mask = _causal_block_mask(q_len, k_len, q.device) if causal and q_len > 1 else None  # as the library
        return attend(q, k, v, score_mod=score_mod, block_mask=mask, kernel_options=kernel_options(variant, causal))

    return flex


def measure(variant: str, n: int, causal: bool, backward: bool, dtype, device, repeat: int, queue: int,
            decode: bool = False) -> dict:
    """One row. ``decode``: one query against N keys, a batch of 8 (a decoding step with a KV cache)."""
    gen = torch.Generator(device=device).manual_seed(0)
    batch, q_len = (8, 1) if decode else (1, n)
    q, upstream = (torch.randn(batch, 8, q_len, 64, device=device, generator=gen).to(dtype) for _ in range(2))
    k, v = (torch.randn(batch, 8, n, 64, device=device, generator=gen).to(dtype) for _ in range(2))
    q, k, v = (x.requires_grad_(backward) for x in (q, k, v))  # (B, H, N, d)
    slopes = torch.tensor(get_slopes(8), dtype=torch.float32, device=device)
    row = {"variant": variant, "n": n, "q_len": q_len, "batch": batch, "causal": causal,
           "pass": "fwd+bwd" if backward else "fwd", "dtype": str(dtype).removeprefix("torch."), "device": str(device)}
    try:
        fn = attention(variant, slopes, causal)
        with torch.no_grad():
            out = fn(q, k, v)
            if variant != "flex_no_bias":
                reference = alibi_attention(q, k, v, slopes, causal=causal, impl="flex")
                row["max_diff_in_eps"] = float((out.float() - reference.float()).abs().max()) / torch.finfo(dtype).eps
    except Exception as err:  # a variant this torch or GPU cannot run is a result too
        return {**row, "error": f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"}
    # the floor: one query is the last position and sees every key (is_causal would align it to the first)
    plain = (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal and not decode))  # noqa: E731

    def call(f):
        out = f(q, k, v)
        if backward:
            out.backward(upstream)

    def synced(f) -> float:
        sync(device)
        start = time.perf_counter()
        call(f)
        sync(device)
        return time.perf_counter() - start

    def queued(f) -> float:
        sync(device)
        start = time.perf_counter()
        for _ in range(queue):
            call(f)
        sync(device)
        return (time.perf_counter() - start) / queue

    for f in (fn, plain):
        call(f)  # warm-up, and the backward's compilation
    for how, timer in (("synced", synced), ("queued", queued)):
        times, plain_times = [], []
        for _ in range(repeat):
            times.append(timer(fn))
            plain_times.append(timer(plain))
        row[f"{how}_ms"] = statistics.median(times) * 1e3
        row[f"{how}_plain_ms"] = statistics.median(plain_times) * 1e3
        row[f"{how}_ratio"] = row[f"{how}_ms"] / row[f"{how}_plain_ms"]
    q.grad = k.grad = v.grad = None
    return row


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def applicable(variant: str, causal: bool, device) -> bool:
    _, masks, needs_cuda = VARIANTS[variant]
    return (masks is None or masks == causal) and (device.type == "cuda" or not needs_cuda)


def line(row: dict) -> str:
    shape = f"N={row['n']}" if row["q_len"] == row["n"] else f"1 of N={row['n']}, B={row['batch']}"
    setting = f"{shape:<16} {'causal' if row['causal'] else 'sym':6} {row['pass']:7} {row['variant']:22}"
    if "error" in row:
        return f"{setting} failed: {row['error']}"
    diff = f"max diff {row['max_diff_in_eps']:6.1f} eps" if "max_diff_in_eps" in row else " " * 19
    return (f"{setting} synced {row['synced_ms']:8.3f} ms {row['synced_ratio']:5.2f}x   queued {row['queued_ms']:8.3f}"
            f" ms {row['queued_ratio']:5.2f}x   (plain {row['queued_plain_ms']:.3f} ms)   {diff}")


def plot(rows: list[dict], path: Path) -> None:
    """Each variant's time as a multiple of plain SDPA's ("synced"), a group of bars per size, mask and pass, one
    panel per size (the bench's ``ratio_bars``); a variant measured twice shows its last row."""
    from matplotlib.figure import Figure

    from alibi_ref.lab.bench import ratio_bars

    timed = [{"path": r["variant"], "n": r["n"], "causal": r["causal"], "pass": r["pass"], "ratio": r["synced_ratio"]}
             for r in rows if "synced_ratio" in r and r["q_len"] == r["n"]]
    sizes = sorted({r["n"] for r in timed}, reverse=True)
    if not sizes:
        return
    fig = Figure(figsize=(10, 4 * len(sizes)), layout="constrained")
    for ax, n in zip(fig.subplots(len(sizes), 1, squeeze=False)[:, 0], sizes, strict=True):
        ratio_bars(ax, [r for r in timed if r["n"] == n])
        ax.axhline(GOAL, color="0.3", linewidth=1, linestyle=":")  # issue 15's goal for the CUDA path
        ax.annotate(f"goal {GOAL:g}x", (1.0, GOAL), xycoords=("axes fraction", "data"), ha="right", va="bottom",
                    fontsize="x-small")
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16384, 4096])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), metavar="VARIANT",
                        help=f"default: all that apply ({', '.join(VARIANTS)})")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--queue", type=int, default=10, help="calls back to back in a queued timing")
    parser.add_argument("--passes", nargs="+", choices=("fwd", "fwd+bwd"),
                        help="default: both on CUDA; the CPU's FlexAttention has no backward")
    parser.add_argument("--masks", nargs="+", default=["symmetric", "causal"], choices=("symmetric", "causal"),
                        help="which masks, in this order (a run cut short keeps the first's rows)")
    parser.add_argument("--decode", action="store_true", help="one query against N keys, B = 8, causal: a "
                        "decoding step (forward)")
    parser.add_argument("--output", type=Path, default=Path("flex_tuning"))
    parser.add_argument("--plot-from", type=Path, nargs="+", metavar="JSONL", help="measure nothing: plot these "
                        "files' rows into OUTPUT/flex_tuning.png")
    parser.add_argument("--no-plot", action="store_true", help="no OUTPUT/flex_tuning.png after measuring (a lent "
                        "GPU's few files: plot the rows back home with --plot-from)")
    args = parser.parse_args(argv)
    if args.plot_from:
        args.output.mkdir(parents=True, exist_ok=True)
        plot([json.loads(text) for f in args.plot_from for text in f.read_text().splitlines()],
             args.output / "flex_tuning.png")
        return
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    passes = args.passes or (["fwd", "fwd+bwd"] if device.type == "cuda" and not args.decode else ["fwd"])
    args.output.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}; "
          f"{args.dtype}, B = {8 if args.decode else 1}, H = 8, d = 64; ratios to plain SDPA timed in turn", flush=True)
    with open(args.output / "flex_tuning.jsonl", "a") as log:
        for n in args.sizes:
            for causal in (True,) if args.decode else [mask == "causal" for mask in args.masks]:
                for variant in (v for v in args.variants if applicable(v, causal, device)):
                    torch._dynamo.reset()  # each variant compiled afresh: none of another's cache entries, no limit
                    for pass_ in (p for p in passes if not (p == "fwd+bwd" and variant in FORWARD_ONLY)):
                        row = measure(variant, n, causal, pass_ == "fwd+bwd", dtype, device, args.repeat, args.queue,
                                      args.decode)
                        print(line(row), flush=True)
                        log.write(json.dumps(row) + "\n")
                        log.flush()
    if not args.no_plot:
        plot([json.loads(text) for text in (args.output / "flex_tuning.jsonl").read_text().splitlines()],
             args.output / "flex_tuning.png")


if __name__ == "__main__":
    sys.exit(main())
