"""Where grading keeps each student's state, and each notebook's outcome: one layout and one format.

    STATE/STUDENT/ASSIGNMENT/NOTEBOOK.json   {"status", "reason", "seconds", "failed": {grade id: why}}
    STATE/STUDENT/ASSIGNMENT/done.sha256     what the assignment was last graded from, complete

STATE is OUTPUT/state. The grader's stage (``grade._stage``) writes the outcome of a notebook it could not
hand to nbgrader; ``verdicts.RecordOutcome`` the outcome of one nbgrader graded; ``timeouts`` reads and
amends them; the report reads them.
"""

from __future__ import annotations

import json
from pathlib import Path


def assignment_dir(state: Path, student: str, assignment: str) -> Path:
    return Path(state) / student / assignment


def outcome_path(state: Path, student: str, assignment: str, notebook: str) -> Path:
    return assignment_dir(state, student, assignment) / f"{notebook}.json"


def read(path: Path) -> dict:
    """A notebook's outcome; {} where none was written."""
    return json.loads(path.read_text()) if path.exists() else {}


def write(path: Path, outcome: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(outcome))


def notebooks(folder: Path) -> list[str]:
    """The notebooks with an outcome in one student's assignment folder (``assignment_dir``)."""
    return [p.stem for p in sorted(folder.glob("*.json")) if not p.name.startswith(".")]
