"""The autograder's parts: sandbox, screen, collection, resume, load (the sample class graded: test_sample_class.py)."""

import ast
import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import nbformat
import pytest
import tiny_course
from conftest import FAST, csv_rows, needs_bwrap

from alibi_ref.course import grading
from autograder.cgroup import SandboxCgroup
from autograder.collect import collect
from autograder.grade import grade
from autograder.sandbox import (
    SandboxedKernelManager,
    SandboxPolicy,
    new_scratch,
    sandbox_user,
    sweep_scratch,
)
from autograder.screen import screen_notebook
from autograder.zygote import Zygote

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "autograder" / "sample_class"
SOLUTIONS = ROOT / "solutions" / "alibi"
RELEASE = ROOT / "course" / "alibi"
NOTEBOOKS = sorted(p.stem for p in RELEASE.glob("*.ipynb"))




# ----------------------------------------------------------------------------- resume after an interruption

@needs_bwrap
def test_an_interrupted_run_resumes_without_regrading(tmp_path):
    course = tiny_course.build(tmp_path / "tiny", assignments=("hw2",))
    subs = tmp_path / "subs"
    for student in ("s1", "s2", "s3", "s4"):
        (subs / student).mkdir(parents=True)
        nbformat.write(tiny_course.answer(course / "release" / "hw2" / "words.ipynb", tiny_course.ANSWERS),
                       subs / student / "words.ipynb")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "autograder", "grade", str(subs), "--output", str(out), "--course", str(course),
           "--workers", "1", "--no-progress", "--db", f"sqlite:///{tmp_path / 'elsewhere.db'}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(out.glob("state/*/hw2/done.sha256")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, 9)  # the instructor's laptop dies
    proc.wait()
    done = {p.parent.parent.name: p.stat().st_mtime_ns for p in out.glob("state/*/hw2/done.sha256")}
    assert 1 <= len(done) < 4, f"expected an interrupted run, found {len(done)} students done"
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    for student, mtime in done.items():
        done_file = out / "state" / student / "hw2" / "done.sha256"
        assert done_file.stat().st_mtime_ns == mtime, f"{student} was graded again"
    assert (tmp_path / "elsewhere.db").exists() and not (out / "gradebook.db").exists(), "--db was not used"
    rows = csv_rows(out / "grades.csv")
    graded = {r["student"]: r for r in rows if r["notebook"] == "words"}
    assert {s: (float(r["score"]), r["status"]) for s, r in graded.items()} == {
        s: (3.0, "graded") for s in ("s1", "s2", "s3", "s4")}


# ----------------------------------------------------------------------------- the sandbox itself

@contextlib.asynccontextmanager
async def _sandboxed_kernel(policy: SandboxPolicy, scratch: Path, zygote=None):
    """(kernel manager, client) of a kernel started as the grader starts one, ready; shut down after."""
    km = SandboxedKernelManager(policy=policy, scratch=scratch, zygote=zygote)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        yield km, kc
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)


async def _run_in_sandbox(code: str, policy: SandboxPolicy, scratch: Path, zygote=None) -> str:
    async with _sandboxed_kernel(policy, scratch, zygote) as (_, kc):
        msg_id = kc.execute(code)
        printed = []
        while True:
            msg = await kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                printed.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                printed.append(f"ERROR {msg['content']['ename']}: {msg['content']['evalue']}")
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return "".join(printed)


@needs_bwrap
@pytest.mark.parametrize("forked", [False, True], ids=["own-sandbox", "forked-from-zygote"])
def test_a_sandboxed_kernel_sees_nothing_it_should_not(tmp_path, forked):
    secret_dir = tmp_path / "course"
    secret_dir.mkdir()
    (secret_dir / "hidden_tests.txt").write_text("the answer is 42")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    # the view a notebook with no helper sees, and the cases of one hidden check, drawn with a secret
    grading.write_view(tmp_path / "view")
    secret = os.urandom(32)
    grading.write_cases(tmp_path / "cases.json", [("paper_slopes", 7)], secret)
    policy = SandboxPolicy(memory_bytes=2 * 2**30, tmp_bytes=32 * 2**20, file_bytes=64 * 2**20, processes=64,
                           view=str(tmp_path / "view"), cases=str(tmp_path / "cases.json"),
                           env=((grading.GRADING_ENV, SandboxPolicy.cases_path),))
    zygote = Zygote(policy, ["numpy"]) if forked else None
    scratch = zygote.scratch() if forked else new_scratch("kernel")
    code = f"""
import os, socket, subprocess
def fill(path, mib):  # tmpfs is memory RLIMIT_AS does not count; the scratch folder is the grader's disk
    try:
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(bytes(2**20))
    finally:
        if os.path.exists(path):
            os.remove(path)
def attempt(name, fn):
    try:
        fn()
        print(name, "ALLOWED")
    except Exception as err:
        print(name, "refused", type(err).__name__)
attempt("read", lambda: open({str(secret_dir / 'hidden_tests.txt')!r}).read())
attempt("write", lambda: open("/var/tmp/alibi-planted-{os.getpid()}.txt", "w").write("x"))
attempt("elsewhere", lambda: open({str(outside / 'planted.txt')!r}, "w").write("x"))
attempt("repo", lambda: open({str(ROOT / 'solutions' / 'alibi' / '01_slopes_and_bias.ipynb')!r}).read())
attempt("network", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2))
attempt("memory", lambda: bytearray(4 * 2**30))
attempt("shadow", lambda: open("/etc/shadow").read())
attempt("fill tmp", lambda: fill("/tmp/big", 40))
attempt("fill shm", lambda: fill("/dev/shm/big", 40))
attempt("fill dev", lambda: fill("/dev/big", 1))
attempt("fill scratch", lambda: fill("big", 80))
attempt("small files", lambda: [fill(f, 16) for f in ("/tmp/small", "/dev/shm/small", "small")])
# what root could do inside bwrap's namespaces: remount a read-only bind writable, and write through it
attempt("remount", lambda: subprocess.run(["mount", "-o", "remount,rw,bind", {str(ROOT / 'alibi_ref')!r}],
                                          check=True, capture_output=True))
attempt("write package", lambda: open({str(ROOT / 'alibi_ref' / 'planted.pth')!r}, "w").write("import os"))
# the package is the view: the checks and the example, no reference, no exercises; the cases, and no secret
attempt("import reference", lambda: __import__("alibi_ref.attention"))
attempt("import exercises", lambda: __import__("alibi_ref.course.exercises"))
attempt("from alibi_ref import get_slopes", lambda: __import__("alibi_ref").get_slopes)
from alibi_ref.course.checks import run
print("hidden check ran", len(run("paper_slopes", lambda n, max_bias=8.0: [0.0] * n, 7)["results"]))
print("cases at", os.environ[{grading.GRADING_ENV!r}], os.path.getsize(os.environ[{grading.GRADING_ENV!r}]) > 0)
print("environment", open("/proc/self/environ").read().replace(chr(0), " "))
print("capabilities", open("/proc/self/status").read().split("CapEff:")[1].split()[0])
print("uid", os.getuid())
attempt("parent's descriptors", lambda: os.listdir(f"/proc/{{os.getppid()}}/fd"))
def many(n):
    started = []
    try:
        for _ in range(n):
            started.append(subprocess.Popen(["sleep", "60"]))
    finally:
        for p in started:
            p.kill()
            p.wait()
attempt("100 processes", lambda: many(100))
# a user namespace of its own (where the kernel's code for them is reachable), by the syscall and by unshare(1)
attempt("user namespace", lambda: subprocess.run(
    ["python3", "-c", "import ctypes, sys; sys.exit(ctypes.CDLL(None).unshare(0x10000000) != 0)"], check=True))
attempt("unshare --user", lambda: subprocess.run(["unshare", "--user", "true"], check=True, capture_output=True))
home = {os.path.expanduser("~")!r}
print("home holds", sorted(os.listdir(home)) if os.path.isdir(home) else [])
open("scratch_ok.txt", "w").write("fine")
print("scratch written")
subprocess.Popen(["sleep", "1234"], start_new_session=True)
print("spawned")
"""
    try:
        printed = asyncio.run(_run_in_sandbox(code, policy, scratch, zygote))
    finally:
        if zygote is not None:  # the student's last notebook is done: the sandbox ends, and what it started
            zygote.close()
    listener.close()
    for what in ("read", "write", "elsewhere", "repo", "network", "memory", "shadow", "fill tmp", "fill shm",
                 "fill dev", "fill scratch", "remount", "write package", "100 processes", "import reference",
                 "import exercises", "from alibi_ref import get_slopes", "user namespace", "unshare --user"):
        assert f"{what} refused" in printed, f"{what}: {printed}"
    assert "capabilities 0000000000000000" in printed, printed
    assert "hidden check ran 22" in printed and f"cases at {SandboxPolicy.cases_path} True" in printed, printed
    assert secret.hex() not in printed and (tmp_path / "cases.json").read_text().count(secret.hex()) == 0
    if forked:  # the zygote, whose pipes command it, is not the kernel's to trace or look into
        assert "parent's descriptors refused" in printed, printed
    if os.geteuid() == 0:  # a user of the sandbox's own, not root
        assert int(printed.split("uid ")[1].split()[0]) not in (0, 65534) or not sandbox_user(), printed
    assert not (ROOT / "alibi_ref" / "planted.pth").exists()
    assert "small files ALLOWED" in printed, printed
    assert "scratch written" in printed and "spawned" in printed
    # only the folders on the way to the Python installation, if it lives there, nothing else of $HOME
    home_line = next(line for line in printed.splitlines() if line.startswith("home holds"))
    home = Path(os.path.expanduser("~"))
    base = Path(sys.base_prefix)
    allowed = {base.relative_to(home).parts[0]} if base.is_relative_to(home) else set()
    assert set(ast.literal_eval(home_line.removeprefix("home holds "))) <= allowed, home_line
    assert not (outside / "planted.txt").exists()
    assert not Path(f"/var/tmp/alibi-planted-{os.getpid()}.txt").exists()
    time.sleep(0.5)
    leftovers = subprocess.run(["pgrep", "-f", "sleep 1234"], capture_output=True, text=True, check=False)
    assert leftovers.stdout.strip() == "", "a process started by the kernel outlived it"


async def _dies_after(code: str, policy: SandboxPolicy, scratch: Path, zygote) -> bool:
    """Run ``code``; whether the kernel is dead within 20 s (as the grader's kernel manager sees it)."""
    async with _sandboxed_kernel(policy, scratch, zygote) as (km, kc):
        kc.execute(code)
        deadline = time.monotonic() + 20
        while await km.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return not await km.is_alive()


def test_the_memory_meter_sees_what_the_sandboxs_processes_allocate_whatever_they_say():
    """How far a cgroup's memory rose, read from outside: 200 MiB touched by a child process (which no tracemalloc
    in the parent sees) count; the meter started after them sees only what came since."""
    cgroup = SandboxCgroup.create(2**30, 16)
    if cgroup is None:
        pytest.skip("this process may make no cgroup")
    held = subprocess.Popen([*cgroup.join_prefix(), sys.executable, "-c",
                             "import os, sys\nsys.stdin.readline()\nblock = bytearray(os.urandom(1)) * (200 * 2**20)\n"
                             "print('held', flush=True)\nsys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        meter = cgroup.memory_meter()
        if meter is None:
            pytest.skip("this machine's cgroup cannot restart its memory peak (cgroup v2 before Linux 6.12)")
        held.stdin.write("allocate\n")
        held.stdin.flush()
        assert held.stdout.readline().strip() == "held"
        rise = meter.rise()
        assert 200 * 2**20 <= rise < 400 * 2**20, rise / 2**20
        assert cgroup.memory_meter().rise() < 16 * 2**20, "what is held already is not a rise"
    finally:
        held.kill()
        held.wait()
        cgroup.close()


@needs_bwrap
def test_kernels_forked_from_a_zygote_share_nothing_and_survive_its_death(tmp_path):
    """Each notebook's kernel is a fresh fork: what one notebook changes (a module, builtins, files in its
    folder) the next does not see; a notebook that kills the zygote crashes itself only, and the next
    notebook gets a new zygote."""
    from autograder.zygote import close_zygote, zygote_for

    policy = SandboxPolicy(memory_bytes=2 * 2**30)
    key = ("student", "hw")
    try:
        first = zygote_for(key, policy, ["numpy"])
        scratch = first.scratch()
        printed = asyncio.run(_run_in_sandbox(
            "import numpy, builtins, os\nnumpy.leak = 1\nbuiltins.leak = 2\nopen('mine.txt', 'w').write('x')\n"
            "print('pid', os.getpid(), 'numpy' in __import__('sys').modules)", policy, scratch, first))
        assert "True" in printed, "numpy came preloaded"
        printed = asyncio.run(_run_in_sandbox(
            "import numpy, builtins, os\nprint(hasattr(numpy, 'leak'), hasattr(builtins, 'leak'), "
            "os.path.exists('mine.txt'))", policy, first.scratch(), first))
        assert printed.split() == ["False", "False", "False"], printed
        assert zygote_for(key, policy, ["numpy"]) is first, "one zygote per student's job"
        assert asyncio.run(_dies_after("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", policy,
                                       first.scratch(), first)), "the kernel died with its zygote"
        assert not first.alive
        second = zygote_for(key, policy, ["numpy"])
        assert second is not first and second.alive
        assert "3" in asyncio.run(_run_in_sandbox("print(1 + 2)", policy, second.scratch(), second))
    finally:
        close_zygote(key)
        first.close()
    assert not first.root.exists() and not second.root.exists(), "the students' scratch folders are removed"


def _processes_mentioning(text: str) -> list[str]:
    """The command lines of this machine's processes that contain ``text``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        if text in line:
            found.append(line)
    return found


@needs_bwrap
def test_jax_compilations_are_cached_from_the_instructors_notebooks_and_lent_privately(tmp_path):
    """The notebook that imports JAX fills the cache (the one that does not is not run); a kernel
    forked for a student starts with a copy, so it compiles only what the cache lacks, and what it adds
    stays in its own folder."""
    from autograder import compile_cache
    from autograder.zygote import close_zygote, zygote_for

    source = tmp_path / "source"
    source.mkdir()
    program = "import jax.numpy as jnp\nx = jnp.ones((5, 3))\nprint(float(jnp.tanh(x @ x.T).sum()))\n"
    count = "import os\nprint('entries', len(os.listdir(os.environ['JAX_COMPILATION_CACHE_DIR'])))"
    for name, code in (("uses_jax", program), ("plain", "open('ran.txt', 'w')")):
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)]), source / f"{name}.ipynb")
    assert [compile_cache.uses_jax(source / f"{n}.ipynb") for n in ("uses_jax", "plain")] == [True, False]
    policy = SandboxPolicy(memory_bytes=2 * 2**30)
    cache = tmp_path / "cache"
    filled = compile_cache.fill(source, cache, lambda path: policy, cell_timeout=60)
    assert filled > 0 and filled == len(list(cache.iterdir()))
    assert not _processes_mentioning("autograder-compile-cache-"), "the kernels that filled the cache have ended"
    before = sorted(p.name for p in cache.iterdir())
    key = ("student", "hw")
    try:
        zygote = zygote_for(key, policy, ["numpy"])
        for code, new_programs in ((program, False), (program + "print(float(jnp.exp(x).sum()))\n", True)):
            scratch = zygote.scratch()
            compile_cache.lend(cache, scratch)
            printed = asyncio.run(_run_in_sandbox(code + count, policy, scratch, zygote))
            assert (int(printed.split("entries")[1]) > filled) == new_programs, printed
    finally:
        close_zygote(key)
    assert sorted(p.name for p in cache.iterdir()) == before, "a kernel's additions stay in its own folder"
    empty = tmp_path / "no_jax"
    empty.mkdir()
    shutil.copy(source / "plain.ipynb", empty)
    assert compile_cache.fill(empty, tmp_path / "cache2", lambda path: policy, cell_timeout=60) == 0
    assert not (tmp_path / "cache2").exists()


# ----------------------------------------------------------------------------- static screening

def test_the_solutions_are_not_flagged():
    for path in SOLUTIONS.glob("*.ipynb"):
        assert screen_notebook(nbformat.read(path, as_version=4)) == [], path.name


def test_validate_fails_what_the_screen_flags_as_grading_does(tmp_path):
    """A student's Validate (nbgrader validate in the course folder, as JupyterLab's button runs it) fails
    the test cells the screen flags, with the reason grading gives; an honest notebook still succeeds."""
    ada = nbformat.read(SAMPLE / "submissions" / "ada" / "alibi" / "02_worked_example.ipynb", as_version=4)
    nbformat.write(ada, tmp_path / "honest.ipynb")
    softmax = next(c for c in ada.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    softmax.source = "import sys\n\nfrom alibi_ref.course.exercises import softmax as theirs\n" + softmax.source
    nbformat.write(ada, tmp_path / "flagged.ipynb")
    # a module beside the notebook that it imports is read as grading reads it (a cell of the student's own)
    ada = nbformat.read(tmp_path / "honest.ipynb", as_version=4)
    ada.cells.insert(1, nbformat.v4.new_code_cell("import tools"))
    nbformat.write(ada, tmp_path / "module.ipynb")
    (tmp_path / "tools.py").write_text("import sys\n\nfrom alibi_ref import get_slopes\n")
    # and a package's files, as grading hands them over
    ada.cells[1].source = "import tools_pkg"
    nbformat.write(ada, tmp_path / "package.ipynb")
    (tmp_path / "tools_pkg").mkdir()
    (tmp_path / "tools_pkg" / "__init__.py").write_text("from .inner import *\n")
    (tmp_path / "tools_pkg" / "inner.py").write_text("import sys\n\nfrom alibi_ref import get_slopes\n")
    # one that grading would not hand over (over 1 MiB) is not read, and Validate says what grading will do
    ada.cells[1].source = "import big_tools"
    nbformat.write(ada, tmp_path / "big.ipynb")
    reaching = "def never_called():\n    from alibi_ref import get_slopes\n"
    (tmp_path / "big_tools.py").write_text(reaching + "#" * 2**20 + "\n")
    said = {}
    for name in ("honest", "flagged", "module", "package", "big"):
        run = subprocess.run([sys.executable, "-m", "nbgrader", "validate", str(tmp_path / f"{name}.ipynb")],
                             cwd=ROOT / "course", capture_output=True, text=True, check=False)
        said[name] = run.stdout + run.stderr
    assert "Success! Your notebook passes all the tests." in said["honest"], said["honest"]
    def reasons(said: str) -> str:
        """Validate's report with each reason's wrapped lines joined again (it cuts a line at 87 characters)."""
        return re.sub(r"\n +(?=\S)(?!The error was|The following)", " ", said)

    assert reasons(said["flagged"]).count(
        "Flagged: no points for this exercise: cell 'softmax', line 3: imports alibi_ref.course.exercises.softmax from "
        "the reference module; this notebook asks you to write it yourself (a graded kernel does not have it)") == 1
    assert "Success" not in said["flagged"]
    assert reasons(said["module"]).count(
        "Flagged: no points for this exercise: cell 'a module you handed in (tools.py)', line 3") == 4, said["module"]
    assert reasons(said["package"]).count("Flagged: no points for this exercise: cell 'a module you handed in "
                                          "(tools_pkg/inner.py)', line 3") == 4, said["package"]
    assert "Success" not in said["big"] and "Flagged" not in said["big"], said["big"]
    not_handed_over = ("NotHandedOver: when graded, this notebook imports big_tools.py, handed in beside it, which "
                       "grading does not hand over: larger than 1 MiB")
    assert reasons(said["big"]).count(not_handed_over) == 4, said["big"]
    assert "..." not in said["big"]  # the whole reason shown


# ----------------------------------------------------------------------------- collecting submissions

def test_collect_reads_folders_zips_and_nbgrader_layout(tmp_path):
    ids = {"02_worked_example": RELEASE / "02_worked_example.ipynb"}
    good = (SAMPLE / "submissions" / "ada" / "alibi" / "02_worked_example.ipynb").read_bytes()
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "02_worked_example.ipynb").write_bytes(good)
    (tmp_path / "layout" / "alibi").mkdir(parents=True)
    (tmp_path / "layout" / "alibi" / "02_worked_example.ipynb").write_bytes(good)
    with zipfile.ZipFile(tmp_path / "zipped.zip", "w") as z:
        z.writestr("some/folder/02_worked_example.ipynb", good)
    (tmp_path / "bad.zip").write_bytes(b"not a zip")
    (tmp_path / "bad name!").mkdir()
    (tmp_path / "truncated").mkdir()
    (tmp_path / "truncated" / "02_worked_example.ipynb").write_bytes(good[:500])
    found = {s.student: s for s in collect(tmp_path, ids)}
    for student in ("flat", "layout", "zipped"):
        assert "02_worked_example" in found[student].notebooks, student
    assert found["bad"].problems["02_worked_example"][0] == "unreadable"
    assert found["bad name!"].problems["02_worked_example"][0] == "invalid"
    assert found["truncated"].problems["02_worked_example"][0] == "unreadable"


def test_foreign_grading_cells_lose_their_metadata(tmp_path):
    nb = nbformat.read(SAMPLE / "submissions" / "pat" / "alibi" / "02_worked_example.ipynb", as_version=4)
    (tmp_path / "pat").mkdir()
    nbformat.write(nb, tmp_path / "pat" / "02_worked_example.ipynb")
    (submission,) = collect(tmp_path, {"02_worked_example": RELEASE / "02_worked_example.ipynb"})
    cleaned = nbformat.reads(submission.notebooks["02_worked_example"].decode(), as_version=4)
    assert all(c.metadata.get("nbgrader", {}).get("grade_id") != "bonus" for c in cleaned.cells)
    assert "bonus" in submission.notes["02_worked_example"]


def test_a_pasted_copy_of_an_answer_cell_left_as_released_does_not_replace_the_answer(tmp_path):
    """Copy and paste keeps a cell's metadata: the answer written into the first copy, the second, left as
    released, ran after it and replaced it (4 of 7 before). A second copy of a test cell stays, ungraded."""
    import copy

    from make_sample_class import cell, filled

    name = "01_slopes_and_bias"
    release = nbformat.read(RELEASE / f"{name}.ipynb", as_version=4)
    nb = filled(name)
    answer = cell(nb, "paper_slopes")
    nb.cells.insert(nb.cells.index(answer) + 1, copy.deepcopy(cell(release, "paper_slopes")))
    nb.cells.append(copy.deepcopy(cell(nb, "test_alibi_bias")))
    cleaned, note = _collected(tmp_path, nb, name)
    assert cell(cleaned, "paper_slopes").source == answer.source
    assert cell(release, "paper_slopes").source not in [c.source for c in cleaned.cells]
    assert _grade_ids(cleaned).count("test_alibi_bias") == 1
    assert [c.source for c in cleaned.cells].count(cell(nb, "test_alibi_bias").source) == 2
    assert "graded the first of two cells with the grading metadata of paper_slopes, test_alibi_bias" in note
    assert "left out 1 copies of answer cells as released" in note


def test_a_student_handed_in_twice_is_graded_once_from_the_newest_and_a_lone_notebook_is_a_student(tmp_path):
    """A zip beside its unpacked folder, or a re-upload: graded twice before, two jobs raced for one student's
    gradebook rows and grades.csv had the student twice. A notebook alone in the submissions folder is the
    student it is named for; its grade ids say which notebook of the assignment it is."""
    from make_sample_class import cell, filled

    names = ["01_slopes_and_bias", "03_slope_zero"]
    old, new = filled(names[1]), filled(names[1])
    new.cells.append(nbformat.v4.new_markdown_cell("handed in last"))
    (tmp_path / "bob").mkdir()
    nbformat.write(old, tmp_path / "bob" / f"{names[1]}.ipynb")
    os.utime(tmp_path / "bob" / f"{names[1]}.ipynb", (1.7e9, 1.7e9))
    with zipfile.ZipFile(tmp_path / "bob.zip", "w") as archive:
        archive.writestr(zipfile.ZipInfo(f"bob/{names[1]}.ipynb", date_time=(2026, 11, 1, 0, 0, 0)),
                         nbformat.writes(new))
    nbformat.write(filled(names[0]), tmp_path / "cal.ipynb")
    (tmp_path / "README.txt").write_text("the class's hand-ins, unpacked")
    found = collect(tmp_path, {name: RELEASE / f"{name}.ipynb" for name in names})
    assert [s.student for s in found] == ["bob", "cal"]
    bob, cal = found
    assert "handed in last" in bob.notebooks[names[1]].decode()
    assert bob.notes[names[1]] == "handed in 2 times: graded bob.zip, the newest, not bob/"
    assert sorted(cal.notebooks) == [names[0]] and cal.notes[names[0]] == f"graded cal.ipynb as {names[0]}.ipynb"
    cleaned = nbformat.reads(cal.notebooks[names[0]].decode(), as_version=4)
    assert cell(cleaned, "paper_slopes").source == cell(filled(names[0]), "paper_slopes").source


def test_notebooks_handed_in_under_another_name_are_found(tmp_path):
    """Downloads and copies rename notebooks ("name (1)", "Copy of name", an LMS's prefix and "-1"): before,
    such a notebook was "missing", 0 points. Found by the grade ids it holds, or where it lost them, by name."""
    from make_sample_class import filled

    names = ["01_slopes_and_bias", "02_worked_example", "03_slope_zero", "04_causal"]
    folder = tmp_path / "ann"
    folder.mkdir()
    nbformat.write(filled(names[0]), folder / f"{names[0]} (1).ipynb")
    nbformat.write(filled(names[1]), folder / "Copy of my work.ipynb")  # by its grade ids alone
    stripped = filled(names[3])
    for c in stripped.cells:
        c.metadata.pop("nbgrader", None)
    nbformat.write(stripped, folder / f"doe_ann_1234_{names[3]}-1.ipynb")  # by its name alone
    exact, copy = filled(names[2]), filled(names[2])
    exact.cells.append(nbformat.v4.new_markdown_cell("the one handed in under its name"))
    nbformat.write(exact, folder / f"{names[2]}.ipynb")
    nbformat.write(copy, folder / f"{names[2]}-Copy1.ipynb")
    nbformat.write(filled(names[1]), folder / "scratch.ipynb")  # 02 again: taken once only
    (submission,) = collect(tmp_path, {name: RELEASE / f"{name}.ipynb" for name in names})
    assert sorted(submission.notebooks) == names
    assert submission.notes[names[0]].startswith(f"graded {names[0]} (1).ipynb as {names[0]}.ipynb")
    assert submission.notes[names[3]].startswith(f"graded doe_ann_1234_{names[3]}-1.ipynb as {names[3]}.ipynb")
    assert "the one handed in under its name" in submission.notebooks[names[2]].decode()
    assert names[2] not in submission.notes
    assert "Copy of my work.ipynb" in submission.notes[names[1]] or "scratch.ipynb" in submission.notes[names[1]]
    # a notebook that is none of them is named where one is missing, for the instructor to look at
    nbformat.write(nbformat.v4.new_notebook(), folder / "homework.ipynb")
    (submission,) = collect(tmp_path, {name: RELEASE / f"{name}.ipynb" for name in [*names, "05_schedules"]})
    unused = submission.notes["05_schedules"].removeprefix("handed in, and taken for none of the assignment's "
                                                           "notebooks: ").split(", ")
    assert {"03_slope_zero-Copy1.ipynb", "homework.ipynb"} < set(unused) and len(unused) == 3  # and a copy of 02


def test_a_notebook_too_large_for_grading_loses_its_outputs_not_its_points(tmp_path, monkeypatch):
    """Outputs are run again when grading: past the size that reaches nbgrader they are cleared first (before, a
    notebook over 20 MiB, a printing loop's or many plots', was unreadable: 0 points). The limits are lowered
    here to 1 and 4 MiB to keep the files small; the code reads them at each call."""
    from make_sample_class import cell, filled

    import autograder.collect as collect_module

    monkeypatch.setattr(collect_module, "MAX_NOTEBOOK_BYTES", 2**20)
    monkeypatch.setattr(collect_module, "MAX_READ_BYTES", 4 * 2**20)
    name = "02_worked_example"
    printed = filled(name)  # 2 MiB printed by the answer cell, and widget state saved
    cell(printed, "alibi_head").outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 2**21)]
    printed.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    written = filled(name)  # 2 MiB in a written answer: the student's own text, which is not cleared
    cell(written, "sat_answer").source = "y" * 2**21
    huge = filled(name)  # past what is read at all
    cell(huge, "alibi_head").outputs = [nbformat.v4.new_output("stream", name="stdout", text="z" * 5 * 2**20)]
    for student, nb in (("printed", printed), ("written", written), ("huge", huge)):
        (tmp_path / student).mkdir()
        nbformat.write(nb, tmp_path / student / f"{name}.ipynb")
    found = {s.student: s for s in collect(tmp_path, {name: RELEASE / f"{name}.ipynb"})}
    graded = nbformat.reads(found["printed"].notebooks[name].decode(), as_version=4)
    assert cell(graded, "alibi_head").source == cell(printed, "alibi_head").source
    assert not any(c.get("outputs") for c in graded.cells) and "widgets" not in graded.metadata
    assert found["printed"].notes[name].startswith("cleared its outputs first (2 MiB in all")
    assert found["written"].problems[name] == ("unreadable", "larger than 1 MiB without its outputs")
    assert found["huge"].problems[name] == ("unreadable", "larger than 4 MiB (5 MiB)")


def test_a_notebook_saved_on_windows_is_read_in_its_encoding(tmp_path):
    """Notepad and PowerShell save a notebook with a byte-order mark, as UTF-16 or in the Windows code page;
    Jupyter and nbgrader read none of them (before: unreadable, 0 points). The answers are graded as written,
    found under another name too, and the row says how the file was read."""
    from make_sample_class import cell, filled

    names = ["01_slopes_and_bias", "02_worked_example", "03_slope_zero"]
    nbs = {name: filled(name) for name in names}
    cell(nbs[names[1]], "sat_answer").source = "Sat looks at \u201ccat\u201d most: caf\u00e9 math, 1/2 \u00b7 2"
    folder = tmp_path / "win"
    folder.mkdir()
    for name, encoding in zip(names, ["utf-8-sig", "cp1252", "utf-16"], strict=True):
        text = nbformat.writes(nbs[name]).replace("\n", "\r\n")
        (folder / f"{'Copy of ' if encoding == 'utf-16' else ''}{name}.ipynb").write_bytes(text.encode(encoding))
    (folder / "junk.ipynb").write_bytes(bytes(range(256)) * 4)  # not a notebook in any encoding
    (submission,) = collect(tmp_path, {name: RELEASE / f"{name}.ipynb" for name in [*names, "04_causal"]})
    assert sorted(submission.notebooks) == names
    for name in names:
        graded = nbformat.reads(submission.notebooks[name].decode("utf-8"), as_version=4)
        for c in nbs[name].cells:
            if c.metadata.get("nbgrader", {}).get("solution"):
                assert cell(graded, c.metadata.nbgrader.grade_id).source == c.source, (name, c.source[:40])
    assert submission.notes[names[0]] == "read as UTF-8 with a byte-order mark"
    assert submission.notes[names[1]] == "read in the Windows code page (cp1252): it was not UTF-8"
    assert "read as UTF-16" in submission.notes[names[2]] and "graded Copy of 03_slope_zero.ipynb" in (
        submission.notes[names[2]])
    assert "junk.ipynb" in submission.notes["04_causal"]


def test_python_modules_beside_the_notebooks_are_handed_in_with_them(tmp_path):
    """nbgrader hands the files beside a notebook to it when grading; a notebook importing a module of the
    student's lost every exercise that used it (ModuleNotFoundError). Only modules Python can import by a name
    of their own, beside one of the assignment's notebooks, up to a size each."""
    from make_sample_class import filled

    import autograder.collect as collect_module

    name = "03_slope_zero"
    folder = tmp_path / "ann" / "alibi"
    folder.mkdir(parents=True)
    importing = filled(name)  # what it imports and grading cannot hand it is named in its row
    importing.cells.insert(1, nbformat.v4.new_code_cell("import helpers\nimport json\nimport huge\nimport tqdm\n"
                                                        "%run huge-script.py\nimport loose.parts\nimport numpy"))
    nbformat.write(importing, folder / f"{name}.ipynb")
    for module in ("helpers.py", "my_rows2.py", "hw1-script.py", "bad name.py", "__init__.py", "json.py", "tqdm.py",
                   # a package (a folder with __init__.py) goes whole, subpackages too; what no import reaches not
                   "mylib/__init__.py", "mylib/core.py", "mylib/sub/deep.py", "mylib/.ipynb_checkpoints/core.py",
                   "mylib/hw1-x.py", "loose/parts.py", "numpy/__init__.py", "not-a-name/x.py"):
        (folder / module).parent.mkdir(parents=True, exist_ok=True)
        (folder / module).write_text(f"# {module}\n")
    for huge in ("huge.py", "huge-script.py"):
        (folder / huge).write_text("x = 1\n" * (collect_module.MAX_MODULE_BYTES // 6 + 1))
    (tmp_path / "ann" / "elsewhere.py").write_text("# not beside a notebook\n")
    with zipfile.ZipFile(tmp_path / "bob.zip", "w") as archive:
        archive.writestr(f"bob/{name}.ipynb", nbformat.writes(filled(name)))
        archive.writestr("bob/helpers.py", "# bob's\n")
        archive.writestr("bob/lib/deeper.py", "# in another folder\n")  # no package: no __init__.py
        archive.writestr("bob/pkg/__init__.py", "")
        archive.writestr("bob/pkg/a.py", "# a\n")
        archive.writestr("__MACOSX/bob/._helpers.py", "\x00\x05")
    ann, bob = collect(tmp_path, {name: RELEASE / f"{name}.ipynb"})
    assert sorted(ann.files) == ["student_modules/helpers.py", "student_modules/hw1-script.py",  # %run reaches it
                                 "student_modules/my_rows2.py", "student_modules/mylib/__init__.py",
                                 "student_modules/mylib/core.py", "student_modules/mylib/sub/deep.py"]
    assert ann.files["student_modules/helpers.py"] == b"# helpers.py\n"
    assert ann.files["student_modules/mylib/sub/deep.py"] == b"# mylib/sub/deep.py\n"
    assert ann.notes[name].split("; ") == [
        "imports huge.py, handed in beside it, which grading does not hand over: larger than 1 MiB",
        "runs huge-script.py, handed in beside it, which grading does not hand over: larger than 1 MiB",
        "imports json.py, handed in beside it, which grading does not hand over: the standard library has a "
        "module of that name, which the notebook gets instead when graded: rename it",
        "imports loose/, handed in beside it, which grading does not hand over: it has no __init__.py: with an "
        "empty one, grading hands the folder over as a package",
        "imports numpy/, handed in beside it, which grading does not hand over: an installed package has a "
        "module of that name, which the notebook gets instead when graded: rename it",
        "imports tqdm.py, handed in beside it, which grading does not hand over: an installed package has a "
        "module of that name, which the notebook gets instead when graded: rename it"]
    assert bob.files == {"student_modules/helpers.py": b"# bob's\n", "student_modules/pkg/__init__.py": b"",
                         "student_modules/pkg/a.py": b"# a\n"} and name not in bob.notes


@pytest.mark.parametrize("packed", ["folder", "zip"])
def test_a_checkpoint_is_graded_only_where_its_notebook_was_not_handed_in(tmp_path, packed):
    """Jupyter keeps each notebook's last explicit save in .ipynb_checkpoints/. Folders skipped it and zips took
    it as any other notebook, so one hand-in was graded two ways. Now both take the notebook where it was
    handed in, under its name or another, and its checkpoint only where it was not (the row says so), with the
    modules of the folder the notebook ran in, above .ipynb_checkpoints/."""
    from make_sample_class import filled

    name = "02_worked_example"

    def marked(which, drop_a_test=False):
        nb = filled(name)
        nb.cells.insert(1, nbformat.v4.new_code_cell(f"import helpers  # {which}"))
        if drop_a_test:  # a notebook holding fewer of the assignment's grade ids than its checkpoint
            nb.cells.remove(next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")))
        return nbformat.writes(nb).encode()

    checkpoint = f"alibi/.ipynb_checkpoints/{name}-checkpoint.ipynb"
    hand_ins = {
        "ann": {checkpoint: marked("checkpoint"), "alibi/helpers.py": b"# ann's\n"},
        "bob": {checkpoint: marked("checkpoint"), f"alibi/{name}.ipynb": marked("notebook")},
        "cy": {checkpoint: marked("checkpoint"), f"alibi/{name} (1).ipynb": marked("renamed", drop_a_test=True)},
    }
    for student, files in hand_ins.items():
        if packed == "zip":
            with zipfile.ZipFile(tmp_path / f"{student}.zip", "w") as archive:
                for path, data in files.items():
                    archive.writestr(f"{student}/{path}", data)
        else:
            for path, data in files.items():
                (tmp_path / student / path).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / student / path).write_bytes(data)
    ann, bob, cy = collect(tmp_path, {n: RELEASE / f"{n}.ipynb" for n in ("01_slopes_and_bias", name)}, "alibi")

    def taken(submission):
        return nbformat.reads(submission.notebooks[name].decode(), as_version=4).cells[1].source.split("# ")[-1]

    assert (taken(ann), taken(bob), taken(cy)) == ("checkpoint", "notebook", "renamed")
    assert ann.notes[name].startswith(f"graded {name}-checkpoint.ipynb as {name}.ipynb (Jupyter's last checkpoint")
    assert ann.files == {"student_modules/helpers.py": b"# ann's\n"}, "the modules beside the notebook it saves"
    assert "checkpoint" not in bob.notes.get(name, "") and cy.notes[name].startswith(f"graded {name} (1).ipynb")
    # a checkpoint left beside its notebook is not listed as a notebook taken for none of the assignment's
    assert all("01_slopes_and_bias" not in s.notes for s in (ann, bob, cy))


def _collected(tmp_path, nb, name="02_worked_example"):
    """``nb`` handed in by one student and read by ``collect``: the notebook it grades, and the note."""
    folder = tmp_path / "student"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.ipynb").write_text(json.dumps(nb))  # as saved: pasted cells repeat their ids
    (submission,) = collect(tmp_path, {name: RELEASE / f"{name}.ipynb"})
    return nbformat.reads(submission.notebooks[name].decode(), as_version=4), submission.notes.get(name, "")


def _grade_ids(nb):
    return [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]


def test_cells_that_lost_their_grading_metadata_get_it_back_cell_for_cell(tmp_path):
    """An editor that drops cell metadata (or cells pasted into a new notebook) left plain cells: before, the
    test cells were put back at the top, above the answers, and a right notebook earned 0."""
    from make_sample_class import filled

    whole = filled("02_worked_example")
    stripped = filled("02_worked_example")
    for c in stripped.cells:
        c.metadata.pop("nbgrader", None)
    # and a cell of the student's own in between, which is nobody's answer
    stripped.cells.insert(5, nbformat.v4.new_code_cell("print(Q.shape)"))
    whole.cells.insert(5, nbformat.v4.new_code_cell("print(Q.shape)"))
    cleaned, note = _collected(tmp_path, stripped)
    assert _grade_ids(cleaned) == _grade_ids(whole)
    assert [c.source for c in cleaned.cells] == [c.source for c in whole.cells], "a cell was added or moved"
    assert "put back" not in note and "gave back the grading metadata" in note


def test_an_answer_beside_its_answer_cell_is_graded_and_a_stub_is_never_put_back(tmp_path):
    from make_sample_class import cell, filled

    release = nbformat.read(RELEASE / "02_worked_example.ipynb", as_version=4)
    nb = filled("02_worked_example")
    answer = cell(nb, "alibi_head").source
    # alibi_head: a helper cell and the answer in new cells above the answer cell, left as released
    cell(nb, "alibi_head").source = cell(release, "alibi_head").source
    at = nb.cells.index(cell(nb, "alibi_head"))
    nb.cells[at:at] = [nbformat.v4.new_code_cell(answer), nbformat.v4.new_code_cell("def helper():\n    pass")]
    # multi_head: the answer cell deleted, nothing written in its place; softmax: a helper in its place
    nb.cells.remove(cell(nb, "multi_head"))
    helper = cell(nb, "softmax")
    helper.metadata.pop("nbgrader")
    helper.source = "def not_softmax(x):\n    return x"
    # the written answer below its answer cell, left as released, and the question pasted again (not an answer,
    # though longer)
    written = cell(nb, "sat_answer")
    text, written.source = written.source, cell(release, "sat_answer").source
    question = nb.cells[nb.cells.index(written) - 1].source
    assert len(question) > len(text)
    at = nb.cells.index(written) + 1
    nb.cells[at:at] = [nbformat.v4.new_markdown_cell(question), nbformat.v4.new_markdown_cell(text)]
    cleaned, note = _collected(tmp_path, nb)
    assert cell(cleaned, "alibi_head").source == answer, "the answer above the stub is the answer cell"
    assert cell(release, "alibi_head").source not in [c.source for c in cleaned.cells], "the stub is gone"
    assert cell(cleaned, "sat_answer").source == text
    ids = _grade_ids(cleaned)
    assert "multi_head" not in ids and "softmax" not in ids, "a stub was put back, or a helper taken for an answer"
    assert ids.count("test_multi_head") == ids.count("test_softmax") == 1
    assert "graded the answer written beside its answer cell, which was left as released: sat_answer, alibi_head" \
        in note


def _executed(cells, **settings):
    """``cells`` (code, or a nbformat cell) run by the grader's execution step without a zygote: the
    executed notebook and its resources, which carry the outcome."""
    from nbformat.v4 import new_code_cell, new_notebook

    from autograder.execute import SandboxedExecute

    nb = new_notebook(cells=[new_code_cell(c) if isinstance(c, str) else c for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return SandboxedExecute(fork_kernels=False, **settings).preprocess(nb, {"metadata": {"path": "."}})


@needs_bwrap
def test_a_cell_that_prints_without_end_is_cut_as_it_prints_and_keeps_its_errors_and_check_values():
    """Output past a cell's budget is left out as it arrives, with a note (a loop printing until its time
    limit grew the grading process by about 150 MB a second before); an error, a stream of stderr (which
    fails an nbgrader test cell) and the values a check hands back are never lost that way."""
    from nbformat.v4 import new_markdown_cell

    from alibi_ref.course.wire import MIME
    from autograder.execute import SandboxedExecute

    cells = {
        "many prints": "for _ in range(30_000):\n    print('x' * 999)",
        "one long line, then stderr": "import sys\nprint('y' * 5_000_000)\nprint('late', file=sys.stderr)",
        "an error after": "print('z' * 3_000_000)\nraise ValueError('kept')",
        "check values after": f"from IPython.display import display\nprint('w' * 3_000_000)\n"
                              f"display({{{MIME!r}: {{'exercise': 'e', 'pad': 'v' * 3_000_000}}}}, raw=True)",
        "redrawn": "from IPython.display import clear_output\nfor k in range(3):\n    clear_output(wait=True)\n"
                   "    print(str(k) * 1_500_000)",
    }
    nb, _ = _executed([*cells.values(), new_markdown_cell("no outputs")], timeout=60, kept_whole=[MIME])
    outputs = dict(zip(cells, (cell.outputs for cell in nb.cells[:-1]), strict=True))

    def kept(name, stream="stdout"):
        return "".join(o.text for o in outputs[name] if o.output_type == "stream" and o.name == stream)

    limit = SandboxedExecute.output_limit.default_value
    note = "[grading left out 26.6 MiB of this cell's output past its first 2 MiB]\n"
    assert outputs["many prints"][0].text == note, "the note goes first: nbgrader keeps a cell's first 1000 lines"
    assert len(kept("many prints")) == limit + len(note) and kept("many prints")[len(note):].startswith("x" * 999)
    assert "y" * (limit - 1) in kept("one long line, then stderr")
    assert "left out" in kept("one long line, then stderr", "stderr")  # still a stderr output: still fails
    assert [o.evalue for o in outputs["an error after"] if o.output_type == "error"] == ["kept"]
    values = [o.data[MIME] for o in outputs["check values after"] if o.output_type == "display_data"]
    assert len(values) == 1 and len(values[0]["pad"]) == 3_000_000
    assert kept("redrawn") == "2" * 1_500_000 + "\n"  # each redraw starts the budget again


@needs_bwrap
def test_output_that_outlasts_an_interrupted_cell_is_a_timeout_not_a_crash():
    """A loop that printed until interrupted leaves output to read after the cell's reply; where it outlasts
    the wait for it (iopub_timeout 0 here; a loaded Dask worker ran past nbclient's 4 s), the notebook timed
    out at that cell, and says so: before, it was 'the kernel died ... ran out of memory'."""
    nb, resources = _executed(["while True:\n    print('again')", "x = 1"], timeout=2, iopub_timeout=0)
    outcome = resources["autograder_outcome"]
    assert outcome["status"] == "timeout" and outcome["reason"].startswith("cell 0 ran past its time limit"), outcome
    assert [o.ename for o in nb.cells[1].outputs] == ["NotRun"]


@needs_bwrap
def test_exit_with_output_still_coming_ends_the_kernel_after_its_cell_every_time():
    """exit() stopped the kernel 0.1 s after the cell's reply: where its output was still being read, grading
    saw the kernel dead (a crash in that cell, its points lost) or garbled messages (the whole submission
    lost), in 3 of 4 runs here, and a Dask worker graded a sample student differently from the local pool.
    The cell is read to its end, then grading stops; the same outcome each time."""
    cell = "x = 1\nexit()\nfor _ in range(30_000):\n    print('x' * 999)"
    for _ in range(3):
        nb, resources = _executed([cell, "y = 2"], timeout=60)
        assert resources["autograder_outcome"]["reason"] == (
            "the code in cell 0 ended the kernel (exit() or quit()); the cells after it were not run")
        assert nb.cells[0].outputs[0].text.startswith("[grading left out 26.6 MiB"), "its output was cut short"
        assert [o.output_type for o in nb.cells[0].outputs] == ["stream", "stream"], "the cell itself ran"
        assert [o.ename for o in nb.cells[1].outputs] == ["GradingStopped"]
    nb, resources = _executed(["exit(keep_kernel=True)", "y = 2\nprint(y)"])  # as in Jupyter: nothing ends
    assert resources["autograder_outcome"]["status"] == "graded" and nb.cells[1].outputs[0].text == "2\n"


@needs_bwrap
def test_a_kernel_that_stops_itself_mid_output_is_a_crash_not_a_lost_submission():
    """Stopping the kernel by hand still sends garbled frames as it goes (2 of 3 runs here): jupyter_client
    refuses them, and nbgrader would have thrown the student's whole submission away."""
    for _ in range(3):
        nb, resources = _executed(["get_ipython().exit_now = True\nfor _ in range(30_000):\n    print('x' * 999)",
                                   "y = 2", "z = 3"], timeout=60)
        outcome = resources["autograder_outcome"]
        assert outcome["status"] == "crashed", outcome
        assert [o.ename for o in nb.cells[2].outputs] == ["NotRun"]


@pytest.mark.parametrize("writes, limits, reason", [
    ("for n in range(1000):\n    with open(f'part{n}', 'wb') as f:\n        f.write(bytes(2**20))",
     {"disk_limit": 64 * 2**20}, "it wrote more than 64 MiB into its folder"),
    ("os.makedirs('d')\nfor n in range(10**6):\n    open(f'd/{n}', 'w').close()",
     {"disk_files": 50}, "it made more than 50 files and folders in its folder"),
], ids=["bytes", "files"])
def test_a_kernel_that_fills_its_folder_is_stopped_and_told_why(writes, limits, reason):
    """The scratch folder lies on the grader's disk, and files each under the size cap were written
    without end before: the kernel is stopped once its folder holds more than its bounds."""
    nb, resources = _executed(["import os\n" + writes, "x = 1"], timeout=30, **limits)
    assert resources["autograder_outcome"]["reason"] == f"the kernel was stopped in cell 0: {reason}"
    assert [o.ename for o in nb.cells[1].outputs] == ["NotRun"]


def test_without_the_sandbox_it_warns_and_still_grades(tmp_path):
    course = tiny_course.build(tmp_path / "tiny", assignments=("hw2",))
    (tmp_path / "subs" / "solo").mkdir(parents=True)
    nbformat.write(tiny_course.answer(course / "release" / "hw2" / "words.ipynb", tiny_course.ANSWERS),
                   tmp_path / "subs" / "solo" / "words.ipynb")
    with pytest.warns(UserWarning, match="sandbox disabled"):
        report = grade(tmp_path / "subs", tmp_path / "out", course=course, sandbox=False, **FAST)
    rows = {r["notebook"]: r for r in csv_rows(tmp_path / "out" / "grades.csv")}
    assert (float(rows["words"]["score"]), rows["words"]["status"]) == (3.0, "graded")
    assert report.totals()["solo"] == 3.0


def test_scratch_folders_a_killed_grader_left_are_removed_by_the_next_and_only_those(tmp_path, monkeypatch):
    """A grader killed by a signal or the OOM killer cannot clean up: its students' code and outputs stay in
    the temporary folder. The next scratch folder made sweeps them, and nothing else: not a live process's,
    not a name from before the process was written into it, not a link made to look like one."""
    make = "from autograder.sandbox import new_scratch; print(new_scratch('student'))"
    made = subprocess.run([sys.executable, "-c", make], env={**os.environ, "TMPDIR": str(tmp_path)},
                          capture_output=True, text=True, check=True, cwd=ROOT)
    killed = Path(made.stdout.strip())  # its process has ended without removing it
    (killed / "kernel-abc").mkdir()
    (killed / "kernel-abc" / "answers.py").write_text("a student's work")
    reused = tmp_path / f"alibi-student-{os.getpid()}-1-abcdefgh"  # this pid, another start time: a pid reused
    reused.mkdir()
    untagged = tmp_path / "alibi-kernel-2tkwv2b5"  # an older grader's name: no process to ask
    untagged.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "alibi-student-1-1-linklink"  # names a process long gone, but is a link: never followed
    link.symlink_to(elsewhere)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    live = new_scratch("kernel")
    assert live.parent == tmp_path and killed.parent == tmp_path
    assert not killed.exists() and not reused.exists()
    assert live.is_dir() and untagged.is_dir() and elsewhere.is_dir() and link.is_symlink()
    assert sweep_scratch(tmp_path) == [] and live.is_dir()  # this process is alive


def test_the_help_lists_the_commands_in_the_order_an_instructor_runs_them(capsys):
    """``python -m autograder --help`` shows the module docstring's table as it is written, one command a line."""
    from autograder.__main__ import main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    rows = [line.split()[0] for line in shown.splitlines() if line.startswith("    ") and not line.startswith("     ")]
    assert rows[:4] == ["collect", "grade", "feedback", "export"], shown


def test_a_cache_folder_this_user_cannot_make_costs_the_sharing_not_the_grading(tmp_path, monkeypatch):
    """JAX's compilation cache goes to XDG_CACHE_HOME, shared by this user's gradings; where it cannot be made (the
    variable names another user's folder, or a file) each grading keeps its own, in its output folder."""
    from autograder.course import Course
    from autograder.workspace import Settings, compile_cache_dir, machine_compile_cache

    course = Course(source=tmp_path, course_id="c101", assignments=("hw1",))
    s = Settings(output=tmp_path / "out", db_url="sqlite://", workers=1, timeout=1, cell_timeout=1, memory_bytes=1,
                 sandbox=False, course=course)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert compile_cache_dir(s) == machine_compile_cache("c101") == tmp_path / "cache" / "alibi-autograder" / \
        "compile-cache" / "c101"
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-folder"))
    assert compile_cache_dir(s) == tmp_path / "out" / "compile-cache"


def test_grades_for_formgrader_need_a_course_root_and_say_so_before_grading(tmp_path):
    from autograder.grade import NotACourseRoot, grade

    (tmp_path / "course" / "hw1").mkdir(parents=True)
    (tmp_path / "course" / "hw1" / "a.ipynb").write_text("{}")
    (tmp_path / "submissions").mkdir()
    with pytest.raises(NotACourseRoot, match="needs an nbgrader course root"):
        grade(tmp_path / "submissions", tmp_path / "out", course=tmp_path / "course", for_formgrader=True)
    assert not (tmp_path / "out").exists()
