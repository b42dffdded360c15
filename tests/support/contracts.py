"""Contract documents for the tests: the shipped ones as dicts, a third one, and the one
line a refused document gets."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.contracts.loading import SHIPPED_DIR, parse_contract
from service.errors import ContractError

DRAFT = "https://json-schema.org/draft/2020-12/schema"
# An edit of a contract document, in place.
Edit = Callable[[dict[str, Any]], object]


def shipped(name: str) -> dict[str, Any]:
    """The shipped contract ``name``'s document."""
    document: dict[str, Any] = json.loads((SHIPPED_DIR / f"{name}.json").read_text())
    return document


def orders(**extension: Any) -> dict[str, Any]:
    """A third contract: events with an id (default table names), ``extension`` added to its
    x-lakehouse block."""
    return {
        "$schema": DRAFT,
        "type": "object",
        "required": ["order_id", "placed_at"],
        "properties": {
            "order_id": {"type": "string", "minLength": 1},
            "placed_at": {"type": "string", "format": "date-time"},
            "amount": {"type": ["number", "null"], "minimum": 0},
        },
        "x-lakehouse": {"name": "orders", "mode": "events", "id": "order_id", **extension},
    }


def changed(document: dict[str, Any], change: Edit) -> dict[str, Any]:
    """A deep copy of ``document`` that ``change`` edited."""
    copied = copy.deepcopy(document)
    change(copied)
    return copied


def refusal(document: dict[str, Any], source: str) -> str:
    """The one line `parse_contract` refuses ``document`` with."""
    with pytest.raises(ContractError) as raised:
        parse_contract(document, source, Path(source).stem, {})
    message = str(raised.value)
    assert 1 == len(message.splitlines()), message
    return message
