"""The ``reconcile`` verb: its ``--since`` argument. The checks themselves are the lake's
invariants (`service.lake.invariants`), which the driver runs too."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_DURATION = re.compile(r"^(\d+)\s*([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_since(text: str, now: datetime) -> datetime:
    """``--since``: an ISO-8601 date or time (zone-less = UTC), or a duration back from ``now``
    (``90s``, ``15m``, ``6h``, ``7d``)."""
    text = text.strip()
    if match := _DURATION.match(text):
        return now - timedelta(**{_UNITS[match[2]]: int(match[1])})
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as e:
        raise ValueError(
            f"{text!r} is neither an ISO-8601 time (2026-01-31T12:00:00Z) nor a duration (6h)"
        ) from e
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
