import os, resource, time
import pytest

def _cpu():
    s = resource.getrusage(resource.RUSAGE_SELF); c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    s0, c0 = _cpu(); t0 = time.monotonic()
    yield
    s1, c1 = _cpu()
    with open(f"/tmp/plug/cpu-{os.environ.get('PYTEST_XDIST_WORKER','main')}.tsv", "a") as f:
        f.write(f"{item.nodeid}\t{s1-s0:.2f}\t{c1-c0:.2f}\t{time.monotonic()-t0:.2f}\n")
