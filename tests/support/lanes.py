"""`make test`'s three lanes under ``pytest -n 3`` (the scheduler is in tests/conftest.py).

Two cores run three lanes because one of them mostly waits. The faults lane holds the
tests that spend most of their time waiting out a wall-clock fault (MinIO down for 30 s
and 3 min, a broker stopped and killed, a transaction left open until the broker aborts
it, a full local disk, the dev servers killed and restarted), so it uses little CPU
beside the other two. The second lane holds the longest stories of one driver at a time
(the contracts', the kill -9 at every commit phase, gold's windows and restarts, the lost
offsets' refusal, the standalone cluster); the main lane runs every other test one after
another in collection order. The three end within about three minutes of each other
(docs/performance.md has the measured times).
"""

LANES = {
    "faults": (
        "tests/integration/test_storage_outage.py",
        "tests/integration/test_transactions.py",
        "tests/integration/test_broker_restart.py",
        "tests/integration/test_observability.py",
        "tests/integration/test_local_dir_full.py",
        "tests/integration/test_devstack.py",
    ),
    "second": (
        "tests/integration/test_contracts.py",
        "tests/integration/test_reconciliation.py",
        "tests/integration/test_gold.py",
        "tests/integration/test_lost_offsets.py",
        "tests/integration/test_cluster.py",
    ),
}


def lane_of(nodeid: str) -> str:
    """The lane of the test ``nodeid``: "faults", "second" or "main"."""
    path = nodeid.split("::")[0]
    return next((lane for lane, paths in LANES.items() if path in paths), "main")
