"""Applying a changed contract to its silver table, and recording which contract wrote it.

Before Spark starts, `plan_evolution` reads each silver table's schema and recorded
contract with delta-rs and decides (`service.contracts.evolution`): a breaking change
refuses the start (`ContractChangeRefusedError`, exit 3, one line). After it,
`apply_evolution` makes the compatible changes as Delta schema changes of the driver's
own, under its lease (a new optional column, a column made nullable), and records the
contract with the table in its properties: its fingerprint, its version and the document
itself (base64), which `status` shows and the next start compares with. A change is
logged once, when it is applied.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from service.contracts.evolution import Change, refusal, table_changes
from service.contracts.loading import Contracts
from service.contracts.model import Contract
from service.errors import ContractChangeRefusedError
from service.lake.tables import (
    DOCUMENT_PROPERTY,
    FINGERPRINT_PROPERTY,
    VERSION_PROPERTY,
    Table,
    contract_tables,
)

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Evolution:
    """What one contract's silver table needs: its changes (compatible ones only, once
    planned) and whether the contract must be recorded with it."""

    contract: Contract
    table: Table
    exists: bool
    changes: list[Change]
    record: bool


def recorded_contract(properties: Mapping[str, str]) -> dict[str, Any] | None:
    """The contract document recorded in a table's ``properties``, None if none is."""
    encoded = properties.get(DOCUMENT_PROPERTY)
    if not encoded:
        return None
    document: dict[str, Any] = json.loads(base64.b64decode(encoded))
    return document


def recording(contract: Contract) -> dict[str, str]:
    """The table properties that record ``contract`` with its silver table: its
    fingerprint, version and document (base64)."""
    document = base64.b64encode(json.dumps(contract.document, sort_keys=True).encode())
    return {
        FINGERPRINT_PROPERTY: contract.fingerprint,
        VERSION_PROPERTY: str(contract.version) if contract.version is not None else "",
        DOCUMENT_PROPERTY: document.decode(),
    }


def plan_evolution(contracts: Contracts, root: str, options: Mapping[str, str]) -> list[Evolution]:
    """Each contract's silver table against the contract (delta-rs, no JVM; ``root`` as
    delta-rs spells it); raise `ContractChangeRefusedError` at the first breaking change.
    A table that does not exist yet needs only its contract recorded once created."""
    plans = []
    for contract in contracts:
        table = contract_tables(contract).silver
        uri = f"{root.rstrip('/')}/{table.name}"
        try:
            delta = DeltaTable(uri, storage_options=dict(options))
        except TableNotFoundError:
            plans.append(Evolution(contract, table, False, [], record=True))
            continue
        actual = StructType.fromJson(json.loads(delta.schema().to_json()))
        properties = dict(delta.metadata().configuration)
        assert table.schema is not None
        changes = table_changes(contract, table.schema, actual, recorded_contract(properties))
        refused = refusal(contract, changes)
        if refused is not None:
            raise ContractChangeRefusedError(refused)
        current = properties.get(FINGERPRINT_PROPERTY) == contract.fingerprint
        plans.append(Evolution(contract, table, True, changes, record=not current))
    return plans


def apply_evolution(
    spark: SparkSession, storage_uri: str, plans: list[Evolution], fence: Callable[[], None]
) -> None:
    """Make each plan's compatible schema changes and record its contract (the lease holder
    only: ``fence`` runs first)."""
    for plan in plans:
        if not plan.record and not plan.changes:
            continue
        uri = plan.table.uri(storage_uri).replace("`", "``")
        fence()
        added = [
            (f"`{c.add_column.name}`", c.add_column)
            for c in plan.changes
            if c.add_column is not None
        ]
        # A field of an array's objects is named through the array's "element".
        added += [
            (f"`{c.field}`.element.`{f.name}`", f) for c in plan.changes for f in c.add_inside
        ]
        if added:
            columns = ", ".join(f"{name} {c.dataType.simpleString()}" for name, c in added)
            spark.sql(f"ALTER TABLE delta.`{uri}` ADD COLUMNS ({columns})")
        for change in plan.changes:
            if change.drop_not_null is not None:
                column = change.drop_not_null
                spark.sql(f"ALTER TABLE delta.`{uri}` ALTER COLUMN `{column}` DROP NOT NULL")
        contract = plan.contract
        assignments = ", ".join(f"'{k}' = '{v}'" for k, v in recording(contract).items())
        spark.sql(f"ALTER TABLE delta.`{uri}` SET TBLPROPERTIES ({assignments})")
        if plan.changes:
            log.info(
                "contract_evolved",
                contract=contract.name,
                table=plan.table.name,
                fingerprint=contract.fingerprint,
                changes=[f"{c.field}: {c.rule}" for c in plan.changes],
            )
