"""Drop repeated events: the same id (an events contract's ``id``) seen again within the dedup
horizon.

Arrival time is ``kafka_timestamp``. An event is a duplicate when an earlier
event with its id arrived at most ``horizon_seconds`` before it,
either earlier in the same micro-batch or in silver already. A silver row at the
reading's own Kafka coordinates is the reading itself (a micro-batch replayed
after a crash), never its duplicate, so replays classify every record the same way.

The search runs on the key columns only (event id, Kafka coordinates): its
shuffles move a few dozen bytes a reading, not whole readings, and the readings
themselves are filtered only when the batch has duplicates at all. It first
narrows the readings to the event ids whose 64-bit hash is seen at two Kafka
coordinates or more (`duplicate_candidates`, one hash aggregation on a number, not
on the id's text; a collision only adds a candidate); the windows and the join
that decide, on the ids themselves, which of them repeat what run on those few
rows only, and not at all when there are none (the usual batch): the search then
ends after that one aggregation. A driver's small batch comes with its candidates
already (`service.ingest.modes.recent_ids`): the aggregation is skipped.
"""

from __future__ import annotations

from collections.abc import Collection

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from service.contracts.model import Contract
from service.lake.local_rows import local_frame
from service.lake.schemas import silver_schema

_ORDER = ("kafka_timestamp", "kafka_partition", "kafka_offset")
_COORDINATES = ("kafka_partition", "kafka_offset")
# The event id's 64-bit hash, which the candidates are found by.
ID_HASH = "_event_id_hash"
_ID_HASHES = StructType([StructField(ID_HASH, LongType(), nullable=False)])
# Event ids (their hashes) a driver broadcasts for one search at most (a hash relation of
# a million 64-bit keys: tens of MB).
BROADCAST_IDS = 1_000_000
# Candidate ids a driver collects and hands back as a local relation at most; more are
# computed again within the search's plan.
LOCAL_IDS = 10_000
# Id hashes or Kafka coordinates a plan names in an IN set at most, where it would
# otherwise broadcast a relation of them: a broadcast costs a Spark job of its own.
IN_SET = 1_000


def find_duplicates(
    readings: DataFrame,
    recent_silver: DataFrame,
    horizon_seconds: int,
    rows: int,
    id_column: str,
    schema: StructType,
    candidates: Collection[int] | None = None,
) -> DataFrame | None:
    """The duplicates table's rows (``schema``) of ``readings``: each repeat, what it repeats;
    None when no id's hash of ``readings`` is at two Kafka coordinates (no repeat can exist).

    ``recent_silver`` is the contract's silver table, ideally pruned to the arrival
    window ``[min arrival - horizon, max arrival]`` of ``readings``. A repeat names the
    earliest silver event it matches, else the previous one in the batch. ``rows`` is
    the number of ``readings``: up to `BROADCAST_IDS` the batch's ids are broadcast
    (neither silver nor the batch is shuffled) and the candidates' hashes are collected
    first (one Spark job; None when there are none); beyond it (a large replay), Spark plans
    the joins by its own estimates. ``id_column`` is renamed ``event_id`` while searching.

    ``candidates``, when given, are id hashes that include every repeat's (`RecentIds`
    knows them in the driver): the search narrows to them without finding its own (no job
    before the search itself), and does not run without any. Up to `IN_SET` candidates,
    given or collected, are named in the search's plan, more are broadcast.
    """
    readings = with_id_hash(readings.withColumnRenamed(id_column, "event_id"))
    recent_silver = with_id_hash(recent_silver.withColumnRenamed(id_column, "event_id"))
    spark = readings.sparkSession
    narrowed: Collection[int] | DataFrame
    if candidates is not None:
        if not candidates:
            return None
        narrowed = _hashes(spark, candidates)
    else:
        # Silver's rows whose id's hash the batch has, then the hashes at two coordinates.
        share = rows <= BROADCAST_IDS
        batch_ids = readings.select(ID_HASH)
        recent_silver = recent_silver.join(
            F.broadcast(batch_ids) if share else batch_ids, ID_HASH, "left_semi"
        )
        narrowed = duplicate_candidates(readings, recent_silver)
        if share:
            ids = narrowed.limit(LOCAL_IDS + 1).collect()
            if not ids:
                return None
            if len(ids) <= LOCAL_IDS:
                narrowed = _hashes(spark, [r[ID_HASH] for r in ids])
            else:
                narrowed = F.broadcast(narrowed)
    return _search(readings, recent_silver, narrowed, horizon_seconds, id_column, schema)


def _hashes(spark: SparkSession, hashes: Collection[int]) -> Collection[int] | DataFrame:
    """Candidate ``hashes`` as `_search` narrows to them: up to `IN_SET` as they are, more
    as a broadcast local relation."""
    if len(hashes) <= IN_SET:
        return hashes
    return F.broadcast(local_frame(spark, [(h,) for h in hashes], _ID_HASHES))


def _search(
    readings: DataFrame,
    recent_silver: DataFrame,
    candidates: Collection[int] | DataFrame,
    horizon_seconds: int,
    id_column: str,
    schema: StructType,
) -> DataFrame:
    """`find_duplicates`'s search among the rows whose `ID_HASH` ``candidates`` holds
    (hashes, or a relation of them)."""
    if isinstance(candidates, DataFrame):
        readings = readings.join(candidates, ID_HASH, "left_semi")
        recent_silver = recent_silver.join(candidates, ID_HASH, "left_semi")
    else:
        readings = readings.where(in_set(ID_HASH, candidates))
        recent_silver = recent_silver.where(in_set(ID_HASH, candidates))
    keys = readings.select("event_id", "kafka_topic", *_ORDER, "ingested_at")
    earlier_in_batch = Window.partitionBy("event_id").orderBy(*_ORDER)
    horizon = F.expr(f"INTERVAL {int(horizon_seconds)} SECONDS")
    ranked = keys.withColumn(
        "_previous", F.lag(F.struct(*_ORDER)).over(earlier_in_batch)
    ).withColumn(
        "_repeat_in_batch",
        F.col("_previous").isNotNull()
        & (F.col("kafka_timestamp") <= F.col("_previous.kafka_timestamp") + horizon),
    )
    seen = recent_silver.select(
        F.col("event_id").alias("_seen_event_id"),
        F.struct(*_ORDER).alias("_seen"),
    )
    matched = ranked.join(
        seen,
        (F.col("_seen_event_id") == F.col("event_id"))
        & (F.col("_seen.kafka_timestamp") <= F.col("kafka_timestamp"))
        & (F.col("_seen.kafka_timestamp") >= F.col("kafka_timestamp") - horizon)
        & (
            (F.col("_seen.kafka_partition") != F.col("kafka_partition"))
            | (F.col("_seen.kafka_offset") != F.col("kafka_offset"))
        ),
        "left",
    )
    # A reading may match several silver rows; keep one row per reading, the earliest match.
    first_match = Window.partitionBy(*_ORDER, "event_id").orderBy(F.col("_seen").asc_nulls_last())
    original = F.when(F.col("_seen").isNotNull(), F.col("_seen")).when(
        F.col("_repeat_in_batch"), F.col("_previous")
    )
    return (
        matched.withColumn("_n", F.row_number().over(first_match))
        .where(F.col("_n") == 1)
        .withColumn("_original", original)
        .where(F.col("_original").isNotNull())
        .select(
            "event_id",
            "kafka_topic",
            "kafka_partition",
            "kafka_offset",
            "kafka_timestamp",
            "ingested_at",
            F.col("_original.kafka_partition").alias("original_kafka_partition"),
            F.col("_original.kafka_offset").alias("original_kafka_offset"),
        )
        .withColumnRenamed("event_id", id_column)
        .select([F.col(f.name).cast(f.dataType) for f in schema.fields])
    )


def in_set(column: str, values: Collection[int]) -> Column:
    """Whether the 64-bit integer ``column`` is one of ``values`` (non-empty): one SQL
    expression, which Spark parses at once where a Python ``isin`` makes a py4j call per
    value."""
    return _in(f"`{column}`", values)


def id_hash_in(column: str, hashes: Collection[int]) -> Column:
    """Whether the `id_hash` of ``column`` is one of ``hashes`` (non-empty), as `in_set`."""
    return _in(f"xxhash64(`{column}`)", hashes)


def _in(expression: str, values: Collection[int]) -> Column:
    return F.expr(f"{expression} IN ({', '.join(f'{int(v)}L' for v in sorted(values))})")


def id_hash(column: str | Column) -> Column:
    """The 64-bit hash of the event id in ``column`` (of silver's type): what dedup's
    candidates and the recent ids (`service.ingest.modes.recent_ids`) are found by;
    computed by Spark, so no id leaves the JVM."""
    return F.xxhash64(column)


def valid_hash(contract: Contract, field: str) -> Column:
    """Over a validated row (`OUTCOME`, the fast path's record or the exact checks'): the
    `id_hash` of its record's ``field`` as silver holds it (an event id, an entity's key)
    when it is valid, else null."""
    silver_type = silver_schema(contract)[field].dataType
    valid = F.col("error_code").isNull()
    return F.when(valid, id_hash(F.col("record")[field].cast(silver_type)))


def with_id_hash(rows: DataFrame) -> DataFrame:
    """``rows`` with `ID_HASH`, the `id_hash` of their ``event_id``."""
    return rows.withColumn(ID_HASH, id_hash("event_id"))


def duplicate_candidates(readings: DataFrame, recent_silver: DataFrame) -> DataFrame:
    """The `ID_HASH`es of ``readings`` that ``readings`` and ``recent_silver`` (both
    `with_id_hash`) together hold at two Kafka coordinates or more: the hash of every id
    `find_duplicates` can report, of those of repeats beyond the horizon, and of ids
    that share a hash. One hash aggregation on a 64-bit key, no sort; usually empty.

    A hash's coordinates are not all one exactly when its partitions' or its offsets'
    least and greatest differ: the aggregation keeps four numbers and a flag per hash,
    which Spark's hash aggregation holds in place (the least and greatest *pair*, a
    struct, made it sort every row of the batch and the horizon by id, twice).
    """
    columns = [ID_HASH, *_COORDINATES]
    rows = readings.select(*columns, F.lit(True).alias("_batch")).unionByName(
        recent_silver.select(*columns, F.lit(False).alias("_batch"))
    )
    spread = [F.min(c) != F.max(c) for c in _COORDINATES]
    return (
        rows.groupBy(ID_HASH)
        .agg(F.max("_batch").alias("_in"), (spread[0] | spread[1]).alias("_spread"))
        .where(F.col("_in") & F.col("_spread"))
        .select(ID_HASH)
    )


def without_duplicates(
    readings: DataFrame,
    duplicates: DataFrame,
    coordinates: Collection[tuple[int, int]] | None = None,
) -> DataFrame:
    """``readings`` but the ones at the Kafka coordinates of ``duplicates`` (`find_duplicates`).

    Given those ``coordinates`` (partition, offset), up to `IN_SET` of them, the readings
    are filtered by IN sets; else ``duplicates`` is broadcast (a Spark job of its own): it
    is at most one batch's key columns.
    """
    if coordinates is not None and len(coordinates) <= IN_SET:
        offsets: dict[int, list[int]] = {}
        for partition, offset in coordinates:
            offsets.setdefault(partition, []).append(offset)
        repeat = F.lit(False)
        for partition, at in sorted(offsets.items()):
            repeat |= (F.col("kafka_partition") == partition) & in_set("kafka_offset", at)
        return readings.where(~repeat)
    repeats = F.broadcast(duplicates.select(*[F.col(c).alias(f"_dup_{c}") for c in _COORDINATES]))
    same = [F.col(c) == F.col(f"_dup_{c}") for c in _COORDINATES]
    return readings.join(repeats, same[0] & same[1], "left_anti").select(*readings.columns)
