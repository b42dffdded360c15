"""The show verb: value rendering, the three formats, and reading local Delta tables (delta-rs)."""

from __future__ import annotations

import io
import json
import math
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from service.__main__ import main
from service.config import Location
from service.errors import LakeRequestError
from service.lake.lakeview import LakeReader, plain
from service.lake.tables import BRONZE_SENSORS, QUARANTINE_TABLE
from service.verbs.show import (
    CELL_WIDTH,
    ShowRequest,
    render_table,
    select_statement,
    show,
    write_csv,
    write_json_lines,
)

AT = datetime(2026, 1, 31, 12, 0, 0, 123456, tzinfo=UTC)
INVALID_UTF8 = b'{"v": "\xff\xfe"}'


def bronze_rows(layout: str) -> pa.Table:
    """Three bronze-like rows: the STRING layout (key, value) or the BINARY one (+ text views)."""
    keys, values = [b"dev-1", b"dev-2", None], [b'{"a": 1}', INVALID_UTF8, None]
    columns: dict[str, pa.Array] = {}
    if layout == "binary":
        columns["key"] = pa.array(keys, pa.binary())
        columns["value"] = pa.array(values, pa.binary())
        columns["key_text"] = pa.array(["dev-1", "dev-2", None])
        columns["value_text"] = pa.array(['{"a": 1}', None, None])
    else:
        columns["key"] = pa.array(["dev-1", "dev-2", None])
        columns["value"] = pa.array(['{"a": 1}', "{}", None])
    columns["kafka_partition"] = pa.array([0, 1, 2], pa.int32())
    columns["kafka_offset"] = pa.array([10, 11, 12], pa.int64())
    columns["kafka_timestamp"] = pa.array([AT, AT, None], pa.timestamp("us", tz="UTC"))
    headers = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    columns["headers"] = pa.array([[{"key": "h", "value": b"\x00\x01"}], [], None], headers)
    return pa.table(columns)


def test_values_render_once_for_every_format() -> None:
    assert "7b2276223a2022fffe227d" == plain(INVALID_UTF8)
    assert "2026-01-31T12:00:00.123456Z" == plain(AT)
    assert "2026-01-31T12:00:00" == plain(datetime(2026, 1, 31, 12))  # zone-less stays so
    assert "2026-01-31" == plain(date(2026, 1, 31))
    assert ["NaN", "Infinity", "-Infinity", 1.5] == plain([math.nan, math.inf, -math.inf, 1.5])
    assert "1.10" == plain(Decimal("1.10"))
    assert {"key": "h", "value": "0001"} == plain({"key": "h", "value": b"\x00\x01"})
    assert (None, True, 3, "é") == (plain(None), plain(True), plain(3), plain("é"))


@pytest.mark.parametrize("layout", ["string", "binary"])
def test_json_lines_print_binary_as_hex_in_both_bronze_layouts(layout: str) -> None:
    out = io.StringIO()

    count = write_json_lines(bronze_rows(layout).to_batches(), out)

    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert 3 == count == len(rows)
    expected_value = INVALID_UTF8.hex() if layout == "binary" else "{}"
    assert expected_value == rows[1]["value"]
    assert ("dev-1", "2026-01-31T12:00:00.123456Z") == (
        rows[0]["key"] if layout == "string" else rows[0]["key_text"],
        rows[0]["kafka_timestamp"],
    )
    assert [{"key": "h", "value": "0001"}] == rows[0]["headers"]
    assert (None, None) == (rows[2]["value"], rows[2]["headers"])


def test_csv_has_a_header_quotes_fields_and_prints_null_as_empty() -> None:
    rows = bronze_rows("binary")
    out = io.StringIO()

    write_csv(rows.column_names, rows.to_batches(), out)

    lines = out.getvalue().splitlines()
    assert ",".join(rows.column_names) == lines[0]
    assert '"{""a"": 1}"' in lines[1]  # value_text, quoted
    assert '[{""key"":""h"",""value"":""0001""}]' in lines[1]  # headers as compact JSON
    assert ",,,,2,12,," == lines[3]  # nulls are empty fields


def test_text_table_aligns_columns_shows_null_and_keeps_each_row_on_one_line() -> None:
    long = "x" * (CELL_WIDTH + 10)
    text = render_table(
        ["a", "b"],
        [{"a": "line\nbreak", "b": None}, {"a": long, "b": 1}],
    )

    lines = text.splitlines()
    assert 4 == len(lines)
    assert lines[0].index("b") == lines[2].index("null")
    assert "line\\nbreak" in lines[2]
    assert lines[3].startswith("x" * (CELL_WIDTH - 1) + "…")


def test_statement_wraps_the_predicate_and_limit_zero_means_all() -> None:
    assert "SELECT * FROM quarantine WHERE (a = 1 OR b = 2) LIMIT 5" == select_statement(
        QUARANTINE_TABLE, "a = 1 OR b = 2", 5
    )
    assert "SELECT * FROM sensors" == select_statement(BRONZE_SENSORS, "  ", 0)


def test_delta_rs_uris_from_the_service_spelling() -> None:
    assert "s3://lake/prefix" == Location("s3a://lake/prefix").for_delta_rs()
    assert "/abs/path" == Location("file:/abs/path").for_delta_rs()
    assert "/abs/path" == Location("file:///abs/path").for_delta_rs()


@pytest.fixture
def local_lake(tmp_path: Path) -> Path:
    """A local lake whose bronze/sensors has versions 0 (3 rows) and 1 (6 rows)."""
    rows = bronze_rows("binary")
    write_deltalake(str(tmp_path / "bronze" / "sensors"), rows)
    offsets = rows.schema.get_field_index("kafka_offset")
    more = rows.set_column(offsets, "kafka_offset", pa.array([20, 21, 22], pa.int64()))
    write_deltalake(str(tmp_path / "bronze" / "sensors"), more, mode="append")
    return tmp_path


def shown(lake: Path, **request: object) -> tuple[list[dict[str, object]], str]:
    out = io.StringIO()
    fmt = request.pop("output_format", "json")
    show(LakeReader(str(lake)), ShowRequest(BRONZE_SENSORS, output_format=fmt, **request), out)  # type: ignore[arg-type]
    text = out.getvalue()
    return ([json.loads(line) for line in text.splitlines()] if fmt == "json" else []), text


def test_show_filters_limits_and_time_travels_a_delta_table(local_lake: Path) -> None:
    every, _ = shown(local_lake, limit=0)
    assert [10, 11, 12, 20, 21, 22] == sorted(r["kafka_offset"] for r in every)  # type: ignore[type-var]

    odd, _ = shown(local_lake, where="kafka_offset % 2 = 1 AND key_text IS NOT NULL", limit=0)
    assert [11, 21] == sorted(r["kafka_offset"] for r in odd)  # type: ignore[type-var]

    first, _ = shown(local_lake, limit=0, version=0)
    assert [10, 11, 12] == sorted(r["kafka_offset"] for r in first)  # type: ignore[type-var]
    assert 2 == len(shown(local_lake, limit=2)[0])


def test_text_table_says_when_more_rows_match(local_lake: Path) -> None:
    _, text = shown(local_lake, limit=4, output_format="table")
    assert 4 + 3 == len(text.splitlines())
    assert text.splitlines()[-1].startswith("(4 rows shown; more match")

    _, text = shown(local_lake, limit=6, output_format="table")
    assert "(6 rows)" == text.splitlines()[-1]


def test_missing_table_version_or_bad_predicate_is_a_request_error(local_lake: Path) -> None:
    with pytest.raises(LakeRequestError, match="no Delta table silver/quarantine"):
        show(LakeReader(str(local_lake)), ShowRequest(QUARANTINE_TABLE), io.StringIO())
    with pytest.raises(LakeRequestError, match="no version 7 \\(versions 0 to 1\\)"):
        shown(local_lake, version=7)
    with pytest.raises(LakeRequestError, match="no_such_column"):
        shown(local_lake, where="no_such_column = 1")


def test_cli_exit_codes(
    local_lake: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("INGEST_STORAGE_ROOT", str(local_lake))
    # Logging set up on pytest's capture stream would outlive the test.
    monkeypatch.setattr("service.logs.configure_logging", lambda *args, **kwargs: None)

    assert 0 == main(["show", "bronze/sensors", "--format", "csv", "--limit", "0"])
    assert 1 + 6 == len(capsys.readouterr().out.splitlines())

    assert 2 == main(["show", "silver/quarantine"])
    err = capsys.readouterr().err
    assert err.startswith("lakehouse-ingest show: no Delta table silver/quarantine at ")
    assert 1 == len(err.splitlines())

    with pytest.raises(SystemExit) as usage:
        main(["show", "bronze/sensors", "--limit", "-1"])
    assert 2 == usage.value.code
