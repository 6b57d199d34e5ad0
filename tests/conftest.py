import os

# Two pytest workers share the machine's cores: each, and every kernel, script and grader it starts, runs one
# thread, as the grader's own workers do (autograder/sandbox.py). Oversubscribed, torch's threads spin while they
# wait for a core, and a notebook that needs 20 s of CPU alone used 70 beside the other worker.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # after the thread count, which numpy and torch read as they load
import pytest
import torch
from hypothesis import HealthCheck, settings

# Timing on a shared 2-core machine varies; correctness, not speed, is checked here.
settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True, max_examples=60)
settings.load_profile("ci" if os.environ.get("CI") else "default")

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[
        pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU on this machine"),
    ]),
]


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """Each torch test runs once per device that exists; CUDA is skipped, never faked, without a GPU."""
    return torch.device(request.param)


def csv_rows(path) -> list[dict]:
    """The rows of a CSV the grader wrote (grades.csv, expected.csv, nbgrader's export), as dicts."""
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _sandbox_problem():
    from autograder.sandbox import bwrap_problem

    return bwrap_problem()


# the tests that grade in bubblewrap's sandbox: skipped, saying why, where it cannot run
needs_bwrap = pytest.mark.skipif(_sandbox_problem() is not None, reason=f"no sandbox here: {_sandbox_problem()}")


@pytest.fixture
def without_fused_kernel(monkeypatch):
    """``impl="auto"`` as where the fused CPU kernel is not built (ALIBI_REF_FUSED=0, alibi_ref.fused): for the
    tests of the other CPU paths' own rules, which "auto" follows there (and for float16, and bfloat16 with a
    gradient, everywhere)."""
    monkeypatch.setenv("ALIBI_REF_FUSED", "0")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


# the sample class is graded once per test session: by the autograder tests and the browser test.
# 20 s a cell and 45 s a notebook: notebook 08 takes about 18 s unloaded, its backward's check 9 s (the hidden case
# at N = 32768); where a busy machine pushes an honest notebook past them, it is graded again under limits scaled
# to the solution's time then (timeouts.py), which costs more than the limits' slack, and the loops of ivy and jay
# cost two runs of these limits (ivy of the cell's, jay of the notebook's), not of longer ones
FAST = {"cell_timeout": 20, "timeout": 45, "workers": 2, "progress": False}


# the order test files start in under pytest-xdist's loadfile, as collected (the Makefile's --no-loadscope-reorder;
# xdist would otherwise start the files with the most tests first): each worker takes the next file in this order
# whenever it has two or fewer tests left. The sample class first, graded while the other worker runs long files that
# need no grading; the course-scale file, whose last tests read the graded class, a few files later, so that it
# reaches them after the class is graded (a test that reaches the class sooner waits for it); the rest longest
# first, the browser (which reads the class too) late.
LONGEST_FIRST = ("test_sample_class.py", "test_fused_paths.py", "test_bench.py", "test_course_scale.py", "test_hub.py",
                 "test_autograder.py", "test_notebooks.py", "test_jax.py", "test_padding.py", "test_extrapolation.py",
                 "test_checks.py", "test_browser.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    # within a file, the tests that read the graded sample class last: a worker that reached one before the class
    # was graded would wait for it idle, where the file's other tests could run
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)),
                                 "graded_sample_class" in getattr(item, "fixturenames", ())))


@pytest.fixture(scope="session")
def graded_sample_class(tmp_path_factory):
    """(output folder, report, seconds) of grading autograder/sample_class with the autograder, once per test
    session: under pytest-xdist the first worker to ask grades it, into the session's shared folder, and the
    others wait for it and read its report (xdist's own recipe for a session fixture that runs once)."""
    import pickle
    import time
    from pathlib import Path

    from filelock import FileLock

    from autograder.grade import grade

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's folder, above each worker's own
    out, made = shared / "graded-sample-class", shared / "graded-sample-class.pickle"
    with FileLock(str(shared / "graded-sample-class.lock")):
        if not made.exists():
            started = time.monotonic()
            report = grade(Path(__file__).resolve().parents[1] / "autograder" / "sample_class" / "submissions", out,
                           **FAST)
            made.write_bytes(pickle.dumps((report, time.monotonic() - started)))
        report, seconds = pickle.loads(made.read_bytes())
    return out, report, seconds


def prepared_like(graded, out) -> None:
    """Start ``out`` with what the grader prepared in ``graded`` from the same course: its secret, so that the same
    hidden cases are drawn, and the reference's values and the kernels' views made with it (prepare.py rebuilds
    them only when what they are built from changed): 15 s of CPU that another grading of the course need not pay."""
    import shutil

    (out / "state").mkdir(parents=True)
    shutil.copy(graded / "state" / "hidden-cases.key", out / "state" / "hidden-cases.key")
    for made in ("expected", "views"):  # with the fingerprints they were made under (their .key files)
        shutil.copytree(graded / "state" / made, out / "state" / made)


@pytest.fixture(scope="session")
def postgres_url():
    """A real PostgreSQL server for the session, on a unix socket in a temporary folder; its SQLAlchemy URL.

    Debian's server binaries, ``initdb`` into the folder, run as the unprivileged ``postgres`` user
    when the tests run as root (PostgreSQL refuses root). Skipped, with the reason, where there are none.
    """
    import glob
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    initdb = found[-1] if found else shutil.which("initdb")
    if initdb is None:
        pytest.skip("no PostgreSQL server binaries (Debian: apt-get install postgresql)")
    pytest.importorskip("psycopg2", reason="psycopg2 is the gradebook's PostgreSQL driver")
    bin_dir = os.path.dirname(initdb)
    # in /tmp itself: the postgres user cannot enter pytest's own (root-only) temporary folders
    folder = Path(tempfile.mkdtemp(prefix="alibi-postgres-"))
    as_user = []
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server as")
        shutil.chown(folder, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = folder / "data", "54329"
    subprocess.run([*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "postgres"], check=True,
                   capture_output=True)
    subprocess.run([*as_user, f"{bin_dir}/pg_ctl", "-D", str(data), "-l", str(folder / "server.log"), "-w",
                    "-o", f"-k {folder} -c listen_addresses='' -p {port}", "start"], check=True, capture_output=True)
    try:
        subprocess.run([*as_user, f"{bin_dir}/createdb", "-h", str(folder), "-p", port, "gradebook"], check=True)
        yield f"postgresql+psycopg2://postgres@/gradebook?host={folder}&port={port}"
    finally:
        subprocess.run([*as_user, f"{bin_dir}/pg_ctl", "-D", str(data), "-m", "fast", "stop"], check=False,
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
