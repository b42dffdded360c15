"""Fixtures the unit tests share (the session's Spark, Kafka and MinIO are tests/conftest.py's)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``INGEST_`` or ``AWS_`` variable of the calling shell: settings from defaults and
    what the test sets."""
    for name in list(os.environ):
        if name.startswith(("INGEST_", "AWS_")):
            monkeypatch.delenv(name)
