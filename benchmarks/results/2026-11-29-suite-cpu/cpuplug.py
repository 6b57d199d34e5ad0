"""A pytest plugin: each test's CPU seconds (its process, and the children it reaped) and wall seconds, one
tab-separated line per test in /tmp/plug/cpu-WORKER.tsv. Loaded with PYTHONPATH=THIS_FOLDER and -p cpuplug."""

import os
import resource
import time

import pytest


def _cpu() -> tuple[float, float]:
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    own0, reaped0 = _cpu()
    started = time.monotonic()
    yield
    own1, reaped1 = _cpu()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    os.makedirs("/tmp/plug", exist_ok=True)
    with open(f"/tmp/plug/cpu-{worker}.tsv", "a") as f:
        f.write(f"{item.nodeid}\t{own1 - own0:.2f}\t{reaped1 - reaped0:.2f}\t{time.monotonic() - started:.2f}\n")
