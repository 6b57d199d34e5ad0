"""Final grades for an LMS: one row per student, autograded and hand-graded points per notebook.

    python -m autograder export [--output OUT] [--db URL] [--csv FILE] [--course-id ID]

Reads nbgrader's gradebook after grading (and after any grading by hand in formgrader, which writes
the same gradebook) and writes a CSV laid out as Canvas's gradebook import expects: the columns
``Student, ID, SIS User ID, SIS Login ID, Section``, then one column per grade, and a second row
``Points Possible``. The student id goes in ``SIS User ID`` and ``SIS Login ID`` (what an LMS
matches on; ``ID`` is the LMS's own number, which nbgrader does not know). Per notebook there are
two columns, autograded (code) and by hand (written answers and tasks), then each assignment's
total; with several assignments the notebook columns are named ``ASSIGNMENT/NOTEBOOK``.
nbgrader's own ``nbgrader export`` gives one total per student and assignment only.
"""

from __future__ import annotations

import csv
from pathlib import Path

IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def course_ids(db_url: str) -> list[str]:
    """The courses with assignments that a gradebook holds (the autograder's hold one)."""
    import sqlalchemy as sa

    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as db:
            # a course without assignments is nbgrader's "default_course", made by an API call without one
            query = "select distinct course.id from course join assignment on assignment.course_id = course.id"
            return sorted(row[0] for row in db.execute(sa.text(query)))
    finally:
        engine.dispose()


def lms_rows(db_url: str, course_id: str | None = None) -> list[list]:
    """The header, the Points Possible row, then one row per student in the gradebook."""
    from nbgrader.api import Gradebook, MissingEntry

    from .report import notebook_points

    if course_id is None:
        found = course_ids(db_url)
        if len(found) != 1:
            raise ValueError(f"the gradebook holds {len(found)} courses ({', '.join(found)}): "
                             "name one with --course-id")
        course_id = found[0]
    with Gradebook(db_url, course_id) as gb:
        assignments = sorted(gb.assignments, key=lambda a: (a.duedate is None, a.duedate, a.name))
        header, possible, columns = list(IDENTITY), ["Points Possible", "", "", "", ""], []
        for assignment in assignments:
            prefix = f"{assignment.name}/" if len(assignments) > 1 else ""
            for nb in sorted(assignment.notebooks, key=lambda nb: nb.name):
                header += [f"{prefix}{nb.name} autograded", f"{prefix}{nb.name} by hand"]
                points = notebook_points(gb, nb.name, assignment.name)  # grades.csv's: test cells alone
                possible += [_points(points.auto_max), _points(nb.max_score - points.auto_max)]
                columns.append((assignment.name, nb.name, points))
            header.append(f"{assignment.name} total")
            possible.append(_points(assignment.max_score))
            columns.append((assignment.name, None, None))
        rows = [header, possible]
        for student in sorted(gb.students, key=lambda s: s.id):
            row, total = [student.id, "", student.id, student.id, ""], 0.0
            for assignment, name, points in columns:
                if name is None:  # the assignment's total closes its columns
                    row.append(_points(total))
                    total = 0.0
                    continue
                try:
                    graded = gb.find_submission_notebook(name, assignment, student.id)
                    auto = points.autograded(graded)
                    by_hand = graded.score - auto
                except MissingEntry:  # nothing handed in for this notebook
                    auto, by_hand = 0.0, 0.0
                row += [_points(auto), _points(by_hand)]
                total += auto + by_hand
            rows.append(row)
    return rows


def _points(x) -> str:
    return f"{float(x or 0):g}"


def export(db_url: str, csv_path: Path, course_id: str | None = None) -> Path:
    rows = lms_rows(db_url, course_id)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return csv_path
