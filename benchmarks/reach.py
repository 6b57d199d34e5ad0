"""Each head's reach (alibi_ref.reach) on the CPU: the default path with it and without, against plain SDPA.

    python benchmarks/reach.py [--sizes 2048 4096 8192] [--keep-denormals] [--repeat 5] [--output DIR]

Times, call for call in turn in one process (shuffled each round, so that a slow spell of a shared
machine falls on every path alike), plain SDPA, the default path (``alibi_attention``, which takes the
reach from ``reach.MIN_KEYS`` keys) and the same path with the reach switched off; forward and
forward+backward, both masks, float32 (``--dtype``), B = 1, H = 8, d = 64. Prints each path's median as a ratio to
plain SDPA, and the windows the reach gave the heads. ``--keep-denormals``: without flushing subnormal
floats to zero (what a script that never calls ``alibi_ref.flush_denormals`` gets). Writes the rows to
``DIR/reach.jsonl`` and plots them, the ratio against N for each mask and pass, to ``DIR/reach.png``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

import alibi_ref.reach as reach
from alibi_ref import alibi_attention, flush_denormals, get_slopes
from alibi_ref.lab.bench import call_seconds


def paths(slopes, causal: bool) -> dict:
    def with_reach(q, k, v):
        return alibi_attention(q, k, v, slopes, causal=causal)

    def without_reach(q, k, v):
        kept = dict(reach.MIN_KEYS)
        reach.MIN_KEYS.update(dict.fromkeys(kept, float("inf")))
        try:
            return alibi_attention(q, k, v, slopes, causal=causal)
        finally:
            reach.MIN_KEYS.update(kept)

    def plain(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return {"plain": plain, "reach": with_reach, "no_reach": without_reach}


def time_paths(n: int, causal: bool, backward: bool, repeat: int, heads: int = 8, head_dim: int = 64,
               dtype=torch.float32) -> dict:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, head_dim, generator=gen).to(dtype).requires_grad_(backward) for _ in range(3))
    upstream = torch.randn(1, heads, n, head_dim, generator=gen).to(dtype)
    slopes = torch.tensor(get_slopes(heads), dtype=torch.float32)
    fns = paths(slopes, causal)

    def seconds(fn) -> float:
        return call_seconds(fn, q, k, v, upstream if backward else None)

    times = {name: [] for name in fns}
    for fn in fns.values():
        seconds(fn)  # warm-up
    for _ in range(repeat):
        order = list(fns)
        random.shuffle(order)
        for name in order:
            times[name].append(seconds(fns[name]))
    medians = {name: statistics.median(t) for name, t in times.items()}
    windows = reach.reach_windows(q, k, slopes, head_dim ** -0.5, causal, 1, None)
    return {"plain_ms": medians["plain"] * 1e3, "reach": medians["reach"] / medians["plain"],
            "no_reach": medians["no_reach"] / medians["plain"], "windows": windows}


def plot(rows: list[dict], path: Path) -> None:
    """The ratio to plain SDPA against N, with the reach and without, one panel per mask and pass."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, panels = plt.subplots(1, 4, figsize=(16, 3.6), sharey=True)
    for ax, (causal, backward) in zip(panels, [(False, False), (False, True), (True, False), (True, True)],
                                      strict=True):
        mine = [r for r in rows if r["causal"] == causal and r["backward"] == backward]
        for key, style in (("no_reach", "o--"), ("reach", "o-")):
            ax.plot([r["n"] for r in mine], [r[key] for r in mine], style, label=key.replace("_", " "))
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.axhline(1.1, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N (queries and keys)")
        ax.set_title(f"{'causal' if causal else 'symmetric'}, {'fwd+bwd' if backward else 'fwd'}")
    panels[0].set_ylabel("time / plain SDPA")
    panels[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds per row (default 5)")
    parser.add_argument("--min-keys", type=int, help=f"reach.MIN_KEYS for the reach path (default {reach.MIN_KEYS})")
    parser.add_argument("--shown", type=float,
                        help=f"reach.SHOWN_AT_MOST for the reach path (default {reach.SHOWN_AT_MOST})")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32", help="of q, k and v")
    parser.add_argument("--output", type=Path, default=Path("reach"), help="where reach.jsonl and reach.png go")
    parser.add_argument("--keep-denormals", action="store_true", help="do not flush subnormal floats to zero")
    args = parser.parse_args(argv)
    if args.min_keys is not None:  # a tuning run: the same for both states and masks
        reach.MIN_KEYS.update(dict.fromkeys(reach.MIN_KEYS, args.min_keys))
    if args.shown is not None:
        reach.SHOWN_AT_MOST = args.shown
    if not args.keep_denormals:
        flush_denormals()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, subnormals "
          f"{'kept' if args.keep_denormals else 'flushed'}; ratios to plain SDPA ({args.dtype}, B = 1, H = 8, d = 64)")
    print(f"{'N':>6} {'causal':>6} {'pass':>8} {'plain ms':>9} {'reach':>6} {'no reach':>8}  windows (left, right)")
    args.output.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(args.output / "reach.jsonl", "w") as jsonl:
        for n in args.sizes:
            for causal in (False, True):
                for backward in (False, True):
                    row = {"n": n, "causal": causal, "backward": backward, "subnormals_kept": args.keep_denormals,
                           "dtype": args.dtype,
                           **time_paths(n, causal, backward, args.repeat, dtype=getattr(torch, args.dtype))}
                    rows.append(row)
                    jsonl.write(json.dumps(row) + "\n")
                    windows = [w for w in row["windows"] or [] if w is not None]
                    print(f"{n:>6} {causal!s:>6} {'fwd+bwd' if backward else 'fwd':>8} {row['plain_ms']:>9.1f} "
                          f"{row['reach']:>5.2f}x {row['no_reach']:>7.2f}x  {windows}", flush=True)
    plot(rows, args.output / "reach.png")
    print(f"written to {args.output}/: reach.jsonl, reach.png")


if __name__ == "__main__":
    main()
