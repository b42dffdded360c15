"""Payload builders: valid sensor and user documents as producers send them, for every test tier."""

from __future__ import annotations

import json
from typing import Any


def reading(**overrides: Any) -> dict[str, Any]:
    """A valid heart-rate reading with ``overrides`` (None removes a field)."""
    fields: dict[str, Any] = {
        "event_id": "e-1",
        "device_id": "watch-1",
        "user_id": 7,
        "sensor_type": "heart_rate",
        "event_time": "2024-05-01T11:59:00Z",
        "value": 72.5,
        "unit": "bpm",
    }
    fields.update(overrides)
    return {k: v for k, v in fields.items() if v is not None}


def profile(**overrides: Any) -> str:
    """A valid user payload, as JSON text, with ``overrides`` (None removes a field)."""
    fields: dict[str, Any] = {
        "user_id": 1,
        "first_name": "Ada",
        "last_name": "Lovelace",
        "dob": "1990-12-10",
        "gender": "F",
        "country": "GB",
        "updated_at": "2024-04-01T00:00:00Z",
    }
    fields.update(overrides)
    return json.dumps({k: v for k, v in fields.items() if v is not None})
