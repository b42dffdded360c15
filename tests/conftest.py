"""Suite-wide set-up: pin the process time zone, so timestamps collected from Spark are
UTC, and run the suite in two lanes under ``pytest -n 2`` (`make test`).
"""

import os
import time

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

os.environ["TZ"] = "UTC"
time.tzset()

# Tests that spend most of their time waiting out a wall-clock fault (MinIO down for
# 30 s and 3 min; a transaction left open until the broker aborts it) with one slow
# driver: they run in a lane of their own, beside the main lane, which runs every other
# test one after another in collection order.
WAITING_LANE = (
    "tests/integration/test_storage_outage.py",
    "tests/integration/test_transactions.py",
)


def lane_of(nodeid: str) -> str:
    """The lane of the test ``nodeid``: "waiting" or "main"."""
    return "waiting" if nodeid.split("::")[0] in WAITING_LANE else "main"


class _TwoLanes(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's scope scheduling with two scopes, so each worker takes one lane.

    Not ``--dist loadgroup`` with ``xdist_group`` marks: xdist 3.8.0 groups by renaming
    the nodes through ``Item._nodeid``, which pytest 9.2 no longer reads (tried: it
    spread the tests over both workers).
    """

    def _split_scope(self, nodeid: str) -> str:
        return lane_of(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> _TwoLanes:
    """The scheduler of ``pytest -n 2``: the two lanes above."""
    return _TwoLanes(config, log)
