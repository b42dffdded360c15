"""Background components: the periodic worker's failure edges and the lifecycle's order."""

from __future__ import annotations

import threading

import pytest
from structlog.testing import capture_logs

from service.background import Finished, Lifecycle, PeriodicWorker


def test_an_outage_is_two_lines_and_every_error_is_seen() -> None:
    outcomes: list[object] = [["broker down"], RuntimeError("boom"), [], [], ["again"]]
    errors: list[Exception] = []

    def tick() -> list[str]:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        assert isinstance(outcome, list)
        return outcome

    worker = PeriodicWorker(
        "w", 60, tick, failed_event="w_failed", recovered_event="w_recovered",
        on_error=errors.append, where="here",
    )  # fmt: skip
    with capture_logs() as logs:
        healthy = [worker.run_once() for _ in range(5)]

    assert [False, False, True, True, False] == healthy
    assert ["w_failed", "w_recovered", "w_failed"] == [e["event"] for e in logs]
    assert (["broker down"], "here") == (logs[0]["problems"], logs[0]["where"])
    assert "failed_for_seconds" in logs[1]
    assert ["boom"] == [str(e) for e in errors]


def test_a_worker_ticks_until_stopped_and_a_finished_tick_ends_it() -> None:
    ticked = threading.Event()
    ticks: list[int] = []

    def tick() -> list[str]:
        ticks.append(1)
        if len(ticks) == 3:
            ticked.set()
            raise Finished
        return []

    worker = PeriodicWorker("w", 0.01, tick, failed_event="f", recovered_event="r")
    worker.start()
    assert ticked.wait(10)
    worker.stop()

    assert 3 == len(ticks)


def test_components_stop_in_reverse_order_once_even_when_a_start_fails() -> None:
    events: list[str] = []

    class Named:
        def __init__(self, name: str, fail_start: bool = False) -> None:
            self.name, self.fail_start = name, fail_start

        def start(self) -> None:
            if self.fail_start:
                raise RuntimeError(f"{self.name} did not start")
            events.append(f"start {self.name}")

        def stop(self) -> None:
            events.append(f"stop {self.name}")
            if self.name == "b":
                raise RuntimeError("a failing stop does not keep the others running")

    with pytest.raises(RuntimeError, match="c did not start"), Lifecycle() as components:
        components.start(Named("a"))
        components.start(Named("b"))
        components.start(Named("c", fail_start=True))

    assert ["start a", "start b", "stop b", "stop a"] == events
