"""What the running driver says about itself: ``/status`` on its HTTP port.

Only the driver knows what is happening now: which batch each query is writing
and for how long, its polled Kafka lag, its readiness and liveness verdicts. It
answers from memory (no I/O), so it is instant even while the driver is busy.
`lakehouse-ingest status` asks it first and adds the durable view (checkpoints,
tables) that works when the driver is down.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass

_FETCH_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class QueryNow:
    """One query as the driver sees it now."""

    query: str
    active: bool
    batch_in_flight: int | None
    in_flight_seconds: float | None
    last_batch_id: int | None
    seconds_since_progress: float | None
    records_waiting: int | None


@dataclass(frozen=True)
class DriverView:
    """The driver's answer to ``/status``."""

    pid: int
    ready: bool
    ready_reason: str
    alive: bool
    alive_reason: str
    lease_heartbeat_age_seconds: float | None
    queries: list[QueryNow]

    def to_json(self) -> str:
        """The view as one JSON document."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DriverView:
        """Parse what `to_json` wrote."""
        data = json.loads(text)
        return cls(**{**data, "queries": [QueryNow(**q) for q in data["queries"]]})


def fetch_driver_view(port: int, host: str = "127.0.0.1") -> tuple[DriverView | None, str | None]:
    """Ask the driver at ``host:port``; the view, or None and why it did not answer."""
    url = f"http://{host}:{port}/status"
    try:
        with urllib.request.urlopen(url, timeout=_FETCH_TIMEOUT_SECONDS) as answer:
            return DriverView.from_json(answer.read().decode("utf-8")), None
    except (OSError, ValueError, TypeError, KeyError) as e:  # URLError is an OSError
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        return None, f"no driver answering at {url}: {reason}"
