"""Suite-wide set-up: pin the process time zone, so timestamps collected from Spark are
UTC, and run the suite in two lanes under ``pytest -n 2`` (`make test`).
"""

import os
import time

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

from tests.support.lanes import lane_of

os.environ["TZ"] = "UTC"
time.tzset()


class _TwoLanes(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's scope scheduling with two scopes, so each worker takes one lane.

    Not ``--dist loadgroup`` with ``xdist_group`` marks: xdist 3.8.0 groups by renaming
    the nodes through ``Item._nodeid``, which pytest 9.2 no longer reads (tried: it
    spread the tests over both workers).
    """

    def _split_scope(self, nodeid: str) -> str:
        return lane_of(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> _TwoLanes:
    """The scheduler of ``pytest -n 2``: the two lanes of `tests.support.lanes`."""
    return _TwoLanes(config, log)
