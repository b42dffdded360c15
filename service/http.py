"""The operations HTTP endpoint: /metrics, /healthz (process alive), /readyz (queries healthy)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Readiness = Callable[[], tuple[bool, str]]


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


def serve_http(port: int, registry: CollectorRegistry, readiness: Readiness) -> ThreadingHTTPServer:
    """Serve the endpoints on ``port`` (0 = any free port) in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(200, b"ok\n", "text/plain; charset=utf-8")
            elif path == "/readyz":
                ready, detail = readiness()
                body = (detail + "\n").encode()
                self._send(200 if ready else 503, body, "text/plain; charset=utf-8")
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Silence per-request access logs (scrapes every few seconds)."""

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)  # noqa: S104 - scraped by Prometheus
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
