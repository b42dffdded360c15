"""The table catalogue: one entry per table, usable as set members and dict keys."""

from __future__ import annotations

from service.gold.queries import gold_queries
from service.ingest.query import IngestQuery
from service.lake.tables import ALL_TABLES, OPERATOR_TABLES, QuerySpec


def test_every_table_is_catalogued_once_and_every_query_writes_catalogued_tables() -> None:
    queries: list[QuerySpec] = [
        IngestQuery("ingest_users", "u", "users"),
        IngestQuery("ingest_sensors", "s", "sensors"),
        *gold_queries(),
    ]
    written = {t for q in queries for t in q.tables}

    assert len(ALL_TABLES) == len(set(ALL_TABLES)) == len({t.name for t in ALL_TABLES})
    assert set(ALL_TABLES) == written | set(OPERATOR_TABLES)
    assert set() == written & set(OPERATOR_TABLES)
