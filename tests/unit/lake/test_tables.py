"""The table catalogue: one entry per table, usable as set members and dict keys."""

from __future__ import annotations

from service.gold.queries import gold_queries
from service.ingest.query import IngestQuery
from service.lake.tables import OPERATOR_TABLES, SHIPPED, QuerySpec


def test_every_table_is_catalogued_once_and_every_query_writes_catalogued_tables() -> None:
    queries: list[QuerySpec] = [
        *(IngestQuery(c) for c in SHIPPED.contracts),
        *gold_queries(),
    ]
    written = {t for q in queries for t in q.tables}

    tables = SHIPPED.tables
    assert len(tables) == len(set(tables)) == len({t.name for t in tables})
    assert set(tables) == written | set(OPERATOR_TABLES)
    assert set() == written & set(OPERATOR_TABLES)
