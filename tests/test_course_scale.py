"""The autograder beyond this course and this machine: any nbgrader course, several assignments, the
installed package, a Dask cluster, and the cycle an instructor runs through nbgrader's exchange."""

import contextlib
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import tiny_course
from conftest import FAST, csv_rows, needs_bwrap, prepared_like

from autograder.grade import grade

ROOT = Path(__file__).resolve().parents[1]




def _scores(path) -> dict[tuple[str, str, str], tuple[float, str]]:
    return {(r["student"], r["assignment"], r["notebook"]): (float(r["score"]), r["status"]) for r in csv_rows(path)}


def _hand_in(folder: Path, course: Path, assignment: str, notebook: str, answers, written=None) -> None:
    nb = tiny_course.answer(course / "release" / assignment / f"{notebook}.ipynb", answers, written)
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / f"{notebook}.ipynb")


def _tiny_class(course: Path, subs: Path) -> dict:
    """Four students of the tiny course in nbgrader's layout; what each should get."""
    right = tiny_course.ANSWERS
    _hand_in(subs / "good" / "hw1", course, "hw1", "squares", right)
    _hand_in(subs / "good" / "hw2", course, "hw2", "words", right)
    _hand_in(subs / "part" / "hw1", course, "hw1", "squares", {"squares": "def squares(n):\n    return [0, 1, 4]"})
    _hand_in(subs / "part" / "hw2", course, "hw2", "words", right)
    _hand_in(subs / "dies" / "hw1", course, "hw1", "squares", {"squares": "import os\nos._exit(3)"})
    _hand_in(subs / "flat", course, "hw2", "words", right)  # not in a folder named for the assignment
    return {
        ("good", "hw1", "squares"): (2.0, "graded"), ("good", "hw2", "words"): (3.0, "graded"),
        ("part", "hw1", "squares"): (0.0, "graded"), ("part", "hw2", "words"): (3.0, "graded"),
        ("dies", "hw1", "squares"): (0.0, "crashed"), ("dies", "hw2", "words"): (0.0, "missing"),
        ("flat", "hw1", "squares"): (0.0, "missing"), ("flat", "hw2", "words"): (0.0, "missing"),
    }


@needs_bwrap
def test_a_students_scripts_and_packages_run_and_the_assignments_own_files_win(tmp_path):
    """Grading puts a script a notebook %runs in the kernel's folder (screen.run_scripts); a student's script
    of the same name as a file the assignment hands out must not replace that file, which later cells may
    import: nbgrader's own files win over a student's. The student's own script, where the assignment has
    none, runs. (Its name is one no test imports: a module the grading process can import is "installed".)
    A package of the student's (a folder with __init__.py, its files importing each other) is handed over
    whole: ``import`` of it failed when graded, though it ran in the student's Jupyter."""
    course = tiny_course.build(tmp_path / "tiny")
    (course / "source" / "hw1" / "given.py").write_text("TRUSTED = True\n")  # the assignment's own
    tiny_course.nbgrader(course, "generate_assignment", "hw1", "--force")
    answer = {"squares": "def squares(n):\n    return [i * i for i in range(n)] if TRUSTED and SET_UP else []"}
    for student, scripts in [("kept", {"given.py": "TRUSTED = False\n", "own_setup.py": "SET_UP = True\n"}),
                             ("own", {"own_setup.py": "SET_UP = True\n"})]:
        _hand_in(tmp_path / "subs" / student / "hw1", course, "hw1", "squares", answer)
        nb = nbformat.read(tmp_path / "subs" / student / "hw1" / "squares.ipynb", as_version=4)
        nb.cells.insert(1, nbformat.v4.new_code_cell("%run given.py\n%run own_setup.py"))
        nbformat.write(nb, tmp_path / "subs" / student / "hw1" / "squares.ipynb")
        for name, source in scripts.items():
            (tmp_path / "subs" / student / "hw1" / name).write_text(source)
    _hand_in(tmp_path / "subs" / "pkg" / "hw1", course, "hw1", "squares",
             {"squares": "from own_squares import squares"})
    for name, source in {"__init__.py": "from .inner.squares import squares\n", "inner/__init__.py": "",
                         "inner/squares.py": "from ..rules import square\n\ndef squares(n):\n"
                                             "    return [square(i) for i in range(n)]\n",
                         "rules.py": "def square(i):\n    return i * i\n"}.items():
        (tmp_path / "subs" / "pkg" / "hw1" / "own_squares" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "subs" / "pkg" / "hw1" / "own_squares" / name).write_text(source)
    grade(tmp_path / "subs", tmp_path / "out", course=course, assignments=["hw1"], **FAST)
    scores = _scores(tmp_path / "out" / "grades.csv")
    reasons = {r["student"]: r["reason"] for r in csv_rows(tmp_path / "out" / "grades.csv")}
    assert scores["kept", "hw1", "squares"] == scores["own", "hw1", "squares"] == (2.0, "graded"), reasons
    assert scores["pkg", "hw1", "squares"] == (2.0, "graded"), reasons


@needs_bwrap
def test_any_nbgrader_course_with_several_assignments(tmp_path, capsys):
    course = tiny_course.build(tmp_path / "tiny")
    expected = _tiny_class(course, tmp_path / "subs")
    out = tmp_path / "out"
    report = grade(tmp_path / "subs", out, course=course, **FAST)
    assert _scores(out / "grades.csv") == expected
    assert report.course_id == tiny_course.COURSE_ID
    reasons = {(r["student"], r["assignment"]): r["reason"] for r in csv_rows(out / "grades.csv")}
    assert "the kernel died in cell 1" in reasons["dies", "hw1"]
    assert "test_squares" in reasons["part", "hw1"]
    # feedback per student and assignment, without the hidden tests
    page = re.sub(r"<[^>]+>", "", (out / "feedback" / "part" / "hw1" / "squares.html").read_text())
    assert "squares(3)" in page and "squares(6)" not in page
    # the gradebook is the course's: its id, both assignments
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{out / 'gradebook.db'}", tiny_course.COURSE_ID) as gb:
        assert sorted(a.name for a in gb.assignments) == ["hw1", "hw2"]
        assert gb.find_submission_notebook("words", "hw2", "good").code_score == 3
    # resuming: a second run grades no one again and writes the same table
    done = {p: p.stat().st_mtime_ns for p in out.glob("state/*/*/done.sha256")}
    assert len(done) == 5, "every handed-in assignment graded"
    grade(tmp_path / "subs", out, course=course, **FAST)
    assert {p: p.stat().st_mtime_ns for p in out.glob("state/*/*/done.sha256")} == done
    assert _scores(out / "grades.csv") == expected
    # the instructor drops hw1's hidden test, which "part" fails: hw1 is graded again, and only hw1 (before,
    # a re-run kept every grade, the fixed test's included)
    source = course / "source" / "hw1" / "squares.ipynb"
    nb = nbformat.read(source, as_version=4)
    (test,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_squares"]
    test.source = test.source.split("### BEGIN HIDDEN TESTS")[0].rstrip()
    nbformat.write(nb, source)
    grade(tmp_path / "subs", out, course=course, **FAST)
    after = {p: p.stat().st_mtime_ns for p in out.glob("state/*/*/done.sha256")}
    assert {p.parent.name for p in done if after[p] != done[p]} == {"hw1"}
    assert {p.parent.parent.name for p in done if after[p] != done[p]} == {"good", "part", "dies"}
    expected[("part", "hw1", "squares")] = (2.0, "graded")
    assert _scores(out / "grades.csv") == expected
    # and a longer time limit grades everyone again
    grade(tmp_path / "subs", out, course=course, **{**FAST, "cell_timeout": FAST["cell_timeout"] + 1})
    assert all(p.stat().st_mtime_ns != after[p] for p in after)
    # one assignment and two students alone, chosen by name: then notebooks outside a folder named for the
    # assignment count too
    only = grade(tmp_path / "subs", tmp_path / "out2", course=course, assignments=["hw2"], students=["flat", "good"],
                 **FAST)
    assert {r["assignment"] for r in only.rows} == {"hw2"}
    assert _scores(tmp_path / "out2" / "grades.csv") == {("good", "hw2", "words"): (3.0, "graded"),
                                                          ("flat", "hw2", "words"): (3.0, "graded")}
    # a student who handed nothing in is named before anything is graded
    from autograder.__main__ import main

    with pytest.raises(SystemExit):
        main(["grade", str(tmp_path / "subs"), "--output", str(tmp_path / "out3"), "--course", str(course),
              "--student", "good", "--student", "nobody"])
    assert "no submission from nobody in" in capsys.readouterr().err
    assert not list((tmp_path / "out3").glob("state/*/*/done.sha256")), "nobody graded"


# ----------------------------------------------------------------------------- courses this project did not write

def _quickstart_course(tmp_path: Path) -> Path:
    """A course made by ``nbgrader quickstart`` (ps1, its header named relative to the course root), with the
    autotest assignment and templates of nbgrader's example course beside it, as they ship in nbgrader, and an
    assignment nbgrader cannot generate (two cells with one grade id)."""
    import nbgrader

    guide = Path(nbgrader.__file__).parent / "docs" / "source" / "user_guide"
    subprocess.run([sys.executable, "-m", "nbgrader", "quickstart", "course101"], cwd=tmp_path, check=True,
                   capture_output=True)
    course = tmp_path / "course101"
    shutil.copytree(guide / "source" / "ps1_autotest", course / "source" / "ps1_autotest")
    shutil.copy(guide / "autotests.yml", course / "autotests.yml")
    broken = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("assert True", metadata={"nbgrader": {
            "grade": True, "solution": False, "locked": True, "grade_id": "twice", "points": 1, "schema_version": 3}})
        for _ in range(2)])
    (course / "source" / "broken").mkdir()
    nbformat.write(broken, course / "source" / "broken" / "twice.ipynb")
    return course


@needs_bwrap
def test_nbgrader_example_and_quickstart_courses_grade_as_plain_nbgrader_grades_them(tmp_path):
    """A course this project did not write, graded with no change: every cell's score is plain ``nbgrader
    autograde``'s; the broken assignment costs its own rows, not the run; points given by hand are counted
    apart and said to wait; the feedback pages carry their pictures; nothing of ALiBi is imported."""
    import nbgrader
    from nbgrader.api import Gradebook

    course = _quickstart_course(tmp_path)
    shipped = Path(nbgrader.__file__).parent / "docs" / "source" / "user_guide" / "submitted"
    subs = tmp_path / "subs"
    for student in ("bitdiddle", "hacker"):
        shutil.copytree(shipped / student / "ps1", subs / student / "ps1")
    shutil.copytree(course / "source" / "broken", subs / "carol" / "broken")
    out = tmp_path / "out"
    graded = subprocess.run(
        [sys.executable, "-c", "import sys; from autograder.__main__ import main; main(sys.argv[1:]); "
         "print('ALIBI', sorted(m for m in ('torch', 'alibi_ref', 'jax') if m in sys.modules))",
         "grade", str(subs), "--course", str(course), "--output", str(out), "--no-progress",
         "--cell-timeout", str(FAST["cell_timeout"]), "--timeout", str(FAST["timeout"])],
        cwd=ROOT, capture_output=True, text=True, check=True)
    assert "ALIBI []" in graded.stdout, graded.stdout[-2000:]
    rows = {(r["student"], r["assignment"], r["notebook"]): r for r in csv_rows(out / "grades.csv")}
    # the assignment nbgrader cannot generate: its rows say why; ps1 and the autotest assignment are graded
    assert (rows["carol", "broken", "twice"]["status"], rows["carol", "broken", "twice"]["reason"]) == (
        "error", "the course's assignment broken could not be made ready: nbgrader generate_assignment failed: "
                 "ValidationError: Duplicate grade id: twice")
    assert rows["hacker", "broken", "twice"]["status"] == "missing", "handed nothing in for it"
    header = nbformat.read(course / "source" / "header.ipynb", as_version=4).cells[0].source
    assert nbformat.read(out / "course" / "release" / "ps1" / "problem1.ipynb", as_version=4).cells[0].source == header
    assert "### AUTOTEST" not in (out / "course" / "release" / "ps1_autotest" / "problem1.ipynb").read_text()
    assert {rows[s, "ps1", n]["status"] for s in ("bitdiddle", "hacker") for n in ("problem1", "problem2")} == {
        "graded"}
    # plain nbgrader, in the course itself, as its user guide runs it
    shutil.copytree(subs, course / "submitted", ignore=shutil.ignore_patterns("broken"), dirs_exist_ok=True)
    tools = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for step in ("generate_assignment", "autograde"):  # nbgrader runs alembic from the environment's bin folder
        subprocess.run([sys.executable, "-m", "nbgrader", step, "ps1", "--force"], cwd=course, check=True,
                       capture_output=True, env=tools)

    def cells(db: Path) -> dict:
        with Gradebook(f"sqlite:///{db}", "course101") as gb:
            return {(s, nb.name, g.name): (g.cell_type, g.auto_score, g.max_score, g.needs_manual_grade)
                    for s in ("bitdiddle", "hacker")
                    for nb in gb.find_submission("ps1", s).notebooks for g in nb.grades}

    plain = cells(course / "gradebook.db")
    assert plain and cells(out / "gradebook.db") == plain
    # a row counts the autograded points (test cells); the answers and tasks graded by hand wait, and where they
    # are code (hacker's problem1) or all there is (problem2), the row says so
    by_hand = {cell.metadata.nbgrader["grade_id"] for path in (course / "source" / "ps1").glob("*.ipynb")
               for cell in nbformat.read(path, as_version=4).cells
               if cell.metadata.get("nbgrader", {}).get("solution") or cell.metadata.get("nbgrader", {}).get("task")}
    for (student, name), row in {(s, n): rows[s, "ps1", n] for s in ("bitdiddle", "hacker")
                                 for n in ("problem1", "problem2")}.items():
        tests = [v for (s, n, g), v in plain.items() if (s, n) == (student, name) and g not in by_hand]
        assert (float(row["score"]), float(row["max_score"])) == (
            sum(auto for kind, auto, _, _ in tests if kind == "code"),
            sum(most for kind, _, most, _ in tests if kind == "code")), row
        waiting = [g for (s, n, g), (kind, _, _, waits) in plain.items()
                   if (s, n) == (student, name) and waits and (kind == "code" or name == "problem2")]
        assert all(g in row["reason"] for g in waiting) and ("waiting for a hand grade" in row["reason"]) == bool(
            waiting), (waiting, row)
    assert any(g == "sum_of_squares_application" for (_, _, g), v in plain.items() if v[3]), "no code cell waits"
    # the picture the notebook shows, beside its feedback page
    assert (out / "feedback" / "hacker" / "ps1" / "jupyter.png").is_file()
    assert 'src="jupyter.png"' in (out / "feedback" / "hacker" / "ps1" / "problem1.html").read_text()


def test_a_postgresql_gradebook_gives_the_same_grades(postgres_url, tmp_path):
    """The tiny class graded by the local pool (two workers writing at once) into a real PostgreSQL server: what
    it gets on sqlite, and the grades live in the server, not in a file."""
    import sqlalchemy as sa

    course = tiny_course.build(tmp_path / "tiny")
    expected = _tiny_class(course, tmp_path / "subs")
    grade(tmp_path / "subs", tmp_path / "out", course=course, db=postgres_url, **FAST)
    assert _scores(tmp_path / "out" / "grades.csv") == expected
    with sa.create_engine(postgres_url).connect() as db:
        points = db.execute(sa.text("select sum(auto_score) from grade")).scalar()
    assert points == sum(score for score, _ in expected.values()) > 0
    assert not (tmp_path / "out" / "gradebook.db").exists()


def test_a_course_that_is_not_there_says_what_was_expected(tmp_path):
    from autograder.course import Course

    with pytest.raises(FileNotFoundError, match="does not exist"):
        Course.find(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="one folder of notebooks per assignment"):
        Course.find(tmp_path / "empty")
    course = tiny_course.build(tmp_path / "tiny")
    with pytest.raises(FileNotFoundError, match=r"no assignment 'hw3'.*it has hw1, hw2"):
        Course.find(course, ["hw3"])
    found = Course.find(course)
    assert (found.course_id, found.assignments, found.source) == (tiny_course.COURSE_ID, ("hw1", "hw2"),
                                                                    course / "source")


@pytest.mark.parametrize("fault", ["raised", "in nbgrader's log"])
def test_a_full_disk_while_the_course_is_made_ready_stops_the_run_and_says_so(fault, tmp_path, monkeypatch, capsys):
    """An assignment nbgrader cannot generate costs that assignment alone (the foreign courses above); a fault
    of the machine does not become rows that call the course broken: the command stops, says what happened, and
    grades nothing."""
    import errno

    from autograder import prepare
    from autograder.__main__ import main

    course = tiny_course.build(tmp_path / "tiny")
    (tmp_path / "subs" / "ann" / "hw1").mkdir(parents=True)

    def disk_full(*args, **kwargs):
        if fault == "raised":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise RuntimeError("nbgrader generate_assignment failed: OperationalError: database or disk is full")

    monkeypatch.setattr(prepare, "_prepare_expected_values", disk_full)
    assert main(["grade", str(tmp_path / "subs"), "--course", str(course), "--output", str(tmp_path / "out"),
                 "--no-progress"]) == 1
    said = capsys.readouterr().err
    assert "grading stopped while making assignment hw1 ready" in said, said
    assert ("No space left on device" if fault == "raised" else "database or disk is full") in said, said
    assert not (tmp_path / "out" / "grades.csv").exists()


# ----------------------------------------------------------------------------- a real Dask cluster

def _scheduler_address(info: Path, deadline: float) -> str:
    """The address in the scheduler's file once it is whole: the scheduler creates the file before it writes the
    JSON, so a file that exists can still be empty or half written."""
    while True:
        try:
            return json.loads(info.read_text())["address"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture
def dask_cluster(tmp_path):
    """A real ``dask scheduler`` and two ``dask worker`` processes on 127.0.0.1, each worker one thread
    with one sandbox slot: (the scheduler's address, {worker name: its process}). Stopped afterwards."""
    pytest.importorskip("distributed", reason="dask distributed is not installed")
    dask = str(Path(sys.executable).parent / "dask")
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    logs = tmp_path / "dask-logs"
    logs.mkdir()
    info = tmp_path / "scheduler.json"
    procs = {}

    def start(name, *args):
        with open(logs / f"{name}.log", "wb") as log:
            procs[name] = subprocess.Popen([dask, *args], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)

    try:
        start("scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
              "--scheduler-file", str(info))
        address = _scheduler_address(info, deadline=time.monotonic() + 60)
        for name in ("w1", "w2"):
            start(name, "worker", address, "--name", name, "--nthreads", "1", "--resources", "sandbox=1",
                  "--no-dashboard", "--local-directory", str(tmp_path / name))
        from distributed import Client

        with Client(address, timeout="30s") as client:
            client.wait_for_workers(2, timeout=90)
        yield address, procs
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# what a busy machine changes in a reason, not in a grade: the note on a notebook graded again after it ran out
# of time (timeouts.note_retry), and the limits a timed-out notebook's last run had (the solution's time scaled)
RETRY_NOTE = re.compile(r"graded again on its own after running out of time on a busy machine \([^)]*\)(; )?")
LIMITS = re.compile(r"\(limits: \d+ s per cell, \d+ s for the whole notebook\)")


def _without_retry_notes(rows: list[dict]) -> list[dict]:
    return [{**row, "reason": LIMITS.sub("(limits: ...)", RETRY_NOTE.sub("", row["reason"]))} for row in rows]


# every status but one, each through what a worker does that the local pool does not (its own copy of the course
# and the secret, the one writer's gradebook, feedback pages): graded, crashed, unreadable in a zip beside a
# notebook graded from it, flagged (an answer that imports the reference) beside answers that reach for it by other
# routes, and a JAX notebook (the compilation cache lent on the worker). Timed out, graded again on the worker, is
# the tiny class's in the killed-worker test: the class's loops (ivy's, jay's) hold a worker for four limits
DASK_STUDENTS = ("hal", "lou", "vic", "uma")


@needs_bwrap
def test_the_sample_class_graded_on_dask_into_postgresql_matches_local_sqlite(graded_sample_class, dask_cluster,
                                                                              postgres_url, tmp_path):
    """Grade, status and reason, row by row: a local pool into sqlite, or two Dask workers on a real
    scheduler into a real PostgreSQL server (one writer), agree. The workers grade students whose rows cover
    the class's statuses but the timeout (DASK_STUDENTS; all of them again took 11 minutes on a 2-core machine)."""
    import sqlalchemy as sa

    address, _ = dask_cluster
    engine = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as db:
        db.execute(sa.text("create database dask_run"))
    engine.dispose()
    url = postgres_url.replace("/gradebook?", "/dask_run?")
    local_out, _, _ = graded_sample_class
    local_rows = [r for r in csv_rows(local_out / "grades.csv") if r["student"] in DASK_STUDENTS]
    assert {r["status"] for r in local_rows} == {r["status"] for r in csv_rows(local_out / "grades.csv")} - {"timeout"}
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    for handed_in in (ROOT / "autograder" / "sample_class" / "submissions").iterdir():
        if handed_in.name.removesuffix(".zip") in DASK_STUDENTS:  # copies: grading follows no link
            copy = shutil.copytree if handed_in.is_dir() else shutil.copy
            copy(handed_in, submissions / handed_in.name)
    out = tmp_path / "out"
    prepared_like(local_out, out)  # the same hidden cases: the workers get the secret with the course
    grade(submissions, out, db=url, scheduler=address, **FAST)
    assert _without_retry_notes(csv_rows(out / "grades.csv")) == _without_retry_notes(local_rows)
    # nbgrader's own export of the gradebook agrees too, and the feedback pages are there
    by_student = lambda rows: sorted(rows, key=lambda r: r["student_id"])  # noqa: E731
    assert by_student(csv_rows(out / "nbgrader_grades.csv")) == by_student(
        r for r in csv_rows(local_out / "nbgrader_grades.csv") if r["student_id"] in DASK_STUDENTS)
    local_pages = sorted(p.relative_to(local_out) for p in (local_out / "feedback").rglob("*.html")
                         if p.relative_to(local_out / "feedback").parts[0] in DASK_STUDENTS)
    assert sorted(p.relative_to(out) for p in (out / "feedback").rglob("*.html")) == local_pages
    for page in local_pages:  # made by the workers, from the same grades: the same points, cell by cell
        points = [re.findall(r"Score:\s*[\d.]+\s*/\s*[\d.]+", _visible_text(o / page)) for o in (out, local_out)]
        assert points[0] == points[1] and points[0], page


@needs_bwrap
def test_a_worker_killed_mid_grading_loses_nothing(dask_cluster, tmp_path):
    from distributed import Client

    address, procs = dask_cluster
    course = tiny_course.build(tmp_path / "tiny")
    expected = _tiny_class(course, tmp_path / "subs")
    # a loop that sleeps: interrupted at the cell's limit, then graded again on its worker under the solution's
    # limits (timeouts.py), and out of time there too
    _hand_in(tmp_path / "subs" / "loops" / "hw1", course, "hw1", "squares",
             {"squares": "import time\nwhile True:\n    time.sleep(0.05)"})
    expected["loops", "hw1", "squares"] = (0.0, "timeout")
    expected["loops", "hw2", "words"] = (0.0, "missing")
    for n in range(4):  # more students, so that both workers are busy for a while
        for student, assignment, notebook in [k for k in expected if k[0] == "good"]:
            shutil.copytree(tmp_path / "subs" / student / assignment, tmp_path / "subs" / f"more{n}" / assignment,
                            dirs_exist_ok=True)
            expected[f"more{n}", assignment, notebook] = expected[student, assignment, notebook]
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "autograder", "grade", str(tmp_path / "subs"), "--course", str(course),
           "--output", str(out), "--scheduler", address, "--no-progress", "--cell-timeout", "5", "--timeout", "30"]
    grading = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with Client(address, timeout="30s") as client:
        victim = next(a for a, w in client.scheduler_info()["workers"].items() if w["name"] == "w1")
        deadline = time.monotonic() + 120
        while not client.processing().get(victim) and time.monotonic() < deadline:
            time.sleep(0.05)
        busy_with = client.processing().get(victim)
        assert busy_with, "worker w1 never got a task"
        time.sleep(1.0)  # well into grading it: the kernel is running
        os.killpg(procs["w1"].pid, signal.SIGKILL)
        procs["w1"].wait()
    printed, _ = grading.communicate(timeout=300)
    assert grading.returncode == 0, printed
    assert _scores(out / "grades.csv") == expected, printed
    assert all(r["status"] != "error" for r in csv_rows(out / "grades.csv"))
    # the loop ran out of its 5 s twice on its worker: graded again there (its autograde, as the worker timed it)
    assert json.loads((out / "state" / "loops" / "hw1" / ".timing.json").read_text())["autograde"] >= 2 * 5
    # re-running on the cluster is idempotent: nothing is graded again
    before = {p: p.stat().st_mtime_ns for p in out.glob("state/*/*/done.sha256")}
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stdout + again.stderr
    assert {p: p.stat().st_mtime_ns for p in out.glob("state/*/*/done.sha256")} == before
    assert _scores(out / "grades.csv") == expected


# ----------------------------------------------------------------------------- the instructor's cycle, end to end

def _student(home: Path, exchange: Path):
    """A student's own home and environment, configured for the course's exchange as a hub would (the
    tests run as one OS user, so the student id is configured rather than taken from the account)."""
    home.mkdir(parents=True)
    (home / "nbgrader_config.py").write_text("\n".join([
        "c = get_config()  # noqa: F821", f"c.Exchange.root = {str(exchange)!r}",
        f"c.CourseDirectory.course_id = {tiny_course.COURSE_ID!r}", f"c.CourseDirectory.student_id = {home.name!r}"]))
    return {**os.environ, "HOME": str(home)}


def _visible_text(html: Path) -> str:
    return re.sub(r"<[^>]+>", "", html.read_text())


@needs_bwrap
def test_release_fetch_submit_collect_grade_feedback_export(tmp_path):
    """The whole cycle through nbgrader's exchange, with two students in their own homes: release, fetch,
    submit, collect, autograde (this autograder), a written answer graded by hand, feedback regenerated
    and released, fetched by the students, final grades exported."""
    from nbgrader.api import Gradebook

    from autograder.__main__ import main

    exchange = tmp_path / "exchange"
    exchange.mkdir()
    exchange.chmod(0o777)
    course = tiny_course.build(tmp_path / "instructor" / "tiny", exchange)
    for assignment in ("hw1", "hw2"):
        tiny_course.nbgrader(course, "release_assignment", assignment, "--force")
    alice, bob = (_student(tmp_path / "homes" / name, exchange) for name in ("alice", "bob"))
    work = {"alice": (alice, ("hw1", "hw2"), tiny_course.ANSWERS, "range(0) has nothing in it."),
            "bob": (bob, ("hw1",), {"squares": "def squares(n):\n    return [i * 2 for i in range(n)]"}, None)}
    for env, assignments, answers, written in work.values():
        home = Path(env["HOME"])
        for assignment in assignments:
            tiny_course.nbgrader(home, "fetch_assignment", assignment, env=env)
            for path in (home / assignment).glob("*.ipynb"):
                nbformat.write(tiny_course.answer(path, answers, written), path)
            tiny_course.nbgrader(home, "submit", assignment, env=env)

    # bob puts a link to the instructor's source beside his submission in the exchange: collected, it would be
    # the solutions' copy, read as the instructor
    [inbound] = (exchange / tiny_course.COURSE_ID / "inbound").glob("bob+hw1+*")
    (inbound / "stolen.ipynb").symlink_to(course / "source" / "hw1" / "squares.ipynb")
    # and mallory's whole submission is a link to the source folder
    (inbound.parent / inbound.name.replace("bob+", "mallory+")).symlink_to(course / "source" / "hw1")
    # and someone hands bob's answers in as alice's, stamped in the future to outrank her every later submission
    forged = inbound.parent / "alice+hw1+2099-01-01 00:00:00.000000 UTC+forged"
    shutil.copytree(inbound, forged, ignore=shutil.ignore_patterns("stolen.ipynb"))
    # a folder whose name nbgrader cannot parse, and one holding a named pipe: each costs its own folder alone
    (inbound.parent / "carol+hw1+not a date").mkdir()
    pipe = inbound.parent / inbound.name.replace("bob+", "dave+")
    pipe.mkdir()
    os.mkfifo(pipe / "squares.ipynb")
    assert main(["collect", "--course", str(course)]) == 0
    assert not (course / "submitted" / "bob" / "hw1" / "stolen.ipynb").exists(), "a link in the inbound was followed"
    assert not (course / "submitted" / "mallory" / "hw1").exists(), "a submission that is a link was followed"
    for left_out in ("mallory", "dave", "carol"):  # the empty folders nbgrader's collect made for them
        shutil.rmtree(course / "submitted" / left_out, ignore_errors=True)
    assert sorted(p.name for p in (course / "submitted").iterdir()) == ["alice", "bob"]
    out = tmp_path / "out"
    assert main(["grade", str(course / "submitted"), "--course", str(course), "--output", str(out), "--no-progress",
                 "--cell-timeout", "10", "--timeout", "30"]) == 0
    assert _scores(out / "grades.csv") == {
        ("alice", "hw1", "squares"): (2.0, "graded"), ("alice", "hw2", "words"): (3.0, "graded"),
        ("bob", "hw1", "squares"): (0.0, "graded"), ("bob", "hw2", "words"): (0.0, "missing")}

    # the written answer, graded by hand as formgrader does it: through nbgrader's gradebook
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}", tiny_course.COURSE_ID) as gb:
        gb.find_grade("why_empty", "squares", "hw1", "alice").manual_score = 1.0
        gb.db.commit()

    assert main(["feedback", "--output", str(out), "--release"]) == 0
    for env, assignments, _, _ in work.values():
        home = Path(env["HOME"])
        for assignment in assignments:
            tiny_course.nbgrader(home, "fetch_feedback", assignment, env=env)
    [page] = (Path(alice["HOME"]) / "hw1" / "feedback").glob("*/squares.html")
    seen = _visible_text(page)
    assert "range(0) has nothing in it." in seen, "alice's own written answer"
    assert re.search(r"Score:\s*3(\.0)?\s*/\s*3", seen), "2 autograded points and 1 given by hand"
    assert "squares(6)" not in seen and "range(0) is empty" not in seen, "no hidden test, no mark scheme"
    [bobs] = (Path(bob["HOME"]) / "hw1" / "feedback").glob("*/squares.html")
    assert re.search(r"Score:\s*0(\.0)?\s*/\s*3", _visible_text(bobs))
    assert not (Path(bob["HOME"]) / "hw2").exists()

    assert main(["export", "--output", str(out)]) == 0
    with open(out / "lms_grades.csv", newline="") as f:
        header, possible, *rows = list(csv.reader(f))
    table = {row[2]: dict(zip(header, row, strict=True)) for row in rows}
    assert header[5:] == ["hw1/squares autograded", "hw1/squares by hand", "hw1 total",
                          "hw2/words autograded", "hw2/words by hand", "hw2 total"]
    assert possible[5:] == ["2", "1", "3", "3", "0", "3"]
    assert [table["alice"][h] for h in header[5:]] == ["2", "1", "3", "3", "0", "3"]
    assert [table["bob"][h] for h in header[5:]] == ["0", "0", "0", "0", "0", "0"]


# ----------------------------------------------------------------------------- the package, installed

@needs_bwrap
def test_the_installed_package_grades_a_course_outside_any_checkout(tmp_path):
    """Built as a wheel and installed into an environment of its own (its dependencies taken from this
    one's site-packages), run from a folder that is no checkout: it grades a course given by path."""
    import sysconfig

    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                          "-w", str(tmp_path / "wheel"), str(ROOT)], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    [wheel] = (tmp_path / "wheel").glob("alibi_course-*.whl")
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = env / Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
                   check=True)
    python = str(env / "bin" / "python")
    # the dependencies' programs (alembic) and data files (nbconvert's templates) are in this environment
    shell = {**os.environ, "PATH": f"{env / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
                                   f"{os.environ.get('PATH', '')}", "JUPYTER_PATH": f"{sys.prefix}/share/jupyter"}
    probe = "import autograder, alibi_ref; print(autograder.__file__, alibi_ref.__file__)"
    where = subprocess.run([python, "-c", probe], cwd=tmp_path, env=shell, capture_output=True, text=True,
                           check=True).stdout.split()
    assert all(Path(p).is_relative_to(site) for p in where), where

    course = tiny_course.build(tmp_path / "tiny")
    _hand_in(tmp_path / "subs" / "good" / "hw2", course, "hw2", "words", tiny_course.ANSWERS)
    cmd = [python, "-m", "autograder", "grade", str(tmp_path / "subs"), "--output", str(tmp_path / "out"),
           "--no-progress", "--cell-timeout", "10", "--timeout", "30"]
    no_course = subprocess.run(cmd, cwd=tmp_path, env=shell, capture_output=True, text=True, check=False)
    assert no_course.returncode == 2 and "pass --course" in no_course.stderr, no_course.stderr
    graded = subprocess.run([*cmd, "--course", str(course), "--assignment", "hw2"], cwd=tmp_path, env=shell,
                            capture_output=True, text=True, check=False)
    assert graded.returncode == 0, graded.stdout + graded.stderr
    assert _scores(tmp_path / "out" / "grades.csv") == {("good", "hw2", "words"): (3.0, "graded")}
