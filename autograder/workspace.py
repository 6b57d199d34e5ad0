"""The grading folder: the settings of a run, nbgrader's configuration and API on its course, and where each
piece of state lives (OUTPUT/state: the outcomes, the hidden cases' secret, the reference's values, and the
JAX compilation caches on this machine)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from traitlets.config import Config

from . import outcomes
from .course import Course, load_config
from .sandbox import SandboxPolicy

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
        *SAVED,
    ]
    c.SandboxedExecute.timeout = s.cell_timeout
    c.SandboxedExecute.notebook_timeout = s.timeout
    c.SandboxedExecute.memory_limit = s.memory_bytes
    c.SandboxedExecute.use_bwrap = s.sandbox
    c.RecordOutcome.state_dir = str(s.output / "state")
    c.JudgeChecks.expected_dir = c.SandboxedExecute.cases_dir = str(expected_dir(s))
    c.JudgeChecks.hidden_cases_key = str(hidden_cases_key(s))
    c.SandboxedExecute.views_dir = str(s.output / "state" / "views")
    if c.JudgeChecks.get("checks_module"):  # a course with checks of its own (this one's nbgrader_config.py)
        c.SandboxedExecute.checks_module = c.JudgeChecks.checks_module
        c.SandboxedExecute.kept_whole = [importlib.import_module(c.JudgeChecks.checks_module).MIME]
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


# once the notebook has run: what is kept of it, then its grades saved, then the notebook formgrader shows the
# instructor made inert (no student script); after the grades are saved, which read a written answer's text (left
# as released, it scores 0)
SAVED = [
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
    "autograder.feedback.SanitizeStudentHTML",
]

# where a Dask worker executed the notebooks, this process records its outputs through the same pipeline
REPLAYED = ["autograder.distributed.ReplayExecute", "nbgrader.preprocessors.IgnorePattern", *SAVED]


def nbgrader_api(s: Settings, notebook: str = "*", replay_dir: Path | None = None, exchange: bool = False, limits=None):
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


def expected_dir(s: Settings) -> Path:
    return s.output / "state" / "expected"


SECRET_BYTES = 32


def hidden_cases_key(s: Settings) -> Path:
    """The grader's secret for the hidden cases: made once per grading folder (so that a regrade draws the
    same cases), readable by this user alone, travelling to Dask workers with the course. No kernel sees it:
    it sees the cases drawn with it (``cases_file``)."""
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


def cases_file(s: Settings, assignment: str) -> Path:
    """The inputs of the assignment's checks, drawn with the grader's secret: shown read-only to every kernel."""
    return expected_dir(s) / f"{assignment}.cases.json"


def views_dir(s: Settings, assignment: str) -> Path:
    """The course's views of its package for the assignment's kernels, one folder per set of helpers."""
    return s.output / "state" / "views" / assignment


def notebook_policy(s: Settings, assignment: str, notebook: Path) -> SandboxPolicy:
    """The sandbox of one of the course's notebooks that the grader runs itself (the solution timed, a release
    filling the compilation cache): the settings' limits, and the view and cases students' runs of it see."""
    import nbformat

    from .execute import course_sandbox

    _, course = course_sandbox(checks_module(s), str(s.output / "state" / "views"), str(expected_dir(s)), assignment,
                               nbformat.read(notebook, as_version=4))
    return SandboxPolicy(memory_bytes=s.memory_bytes, use_bwrap=s.sandbox, **course)


def checks_package(s: Settings) -> Path | None:
    """The folder of the package the course's grading module is in (found, not imported), or None."""
    module = checks_module(s)
    spec = importlib.util.find_spec(module.split(".")[0]) if module else None
    return Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None


def checks_module(s: Settings) -> str:
    from .verdicts import JudgeChecks

    return JudgeChecks(config=nbgrader_config(s)).checks_module


def compile_cache_dir(s: Settings) -> Path:
    """``s.compile_cache``, else this machine's (``machine_compile_cache``) where this user can write it, else the
    grading folder's own: a cache folder this user cannot write (XDG_CACHE_HOME naming another user's) costs the
    sharing between runs, not the grading."""
    if s.compile_cache:
        return s.compile_cache
    shared = machine_compile_cache(s.course.course_id)
    try:
        shared.mkdir(parents=True, exist_ok=True)
    except OSError:
        return s.output / "compile-cache"
    return shared if os.access(shared, os.W_OK | os.X_OK) else s.output / "compile-cache"


def machine_compile_cache(course_id: str) -> Path:
    """This machine's JAX compilation caches for a course, shared by every grading folder on it (a section, a
    regrade in a new folder, a Dask worker): each assignment's is filled once while its source and jaxlib stay as
    they are, and XLA compiles for the machine's CPU. In the user's cache folder, not /tmp, where another user
    could plant one."""
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache_home / "alibi-autograder" / "compile-cache" / course_id


def state_dir(s: Settings, student: str, assignment: str) -> Path:
    """Where one student's assignment keeps its outcomes (outcomes.py)."""
    return outcomes.assignment_dir(s.output / "state", student, assignment)
