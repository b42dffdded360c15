"""`make test`'s two lanes under ``pytest -n 2`` (the scheduler is in tests/conftest.py).

The second lane holds the tests that spend most of their time waiting out a wall-clock
fault (MinIO down for 30 s and 3 min; a transaction left open until the broker aborts
it), and beside them the longest stories of one driver at a time (the contracts', the
kill -9 at every commit phase, gold's windows and restarts, the lost offsets' refusal),
so that the two lanes end about together (docs/performance.md has the measured times).
The main lane runs every other test one after another in collection order.
"""

SECOND_LANE = (
    "tests/integration/test_storage_outage.py",
    "tests/integration/test_transactions.py",
    "tests/integration/test_contracts.py",
    "tests/integration/test_reconciliation.py",
    "tests/integration/test_gold.py",
    "tests/integration/test_lost_offsets.py",
)


def lane_of(nodeid: str) -> str:
    """The lane of the test ``nodeid``: "second" or "main"."""
    return "second" if nodeid.split("::")[0] in SECOND_LANE else "main"
