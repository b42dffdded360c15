"""`lakehouse-ingest migrate`: upgrade tables written by an earlier layout, in place.

The one earlier layout is bronze and quarantine with ``key``/``value`` as STRING
(before the contract made them the exact bytes, BINARY, with text views). Each
such table is rewritten by one Delta overwrite commit: its rows, Kafka
coordinates and ``txn`` records (the exactly-once bookkeeping) stay, so the
checkpoints still agree with it. A table created before one of its declared
Delta properties (`service.lake.tables`, e.g. which columns get file statistics)
gets it by one metadata commit, which rewrites no data. It runs under the
driver lease: never beside a running driver.
"""

from __future__ import annotations

import structlog
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from service.config import Settings
from service.errors import TableLayoutError
from service.ingest.bronze import raw_from_text
from service.lake.lease import acquire_driver_lease
from service.lake.tables import QUARANTINE_TABLE, Table, catalogue_of
from service.streaming.session import build_spark

log = structlog.get_logger(__name__)

_TEXT_LAYOUT = {"key": "string", "value": "string"}


def migrate(settings: Settings) -> list[str]:
    """The ``migrate`` verb: under the driver lease, upgrade what needs it; return its names."""
    spark = build_spark(settings, "lakehouse-ingest-migrate", jvm_log_target="SYSTEM_ERR")
    lease = acquire_driver_lease(settings)  # renewing: a large rewrite outlasts the TTL
    try:
        return migrate_tables(spark, settings)
    finally:
        lease.release()


def migrate_tables(spark: SparkSession, settings: Settings) -> list[str]:
    """Upgrade every table of an earlier layout or properties; return the names of those changed."""
    migrated = []
    catalogue = catalogue_of(settings.contracts)
    # The tables that keep raw records: every bronze table, and the quarantine.
    raw = {*(catalogue.of(c.name).bronze.name for c in settings.contracts), QUARANTINE_TABLE.name}
    for table in catalogue.tables:
        uri = table.uri(settings.storage_uri)
        if not DeltaTable.isDeltaTable(spark, uri):
            continue
        rewritten = table.name in raw and _upgrade(spark, table, uri)
        if _set_properties(spark, table, uri) or rewritten:
            migrated.append(table.name)
    return migrated


def _set_properties(spark: SparkSession, table: Table, uri: str) -> bool:
    """Set ``table``'s declared properties the table lacks (or holds other values of)."""
    current = DeltaTable.forPath(spark, uri).detail().first()
    configuration = dict(current["properties"]) if current is not None else {}
    missing = {k: v for k, v in table.properties.items() if configuration.get(k) != v}
    if not missing:
        return False
    assignments = ", ".join(f"'{k}' = '{v}'" for k, v in sorted(missing.items()))
    path = uri.replace("`", "``")
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({assignments})")
    log.info("table_properties_set", table=table.name, uri=uri, properties=missing)
    return True


def _upgrade(spark: SparkSession, table: Table, uri: str) -> bool:
    current = spark.read.format("delta").load(uri)
    schema = table.schema
    if schema is None or not table.layout_differences(current.schema):
        return False
    kinds = {f.name: f.dataType.simpleString() for f in current.schema.fields}
    if any(kinds.get(name) != kind for name, kind in _TEXT_LAYOUT.items()):
        raise TableLayoutError(
            f"{table.name} at {uri}: no migration from this layout "
            f"({'; '.join(table.layout_differences(current.schema))})"
        )
    version = DeltaTable.forPath(spark, uri).history(1).collect()[0]["version"]
    upgraded = raw_from_text(current).select(*schema.fieldNames())
    (upgraded.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(uri))
    log.info("table_migrated", table=table.name, uri=uri, from_version=version)
    return True
