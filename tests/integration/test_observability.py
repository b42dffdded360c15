"""A real Prometheus scrapes the running service: dashboards, alerts, readiness, logs, status.

One service run on a fresh lake (real Kafka, real MinIO), scraped every two seconds by
the Debian ``prometheus`` binary with the chart's alert rules loaded (as a release gets
them), which sends what fires to the pinned Alertmanager with the shipped configuration:

1. healthy ingest: `promtool check metrics` is clean on a real scrape; every
   PromQL expression of the dashboard, and every alert expression with its
   thresholds turned into ``bool`` comparisons (so it keeps every series it
   would compare), returns data; every rule evaluates without error;
2. the S3 server stops: /readyz answers 503 and Prometheus sees the service not
   ready, the storage heartbeat stale and the sensors query stuck or down; it fires
   StorageUnreachable and NoProgress, and the Alertmanager (its inhibit rules) sends
   one notification, StorageUnreachable's;
3. the service is killed, and ``lakehouse-ingest status --json`` reports the
   checkpoint's committed offsets, the broker's latest and the tables.

Throughout, the service's stdout is JSON lines (Python and JVM) and a configured
secret never appears in it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from devstack import MinioServer, free_port

from service.lake.tables import SHIPPED, contract_tables
from tests.support.alertmanager import alertmanager, notified, webhook
from tests.support.chart import NAMESPACE, render
from tests.support.kafka import end_offsets, group_offsets
from tests.support.lake import Lake
from tests.support.repo import REPO
from tests.support.service_process import ServiceProcess

pytestmark = pytest.mark.integration

DASHBOARD = REPO / "helm" / "lakehouse-ingest" / "files" / "dashboards" / "lakehouse-ingest.json"
ALERTS = REPO / "helm" / "lakehouse-ingest" / "files" / "rules" / "alerts.yml"
ALERT_TESTS = REPO / "deploy" / "prometheus" / "alerts_test.yml"
# The scrape job of prometheus-test.yml.in (the dashboard's $job, the rules' job).
JOB = "lakehouse-ingest"
# Alerts on series that exist only once their event happened, so a healthy run has none;
# each has its promtool unit test in ALERT_TESTS instead.
EVENT_ONLY_ALERTS = {"KafkaOffsetsSkipped": "lakehouse_ingest_kafka_offsets_skipped_total"}
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus" / "prometheus-test.yml.in"
SASL_SECRET = "sasl-Pa55w0rd-never-logged-7d1c"  # noqa: S105 - a test value to look for
QUERIES = {"ingest_users", "ingest_sensors"}
# Lines the JVM writes to stderr itself, outside any logging framework: the launcher's
# notice, and an slf4j 1.x API (inside a dependency) without a binding.
JVM_LAUNCHER_NOTICES = ("WARNING: Using incubator modules", "SLF4J: ")


class Prometheus:
    """The Debian ``prometheus`` server on a free loopback port with temporary storage,
    evaluating the alert rules of ``rule_file`` and sending them to the Alertmanager
    listening at ``alertmanager``."""

    def __init__(self, work_dir: Path, target: str, rule_file: Path, alertmanager: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = work_dir / "prometheus.yml"
        config.write_text(
            PROMETHEUS_CONFIG.read_text()
            .replace("@TARGET@", target)
            .replace("@RULE_FILE@", str(rule_file))
            .replace("@ALERTMANAGER@", alertmanager)
            .replace("@NAMESPACE@", NAMESPACE)
        )
        self.log_path = work_dir / "prometheus.log"
        binary = shutil.which("prometheus")
        assert binary, "prometheus not installed: run `make prometheus`"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={work_dir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        _eventually(lambda: _http_status(f"{self.url}/-/ready") == 200, 60, "prometheus ready")

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The result of an instant query; fail on a PromQL error."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        body = json.loads(_http_get(url))
        assert "success" == body["status"], f"{promql}: {body}"
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def api(self, path: str) -> Any:
        """The ``data`` of a GET on the HTTP API."""
        return json.loads(_http_get(f"{self.url}/api/v1/{path}"))["data"]

    def stop(self) -> None:
        """Stop the server."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def release_rules(work_dir: Path) -> Path:
    """The chart's PrometheusRule groups, as a release would get them, in a rule file: the
    job this test's Prometheus scrapes, and StorageUnreachable (20 s stale) and NoProgress
    (60 s) made to fire within the test's outage, each after 5 s (chart values)."""
    manifests = render(
        None,
        True,
        f"monitoring.alerts.job={JOB}",
        "monitoring.alerts.thresholds.storageStaleSeconds=20",
        "monitoring.alerts.rules.StorageUnreachable.for=5s",
        "monitoring.alerts.thresholds.noProgressSeconds=60",
        "monitoring.alerts.rules.NoProgress.for=5s",
    )
    (rule,) = [m for m in manifests if m["kind"] == "PrometheusRule"]
    path = work_dir / "release-rules.yml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    return path


@pytest.fixture
def minio(minio_server: MinioServer) -> Iterator[MinioServer]:
    """The session's MinIO, restarted after the test if the test stopped it."""
    yield minio_server
    if not minio_server.running:
        minio_server.start()


def test_prometheus_scrapes_every_dashboard_and_alert_series_and_sees_a_storage_outage(
    lake: Lake, minio: MinioServer
) -> None:
    produced = json.loads(
        lake.generate(
            "--users", "40", "--readings", "1500", "--seed", "11",
            "--bad-fraction", "0.1", "--duplicate-fraction", "0.05",
        )
    )  # fmt: skip
    http_port = free_port()
    service = lake.service(
        "observability",
        INGEST_HTTP_PORT=str(http_port),
        INGEST_GOLD_ENABLED="true",  # stateful queries, so the state panels have data
        INGEST_KAFKA_SASL_USERNAME="ingest",
        INGEST_KAFKA_SASL_PASSWORD=SASL_SECRET,
        INGEST_LAG_POLL_SECONDS="2",
        # Above a cold gold batch on a loaded two-core host (one over 40 s: /status said
        # "not alive" before the outage), below the outage's wait for the 503.
        INGEST_WEDGED_SECONDS="60",
        INGEST_RECONCILE_INTERVAL_SECONDS="3",
        # Maintenance runs after a batch once its interval has passed: due by the end of
        # the first (cold) batches, so its panels have data.
        INGEST_MAINTENANCE_INTERVAL_SECONDS="5",
    )
    base = f"http://127.0.0.1:{http_port}"
    stack = contextlib.ExitStack()
    receiver, received = stack.enter_context(webhook())
    alertmanager_port = stack.enter_context(alertmanager(lake.work_dir, receiver))
    prometheus = Prometheus(
        lake.work_dir,
        f"127.0.0.1:{http_port}",
        release_rules(lake.work_dir),
        f"127.0.0.1:{alertmanager_port}",
    )
    feeder: subprocess.Popen[bytes] | None = None
    try:
        service.start()
        service.wait_for_log('"event": "running"', timeout=240)
        total_in = _produced_records(produced)
        _eventually(
            lambda: _value(prometheus, "sum(lakehouse_ingest_input_rows_total)") >= total_in,
            420,
            f"Prometheus sees {total_in} input rows",
        )
        _eventually(lambda: _http_status(f"{base}/readyz") == 200, 60, "/readyz 200")
        _eventually(
            lambda: _value(prometheus, "sum(lakehouse_ingest_kafka_offsets_behind_latest)") == 0,
            60,
            "Prometheus sees no Kafka lag once every produced record is in",
        )
        # The driver's own reconcile covered every record exactly, and found nothing wrong.
        _eventually(
            lambda: (
                _value(prometheus, "sum(lakehouse_ingest_reconcile_records_checked_total)")
                == total_in
            ),
            60,
            f"Prometheus sees the driver's reconcile cover {total_in} records",
        )
        for healthy in (
            "lakehouse_ingest_reconcile_problems == 0",
            'lakehouse_ingest_reconcile_checks_total{result="broken"} == 0',
            'lakehouse_ingest_reconcile_checks_total{result="ok"} > 0',
        ):
            assert prometheus.query(healthy), healthy
        assert service.events("lake_reconciled"), "a check that found nothing logs so"
        _eventually(
            lambda: bool(
                prometheus.query("lakehouse_ingest_maintenance_last_success_timestamp_seconds > 0")
            ),
            120,
            "Prometheus sees a maintenance round succeed",
        )
        # Gold's first batch reports the watermark of no event (0); the watermark it
        # moves to is reported by its next batch, data or not.
        _eventually(
            lambda: bool(
                prometheus.query('lakehouse_ingest_freshness_timestamp_seconds{basis="watermark"}')
            ),
            120,
            "Prometheus sees gold's event-time watermark",
        )
        _assert_the_consumer_group_holds_the_checkpoint(lake)
        _assert_the_driver_jvm_is_exported(prometheus)
        _assert_status_asks_the_running_driver(lake, http_port, service.pid)
        assert 200 == _http_status(f"{base}/healthz")
        time.sleep(3)  # a few more scrapes, so rates have two samples after the batches

        _assert_promtool_check_metrics_is_clean(_http_get(f"{base}/metrics"))
        _assert_dashboard_queries_return_data(prometheus)
        _assert_alert_expressions_return_data(prometheus)
        _assert_every_rule_evaluates(prometheus)
        quarantined = _value(prometheus, "sum(lakehouse_ingest_quarantined_rows_total)")
        assert quarantined > 0, "bad records were produced, so quarantine counters must move"

        # The S3 server goes away while data keeps arriving.
        feeder = _start_feeder(lake)
        outage = time.time()
        minio.stop()
        _eventually(lambda: _http_status(f"{base}/readyz") == 503, 90, "/readyz 503")
        detail = _http_body(f"{base}/readyz")
        assert "storage unreachable" in detail or "not active" in detail, detail
        _eventually(
            lambda: bool(prometheus.query("lakehouse_ingest_ready == 0")),
            60,
            "Prometheus sees lakehouse_ingest_ready == 0",
        )
        _eventually(
            lambda: bool(
                prometheus.query(
                    '(lakehouse_ingest_query_up{query="ingest_sensors"} == 0)'
                    " or (time() - lakehouse_ingest_last_progress_timestamp_seconds"
                    '{query="ingest_sensors"} > 20)'
                )
            ),
            120,
            "Prometheus sees ingest_sensors stuck or down",
        )
        assert prometheus.query(
            "time() - lakehouse_ingest_storage_heartbeat_timestamp_seconds > 8"
        ), "the storage heartbeat must be stale during the outage"
        # No batch completes, yet the lag keeps being polled and shows the backlog.
        _eventually(
            lambda: bool(
                prometheus.query(
                    'lakehouse_ingest_kafka_offsets_behind_latest{query="ingest_sensors"} > 20'
                    " and on(query)"
                    " (time() - lakehouse_ingest_last_progress_timestamp_seconds > 10)"
                    " and on(query)"
                    " (time() - lakehouse_ingest_kafka_lag_polled_timestamp_seconds < 10)"
                )
            ),
            60,
            "Prometheus sees fresh, growing Kafka lag while no batch completes",
        )
        # Records waiting and no batch finishing: liveness fails, so Kubernetes restarts it.
        _eventually(lambda: _http_status(f"{base}/healthz") == 503, 120, "/healthz 503")
        assert "wedged: no batch finished for over 60s: " in _http_body(f"{base}/healthz")
        _assert_the_outage_pages_once(prometheus, received, outage)
    finally:
        if feeder is not None:
            feeder.kill()
            feeder.wait()
        if not minio.running:
            minio.start()
        service.cleanup()
        prometheus.stop()
        stack.close()

    _assert_logs_are_json_without_secrets(service)
    _assert_status_reports_checkpoint_lag_and_tables(lake)


def _assert_the_outage_pages_once(
    prometheus: Prometheus, received: list[dict[str, Any]], outage: float
) -> None:
    """Prometheus fires StorageUnreachable and a consequence (the sensors query without
    progress); the Alertmanager, with the shipped inhibit rules, notifies the first only."""
    firing = 'ALERTS{alertstate="firing", alertname=~"StorageUnreachable|NoProgress"}'
    _eventually(
        lambda: (
            {a["metric"]["alertname"] for a in prometheus.query(firing)}
            == {"StorageUnreachable", "NoProgress"}
        ),
        180,
        "Prometheus fires StorageUnreachable and NoProgress",
    )
    _eventually(lambda: bool(notified(received, outage)), 60, "an outage notification")
    time.sleep(5)  # NoProgress is sent every evaluation: a failed inhibition shows by now
    assert [("StorageUnreachable", JOB)] == notified(received, outage), received


def _assert_promtool_check_metrics_is_clean(exposition: str) -> None:
    result = subprocess.run(
        ["promtool", "check", "metrics"],
        input=exposition,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (0, "") == (result.returncode, result.stdout + result.stderr)
    for family in ("lakehouse_ingest_build_info", "lakehouse_ingest_process_start_time_seconds"):
        assert family in exposition


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of the dashboard, Grafana variables filled in."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "20s").replace("$job", JOB)
            for variable in ("$query", "$namespace", "$instance"):
                expr = expr.replace(variable, ".*")
            found.append((panel["title"], expr))
    return found


def alert_expressions() -> list[tuple[str, str]]:
    """(alert name, PromQL) of every alert rule."""
    rules = yaml.safe_load(ALERTS.read_text())
    return [(r["alert"], r["expr"]) for g in rules["groups"] for r in g["rules"] if "alert" in r]


def without_thresholds(promql: str) -> str:
    """``promql`` with every comparison made a ``bool`` one: it keeps all series it compares.

    Comparisons inside label matchers (``{a!="b"}``) and strings are left alone.
    """
    out: list[str] = []
    depth = 0
    quote: str | None = None
    i = 0
    while i < len(promql):
        ch = promql[i]
        if quote:
            out.append(ch)
            if ch == "\\" and i + 1 < len(promql):
                out.append(promql[i + 1])
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'`":
            quote = ch
            out.append(ch)
        elif ch == "{":
            depth += 1
            out.append(ch)
        elif ch == "}":
            depth -= 1
            out.append(ch)
        elif depth == 0 and (m := re.match(r"(==|!=|>=|<=|>|<)(?!\s*bool\b)", promql[i:])):
            out.append(f"{m.group(1)} bool")
            i += len(m.group(1))
            continue
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def _assert_dashboard_queries_return_data(prometheus: Prometheus) -> None:
    expressions = dashboard_expressions()
    assert len(expressions) >= 20
    empty = [f"{title}: {expr}" for title, expr in expressions if not prometheus.query(expr)]
    assert [] == empty
    values = prometheus.api(
        "label/query/values?" + urllib.parse.urlencode({"match[]": "lakehouse_ingest_query_up"})
    )
    assert QUERIES <= set(values), "the dashboard's query variable lists both queries"


def _assert_alert_expressions_return_data(prometheus: Prometheus) -> None:
    alerts = alert_expressions()
    assert len(alerts) >= 7
    for name, metric in EVENT_ONLY_ALERTS.items():
        assert not prometheus.query(metric), f"{metric} exists without its event"
        assert f"alertname: {name}" in ALERT_TESTS.read_text(), f"{name} has no promtool test"
    empty = []
    for name, expr in alerts:
        if name in EVENT_ONLY_ALERTS:
            continue
        relaxed = without_thresholds(expr)
        assert relaxed != expr, f"{name}: no threshold found in {expr}"
        # A test a few minutes long has no history for a look-back window to compare with.
        relaxed = re.sub(r"\s+offset\s+\d+[smhdwy]\b", "", relaxed)
        if not prometheus.query(relaxed):
            empty.append(f"{name}: {relaxed}")
    assert [] == empty


def _assert_the_consumer_group_holds_the_checkpoint(lake: Lake) -> None:
    """Every record is in (no lag): the group's committed offsets are the topics' ends."""
    for topic in (lake.users_topic, lake.sensors_topic):
        ends = end_offsets(lake.bootstrap_servers, topic)
        _eventually(
            partial(
                lambda t, e: group_offsets(lake.bootstrap_servers, lake.consumer_group, t, e) == e,
                topic,
                ends,
            ),
            30,
            f"{topic}'s group offsets",
        )


def _assert_the_driver_jvm_is_exported(prometheus: Prometheus) -> None:
    used = _value(prometheus, 'sum(lakehouse_ingest_jvm_memory_used_bytes{area="heap"})')
    most = _value(prometheus, 'sum(lakehouse_ingest_jvm_memory_max_bytes{area="heap"})')
    # INGEST_SPARK_DRIVER_MEMORY is 1g in the tests.
    assert 0 < used <= most <= 1024**3, (used, most)
    assert _value(prometheus, "sum(lakehouse_ingest_jvm_threads)") > 10
    assert prometheus.query("lakehouse_ingest_jvm_gc_collection_seconds_total")


def _assert_every_rule_evaluates(prometheus: Prometheus) -> None:
    rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
    assert {name for name, _ in alert_expressions()} == {r["name"] for r in rules}
    unhealthy = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert [] == unhealthy


def _assert_logs_are_json_without_secrets(service: ServiceProcess) -> None:
    text = service.log_text()
    assert SASL_SECRET not in text
    events: list[dict[str, Any]] = []
    foreign = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if not line.startswith(JVM_LAUNCHER_NOTICES):
                foreign.append(line)
    assert [] == foreign[:5], f"{len(foreign)} lines are not JSON"
    batches = [e for e in events if e.get("event") == "batch_written"]
    assert QUERIES <= {e["query"] for e in batches}
    batches = [e for e in batches if e["query"] in QUERIES]
    for key in ("batch_id", "rows_in", "quarantined", "rows_out", "duration_ms"):
        assert all(key in e for e in batches), key
    assert any(e.get("source") == "jvm" for e in events), "the JVM logs JSON lines too"
    lifecycle = {e.get("event") for e in events}
    assert {"starting", "query_started", "running"} <= lifecycle
    starting = next(e for e in events if e.get("event") == "starting")
    assert "**********" == starting["settings"]["kafka_sasl_password"]


def _assert_status_reports_checkpoint_lag_and_tables(lake: Lake) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "service", "status", "--json"],
        cwd=REPO,
        env={**_base_env(), **lake.env(INGEST_SPARK_DRIVER_MEMORY="512m")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert 0 == result.returncode, result.stderr[-3000:] + result.stdout[-2000:]
    status = json.loads(result.stdout)
    assert status["driver"] is None, "the driver was killed"
    assert "no driver answering at http://127.0.0.1:" in status["driver_error"]
    assert QUERIES <= {q["query"] for q in status["queries"]}
    assert status["lease"]["held"], "a killed driver leaves its lease behind"
    tables = {t["table"]: t for t in status["tables"]}
    for query in (q for q in status["queries"] if q["query"] in QUERIES):
        topic = query["topic"]
        ends = end_offsets(lake.bootstrap_servers, topic)
        assert query["last_committed_batch"] is not None
        assert query["last_batch_time"] is not None
        by_partition = {p["partition"]: p for p in query["partitions"]}
        assert set(ends) == set(by_partition)
        for partition, end in ends.items():
            row = by_partition[partition]
            assert end == row["latest"]
            assert end - row["committed"] == row["lag"]
        committed = sum(p["committed"] for p in query["partitions"])
        assert sum(ends.values()) - committed == query["lag"]
        bronze = tables[f"bronze/{'users' if query['query'] == 'ingest_users' else 'sensors'}"]
        # Every committed batch is in bronze; a batch cut short by the kill may be too.
        assert committed <= bronze["rows"] <= sum(ends.values())
        assert bronze["version"] >= query["last_committed_batch"] + 1
    assert tables["silver/quarantine"]["rows"] > 0
    # The contract each silver table was written under, recorded at the driver's start.
    for contract in SHIPPED.contracts:
        silver = tables[contract_tables(contract).silver.name]
        assert (contract.fingerprint, None) == (silver["contract"], silver["contract_file"])


def _assert_status_asks_the_running_driver(lake: Lake, http_port: int, pid: int) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "service", "status", "--json"],
        cwd=REPO,
        env={**_base_env(), **lake.env(INGEST_HTTP_PORT=str(http_port))},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert 0 == result.returncode, result.stderr[-3000:] + result.stdout[-2000:]
    driver = json.loads(result.stdout)["driver"]
    assert pid == driver["pid"]
    assert driver["alive"]
    assert driver["ready"], driver["ready_reason"]
    now = {q["query"]: q for q in driver["queries"]}
    assert QUERIES <= set(now)
    assert all(now[q]["active"] and now[q]["records_waiting"] == 0 for q in QUERIES), now


def _start_feeder(lake: Lake) -> subprocess.Popen[bytes]:
    """The generator producing readings at a steady rate, so batches keep needing S3."""
    return subprocess.Popen(
        [sys.executable, "-m", "service", "generate", "--users", "5", "--rate", "20"],
        cwd=REPO,
        env={**_base_env(), **lake.env(INGEST_LOG_LEVEL="WARNING")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _base_env() -> dict[str, str]:
    return dict(os.environ)


def _produced_records(summary: dict[str, Any]) -> int:
    """Records the generator put into both topics, from its summary line."""
    total = sum(int(v) for v in summary["produced"].values())
    assert total > 0, f"unexpected generator summary: {summary}"
    return total


def _value(prometheus: Prometheus, promql: str) -> float:
    result = prometheus.query(promql)
    return float(result[0]["value"][1]) if result else 0.0


def _http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback test URL
        body: bytes = response.read()
        return body.decode()


def _http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def _http_body(url: str) -> str:
    try:
        return _http_get(url)
    except urllib.error.HTTPError as e:
        return bytes(e.read()).decode()


def _eventually(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, AssertionError, KeyError, ValueError):
            if check():
                return
        time.sleep(1)
    raise AssertionError(f"not within {timeout:.0f}s: {what}")
