"""The operations HTTP endpoint: /metrics, /healthz (not wedged), /readyz (queries healthy)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

if TYPE_CHECKING:
    from wsgiref.types import StartResponse

Probe = Callable[[], tuple[bool, str]]


def readiness_verdict(
    active: Mapping[str, bool],
    progress_age: Mapping[str, float | None],
    max_progress_age: float,
    storage_age: float | None,
    max_storage_age: float,
) -> tuple[bool, str]:
    """Ready when every query is active and progressing or idle, and the storage is writable.

    ``progress_age`` is the seconds since each query's last start, progress or idle
    event (None: not started yet); a query silent for more than ``max_progress_age``
    is stuck in a batch. ``storage_age`` is the seconds since the last successful
    write to the checkpoint storage (the lease renewal); beyond ``max_storage_age``
    the object store is unreachable, so no batch can commit.
    """
    if not active:
        return False, "starting: no query yet"
    problems: list[str] = []
    down = sorted(name for name, is_active in active.items() if not is_active)
    if down:
        problems.append(f"queries not active: {', '.join(down)}")
    starting = sorted(n for n in active if n not in down and progress_age.get(n) is None)
    if starting:
        problems.append(f"queries starting: {', '.join(starting)}")
    stale = sorted(
        f"{n} ({age:.0f}s)"
        for n in active
        if n not in down and (age := progress_age.get(n)) is not None and age > max_progress_age
    )
    if stale:
        problems.append(f"no progress for over {max_progress_age:.0f}s: {', '.join(stale)}")
    if storage_age is not None and storage_age > max_storage_age:
        problems.append(f"storage unreachable: no successful write for {storage_age:.0f}s")
    if problems:
        return False, "; ".join(problems)
    return True, "ok"


def liveness_verdict(
    progress_age: Mapping[str, float | None],
    records_waiting: Mapping[str, int | None],
    max_wedged_age: float,
) -> tuple[bool, str]:
    """Alive unless a query has data waiting and finished no batch for ``max_wedged_age``.

    A healthy query reports progress after each batch and an idle event every few
    seconds when there is nothing to read, so a long silence means a batch that does
    not end. ``records_waiting`` is a query's polled Kafka lag (None: unknown, as for
    the gold queries, whose silence alone counts). A restart (the probe failing)
    resumes from the checkpoint.
    """
    wedged = sorted(
        f"{name} ({age:.0f}s, {waiting if waiting is not None else 'unknown'} records waiting)"
        for name, age in progress_age.items()
        if age is not None and age > max_wedged_age and (waiting := records_waiting.get(name)) != 0
    )
    if wedged:
        return False, f"wedged: no batch finished for over {max_wedged_age:.0f}s: " + ", ".join(
            wedged
        )
    return True, "ok"


class HttpServer:
    """The driver's endpoints as a component: `start` serves them, `stop` shuts them down."""

    def __init__(
        self,
        port: int,
        registry: CollectorRegistry,
        readiness: Probe,
        liveness: Probe,
        status: Callable[[], str],
    ) -> None:
        self._args = (port, registry, readiness, liveness, status)
        self._server: WSGIServer | None = None

    @property
    def port(self) -> int:
        """The port it listens on (the free one chosen for port 0)."""
        assert self._server is not None, "not started"
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Serve in a daemon thread."""
        self._server = serve_http(*self._args)

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()


def serve_http(
    port: int,
    registry: CollectorRegistry,
    readiness: Probe,
    liveness: Probe,
    status: Callable[[], str],
) -> WSGIServer:
    """Serve the endpoints on ``port`` (0 = any free port) in a daemon thread.

    ``/metrics`` is prometheus_client's own exposition (OpenMetrics negotiation,
    gzip, ``name[]`` filters); ``/status`` is ``status()``'s JSON; every other path
    but the probes is a 404.
    """
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            exposition: Iterable[bytes] = metrics_app(environ, start_response)
            return exposition
        if path == "/status":
            start_response("200 OK", [("Content-Type", "application/json")])
            return [status().encode()]
        if path in ("/healthz", "/readyz"):
            healthy, body = liveness() if path == "/healthz" else readiness()
            code = "200 OK" if healthy else "503 Service Unavailable"
        else:
            code, body = "404 Not Found", "not found"
        start_response(code, [("Content-Type", "text/plain; charset=utf-8")])
        return [(body + "\n").encode()]

    server = make_server(
        "0.0.0.0",  # noqa: S104 - scraped by Prometheus
        port,
        app,
        server_class=ThreadingWSGIServer,
        handler_class=_QuietHandler,
    )
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server


class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    """A WSGI server answering each request in its own daemon thread."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Silence per-request access logs (scrapes every few seconds)."""
