"""Grade a class: collect submissions, autograde each student with nbgrader in parallel, report.

    grade(submissions, output, workers=..., timeout=..., db=...) -> Report

The work happens in OUTPUT/course, an nbgrader course root: source/ is a copy of the
repository's solutions/, the gradebook is OUTPUT/gradebook.db (or --db), and nbgrader's own
generate_assignment, autograde, generate_feedback and export do the grading. Each student is
one job; a worker runs nbgrader's autograde for that student with the sandboxed Execute step.
A student whose submission has not changed since their last complete grading is skipped, so
re-running is idempotent and an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from traitlets.config import Config

from .collect import Submission, collect
from .sandbox import REPO, SandboxPolicy, warn_if_unsandboxed

ASSIGNMENT = "alibi"
# correct code that prints a warning is not failed for it (nbgrader fails any stderr otherwise)
WARNING_PATTERN = r"\w*Warning: "


@dataclass(frozen=True)
class Settings:
    output: Path
    db_url: str
    workers: int
    timeout: int  # seconds per notebook, all cells together
    cell_timeout: int
    memory_bytes: int
    sandbox: bool


def nbgrader_config(s: Settings) -> Config:
    c = Config()
    c.CourseDirectory.root = str(s.output / "course")
    c.CourseDirectory.course_id = ASSIGNMENT
    c.CourseDirectory.source_directory = "source"
    c.CourseDirectory.db_url = s.db_url
    c.OverwriteCells.add_missing_cells = True  # a deleted test cell is put back, not skipped
    c.IgnorePattern.enabled = True
    c.IgnorePattern.pattern = WARNING_PATTERN
    c.Autograde.autograde_preprocessors = [
        "autograder.execute.SandboxedExecute",
        "autograder.verdicts.JudgeChecks",
        "nbgrader.preprocessors.IgnorePattern",
        "autograder.verdicts.RecordOutcome",
        "nbconvert.preprocessors.ClearMetadataPreprocessor",
        "nbgrader.preprocessors.LimitOutput",
        "nbgrader.preprocessors.SaveAutoGrades",
        "nbgrader.preprocessors.AssignLatePenalties",
        "nbgrader.preprocessors.CheckCellMetadata",
    ]
    c.SandboxedExecute.timeout = s.cell_timeout
    c.SandboxedExecute.notebook_timeout = s.timeout
    c.SandboxedExecute.memory_limit = s.memory_bytes
    c.SandboxedExecute.use_bwrap = s.sandbox
    c.RecordOutcome.state_dir = str(s.output / "state")
    c.GenerateFeedback.preprocessors = [
        "nbgrader.preprocessors.GetGrades",
        "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
        "autograder.feedback.ScrubHiddenTestTracebacks",
        "nbgrader.preprocessors.ClearHiddenTests",
        "nbgrader.preprocessors.ClearMarkScheme",  # the rubrics are for the grader (formgrader shows them)
    ]
    return c


def _api(s: Settings, notebook: str = "*"):
    from nbgrader.apps import NbGraderAPI

    config = nbgrader_config(s)
    config.CourseDirectory.notebook_id = notebook
    return NbGraderAPI(config=config)


def _tree_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def prepare_course(s: Settings) -> dict[str, Path]:
    """Copy solutions/ in as nbgrader's source and generate the assignment (only when it changed).

    Returns each notebook's generated release version, by name."""
    source = s.output / "course" / "source" / ASSIGNMENT
    solutions = REPO / "solutions" / ASSIGNMENT
    marker = s.output / "state" / "source.sha256"
    wanted = _tree_hash(solutions) + s.db_url
    if not (marker.exists() and marker.read_text() == wanted and source.exists()):
        shutil.rmtree(source, ignore_errors=True)
        shutil.copytree(solutions, source)
        result = _api(s).generate_assignment(ASSIGNMENT, force=True)
        if not result["success"]:
            raise RuntimeError(f"nbgrader generate_assignment failed:\n{result['log']}\n{result.get('error', '')}")
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(wanted)
    release = s.output / "course" / "release" / ASSIGNMENT
    return {p.stem: p for p in sorted(release.glob("*.ipynb"))}


def _grade_student(s: Settings, student: str, notebooks: list[str]) -> dict:
    """One worker job: nbgrader autograde, then feedback, for one student.

    nbgrader discards a student's whole assignment when it fails on any one notebook, so after
    such a failure each notebook is autograded on its own: only the one that fails is lost.
    """
    import warnings

    from sqlalchemy.exc import SAWarning

    warnings.filterwarnings("ignore", category=SAWarning)  # nbgrader's own session bookkeeping
    failed = {}
    result = _api(s).autograde(ASSIGNMENT, student, force=True, create=True)
    if not result["success"]:
        for name in notebooks:
            one = _api(s, name).autograde(ASSIGNMENT, student, force=True, create=True)
            if not one["success"]:
                failed[name] = _last_words(one)
    feedback = _api(s).generate_feedback(ASSIGNMENT, student, force=True)
    if not feedback["success"]:
        failed["*"] = _last_words(feedback)
    return {"student": student, "failed": failed}


def _last_words(result: dict) -> str:
    return ((result.get("error") or result.get("log") or "").strip().splitlines() or ["?"])[-1][-500:]


def _stage(s: Settings, submission: Submission, notebooks) -> None:
    """Put the readable notebooks where nbgrader looks for them, and record the others."""
    target = s.output / "course" / "submitted" / submission.student / ASSIGNMENT
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    state = s.output / "state" / submission.student
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    for name in notebooks:
        problem = submission.problems.get(name)
        if name in submission.notebooks:
            (target / f"{name}.ipynb").write_bytes(submission.notebooks[name])
        else:
            status, reason = problem or ("missing", "no such notebook was submitted")
            (state / f"{name}.json").write_text(json.dumps({"status": status, "reason": reason, "seconds": 0}))


def grade(submissions, output="grading", *, workers: int | None = None, timeout: int = 120,
          cell_timeout: int = 60, memory_gib: float = 3.0, db: str | None = None, sandbox: bool = True,
          progress: bool = True):
    """Grade every submission in ``submissions``; returns the Report (also written to ``output``)."""
    from .report import Report

    output = Path(output).resolve()
    submissions = Path(submissions).resolve()
    s = Settings(
        output=output, db_url=db or f"sqlite:///{output / 'gradebook.db'}",
        workers=workers or os.cpu_count() or 1, timeout=timeout, cell_timeout=min(cell_timeout, timeout),
        memory_bytes=int(memory_gib * 2**30), sandbox=sandbox,
    )
    warn_if_unsandboxed(SandboxPolicy(use_bwrap=sandbox))
    # nbgrader runs its database migrations with the `alembic` program of this environment
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    output.mkdir(parents=True, exist_ok=True)
    notebooks = prepare_course(s)
    class_ = collect(submissions, notebooks)
    todo = []
    for submission in class_:
        done = output / "state" / submission.student / "done.sha256"
        if done.exists() and done.read_text() == submission.digest + s.db_url:
            continue  # graded already, and nothing changed since
        _stage(s, submission, notebooks)
        todo.append(submission)

    failures = _run(s, todo, progress)
    report = Report.build(s, class_, list(notebooks), failures)
    report.write()
    return report


def _run(s: Settings, todo: list[Submission], progress: bool) -> dict[str, dict[str, str]]:
    """Grade ``todo`` in the worker pool: {student: {notebook (or "*" for all): why nbgrader failed}}."""
    from tqdm import tqdm

    failures = {}
    by_name = {sub.student: sub for sub in todo}
    # spawn: a fresh interpreter per worker, nothing inherited from the caller's state
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=s.workers, mp_context=context) as pool, \
            tqdm(total=len(todo), desc="grading", unit="student", disable=not progress, file=sys.stderr) as bar:
        jobs = {pool.submit(_grade_student, s, sub.student, sorted(sub.notebooks)): sub.student for sub in todo}
        for job in as_completed(jobs):
            student = jobs[job]
            try:
                result = job.result()
            except Exception as err:  # a worker that died: record it, keep grading the others
                result = {"student": student, "failed": {"*": repr(err)[-500:]}}
            if result["failed"]:
                failures[student] = result["failed"]
            else:
                done = s.output / "state" / student / "done.sha256"
                done.write_text(by_name[student].digest + s.db_url)
            bar.set_postfix_str(student)
            bar.update()
    return failures
