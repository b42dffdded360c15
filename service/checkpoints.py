"""What a streaming checkpoint records, and whether the tables it protects agree.

Exactly-once rests on two records agreeing: the checkpoint's commit log (which
batches are done) and each Delta table's ``txn`` action for the query's app id
(which batches were written). The app id is derived from the query id that
Spark stores in the checkpoint's ``metadata`` file, so it lives exactly as long
as the checkpoint. Before a query starts, `verify_checkpoint_matches_tables`
refuses the two states that would otherwise silently lose or duplicate data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from service.errors import CheckpointMismatchError
from service.hadoop_fs import HadoopFiles

APP_ID_PREFIX = "lakehouse-ingest"


@dataclass(frozen=True)
class CheckpointState:
    """The parts of a streaming checkpoint that exactly-once depends on."""

    uri: str
    query_id: str | None
    last_committed_batch: int | None


def app_id(query_name: str, query_id: str) -> str:
    """Delta ``txnAppId`` of a query: stable for the life of its checkpoint."""
    return f"{APP_ID_PREFIX}:{query_name}:{query_id}"


def read_checkpoint(files: HadoopFiles, uri: str) -> CheckpointState:
    """Read the query id and the last committed batch id of the checkpoint at ``uri``."""
    metadata = files.read_text(f"{uri}/metadata")
    query_id = json.loads(metadata)["id"] if metadata else None
    batches = [int(n) for n in files.list_names(f"{uri}/commits") if n.isdigit()]
    return CheckpointState(uri, query_id, max(batches) if batches else None)


def verify_checkpoint_matches_tables(
    query_name: str,
    checkpoint: CheckpointState,
    table_txns: Mapping[str, Mapping[str, int] | None],
) -> None:
    """Raise `CheckpointMismatchError` unless every table agrees with ``checkpoint``.

    ``table_txns`` maps each table URI the query writes to its Delta ``txn`` versions
    by app id, or to None when the table does not exist.
    """
    prefix = f"{APP_ID_PREFIX}:{query_name}:"
    committed = checkpoint.last_committed_batch
    own = app_id(query_name, checkpoint.query_id) if checkpoint.query_id else None
    for table, txns in sorted(table_txns.items()):
        foreign = sorted(a for a in (txns or {}) if a.startswith(prefix) and a != own)
        if committed is None and foreign:
            raise CheckpointMismatchError(
                f"checkpoint {checkpoint.uri} is new or empty, but table {table} already holds "
                f"batches written under another checkpoint ({foreign[-1]}). Starting would "
                "replay Kafka into duplicates. Restore the original checkpoint, or delete the "
                "checkpoint and every table of this query to rebuild from Kafka "
                "(see docs/runbooks/CheckpointMismatch.md)."
            )
        if committed is None:
            continue
        written = (txns or {}).get(own or "")
        if written is None or written < committed:
            state = "does not exist" if txns is None else f"has txn version {written} for it"
            raise CheckpointMismatchError(
                f"checkpoint {checkpoint.uri} records batch {committed} of query {query_name} "
                f"as committed, but table {table} {state}: the table was deleted or replaced "
                "after the checkpoint was written, and continuing would silently skip the data "
                "of the batches already committed. Restore the table (Delta time travel or a "
                "backup), or delete the checkpoint and every table of this query to rebuild "
                "from Kafka (see docs/runbooks/CheckpointMismatch.md)."
            )
