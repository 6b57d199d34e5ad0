"""How long each solution notebook takes to run top to bottom in a fresh kernel.

    .venv/bin/python benchmarks/notebook_times.py [--repeat N]

The course's target is under 30 s per notebook on 2 CPU cores. This prints figures; it asserts nothing.
"""

import argparse
import statistics
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

SOLUTIONS = Path(__file__).resolve().parents[1] / "solutions" / "alibi"


def run_once(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per notebook; the median is reported")
    args = parser.parse_args()
    print(f"{'notebook':<24} {'median s':>9} {'min s':>7} {'max s':>7}   (kernel start included)")
    for path in sorted(SOLUTIONS.glob("*.ipynb")):
        times = [run_once(path) for _ in range(args.repeat)]
        print(f"{path.stem:<24} {statistics.median(times):9.2f} {min(times):7.2f} {max(times):7.2f}", flush=True)


if __name__ == "__main__":
    main()
