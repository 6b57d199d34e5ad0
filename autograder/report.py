"""What a grading run leaves behind: grades.csv, feedback HTML, plots, nbgrader's own export, a summary."""

from __future__ import annotations

import csv
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from . import outcomes

COLUMNS = ["student", "assignment", "notebook", "score", "max_score", "status", "reason"]


@dataclass
class Report:
    output: Path
    db_url: str
    course_id: str
    notebooks: list[tuple[str, str]]  # (assignment, notebook), in order
    rows: list[dict] = field(default_factory=list)
    pass_rates: dict[str, float] = field(default_factory=dict)  # "notebook/test cell" -> fraction passed

    @classmethod
    def build(cls, s, class_, releases: dict[str, dict], failures: dict[tuple[str, str], dict[str, str]]) -> Report:
        from nbgrader.api import Gradebook, MissingEntry

        report = cls(s.output, s.db_url, s.course.course_id, [(a, n) for a, nbs in releases.items() for n in nbs])
        several = len(releases) > 1
        passed: dict[str, list[bool]] = {}
        points_of: dict[tuple[str, str], Points] = {}
        with Gradebook(s.db_url, s.course.course_id) as gb:
            for submission in class_:
                assignment = submission.assignment
                for name in releases[assignment]:
                    state = _state(s.output, submission.student, assignment, name)
                    status, reason = state.get("status", "error"), state.get("reason", "")
                    if status == "graded" and state.get("failed"):
                        reason = "failed " + ", ".join(f"{k} ({v})" for k, v in state["failed"].items())
                    if (assignment, name) not in points_of:  # the course's, the same for every student
                        points_of[assignment, name] = notebook_points(gb, name, assignment)
                    points = points_of[assignment, name]
                    score, max_score = 0.0, points.auto_max
                    failed = failures.get((submission.student, assignment), {})
                    why = failed.get(name) or failed.get("*")
                    if why and status not in ("missing", "unreadable", "invalid"):
                        status, reason = "error", f"nbgrader could not grade this notebook: {why}"
                    else:
                        try:
                            graded = gb.find_submission_notebook(name, assignment, submission.student)
                            score = points.autograded(graded)
                            reason = "; ".join(part for part in (reason, points.waiting(graded)) if part)
                            for grade in graded.grades:
                                if points.is_test(grade) and name in submission.notebooks:
                                    key = f"{assignment}/{name}/{grade.name}" if several else f"{name}/{grade.name}"
                                    passed.setdefault(key, []).append((grade.auto_score or 0) >= grade.max_score)
                        except MissingEntry:
                            pass
                    note = submission.notes.get(name)
                    reason = f"{reason}; {note}" if reason and note else reason or note or ""
                    report.rows.append({"student": submission.student, "assignment": assignment, "notebook": name,
                                        "score": score, "max_score": max_score, "status": status, "reason": reason})
        report.pass_rates = {k: sum(v) / len(v) for k, v in sorted(passed.items())}
        return report

    def write(self) -> None:
        with open(self.output / "grades.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS)
            writer.writeheader()
            writer.writerows(self.rows)
        self._export_nbgrader()
        self._copy_feedback()
        self._plots()

    def _export_nbgrader(self) -> None:
        from nbgrader.api import Gradebook
        from nbgrader.plugins import CsvExportPlugin

        with Gradebook(self.db_url, self.course_id) as gb:
            CsvExportPlugin(to=str(self.output / "nbgrader_grades.csv")).export(gb)

    def _copy_feedback(self) -> None:
        copy_feedback(self.output, sorted({a for a, _ in self.notebooks}))

    def _plots(self) -> None:
        from matplotlib.figure import Figure

        totals = self.totals()
        fig = Figure(figsize=(11, 4), layout="constrained")
        ax_hist, ax_rates = fig.subplots(1, 2, width_ratios=[1, 2])
        max_total = sum(self.max_scores().values())
        ax_hist.hist([t for t in totals.values()], bins=min(20, max(5, len(totals))), range=(0, max_total),
                     color="tab:blue", edgecolor="white")
        ax_hist.set_xlabel(f"autograded points (of {max_total:g})")
        ax_hist.set_ylabel("students")
        ax_hist.set_title("score distribution")
        names = list(self.pass_rates)
        ax_rates.barh(range(len(names)), [100 * self.pass_rates[n] for n in names], color="tab:green")
        ax_rates.set_yticks(range(len(names)), names, fontsize=7)
        ax_rates.invert_yaxis()
        ax_rates.set_xlim(0, 100)
        ax_rates.set_xlabel("% of submitted notebooks passing the test cell")
        ax_rates.set_title("pass rate per exercise")
        fig.savefig(self.output / "grades.png", dpi=120)

    def totals(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for row in self.rows:
            totals[row["student"]] = totals.get(row["student"], 0.0) + row["score"]
        return totals

    def max_scores(self) -> dict[tuple[str, str], float]:
        """{(assignment, notebook): its autograded points}"""
        return {(row["assignment"], row["notebook"]): row["max_score"] for row in self.rows}

    def table(self) -> str:
        """Students down, notebooks across: score, and a mark where the status is not 'graded'."""
        marks = {"graded": "", "missing": " -", "unreadable": " U", "crashed": " C", "timeout": " T",
                 "flagged": " F", "error": " E", "invalid": " I"}
        by_student: dict[str, dict[tuple[str, str], dict]] = {}
        for row in self.rows:
            by_student.setdefault(row["student"], {})[row["assignment"], row["notebook"]] = row
        several = len({a for a, _ in self.notebooks}) > 1
        short = [f"{a}/{n.split('_')[0]}" if several else n.split("_")[0] for a, n in self.notebooks]
        width = max([7, *(len(s) for s in by_student)])
        col = max([7, *(len(n) for n in short)])
        lines = [f"{'student':<{width}} " + " ".join(f"{n:>{col}}" for n in short) + f" {'total':>7}"]
        maxes = self.max_scores()
        lines.append(f"{'(max)':<{width}} " + " ".join(f"{maxes.get(n, 0):>{col}g}" for n in self.notebooks)
                     + f" {sum(maxes.values()):>7g}")
        for student, rows in by_student.items():
            cells = [f"{rows[n]['score']:g}{marks.get(rows[n]['status'], ' ?')}" if n in rows else ""
                     for n in self.notebooks]
            total = sum(row["score"] for row in rows.values())
            lines.append(f"{student:<{width}} " + " ".join(f"{c:>{col}}" for c in cells) + f" {total:>7g}")
        lines.append("marks: - missing, U unreadable, C crashed, T timed out, F flagged (reaches for the reference), "
                     "E grading error, I invalid id; details in grades.csv")
        return "\n".join(lines)


def copy_feedback(output: Path, assignments: list[str]) -> None:
    """nbgrader's feedback pages, from the course in ``output`` to ``output/feedback``: one assignment
    gives feedback/STUDENT/NOTEBOOK.html, several feedback/STUDENT/ASSIGNMENT/NOTEBOOK.html."""
    source = output / "course" / "feedback"
    for assignment in assignments:
        release = output / "course" / "release" / assignment
        for html in source.glob(f"*/{assignment}/*.html"):
            student = output / "feedback" / html.parts[-3]
            target = (student / assignment if len(assignments) > 1 else student) / html.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(html, target)
            for name in _pictures_shown(html.read_text(errors="replace"), release):
                shutil.copy(release / name, target.parent / name)


def _pictures_shown(page: str, release: Path) -> set[str]:
    """The files of the assignment's release (the instructor's, never the student's) that the page shows by a
    name beside it (``<img src="jupyter.png">``, as the notebook had it)."""
    return {name for name in re.findall(r'src="([^"/\\]+)"', page)
            if (release / name).is_file() and not (release / name).is_symlink() and name not in (".", "..")}


@dataclass(frozen=True)
class Points:
    """A notebook's points as the gradebook has them: the autograded ones (code cells that are tests), which a row's
    score counts, and those given by hand (graded answers, code or written, and tasks), which it does not."""
    auto_max: float
    by_hand: dict[str, tuple[str, float]]  # grade id -> (cell type, points)

    def is_test(self, grade) -> bool:
        """Whether a grade is a test cell's, autograded."""
        return grade.cell_type == "code" and grade.name not in self.by_hand

    def autograded(self, graded) -> float:
        """The submitted notebook's points from its test cells."""
        return float(sum(g.score for g in graded.grades if self.is_test(g)))

    def waiting(self, graded) -> str:
        """What a row says of the points by hand that it does not count: the code cells graded by hand (which
        nbgrader counts among a notebook's code points), and every such cell where nothing is autograded."""
        shown = {name: pts for name, (kind, pts) in self.by_hand.items() if kind == "code" or not self.auto_max}
        waiting = [g.name for g in graded.grades if g.name in shown and g.needs_manual_grade]
        if not waiting:
            return ""
        total = sum(shown[name] for name in waiting)
        return f"{total:g} points waiting for a hand grade ({', '.join(waiting)}), not counted here"


def notebook_points(gb, notebook: str, assignment: str) -> Points:
    """The notebook's Points; none for one nbgrader never generated (its assignment could not be made ready)."""
    from nbgrader.api import MissingEntry

    try:
        nb = gb.find_notebook(notebook, assignment)
    except MissingEntry:
        return Points(0.0, {})
    answers = {cell.name for cell in nb.solution_cells}
    by_hand = {cell.name: (cell.cell_type, cell.max_score) for cell in nb.grade_cells if cell.name in answers}
    by_hand.update({cell.name: ("markdown", cell.max_score) for cell in nb.task_cells})  # nbgrader's tasks
    auto_max = sum(cell.max_score for cell in nb.grade_cells if cell.cell_type == "code" and cell.name not in answers)
    return Points(float(auto_max), by_hand)


def _state(output: Path, student: str, assignment: str, notebook: str) -> dict:
    return outcomes.read(outcomes.outcome_path(output / "state", student, assignment, notebook))
