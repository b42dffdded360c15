"""Kafka offsets a checkpoint still has to read that the brokers no longer have.

At start, before any query runs, each ingest checkpoint's next offsets are compared
with the brokers' earliest and end offsets, per topic partition:

- **expired**: the next offset is below the earliest one the broker keeps. Retention
  (or DeleteRecords) removed records that were never read.
- **rewound**: the next offset is beyond the partition's end (its high watermark), or
  the partition is gone. The topic was deleted and recreated (or truncated); its
  offsets start again and would reuse coordinates bronze already holds.
- **past the stable offset** (read_committed): the next offset lies beyond the last
  stable offset but within the log: a transaction is still open there, and the
  checkpoint read into it uncommitted (an earlier release, or read_uncommitted before).
  Spark's source would fail on it as lost data; it resolves itself once the
  transaction ends, so the start is refused (exit 3) with that said.

Any of them refuses to start (exit 3, `KafkaOffsetsLostError`) with the topic, partition
and offsets (runbook KafkaOffsetsLost). With ``INGEST_KAFKA_SKIP_LOST_OFFSETS`` an
expired range is skipped instead: one row per range in bronze/skipped_offsets (which
reconcile accepts as a gap), a ``kafka_offsets_skipped`` log line, the
``kafka_offsets_skipped_total`` counter, and that query reads from the earliest offset
(Spark's ``failOnDataLoss=false`` for this run). A rewound topic is always refused.
Without this check Spark's Kafka source fails the first batch with a generic error,
and the driver would crash at every restart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from service.errors import KafkaOffsetsLostError
from service.lake.checkpoints import CheckpointFiles, QueryTarget, read_checkpoint
from service.lake.local_rows import local_frame
from service.lake.schemas import SKIPPED_OFFSETS
from service.lake.tables import SKIPPED_OFFSETS_TABLE

log = structlog.get_logger(__name__)

RUNBOOK = "docs/runbooks/KafkaOffsetsLost.md"
SKIP_SETTING = "INGEST_KAFKA_SKIP_LOST_OFFSETS"


@dataclass(frozen=True)
class LostOffsets:
    """One topic partition whose next offset (from ``query``'s checkpoint) the brokers
    no longer have: they keep ``earliest`` up to ``end`` (exclusive)."""

    query: str
    topic: str
    partition: int
    next_offset: int
    earliest: int
    end: int
    # The last stable offset, when a read-committed reader's end is below ``end``.
    stable: int | None = None

    @property
    def rewound(self) -> bool:
        """Whether the partition's offsets went back (the topic was recreated)."""
        return self.next_offset > self.end

    @property
    def past_stable(self) -> bool:
        """Whether the next offset lies inside a transaction that is still open."""
        return self.stable is not None and self.stable < self.next_offset <= self.end

    @property
    def refused(self) -> bool:
        """Whether no setting lets the driver start past it."""
        return self.rewound or self.past_stable

    @property
    def count(self) -> int:
        """How many offsets an expired range holds."""
        return self.earliest - self.next_offset

    def describe(self) -> str:
        """One sentence for the log and the exit message."""
        where = f"topic {self.topic} partition {self.partition}"
        if self.past_stable:
            return (
                f"{where}: the checkpoint of {self.query} reads on from offset "
                f"{self.next_offset}, past the last stable offset {self.stable}: a "
                "transaction is still open there, and these offsets were read uncommitted "
                "(by an earlier release, or with INGEST_KAFKA_ISOLATION_LEVEL=read_uncommitted)."
                " Start again once it ends: the producer commits or aborts it, or the broker"
                " aborts it after the producer's transaction.timeout.ms"
            )
        if self.rewound:
            return (
                f"{where}: the checkpoint of {self.query} reads on from offset "
                f"{self.next_offset} but the partition ends at {self.end} (the topic was "
                "deleted and recreated, or truncated; its new records would reuse offsets "
                "bronze already holds)"
            )
        return (
            f"{where}: offsets {self.next_offset}-{self.earliest - 1} ({self.count}) are no "
            f"longer in Kafka (the broker keeps {self.earliest} onwards; retention or "
            f"DeleteRecords removed them before {self.query} read them)"
        )


def find_lost(
    query: QueryTarget,
    next_offsets: Mapping[int, int],
    broker: Mapping[int, tuple[int, int]],
    stable: Mapping[int, int] | None = None,
) -> list[LostOffsets]:
    """The partitions of ``query``'s topic whose checkpointed next offset the brokers
    (``{partition: (earliest, end)}``, ``end`` the high watermark) no longer have, or that
    lies past the partition's last ``stable`` offset (read_committed), by partition (pure)."""
    lost = []
    for partition, next_offset in sorted(next_offsets.items()):
        earliest, end = broker.get(partition, (0, 0))
        lso = (stable or {}).get(partition)
        found = LostOffsets(
            query.name, query.topic, partition, next_offset, earliest, end,
            lso if lso is not None and lso < end else None,
        )  # fmt: skip
        if next_offset < earliest or found.rewound or found.past_stable:
            lost.append(found)
    return lost


def check_lost_offsets(
    queries: Sequence[QueryTarget],
    files: CheckpointFiles,
    broker_offsets: Callable[[list[str]], Mapping[str, Any]],
    skip: bool,
    stable_offsets: Callable[[list[str]], Mapping[str, Any]] | None = None,
) -> list[LostOffsets]:
    """The expired ranges to skip (empty when nothing is lost); raise
    `KafkaOffsetsLostError` for any loss ``skip`` does not cover.

    ``broker_offsets`` gives each partition's (earliest, high watermark),
    ``stable_offsets`` (read_committed) its (earliest, last stable offset). A checkpoint
    with no committed batch has nothing to lose. Brokers that cannot be asked leave the
    check to Spark's source, which fails on lost offsets itself.
    """
    committed = {
        q: read_checkpoint(files, q.checkpoint).kafka_offsets.get(q.topic) for q in queries
    }
    asked = [q for q, offsets in committed.items() if offsets]
    if not asked:
        return []
    topics = sorted({q.topic for q in asked})
    offsets = broker_offsets(topics)
    stable = stable_offsets(topics) if stable_offsets is not None else {}
    if "_error" in offsets or "_error" in stable:
        log.warning("kafka_offsets_unchecked", error=offsets.get("_error", stable.get("_error")))
        return []
    lost = []
    for query in asked:
        by_partition = offsets.get(query.topic) or {}
        if not by_partition:  # the topic is gone: Spark's source reports it
            continue
        ends = {p: high for p, (_, high) in (stable.get(query.topic) or {}).items()}
        lost += find_lost(query, committed[query] or {}, by_partition, ends)
    refused = [lost_range for lost_range in lost if lost_range.refused or not skip]
    if refused:
        hint = (
            ""
            if any(r.refused for r in refused)
            else f" To start past them, set {SKIP_SETTING}=true: the ranges are recorded in"
            f" {SKIPPED_OFFSETS_TABLE.name}."
        )
        raise KafkaOffsetsLostError(
            "Kafka no longer has offsets this lake has not read: "
            + "; ".join(r.describe() for r in refused)
            + f". Refusing to start.{hint} See {RUNBOOK}."
        )
    return lost


def skipped_rows(
    lost: Sequence[LostOffsets], recorded: set[tuple[str, int, int, int]]
) -> list[dict[str, Any]]:
    """Rows of bronze/skipped_offsets for ``lost`` (but ``skipped_at``), less those already
    ``recorded`` as (topic, partition, first, last): a driver killed before its first
    batch committed finds, and records, the same range again."""
    rows = []
    for r in lost:
        key = (r.topic, r.partition, r.next_offset, r.earliest - 1)
        if key not in recorded:
            columns = ("kafka_topic", "kafka_partition", "first_offset", "last_offset")
            rows.append(
                dict(zip(columns, key, strict=True))
                | {"offsets": r.count, "query": r.query, "reason": r.describe()}
            )
    return rows


def record_skipped(
    spark: SparkSession, storage_uri: str, lost: Sequence[LostOffsets], fence: Callable[[], None]
) -> None:
    """Append ``lost`` to bronze/skipped_offsets (the driver holds the lease) and log each."""
    uri = SKIPPED_OFFSETS_TABLE.uri(storage_uri)
    table = spark.read.format("delta").load(uri)
    recorded = {
        (r.kafka_topic, r.kafka_partition, r.first_offset, r.last_offset)
        for r in table.select("kafka_topic", "kafka_partition", "first_offset", "last_offset")
        .where(F.col("kafka_topic").isin(sorted({x.topic for x in lost})))
        .collect()
    }
    rows = skipped_rows(lost, recorded)
    if rows:
        without_time = StructType([f for f in SKIPPED_OFFSETS.fields if f.name != "skipped_at"])
        frame = local_frame(
            spark, [tuple(row[f.name] for f in without_time.fields) for row in rows], without_time
        ).withColumn("skipped_at", F.current_timestamp())
        fence()
        frame.select(*SKIPPED_OFFSETS.fieldNames()).write.format("delta").mode("append").save(uri)
    for r in lost:
        log.warning(
            "kafka_offsets_skipped",
            query=r.query,
            topic=r.topic,
            partition=r.partition,
            first_offset=r.next_offset,
            last_offset=r.earliest - 1,
            offsets=r.count,
            setting=SKIP_SETTING,
            table=SKIPPED_OFFSETS_TABLE.name,
        )
