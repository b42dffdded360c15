"""Drivers started at the same instant on one lease: run as a module, one process each.

``python -m tests.support.lease_race URI AT HOLD`` waits until unix time AT, takes the lease
at URI (exit 3 and "refused" if another driver has it), prints its owner id, holds
it for HOLD seconds and releases it. `race` starts several and collects outcomes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from service.config import Settings
from service.errors import LeaseHeldError
from service.lake.lease import DriverLease
from service.lake.lease_store import lease_store
from tests.support.repo import REPO


def race(
    uri: str, drivers: int, start_in: float, hold: float, env: dict[str, str]
) -> list[tuple[str, int]]:
    """(stdout, exit code) of ``drivers`` processes taking ``uri`` at the same instant."""
    at = time.time() + start_in  # every process imported and waiting by then
    started = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.lease_race", uri, str(at), str(hold)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        for _ in range(drivers)
    ]
    return [(p.communicate(timeout=120)[0].strip(), p.returncode) for p in started]


def main(uri: str, at: float, hold: float) -> int:
    lease = DriverLease(lease_store(Settings(), uri), ttl_seconds=3, renew_seconds=0.2)
    time.sleep(max(0.0, at - time.time()))
    try:
        lease.acquire(poll_seconds=0.05)
    except LeaseHeldError:
        print("refused", flush=True)
        return 3
    lease.start_renewing()
    print(lease.record.owner, flush=True)
    time.sleep(hold)
    lease.release()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3])))
