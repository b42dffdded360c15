"""Streaming-listener events recorded from real Spark queries (the JSON files here,
written by `record`), read back as the tests' events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RECORDED = Path(__file__).resolve().parent


def recorded(name: str) -> dict[str, Any]:
    """The recorded listener event of file ``name`` (e.g. ``"idle.json"``)."""
    event: dict[str, Any] = json.loads((RECORDED / name).read_text())
    return event
