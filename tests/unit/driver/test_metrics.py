"""The metrics listener, fed with listener events recorded from real Spark queries."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import datetime

import pytest
import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
)

from service.driver.metrics import (
    FAMILIES,
    LAG_FAMILIES,
    MAINTENANCE_FAMILIES,
    RECONCILE_FAMILIES,
    IngestMetrics,
    MetricsListener,
    termination_error_class,
)
from service.ingest.query import IngestQuery
from service.ingest.validation import ERROR_CODES
from service.lake.tables import SHIPPED
from service.streaming.listener import progress_event
from tests.support.progress import recorded

SENSORS = {"query": "ingest_sensors"}
GOLD = {"query": "gold_sensor_stats_1m"}


def epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


class Clock:
    """A settable clock for the metrics' notion of now."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def metrics(registry: CollectorRegistry, clock: Clock) -> IngestMetrics:
    return IngestMetrics(registry, clock=clock)


@pytest.fixture
def listener(metrics: IngestMetrics) -> MetricsListener:
    listener = MetricsListener(metrics)
    listener.onQueryStarted(QueryStartedEvent.fromJson(recorded("started.json")))
    return listener


def progress(listener: MetricsListener, name: str) -> None:
    # As the driver's listener reads it: Spark's JSON of the progress.
    listener.onQueryProgress(progress_event(json.dumps(recorded(name)["progress"])))


def test_started_query_is_up_with_zero_series(
    registry: CollectorRegistry, listener: MetricsListener, clock: Clock
) -> None:
    assert 1.0 == registry.get_sample_value("lakehouse_ingest_query_up", SENSORS)
    assert clock.now == registry.get_sample_value(
        "lakehouse_ingest_last_progress_timestamp_seconds", SENSORS
    )
    assert 0.0 == registry.get_sample_value("lakehouse_ingest_input_rows_total", SENSORS)
    assert 0.0 == registry.get_sample_value("lakehouse_ingest_state_rows", SENSORS)
    assert 0.0 == registry.get_sample_value(
        "lakehouse_ingest_query_terminations_total", {**SENSORS, "error_class": "none"}
    )


def test_polled_lag_becomes_gauges_per_topic_and_a_batch_end_does_not_overwrite_them(
    registry: CollectorRegistry, metrics: IngestMetrics, listener: MetricsListener, clock: Clock
) -> None:
    metrics.lag.kafka_lag_polled("ingest_sensors", "sensors", [3, 0, 12])
    progress(listener, "kafka_lagging.json")  # Spark's own figure (60) is a batch old

    labels = {**SENSORS, "topic": "sensors"}
    assert [0.0, 5.0, 12.0, 15.0] == [
        registry.get_sample_value(f"lakehouse_ingest_kafka_{stat}offsets_behind_latest", labels)
        for stat in ("min_", "avg_", "max_", "")
    ]
    assert clock.now == registry.get_sample_value(
        "lakehouse_ingest_kafka_lag_polled_timestamp_seconds", SENSORS
    )


def test_progress_counts_rows_and_times_the_batch_and_its_phases(
    registry: CollectorRegistry, listener: MetricsListener
) -> None:
    progress(listener, "kafka_lagging.json")
    progress(listener, "kafka_caught_up.json")

    assert 180.0 == registry.get_sample_value("lakehouse_ingest_input_rows_total", SENSORS)
    assert 2.0 == registry.get_sample_value(
        "lakehouse_ingest_batch_duration_seconds_count", SENSORS
    )
    assert pytest.approx(17.670 + 1.679) == registry.get_sample_value(
        "lakehouse_ingest_batch_duration_seconds_sum", SENSORS
    )
    assert pytest.approx(12.744 + 1.220) == registry.get_sample_value(
        "lakehouse_ingest_trigger_phase_seconds_total", {**SENSORS, "phase": "addBatch"}
    )
    assert pytest.approx(0.152 + 0.089) == registry.get_sample_value(
        "lakehouse_ingest_trigger_phase_seconds_total", {**SENSORS, "phase": "walCommit"}
    )
    assert pytest.approx(24.742268) == registry.get_sample_value(
        "lakehouse_ingest_input_rows_per_second", SENSORS
    )
    assert pytest.approx(35.735557) == registry.get_sample_value(
        "lakehouse_ingest_processed_rows_per_second", SENSORS
    )
    assert 2.0 == registry.get_sample_value("lakehouse_ingest_last_batch_id", SENSORS)


def test_freshness_advances_only_when_a_batch_caught_up_with_kafka(
    registry: CollectorRegistry, listener: MetricsListener
) -> None:
    caught_up = {**SENSORS, "basis": "caught_up"}
    progress(listener, "kafka_lagging.json")
    assert (
        registry.get_sample_value("lakehouse_ingest_freshness_timestamp_seconds", caught_up) is None
    )

    progress(listener, "kafka_caught_up.json")

    started = recorded("kafka_caught_up.json")["progress"]["timestamp"]
    assert epoch(started) == registry.get_sample_value(
        "lakehouse_ingest_freshness_timestamp_seconds", caught_up
    )


def test_idle_query_is_alive_and_caught_up(
    registry: CollectorRegistry, metrics: IngestMetrics, listener: MetricsListener, clock: Clock
) -> None:
    clock.now += 500
    assert 500.0 == metrics.seconds_since_progress("ingest_sensors")

    listener.onQueryIdle(QueryIdleEvent.fromJson(recorded("idle.json")))

    assert 0.0 == metrics.seconds_since_progress("ingest_sensors")
    assert clock.now == registry.get_sample_value(
        "lakehouse_ingest_last_progress_timestamp_seconds", SENSORS
    )
    assert clock.now == registry.get_sample_value(
        "lakehouse_ingest_freshness_timestamp_seconds", {**SENSORS, "basis": "caught_up"}
    )
    assert 1.0 == registry.get_sample_value("lakehouse_ingest_query_up", SENSORS)


def test_termination_with_error_marks_query_down_by_error_class(
    registry: CollectorRegistry, listener: MetricsListener
) -> None:
    with structlog.testing.capture_logs() as logs:
        listener.onQueryTerminated(
            QueryTerminatedEvent.fromJson(recorded("terminated_with_error.json"))
        )

    assert 0.0 == registry.get_sample_value("lakehouse_ingest_query_up", SENSORS)
    assert 1.0 == registry.get_sample_value(
        "lakehouse_ingest_query_terminations_total",
        {**SENSORS, "error_class": "FOREACH_BATCH_USER_FUNCTION_ERROR"},
    )
    [line] = logs
    assert ("query_terminated", "error") == (line["event"], line["log_level"])
    assert "FOREACH_BATCH_USER_FUNCTION_ERROR" == line["error_class"]
    assert line["error"].startswith("py4j.Py4JException")
    assert any("simulated sink failure" in frame for frame in line["stack_trace"])


def test_clean_termination_counts_as_error_class_none(
    registry: CollectorRegistry, listener: MetricsListener
) -> None:
    event = {**recorded("terminated_with_error.json"), "exception": None}
    event["errorClassOnException"] = None

    listener.onQueryTerminated(QueryTerminatedEvent.fromJson(event))

    assert 1.0 == registry.get_sample_value(
        "lakehouse_ingest_query_terminations_total", {**SENSORS, "error_class": "none"}
    )
    assert 0.0 == registry.get_sample_value("lakehouse_ingest_query_up", SENSORS)


def test_watermarked_query_reports_state_late_rows_and_watermark_freshness(
    registry: CollectorRegistry, listener: MetricsListener, clock: Clock
) -> None:
    event = recorded("watermark_dropped_late_rows.json")
    with structlog.testing.capture_logs() as logs:
        progress(listener, "watermark_dropped_late_rows.json")

    [line] = [line for line in logs if line["event"] == "query_progress"]
    assert {
        "query": GOLD["query"],
        "batch_id": event["progress"]["batchId"],
        "watermark": event["progress"]["eventTime"]["watermark"],
        "event_time_max": event["progress"]["eventTime"]["max"],
        "state_rows": 2,
        "state_memory_bytes": 8544,
        "dropped_by_watermark": 1,
    }.items() <= line.items()
    assert 2.0 == registry.get_sample_value("lakehouse_ingest_state_rows", GOLD)
    assert 8544.0 == registry.get_sample_value("lakehouse_ingest_state_memory_bytes", GOLD)
    assert 1.0 == registry.get_sample_value(
        "lakehouse_ingest_rows_dropped_by_watermark_total", GOLD
    )
    watermark = epoch(event["progress"]["eventTime"]["watermark"])
    assert watermark == registry.get_sample_value(
        "lakehouse_ingest_freshness_timestamp_seconds", {**GOLD, "basis": "watermark"}
    )
    # Idle does not move a watermark: no caught_up freshness for a watermarked query, but
    # its idle time (its input is empty), which the freshness alert counts as fresh.
    idle = {**recorded("idle.json"), "id": event["progress"]["id"]}
    listener.onQueryIdle(QueryIdleEvent.fromJson(idle))
    assert (
        registry.get_sample_value(
            "lakehouse_ingest_freshness_timestamp_seconds", {**GOLD, "basis": "caught_up"}
        )
        is None
    )
    assert clock.now == registry.get_sample_value(
        "lakehouse_ingest_freshness_timestamp_seconds", {**GOLD, "basis": "idle"}
    )
    assert watermark == registry.get_sample_value(
        "lakehouse_ingest_freshness_timestamp_seconds", {**GOLD, "basis": "watermark"}
    )


def test_batch_outcome_counts_quarantine_by_code_rows_per_table_and_duplicates(
    registry: CollectorRegistry, metrics: IngestMetrics
) -> None:
    quarantined_by_code = {"malformed_json": 3, "out_of_range": 2}
    rows_written = {"bronze/sensors": 100, "silver/quarantine": 5, "silver/sensor_readings": 94}

    for _ in range(2):
        metrics.batch_written("ingest_sensors", rows_written, quarantined_by_code, duplicates=1)

    def quarantined(code: str) -> float | None:
        labels = {**SENSORS, "error_code": code}
        return registry.get_sample_value("lakehouse_ingest_quarantined_rows_total", labels)

    assert (6.0, 4.0) == (quarantined("malformed_json"), quarantined("out_of_range"))
    assert 188.0 == registry.get_sample_value(
        "lakehouse_ingest_table_rows_written_total",
        {**SENSORS, "table": "silver/sensor_readings"},
    )
    assert 2.0 == registry.get_sample_value("lakehouse_ingest_duplicates_dropped_total", SENSORS)


def test_declared_query_has_every_error_code_table_and_trigger_interval(
    registry: CollectorRegistry, metrics: IngestMetrics
) -> None:
    query = IngestQuery(SHIPPED.contracts["users"])

    metrics.query_declared(query.name, [t.name for t in query.tables], 10.0)

    users = {"query": "ingest_users"}
    for code in ERROR_CODES:
        labels = {**users, "error_code": code}
        assert 0.0 == registry.get_sample_value("lakehouse_ingest_quarantined_rows_total", labels)
    for table in query.tables:
        labels = {**users, "table": table.name}
        assert 0.0 == registry.get_sample_value("lakehouse_ingest_table_rows_written_total", labels)
    assert 10.0 == registry.get_sample_value("lakehouse_ingest_trigger_interval_seconds", users)
    assert 0.0 == registry.get_sample_value("lakehouse_ingest_query_up", users)


def test_malformed_progress_is_logged_and_does_not_raise(
    registry: CollectorRegistry, listener: MetricsListener
) -> None:
    event = recorded("kafka_caught_up.json")
    event["progress"]["stateOperators"] = [
        {**recorded("watermark_dropped_late_rows.json")["progress"]["stateOperators"][0]}
    ]
    parsed = progress_event(json.dumps(event["progress"]))
    parsed.progress.stateOperators[0]["numRowsTotal"] = "not a number"

    with structlog.testing.capture_logs() as logs:
        listener.onQueryProgress(parsed)

    assert "progress_metrics_failed" in [line["event"] for line in logs]


def test_each_family_of_the_table_is_the_attribute_of_its_key_and_kind(
    registry: CollectorRegistry, metrics: IngestMetrics
) -> None:
    for holder, families in (
        (metrics, FAMILIES),
        (metrics.lag, LAG_FAMILIES),
        (metrics.reconcile, RECONCILE_FAMILIES),
    ):
        assert set(type(holder).__annotations__) == set(families)
        for key, family in families.items():
            assert type(getattr(holder, key)) is family.kind, key
            assert type(holder).__annotations__[key] == family.kind.__name__, key
    maintenance = {k: type(getattr(metrics.maintenance, k)) for k in MAINTENANCE_FAMILIES}
    assert maintenance == {k: f.kind for k, f in MAINTENANCE_FAMILIES.items()}
    every = (FAMILIES, LAG_FAMILIES, RECONCILE_FAMILIES, MAINTENANCE_FAMILIES)
    for family in (f for families in every for f in families.values()):
        assert not family.buckets or family.kind is Histogram, family.name
    # Every family is exported under its own name (a counter's without "_total"), once.
    names = [m.name for m in registry.collect()]
    assert len(names) == len(set(names))
    exported = {
        f"lakehouse_ingest_{f.name}".removesuffix("_total" if f.kind is Counter else "")
        for families in (FAMILIES, LAG_FAMILIES, RECONCILE_FAMILIES)
        for f in families.values()
    }
    assert exported <= set(names)


def test_build_info_and_process_start_time_are_exported(registry: CollectorRegistry) -> None:
    IngestMetrics(registry)

    text = generate_latest(registry).decode()

    assert "lakehouse_ingest_build_info{" in text
    assert registry.get_sample_value("lakehouse_ingest_process_start_time_seconds") is not None


def test_storage_heartbeat_and_readiness_are_read_at_scrape(
    registry: CollectorRegistry, metrics: IngestMetrics
) -> None:
    state = {"ready": True, "heartbeat": 100.0}
    metrics.watch_storage(lambda: state["heartbeat"])
    metrics.watch_readiness(lambda: (bool(state["ready"]), "detail"))

    assert (1.0, 100.0) == (
        registry.get_sample_value("lakehouse_ingest_ready"),
        registry.get_sample_value("lakehouse_ingest_storage_heartbeat_timestamp_seconds"),
    )
    state.update(ready=False, heartbeat=160.0)
    assert (0.0, 160.0) == (
        registry.get_sample_value("lakehouse_ingest_ready"),
        registry.get_sample_value("lakehouse_ingest_storage_heartbeat_timestamp_seconds"),
    )


@pytest.mark.parametrize(
    ("exception", "error_class", "expected"),
    [
        (None, None, "none"),
        ("boom", "FOREACH_BATCH_USER_FUNCTION_ERROR", "FOREACH_BATCH_USER_FUNCTION_ERROR"),
        (
            "org.apache.hadoop.fs.s3a.AWSClientIOException: getFileStatus",
            None,
            "AWSClientIOException",
        ),
        ("[STREAM_FAILED] Query [id = 1] terminated with exception", None, "STREAM_FAILED"),
        ("something odd happened", None, "unknown"),
    ],
)
def test_termination_error_class_is_a_short_stable_label(
    exception: str | None, error_class: str | None, expected: str
) -> None:
    assert expected == termination_error_class(exception, error_class)


def test_exposition_of_every_recorded_event_passes_promtool_check_metrics(
    registry: CollectorRegistry, listener: MetricsListener, metrics: IngestMetrics
) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not installed: run `make prometheus`"
    for name in ("kafka_lagging.json", "kafka_caught_up.json", "watermark_dropped_late_rows.json"):
        progress(listener, name)
    listener.onQueryIdle(QueryIdleEvent.fromJson(recorded("idle.json")))
    listener.onQueryTerminated(
        QueryTerminatedEvent.fromJson(recorded("terminated_with_error.json"))
    )
    metrics.batch_written("ingest_sensors", {"bronze/sensors": 3}, {"missing_field": 1}, 0)

    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=generate_latest(registry),
        capture_output=True,
        check=False,
    )

    assert (0, b"") == (result.returncode, result.stdout + result.stderr)


def test_declared_tables_have_maintenance_failures_and_last_success_at_zero() -> None:
    registry = CollectorRegistry()
    metrics = IngestMetrics(registry)
    query = IngestQuery(SHIPPED.contracts["users"])

    metrics.query_declared(query.name, [t.name for t in query.tables], 10.0)

    for table in query.tables:
        labels = {"table": table.name}
        for name in ("failures_total", "last_success_timestamp_seconds"):
            assert 0.0 == registry.get_sample_value(f"lakehouse_ingest_maintenance_{name}", labels)
        assert registry.get_sample_value("lakehouse_ingest_table_files", labels) is None


def test_maintenance_outcomes_are_recorded_per_table(clock: Clock) -> None:
    registry = CollectorRegistry()
    maintenance = IngestMetrics(registry, clock=clock).maintenance
    bronze, users = {"table": "bronze/users"}, {"table": "silver/users"}

    maintenance.table_files_counted("bronze/users", 40)
    maintenance.table_files_counted("bronze/users", 3)
    maintenance.maintenance_succeeded("bronze/users", 12.5)
    maintenance.maintenance_failed("silver/users")
    maintenance.maintenance_failed("silver/users")

    assert 3.0 == registry.get_sample_value("lakehouse_ingest_table_files", bronze)
    assert clock.now == registry.get_sample_value(
        "lakehouse_ingest_maintenance_last_success_timestamp_seconds", bronze
    )
    assert 12.5 == registry.get_sample_value(
        "lakehouse_ingest_maintenance_duration_seconds_sum", bronze
    )
    assert 2.0 == registry.get_sample_value("lakehouse_ingest_maintenance_failures_total", users)
    assert (
        registry.get_sample_value(
            "lakehouse_ingest_maintenance_last_success_timestamp_seconds", users
        )
        is None
    )
