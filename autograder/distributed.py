"""Grading fanned out over a Dask cluster, with one writer for the gradebook.

    python -m autograder grade SUBMISSIONS --scheduler tcp://HOST:PORT

Each student's assignment is one Dask task that needs one ``sandbox`` resource, so a worker
started with ``dask worker tcp://HOST:PORT --nthreads 1 --resources sandbox=1`` (as many such
workers per machine as it has cores: ``--nworkers N``) never runs more sandboxed kernels than that.
The task carries everything it needs: the course as generated here (source, release and a
gradebook holding only the assignments' structure, packed once, a few hundred kB) and
the student's cleaned notebooks. On the worker it is today's job unchanged: nbgrader's autograde
with the sandboxed Execute step and the verdicts, into a private sqlite gradebook in a temporary
folder. What the instructor's machine computes once per course to make grading faster stays out of
the bundle, which travels with every task: each worker machine fills its own JAX compilation cache
(``compile_cache.py``; XLA compiles for the machine's CPU) once, and each worker process computes
the reference's values for the checks as it first judges them and keeps them. The task returns
the executed, judged notebooks, their outcome files and nbgrader's feedback pages (made from the
same grades, and the instructor's due dates, which the bundle carries).

nbgrader's gradebook is not safe for several writers (its get-or-create calls race), so only
this process writes it: for each result it runs nbgrader's own autograde once more, with the
execution replaced by the worker's outputs (``ReplayExecute``), so ``SaveAutoGrades`` and the
rest of nbgrader's pipeline record the grades as they would locally; the feedback pages it only
writes where nbgrader keeps them.

A worker that dies mid-task loses nothing: the task holds no state outside its temporary folder,
Dask's scheduler gives it to another worker, and the student's row comes from the run that
finished. Workers need only this project installed and bubblewrap; a worker that cannot sandbox
refuses the task instead of running student code bare.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
import tempfile
from dataclasses import replace
from pathlib import Path

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

from .collect import Submission
from .course import CONFIG_FILE

# on the worker, inside its temporary folder
WORK_DB = "course/gradebook.db"


def _course_bundle(s) -> bytes:
    """The course as a worker needs it (tar): source, release, a gradebook of the assignments alone,
    the course's configuration. Built with nbgrader's generate_assignment, as here."""
    from .prepare import copy_root_files
    from .workspace import Settings, hidden_cases_key, nbgrader_api

    with tempfile.TemporaryDirectory(prefix="autograder-bundle-") as tmp:
        work = Path(tmp)
        shutil.copytree(s.output / "course" / "source", work / "course" / "source")
        copy_root_files(s.course, work / "course")
        (work / "state").mkdir()  # the grader's secret for the hidden cases: the workers' kernels draw with it
        shutil.copy(hidden_cases_key(s), work / "state" / "hidden-cases.key")
        if s.course.config_file is not None:
            shutil.copy(s.course.config_file, work / CONFIG_FILE)
        ws: Settings = _worker_settings(s, work)
        for assignment in s.course.assignments:
            if not (s.output / "course" / "release" / assignment).is_dir():
                continue  # it could not be made ready here either (prepare.Prepared.failed): nobody's job needs it
            result = nbgrader_api(ws).generate_assignment(assignment, force=True)
            if not result["success"]:
                raise RuntimeError(f"nbgrader generate_assignment {assignment} failed:\n{result['log']}")
        _copy_due_dates(s, ws)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(work, arcname=".")
        return buffer.getvalue()


def _copy_due_dates(s, ws) -> None:
    """The instructor's due dates (``nbgrader db assignment add --duedate``) into the workers' gradebook,
    so that the late penalties in the feedback the workers make are the gradebook's."""
    from nbgrader.api import Gradebook

    with Gradebook(s.db_url, s.course.course_id) as here, Gradebook(ws.db_url, s.course.course_id) as there:
        for assignment in s.course.assignments:
            due = here.find_assignment(assignment).duedate
            if due is not None:
                there.update_or_create_assignment(assignment, duedate=due)


def _worker_settings(s, work: Path):
    course = replace(s.course, config_file=work / CONFIG_FILE if s.course.config_file is not None else None,
                     source=work / "course" / "source")
    # JAX's compilation cache is the worker machine's own (XLA compiles for its CPU): its default, filled once per
    # machine (grade.machine_compile_cache)
    return replace(s, output=work, db_url=f"sqlite:///{work / WORK_DB}", course=course, workers=1,
                   compile_cache=None)


def grade_on_worker(s, bundle: bytes, student: str, assignment: str, notebooks: dict[str, bytes],
                    files: dict[str, bytes]) -> dict:
    """The Dask task: grade one student's assignment in a private copy of the course; return the
    executed, judged notebooks ({name: bytes}), their outcome files and what nbgrader failed on."""
    from .job import grade_student, write_submitted
    from .prepare import prepare_compile_cache, prepare_kernel_files, tree_hash
    from .sandbox import bwrap_problem
    from .workspace import ensure_tools_on_path

    if s.sandbox and (problem := bwrap_problem()):
        raise RuntimeError(f"this worker cannot sandbox student code ({problem}); it refuses to grade unsandboxed")
    ensure_tools_on_path()
    with tempfile.TemporaryDirectory(prefix="autograder-task-") as tmp:
        work = Path(tmp)
        with tarfile.open(fileobj=io.BytesIO(bundle)) as tar:
            tar.extractall(work, filter="data")
        ws = _worker_settings(s, work)
        # what this machine computes once, not the bundle (it would travel with every task): JAX's compilation
        # cache here; the reference's values this worker process computes as it first judges them
        source_hash = tree_hash(work / "course" / "source" / assignment)
        prepare_kernel_files(ws, assignment, source_hash)  # the cases (the bundle's secret) and the views
        prepare_compile_cache(ws, assignment, source_hash)
        submitted = work / "course" / "submitted" / student / assignment
        submitted.mkdir(parents=True)
        write_submitted(submitted, notebooks, files)
        result = grade_student(ws, student, assignment, sorted(notebooks))
        graded = work / "course" / "autograded" / student / assignment
        feedback = work / "course" / "feedback" / student / assignment
        state = work / "state" / student / assignment
        return {
            "failed": result["failed"],
            "executed": {p.stem: p.read_bytes() for p in graded.glob("*.ipynb")},
            # the pages, and the timestamp and secret nbgrader's release_feedback reads beside them
            "feedback": {p.name: p.read_bytes() for p in feedback.glob("*") if p.is_file()},
            "outcomes": {p.stem: p.read_text() for p in state.glob("*.json") if not p.name.startswith(".")},
            "timing": (state / ".timing.json").read_text() if (state / ".timing.json").exists() else "{}",
        }


def _code_or_kind(cell) -> str:
    return cell.source if cell.cell_type == "code" else cell.cell_type


class ReplayExecute(NbGraderPreprocessor):
    """nbgrader's Execute step, replaced by the outputs a worker computed for the same notebook."""

    replay_dir = Unicode("", help="Where the workers' executed notebooks are: STUDENT/ASSIGNMENT/NOTEBOOK.ipynb"
                         ).tag(config=True)

    def preprocess(self, nb, resources):
        ids = resources["nbgrader"]
        path = Path(self.replay_dir) / ids["student"] / ids["assignment"] / f"{ids['notebook']}.ipynb"
        if not path.exists():
            raise FileNotFoundError(f"no result came back from the worker for {ids['notebook']}")
        executed = nbformat.read(path, as_version=4)
        # code cells to the letter; the worker's markdown was rendered and sanitised after grading (this process's
        # pipeline does the same)
        if [_code_or_kind(c) for c in executed.cells] != [_code_or_kind(c) for c in nb.cells]:
            raise ValueError(f"the worker graded another version of {ids['notebook']} (its cells differ)")
        for cell, done in zip(nb.cells, executed.cells, strict=True):
            if cell.cell_type == "code":
                cell.outputs = done.outputs
                cell.execution_count = done.execution_count
        return nb, resources


def _record(s, sub: Submission, result: dict) -> dict[str, str]:
    """Write one worker's result into this course, through nbgrader's pipeline: the single writer."""
    from .job import grade_student
    from .workspace import state_dir

    replays = s.output / "state" / "replay"
    replay = replays / sub.student / sub.assignment
    shutil.rmtree(replay, ignore_errors=True)
    replay.mkdir(parents=True)
    for name, raw in result["executed"].items():
        (replay / f"{name}.ipynb").write_bytes(raw)
    state = state_dir(s, sub.student, sub.assignment)
    for name, text in result["outcomes"].items():
        (state / f"{name}.json").write_text(text)
    (state / ".timing.json").write_text(result.get("timing", "{}"))
    names = sorted(set(sub.notebooks) - set(result["failed"]))
    recorded = (grade_student(s, sub.student, sub.assignment, names, replay_dir=replays, feedback=False)
                if names else {"failed": {}})
    shutil.rmtree(replay, ignore_errors=True)
    # the workers made the feedback from the same grades: this process only writes the gradebook
    feedback = s.output / "course" / "feedback" / sub.student / sub.assignment
    shutil.rmtree(feedback, ignore_errors=True)
    feedback.mkdir(parents=True)
    for name, raw in result["feedback"].items():
        (feedback / name).write_bytes(raw)
    return {**recorded["failed"], **result["failed"]}


def run_on_cluster(s, todo: list[Submission], scheduler: str, progress: bool) -> dict[tuple[str, str], dict]:
    """Grade ``todo`` on the Dask cluster at ``scheduler``; the same failures dict as the local pool's."""
    import sys

    from distributed import Client, as_completed
    from tqdm import tqdm

    from .job import record_done

    if not todo:
        return {}
    bundle = _course_bundle(s)
    failures: dict = {}
    with Client(scheduler, timeout="30s") as client:
        client.wait_for_workers(1, timeout=120)
        _require_sandbox_slots(client)
        # each task carries the bundle itself: scattered data dies with the worker holding it, a task's arguments
        # do not, so a task can always be run again elsewhere
        jobs = {}
        for sub in todo:
            key = f"grade-{sub.student}-{sub.assignment}-{hashlib.sha256(sub.digest.encode()).hexdigest()[:12]}"
            job = client.submit(grade_on_worker, s, bundle, sub.student, sub.assignment, sub.notebooks,
                                sub.files, resources={"sandbox": 1}, key=key, pure=False)
            jobs[job] = sub
        with tqdm(total=len(todo), desc="grading", unit="student", disable=not progress, file=sys.stderr) as bar:
            for job in as_completed(jobs):
                sub = jobs[job]
                try:
                    failed = _record(s, sub, job.result())
                except Exception as err:  # the task failed everywhere it ran: record it, keep going
                    failed = {"*": f"{type(err).__name__}: {err}"[-500:]}
                record_done(s, sub, failed, failures)
                bar.set_postfix_str(sub.student)
                bar.update()
    return failures


def _require_sandbox_slots(client) -> None:
    workers = client.scheduler_info()["workers"].values()
    if not any(w.get("resources", {}).get("sandbox", 0) >= 1 for w in workers):
        raise RuntimeError("no Dask worker offers the 'sandbox' resource, so no task could start: start workers with "
                           "`dask worker SCHEDULER --nthreads 1 --resources sandbox=1` (docs/deploying.md)")

