"""Background work: a periodic worker, and the lifecycle that starts and stops components.

The driver's helpers that run beside its queries (the lease renewal, the lag poller,
the lake auditor, the JVM sampler, the HTTP server) are components: started in order
by the composition root, stopped in the reverse order, once, even when a later start
failed. The periodic ones are a `PeriodicWorker` around a ``tick``: one thread, one
stop event, and the same failure-edge logging, so an outage is two log lines (when
it starts and when it ends), never one per tick.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Protocol, TypeVar

import structlog

log = structlog.get_logger(__name__)

_MAX_ERROR_CHARS = 500


class Component(Protocol):
    """Something the driver starts before its queries and stops after them."""

    def start(self) -> None: ...
    def stop(self) -> None: ...


class Finished(Exception):  # noqa: N818 - a signal, not an error
    """Raised by a tick to end its worker for good (e.g. the lease was lost)."""


class PeriodicWorker:
    """Call ``tick`` every ``interval_seconds`` in a daemon thread named ``name``, until `stop`.

    ``tick`` returns the problems it met (empty when healthy) or raises. The first
    failing tick after a healthy one logs ``failed_event`` (level warning, with the
    problems or the error, the exception's traceback with it when ``traceback``);
    the first healthy tick after failures logs ``recovered_event`` (with how long the
    failure lasted). ``on_error`` sees every exception (a metric counts them all). With
    ``first_now`` the first tick runs at start, else one interval after it; ticks are
    spaced by the interval from the start of the previous one.
    """

    def __init__(
        self,
        name: str,
        interval_seconds: float,
        tick: Callable[[], Sequence[str]],
        *,
        failed_event: str,
        recovered_event: str,
        first_now: bool = True,
        traceback: bool = False,
        on_error: Callable[[Exception], None] | None = None,
        stop_timeout_seconds: float = 10.0,
        **context: object,
    ) -> None:
        self.name = name
        self._interval = interval_seconds
        self._tick = tick
        self._failed_event = failed_event
        self._recovered_event = recovered_event
        self._first_now = first_now
        self._traceback = traceback
        self._on_error = on_error
        self._stop_timeout = stop_timeout_seconds
        self._context = context
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing_since: float | None = None

    @property
    def failing(self) -> bool:
        """Whether the last tick failed."""
        return self._failing_since is not None

    def run_once(self) -> bool:
        """Run one tick now, with the failure-edge logging; return whether it was healthy.

        Raises `Finished` when the tick ends the worker.
        """
        try:
            problems = list(self._tick())
        except Finished:
            raise
        except Exception as e:  # noqa: BLE001 - a tick must never end the thread
            if self._on_error is not None:
                self._on_error(e)
            self._failed(error=str(e)[:_MAX_ERROR_CHARS], exc_info=self._traceback)
            return False
        if problems:
            self._failed(problems=problems)
            return False
        if self._failing_since is not None:
            failed_for = round(time.monotonic() - self._failing_since, 1)
            log.info(self._recovered_event, failed_for_seconds=failed_for, **self._context)
            self._failing_since = None
        return True

    def _failed(self, exc_info: bool = False, **details: object) -> None:
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            log.warning(self._failed_event, exc_info=exc_info, **details, **self._context)

    def _loop(self) -> None:
        wait = 0.0 if self._first_now else self._interval
        while not self._stop.wait(wait):
            started = time.monotonic()
            try:
                self.run_once()
            except Finished:
                return
            wait = max(0.0, self._interval - (time.monotonic() - started))

    def start(self) -> None:
        """Start ticking."""
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop ticking; a tick in progress is given ``stop_timeout_seconds`` to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._stop_timeout)


class Resource:
    """A component already started when made (a session, a client, a lease): `stop` closes it."""

    def __init__(self, close: Callable[[], None]) -> None:
        self._close = close

    def start(self) -> None:
        """Nothing to do: it was started when made."""

    def stop(self) -> None:
        """Close it."""
        self._close()


C = TypeVar("C", bound=Component)


class Lifecycle:
    """Components started in order and stopped in the reverse order, each stop once.

    A context manager: leaving the block stops what was started, whether it ended
    normally or not. A failing stop is logged and does not keep the others running.
    """

    def __init__(self) -> None:
        self._started: list[Component] = []

    def start(self, component: C) -> C:
        """Start ``component`` and return it; it will be stopped before those started earlier."""
        component.start()
        self._started.append(component)
        return component

    def stop(self) -> None:
        """Stop every started component, the last started first."""
        while self._started:
            component = self._started.pop()
            try:
                component.stop()
            except Exception:
                log.exception("component_stop_failed", component=type(component).__name__)

    def __enter__(self) -> Lifecycle:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
