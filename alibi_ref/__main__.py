"""python -m alibi_ref: the chapter's worked example, slope tables and traces, live."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from .course import cat_sat_on_mat, explain, multi_head_alibi
from .slopes import SCHEDULES, get_slopes


def resolve_device(name: str | None):
    """None means NumPy. A device torch cannot use falls back to the CPU with one line on stderr."""
    if name is None:
        return None
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise SystemExit(f"error: --device {name!r} is not a device torch knows ({err})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"note: --device {name} asked for, but torch sees no CUDA GPU here; running on the CPU",
              file=sys.stderr)
        return torch.device("cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        print(f"note: --device {name} asked for, but MPS is not available; running on the CPU", file=sys.stderr)
        return torch.device("cpu")
    return device


def to_numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def table(matrix, rows, cols) -> str:
    width = max(7, *(len(str(c)) + 1 for c in cols), *(len(str(r)) + 1 for r in rows))
    lines = [" " * width + "".join(f"{c:>{width}}" for c in cols)]
    lines += [f"{r:<{width}}" + "".join(f"{x:>{width}.4f}" for x in row) for r, row in zip(rows, matrix, strict=True)]
    return "\n".join(lines)


def cmd_example(args) -> None:
    ex = cat_sat_on_mat()
    backend = args.backend or ("torch" if args.device else "numpy")
    if backend == "jax":
        if args.device:
            raise SystemExit("error: --device is torch's; --backend jax runs on JAX's default device")
        import jax

        with jax.enable_x64(True):  # float64, as the chapter's tables are computed
            print_example(ex, *(jax.numpy.asarray(x) for x in (ex.Q, ex.K, ex.V)),
                          where=f"JAX on {jax.devices()[0]}")
        return
    device = resolve_device(args.device or ("cpu" if backend == "torch" else None))
    Q, K, V = ex.Q, ex.K, ex.V
    if device is not None:
        import torch

        Q, K, V = (torch.tensor(x, dtype=torch.float64, device=device) for x in (Q, K, V))
    print_example(ex, Q, K, V, where="NumPy" if device is None else f"torch on {device}")


def print_example(ex, Q, K, V, where: str) -> None:
    slopes = get_slopes(2, "textbook")
    output, weights = (to_numpy(x) for x in multi_head_alibi(Q, K, V, 2, slopes))
    print(f"ALiBi on {' '.join(ex.tokens)!r}: d_model = 4, 2 heads, d_k = 2, slopes 1/2 and 1/4 ({where})\n")
    for h, m in enumerate(slopes):
        print(f"Head {h + 1} weights (m = {m:g}):\n{table(weights[h], ex.tokens, ex.tokens)}\n")
    print(f"Averaged weights (Head 1 + Head 2) / 2:\n{table(weights.mean(0), ex.tokens, ex.tokens)}\n")
    dims = [f"dim-{c}" for c in range(output.shape[1])]
    print(f"Final output (5x4):\n{table(output, ex.tokens, dims)}")


def cmd_slopes(args) -> None:
    slopes = get_slopes(args.n_heads, args.schedule, max_bias=args.max_bias)
    print(f"{args.schedule} slopes for {args.n_heads} heads")
    print(f"{'head':>4}  {'slope':>12}  {'log2':>7}  {'penalty at distance 10':>22}")
    for h, m in enumerate(slopes, start=1):
        log2 = f"{np.log2(m):7.3f}" if m > 0 else f"{'-inf':>7}"
        print(f"{h:>4}  {m:12.8f}  {log2}  {-10 * m:22.4f}")


def cmd_explain(args) -> None:
    ex = cat_sat_on_mat()
    query = int(args.token) if args.token.lstrip("-").isdigit() else args.token
    try:
        print(explain(ex.Q, ex.K, ex.V, ex.tokens, query, device=resolve_device(args.device)))
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None


def cmd_extrapolate(args) -> None:
    from dataclasses import replace

    from .lab.extrapolation import DEFAULT, METHODS, QUICK, run, table

    device = resolve_device(args.device) or "cpu"
    settings = replace(QUICK if args.quick else DEFAULT, device=str(device))
    if args.steps is not None:
        settings = replace(settings, steps=args.steps)
    results = run(settings, methods=args.methods or METHODS, output=args.output)
    print(table(results))
    print(f"\nwritten to {args.output}/: results.json, extrapolation.png")


def cmd_bench(args) -> None:
    from .lab.bench import fastest, run, table

    device = resolve_device(args.device) or "cpu"
    rows = run(args.sizes, device=str(device), heads=args.heads, head_dim=args.head_dim, repeat=args.repeat,
               paths=args.paths, output=args.output, keep_denormals=args.keep_denormals, dtype=args.dtype,
               default_malloc=args.default_malloc, backward=args.backward, batch=args.batch, window=args.window,
               left_padded=args.left_padded)
    print(table(rows))
    print(f"\n{fastest(rows)}")
    print(f"\nwritten to {args.output}/: bench.json, bench.png")


def cmd_build_kernel(args) -> None:
    from . import fused

    if fused.available():
        print(f"the fused CPU kernel is built: {fused.kernel_dir()}")
        return
    print("building the fused CPU kernel for this machine (a compile of some seconds, once) ...", flush=True)
    try:
        fused.build(verbose=args.verbose)
    except RuntimeError as failed:
        if not args.optional:
            raise SystemExit(str(failed)) from None
        print(f"WARNING: {failed}\nalibi_attention runs its other CPU paths instead (see alibi_ref.fused)")
        return
    print(f"built: {fused.kernel_dir()}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m alibi_ref", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def device_option(p, default: str) -> None:
        p.add_argument("--device", default=None,
                       help=f"run with torch on this device (cpu, cuda, cuda:1, mps); default: {default}")

    p = sub.add_parser("example", help="the chapter's worked tables, computed live")
    device_option(p, "NumPy")
    p.add_argument("--backend", choices=("numpy", "torch", "jax"), default=None,
                   help="numpy (default), torch (implied by --device) or jax")
    p.set_defaults(run=cmd_example)

    p = sub.add_parser("slopes", help="the slope of every head")
    p.add_argument("n_heads", type=int)
    p.add_argument("--schedule", choices=SCHEDULES, default="paper")
    p.add_argument("--max-bias", type=float, default=8.0, help="the 8 of the paper schedule (MPT's alibi_bias_max)")
    p.set_defaults(run=cmd_slopes)

    p = sub.add_parser("explain", help="trace one query of 'The cat sat on mat'")
    device_option(p, "NumPy")
    p.add_argument("token", help="a token (The, cat, sat, on, mat) or a row index")
    p.set_defaults(run=cmd_explain)

    p = sub.add_parser("extrapolate", help="train short, test long: ALiBi against other position methods")
    device_option(p, "the CPU")
    p.add_argument("--quick", action="store_true", help="a short run (about a minute on 2 cores), for CI")
    p.add_argument("--steps", type=int, default=None, metavar="N",
                   help="training steps per model (default 1100; 200 with --quick)")
    p.add_argument("--output", type=Path, default=Path("extrapolation"), help="where results.json and the plot go")
    p.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                   help="alibi, sinusoidal, rotary, none, learned (default: all)")
    p.set_defaults(run=cmd_extrapolate)

    from .lab.bench import DEFAULT_PATHS, DTYPES, PATHS

    p = sub.add_parser("bench", help="time and memory of each ALiBi path against plain SDPA")
    device_option(p, "the CPU")
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096], metavar="N",
                   help="sequence lengths, queries and keys alike (default: 1024 4096)")
    p.add_argument("--heads", type=int, default=8, help="attention heads H (default 8)")
    p.add_argument("--head-dim", type=int, default=64, help="head size d (default 64)")
    p.add_argument("--repeat", type=int, default=10, help="timed runs per measurement; the median is reported")
    p.add_argument("--paths", nargs="+", choices=PATHS, default=list(DEFAULT_PATHS),
                   help="default: all but flex_no_bias (FlexAttention with no bias, a floor for flex_compiled)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="of q, k and v")
    p.add_argument("--backward", action="store_true", help="also time forward+backward (training), beside forward")
    p.add_argument("--batch", type=int, default=1, help="batch size B (default 1)")
    p.add_argument("--window", type=int, nargs=2, metavar=("LEFT", "RIGHT"),
                   help="a sliding window for every ALiBi path (-1: no limit on that side); the floors have none")
    p.add_argument("--left-padded", action="store_true",
                   help="row b of the batch left-padded by b N / (2 B) tokens, BLOOM's positions, for every ALiBi "
                        "path (key_padding_mask and positions); the floors attend to every key")
    p.add_argument("--output", type=Path, default=Path("bench"), help="where bench.json and bench.png go")
    p.add_argument("--keep-denormals", action="store_true",
                   help="measure without flushing subnormal floats to zero (see alibi_ref.denormals)")
    p.add_argument("--default-malloc", action="store_true",
                   help="time with glibc malloc's defaults, which fault freed buffers back in "
                        "(see alibi_ref.lab.bench)")
    p.set_defaults(run=cmd_bench)

    p = sub.add_parser("build-kernel", help="build the fused CPU kernel for this machine (alibi_ref.fused)")
    p.add_argument("--optional", action="store_true", help="where it cannot be built, warn and exit 0")
    p.add_argument("--verbose", action="store_true", help="show the compiler's commands")
    p.set_defaults(run=cmd_build_kernel)

    args = parser.parse_args(argv)
    try:
        args.run(args)
    except ValueError as err:
        parser.error(str(err))


if __name__ == "__main__":
    main()
