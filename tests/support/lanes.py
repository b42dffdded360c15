"""`make test`'s two lanes under ``pytest -n 2`` (the scheduler is in tests/conftest.py)."""

# Tests that spend most of their time waiting out a wall-clock fault (MinIO down for
# 30 s and 3 min; a transaction left open until the broker aborts it) with one slow
# driver: they run in a lane of their own, beside the main lane, which runs every other
# test one after another in collection order. The contracts' story (one driver at a time,
# mostly JVM starts) fills the waiting lane's idle minutes rather than lengthen the main one.
WAITING_LANE = (
    "tests/integration/test_storage_outage.py",
    "tests/integration/test_transactions.py",
    "tests/integration/test_contracts.py",
)


def lane_of(nodeid: str) -> str:
    """The lane of the test ``nodeid``: "waiting" or "main"."""
    return "waiting" if nodeid.split("::")[0] in WAITING_LANE else "main"
