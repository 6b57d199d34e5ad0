"""A tiny nbgrader course of two assignments, one notebook each, built in a test's folder.

It is not this repository's course: no alibi_ref, its own course id and configuration file, so a
test on it shows the autograder grading any nbgrader course. ``hw1/squares`` has a 2-point code
exercise (a visible and a hidden test) and a 1-point written answer; ``hw2/words`` a 3-point code
exercise. ``busy/sums`` (built only when asked for) has a 1-point check that takes about a second of one
CPU: a notebook a busy machine pushes past a tight time limit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

COURSE_ID = "tiny101"
ANSWERS = {  # answer cell id -> a correct answer
    "squares": "def squares(n):\n    return [i * i for i in range(n)]",
    "count_words": "def count_words(text):\n    return len(text.split())",
    "sum_of_squares": "def sum_of_squares(n):\n    return sum(i * i for i in range(n))",
}
BIG = 20_000_000  # busy/sums' check: the squares of 0 .. BIG - 1 summed one by one, about 1 s of one CPU


def _meta(grade_id, *, grade=False, solution=False, locked=False, points=None):
    meta = {"grade": grade, "solution": solution, "locked": locked, "grade_id": grade_id, "schema_version": 3}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def _notebook(cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _source_notebooks() -> dict[str, dict[str, nbformat.NotebookNode]]:
    squares = _notebook([
        new_markdown_cell("# Squares\nWrite `squares(n)`: the squares of 0 .. n - 1, as a list."),
        new_code_cell("def squares(n):\n    ### BEGIN SOLUTION\n    return [i * i for i in range(n)]\n"
                      "    ### END SOLUTION", metadata=_meta("squares", solution=True)),
        new_code_cell("# 2 points\nassert squares(3) == [0, 1, 4]\n### BEGIN HIDDEN TESTS\n"
                      "assert squares(6) == [0, 1, 4, 9, 16, 25]\n### END HIDDEN TESTS",
                      metadata=_meta("test_squares", grade=True, locked=True, points=2)),
        new_markdown_cell("Why does `squares(0)` return an empty list? (one sentence)"),
        new_markdown_cell("=== BEGIN MARK SCHEME ===\nrange(0) is empty.\n=== END MARK SCHEME ===\n"
                          "YOUR ANSWER HERE", metadata=_meta("why_empty", grade=True, solution=True, points=1)),
    ])
    words = _notebook([
        new_markdown_cell("# Words\nWrite `count_words(text)`: how many words, split on white space."),
        new_code_cell("def count_words(text):\n    ### BEGIN SOLUTION\n    return len(text.split())\n"
                      "    ### END SOLUTION", metadata=_meta("count_words", solution=True)),
        new_code_cell("# 3 points\nassert count_words('a b  c') == 3\n### BEGIN HIDDEN TESTS\n"
                      "assert count_words('') == 0\nassert count_words(' x\\ty\\n') == 2\n### END HIDDEN TESTS",
                      metadata=_meta("test_count_words", grade=True, locked=True, points=3)),
    ])
    sums = _notebook([
        new_markdown_cell("# Sums\nWrite `sum_of_squares(n)`: the sum of the squares of 0 .. n - 1."),
        new_code_cell("def sum_of_squares(n):\n    ### BEGIN SOLUTION\n    return sum(i * i for i in range(n))\n"
                      "    ### END SOLUTION", metadata=_meta("sum_of_squares", solution=True)),
        new_code_cell(f"# 1 point\nn = {BIG}\nassert sum_of_squares(n) == (n - 1) * n * (2 * n - 1) // 6",
                      metadata=_meta("test_sum_of_squares", grade=True, locked=True, points=1)),
    ])
    return {"hw1": {"squares": squares}, "hw2": {"words": words}, "busy": {"sums": sums}}


def build(root: Path, exchange: Path | None = None, assignments: tuple[str, ...] = ("hw1", "hw2")) -> Path:
    """An nbgrader course root at ``root`` (source/, nbgrader_config.py, release/ generated) with ``assignments``;
    returns root. A copy of one built per process: nbgrader's generate_assignment takes seconds a call."""
    shutil.copytree(_built(tuple(assignments)), root, dirs_exist_ok=True)
    if exchange is not None:
        with open(root / "nbgrader_config.py", "a") as f:
            f.write(f"c.Exchange.root = {str(exchange)!r}\n")
    return root


_BUILT_COURSES: dict[tuple[str, ...], Path] = {}  # assignments -> a course built with them, copied by build()


def _built(assignments: tuple[str, ...]) -> Path:
    if assignments not in _BUILT_COURSES:
        root = Path(tempfile.mkdtemp(prefix="tiny-course-")) / "course"
        atexit.register(shutil.rmtree, root.parent, True)
        root.mkdir()
        config = [f"c.CourseDirectory.course_id = {COURSE_ID!r}",
                  "c.CourseDirectory.db_url = 'sqlite:///' + __import__('os').path.join("
                  "__import__('os').path.dirname(__file__), 'gradebook.db')"]
        (root / "nbgrader_config.py").write_text("c = get_config()  # noqa: F821\n" + "\n".join(config) + "\n")
        sources = _source_notebooks()
        for assignment in assignments:
            (root / "source" / assignment).mkdir(parents=True)
            for name, nb in sources[assignment].items():
                nbformat.write(nb, root / "source" / assignment / f"{name}.ipynb")
            nbgrader(root, "generate_assignment", assignment, "--force")
        _BUILT_COURSES[assignments] = root
    return _BUILT_COURSES[assignments]


def nbgrader(cwd: Path, *args: str, env=None) -> str:
    """Run nbgrader's own command line in ``cwd``; its output, or an AssertionError with it."""
    env = dict(env or os.environ)
    # nbgrader runs its database migrations with the `alembic` program of this environment
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    run = subprocess.run([sys.executable, "-m", "nbgrader", *args, "--log-level=INFO"], cwd=cwd, env=env,
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{run.stdout}\n{run.stderr}"
    return run.stdout + run.stderr


def answer(release_nb: Path, answers: dict[str, str], written: str | None = None) -> nbformat.NotebookNode:
    """The released notebook with its answer cells filled in (cell id -> code), as a student hands it in."""
    nb = nbformat.read(release_nb, as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
        elif grade_id == "why_empty" and written is not None:
            cell.source = written
    return nb
