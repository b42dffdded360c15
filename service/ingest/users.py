"""Bronze user records → validated profile changes, reduced to the newest change per user.

Rules are docs/contract.md's (users) with the edge cases decided in
`service.ingest.validation`. User-specific decisions: a record with a key
and a null value is a tombstone, valid when the key is a user id (decimal
integer ≥ 1 within 64 bits, leading zeros allowed; otherwise ``type_mismatch``
or ``out_of_range`` on ``key``); a null value without a key is
``empty_payload``; the key of an upsert is not compared with its ``user_id``;
names longer than 200 characters are ``out_of_range``; ``country`` is two
uppercase ASCII letters (``invalid_value`` otherwise); ``dob`` must lie in
1900-01-01..``today``. Each change has a change time, ``updated_at`` for
upserts and the Kafka timestamp for tombstones; the newest wins, ties broken by
the higher (partition, offset).
"""

from __future__ import annotations

import datetime

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from service.ingest.validation import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    JsonField,
    Violation,
    payload_fields,
    payload_violations,
    rescued_fields,
    shown,
    stage_fields,
    typed_columns,
    with_error,
    with_parsed_payload,
)
from service.lake.schemas import INGESTED_AT, LINEAGE, RESCUED, USER_PAYLOAD, USER_PROFILE

GENDERS = ("F", "M", "X")
MAX_NAME_CHARS = 200
EARLIEST_DOB = datetime.date(1900, 1, 1)
_LINEAGE = tuple(c.name for c in LINEAGE)
# The profile an upsert carries, with its lineage, as `latest_user_changes` returns it.
UPSERT_COLUMNS = (*USER_PROFILE.fieldNames(), RESCUED.name, *_LINEAGE, INGESTED_AT.name)

_FIELDS = payload_fields(USER_PAYLOAD)
_INTEGER_KEY = r"^-?[0-9]+$"


def _is_tombstone() -> Column:
    return F.col("key").isNotNull() & F.col("value").isNull()


def _tombstone_violations() -> list[Violation]:
    key = F.col("key_text")
    tombstone = _is_tombstone()
    integer_key = F.coalesce(key.rlike(_INTEGER_KEY), F.lit(False))
    user_id = key.try_cast("bigint")
    return [
        Violation(
            "type_mismatch",
            tombstone & ~integer_key,
            F.concat(
                F.lit("key: tombstone key is not a user id: "),
                F.coalesce(shown(key), F.lit("(not valid UTF-8)")),
            ),
        ),
        Violation(
            "out_of_range",
            tombstone & integer_key & (user_id.isNull() | (user_id < 1)),
            F.concat(F.lit("key: tombstone user id "), shown(key), F.lit(" is not in 1..2^63-1")),
        ),
    ]


def _name_violations(field: JsonField) -> list[Violation]:
    length = F.char_length(field.as_string())
    return [
        *field.string(),
        Violation(
            "out_of_range",
            length > MAX_NAME_CHARS,
            F.concat(
                F.lit(f"{field.name}: "),
                length.cast("string"),
                F.lit(f" characters exceeds {MAX_NAME_CHARS}"),
            ),
        ),
    ]


def _field_violations(today: Column) -> list[Violation]:
    f = _FIELDS
    upsert = ~_is_tombstone()
    country = f["country"].as_string()
    rules = [
        *f["user_id"].required(),
        *f["user_id"].integer(minimum=1),
        *_name_violations(f["first_name"]),
        *_name_violations(f["last_name"]),
        *f["dob"].date(F.lit(EARLIEST_DOB), today),
        *f["gender"].string(one_of=GENDERS),
        *f["country"].string(),
        Violation(
            "invalid_value",
            ~country.rlike("^[A-Z]{2}$"),
            F.concat(F.lit("country: "), shown(country), F.lit(" is not 2 uppercase letters")),
        ),
        *f["updated_at"].required(),
        *f["updated_at"].timestamp(),
    ]
    # A tombstone has no payload: only its key is checked.
    return [Violation(r.code, upsert & r.broken, r.detail) for r in rules]


def parse_user_changes(
    bronze: DataFrame,
    today: Column | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> DataFrame:
    """Validate bronze user rows: add ``error_code``/``error_detail`` and typed fields.

    Every input row comes out once, with the bronze columns, the error (null when
    valid) and ``change``: a struct of ``is_tombstone``, ``user_id``, the typed
    profile, ``change_time`` and ``_rescued``, complete on valid rows.
    ``today`` (a date column, default ``current_date()``) bounds ``dob``.
    """
    latest_dob = today if today is not None else F.current_date()
    staged = stage_fields(with_parsed_payload(bronze, max_payload_bytes), _FIELDS.values())
    tombstone = _is_tombstone()
    updated_at = _FIELDS["updated_at"].as_timestamp()
    typed = typed_columns(USER_PAYLOAD)
    change = F.struct(
        tombstone.alias("is_tombstone"),
        F.when(tombstone, F.col("key_text").try_cast("bigint"))
        .otherwise(_FIELDS["user_id"].as_long())
        .alias("user_id"),
        *[typed[name] for name in USER_PROFILE.fieldNames()],
        F.when(tombstone, F.col("kafka_timestamp")).otherwise(updated_at).alias("change_time"),
        rescued_fields(F.col("_json"), USER_PAYLOAD.fieldNames()).alias("_rescued"),
    )
    checked = with_error(
        staged,
        [
            *payload_violations(max_payload_bytes, null_allowed=F.col("key").isNotNull()),
            *_tombstone_violations(),
            *_field_violations(latest_dob),
        ],
        [*bronze.columns, change.alias("change")],
    )
    return checked.select(*bronze.columns, "error_code", "error_detail", "change")


def latest_user_changes(valid_changes: DataFrame) -> DataFrame:
    """Reduce valid changes to one row per ``user_id``: its newest upsert and newest tombstone.

    The newest upsert is the greatest (updated_at, partition, offset), its columns
    null when the batch has none for the user; ``tombstone_at`` is the latest
    tombstone's arrival time, or null. Keeping both (rather than the single newest
    change) makes the merged state independent of how records fall into batches.
    """
    flat = valid_changes.select("change.*", *_LINEAGE, "ingested_at")
    upsert = F.max_by(
        F.when(~F.col("is_tombstone"), F.struct(*UPSERT_COLUMNS)),
        F.when(~F.col("is_tombstone"), F.struct("updated_at", "kafka_partition", "kafka_offset")),
    )
    tombstone_at = F.max(F.when(F.col("is_tombstone"), F.col("change_time")))
    tombstone = F.max_by(
        F.when(F.col("is_tombstone"), F.struct(*_LINEAGE, "ingested_at")),
        F.when(F.col("is_tombstone"), F.struct("change_time", "kafka_partition", "kafka_offset")),
    )
    return flat.groupBy("user_id").agg(
        upsert.alias("upsert"), tombstone_at.alias("tombstone_at"), tombstone.alias("tombstone")
    )
