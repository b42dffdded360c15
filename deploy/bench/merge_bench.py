"""A small users batch's MERGE alone: Delta's MERGE against the rewrite of the touched files.

``python deploy/bench/merge_bench.py [--users N] [--changes C] [--rounds K]`` writes N
users into two silver/users tables, then merges K batches of C changed users into each,
in turn, on a local[2] session configured as the service's, adaptive execution off as in
an ingest batch (a warm driver, nothing else running): one table by Delta's MERGE, the
other by the rewrite of the files that hold the batch's keys (what a driver's small batch
takes, `merge_once`'s ``touching``: one Spark job into a table of at most
`service.lake.merge.ONE_PASS_BYTES`, two into a larger one). It prints each path's p50,
least and greatest time per MERGE (the first round of each excluded: its code
generation) and fails unless the two tables end equal.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from local_session import local_session
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from service.ingest.bronze import to_records
from service.ingest.modes import parse_records
from service.ingest.modes.dedup import id_hash_in, valid_hash
from service.ingest.modes.entities import Entities
from service.ingest.validation import DEFAULT_MAX_PAYLOAD_BYTES, split_valid_invalid
from service.lake.delta import ensure_table
from service.lake.merge import merge_once
from service.lake.object_files import ObjectFiles
from service.lake.schemas import INGESTED_AT
from service.lake.tables import SHIPPED, USERS

_KAFKA_SOURCE = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, headers array<struct<key: string, value: binary>>"
)
_CONTRACT = SHIPPED.contracts["users"]


def _changes(spark: SparkSession, users: Sequence[int], batch: int) -> tuple[DataFrame, set[int]]:
    """Batch ``batch``'s valid changes of ``users`` (cached) and their keys' hashes."""
    now = datetime.now(UTC)
    rows = [
        (
            str(user).encode(),
            json.dumps(
                {
                    "user_id": user,
                    "first_name": f"name-{batch}",
                    "last_name": "Lovelace",
                    "updated_at": f"2024-04-01T00:00:{batch % 60:02d}Z",
                }
            ).encode(),
            "users",
            0,
            batch * 1_000_000 + i,
            now,
            None,
        )
        for i, user in enumerate(users)
    ]
    records = to_records(spark.createDataFrame(rows, _KAFKA_SOURCE)).withColumn(
        INGESTED_AT.name, F.lit(now)
    )
    parsed = parse_records(_CONTRACT, records, DEFAULT_MAX_PAYLOAD_BYTES, None)
    valid, _ = split_valid_invalid(parsed)
    valid = valid.persist()
    keys = {r.h for r in valid.select(valid_hash(_CONTRACT, "user_id").alias("h")).collect()}
    return valid, keys


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)

    root, settings, spark = local_session("merge-bench-")
    # As a driver's ingest batch runs (`service.ingest.writer`): without adaptive execution.
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    files = ObjectFiles(settings)
    mode = Entities(_CONTRACT)
    uris = {path: f"file:{root}/{path}/silver/users" for path in ("delta-merge", "touched")}
    valid, _ = _changes(spark, range(1, args.users + 1), 0)
    for uri in uris.values():
        ensure_table(files, uri, USERS)
        merge_once(mode.latest_changes(valid), uri, "bench", 0, mode.merge_clauses())
    valid.unpersist()
    times: dict[str, list[float]] = {path: [] for path in uris}
    for batch in range(1, args.rounds + 1):
        first = (batch * 37) % max(1, args.users - args.changes) + 1
        valid, keys = _changes(spark, range(first, first + args.changes), batch)
        for path, uri in uris.items():
            touching = id_hash_in("user_id", keys) if path == "touched" else None
            start = time.perf_counter()
            merge_once(
                mode.latest_changes(valid), uri, "bench", batch, mode.merge_clauses(), touching
            )
            times[path].append(time.perf_counter() - start)
        valid.unpersist()
    tables = [
        sorted(tuple(r) for r in spark.read.format("delta").load(uri).collect())
        for uri in uris.values()
    ]
    for path, runs in times.items():
        warm = runs[1:] or runs
        print(
            f"{path:12s} p50 {statistics.median(warm):5.2f} s  least {min(warm):5.2f} s"
            f"  greatest {max(warm):5.2f} s  ({len(warm)} merges of {args.changes} users"
            f" into {args.users})",
            flush=True,
        )
    print("tables equal" if tables[0] == tables[1] else "TABLES DIFFER", flush=True)
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)
    return 0 if tables[0] == tables[1] else 1


if __name__ == "__main__":
    raise SystemExit(main())
