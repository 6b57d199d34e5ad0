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

import fcntl
import hashlib
import importlib
import json
import multiprocessing
import os
import secrets
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from traitlets.config import Config

from . import outcomes
from .collect import Submission, collect
from .course import Course, load_config
from .sandbox import SandboxPolicy, warn_if_unsandboxed

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
    course: Course
    compile_cache: Path | None = None  # where JAX's compilation caches are kept (default: machine_compile_cache)

    @property
    def policy(self) -> SandboxPolicy:
        """The sandbox of the kernels the grader runs besides the students' (the solutions, timed or caching)."""
        return SandboxPolicy(memory_bytes=self.memory_bytes, use_bwrap=self.sandbox)


def nbgrader_config(s: Settings, exchange: bool = False) -> Config:
    """The course's own configuration, with what grading needs set on top of it (``exchange``: its own
    exchange, as configured or nbgrader's default, for releasing feedback)."""
    c = load_config(s.course.config_file) if s.course.config_file else Config()
    c.CourseDirectory.root = str(s.output / "course")
    c.CourseDirectory.course_id = s.course.course_id
    for folder in ("source", "release", "submitted", "autograded", "feedback"):
        setattr(c.CourseDirectory, f"{folder}_directory", folder)
    c.CourseDirectory.db_url = s.db_url
    if "root" not in c.Exchange and not exchange:  # grading never uses it; nbgrader's API wants a writable one
        c.Exchange.root = str(s.output / "exchange")
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
        # the notebook formgrader shows the instructor: no student script; after the grades are saved, which
        # read a written answer's text (left as released, it scores 0)
        "autograder.feedback.SanitizeStudentHTML",
    ]
    c.SandboxedExecute.timeout = s.cell_timeout
    c.SandboxedExecute.notebook_timeout = s.timeout
    c.SandboxedExecute.memory_limit = s.memory_bytes
    c.SandboxedExecute.use_bwrap = s.sandbox
    c.RecordOutcome.state_dir = str(s.output / "state")
    c.JudgeChecks.expected_dir = str(expected_dir(s))
    c.JudgeChecks.hidden_cases_key = c.SandboxedExecute.hidden_cases_key = str(hidden_cases_key(s))
    c.SandboxedExecute.compile_cache_dir = str(compile_cache_dir(s))
    c.GenerateFeedback.preprocessors = [
        "nbgrader.preprocessors.GetGrades",
        "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
        "autograder.feedback.ScrubHiddenTestTracebacks",
        "nbgrader.preprocessors.ClearHiddenTests",
        "nbgrader.preprocessors.ClearMarkScheme",  # the rubrics are for the grader (formgrader shows them)
        "autograder.feedback.SanitizeStudentHTML",  # a student's HTML never runs in anyone's browser
    ]
    return c


# where a Dask worker executed the notebooks, this process records its outputs through the same pipeline
REPLAYED = [
    "autograder.distributed.ReplayExecute",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
    "autograder.feedback.SanitizeStudentHTML",
]


def _api(s: Settings, notebook: str = "*", replay_dir: Path | None = None, exchange: bool = False, limits=None):
    """nbgrader's API on the grading course (``limits``: timeouts.Limits in place of the settings' own)."""
    from nbgrader.apps import NbGraderAPI

    config = nbgrader_config(s, exchange)
    config.CourseDirectory.notebook_id = notebook
    if limits is not None:
        config.SandboxedExecute.timeout, config.SandboxedExecute.notebook_timeout = limits.cell, limits.notebook
    if replay_dir is not None:
        config.Autograde.autograde_preprocessors = REPLAYED
        config.ReplayExecute.replay_dir = str(replay_dir)
    return NbGraderAPI(config=config)


def ensure_tools_on_path() -> None:
    """nbgrader runs its database migrations with the `alembic` program of this environment."""
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def load_settings(output: Path, db: str | None = None) -> Settings:
    """The settings of an earlier grading run in ``output`` (its course, its gradebook), to work on its results."""
    info_file = Path(output).resolve() / "state" / "course.json"
    if not info_file.exists():
        raise FileNotFoundError(f"no grading run in {output}: grade first (python -m autograder grade ...)")
    info = json.loads(info_file.read_text())
    course = Course(source=Path(info["source"]), course_id=info["course_id"], assignments=tuple(info["assignments"]),
                    config_file=Path(info["config_file"]) if info["config_file"] else None)
    return Settings(output=info_file.parents[1], db_url=db or info["db_url"], workers=1, timeout=120,
                    cell_timeout=60, memory_bytes=3 * 2**30, sandbox=True, course=course)


def _tree_hash(folder: Path, pattern: str = "*") -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob(pattern)):
        if path.is_file():
            digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def prepare_course(s: Settings) -> dict[str, dict[str, Path]]:
    """Copy each assignment's source in and generate it with nbgrader (only when it changed).

    Returns {assignment: {notebook name: its generated release version}}."""
    releases = {}
    for assignment in s.course.assignments:
        source = s.output / "course" / "source" / assignment
        marker = s.output / "state" / f"{assignment}.source.sha256"
        source_hash = _tree_hash(s.course.source / assignment)
        wanted = source_hash + s.db_url + s.course.course_id
        if not (marker.exists() and marker.read_text() == wanted and source.exists()):
            shutil.rmtree(source, ignore_errors=True)
            shutil.copytree(s.course.source / assignment, source)
            result = _api(s).generate_assignment(assignment, force=True)
            if not result["success"]:
                raise RuntimeError(f"nbgrader generate_assignment {assignment} failed:\n{result['log']}\n"
                                   f"{result.get('error', '')}")
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(wanted)
        _prepare_expected_values(s, assignment, source_hash)
        _prepare_compile_cache(s, assignment, source_hash)
        release = s.output / "course" / "release" / assignment
        releases[assignment] = {p.stem: p for p in sorted(release.glob("*.ipynb"))}
    (s.output / "state" / "course.json").write_text(json.dumps({
        "course_id": s.course.course_id, "assignments": list(s.course.assignments),
        "source": str(s.course.source), "config_file": str(s.course.config_file or ""), "db_url": s.db_url}))
    return releases


def expected_dir(s: Settings) -> Path:
    return s.output / "state" / "expected"


def hidden_cases_key(s: Settings) -> Path:
    """The grader's secret for the hidden cases: made once per grading folder (so that a regrade draws the
    same cases), readable by this user alone, travelling to Dask workers with the course."""
    from alibi_ref.course.checks import SECRET_BYTES

    path = s.output / "state" / "hidden-cases.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_name(f".{path.name}.{os.getpid()}")
        with os.fdopen(os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(secrets.token_hex(SECRET_BYTES))
        try:
            os.link(draft, path)  # the first grader to get here sets it; any other reads that one
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return path


def _checks_module(s: Settings) -> str:
    from .verdicts import JudgeChecks

    return JudgeChecks(config=nbgrader_config(s)).checks_module


def _rebuild_if_changed(key: Path, wanted: str, build) -> None:
    """Run ``build`` unless ``key`` records ``wanted``, the fingerprint of what it builds from, and record it
    after a build that does not return False. Under a lock beside the key: Dask workers on one machine
    share their compilation cache, and one of them fills it."""
    key.parent.mkdir(parents=True, exist_ok=True)
    with open(key.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if key.exists() and key.read_text() == wanted:
            return
        key.unlink(missing_ok=True)
        if build() is not False:
            key.write_text(wanted)


def _prepare_expected_values(s: Settings, assignment: str, source_hash: str) -> None:
    """The reference's values for the assignment's checks, computed here once (while the assignment's
    source and the checks' code stay as they are) instead of by every judging process."""
    from .verdicts import read_secret, save_expected_values

    module = _checks_module(s)
    key = hidden_cases_key(s)
    package = Path(importlib.import_module(module.split(".")[0]).__file__).parent
    values = expected_dir(s) / f"{assignment}.pickle"

    def build() -> bool:
        values.unlink(missing_ok=True)
        return save_expected_values(module, s.output / "course" / "source" / assignment, values, read_secret(key))

    secret_hash = hashlib.sha256(key.read_bytes()).hexdigest()
    _rebuild_if_changed(expected_dir(s) / f"{assignment}.key", source_hash + _tree_hash(package, "*.py") + secret_hash,
                        build)


def compile_cache_dir(s: Settings) -> Path:
    return s.compile_cache or machine_compile_cache(s.course.course_id)


def machine_compile_cache(course_id: str) -> Path:
    """This machine's JAX compilation caches for a course, shared by every grading folder on it (a section, a
    regrade in a new folder, a Dask worker): each assignment's is filled once while its source and jaxlib stay as
    they are, and XLA compiles for the machine's CPU. In the user's cache folder, not /tmp, where another user
    could plant one."""
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache_home / "alibi-autograder" / "compile-cache" / course_id


def _prepare_compile_cache(s: Settings, assignment: str, source_hash: str) -> None:
    """JAX's compilation cache for the assignment, filled from its source notebooks (compile_cache.py)
    once while the source and JAX stay as they are."""
    from importlib.metadata import PackageNotFoundError, version

    from . import compile_cache

    try:
        jax = version("jaxlib")
    except PackageNotFoundError:
        return
    source = s.output / "course" / "source" / assignment
    _rebuild_if_changed(compile_cache_dir(s) / f"{assignment}.key", source_hash + jax,
                        lambda: compile_cache.fill(source, compile_cache_dir(s) / assignment, s.policy, s.cell_timeout))


def _grade_student(s: Settings, student: str, assignment: str, notebooks: list[str], *, feedback: bool = True,
                   replay_dir: Path | None = None) -> dict:
    """One worker job: nbgrader autograde, then feedback, for one student's assignment (with
    ``replay_dir``: recording the outputs a Dask worker computed, see ``distributed.py``).

    nbgrader discards a student's whole assignment when it fails on any one notebook, so after
    such a failure each notebook is autograded on its own: only the one that fails is lost.
    """
    import warnings

    from sqlalchemy.exc import SAWarning

    warnings.filterwarnings("ignore", category=SAWarning)  # nbgrader's own session bookkeeping
    from .zygote import close_zygote

    failed = {}
    started = time.perf_counter()
    try:
        result = _api(s, replay_dir=replay_dir).autograde(assignment, student, force=True, create=True)
        if not result["success"]:
            for name in notebooks:
                one = _api(s, name, replay_dir).autograde(assignment, student, force=True, create=True)
                if not one["success"]:
                    failed[name] = _last_words(one)
    finally:
        close_zygote((student, assignment))  # the student's sandbox ends with their job
    if replay_dir is None:  # a replay records what its worker graded, again included
        try:  # in a new sandbox: nothing the student left running slows the solution while it is timed
            _grade_timeouts_again(s, student, assignment, failed)
        finally:
            close_zygote((student, assignment))
    graded = time.perf_counter()
    if feedback:
        made = _api(s).generate_feedback(assignment, student, force=True)
        if not made["success"]:
            failed["*"] = _last_words(made)
    # where the time went (benchmarks/grading.py reads it): nbgrader's autograde, kernels included, and feedback
    timing = {"autograde": graded - started, "feedback": time.perf_counter() - graded}
    state = _state_dir(s, student, assignment)
    state.mkdir(parents=True, exist_ok=True)
    (state / (".replay_timing.json" if replay_dir else ".timing.json")).write_text(json.dumps(timing))
    return {"student": student, "assignment": assignment, "failed": failed}


def _grade_timeouts_again(s: Settings, student: str, assignment: str, failed: dict) -> None:
    """Each of the student's notebooks that ran out of time, graded once more on its own, with limits scaled to
    what the instructor's solution takes now (timeouts.py)."""
    from . import timeouts

    for name in timeouts.timed_out(_state_dir(s, student, assignment)):
        source = s.output / "course" / "source" / assignment / f"{name}.ipynb"
        limits = timeouts.scaled_limits(timeouts.Limits(s.cell_timeout, s.timeout),
                                        *timeouts.solution_seconds(source, s.policy, s.cell_timeout))
        again = _api(s, name, limits=limits).autograde(assignment, student, force=True, create=True)
        if not again["success"]:
            failed[name] = _last_words(again)
        timeouts.note_retry(outcomes.outcome_path(s.output / "state", student, assignment, name), limits)


def _last_words(result: dict) -> str:
    return ((result.get("error") or result.get("log") or "").strip().splitlines() or ["?"])[-1][-500:]


def _stage(s: Settings, submission: Submission, notebooks) -> None:
    """Put the readable notebooks where nbgrader looks for them, and record the others."""
    target = s.output / "course" / "submitted" / submission.student / submission.assignment
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    state = _state_dir(s, submission.student, submission.assignment)
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    write_submitted(target, submission.notebooks, submission.files)
    for name in notebooks:
        problem = submission.problems.get(name)
        if name not in submission.notebooks:
            status, reason = problem or ("missing", "no such notebook was submitted")
            outcomes.write(state / f"{name}.json", {"status": status, "reason": reason, "seconds": 0})


def write_submitted(target: Path, notebooks: dict[str, bytes], files: dict[str, bytes]) -> None:
    """A student's notebooks and other files where nbgrader's autograde reads them: nbgrader's exchange files (the
    time handed in: late penalties), and the student's modules, in a folder of their own (screen.MODULES)."""
    for name, raw in notebooks.items():
        (target / f"{name}.ipynb").write_bytes(raw)
    for name, raw in files.items():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_bytes(raw)


def _state_dir(s: Settings, student: str, assignment: str) -> Path:
    """Where one student's assignment keeps its outcomes (outcomes.py)."""
    return outcomes.assignment_dir(s.output / "state", student, assignment)


def grade(submissions, output="grading", *, course=None, assignments=None, students=None, workers: int | None = None,
          timeout: int = 120, cell_timeout: int = 60, memory_gib: float = 3.0, db: str | None = None,
          sandbox: bool = True, scheduler: str | None = None, progress: bool = True):
    """Grade every submission in ``submissions``; returns the Report (also written to ``output``).

    ``course``: a Course, or the folder ``Course.find`` takes (default: this repository's course);
    ``assignments``: which of its assignments (default: all); ``students``: which student ids among the
    submissions (default: all; one that is not there raises StudentsNotFound). ``scheduler``: a Dask scheduler's
    address to fan the jobs out to (default: a local pool of ``workers`` processes).
    """
    from .report import Report

    output = Path(output).resolve()
    submissions = Path(submissions).resolve()
    if not isinstance(course, Course):
        course = Course.find(course, assignments)
    s = Settings(
        output=output, db_url=db or f"sqlite:///{output / 'gradebook.db'}",
        workers=workers or os.cpu_count() or 1, timeout=timeout, cell_timeout=min(cell_timeout, timeout),
        memory_bytes=int(memory_gib * 2**30), sandbox=sandbox, course=course,
    )
    warn_if_unsandboxed(SandboxPolicy(use_bwrap=sandbox))
    ensure_tools_on_path()
    (output / "exchange").mkdir(parents=True, exist_ok=True)
    releases = prepare_course(s)
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
        done = _state_dir(s, submission.student, submission.assignment) / "done.sha256"
        if done.exists() and done.read_text() == submission.digest + submission.graded_under:
            continue  # graded already, and nothing changed since
        _stage(s, submission, releases[submission.assignment])
        todo.append(submission)

    if scheduler:
        from .distributed import run_on_cluster

        failures = run_on_cluster(s, todo, scheduler, progress)
    else:
        failures = _run(s, todo, progress)
    report = Report.build(s, class_, releases, failures)
    report.write()
    return report


class StudentsNotFound(ValueError):
    """Students asked for by id who handed nothing in."""


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
    configuration, the checks' and the grader's code, the hidden cases' secret, the limits and the gradebook.
    A submission last graded under another fingerprint is graded again: before, fixing a test in the
    source, or raising a time limit for the students who ran out of it, left every grade as it was."""
    checks = Path(importlib.import_module(_checks_module(s).split(".")[0]).__file__).parent
    parts = [_tree_hash(s.course.source / assignment), _tree_hash(checks, "*.py"),
             _tree_hash(Path(__file__).parent, "*.py"), hidden_cases_key(s).read_text(),
             s.course.config_file.read_text() if s.course.config_file else "", s.course.course_id,
             repr((s.timeout, s.cell_timeout, s.memory_bytes, s.sandbox)), s.db_url]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def record_done(s: Settings, sub: Submission, failed: dict[str, str], failures: dict) -> None:
    """Note a finished job: its failures, or (none) that it need not be graded again while it and what it was
    graded under (``grading_fingerprint``) stay as they are."""
    if failed:
        failures[sub.student, sub.assignment] = failed
    else:
        (_state_dir(s, sub.student, sub.assignment) / "done.sha256").write_text(sub.digest + sub.graded_under)


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
        jobs = {pool.submit(_grade_student, s, sub.student, sub.assignment, sorted(sub.notebooks)): sub
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
