"""User records → validated changes, and the newest change per user within a batch."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from service.ingest.modes import parse_records
from service.ingest.modes.entities import Entities
from service.ingest.validation import DEFAULT_MAX_PAYLOAD_BYTES, split_valid_invalid
from service.lake.tables import SHIPPED
from tests.support.payloads import profile
from tests.support.records import bronze_frame

TODAY = datetime.date(2024, 5, 1)
USERS = SHIPPED.contracts["users"]


# case name → (key, value, expected error_code, expected error_detail)
CASES: dict[str, tuple[str | None, str | None, str | None, str | None]] = {
    "valid profile": ("1", profile(), None, None),
    "valid minimal profile": ("1", profile(first_name=None, dob=None, country=None), None, None),
    "valid 200-character name": ("1", profile(first_name="a" * 200), None, None),
    "valid dob today": ("1", profile(dob="2024-05-01"), None, None),
    "valid epoch updated_at": ("1", profile(updated_at=1711929600000), None, None),
    "tombstone": ("42", None, None, None),
    "tombstone with leading zeros": ("007", None, None, None),
    "null value without key": (None, None, "empty_payload", "value: empty"),
    "empty value": ("1", "", "empty_payload", "value: empty"),
    "tombstone with a non-numeric key": (
        "abc",
        None,
        "type_mismatch",
        "key: tombstone key is not a user id: 'abc'",
    ),
    "tombstone with a trailing line feed in its key": (
        "42\n",
        None,
        "type_mismatch",
        "key: tombstone key is not a user id: '42\n'",
    ),
    "tombstone with key zero": (
        "0",
        None,
        "out_of_range",
        "key: tombstone user id '0' is not in 1..2^63-1",
    ),
    "tombstone with a key beyond 64 bits": (
        "99999999999999999999",
        None,
        "out_of_range",
        "key: tombstone user id '99999999999999999999' is not in 1..2^63-1",
    ),
    "missing user_id": ("1", profile(user_id=None), "missing_field", "user_id: required"),
    "missing updated_at": ("1", profile(updated_at=None), "missing_field", "updated_at: required"),
    "user_id zero": ("1", profile(user_id=0), "out_of_range", "user_id: 0 is below 1"),
    "quoted user_id": (
        "1",
        profile(user_id="1"),
        "type_mismatch",
        "user_id: expected a JSON integer, got string",
    ),
    "201-character name": (
        "1",
        profile(last_name="a" * 201),
        "out_of_range",
        "last_name: 201 characters exceeds 200",
    ),
    "dob before 1900": (
        "1",
        profile(dob="1899-12-31"),
        "out_of_range",
        "dob: 1899-12-31 is outside 1900-01-01..today",
    ),
    "dob after today": (
        "1",
        profile(dob="2024-05-02"),
        "out_of_range",
        "dob: 2024-05-02 is outside 1900-01-01..today",
    ),
    "impossible dob": (
        "1",
        profile(dob="2020-02-30"),
        "type_mismatch",
        "dob: not a YYYY-MM-DD date: '2020-02-30'",
    ),
    "dob with a time": (
        "1",
        profile(dob="2020-02-03T00:00:00"),
        "type_mismatch",
        "dob: not a YYYY-MM-DD date: '2020-02-03T00:00:00'",
    ),
    "unknown gender": (
        "1",
        profile(gender="Q"),
        "invalid_value",
        "gender: 'Q' is not one of F, M, X",
    ),
    "country with a trailing line feed": (
        "1",
        profile(country="GB\n"),
        "invalid_value",
        "country: 'GB\n' is not 2 uppercase letters",
    ),
    "dob in year 0000": (
        "1",
        profile(dob="0000-02-29"),
        "out_of_range",
        "dob: outside years 1-9999: '0000-02-29'",
    ),
    "lowercase country": (
        "1",
        profile(country="gb"),
        "invalid_value",
        "country: 'gb' is not 2 uppercase letters",
    ),
    "garbage updated_at": (
        "1",
        profile(updated_at="soon"),
        "type_mismatch",
        "updated_at: not an ISO-8601 timestamp: 'soon'",
    ),
}


@pytest.fixture(scope="module")
def outcomes(spark: SparkSession) -> dict[int, dict[str, Any]]:
    """Each case parsed in one batch, by offset (= position in CASES)."""
    records = [(key, value) for key, value, _, _ in CASES.values()]
    parsed = parse_records(
        USERS, bronze_frame(spark, records, "users"), DEFAULT_MAX_PAYLOAD_BYTES, None, F.lit(TODAY)
    )
    rows = parsed.select("kafka_offset", "error_code", "error_detail", "record.*").collect()
    return {row["kafka_offset"]: row.asDict() for row in rows}


@pytest.mark.parametrize("case", list(CASES))
def test_each_case_gets_its_error_code_and_detail(
    outcomes: dict[int, dict[str, Any]], case: str
) -> None:
    _, _, code, detail = CASES[case]
    actual = outcomes[list(CASES).index(case)]
    assert (code, detail) == (actual["error_code"], actual["error_detail"])


def test_tombstone_is_a_change_of_the_key_user_at_arrival_time(
    outcomes: dict[int, dict[str, Any]],
) -> None:
    actual = outcomes[list(CASES).index("tombstone")]
    expected = {"is_tombstone": True, "user_id": 42, "updated_at": None, "first_name": None}
    assert expected == {k: actual[k] for k in expected}
    assert actual["change_time"] is not None


def test_upsert_change_is_typed_and_timed_by_updated_at(
    outcomes: dict[int, dict[str, Any]],
) -> None:
    actual = outcomes[list(CASES).index("valid profile")]
    expected = {
        "is_tombstone": False,
        "user_id": 1,
        "first_name": "Ada",
        "dob": datetime.date(1990, 12, 10),
        "country": "GB",
        "_rescued": None,
    }
    assert expected == {k: actual[k] for k in expected}
    assert actual["updated_at"] == actual["change_time"]


def test_newest_upsert_and_newest_tombstone_per_user_are_kept_within_a_batch(
    spark: SparkSession,
) -> None:
    t = "2024-04-0{}T00:00:00Z"
    records = [
        ("1", profile(first_name="second", updated_at=t.format(2))),  # offset 0
        ("1", profile(first_name="third", updated_at=t.format(3))),  # offset 1
        ("1", profile(first_name="first", updated_at=t.format(1))),  # offset 2: late arrival
        ("2", profile(user_id=2, first_name="tie-low", updated_at=t.format(5))),  # offset 3
        ("2", profile(user_id=2, first_name="tie-high", updated_at=t.format(5))),  # offset 4
        ("3", profile(user_id=3, updated_at=t.format(1))),  # offset 5
        ("3", None),  # offset 6: tombstone at arrival (2024-05-01), newer
        ("4", None),  # offset 7: tombstone at arrival
        ("4", profile(user_id=4, first_name="back", updated_at="2024-05-01T12:00:01Z")),
    ]
    parsed = parse_records(
        USERS, bronze_frame(spark, records, "users"), DEFAULT_MAX_PAYLOAD_BYTES, None
    )
    valid, _ = split_valid_invalid(parsed)
    rows = Entities(USERS).latest_changes(valid).collect()
    actual = {
        r["user_id"]: (
            r["upsert"] and (r["upsert"]["first_name"], r["upsert"]["kafka_offset"]),
            r["tombstone"] and r["tombstone"]["kafka_offset"],
            r["tombstone_at"] is not None,
        )
        for r in rows
    }
    expected = {
        1: (("third", 1), None, False),
        2: (("tie-high", 4), None, False),
        3: (("Ada", 5), 6, True),
        4: (("back", 8), 7, True),
    }
    assert expected == actual
