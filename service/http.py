"""The operations HTTP endpoint: /metrics, /healthz (process alive), /readyz (queries healthy)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def serve_http(
    port: int, registry: CollectorRegistry, readiness: Callable[[], tuple[bool, str]]
) -> ThreadingHTTPServer:
    """Serve the endpoints on ``port`` (0 = any free port) in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                self._send(200, b"ok\n", "text/plain")
            elif self.path == "/readyz":
                ready, detail = readiness()
                self._send(200 if ready else 503, (detail + "\n").encode(), "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Silence per-request access logs (scrapes every few seconds)."""

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)  # noqa: S104 - scraped by Prometheus
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
