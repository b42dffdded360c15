"""Reading the lake's Delta tables without a JVM: delta-rs, and its DataFusion SQL over them.

The operator verbs (`service.verbs.show`) and the lake's checks (`service.lake.invariants`) read
through here. A
table is named by the catalogue (`service.lake.tables`); the storage root is the
service's own (``INGEST_STORAGE_ROOT``): a local path, or ``s3a://`` (Hadoop's
scheme) read as ``s3://`` with the S3 settings the driver uses (endpoint,
credentials, region; plain HTTP when the endpoint says so; path-style requests,
as for MinIO). Reads take no lease and write nothing: safe beside a running
driver, which only ever adds versions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError, TableNotFoundError

from service.config import Location, Settings
from service.errors import LakeReadError, LakeRequestError
from service.lake.tables import SHIPPED, Table, catalogue_of

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class LakeReader:
    """Opens the catalogue's tables under one storage root."""

    root: str
    options: Mapping[str, str] = field(default_factory=dict, repr=False)
    # The tables of the lake by name (default: those of the shipped contracts).
    catalogue: Mapping[str, Table] = field(
        default_factory=lambda: SHIPPED.by_name(), repr=False, compare=False
    )

    @classmethod
    def from_settings(cls, settings: Settings) -> LakeReader:
        """The reader of ``settings``' storage root and contracts."""
        root = Location(settings.storage_uri).for_delta_rs()
        catalogue = catalogue_of(settings.contracts).by_name()
        return cls(root, settings.storage.delta_rs_options(), catalogue)

    @property
    def tables(self) -> tuple[Table, ...]:
        """Every table of the lake."""
        return tuple(self.catalogue.values())

    def table(self, name: str) -> Table:
        """The table named ``name``; `LakeRequestError` naming the others if there is none."""
        if name not in self.catalogue:
            raise LakeRequestError(
                f"no table {name!r} in the catalogue; tables: {', '.join(self.catalogue)}"
            )
        return self.catalogue[name]

    def uri(self, table: Table) -> str:
        """Where ``table`` lives, as delta-rs addresses it."""
        return f"{self.root.rstrip('/')}/{table.name}"

    def open(self, table: Table, version: int | None = None) -> DeltaTable:
        """``table`` at its latest version, or at ``version`` (time travel).

        Raises `LakeRequestError` when there is no such table or version, and
        `LakeReadError` when the storage cannot be read.
        """
        uri = self.uri(table)
        try:
            delta = DeltaTable(uri, storage_options=dict(self.options))
        except TableNotFoundError as e:
            raise LakeRequestError(f"no Delta table {table.name} at {uri}") from e
        except (DeltaError, OSError) as e:
            raise LakeReadError(f"cannot read {table.name} at {uri}: {one_line(e)}") from e
        if version is None or version == delta.version():
            return delta
        latest = delta.version()
        if not 0 <= version <= latest:
            raise LakeRequestError(
                f"{table.name} has no version {version} (versions 0 to {latest})"
            )
        try:
            delta.load_as_version(version)
        except (DeltaError, OSError) as e:
            # Older versions disappear when the log is cleaned up (delta.logRetentionDuration).
            raise LakeRequestError(
                f"{table.name} version {version} cannot be read (its log may have been "
                f"cleaned up): {one_line(e)}"
            ) from e
        return delta

    def open_if_exists(self, table: Table) -> DeltaTable | None:
        """``table`` at its latest version, or None when it does not exist (yet)."""
        try:
            return self.open(table)
        except LakeRequestError:
            return None


def open_sql(tables: Mapping[str, DeltaTable], sql: str) -> pa.RecordBatchReader:
    """Plan one DataFusion SQL statement over ``tables`` (registered under their keys).

    Raises `LakeRequestError` for a statement that does not plan (syntax, unknown
    column, types) and `LakeReadError` when the storage cannot be read. Read the
    result with `read_batches`.
    """
    builder = QueryBuilder()
    for name, delta in tables.items():
        builder.register(name, delta)
    try:
        return pa.RecordBatchReader.from_stream(builder.execute(sql))
    except DeltaError as e:
        raise LakeRequestError(one_line(e)) from e
    except OSError as e:
        raise LakeReadError(one_line(e)) from e


def read_batches(reader: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
    """The batches of a planned statement, as they are computed."""
    while True:
        try:
            yield reader.read_next_batch()
        except StopIteration:
            return
        except (DeltaError, OSError) as e:
            raise LakeReadError(one_line(e)) from e


def run_sql(tables: Mapping[str, DeltaTable], sql: str) -> pa.Table:
    """The whole result of one DataFusion SQL statement over ``tables`` (see `open_sql`)."""
    reader = open_sql(tables, sql)
    return pa.Table.from_batches(list(read_batches(reader)), schema=reader.schema)


def one_line(error: BaseException) -> str:
    """delta-rs's multi-line, coloured error text as one plain line."""
    text = _ANSI.sub("", str(error)).replace("↳", " ")
    return " ".join(text.split())[:400] or type(error).__name__


def plain(value: Any) -> Any:
    """A value read from Arrow as plain JSON data, rendered as every format prints it."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, datetime):
        text = value.isoformat()
        return text.removesuffix("+00:00") + "Z" if text.endswith("+00:00") else text
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return str(value)
