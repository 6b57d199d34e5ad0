"""The sample class graded once (tests/conftest.py) and everything asserted on that run: scores and statuses,
reasons, what the instructor gets, what the red team could not do, a rerun, the LMS export."""

import csv
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from conftest import FAST, csv_rows, needs_bwrap, prepared_like

from autograder.cgroup import SandboxCgroup
from autograder.grade import grade

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "autograder" / "sample_class"
RELEASE = ROOT / "course" / "alibi"
NOTEBOOKS = sorted(p.stem for p in RELEASE.glob("*.ipynb"))




@needs_bwrap
def test_sample_class_scores_and_statuses(graded_sample_class):
    out, report, _ = graded_sample_class
    expected = {(r["student"], r["notebook"]): r for r in csv_rows(SAMPLE / "expected.csv")}
    got = {(r["student"], r["notebook"]): r for r in csv_rows(out / "grades.csv")}
    students = {s for s, _ in expected}
    assert set(got) == {(s, n) for s in students for n in NOTEBOOKS}, "one row per student and notebook"
    for key, row in got.items():
        want = expected.get(key, {"score": "0.0", "status": "missing"})
        assert (float(row["score"]), row["status"]) == (float(want["score"]), want["status"]), (
            f"{key}: got {row['score']} {row['status']} ({row['reason']}), expected {want['score']} {want['status']}"
            f" ({want.get('why', '')})"
        )
        assert float(row["max_score"]) > 0
    assert report.totals()["ada"] == sum(report.max_scores().values()), "the full-marks student lost points"


@needs_bwrap
def test_reasons_say_what_happened(graded_sample_class):
    out, _, _ = graded_sample_class
    reasons = {(r["student"], r["notebook"]): r["reason"] for r in csv_rows(out / "grades.csv")}
    cy = reasons["cy", "01_slopes_and_bias"]
    assert "test_paper_slopes (CheckFailed: paper_slopes(12): 12 of 12 entries are off" in cy
    assert "Hint: for a head count that is not a power of two" in cy
    assert "MemoryError" in reasons["max", "03_slope_zero"]
    assert reasons["eve", "06_extrapolation"].startswith("failed test_kerple_log_bias (CheckFailed: kerple_log_bias(")
    assert "Hint: the bias is a penalty: -r1 log(1 + r2 |i - j|), at most 0" in reasons["eve", "06_extrapolation"]
    assert "the code in cell 7 ended the kernel (exit() or quit())" in reasons["hal", "02_worked_example"]
    # patching the checks or numpy in the kernel changes no verdict: only the zeros paper_slopes returns cost
    assert reasons["rex", "01_slopes_and_bias"].startswith("failed test_paper_slopes (CheckFailed: paper_slopes(8)")
    assert "name 'multi_head_alibi' is not defined" in reasons["rex", "03_slope_zero"]  # not in its view
    assert "alibi_bias([0.5, 0.25], 5): raised ImportError: alibi_ref.alibi_bias is not available while grading" \
        in reasons["vic", "01_slopes_and_bias"]
    assert "cell 'decode_step', line 5: imports alibi_ref.course.exercises from the reference module" in reasons[
        "vic", "04_causal"]  # the screen's one rule
    # what reached for the reference in the guard's time finds none in a graded kernel (view.py)
    unavailable = "raised ImportError: alibi_ref.alibi_attention is not available while grading"
    for student in ("vic", "wes"):
        assert f"test_alibi_head (CheckFailed: alibi_head(head 1 of the chapter's example, slope 1/2): {unavailable}" \
            in reasons[student, "02_worked_example"]
    assert "module 'alibi_ref.course.checks' has no attribute '_exercise'" in reasons["vic", "03_slope_zero"]
    assert "test_paper_slopes (CheckFailed: paper_slopes(" in reasons["wes", "01_slopes_and_bias"]
    assert "raised KeyError" in reasons["wes", "01_slopes_and_bias"]  # the hidden inputs were not in the table
    assert "test_decode_step (CheckFailed: decode_step" in reasons["wes", "04_causal"]
    assert "alibi_bias([0.5, 0.25], 5): expected an array of shape (2, 5, 5), got None" in reasons[
        "xan", "01_slopes_and_bias"]  # the display publisher had no reference to put in
    for name in ("01_slopes_and_bias", "04_causal"):  # a copy of the package is a copy of the view
        assert "raised NameError: name 'mine' is not defined" in reasons["yul", name]
    assert "raised NameError: name 'fast_bias' is not defined" in reasons["zed", "10_jax_flax"]
    # a module handed in beside the notebook that runs the reference in another Python: that Python has none either
    assert reasons["ora", "04_causal"].startswith("failed test_decode_step (CheckFailed: decode_step")
    # quinn's own torch.compile call ran (eagerly: no compiler's process per kernel), and printed
    # the zygote preloads what its first notebook imports: 01 imports no torch, and its kernel holds none
    assert "torch before any cell: False" in (out / "feedback" / "quinn" / "01_slopes_and_bias.html").read_text()
    quinn = (out / "feedback" / "quinn" / "07_pytorch.html").read_text()
    assert "compiled: " in quinn and "InductorError" not in quinn
    assert "put back deleted cells: test_paper_slopes" in reasons["sam", "01_slopes_and_bias"]
    ora = reasons["ora", "01_slopes_and_bias"]  # IPython's shell escape, run by the answers: another Python,
    assert "test_paper_slopes (CheckFailed: paper_slopes(8): raised" in ora  # which has no reference either
    assert "test_alibi_bias (CheckFailed: alibi_bias([0.5, 0.25], 5): raised" in ora
    assert "gave back the grading metadata 20 cell(s) had lost" in reasons["tia", "01_slopes_and_bias"]
    assert reasons["tia", "02_worked_example"].startswith(
        "graded 02_worked_example (1).ipynb as 02_worked_example.ipynb; gave back the grading metadata 1 cell(s)")
    assert ("graded the answer written beside its answer cell, which was left as released: sat_answer, alibi_head"
            in reasons["tia", "02_worked_example"])
    assert "does not appear to be JSON" in reasons["lou", "01_slopes_and_bias"]
    assert "bonus" in reasons["pat", "02_worked_example"]
    assert reasons["ada", "03_slope_zero"] == ""
    assert reasons["ben", "03_slope_zero"] == "no such notebook was submitted"
    # the first cell that ran out of time, named the same whichever limit struck it (the load decides which),
    # under the limits of its last run: those given, or, graded again, the solution's time then scaled (timeouts.py)
    for (student, name), cell in {("ivy", "05_schedules"): 4, ("jay", "03_slope_zero"): 6}.items():
        said = re.fullmatch(rf"cell {cell} ran past its time limit and was interrupted \(limits: (\d+) s per cell, "
                            r"(\d+) s for the whole notebook\)", reasons[student, name])
        assert said, reasons[student, name]
        assert int(said[1]) >= FAST["cell_timeout"] and int(said[2]) >= FAST["timeout"], said[0]
    # ivy's loop prints as it goes: what it printed past the cell's budget is left out, and the page says so
    page = (out / "feedback" / "ivy" / "05_schedules.html").read_text()
    assert "[grading left out" in page and "MiB of this cell's output past its first 2 MiB]" in page
    assert "... Output truncated ..." in page  # nbgrader's LimitOutput then keeps each cell's first 1000 lines


@needs_bwrap
def test_outputs_for_the_instructor(graded_sample_class):
    out, _, _ = graded_sample_class
    assert (out / "grades.png").stat().st_size > 10_000
    assert csv_rows(out / "nbgrader_grades.csv"), "nbgrader's own export is written"
    assert (out / "gradebook.db").exists()
    for student in ("ada", "cy", "hal", "oli"):
        assert list((out / "feedback" / student).glob("*.html")), f"no feedback for {student}"
    # written answers reach the instructor: tia's, typed below the answer cell she left as released, too
    # (nbgrader scores a written answer left as released 0, and does not ask for it to be graded by hand)
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gradebook:
        for student in ("ada", "tia"):
            notebook = gradebook.find_submission_notebook("02_worked_example", "alibi", student)
            (written,) = [g for g in notebook.grades if g.name == "sat_answer"]
            assert written.needs_manual_grade and written.auto_score is None, student


@needs_bwrap
def test_feedback_never_shows_hidden_tests(graded_sample_class):
    out, _, _ = graded_sample_class
    pages = list((out / "feedback").rglob("*.html"))
    assert pages
    for page in pages:
        text = page.read_text()
        for secret in ("BEGIN HIDDEN TESTS", "hidden=", "MARK SCHEME", "Rubric ("):
            assert secret not in text, f"{page.relative_to(out)} shows {secret!r}"
    # the rubrics reach the graded notebooks, which formgrader shows the instructor
    graded = (out / "course" / "autograded" / "ada" / "alibi" / "03_slope_zero.ipynb").read_text()
    assert "Rubric (3 points, for the grader)" in graded
    # the values the kernels handed back are read by the grader, then removed from the notebooks
    for graded in (out / "course" / "autograded").rglob("*.ipynb"):
        outputs = [o for c in nbformat.read(graded, as_version=4).cells for o in c.get("outputs", [])]
        assert not any("application/vnd.alibi-course.check+json" in o.get("data", {}) for o in outputs), graded
    # a failing hidden test still says what failed, by its message only
    kim = (out / "feedback" / "kim" / "01_slopes_and_bias.html").read_text()
    assert "paper_slopes(8): expected an array of shape (8,), got None" in kim  # the view's plots hold nothing
    # a mistake is named in the feedback, and a downstream exercise says it was graded with a correct upstream
    assert "queries sit at the start of the keys" in (out / "feedback" / "gus" / "01_slopes_and_bias.html").read_text()
    oli = (out / "feedback" / "oli" / "02_worked_example.html").read_text()
    assert "with a correct softmax in place of yours" in oli


@needs_bwrap
def test_the_sandbox_hid_the_solutions_and_the_gradebook(graded_sample_class):
    out, _, _ = graded_sample_class
    nb = nbformat.read(out / "course" / "autograded" / "oli" / "alibi" / "01_slopes_and_bias.ipynb", as_version=4)
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "cannot read" in printed and "bytes of" not in printed


@needs_bwrap
def test_rerun_is_idempotent_and_skips_graded_students(graded_sample_class, capsys):
    out, _, first_seconds = graded_sample_class
    before = (out / "grades.csv").read_bytes()
    started = time.monotonic()
    grade(SAMPLE / "submissions", out, **FAST)
    assert (out / "grades.csv").read_bytes() == before
    assert time.monotonic() - started < first_seconds / 3, "a re-run should not grade anyone again"


@needs_bwrap
def test_the_red_team_changed_nothing_and_no_page_runs_its_script(graded_sample_class):
    """The attacks on grading itself (make_sample_class.red_team): their scores are in expected.csv; here, what
    they tried to reach or leave behind."""
    out, _, _ = graded_sample_class
    site = Path(nbformat.__file__).parents[1]
    assert not list(site.glob("zz_planted*")) and not list((ROOT / "alibi_ref").glob("zz_planted*"))

    def own_output(student: str) -> str:
        nb = nbformat.read(out / "course" / "autograded" / student / "alibi" / "01_slopes_and_bias.ipynb", 4)
        return "".join(o.get("text", "") + o.get("evalue", "") for c in nb.cells if c.cell_type == "code"
                       for o in c.outputs)

    # the sandbox refuses these (test_a_sandboxed_kernel_sees_nothing_it_should_not tries them one by one)
    assert "refused" in own_output("rt-remount") and "planted" not in own_output("rt-remount")
    forks = re.search(r"stopped after (\d+) BlockingIOError", own_output("rt-processes"))
    assert forks and int(forks[1]) < 512, own_output("rt-processes")[-500:]
    assert "doors []" in own_output("rt-zygote") and "descriptors refused" in own_output("rt-zygote")
    assert "copies of the reference found: []" in own_output("rt-search")
    # a kernel's environment and memory are its own to read: the grader's secret is in neither, only where the
    # cases it drew are
    secret = (out / "state" / "hidden-cases.key").read_text().strip()
    for student in ("rt-procmem", "rt-fspath"):
        assert "environ opened" in own_output(student) or "opened" in own_output(student)
        assert secret not in own_output(student) and "/grading/cases.json" in own_output(student)
    assert "/proc/1/environ refused" in own_output("rt-procmem"), "the zygote (or bwrap) is not the kernel's to read"
    # outputs keep a bounded part of each error: three of 20 MB left a notebook of kilobytes
    big = out / "course" / "autograded" / "rt-big-errors" / "alibi" / "01_slopes_and_bias.ipynb"
    assert big.stat().st_size < 2**20
    many = out / "course" / "autograded" / "rt-many-cells" / "alibi" / "01_slopes_and_bias.ipynb"
    assert 30 * 2**20 < many.stat().st_size < 40 * 2**20, "the notebook keeps its 32 MiB of output, no more"
    # no script of a student's runs in the feedback or in the notebook formgrader shows: kept as text at most (the
    # student's code is shown, escaped, as code)
    live = re.compile(r"<script|<[^>]*\bon\w+\s*=|href=\"javascript:|application/javascript", re.IGNORECASE)
    page = (out / "feedback" / "rt-xss" / "01_slopes_and_bias.html").read_text()
    template = (out / "feedback" / "hon-notes" / "01_slopes_and_bias.html").read_text()  # its own scripts (MathJax)
    assert "pwned" in page and len(live.findall(page)) == len(live.findall(template)), live.findall(page)
    nb = nbformat.read(out / "course" / "autograded" / "rt-xss" / "alibi" / "01_slopes_and_bias.ipynb", 4)
    shown = [c.source for c in nb.cells if c.cell_type == "markdown"] + [
        json.dumps(o.get("data", {})) for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert any("pwned" in text for text in shown) and not any(live.search(text) for text in shown)
    # pictures the answer names for the grader's files: the page names them, and nothing comes beside it
    assert 'src="hidden-cases.key"' in page and 'src="gradebook.db"' in page
    assert [p.name for p in (out / "feedback" / "rt-xss").iterdir()] == ["01_slopes_and_bias.html"]
    # a test cell shows its verdicts and nothing else it printed (the hook printed every cell's source)
    hook = (out / "feedback" / "rt-hidden-print" / "01_slopes_and_bias.html").read_text()
    assert "CELL:" in hook and "CELL: # paper_slopes" not in hook


def test_final_grades_for_an_lms_add_the_points_graded_by_hand(graded_sample_class, tmp_path):
    """A written answer graded by hand (nbgrader's API, as formgrader does) shows up beside the autograded points."""
    from nbgrader.api import Gradebook

    from autograder.__main__ import main

    out, report, _ = graded_sample_class
    shutil.copy(out / "gradebook.db", tmp_path / "gradebook.db")  # the session's gradebook stays as graded
    db = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with Gradebook(db, "alibi") as gb:
        written = gb.find_grade("redundant_answer", "04_causal", "alibi", "ada")
        written.manual_score = 1.0
        gb.db.commit()
    assert main(["export", "--output", str(tmp_path)]) == 0
    with open(tmp_path / "lms_grades.csv", newline="") as f:
        header, possible, *rows = list(csv.reader(f))
    assert header[:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    assert possible[0] == "Points Possible" and float(possible[-1]) == 90  # 66 autograded, 24 by hand
    by_student = {row[2]: dict(zip(header, row, strict=True)) for row in rows}
    assert set(by_student) == set(report.totals()), "one row per student"
    ada = by_student["ada"]
    assert ada["04_causal autograded"] == "8" and ada["04_causal by hand"] == "1"
    assert float(ada["alibi total"]) == report.totals()["ada"] + 1
    for student, total in report.totals().items():
        if student != "ada":
            assert float(by_student[student]["alibi total"]) == total, student


# what a busy machine changes in a reason, not in a grade (timeouts.note_retry)
RETRIED = "graded again on its own after running out of time on a busy machine"
UNDER_LOAD = ("quinn", "wes")  # honest, with a note on stderr; an attack whose table misses the secret-drawn cases


@needs_bwrap
def test_part_of_the_class_under_half_a_cpu_gets_expected_csv(graded_sample_class, tmp_path):
    """Load costs time, never points: two students' first notebook graded with half a CPU and a 1 s limit for
    the whole notebook get exactly their rows of expected.csv: quinn's honest notebook runs out of time and is
    graded again with limits scaled to what the solution takes then (timeouts.py); wes's attack still misses.
    (A loop runs out of time again: ivy, in the class above.) A CPU quota, unlike a CPU hog, makes the same
    machine for this test whatever else runs."""
    busy = SandboxCgroup.cpu_share(1 / 2)
    if busy is None:
        pytest.skip("this process may make no cgroup with a CPU quota")
    notebook, out = "01_slopes_and_bias", tmp_path / "out"
    for student in UNDER_LOAD:  # copies: grading follows no link
        (tmp_path / "in" / student / "alibi").mkdir(parents=True)
        shutil.copy(SAMPLE / "submissions" / student / "alibi" / f"{notebook}.ipynb",
                    tmp_path / "in" / student / "alibi")
    prepared_like(graded_sample_class[0], out)
    try:
        subprocess.run([*busy.join_prefix(), sys.executable, "-m", "autograder", "grade", str(tmp_path / "in"),
                        "--output", str(out), "--cell-timeout", "1", "--timeout", "1", "--workers", "2",
                        "--no-progress"], cwd=ROOT, check=True, capture_output=True)
    finally:
        busy.close()
    expected = {r["student"]: r for r in csv_rows(SAMPLE / "expected.csv")
                if r["student"] in UNDER_LOAD and r["notebook"] == notebook}
    got = {r["student"]: r for r in csv_rows(out / "grades.csv") if r["notebook"] == notebook}
    assert {s: (float(r["score"]), r["status"]) for s, r in got.items()} == {
        s: (float(r["score"]), r["status"]) for s, r in expected.items()}, got
    # quinn's notebook takes 2.6 s of one CPU: past the limit at any share (wes's fails fast, within it or not)
    assert RETRIED in got["quinn"]["reason"], f"quinn was not graded again: {got['quinn']['reason']}"
