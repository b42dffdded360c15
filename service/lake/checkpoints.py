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
from dataclasses import dataclass, field
from typing import Protocol

from service.errors import CheckpointCorruptError, CheckpointMismatchError

APP_ID_PREFIX = "lakehouse-ingest"
# Our file in a checkpoint: the version of the query's plan its state was started with.
PLAN_FILE = "lakehouse-ingest-plan"


class CheckpointFiles(Protocol):
    """The file reads a checkpoint needs (`service.lake.hadoop_fs.HadoopFiles` in the driver)."""

    def read_text(self, uri: str) -> str | None: ...
    def list_names(self, uri: str) -> list[str]: ...


class PlanFiles(CheckpointFiles, Protocol):
    """What `checkpoint_plan` needs: the reads, and writing the plan file."""

    def write_text(self, uri: str, text: str) -> None: ...


@dataclass(frozen=True)
class QueryTarget:
    """An ingest query's name, the topic it reads and its checkpoint URI."""

    name: str
    topic: str
    checkpoint: str


@dataclass(frozen=True)
class CheckpointState:
    """What a streaming checkpoint records: its query id, committed and planned batches.

    ``kafka_offsets`` are the next offsets to read per topic and partition after the
    last committed batch (empty for other sources); ``batch_timestamp_ms`` is that
    batch's trigger time.
    """

    uri: str
    query_id: str | None = None
    last_committed_batch: int | None = None
    planned_batch: int | None = None
    batch_timestamp_ms: int | None = None
    kafka_offsets: dict[str, dict[int, int]] = field(default_factory=dict)


def app_id(query_name: str, query_id: str) -> str:
    """Delta ``txnAppId`` of a query: stable for the life of its checkpoint."""
    return f"{APP_ID_PREFIX}:{query_name}:{query_id}"


def read_checkpoint(files: CheckpointFiles, uri: str) -> CheckpointState:
    """Read the checkpoint at ``uri``: Spark's ``metadata``, ``commits/`` and ``offsets/`` logs.

    An offsets file is ``v1``, the batch metadata, then one JSON line per source
    (Kafka's: ``{topic: {partition: next offset}}``); a commit file is ``v1`` and
    one JSON line. A file Spark would need to restart from (``metadata``, the last
    commit, the offsets of the last committed and of a planned batch) that is
    missing, truncated or does not parse raises `CheckpointCorruptError` naming it.
    """
    metadata = files.read_text(f"{uri}/metadata")
    query_id = _query_id(f"{uri}/metadata", metadata) if metadata is not None else None
    commits = sorted(int(n) for n in files.list_names(f"{uri}/commits") if n.isdigit())
    planned = sorted(int(n) for n in files.list_names(f"{uri}/offsets") if n.isdigit())
    if planned and (not commits or planned[-1] > commits[-1]):
        _log_entry(files, f"{uri}/offsets/{planned[-1]}")
    if not commits:
        return CheckpointState(uri, query_id, planned_batch=planned[-1] if planned else None)
    last = commits[-1]
    _log_entry(files, f"{uri}/commits/{last}")
    lines = _log_entry(files, f"{uri}/offsets/{last}")
    batch_meta = json.loads(lines[1])
    stamp = batch_meta.get("batchTimestampMs")
    return CheckpointState(
        uri,
        query_id,
        last_committed_batch=last,
        planned_batch=planned[-1] if planned and planned[-1] > last else None,
        batch_timestamp_ms=int(stamp) if isinstance(stamp, int | float) else None,
        kafka_offsets=_kafka_offsets(lines[2:]),
    )


def batch_end_offsets(files: CheckpointFiles, uri: str, batch_id: int) -> dict[str, dict[int, int]]:
    """Where batch ``batch_id`` of the checkpoint at ``uri`` ends (exclusive), per topic and
    partition: its ``offsets/`` entry, which Spark writes before the batch runs."""
    return _kafka_offsets(_log_entry(files, f"{uri}/offsets/{batch_id}")[2:])


def batch_start_offsets(
    files: CheckpointFiles, uri: str, batch_id: int
) -> dict[str, dict[int, int]]:
    """Where batch ``batch_id`` starts: the previous batch's end, or for batch 0 the Kafka
    source's initial offsets (a partition new since the previous batch is absent)."""
    if batch_id > 0:
        return batch_end_offsets(files, uri, batch_id - 1)
    # Spark's Kafka source records its resolved starting offsets there, behind a NUL
    # byte and a version line (KafkaSourceInitialOffsetWriter).
    initial = files.read_text(f"{uri}/sources/0/0")
    lines = initial.lstrip("\x00").splitlines() if initial is not None else []
    return _kafka_offsets(lines[1:]) if lines[:1] == ["v1"] else {}


class BatchRanges:
    """The offsets of one topic each batch of an ingest query covers, from its checkpoint.

    A batch starts where the previous one ended, so in a run of batches one file is
    read per batch. ``floors`` raise the start of partitions whose first offsets were
    skipped at this start (`service.kafka.lost_offsets`): those are recorded as skipped.
    """

    def __init__(
        self, files: CheckpointFiles, uri: str, topic: str, floors: Mapping[int, int]
    ) -> None:
        self._files = files
        self._uri = uri
        self._topic = topic
        self._floors = dict(floors)
        self._last: tuple[int, dict[int, int]] | None = None

    def of(self, batch_id: int) -> tuple[dict[int, int], dict[int, int]]:
        """(start, end) offsets per partition of batch ``batch_id``."""
        if self._last is not None and self._last[0] == batch_id - 1:
            start = self._last[1]
        else:
            start = batch_start_offsets(self._files, self._uri, batch_id).get(self._topic, {})
        end = batch_end_offsets(self._files, self._uri, batch_id).get(self._topic, {})
        self._last = (batch_id, end)
        return {p: max(o, self._floors.get(p, o)) for p, o in start.items()}, end


def checkpoint_plan(files: PlanFiles, uri: str, current: int) -> int:
    """The plan version (1 to ``current``) the stateful query checkpointed at ``uri`` runs.

    A plan that changes a query's state layout gets a new version; Spark refuses to
    restore state written by another layout. A new checkpoint records ``current`` in
    `PLAN_FILE` before Spark creates it; one Spark already created without that file
    was started by version 1; a recorded version is kept for the checkpoint's life,
    as Spark keeps its own state format versions in the offsets log.
    """
    if files.read_text(f"{uri}/metadata") is None:
        files.write_text(f"{uri}/{PLAN_FILE}", f"{current}\n")
        return current
    return recorded_plan(files, uri, current)


def recorded_plan(files: CheckpointFiles, uri: str, current: int) -> int:
    """The plan version of the checkpoint Spark created at ``uri`` (see `checkpoint_plan`:
    1 without a plan file). Reads only."""
    recorded = files.read_text(f"{uri}/{PLAN_FILE}")
    if recorded is None:
        return 1
    try:
        version = int(recorded.strip())
    except ValueError:
        raise _corrupt(f"{uri}/{PLAN_FILE}", "corrupt (not a plan version)") from None
    if not 1 <= version <= current:
        raise CheckpointMismatchError(
            f"checkpoint {uri} was started by plan version {version} of its query, but this "
            f"release knows versions 1 to {current}. Run the release that started it, or "
            "rebuild the query's table and checkpoint (docs/tables.md, Gold plan versions)."
        )
    return version


def _corrupt(file: str, what: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"checkpoint file {file} is {what}. Refusing to start: Spark would fail on it or "
        "lose its place in Kafka. See docs/runbooks/CheckpointCorrupt.md."
    )


def _query_id(file: str, text: str) -> str:
    try:
        return str(json.loads(text)["id"])
    except (ValueError, KeyError, TypeError):
        raise _corrupt(file, "truncated or corrupt (no JSON object with the query id)") from None


def _log_entry(files: CheckpointFiles, file: str) -> list[str]:
    """The lines of a ``v1`` log entry: the version, then JSON lines (``-``: no offset)."""
    text = files.read_text(file)
    if text is None:
        raise _corrupt(file, "missing")
    lines = text.splitlines()
    if len(lines) < 2 or lines[0] != "v1":
        raise _corrupt(file, "truncated or corrupt (not a v1 log entry)")
    for line in lines[1:]:
        if line.strip() in ("", "-"):
            continue
        try:
            json.loads(line)
        except ValueError:
            raise _corrupt(file, "truncated or corrupt (a line is not JSON)") from None
    return lines


def _kafka_offsets(source_lines: list[str]) -> dict[str, dict[int, int]]:
    offsets: dict[str, dict[int, int]] = {}
    for line in source_lines:
        source = json.loads(line) if line.strip() not in ("", "-") else None
        if not isinstance(source, dict):
            continue
        for topic, by_partition in source.items():  # Kafka's shape; other sources are skipped
            if isinstance(by_partition, dict) and all(str(p).isdigit() for p in by_partition):
                offsets[topic] = {int(p): int(o) for p, o in by_partition.items()}
    return offsets


def verify_checkpoint_matches_tables(
    query_name: str,
    checkpoint: CheckpointState,
    table_txns: Mapping[str, Mapping[str, int] | None],
    anchor: str,
) -> None:
    """Raise `CheckpointMismatchError` unless every table agrees with ``checkpoint``.

    ``table_txns`` maps each table URI the query writes to its Delta ``txn`` versions
    by app id, or to None when the table does not exist. The ``anchor`` table
    receives a commit every batch, so it must hold every committed batch; the
    others receive one only when a batch has rows for them, so they must exist
    but may have skipped batches.
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
        if committed is None or (table != anchor and txns is not None):
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
