"""Grading speed: this autograder against one plain `nbgrader autograde` call, same submissions, same machine.

    .venv/bin/python benchmarks/grading.py [--students N] [--workers W] [--dask] [--skip-plain]

Every student hands in the full-marks sample submission (every notebook). The plain run is
nbgrader's own CLI, `nbgrader autograde alibi` over all students in one call (sequential, no
sandbox); ours is `autograder.grade` (workers in parallel, each kernel in bubblewrap), with the
local process pool and, with ``--dask``, on a Dask cluster of W single-threaded worker processes
on this machine (``LocalCluster``, one sandbox slot each). Each of ours is timed on a second run, after
a first that pays what a course pays once (nbgrader's generate_assignment, the reference's values for
the checks, JAX's compilation cache) and a Dask worker process once. Prints seconds per submission, the
ratio, and where a submission's time went: the kernels (start, imports, cells), the rest of
nbgrader's autograde, the feedback pages, and on Dask the recording of the results. Asserts nothing.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FULL_MARKS = ROOT / "autograder" / "sample_class" / "submissions" / "ada" / "alibi"


def plain_nbgrader(students: list[str], work: Path) -> float:
    course = work / "plain"
    shutil.copytree(ROOT / "solutions", course / "source")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    nbgrader = [sys.executable, "-m", "nbgrader"]
    subprocess.run([*nbgrader, "generate_assignment", "alibi", "--force", "--CourseDirectory.root=.",
                    "--log-level=ERROR"], cwd=course, env=env, check=True)
    for student in students:
        shutil.copytree(FULL_MARKS, course / "submitted" / student / "alibi")
    start = time.perf_counter()
    subprocess.run([*nbgrader, "autograde", "alibi", "--force", "--CourseDirectory.root=.", "--log-level=ERROR"],
                   cwd=course, env=env, check=True)
    return time.perf_counter() - start


def ours(students: list[str], work: Path, workers: int, scheduler: str | None = None) -> tuple[float, dict]:
    """(seconds, mean seconds per submission spent in each phase)"""
    from autograder import grade

    submissions = work / "submissions"
    if not submissions.exists():
        for student in students:
            shutil.copytree(FULL_MARKS, submissions / student / "alibi")
    out = work / ("dask" if scheduler else "ours")
    # untimed, once per course: generate_assignment, the reference's values, JAX's compilation cache, and on Dask
    # the worker processes' own copy of the reference's values (about 9 s each, once per worker process)
    grade(submissions, out, workers=workers, scheduler=scheduler, progress=False)
    for state in (out / "state").glob("*/*/done.sha256"):
        state.unlink()  # grade everyone again, with the assignment already generated
    start = time.perf_counter()
    report = grade(submissions, out, workers=workers, scheduler=scheduler, progress=False)
    seconds = time.perf_counter() - start
    assert all(t == sum(report.max_scores().values()) for t in report.totals().values()), report.totals()
    return seconds, _phases(out / "state", len(students))


def _phases(state: Path, n: int) -> dict:
    kernels = sum(json.loads(p.read_text()).get("seconds", 0) for p in state.glob("*/*/[!.]*.json"))
    timing = [json.loads(p.read_text()) for p in state.glob("*/*/.timing.json")]
    replays = [json.loads(p.read_text()) for p in state.glob("*/*/.replay_timing.json")]
    autograde = sum(t.get("autograde", 0) for t in timing)
    return {"kernels (start, imports, cells)": kernels / n,
            "the rest of nbgrader's autograde": (autograde - kernels) / n,
            "feedback pages": sum(t.get("feedback", 0) for t in timing + replays) / n,
            "recording on the instructor's side (Dask)": sum(t.get("autograde", 0) for t in replays) / n}


def dask_cluster(workers: int):
    from distributed import LocalCluster

    return LocalCluster(n_workers=workers, threads_per_worker=1, resources={"sandbox": 1}, processes=True,
                        dashboard_address=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=4)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--dask", action="store_true", help="also grade on a local Dask cluster of W workers")
    parser.add_argument("--skip-plain", action="store_true", help="do not time plain nbgrader")
    args = parser.parse_args()
    students = [f"student{i:02d}" for i in range(args.students)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_plain:
            rows.append(("plain `nbgrader autograde` (one call, sequential, unsandboxed)",
                         plain_nbgrader(students, Path(tmp)), {}))
        rows.append((f"autograder, local pool ({args.workers} workers, bubblewrap sandbox)",
                     *ours(students, Path(tmp), args.workers)))
        if args.dask:
            with dask_cluster(args.workers) as cluster:
                rows.append((f"autograder on Dask ({args.workers} workers, 1 sandbox slot each)",
                             *ours(students, Path(tmp), args.workers, cluster.scheduler_address)))
    n = len(students)
    print(f"{n} full submissions of {len(list(FULL_MARKS.glob('*.ipynb')))} notebooks, {os.cpu_count()} CPU cores")
    for name, seconds, phases in rows:
        print(f"{name:<64} {seconds:7.1f} s  {seconds / n:5.1f} s/submission")
        for phase, per in phases.items():
            if per:
                print(f"    {phase:<60} {per:5.1f} s per submission (of one process's time)")
    if not args.skip_plain:
        for name, seconds, _ in rows[1:]:
            print(f"throughput against plain nbgrader, {name.split(' (')[0]}: {rows[0][1] / seconds:.2f}x")


if __name__ == "__main__":
    main()
