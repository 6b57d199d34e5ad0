"""python -m autograder grade SUBMISSIONS: grade a class and print the grade table; export: final grades for an LMS."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .grade import grade


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("grade", help="grade every submission in a folder")
    p.add_argument("submissions", type=Path, help="one folder or .zip per student (its name is the student id), "
                                                  "or nbgrader's submitted/ layout")
    p.add_argument("--output", type=Path, default=Path("grading"), help="where results go (default: ./grading)")
    p.add_argument("--workers", type=int, default=None, help="parallel workers (default: one per CPU core)")
    p.add_argument("--timeout", type=int, default=120, help="seconds per notebook, all cells together (default 120)")
    p.add_argument("--cell-timeout", type=int, default=60, help="seconds per cell (default 60)")
    p.add_argument("--memory", type=float, default=3.0, help="GiB of memory per kernel (default 3)")
    p.add_argument("--db", default=None, help="gradebook SQLAlchemy URL (default: sqlite in OUTPUT)")
    p.add_argument("--sandbox", choices=["bwrap", "none"], default="bwrap",
                   help="bwrap (default) isolates each kernel; none runs student code unisolated")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    e = sub.add_parser("export", help="final grades (autograded and by hand) as a CSV an LMS imports")
    e.add_argument("--output", type=Path, default=Path("grading"), help="the grading run's folder (default ./grading)")
    e.add_argument("--db", default=None, help="gradebook SQLAlchemy URL (default: sqlite in OUTPUT)")
    e.add_argument("--csv", type=Path, default=None, help="where the CSV goes (default OUTPUT/lms_grades.csv)")
    args = parser.parse_args(argv)
    if args.command == "export":
        return _export(parser, args)
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    if args.timeout < 1 or args.cell_timeout < 1 or args.memory <= 0:
        parser.error("--timeout, --cell-timeout and --memory must be positive")
    if not args.submissions.is_dir():
        parser.error(f"SUBMISSIONS must be a folder, got {args.submissions}")
    report = grade(args.submissions, args.output, workers=args.workers, timeout=args.timeout,
                   cell_timeout=args.cell_timeout, memory_gib=args.memory, db=args.db,
                   sandbox=args.sandbox == "bwrap", progress=not args.no_progress)
    print(report.table())
    print(f"\nwritten to {args.output}/: grades.csv, grades.png, feedback/, nbgrader_grades.csv, gradebook")
    return 0


def _export(parser, args) -> int:
    from .export import export

    db = args.db or f"sqlite:///{args.output.resolve() / 'gradebook.db'}"
    if args.db is None and not (args.output / "gradebook.db").exists():
        parser.error(f"no gradebook in {args.output}: grade first, or give --db")
    path = export(db, args.csv or args.output / "lms_grades.csv")
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
