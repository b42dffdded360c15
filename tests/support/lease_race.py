"""Drivers started at the same instant on one lease: run as a module, one process each.

``python -m tests.support.lease_race URI AT HOLD TRIED DRIVERS`` waits until unix time AT,
takes the lease at URI (exit 3 and "refused" if another driver has it, after leaving a
file in the directory TRIED), prints its owner id, holds it until the DRIVERS - 1 others
have tried (a process the machine's load started late still meets a held lease) and
HOLD seconds more, and releases it. `race` starts several and collects outcomes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from service.config import Settings
from service.errors import LeaseHeldError
from service.lake.lease import DriverLease
from service.lake.lease_store import lease_store
from tests.support.repo import REPO

# How long a winner waits for the others to try before it gives up waiting.
_TRIED_TIMEOUT_SECONDS = 120.0


def race(
    uri: str, drivers: int, start_in: float, hold: float, env: dict[str, str]
) -> list[tuple[str, int]]:
    """(stdout, exit code) of ``drivers`` processes taking ``uri`` at the same instant."""
    at = time.time() + start_in  # every process imported and waiting by then, load allowing
    with tempfile.TemporaryDirectory(prefix="lease-race-") as tried:
        started = [
            subprocess.Popen(
                [
                    sys.executable, "-m", "tests.support.lease_race",
                    uri, str(at), str(hold), tried, str(drivers),
                ],
                cwd=REPO,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, **env},
            )
            for _ in range(drivers)
        ]  # fmt: skip
        return [(p.communicate(timeout=300)[0].strip(), p.returncode) for p in started]


def main(uri: str, at: float, hold: float, tried: Path, drivers: int) -> int:
    lease = DriverLease(lease_store(Settings(), uri), ttl_seconds=3, renew_seconds=0.2)
    time.sleep(max(0.0, at - time.time()))
    try:
        lease.acquire(poll_seconds=0.05)
    except LeaseHeldError:
        (tried / str(os.getpid())).touch()
        print("refused", flush=True)
        return 3
    lease.start_renewing()
    print(lease.record.owner, flush=True)
    deadline = time.monotonic() + _TRIED_TIMEOUT_SECONDS
    while len(list(tried.iterdir())) < drivers - 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(hold)
    lease.release()
    return 0


if __name__ == "__main__":
    uri, at, hold, tried, drivers = sys.argv[1:6]
    sys.exit(main(uri, float(at), float(hold), Path(tried), int(drivers)))
