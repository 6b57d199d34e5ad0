"""The instructor's side of nbgrader's exchange around a grading run: collect, then feedback.

    python -m autograder collect --course COURSE_ROOT [--assignment NAME]
    python -m autograder grade COURSE_ROOT/submitted --course COURSE_ROOT --output OUT
    (grade the written answers by hand in formgrader, or through nbgrader's Gradebook API)
    python -m autograder feedback --output OUT [--release]
    python -m autograder export --output OUT

Collecting and releasing are nbgrader's own: ``collect`` runs nbgrader's collect in the course root
(its exchange, as its nbgrader_config.py says); ``feedback`` regenerates every student's feedback
from the gradebook (so it carries the points given by hand), without hidden tests, and with
``--release`` puts it in the exchange with nbgrader's release_feedback, from which students get it
with ``nbgrader fetch_feedback``. The grading run keeps each submission's timestamp and
submission secret, so the released pages are the ones nbgrader's fetch_feedback looks for.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from .course import CONFIG_FILE, load_config


def _check(result: dict, what: str) -> str:
    if not result["success"]:
        raise RuntimeError(f"nbgrader {what} failed:\n{result.get('log', '')}\n{result.get('error', '')}")
    return result.get("log", "")


def collect(course_root: Path, assignments) -> str:
    """nbgrader's collect, in the course root: every submission in its exchange into submitted/."""
    from nbgrader.apps import NbGraderAPI

    course_root = Path(course_root).resolve()
    if not (course_root / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{course_root} is not an nbgrader course root: it has no {CONFIG_FILE}")
    config = load_config(course_root / CONFIG_FILE)
    config.CourseDirectory.root = str(course_root)
    api = NbGraderAPI(config=config)
    return "".join(_check(api.collect(a), f"collect {a}") for a in assignments)


def feedback(output: Path, release: bool = False, db: str | None = None) -> list[str]:
    """Regenerate every graded student's feedback from the gradebook, copy it to OUT/feedback and, with
    ``release``, release it through the course's exchange. Returns the assignments done."""
    from .grade import _api, load_settings
    from .report import copy_feedback

    s = load_settings(output, db)
    graded = s.output / "course" / "autograded"
    done = [a for a in s.course.assignments if any(graded.glob(f"*/{a}/*.ipynb"))]
    for assignment in done:
        _check(_api(s).generate_feedback(assignment, force=True), f"generate_feedback {assignment}")
        if release:
            with warnings.catch_warnings():  # nbgrader 0.9.6 passes its exchange a misspelt keyword ("authentictor")
                warnings.filterwarnings("ignore", "Passing unrecognized arguments", DeprecationWarning)
                _check(_api(s, exchange=True).release_feedback(assignment), f"release_feedback {assignment}")
    copy_feedback(s.output, list(s.course.assignments))
    return done
