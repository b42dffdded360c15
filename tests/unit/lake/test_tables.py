"""The table catalogue: one entry per table, usable as set members and dict keys; the
tables written together checkpoint apart."""

from __future__ import annotations

from service.gold.queries import gold_queries
from service.ingest.query import IngestQuery
from service.lake.tables import (
    CHECKPOINT_INTERVAL,
    GOLD_TABLES,
    IN_COMMIT_CHECKPOINTS_OFF,
    OPERATOR_TABLES,
    SHIPPED,
    QuerySpec,
)


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


def test_the_tables_a_batch_writes_and_the_gold_tables_checkpoint_at_distinct_cadences() -> None:
    # Each ingest query's tables, then gold's five (their queries trigger together).
    groups = [q.tables for q in (IngestQuery(c) for c in SHIPPED.contracts)] + [GOLD_TABLES]
    for tables in groups:
        staggers = [t.checkpoint_stagger for t in tables]
        assert len(set(staggers)) == len(staggers), [t.name for t in tables]
        assert min(staggers) == 0  # the anchor: INGEST_DELTA_CHECKPOINT_COMMITS, as Delta's 10
        # The driver writes them (service.lake.log_checkpoints), never a commit.
        assert {IN_COMMIT_CHECKPOINTS_OFF} == {t.properties[CHECKPOINT_INTERVAL] for t in tables}
