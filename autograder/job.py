"""One job: a student's assignment autograded with nbgrader, graded again where it ran out of time, and its
feedback made. The local pool and the Dask workers both run ``grade_student``."""

from __future__ import annotations

import json
import time
from pathlib import Path

from . import outcomes
from .collect import Submission
from .workspace import Settings, nbgrader_api, notebook_policy, state_dir


def grade_student(s: Settings, student: str, assignment: str, notebooks: list[str], *, feedback: bool = True,
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
        result = nbgrader_api(s, replay_dir=replay_dir).autograde(assignment, student, force=True, create=True)
        if not result["success"]:
            for name in notebooks:
                one = nbgrader_api(s, name, replay_dir).autograde(assignment, student, force=True, create=True)
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
        made = nbgrader_api(s).generate_feedback(assignment, student, force=True)
        if not made["success"]:
            failed["*"] = _last_words(made)
    # where the time went (benchmarks/grading.py reads it): nbgrader's autograde, kernels included, and feedback
    timing = {"autograde": graded - started, "feedback": time.perf_counter() - graded}
    state = state_dir(s, student, assignment)
    state.mkdir(parents=True, exist_ok=True)
    (state / (".replay_timing.json" if replay_dir else ".timing.json")).write_text(json.dumps(timing))
    return {"student": student, "assignment": assignment, "failed": failed}


def _grade_timeouts_again(s: Settings, student: str, assignment: str, failed: dict) -> None:
    """Each of the student's notebooks that ran out of time, graded once more on its own, with limits scaled to
    what the instructor's solution takes now (timeouts.py)."""
    from . import timeouts

    for name in timeouts.timed_out(state_dir(s, student, assignment)):
        source = s.output / "course" / "source" / assignment / f"{name}.ipynb"
        limits = timeouts.scaled_limits(timeouts.Limits(s.cell_timeout, s.timeout),
                                        *timeouts.solution_seconds(source, notebook_policy(s, assignment, source),
                                                                   s.cell_timeout))
        again = nbgrader_api(s, name, limits=limits).autograde(assignment, student, force=True, create=True)
        if not again["success"]:
            failed[name] = _last_words(again)
        timeouts.note_retry(outcomes.outcome_path(s.output / "state", student, assignment, name), limits)


def _last_words(result: dict) -> str:
    return ((result.get("error") or result.get("log") or "").strip().splitlines() or ["?"])[-1][-500:]


def write_submitted(target: Path, notebooks: dict[str, bytes], files: dict[str, bytes]) -> None:
    """A student's notebooks and other files where nbgrader's autograde reads them: nbgrader's exchange files (the
    time handed in: late penalties), and the student's modules, in a folder of their own (screen.MODULES)."""
    for name, raw in notebooks.items():
        (target / f"{name}.ipynb").write_bytes(raw)
    for name, raw in files.items():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_bytes(raw)


def record_done(s: Settings, sub: Submission, failed: dict[str, str], failures: dict) -> None:
    """Note a finished job: its failures, or (none) that it need not be graded again while it and what it was
    graded under (``grading_fingerprint``) stay as they are."""
    if failed:
        failures[sub.student, sub.assignment] = failed
    else:
        (state_dir(s, sub.student, sub.assignment) / "done.sha256").write_text(sub.digest + sub.graded_under)
