"""Figures and tables of the lab's results, made without torch so the notebooks can import them cheaply.

Each function takes an optional matplotlib ``ax`` and returns the figure; without an ``ax`` it
draws on a new standalone ``Figure`` (not one of pyplot's), so widget callbacks leave no pyplot
figures behind.
"""

from __future__ import annotations


def axes(ax, figsize=(5, 4)):
    """``ax``, or the axes of a new standalone figure."""
    if ax is None:
        from matplotlib.figure import Figure

        ax = Figure(figsize=figsize, layout="constrained").add_subplot()
    return ax


def extrapolation_curves(results: dict, ax=None, *, methods=None, max_length: int | None = None):
    """Perplexity against evaluation length, one line per position method, from ``extrapolate``'s results."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax = axes(ax, (7, 4.5))
    L = results["settings"]["context"]
    for method, row in results["perplexity"].items():
        if methods is not None and method not in methods:
            continue
        shown = {int(n): v for n, v in row.items() if max_length is None or int(n) <= max_length}
        points = [(n, v) for n, v in shown.items() if isinstance(v, float)]
        if not points:
            continue
        line, = ax.plot(*zip(*points, strict=True), marker="o", label=method)
        failed = sorted(n for n, v in shown.items() if not isinstance(v, float))
        if failed:  # no number exists past the failure: mark where the method stops, and why
            ax.plot(failed, [0.97] * len(failed), "x", color=line.get_color(), markersize=9,
                    transform=ax.get_xaxis_transform())
            ax.annotate(f"{method}: no embedding past L", (failed[0], 0.93), xycoords=("data", "axes fraction"),
                        ha="left", va="top", fontsize=8, color=line.get_color())

    ax.axvline(L, color="gray", linestyle="--", linewidth=1)
    ax.annotate(" trained at L", (L, 0.98), xycoords=("data", "axes fraction"), ha="left", va="top", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    lengths = evaluated_lengths(results)
    ax.set_xticks(lengths, [f"{n}\n{n // L}L" for n in lengths])
    low, high = ax.get_ylim()
    ax.set_yticks([t for t in (1, 2, 3, 5, 10, 20, 30, 50, 100, 200, 500) if low <= t <= high])
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("evaluation length (bytes)")
    ax.set_ylabel("perplexity per byte (held out)")
    ax.set_title("train short, test long")
    # beside the plot, where it covers neither the "trained at L" mark nor a curve
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return ax.figure


def evaluated_lengths(results: dict) -> list[int]:
    """Every evaluation length in ``extrapolate``'s results, shortest first."""
    return sorted({int(n) for row in results["perplexity"].values() for n in row})


def table(results: dict) -> str:
    lengths = list(next(iter(results["perplexity"].values())))
    L = results["settings"]["context"]
    head = f"{'method':<11}" + "".join(f"{f'{int(n) // L}L={n}':>12}" for n in lengths) + f"{'seconds':>9}"
    lines = [f"perplexity per byte on {results['held_out_bytes']} held-out bytes (trained at L = {L})", head]
    for method, row in results["perplexity"].items():
        cells = "".join(f"{v:>12.3f}" if isinstance(v, float) else f"{'error':>12}" for v in row.values())
        lines.append(f"{method:<11}{cells}{results['seconds'][method]:>9.1f}")
    if any(isinstance(v, str) for row in results["perplexity"].values() for v in row.values()):
        lines.append("error: learned absolute positions have no embedding past L (nanoGPT asserts the same)")
    return "\n".join(lines)
