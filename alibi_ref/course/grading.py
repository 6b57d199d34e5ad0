"""The course's side of grading, for the autograder (``JudgeChecks.checks_module``): what it writes before the
kernels run, and how it judges what they hand back.

    write_cases(path, calls, secret)    the cases' inputs for a graded kernel (wire.GRADING_ENV names the file)
    save_expected / load_expected       the reference's values, computed once per assignment
    views_of(calls)                     which view each check call is judged in (view.py)
    write_view(folder, helpers, lent)   a view of the package, bound in place of it in the sandbox
    judge(payload, secret, rescue=...)  a check's verdict
    measures_memory(name)               whether the grader measures a check's cell's memory (judge's peak_rise)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import exercises  # noqa: F401  (registers every exercise)
from .judge import Verdict, judge, load_expected, save_expected
from .model import EXERCISES, find, kernel_cases_file
from .view import BARE, helpers_in, helpers_of, view_key, write_view
from .wire import GRADING_ENV, MIME

__all__ = ["BARE", "GRADING_ENV", "MIME", "Verdict", "helpers_in", "judge", "load_expected", "measures_memory",
           "save_expected", "upstream_of", "view_key", "views_of", "write_cases", "write_view"]


def write_cases(path: Path, calls, secret: bytes | None = None) -> None:
    """The inputs of every check call in ``calls`` (hidden ones drawn with ``secret``), for the kernels to read."""
    draft = Path(path).with_suffix(f".{os.getpid()}.tmp")
    draft.write_text(json.dumps(kernel_cases_file(calls, secret)))
    draft.replace(path)


def views_of(calls) -> dict[tuple[str, int | None], str]:
    """(exercise, seed) -> the key of the view it is judged in."""
    return {(name, seed): view_key(helpers_of([name])) for name, seed in calls}


def measures_memory(name: str) -> bool:
    """Whether exercise ``name``'s check bounds the answer's memory, judged from what the grader measures around
    the check's cell (``Exercise.peak_from_grader``): the grader meters only such cells."""
    return name in EXERCISES and EXERCISES[name].peak_from_grader


def upstream_of(name: str) -> tuple[str, ...]:
    """The earlier answers exercise ``name`` calls (``Exercise.upstream``)."""
    return find(name).upstream
