"""The final silver/users rows, computed from the users topic in plain Python (the oracle)
and read from the lake."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import SparkSession

from tests.support.kafka import KafkaRecord
from tests.support.lake import Lake

PROFILE = ("first_name", "last_name", "dob", "gender", "country")


@dataclass(frozen=True)
class ExpectedUser:
    """The final silver/users row of one user, computed from the topic in plain Python."""

    profile: tuple[Any, ...] | None
    updated_at: datetime | None
    is_deleted: bool
    deleted_at: datetime | None


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).replace(tzinfo=None)


def expected_users(records: list[KafkaRecord]) -> dict[int, ExpectedUser]:
    """Newest upsert gives the profile; a tombstone at least as new as it marks deletion."""
    upserts: dict[int, tuple[datetime, int, int, dict[str, Any]]] = {}
    tombstones: dict[int, datetime] = {}
    for r in records:
        assert r.key is not None
        user_id = int(r.key)
        if r.value is None:
            at = datetime.fromtimestamp(r.timestamp_ms / 1000, UTC).replace(tzinfo=None)
            tombstones[user_id] = max(at, tombstones.get(user_id, at))
            continue
        payload = json.loads(r.value)
        candidate = (parse_time(payload["updated_at"]), r.partition, r.offset, payload)
        if user_id not in upserts or candidate[:3] > upserts[user_id][:3]:
            upserts[user_id] = candidate
    result = {}
    for user_id in upserts.keys() | tombstones.keys():
        upsert = upserts.get(user_id)
        deleted = tombstones.get(user_id)
        is_deleted = deleted is not None and (upsert is None or deleted >= upsert[0])
        result[user_id] = ExpectedUser(
            profile=tuple(upsert[3][f] for f in PROFILE) if upsert else None,
            updated_at=upsert[0] if upsert else None,
            is_deleted=is_deleted,
            deleted_at=deleted if is_deleted else None,
        )
    return result


def silver_users(spark: SparkSession, lake: Lake) -> dict[int, ExpectedUser]:
    """silver/users as `ExpectedUser` rows, by user id."""
    return {
        r.user_id: ExpectedUser(
            profile=None if r.updated_at is None else tuple(
                r.dob.isoformat() if f == "dob" and r.dob else r[f] for f in PROFILE
            ),
            updated_at=r.updated_at,
            is_deleted=r.is_deleted,
            deleted_at=r.deleted_at,
        )
        for r in spark.read.format("delta").load(lake.table("silver/users")).collect()
    }  # fmt: skip
