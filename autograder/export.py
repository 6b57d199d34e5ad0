"""Final grades for an LMS: one row per student, autograded and hand-graded points per notebook.

    python -m autograder export [--output OUT] [--db URL] [--csv FILE]

Reads nbgrader's gradebook after grading (and after any grading by hand in formgrader, which writes
the same gradebook) and writes a CSV laid out as Canvas's gradebook import expects: the columns
``Student, ID, SIS User ID, SIS Login ID, Section``, then one column per grade, and a second row
``Points Possible``. The student id goes in ``SIS User ID`` and ``SIS Login ID`` (what an LMS
matches on; ``ID`` is the LMS's own number, which nbgrader does not know). Per notebook there are
two columns, autograded (code) and by hand (written answers and tasks), then the total.
nbgrader's own ``nbgrader export`` gives one total per student and assignment only.
"""

from __future__ import annotations

import csv
from pathlib import Path

from .grade import ASSIGNMENT

IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def lms_rows(db_url: str, assignment: str = ASSIGNMENT) -> list[list]:
    """The header, the Points Possible row, then one row per student in the gradebook."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(db_url, ASSIGNMENT) as gb:  # the course id the autograder gives nbgrader
        notebooks = sorted(nb.name for nb in gb.find_assignment(assignment).notebooks)
        header, possible = list(IDENTITY), ["Points Possible", "", "", "", ""]
        for name in notebooks:
            nb = gb.find_notebook(name, assignment)
            header += [f"{name} autograded", f"{name} by hand"]
            possible += [_points(nb.max_code_score), _points(nb.max_written_score + nb.max_task_score)]
        header.append(f"{assignment} total")
        possible.append(_points(gb.find_assignment(assignment).max_score))
        rows = [header, possible]
        for student in sorted(gb.students, key=lambda s: s.id):
            row, total = [student.id, "", student.id, student.id, ""], 0.0
            for name in notebooks:
                try:
                    graded = gb.find_submission_notebook(name, assignment, student.id)
                    auto, by_hand = graded.code_score, graded.written_score + graded.task_score
                except MissingEntry:  # nothing handed in for this notebook
                    auto, by_hand = 0.0, 0.0
                row += [_points(auto), _points(by_hand)]
                total += auto + by_hand
            rows.append([*row, _points(total)])
    return rows


def _points(x) -> str:
    return f"{float(x or 0):g}"


def export(db_url: str, csv_path: Path, assignment: str = ASSIGNMENT) -> Path:
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        csv.writer(f).writerows(lms_rows(db_url, assignment))
    return csv_path
