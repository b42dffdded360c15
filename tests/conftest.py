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
# 30 s and 3 min) with one slow driver: they run in a lane of their own, beside the
# main lane, which runs every other test one after another in collection order.
_WAITING_LANE = ("tests/integration/test_storage_outage.py",)


class _TwoLanes(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's scope scheduling with two scopes, so each worker takes one lane."""

    def _split_scope(self, nodeid: str) -> str:
        return "waiting" if nodeid.split("::")[0] in _WAITING_LANE else "main"


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> _TwoLanes:
    """The scheduler of ``pytest -n 2``: the two lanes above."""
    return _TwoLanes(config, log)
