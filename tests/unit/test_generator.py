"""The generator's event times in count mode and its event ids."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from itertools import pairwise

from service.generator import count_schedule, uuid4_text


def test_count_mode_event_times_end_now_and_never_run_ahead() -> None:
    end = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
    times = list(count_schedule(400_000, end))
    assert len(times) == 400_000
    assert times[-1] == end
    assert times[0] == end - timedelta(milliseconds=399_999)
    assert all(b - a == timedelta(milliseconds=1) for a, b in pairwise(times))


def test_event_ids_are_the_text_of_version_4_uuids() -> None:
    rng = random.Random(7)
    for bits in [0, 2**128 - 1, *(rng.getrandbits(128) for _ in range(1000))]:
        assert uuid4_text(bits) == str(uuid.UUID(int=bits, version=4))
