"""pytest set-up: the package from this source tree, one CPU thread each for
torch and libflashopt (ctest runs test files in parallel)."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _flashopt_threads():
    import flashopt
    flashopt.set_cpu_threads(1)
    yield


def pytest_sessionfinish(session, exitstatus):
    # A run that collected nothing is a failure, not pytest's "no tests" (5).
    if session.testscollected == 0:
        session.exitstatus = 1
