"""The contracts the docs write out: the `orders` README's "Adding a topic" copies
(docs/examples/orders.json) is docs/contracts.md's worked example's, byte for byte, and
each of them loads; the reserved column names listed are those the lake adds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.contracts.loading import SHIPPED_DIR, read_contract
from service.contracts.silver import duplicates_schema, lake_columns
from tests.support.repo import REPO


def readme_orders() -> str:
    """The orders contract README's "Adding a topic" copies."""
    return (REPO / "docs" / "examples" / "orders.json").read_text()


def worked_example(name: str) -> str:
    """The contract file ``name`` of docs/contracts.md's worked example."""
    text = (REPO / "docs" / "contracts.md").read_text()
    start = text.index(f"`contracts/{name}.json`:\n\n```json\n")
    body = text[text.index("```json\n", start) + len("```json\n") :]
    return body[: body.index("```")]


def test_the_readmes_orders_is_the_worked_examples_orders() -> None:
    assert worked_example("orders") == readme_orders()


@pytest.mark.parametrize("name", ["orders", "devices"])
def test_the_worked_examples_contracts_load(name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.json"
    path.write_text(worked_example(name))

    contract = read_contract(path)

    assert (name, name) == (contract.name, contract.topic)


def test_the_documented_reserved_column_names_are_those_the_lake_adds() -> None:
    text = (REPO / "docs" / "contracts.md").read_text()
    start = text.index("- **Reserved column names.**")
    bullet = text[start : text.index("Two of a contract's columns", start)]
    named = set(re.findall(r"`([a-z_]+)`", bullet))
    lake = {c.name for c in lake_columns("entities")}
    duplicates = {c.name for c in duplicates_schema(read_contract(SHIPPED_DIR / "sensors.json"))}
    reserved = lake | (duplicates - {"event_id"})

    # Every reserved name is listed; besides them, the bullet names only the keys they bind.
    assert set() == reserved - named
    assert {"derived", "entities", "events", "framing", "id", "partition_by"} == named - reserved


def test_the_readme_copies_the_example_contract_it_names() -> None:
    readme = (REPO / "README.md").read_text()
    assert "cp docs/examples/orders.json var/contracts/" in readme
