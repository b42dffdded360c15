"""The generator's event times in count mode, its event ids and its seed."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from service.__main__ import _parser
from service.verbs.generate import (
    GeneratorOptions,
    GeneratorSummary,
    Transaction,
    count_schedule,
    uuid4_text,
)


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


class TransactionsSeen:
    """The transaction calls a producer received, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def init_transactions(self) -> None:
        self.calls.append("init")

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def flush(self) -> int:
        self.calls.append("flush")
        return 0

    def commit_transaction(self) -> None:
        self.calls.append("commit")

    def abort_transaction(self) -> None:
        self.calls.append("abort")


@pytest.mark.parametrize(
    ("abort_fraction", "ends", "categories", "produced"),
    [
        (1.0, ["abort", "abort"], {"sensors.aborted": 3}, 0),
        (0.0, ["commit", "commit"], {"sensors.valid": 3}, 3),
    ],
)
def test_records_count_when_their_transaction_commits_and_as_aborted_when_it_aborts(
    abort_fraction: float, ends: list[str], categories: dict[str, int], produced: int
) -> None:
    summary = GeneratorSummary(seed=0)
    options = GeneratorOptions(transaction_size=2, abort_fraction=abort_fraction)
    transaction, producer = Transaction(options, summary), TransactionsSeen()

    transaction.begin(producer)  # type: ignore[arg-type]
    for _ in range(3):  # one full transaction, then one record the end commits or aborts
        transaction.sent("sensors.valid")
        transaction.delivered("sensors")
        transaction.maybe_end(producer)  # type: ignore[arg-type]
    transaction.end(producer)  # type: ignore[arg-type]

    assert ["init", "begin", "flush", ends[0], "begin", "flush", ends[1]] == producer.calls
    assert categories == dict(summary.by_category)
    assert produced == summary.produced["sensors"]


def test_a_random_seed_is_new_each_run_and_reported_in_the_summary() -> None:
    def seed(*given: str) -> int:
        args = ["generate", "--users", "1", "--readings", "1", *given]
        return int(_parser().parse_args(args).seed)

    assert (0, 7) == (seed(), seed("--seed", "7"))
    drawn = {seed("--seed", "random") for _ in range(3)}
    assert 3 == len(drawn) and all(0 <= s < 2**31 for s in drawn)
    assert 7 == json.loads(GeneratorSummary(seed=7).to_json())["seed"]
    with pytest.raises(SystemExit):
        seed("--seed", "often")
