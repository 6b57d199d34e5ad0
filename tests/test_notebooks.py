"""The course notebooks: one source (solutions/), one generated release (course/), graded by nbgrader."""

import json
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbgrader.utils import determine_grade
from nbgrader.validator import Validator

from autograder.verdicts import check_calls

ROOT = Path(__file__).resolve().parents[1]
ASSIGNMENT = "alibi"
SOLUTIONS = ROOT / "solutions" / ASSIGNMENT
RELEASE = ROOT / "course" / ASSIGNMENT
NOTEBOOKS = sorted(p.stem for p in SOLUTIONS.glob("*.ipynb"))
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def nbgrader(*args, cwd):
    run = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, env=ENV,
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{run.stdout}\n{run.stderr}"
    return run


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """A scratch course whose release nbgrader regenerated from solutions/: the committed one must equal it."""
    root = tmp_path_factory.mktemp("course")
    shutil.copy(ROOT / "nbgrader_config.py", root)
    shutil.copytree(SOLUTIONS, root / "solutions" / ASSIGNMENT)
    nbgrader("generate_assignment", ASSIGNMENT, "--force", cwd=root)
    return root / "course" / ASSIGNMENT


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 1
    assert sorted(p.stem for p in RELEASE.glob("*.ipynb")) == NOTEBOOKS


def test_committed_release_is_what_solutions_generate(generated):
    assert sorted(p.name for p in generated.iterdir()) == sorted(p.name for p in RELEASE.iterdir())
    for path in generated.iterdir():
        assert path.read_bytes() == (RELEASE / path.name).read_bytes(), (
            f"course/{ASSIGNMENT}/{path.name} is stale: run `make release` and commit the result"
        )


def test_release_hides_solutions_and_hidden_tests():
    for path in RELEASE.glob("*.ipynb"):
        text = path.read_text()
        for marker in ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS", "hidden=", "MARK SCHEME", "Model answer"):
            assert marker not in text, f"{path.name} contains {marker!r}"


def test_every_cell_is_an_answer_a_test_or_locked():
    """A cell without nbgrader's metadata is neither restored nor checked: a student may edit or delete it and
    nbgrader never notices. Every cell of the instructor's notebooks says what it is; the one kind meant to be
    neither is a prediction (``"prediction": true``), a guess written before a plot and told right or wrong
    after it (``alibi_ref.course.predict``), never graded."""
    for path in SOLUTIONS.glob("*.ipynb"):
        for n, cell in enumerate(nbformat.read(path, as_version=4).cells):
            meta = cell.metadata.get("nbgrader", {})
            if cell.metadata.get("prediction"):
                assert cell.cell_type == "code" and not meta and "= None" in cell.source, (path.name, n)
                continue
            assert meta.get("solution") or meta.get("grade") or meta.get("locked") or meta.get("task"), (
                f"{path.name} cell {n} ({cell.get('id')}) has no nbgrader role")


def test_each_notebook_states_the_time_the_student_paced_estimate_gives():
    """benchmarks/student_time.py estimates each notebook's time from what it asks a student to read, write and
    code; the time a notebook states is that estimate (`--write` restates them after a notebook changes)."""
    student_time = runpy.run_path(str(ROOT / "benchmarks" / "student_time.py"))
    stated = {name: student_time["stated"](name) for name in NOTEBOOKS}
    assert stated == {name: student_time["estimate"](name) for name in NOTEBOOKS}, (
        "restate: `make release`, `.venv/bin/python benchmarks/student_time.py --write`, `make release`")
    assert all(re.fullmatch(r"\d+(\.5)? to \d+(\.5)? (minutes|hours)", t) for t in stated.values()), stated


def test_every_written_answer_has_a_rubric_and_says_what_a_full_answer_covers():
    for path in SOLUTIONS.glob("*.ipynb"):
        cells = nbformat.read(path, as_version=4).cells
        for n, cell in enumerate(cells):
            meta = cell.metadata.get("nbgrader", {})
            if cell.cell_type == "markdown" and meta.get("grade") and meta.get("solution"):
                question = cells[n - 1].source
                points = [int(p) for p in re.findall(r"^\* (\d+) points?:", question, flags=re.M)]
                assert sum(points) == meta["points"], f"{path.name} {meta['grade_id']}: rubric {points}"
                assert "*A full answer (" in question and "**Model answer.**" in question, meta["grade_id"]
                assert cells[n - 1].metadata["nbgrader"].get("task"), "the mark scheme lives in a task cell"


def test_every_test_cell_says_its_points_and_runs_registered_checks_judged_in_one_view():
    from alibi_ref.course.grading import views_of
    from alibi_ref.course.model import EXERCISES, cases

    for path in SOLUTIONS.glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if not (meta.get("grade") and cell.cell_type == "code"):
                continue
            points = meta["points"]
            first = cell.source.splitlines()[0]
            assert re.fullmatch(rf"# .+: {points:g} points?", first), f"{path.name} {meta['grade_id']}: {first!r}"
            calls = check_calls(cell.source)
            assert calls and {n for n, _ in calls} <= set(EXERCISES), (path.name, calls)
            for name, seed in calls:
                assert cases(name, seed), f"{name} with seed {seed} has no cases"
            # a cell runs in one view of the package when graded: its checks all see the same helpers
            assert len(set(views_of(calls).values())) == 1, (path.name, meta["grade_id"], views_of(calls))


class ValidatorKeepingTheRun(Validator):
    """nbgrader's own Validate (what the student's button runs), keeping the notebook it executed."""

    def _preprocess(self, nb):
        self.executed = super()._preprocess(nb)
        return self.executed


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_unfilled_release_earns_nothing_and_runs_cleanly_up_to_the_first_answer(name):
    validator = ValidatorKeepingTheRun(invert=True)
    results = validator.validate(str(RELEASE / f"{name}.ipynb"))
    assert results == {}, f"{name}: a test cell passes with no answer, or a cell changed: {results}"
    cells = validator.executed.cells
    first_answer = next(i for i, c in enumerate(cells) if c.metadata.get("nbgrader", {}).get("solution"))
    for i, cell in enumerate(cells[:first_answer + 1]):
        for error in (o for o in cell.get("outputs", []) if o.output_type == "error"):
            # the first answer cell itself may only raise its stub's NotImplementedError
            assert i == first_answer and error.ename == "NotImplementedError", (
                f"{name}: cell {i} raised {error.ename}: {error.evalue} before any answer was asked for"
            )


# Checks whose hidden draws differ only in random values at one long length (N = 32768, seconds each): the
# notebook's own run of them is one draw, and another says no more, so they are not replayed
ONE_DRAW = {"tiled_memory", "tiled_backward_long"}

# Run after a solution notebook, in its kernel: each hidden check of its test cells again, with the
# cases drawn from several graders' secrets, judged as the grader judges (no exercise's draw may fail it)
REPLAY_WITH_SECRETS = """
import functools, json
from alibi_ref.course import checks, model
from alibi_ref.course.judge import judge

_replayed, _failed = 0, []


def check(name, answer=None, /, *, hidden=None, device=None, **values):
    global _replayed
    if hidden is None:
        return
    call = answer if answer is not None else functools.partial(checks._look_up, values)
    for secret in () if name in ONE_DRAW else SECRETS:
        spec = json.loads(json.dumps(model.kernel_cases(name, hidden, secret)))  # what a graded kernel reads
        if any(case["device"] == "meta" for case in spec["cases"]):
            checks._warm_up_meta()
        payload = {"exercise": name, "seed": hidden, "results": [checks._call(call, case, spec, device)
                                                                 for case in spec["cases"]]}
        verdict = judge(payload, secret)
        _replayed += 1
        if not verdict.passed:
            _failed.append(f"{name} (secret {secret.hex()[:8]}): {verdict.message}")
"""


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_solution_earns_full_marks_and_passes_its_hidden_checks_whatever_the_graders_secret(name):
    """The instructor's notebook run as a student runs it: every test cell earns its points as nbgrader scores it
    (``determine_grade``: no error and nothing on stderr). Then each hidden check again, with cases drawn from
    several graders' secrets: the instructor's answers (float32 layers and tensors among them) must pass every
    draw, not only the one the grading tests make."""
    nb = nbformat.read(SOLUTIONS / f"{name}.ipynb", as_version=4)
    graded = [i for i, c in enumerate(nb.cells)
              if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")]
    test_cells = [nb.cells[i].source.replace("from alibi_ref.course.checks import check\n", "") for i in graded]
    secrets = [bytes(range(i, i + 32)) for i in (1, 77, 190)]
    nb.cells += [nbformat.v4.new_code_cell(f"SECRETS = {secrets!r}\nONE_DRAW = {ONE_DRAW!r}\n" + REPLAY_WITH_SECRETS),
                 *map(nbformat.v4.new_code_cell, test_cells),
                 nbformat.v4.new_code_cell("print(json.dumps([_replayed, _failed]))")]
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(SOLUTIONS)}}).execute()
    scores = {nb.cells[i].metadata["nbgrader"]["grade_id"]: determine_grade(nb.cells[i]) for i in graded}
    assert scores and all(got == most > 0 for got, most in scores.values()), f"{name}: solution lost points: {scores}"
    printed = "".join(o.text for o in nb.cells[-1].outputs if o.output_type == "stream" and o.name == "stdout")
    replayed, failed = json.loads(printed)
    draws = sum(len(secrets) for source in test_cells
                for exercise, seed in check_calls(source) if seed is not None and exercise not in ONE_DRAW)
    assert replayed == draws > 0 and not failed, failed


@pytest.mark.parametrize("folder", [SOLUTIONS, RELEASE], ids=["solutions", "course"])
def test_no_outputs_are_committed(folder):
    run = subprocess.run([sys.executable, "-m", "nbstripout", "--verify", "--keep-id", *sorted(folder.glob("*.ipynb"))],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_notebook_names_the_python3_kernel():
    for path in [*SOLUTIONS.glob("*.ipynb"), *RELEASE.glob("*.ipynb")]:
        assert json.loads(path.read_text())["metadata"]["kernelspec"]["name"] == "python3", path
