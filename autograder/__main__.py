"""python -m autograder: grade a class's nbgrader submissions, safely and in parallel.

    collect             nbgrader's collect: the submissions in a course's exchange into its submitted/
    grade SUBMISSIONS   grade every submission (locally, or on a Dask cluster with --scheduler)
    feedback            regenerate the feedback with the points given by hand; --release: into the exchange
    export              final grades, autograded and by hand, as a CSV an LMS imports
    hub                 serve the course to a class with JupyterHub, one system account per user (as root)
    kubernetes          the class's values for Zero to JupyterHub on Kubernetes, from a roster
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv=None) -> int:
    # the docstring's table of commands keeps its lines (argparse's default formatter runs them into one paragraph)
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("grade", help="grade every submission in a folder")
    p.add_argument("submissions", type=Path, help="one folder or .zip per student (its name is the student id), "
                                                  "or nbgrader's submitted/ layout")
    p.add_argument("--output", type=Path, default=Path("grading"), help="where results go (default: ./grading)")
    p.add_argument("--course", type=Path, default=None,
                   help="an nbgrader course root (with nbgrader_config.py) or a folder with one folder of source "
                        "notebooks per assignment (default: this repository's ALiBi course)")
    p.add_argument("--assignment", action="append", default=None, metavar="NAME",
                   help="an assignment to grade; repeat for several (default: every assignment of the course)")
    p.add_argument("--student", action="append", default=None, metavar="ID",
                   help="grade this student only; repeat for several (default: every student in SUBMISSIONS)")
    p.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT",
                   help="fan the grading out over this Dask scheduler's workers (default: a local process pool)")
    p.add_argument("--workers", type=int, default=None, help="parallel workers (default: one per CPU core)")
    p.add_argument("--timeout", type=int, default=120, help="seconds per notebook, all cells together (default 120)")
    p.add_argument("--cell-timeout", type=int, default=60, help="seconds per cell (default 60)")
    p.add_argument("--memory", type=float, default=3.0, help="GiB of memory per kernel (default 3)")
    p.add_argument("--db", default=None, help="gradebook SQLAlchemy URL (default: sqlite in OUTPUT)")
    p.add_argument("--sandbox", choices=["bwrap", "none"], default="bwrap",
                   help="bwrap (default) isolates each kernel; none runs student code unisolated")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--for-formgrader", action="store_true",
                   help="also put the autograded notebooks in the course root's autograded/, where nbgrader's "
                        "formgrader shows them for grading by hand (with --db the course's gradebook)")
    e = sub.add_parser("export", help="final grades (autograded and by hand) as a CSV an LMS imports")
    e.add_argument("--output", type=Path, default=Path("grading"), help="the grading run's folder (default ./grading)")
    e.add_argument("--db", default=None, help="gradebook SQLAlchemy URL (default: sqlite in OUTPUT)")
    e.add_argument("--csv", type=Path, default=None, help="where the CSV goes (default OUTPUT/lms_grades.csv)")
    e.add_argument("--course-id", default=None, help="the course, where the gradebook holds several")
    c = sub.add_parser("collect", help="nbgrader's collect in a course root (its exchange into submitted/)")
    c.add_argument("--course", type=Path, required=True, help="the nbgrader course root (with nbgrader_config.py)")
    c.add_argument("--assignment", action="append", default=None, metavar="NAME",
                   help="an assignment to collect; repeat for several (default: every assignment of the course)")
    f = sub.add_parser("feedback", help="regenerate every student's feedback from the gradebook (with the points "
                                        "given by hand), without hidden tests; --release puts it in the exchange")
    f.add_argument("--output", type=Path, default=Path("grading"), help="the grading run's folder (default ./grading)")
    f.add_argument("--db", default=None, help="gradebook SQLAlchemy URL (default: the grading run's)")
    f.add_argument("--release", action="store_true", help="release it with nbgrader's release_feedback, for students' "
                                                          "`nbgrader fetch_feedback`")
    h = sub.add_parser("hub", help="set up a class from a roster (system accounts, exchange, course root) and "
                                   "serve it with JupyterHub on 127.0.0.1 (as root)")
    h.add_argument("--roster", type=Path, default=Path("hub/roster.csv"),
                   help="CSV with columns username,role (student or instructor) (default hub/roster.csv)")
    h.add_argument("--state", type=Path, default=Path(".hub"),
                   help="the hub's own files: its database, secrets, proxy (default ./.hub)")
    h.add_argument("--course-id", default="alibi", help="the nbgrader course id (default alibi)")
    h.add_argument("--source", type=Path, default=Path("solutions"),
                   help="the course's source: one folder of notebooks per assignment (default solutions/)")
    h.add_argument("--exchange", type=Path, default=Path("/srv/nbgrader/exchange"),
                   help="nbgrader's exchange (default /srv/nbgrader/exchange)")
    h.add_argument("--port", type=int, default=8000, help="the hub's port on 127.0.0.1 (default 8000; it also "
                                                          "takes the two above it)")
    k = sub.add_parser("kubernetes", help="the class's values for Zero to JupyterHub, beside "
                                          "deploy/kubernetes/values.yaml (docs/deploying.md, \"Kubernetes\")")
    k.add_argument("--roster", type=Path, default=Path("hub/roster.csv"),
                   help="CSV with columns username,role (student or instructor) (default hub/roster.csv)")
    k.add_argument("--course-id", default="alibi", help="the nbgrader course id (default alibi)")
    k.add_argument("--prepare-volumes", metavar="IMAGE", default=None,
                   help="write instead the one-off Job that lays out the exchange and the course root, run in IMAGE")
    args = parser.parse_args(argv)
    if args.command == "hub":
        return _hub(parser, args, sys.argv[1:] if argv is None else argv)
    if args.command == "kubernetes":
        return _kubernetes(parser, args)
    from .grade import grade

    if args.command == "export":
        return _export(parser, args)
    if args.command == "collect":
        return _collect(parser, args)
    if args.command == "feedback":
        return _feedback(parser, args)
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    if args.timeout < 1 or args.cell_timeout < 1 or args.memory <= 0:
        parser.error("--timeout, --cell-timeout and --memory must be positive")
    if not args.submissions.is_dir():
        parser.error(f"SUBMISSIONS must be a folder, got {args.submissions}")
    from .course import Course

    try:
        course = Course.find(args.course, args.assignment)
    except FileNotFoundError as err:
        parser.error(str(err))
    from .grade import NotACourseRoot, StudentsNotFound
    from .prepare import MachineFault

    try:
        report = grade(args.submissions, args.output, course=course, students=args.student, workers=args.workers,
                       timeout=args.timeout, cell_timeout=args.cell_timeout, memory_gib=args.memory, db=args.db,
                       sandbox=args.sandbox == "bwrap", scheduler=args.scheduler, progress=not args.no_progress,
                       for_formgrader=args.for_formgrader)
    except (StudentsNotFound, NotACourseRoot) as err:
        parser.error(str(err))
    except MachineFault as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(report.table())
    print(f"\nwritten to {args.output}/: grades.csv, grades.png, feedback/, nbgrader_grades.csv, gradebook")
    return 0


def _hub(parser, args, argv: list[str]) -> int:
    from .hub import read_class, set_up, start
    from .users_python import users_python

    try:
        read_class(args.roster, args.course_id)  # what is wrong with the class, said before the Python is copied
        python = users_python(args.state)
        if python != Path(sys.executable):  # the hub and every server it starts run the one the users can reach
            os.execv(python, [str(python), "-m", "autograder", *argv])
        served = set_up(args.roster, args.state, args.course_id, args.source, args.exchange)
        hub = start(served, args.port)
    except (OSError, ValueError, RuntimeError) as err:  # OSError: a full disk, a missing file, a refused folder
        parser.error(str(err))
    print(f"JupyterHub for {len(served.members)} users at http://127.0.0.1:{args.port}/; their passwords, to hand "
          f"out, are in {served.private / 'initial-passwords.csv'}; the course root is {served.course_root}. "
          "Ctrl-C stops it.", flush=True)
    try:
        return hub.wait()
    except KeyboardInterrupt:
        hub.terminate()
        return hub.wait()


def _kubernetes(parser, args) -> int:
    import yaml

    from .hub import check_course_id, read_roster
    from .kubernetes import class_values, prepare_volumes_job

    try:
        check_course_id(args.course_id)
        made = (prepare_volumes_job(args.course_id, args.prepare_volumes) if args.prepare_volumes
                else class_values(read_roster(args.roster), args.course_id))
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    class Dumper(yaml.SafeDumper):  # files' text as YAML's literal blocks, readable as they will be in the pod
        def represent_str(self, text):
            return self.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)

    Dumper.add_representer(str, Dumper.represent_str)
    sys.stdout.write(yaml.dump(made, Dumper=Dumper, sort_keys=False, width=120))
    return 0


def _collect(parser, args) -> int:
    from .course import Course
    from .exchange import collect

    try:
        course = Course.find(args.course, args.assignment)
        print(collect(args.course, course.assignments).strip())
    except (FileNotFoundError, RuntimeError) as err:
        parser.error(str(err))
    return 0


def _feedback(parser, args) -> int:
    from .exchange import feedback

    try:
        done = feedback(args.output, release=args.release, db=args.db)
    except (FileNotFoundError, RuntimeError) as err:
        parser.error(str(err))
    where = " and released to the exchange" if args.release else ""
    print(f"feedback for {', '.join(done) or 'nothing graded yet'} written to {args.output}/feedback/{where}")
    return 0


def _graded_course_id(output: Path) -> str | None:
    """The course a grading run in ``output`` graded, if it was one (a copied gradebook alone has no run)."""
    from .workspace import load_settings

    try:
        return load_settings(output).course.course_id
    except FileNotFoundError:
        return None


def _export(parser, args) -> int:
    from .export import export

    db = args.db or f"sqlite:///{args.output.resolve() / 'gradebook.db'}"
    if args.db is None and not (args.output / "gradebook.db").exists():
        parser.error(f"no gradebook in {args.output}: grade first, or give --db")
    try:
        course_id = args.course_id or _graded_course_id(args.output)
        path = export(db, args.csv or args.output / "lms_grades.csv", course_id)
    except ValueError as err:
        parser.error(str(err))
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
