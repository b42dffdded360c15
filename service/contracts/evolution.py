"""Whether a contract may change under the silver table it writes: a schema registry's BACKWARD
compatibility, decided on the table as it is (pure).

The table's columns (and the contract recorded with it, when there is one) are compared
with what the contract now declares:

- compatible, applied at start: a new optional field (the table gains the column, null
  for the rows already there; inside an array's objects, after their other fields: the
  objects gain it), a required field made optional (its column accepts null
  from then on), any change of a value rule (an enum, a range, a pattern, a length):
  rows already stored stay as they are, new records meet the new rule;
- refused (`ContractChangeRefusedError`, exit 3): a field removed or renamed (silver holds
  a column the contract no longer has), a new required field or an optional one made
  required (rows already stored lack it), a changed type, a changed write mode, key, id,
  order field, partitioning, table or column prefix (compared by meaning: a default
  written out, keys in another order or an events contract's key, which no table
  depends on, are no change). Integer to number is a widening Delta cannot apply
  to a ``bigint`` column for every reader of the lake (Spark, delta-rs), so it is refused
  too, with its own reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import ArrayType, DataType, StructField, StructType

from service.contracts.model import Contract, flatten

RUNBOOK = "docs/runbooks/ContractChangeRefused.md"
# The parts of the extension block a table depends on.
_STRUCTURAL = ("mode", "key", "id", "order_by", "partition_by", "tables", "flatten")


@dataclass(frozen=True)
class Change:
    """One difference: what changed, whether the tables can follow, and how."""

    field: str
    rule: str
    breaking: bool
    add_column: StructField | None = None
    drop_not_null: str | None = None
    # New fields of the objects of the array column ``field``.
    add_inside: tuple[StructField, ...] = ()


def table_changes(
    contract: Contract,
    declared: StructType,
    actual: StructType,
    recorded: Mapping[str, Any] | None,
) -> list[Change]:
    """The changes between the silver table as it is (``actual``, and the contract document
    ``recorded`` with it, if any) and what ``contract`` declares for it (``declared``)."""
    changes: list[Change] = []
    have = {f.name: f for f in actual.fields}
    want = {f.name: f for f in declared.fields}
    # An entities table's profile columns are all nullable (a deleted entity has none): what
    # the contract requires is read from the documents, not from the columns alone.
    required = _required_columns(contract.document)
    was_required = _required_columns(recorded) if recorded is not None else required
    for name, column in want.items():
        if name not in have:
            if not column.nullable or name in required:
                changes.append(
                    Change(name, "a new required field: rows already stored lack it", True)
                )
            else:
                changes.append(Change(name, "a new optional field", False, add_column=column))
            continue
        old = have[name]
        added = _added_inside(old.dataType, column.dataType)
        if added:
            changes.append(_inside_change(contract, name, added))
        elif old.dataType != column.dataType:
            changes.append(Change(name, _type_change(old.dataType, column.dataType), True))
        elif not old.nullable and column.nullable:
            changes.append(
                Change(name, "made optional: accepts null from now on", False, drop_not_null=name)
            )
        elif (old.nullable and not column.nullable) or (
            name in required and name not in was_required
        ):
            changes.append(Change(name, "made required: rows already stored may lack it", True))
    for name in have:
        if name not in want:
            changes.append(
                Change(name, "removed or renamed: silver holds its column and rows", True)
            )
    if recorded is not None:
        changes += _document_changes(contract, recorded)
    return changes


def _required_columns(document: Mapping[str, Any]) -> set[str]:
    """The columns a contract document requires a value in: its required, non-null top-level
    fields'."""
    prefixes = document.get("x-lakehouse", {}).get("flatten", {})
    fields = flatten(document.get("properties", {}), document.get("required", ()), prefixes)
    return {
        f.column
        for f in fields
        if f.required and not f.nullable and not f.is_object and "." not in f.path
    }


def _added_inside(old: DataType, new: DataType) -> tuple[StructField, ...]:
    """The fields ``new`` adds after ``old``'s, where both are arrays of objects and ``new``
    keeps every field of ``old`` in its place; none otherwise."""
    if not (isinstance(old, ArrayType) and isinstance(new, ArrayType)):
        return ()
    before, after = old.elementType, new.elementType
    if not (isinstance(before, StructType) and isinstance(after, StructType)):
        return ()
    kept = len(before.fields)
    if len(after.fields) <= kept or after.fields[:kept] != before.fields:
        return ()
    return tuple(after.fields[kept:])


def _inside_change(contract: Contract, column: str, added: tuple[StructField, ...]) -> Change:
    [array] = [f for f in contract.leaves if f.column == column]
    required = [p.column for p in array.item.properties if p.required]
    names = ", ".join(f.name for f in added)
    if any(f.name in required for f in added):
        return Change(column, f"a new required field inside its objects ({names}): rows"
                      " already stored lack it", True)  # fmt: skip
    return Change(column, f"new optional fields inside its objects: {names}", False,
                  add_inside=added)  # fmt: skip


def _type_change(old: DataType, new: DataType) -> str:
    if (old.simpleString(), new.simpleString()) == ("bigint", "double"):
        return (
            "integer widened to number: Delta cannot widen a bigint column to double for every"
            " reader of the lake (Spark, delta-rs)"
        )
    return f"type changed from {old.simpleString()} to {new.simpleString()}"


def _document_changes(contract: Contract, recorded: Mapping[str, Any]) -> list[Change]:
    """Changes of the extension block's structure (refused) and of value rules (applied)."""
    changes = []
    before = recorded.get("x-lakehouse", {})
    after = contract.document.get("x-lakehouse", {})
    was = _structure(recorded, str(before.get("name", contract.name)))
    now = _structure(contract.document, contract.name)
    for key in _STRUCTURAL:
        if was[key] != now[key]:
            changes.append(
                Change(
                    f"x-lakehouse/{key}",
                    f"changed from {before.get(key)!r} to {after.get(key)!r}: the tables were"
                    " written by the other",
                    True,
                )
            )
    old_properties = recorded.get("properties", {})
    for name, schema in contract.document.get("properties", {}).items():
        if name in old_properties and old_properties[name] != schema:
            changes.append(Change(name, "value rules changed (applied to new records)", False))
    for key in ("allOf", "dependentRequired", "required", "additionalProperties"):
        if recorded.get(key) != contract.document.get(key):
            changes.append(Change(key, "rules changed (applied to new records)", False))
    return changes


def _structure(document: Mapping[str, Any], name: str) -> dict[str, Any]:
    """What the tables depend on in a contract document's extension block, its defaults
    written out, so that two spellings of one meaning compare equal."""
    extension = document.get("x-lakehouse", {})
    mode = extension.get("mode")
    tables = extension.get("tables", {})
    prefixes = extension.get("flatten", {})
    objects = [f for f in flatten(document.get("properties", {}), (), prefixes) if f.is_object]
    return {
        "mode": mode,
        # An events contract's key only says what the Kafka key holds.
        "key": extension.get("key") if mode == "entities" else None,
        "id": extension.get("id"),
        "order_by": extension.get("order_by"),
        "partition_by": extension.get("partition_by"),
        "tables": (
            tables.get("bronze", f"bronze/{name}"),
            tables.get("silver", f"silver/{name}"),
            tables.get("duplicates", f"silver/{name}_duplicates") if mode == "events" else None,
        ),
        "flatten": {f.path: prefixes.get(f.path, f"{f.path.rpartition('.')[2]}_") for f in objects},
    }


def refusal(contract: Contract, changes: list[Change]) -> str | None:
    """The one line that refuses the start, naming the contract, the field and the rule; None
    when every change is compatible."""
    breaking = [c for c in changes if c.breaking]
    if not breaking:
        return None
    first = breaking[0]
    more = f" (and {len(breaking) - 1} more)" if len(breaking) > 1 else ""
    return (
        f"contract {contract.name} ({contract.source}) changed in a way its tables cannot "
        f"follow: {first.field}: {first.rule}{more}. Restore the previous contract, or give "
        f"the change a new field or table; see {RUNBOOK}."
    )
