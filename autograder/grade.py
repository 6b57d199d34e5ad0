"""Grade a class: collect submissions, autograde each student with nbgrader in parallel, report.

    grade(submissions, output, course=..., assignments=..., workers=..., timeout=..., db=...) -> Report

The work happens in OUTPUT/course, an nbgrader course root: source/ is a copy of the course's
source notebooks (this repository's solutions/ unless ``course`` says otherwise, see
``course.py``), the gradebook is OUTPUT/gradebook.db (or ``db``), and nbgrader's own
generate_assignment, autograde, generate_feedback and export do the grading. Each student's
assignment is one job; a worker runs nbgrader's autograde for it with the sandboxed Execute step,
in a local process pool or, with ``scheduler``, on a Dask cluster (``distributed.py``). A job
whose submission, and what it is graded under (``grading_fingerprint``: the source, the checks,
the limits, ...), have not changed since its last complete grading is skipped, so re-running is
idempotent and an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from . import outcomes
from .collect import Submission, collect
from .course import Course
from .job import grade_student, record_done, write_submitted
from .prepare import prepare_course, root_files_hash, tree_hash
from .sandbox import SandboxPolicy, warn_if_unsandboxed
from .workspace import Settings, checks_package, ensure_tools_on_path, hidden_cases_key, state_dir


def _stage(s: Settings, submission: Submission, notebooks) -> None:
    """Put the readable notebooks where nbgrader looks for them, and record the others."""
    target = s.output / "course" / "submitted" / submission.student / submission.assignment
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    state = state_dir(s, submission.student, submission.assignment)
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    write_submitted(target, submission.notebooks, submission.files)
    for name in notebooks:
        problem = submission.problems.get(name)
        if name not in submission.notebooks:
            status, reason = problem or ("missing", "no such notebook was submitted")
            outcomes.write(state / f"{name}.json", {"status": status, "reason": reason, "seconds": 0})


def grade(submissions, output="grading", *, course=None, assignments=None, students=None, workers: int | None = None,
          timeout: int = 120, cell_timeout: int = 60, memory_gib: float = 3.0, db: str | None = None,
          sandbox: bool = True, scheduler: str | None = None, progress: bool = True, for_formgrader: bool = False):
    """Grade every submission in ``submissions``; returns the Report (also written to ``output``).

    ``course``: a Course, or the folder ``Course.find`` takes (default: this repository's course);
    ``assignments``: which of its assignments (default: all); ``students``: which student ids among the
    submissions (default: all; one that is not there raises StudentsNotFound). ``scheduler``: a Dask scheduler's
    address to fan the jobs out to (default: a local pool of ``workers`` processes). ``for_formgrader``: also
    put the autograded notebooks in the course root's autograded/ (``show_in_formgrader``).
    """
    from .report import Report

    output = Path(output).resolve()
    submissions = Path(submissions).resolve()
    if not isinstance(course, Course):
        course = Course.find(course, assignments)
    if for_formgrader and course.config_file is None:  # said before any grading, not after it
        raise NotACourseRoot(f"--for-formgrader needs an nbgrader course root (with nbgrader_config.py) as the "
                             f"course, got {course.source}: formgrader has no course root to show the grades in")
    s = Settings(
        output=output, db_url=db or f"sqlite:///{output / 'gradebook.db'}",
        workers=workers or os.cpu_count() or 1, timeout=timeout, cell_timeout=min(cell_timeout, timeout),
        memory_bytes=int(memory_gib * 2**30), sandbox=sandbox, course=course,
    )
    warn_if_unsandboxed(SandboxPolicy(use_bwrap=sandbox))
    ensure_tools_on_path()
    (output / "exchange").mkdir(parents=True, exist_ok=True)
    prepared = prepare_course(s)
    releases = prepared.releases
    for why in prepared.failed.values():  # the instructor's to fix: said here as in each of its rows
        print(f"warning: {why}", file=sys.stderr)
    class_ = []
    for assignment, notebooks in releases.items():
        # with several assignments each student's notebooks must sit in a folder named for theirs
        class_ += collect(submissions, notebooks, assignment, own_folder_only=len(releases) > 1)
    if students is not None:
        class_ = _only(class_, set(students), submissions)
    _enrol(s, class_)
    fingerprints = {assignment: grading_fingerprint(s, assignment) for assignment in releases}
    todo = []
    for submission in class_:
        submission.graded_under = fingerprints[submission.assignment]
        if submission.assignment in prepared.failed:  # nothing of it can be graded: each handed-in notebook says why
            submission.problems.update({name: ("error", prepared.failed[submission.assignment])
                                        for name in submission.notebooks})
            submission.notebooks.clear()
            submission.notes.clear()
        done = state_dir(s, submission.student, submission.assignment) / "done.sha256"
        if done.exists() and done.read_text() == submission.digest + submission.graded_under:
            continue  # graded already, and nothing changed since
        _stage(s, submission, releases[submission.assignment])
        if submission.notebooks:  # none readable: its rows are the staged ones, and no worker has anything to run
            todo.append(submission)

    if scheduler:
        from .distributed import run_on_cluster

        failures = run_on_cluster(s, todo, scheduler, progress)
    else:
        failures = _run(s, todo, progress)
    report = Report.build(s, class_, releases, failures)
    report.write()
    if for_formgrader:
        show_in_formgrader(s, class_)
    return report


def show_in_formgrader(s: Settings, class_: list[Submission]) -> None:
    """Each graded student's autograded notebooks (their outputs sanitised, ``feedback.py``) copied into the course
    root's autograded/ folder, where nbgrader's formgrader reads the notebooks it shows for grading by hand: the
    gradebook (``db``, the course's own) lists a submission there only where its autograded notebook is."""
    from .course import load_config

    root = s.course.config_file.parent
    shown = (root / load_config(s.course.config_file).CourseDirectory.get("autograded_directory", "autograded"))
    for submission in class_:
        graded = s.output / "course" / "autograded" / submission.student / submission.assignment
        target = shown / submission.student / submission.assignment
        if not graded.is_dir() or not target.resolve().is_relative_to(shown.resolve()):
            continue  # nothing graded (an invalid id, no readable notebook), or an id that names another folder
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(graded, target, symlinks=True)


class StudentsNotFound(ValueError):
    """Students asked for by id who handed nothing in."""


class NotACourseRoot(ValueError):
    """Grades to show in formgrader, for a course that is a folder of assignments, with no course root."""


def _only(class_: list[Submission], students: set[str], submissions: Path) -> list[Submission]:
    """The submissions of ``students``; StudentsNotFound naming any of them that handed nothing in."""
    absent = students - {sub.student for sub in class_}
    if absent:
        raise StudentsNotFound(f"no submission from {', '.join(sorted(absent))} in {submissions} (expected a folder or "
                         "zip named for each student asked for)")
    return [sub for sub in class_ if sub.student in students]


def _enrol(s: Settings, class_: list[Submission]) -> None:
    """Every student with a usable id in the gradebook, also one none of whose files could be graded: nbgrader adds
    a student only as it grades a notebook, and the LMS export and formgrader list the gradebook's students."""
    from nbgrader.api import Gradebook

    students = sorted({sub.student for sub in class_
                       if not any(status == "invalid" for status, _ in sub.problems.values())})
    with Gradebook(s.db_url, s.course.course_id) as gradebook:
        for student in students:
            gradebook.update_or_create_student(student)


def grading_fingerprint(s: Settings, assignment: str) -> str:
    """What a student's grade depends on besides their notebooks: the assignment's source, the course's
    configuration (with the root files it names), the checks' and the grader's code, the hidden cases' secret,
    the limits and the gradebook.
    A submission last graded under another fingerprint is graded again: before, fixing a test in the
    source, or raising a time limit for the students who ran out of it, left every grade as it was."""
    checks = checks_package(s)
    parts = [tree_hash(s.course.source / assignment), root_files_hash(s.course),
             tree_hash(checks, "*.py") if checks else "", tree_hash(Path(__file__).parent, "*.py"),
             hidden_cases_key(s).read_text(),
             s.course.config_file.read_text() if s.course.config_file else "", s.course.course_id,
             repr((s.timeout, s.cell_timeout, s.memory_bytes, s.sandbox)), s.db_url]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _run(s: Settings, todo: list[Submission], progress: bool) -> dict[tuple[str, str], dict[str, str]]:
    """Grade ``todo`` in the local worker pool.

    A worker that dies (the OOM killer) breaks the whole pool, and every job still in it with it: those are
    graded again, each in a pool of its own, so that only the job that kills its worker loses its grading.
    Returns {(student, assignment): {notebook (or "*" for all): why nbgrader failed}}."""
    from tqdm import tqdm

    failures: dict = {}
    with tqdm(total=len(todo), desc="grading", unit="student", disable=not progress, file=sys.stderr) as bar:
        broken = _run_in_pool(s, todo, s.workers, failures, bar)
        for sub in broken:
            _run_in_pool(s, [sub], 1, failures, bar, last_try=True)
    return failures


def _run_in_pool(s: Settings, todo: list[Submission], workers: int, failures: dict, bar,
                 last_try: bool = False) -> list[Submission]:
    """Grade ``todo`` in a pool of ``workers`` processes; returns the jobs lost to a broken pool (none if
    ``last_try``: then they are failures)."""
    broken = []
    # spawn: a fresh interpreter per worker, nothing inherited from the caller's state
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        jobs = {pool.submit(grade_student, s, sub.student, sub.assignment, sorted(sub.notebooks)): sub
                for sub in todo}
        for job in as_completed(jobs):
            sub = jobs[job]
            try:
                failed = job.result()["failed"]
            except BrokenProcessPool as err:
                if not last_try:
                    broken.append(sub)
                    continue
                failed = {"*": f"its grading process died ({err})"[-500:]}
            except Exception as err:  # a job that raised: record it, keep grading the others
                failed = {"*": repr(err)[-500:]}
            record_done(s, sub, failed, failures)
            bar.set_postfix_str(sub.student)
            bar.update()
    return broken
