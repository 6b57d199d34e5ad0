"""Grading speed: this autograder against one plain `nbgrader autograde` call, same submissions, same machine.

    .venv/bin/python benchmarks/grading.py [--students N] [--workers W]

Every student hands in the full-marks sample submission (every notebook). The plain run is
nbgrader's own CLI, `nbgrader autograde alibi` over all students in one call (sequential, no
sandbox); ours is `autograder.grade` (workers in parallel, each kernel in bubblewrap). Prints
seconds per submission and the ratio; asserts nothing.
"""

import argparse
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


def ours(students: list[str], work: Path, workers: int) -> float:
    from autograder import grade

    submissions = work / "submissions"
    for student in students:
        shutil.copytree(FULL_MARKS, submissions / student / "alibi")
    grade(submissions, work / "ours", workers=workers, progress=False)  # generate_assignment, cached
    for state in (work / "ours" / "state").glob("*/done.sha256"):
        state.unlink()  # grade everyone again, with the assignment already generated
    start = time.perf_counter()
    report = grade(submissions, work / "ours", workers=workers, progress=False)
    seconds = time.perf_counter() - start
    assert all(t == sum(report.max_scores().values()) for t in report.totals().values()), report.totals()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=4)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    args = parser.parse_args()
    students = [f"student{i:02d}" for i in range(args.students)]
    with tempfile.TemporaryDirectory() as tmp:
        plain = plain_nbgrader(students, Path(tmp))
        mine = ours(students, Path(tmp), args.workers)
    n = len(students)
    print(f"{n} full submissions of {len(list(FULL_MARKS.glob('*.ipynb')))} notebooks, {os.cpu_count()} CPU cores")
    rows = [("plain `nbgrader autograde` (one call, sequential, unsandboxed)", plain),
            (f"autograder ({args.workers} workers, bubblewrap sandbox)", mine)]
    for name, seconds in rows:
        print(f"{name:<64} {seconds:7.1f} s  {seconds / n:5.1f} s/submission")
    print(f"ratio (autograder / plain nbgrader): {mine / plain:.2f}")


if __name__ == "__main__":
    main()
