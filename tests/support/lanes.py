"""`make test`'s three lanes under ``pytest -n 3`` (the scheduler is in tests/conftest.py).

Two cores run three lanes because one of them mostly waits. The faults lane holds the
tests that spend most of their time waiting out a wall-clock fault (MinIO down for 30 s
and 3 min, a broker stopped and killed, a transaction left open until the broker aborts
it, a full local disk, the dev servers killed and restarted), so it uses little CPU
beside the other two; it also takes the lost offsets' refusal and the upgrade test,
which fill it to the others' length. The second lane holds the longest stories of one
driver at a time (the contracts', the kill -9 at every commit phase, gold's windows and
restarts, the standalone cluster) and the Kafka security tests; the main lane runs every
other test one after another in collection order. Balanced on the per-file times of a
fresh-clone run (pytest's durations summed per lane): the three sums within about two
minutes of each other.
"""

LANES = {
    "faults": (
        "tests/integration/test_storage_outage.py",
        "tests/integration/test_transactions.py",
        "tests/integration/test_broker_restart.py",
        "tests/integration/test_observability.py",
        "tests/integration/test_local_dir_full.py",
        "tests/integration/test_devstack.py",
        # Not fault tests: stories of their own, here because the lane has the room.
        "tests/integration/test_lost_offsets.py",
        "tests/integration/test_upgrade.py",
    ),
    "second": (
        "tests/integration/test_contracts.py",
        "tests/integration/test_reconciliation.py",
        "tests/integration/test_gold.py",
        "tests/integration/test_cluster.py",
        "tests/integration/test_kafka_security.py",
    ),
}


def lane_of(nodeid: str) -> str:
    """The lane of the test ``nodeid``: "faults", "second" or "main"."""
    path = nodeid.split("::")[0]
    return next((lane for lane, paths in LANES.items() if path in paths), "main")
