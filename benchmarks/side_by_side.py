"""``impl="auto"`` of two checkouts, side by side on the cells of the CPU bench table.

    python benchmarks/side_by_side.py OLD_CHECKOUT NEW_CHECKOUT --output DIR

Each cell runs ``python -m alibi_ref bench --paths plain_sdpa alibi_default`` in the old checkout, the new, the
new again and the old again (ABBA, so a drift of the machine's speed during the cell weighs on both alike), each
in a fresh interpreter with the checkout first on ``sys.path``. Every run's bench.json is kept under DIR. The
table compares alibi_default's ratio to plain SDPA in the same run (the bench table's cells), each checkout's
mean of its two runs, against the noise: the larger spread between one checkout's own two runs. The times are
beside it; between runs they move with the machine more than the ratios do.

    python benchmarks/side_by_side.py OLD NEW --output DIR --table   # the table again, from DIR's runs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

# (label, bench arguments): the cells of docs/performance.md's CPU table, then a window and a padded batch
CELLS = [
    ("fp32 N=64 B=32", ["--sizes", "64", "--batch", "32", "--backward"]),
    ("fp32 N=256 B=32", ["--sizes", "256", "--batch", "32", "--backward"]),
    ("fp32 N=256,1024 B=1", ["--sizes", "256", "1024", "--backward"]),
    ("fp32 N=4096 B=1", ["--sizes", "4096", "--backward", "--repeat", "5"]),
    ("bf16 N=64 B=32", ["--sizes", "64", "--batch", "32", "--backward", "--dtype", "bfloat16"]),
    ("bf16 N=256,1024 B=1", ["--sizes", "256", "1024", "--backward", "--dtype", "bfloat16"]),
    ("bf16 N=4096 B=1 fwd", ["--sizes", "4096", "--dtype", "bfloat16", "--repeat", "5"]),
    ("fp32 window (256, 256) N=1024", ["--sizes", "1024", "--window", "256", "256", "--backward"]),
    ("fp32 left-padded B=4 N=512", ["--sizes", "512", "--batch", "4", "--left-padded", "--backward"]),
]
ORDER = ("old", "new", "new", "old")


def run_cell(checkout: Path, args: list[str], output: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    subprocess.run([sys.executable, "-m", "alibi_ref", "bench", "--paths", "plain_sdpa", "alibi_default",
                    "--output", str(output), *args], cwd=checkout, env=env, check=True, capture_output=True)


def cell_folder(output: Path, label: str) -> Path:
    return output / label.replace(" ", "_").replace(",", "-").replace("=", "")


def measured(folder: Path) -> dict[tuple, tuple[float, float]]:
    """alibi_default's (seconds, ratio to plain SDPA) by (N, mask, pass), from one run's bench.json."""
    rows = json.loads((folder / "bench.json").read_text())["rows"]
    return {(row["n"], "causal" if row["causal"] else "symmetric", row["pass"]): (row["seconds"], row["ratio"])
            for row in rows if row["path"] == "alibi_default"}


def table(output: Path, labels: list[str]) -> None:
    """Per cell: alibi_default's ratio to plain SDPA, each checkout's mean of its two runs (the bench table's
    cell), the larger spread between one checkout's own two runs (the noise), and whether the new is slower than
    the old by more than that; then the times, whose floor moves with the machine between runs."""
    print(f"{'cell':30} {'N':>5} {'mask':9} {'pass':7} {'old x':>6} {'new x':>6} {'noise':>6} {'slower':>6} "
          f"{'old ms':>8} {'new ms':>8}")
    for label in labels:
        runs = {which: [measured(cell_folder(output, label) / f"{turn}-{which}")
                        for turn, w in enumerate(ORDER) if w == which] for which in ("old", "new")}
        for key in runs["new"][0]:
            old, new = ([run[key] for run in runs[which]] for which in ("old", "new"))
            noise = max(abs(a[1] - b[1]) for a, b in (old, new))
            old_x, new_x = statistics.mean(r for _, r in old), statistics.mean(r for _, r in new)
            print(f"{label:30} {key[0]:>5} {key[1]:9} {key[2]:7} {old_x:6.2f} {new_x:6.2f} {noise:6.2f} "
                  f"{'yes' if new_x - old_x > noise else 'no':>6} {statistics.mean(t for t, _ in old) * 1e3:8.2f} "
                  f"{statistics.mean(t for t, _ in new) * 1e3:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--cells", nargs="*", help="labels to run (default: all)")
    parser.add_argument("--table", action="store_true", help="print the table from the runs in --output, run nothing")
    options = parser.parse_args()
    checkouts = {"old": options.old.resolve(), "new": options.new.resolve()}
    labels = [label for label, _ in CELLS if not options.cells or label in options.cells]
    if not options.table:
        for label, args in CELLS:
            if label in labels:
                for turn, which in enumerate(ORDER):
                    run_cell(checkouts[which], args, cell_folder(options.output, label) / f"{turn}-{which}")
                print(f"measured {label}", file=sys.stderr, flush=True)
    table(options.output, [label for label in labels if (cell_folder(options.output, label) / "3-old").exists()])


if __name__ == "__main__":
    main()
