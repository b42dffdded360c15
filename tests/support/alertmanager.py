"""The shipped Alertmanager configuration and the pinned Alertmanager tools (`make tools`)."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from devstack import free_port

from service.config import default_cache_dir
from tests.support.repo import REPO

ALERTMANAGER_CONFIG = (
    REPO / "helm" / "lakehouse-ingest" / "files" / "alertmanager" / "alertmanager.yml"
)
_MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"(.*)"\s*$')


def tool(name: str) -> str:
    """A pinned binary of the cache's bin directory (``amtool``, ``alertmanager``)."""
    binary = default_cache_dir() / "bin" / name
    if not binary.exists():
        pytest.fail(f"{binary} missing: run `make tools`")
    return str(binary)


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the pinned amtool."""
    return subprocess.run([tool("amtool"), *args], capture_output=True, text=True, check=False)


def shipped_config() -> dict[str, Any]:
    """The Alertmanager configuration Compose runs and the chart's inhibit rules come from."""
    config: dict[str, Any] = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    return config


def matcher(text: str) -> tuple[str, str, str]:
    """An Alertmanager matcher string as (name, operator, value)."""
    parsed = _MATCHER.match(text)
    assert parsed, f"not a matcher: {text!r}"
    name, operator, value = parsed.groups()
    return name, operator, value


class _Webhook(BaseHTTPRequestHandler):
    """Alertmanager's webhook notifications, kept in the server's ``received``."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append(json.loads(body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A webhook receiver on loopback: its URL and the notifications it received."""
    server = HTTPServer(("127.0.0.1", 0), _Webhook)
    server.received = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/", server.received  # type: ignore[attr-defined]
    finally:
        server.shutdown()


@contextmanager
def alertmanager(work_dir: Path, receiver_url: str) -> Iterator[int]:
    """The pinned Alertmanager with the shipped configuration on loopback, its receiver the
    webhook at ``receiver_url`` and its group wait 1 s; its port."""
    config = shipped_config()
    config["receivers"] = [{"name": "on-call", "webhook_configs": [{"url": receiver_url}]}]
    config["route"] |= {"group_wait": "1s", "group_interval": "1s"}
    (work_dir / "alertmanager.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    process = subprocess.Popen(
        [
            tool("alertmanager"),
            f"--config.file={work_dir / 'alertmanager.yml'}",
            f"--storage.path={work_dir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "Alertmanager did not get ready in 30 s"
                time.sleep(0.2)
        yield port
    finally:
        process.terminate()
        process.wait(10)


def notified(received: list[dict[str, Any]], since: float | None = None) -> list[tuple[str, str]]:
    """(alertname, job) of every alert in ``received`` notifications, sorted; with ``since``
    (seconds since the epoch), only the firing ones that started then or later."""
    return sorted(
        (alert["labels"]["alertname"], alert["labels"]["job"])
        for notification in received
        for alert in notification["alerts"]
        if since is None or (alert["status"] == "firing" and _epoch(alert["startsAt"]) >= since)
    )


def _epoch(rfc3339: str) -> float:
    """Seconds since the epoch of an Alertmanager timestamp (nanosecond fractions)."""
    moment, _, fraction = rfc3339.rstrip("Z").partition(".")
    whole = datetime.fromisoformat(moment).replace(tzinfo=UTC).timestamp()
    return whole + float(f"0.{fraction or 0}")
