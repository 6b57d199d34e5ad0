import os

import numpy as np
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


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


# the sample class is graded once per test session: by the autograder tests and the browser test
FAST = {"cell_timeout": 10, "timeout": 30, "workers": 2, "progress": False}


@pytest.fixture(scope="session")
def graded_sample_class(tmp_path_factory):
    """(output folder, report, seconds) of grading autograder/sample_class with the autograder."""
    import time
    from pathlib import Path

    from autograder.grade import grade

    out = tmp_path_factory.mktemp("grading")
    started = time.monotonic()
    report = grade(Path(__file__).resolve().parents[1] / "autograder" / "sample_class" / "submissions", out, **FAST)
    return out, report, time.monotonic() - started
