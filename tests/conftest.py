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
