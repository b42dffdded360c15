"""The lake's invariants (what `reconcile` checks), run by delta-rs on small hand-made local lakes
(no Spark); and `reconcile`'s `--since`."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from service.config import Settings
from service.errors import LakeRequestError
from service.lake.invariants import (
    Increment,
    Increments,
    OffsetRange,
    Reconciliation,
    reconcile,
)
from service.lake.lakeview import LakeReader
from service.verbs.reconcile import parse_since

T0 = datetime(2026, 1, 31, 12, 0, tzinfo=UTC)
Coordinate = tuple[int, int]  # (partition, offset); the topic is the table's


def coordinates(topic: str, coords: Iterable[Coordinate]) -> dict[str, pa.Array]:
    """Lineage columns; a record's Kafka timestamp is T0 + its offset in seconds."""
    items = sorted(coords)
    return {
        "kafka_topic": pa.array([topic] * len(items)),
        "kafka_partition": pa.array([p for p, _ in items], pa.int32()),
        "kafka_offset": pa.array([o for _, o in items], pa.int64()),
        "kafka_timestamp": pa.array(
            [T0 + timedelta(seconds=o) for _, o in items], pa.timestamp("us", tz="UTC")
        ),
    }


def offsets(partition: int, first: int, last: int) -> list[Coordinate]:
    return [(partition, o) for o in range(first, last + 1)]


def window(minute: int) -> dict[str, Any]:
    start = T0 + timedelta(minutes=minute)
    return {"window_start": start, "window_end": start + timedelta(minutes=1)}


GOOD: Mapping[str, Any] = {
    "bronze/sensors": offsets(0, 0, 9) + offsets(1, 0, 4),
    "silver/sensor_readings": offsets(0, 0, 6) + offsets(1, 0, 3),
    "quarantine/sensors": [(0, 7), (0, 8), (1, 4)],
    "silver/sensor_duplicates": [(0, 9)],
    "bronze/users": offsets(0, 0, 5),
    "silver/users": {1: (0, 3), 2: (0, 5)},
    "quarantine/users": [(0, 4)],
    "gold/sensor_stats_1m": [{**window(0), "device_id": "d1", "sensor_type": "heart_rate"},
                             {**window(1), "device_id": "d1", "sensor_type": "heart_rate"}],
    "gold/readings_enriched": offsets(0, 0, 6),
}  # fmt: skip


def build(root: Path, **changes: Any) -> LakeReader:
    """A lake of the `GOOD` tables with ``changes`` (key ``a__b`` is table ``a/b``; None drops
    the table)."""
    spec = {**GOOD, **{k.replace("__", "/"): v for k, v in changes.items()}}

    def write(name: str, columns: Mapping[str, Any]) -> None:
        write_deltalake(str(root / name), pa.table(dict(columns)))

    for name in ("bronze/sensors", "silver/sensor_readings", "silver/sensor_duplicates"):
        if spec[name] is not None:
            write(name, coordinates("sensors", spec[name]))
    if spec["bronze/users"] is not None:
        write("bronze/users", coordinates("users", spec["bronze/users"]))
    quarantine = [
        pa.table(coordinates(topic, spec[f"quarantine/{topic}"]))
        for topic in ("sensors", "users")
        if spec[f"quarantine/{topic}"] is not None
    ]
    if quarantine:
        write("silver/quarantine", pa.concat_tables(quarantine).to_pydict())
    if (users := spec["silver/users"]) is not None:
        pairs = users.items() if isinstance(users, dict) else users
        lineage = coordinates("users", [c for _, c in pairs])
        by_coordinate = {c: u for u, c in pairs}
        ids = [
            by_coordinate[(p, o)]
            for p, o in zip(
                lineage["kafka_partition"].to_pylist(),
                lineage["kafka_offset"].to_pylist(),
                strict=True,
            )
        ]
        write("silver/users", {"user_id": pa.array(ids, pa.int64()), **lineage})
    if (stats := spec["gold/sensor_stats_1m"]) is not None:
        write("gold/sensor_stats_1m", pa.Table.from_pylist(stats).to_pydict())
    if (enriched := spec["gold/readings_enriched"]) is not None:
        write("gold/readings_enriched", coordinates("sensors", enriched))
    return LakeReader(str(root))


def run(reader: LakeReader, since: datetime | None = None) -> Reconciliation:
    settings = Settings(storage_root=reader.root, sensors_topic="sensors", users_topic="users")
    return reconcile(reader, settings, since)


def ranges(found: Sequence[OffsetRange]) -> list[tuple[str, int, int, int, str]]:
    return [(r.topic, r.partition, r.first, r.last, r.tables) for r in found]


def test_a_consistent_lake_holds_every_invariant(tmp_path: Path) -> None:
    report = run(build(tmp_path))

    assert [] == report.problems
    assert report.ok
    assert [("bronze/users", "users", 0, 0, 5, 6), ("bronze/sensors", "sensors", 0, 0, 9, 10),
            ("bronze/sensors", "sensors", 1, 0, 4, 5)] == [
        (p.table, p.topic, p.partition, p.first_offset, p.last_offset, p.rows)
        for p in report.bronze
    ]  # fmt: skip
    assert 15 == report.appended("sensors").bronze_rows
    assert {
        "silver/sensor_readings": 11,
        "silver/quarantine": 3,
        "silver/sensor_duplicates": 1,
    } == report.appended("sensors").landed
    assert (6, 2, 1, 0) == (
        report.keyed("users").coverage.bronze_rows,
        report.keyed("users").silver_rows,
        report.keyed("users").quarantined,
        report.keyed("users").duplicate_keys,
    )
    assert {"gold/sensor_stats_1m": 2, "gold/readings_enriched": 7} == {
        g.table: g.rows for g in report.gold
    }
    assert None is report.tables["gold/alerts"]


def test_bronze_gaps_and_duplicate_rows_are_reported_as_offset_ranges(tmp_path: Path) -> None:
    bronze = [c for c in GOOD["bronze/sensors"] if c not in {(0, 3), (0, 4), (0, 7)}] + [(1, 2)]

    report = run(build(tmp_path, bronze__sensors=bronze))

    p0, p1 = [p for p in report.bronze if p.table == "bronze/sensors"]
    assert (3, 0, [("sensors", 0, 3, 4, ""), ("sensors", 0, 7, 7, "")]) == (
        p0.missing_offsets,
        p0.duplicate_rows,
        ranges(p0.gaps),
    )
    assert (0, 1, [("sensors", 1, 2, 2, "")]) == (
        p1.missing_offsets,
        p1.duplicate_rows,
        ranges(p1.duplicates),
    )
    # The silver rows of the deleted bronze records are now rows bronze lacks.
    assert (3, [("sensors", 0, 3, 4, "silver/sensor_readings"),
                ("sensors", 0, 7, 7, "silver/quarantine")]) == (
        report.appended("sensors").extra.count,
        ranges(report.appended("sensors").extra.ranges),
    )  # fmt: skip
    assert [
        "bronze/sensors sensors/0: 3 offsets missing (gaps: 3-4, 7)",
        "bronze/sensors sensors/1: 1 duplicate rows",
    ] == report.problems[:2]
    assert not report.ok


def test_records_landed_nowhere_or_twice_are_missing_or_repeated(tmp_path: Path) -> None:
    readings = [c for c in GOOD["silver/sensor_readings"] if c[0] == 0] + [(0, 9), (1, 3)]

    report = run(build(tmp_path, silver__sensor_readings=readings))

    assert (3, [("sensors", 1, 0, 2, "")]) == (
        report.appended("sensors").missing.count,
        ranges(report.appended("sensors").missing.ranges),
    )
    assert [("sensors", 0, 9, 9, "silver/sensor_duplicates + silver/sensor_readings")] == ranges(
        report.appended("sensors").repeated.ranges
    )
    assert 0 == report.appended("sensors").extra.count
    assert 2 == len(report.problems)


def test_users_one_row_per_user_and_lineage_in_bronze_never_quarantined(tmp_path: Path) -> None:
    users = [(1, (0, 3)), (1, (0, 1)), (2, (0, 4)), (3, (0, 99))]

    report = run(build(tmp_path, silver__users=users))

    assert (1, [1]) == (
        report.keyed("users").duplicate_keys,
        report.keyed("users").duplicate_key_samples,
    )
    assert [("users", 0, 99, 99, "silver/users")] == ranges(
        report.keyed("users").coverage.extra.ranges
    )
    assert [("users", 0, 4, 4, "silver/quarantine + silver/users")] == ranges(
        report.keyed("users").coverage.repeated.ranges
    )
    assert 0 == report.keyed("users").coverage.missing.count  # superseded changes leave no trace
    assert 3 == len(report.problems)


def test_gold_keys_occurring_twice_are_reported(tmp_path: Path) -> None:
    stats = [*GOOD["gold/sensor_stats_1m"], GOOD["gold/sensor_stats_1m"][1]]

    report = run(build(tmp_path, gold__sensor_stats_1m=stats, gold__readings_enriched=[(0, 1)] * 3))

    found = {g.table: (g.rows, g.duplicate_keys, g.extra_rows) for g in report.gold}
    assert {"gold/sensor_stats_1m": (3, 1, 1), "gold/readings_enriched": (3, 1, 2)} == found
    stats_check = next(g for g in report.gold if g.table == "gold/sensor_stats_1m")
    assert [
        {
            "window_start": "2026-01-31T12:01:00Z",
            "window_end": "2026-01-31T12:02:00Z",
            "device_id": "d1",
            "sensor_type": "heart_rate",
            "copies": 2,
        }
    ] == stats_check.samples


def test_since_checks_only_records_at_or_after_it(tmp_path: Path) -> None:
    bronze = [c for c in GOOD["bronze/sensors"] if c != (0, 3)]
    reader = build(tmp_path, bronze__sensors=bronze)

    report = run(reader, since=T0 + timedelta(seconds=4))

    assert report.ok, report.problems
    assert [(0, 4, 9, 6), (1, 4, 4, 1)] == [
        (p.partition, p.first_offset, p.last_offset, p.rows)
        for p in report.bronze
        if p.table == "bronze/sensors"
    ]
    assert "2026-01-31T12:00:04.000000Z" == report.since
    assert not run(reader).ok


def test_absent_tables_count_as_empty_and_no_lake_at_all_is_a_request_error(
    tmp_path: Path,
) -> None:
    report = run(build(tmp_path / "lake", silver__sensor_readings=None))
    assert (11, [("sensors", 0, 0, 6, ""), ("sensors", 1, 0, 3, "")]) == (
        report.appended("sensors").missing.count,
        ranges(report.appended("sensors").missing.ranges),
    )
    assert None is report.tables["silver/sensor_readings"]

    with pytest.raises(LakeRequestError, match="no table of the lake found under"):
        run(LakeReader(str(tmp_path / "nothing")))


def test_report_as_json_and_text(tmp_path: Path) -> None:
    bronze = [c for c in GOOD["bronze/sensors"] if c != (1, 1)]
    report = run(build(tmp_path, bronze__sensors=bronze))

    document = json.loads(report.to_json())
    assert (False, report.problems) == (document["ok"], document["problems"])
    extra = document["sensors"]["extra"]
    assert {"count": 1, "ranges": [{"topic": "sensors", "partition": 1, "first": 1, "last": 1,
            "tables": "silver/sensor_readings", "count": 1}]} == extra  # fmt: skip
    text = report.to_text()
    assert f"FAILED: {len(report.problems)} problem(s)" in text
    assert "  - bronze/sensors sensors/1: 1 offsets missing (gaps: 1)" in text
    assert "OK: every invariant holds" in run(build(tmp_path / "good")).to_text()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", T0 - timedelta(seconds=90)),
        ("15m", T0 - timedelta(minutes=15)),
        ("6h", T0 - timedelta(hours=6)),
        ("7d", T0 - timedelta(days=7)),
        ("2026-01-30T08:00:00Z", datetime(2026, 1, 30, 8, tzinfo=UTC)),
        ("2026-01-30T10:00:00+02:00", datetime(2026, 1, 30, 8, tzinfo=UTC)),
        ("2026-01-30 08:00", datetime(2026, 1, 30, 8, tzinfo=UTC)),
        ("2026-01-30", datetime(2026, 1, 30, tzinfo=UTC)),
    ],
)
def test_since_is_a_time_or_a_duration_back_from_now(text: str, expected: datetime) -> None:
    assert expected == parse_since(text, now=T0)


def test_since_rejects_anything_else() -> None:
    with pytest.raises(ValueError, match="neither an ISO-8601 time"):
        parse_since("yesterday", now=T0)


def skip(root: Path, *ranges: tuple[str, int, int, int]) -> None:
    """Record ``ranges`` (topic, partition, first, last) in bronze/skipped_offsets."""
    write_deltalake(
        str(root / "bronze/skipped_offsets"),
        pa.table(
            {
                "kafka_topic": pa.array([r[0] for r in ranges]),
                "kafka_partition": pa.array([r[1] for r in ranges], pa.int32()),
                "first_offset": pa.array([r[2] for r in ranges], pa.int64()),
                "last_offset": pa.array([r[3] for r in ranges], pa.int64()),
            }
        ),
        mode="append",
    )


def without(name: str, *gone: Coordinate) -> list[Coordinate]:
    return [c for c in GOOD[name] if c not in gone]


@pytest.mark.parametrize("increments", [None, {"sensors": {0: Increment(3, 10, True)}}])
def test_a_gap_recorded_as_skipped_is_accepted_and_a_partly_recorded_one_is_not(
    tmp_path: Path, increments: Increments | None
) -> None:
    """Offsets 3-4 of sensors/0 never reached bronze (Kafka had lost them): accepted when
    bronze/skipped_offsets covers them, in a whole-lake check and in a periodic one
    whose increment starts at the gap; a range covering offset 3 only leaves 4 missing."""
    reader = build(
        tmp_path,
        bronze__sensors=without("bronze/sensors", (0, 3), (0, 4)),
        silver__sensor_readings=without("silver/sensor_readings", (0, 3), (0, 4)),
        gold__readings_enriched=without("gold/readings_enriched", (0, 3), (0, 4)),
    )
    settings = Settings(storage_root=reader.root, sensors_topic="sensors", users_topic="users")
    assert ["bronze/sensors sensors/0: 2 offsets missing (gaps: 3-4)"] == (
        reconcile(reader, settings, None, increments).problems
    )

    skip(tmp_path, ("sensors", 0, 3, 3))
    assert ["bronze/sensors sensors/0: 1 offsets missing (gaps: 4)"] == (
        reconcile(reader, settings, None, increments).problems
    )

    skip(tmp_path, ("sensors", 0, 2, 4))
    report = reconcile(reader, settings, None, increments)
    assert [] == report.problems
    assert 0 == sum(p.missing_offsets for p in report.bronze)
    assert [("sensors", 0, 3, 3, ""), ("sensors", 0, 2, 4, "")] == sorted(
        ranges(report.skipped), key=lambda r: r[3]
    )
    assert "skipped at a start" in report.to_text()


def record_gaps(root: Path, *ranges: tuple[str, int, int, int]) -> None:
    """Record ``ranges`` (topic, partition, first, last) in bronze/offset_gaps."""
    write_deltalake(
        str(root / "bronze/offset_gaps"),
        pa.table(
            {
                "kafka_topic": pa.array([r[0] for r in ranges]),
                "kafka_partition": pa.array([r[1] for r in ranges], pa.int32()),
                "first_offset": pa.array([r[2] for r in ranges], pa.int64()),
                "last_offset": pa.array([r[3] for r in ranges], pa.int64()),
            }
        ),
        mode="append",
    )


@pytest.mark.parametrize("increments", [None, {"sensors": {0: Increment(2, 10, True)}}])
def test_offsets_recorded_without_a_record_are_no_gap_but_a_hole_beside_them_is(
    tmp_path: Path, increments: Increments | None
) -> None:
    """Transaction markers at sensors/0 offsets 2 and 5-6, recorded by two batches (5 at the
    end of one, 6 at the start of the next), hold no record: no problem. A record deleted
    from bronze at offset 7, next to them, is reported alone."""
    gone = [(0, 2), (0, 5), (0, 6)]
    reader = build(
        tmp_path,
        bronze__sensors=without("bronze/sensors", *gone),
        silver__sensor_readings=without("silver/sensor_readings", *gone),
        gold__readings_enriched=without("gold/readings_enriched", *gone),
    )
    settings = Settings(storage_root=reader.root, sensors_topic="sensors", users_topic="users")
    record_gaps(tmp_path, ("sensors", 0, 2, 2), ("sensors", 0, 5, 5), ("sensors", 0, 6, 6))

    report = reconcile(reader, settings, None, increments)

    assert [] == report.problems
    p0 = next(p for p in report.bronze if (p.table, p.partition) == ("bronze/sensors", 0))
    assert (0, 3) == (p0.missing_offsets, p0.without_record)
    assert "NO RECORD" in report.to_text()

    holed = [c for c in without("bronze/sensors", *gone) if c != (0, 7)]
    reader = build(tmp_path / "holed", bronze__sensors=holed)
    record_gaps(tmp_path / "holed", ("sensors", 0, 2, 2), ("sensors", 0, 5, 6))
    report = reconcile(reader, settings, None, increments)
    assert "bronze/sensors sensors/0: 1 offsets missing (gaps: 7)" in report.problems


def test_recorded_ranges_outside_the_records_checked_make_no_gap(tmp_path: Path) -> None:
    """``--since`` checks sensors/0 from offset 5 on: a recorded range at offsets 1-2 lies
    before the first record checked and adds no gap between it and them."""
    reader = build(tmp_path)
    record_gaps(tmp_path, ("sensors", 0, 1, 2))

    report = run(reader, since=T0 + timedelta(seconds=5))

    assert [] == report.problems


def test_every_partition_lists_its_own_gaps(tmp_path: Path) -> None:
    """Each partition's problem names its gaps, however many the partitions before it have."""
    many = [(0, o) for o in range(0, 60, 2)]
    reader = build(tmp_path, bronze__sensors=[*many, (1, 0), (1, 4)])

    problems = run(reader).problems

    assert any(
        p.startswith("bronze/sensors sensors/1: 3 offsets missing (gaps: 1-3)") for p in problems
    )
