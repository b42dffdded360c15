"""The alert rules and the dashboard (their one copy: helm/lakehouse-ingest/files): alerts
scoped to one job, summaries that say something, dashboard panels narrowed by namespace and
instance.

The alert logic itself is tested by promtool (deploy/prometheus/alerts_test.yml, run by
test_rules.py and, against the chart's PrometheusRule, by test_chart.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from tests.support.repo import REPO

PROMETHEUS = REPO / "deploy" / "prometheus"
CHART_FILES = REPO / "helm" / "lakehouse-ingest" / "files"
RULES = CHART_FILES / "rules" / "alerts.yml"
DASHBOARD = CHART_FILES / "dashboards" / "lakehouse-ingest.json"
# The scrape job of Docker Compose and of the integration tests' Prometheus.
JOB = "lakehouse-ingest"
METRIC_SELECTOR = re.compile(r"\b(lakehouse_ingest_[a-z_]+)(\{[^}]*\})?")


def alert_rules() -> list[dict[str, Any]]:
    """The alert rules of alerts.yml."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def unit_tests() -> list[dict[str, Any]]:
    """The promtool unit tests of deploy/prometheus/alerts_test.yml."""
    tests: list[dict[str, Any]] = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())[
        "tests"
    ]
    return tests


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: rule["alert"])
def test_every_alert_selector_names_the_job(rule: dict[str, Any]) -> None:
    selectors = list(METRIC_SELECTOR.finditer(rule["expr"]))
    assert selectors
    for selector in selectors:
        assert f'job="{JOB}"' in (selector.group(2) or ""), selector.group(0)


def test_the_alerts_job_is_the_job_compose_and_the_tests_scrape() -> None:
    compose = yaml.safe_load((REPO / "deploy/compose/prometheus.yml").read_text())
    integration = yaml.safe_load((PROMETHEUS / "prometheus-test.yml.in").read_text())
    for config in (compose, integration):
        jobs = {c["job_name"] for c in config["scrape_configs"]}
        assert JOB in jobs


def test_every_test_series_has_a_job_to_move_to_a_release() -> None:
    for test in unit_tests():
        for series in test["input_series"]:
            assert re.search(r'\bjob="[^"]+"', series["series"]), series["series"]


def test_another_job_appears_in_the_tests_of_absent_and_of_a_threshold() -> None:
    """The cases where a foreign series must neither hide nor raise an alert exist."""
    foreign = {
        case["alertname"]
        for test in unit_tests()
        if any(f'job="{JOB}"' not in s["series"] for s in test["input_series"])
        for case in test.get("alert_rule_test", [])
    }
    expected = {
        "QueryDown",
        "KafkaLagHigh",
        "StorageUnreachable",
        "FreshnessSLOBreached",
        "LakeInvariantBroken",
        "ReconcileFailing",
        "ReconcileStale",
        "KafkaLagStale",
        "KafkaOffsetsSkipped",
    }
    assert expected <= foreign


def test_every_alert_fires_in_a_test_that_checks_a_meaningful_summary() -> None:
    summaries: dict[str, list[str]] = {}
    for test in unit_tests():
        for case in test.get("alert_rule_test", []):
            for alert in case.get("exp_alerts") or []:
                summary = alert["exp_annotations"]["summary"]
                summaries.setdefault(case["alertname"], []).append(summary)
    assert {rule["alert"] for rule in alert_rules()} == set(summaries)
    for name, texts in summaries.items():
        for text in texts:
            # An empty label renders as a doubled or dangling space ("query  is down").
            assert text == " ".join(text.split()), (name, text)
            assert "{{" not in text and "<no value>" not in text, (name, text)


def test_every_alert_fires_in_a_case_that_starts_from_a_restart() -> None:
    """A case with a driver whose series end (stale) or begin mid-test (`_`): what a
    restart looks like to Prometheus. Series a new driver declares at start let each alert
    fire from there."""

    def restarts(test: dict[str, Any]) -> bool:
        return any(
            "stale" in str(s["values"]) or str(s["values"]).startswith("_")
            for s in test["input_series"]
        )

    fired = {
        case["alertname"]
        for test in unit_tests()
        if restarts(test)
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert set() == {rule["alert"] for rule in alert_rules()} - fired


def test_the_absent_case_has_a_summary_without_the_missing_query_label() -> None:
    absent_cases = [
        alert
        for test in unit_tests()
        for case in test.get("alert_rule_test", [])
        if case["alertname"] == "QueryDown"
        for alert in case.get("exp_alerts") or []
        if "query" not in alert["exp_labels"]
    ]
    assert absent_cases
    for absent_case in absent_cases:
        assert {"severity": "critical", "job": JOB} == absent_case["exp_labels"]
        assert "no driver exports query metrics" in absent_case["exp_annotations"]["summary"]


def dashboard() -> dict[str, Any]:
    """The Grafana dashboard."""
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def test_dashboard_has_namespace_and_instance_variables_that_default_to_all() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    for name in ("namespace", "instance"):
        variable = variables[name]
        assert "query" == variable["type"]
        assert f", {name})" in variable["definition"]
        assert variable["includeAll"] is True
        # ".*" also matches a missing label: Compose's series have no namespace.
        assert ".*" == variable["allValue"]
        assert ["$__all"] == variable["current"]["value"]
    assert 'namespace=~"$namespace"' in variables["instance"]["definition"]
    assert 'job="$job"' in variables["instance"]["definition"]
    names = [v["name"] for v in dashboard()["templating"]["list"]]
    assert names.index("namespace") < names.index("job") < names.index("instance")


def test_dashboard_job_variable_is_one_job_never_all() -> None:
    """ "All" jobs would add up the series of two releases: the job variable has one value."""
    job = {v["name"]: v for v in dashboard()["templating"]["list"]}["job"]
    assert "query" == job["type"]
    assert (
        'label_values(lakehouse_ingest_build_info{namespace=~"$namespace"}, job)'
        == job["definition"]
    )
    assert job["includeAll"] is False
    assert job["multi"] is False
    assert JOB == job["current"]["value"], "the compose stack's job by default"


def panels() -> list[dict[str, Any]]:
    """Every panel of the dashboard (rows included)."""
    found: list[dict[str, Any]] = dashboard()["panels"]
    return found


def test_every_panel_query_is_narrowed_by_namespace_job_and_instance() -> None:
    targets = [t["expr"] for p in panels() for t in p.get("targets", [])]
    assert targets
    for expr in targets:
        selectors = list(METRIC_SELECTOR.finditer(expr))
        assert selectors, expr
        for selector in selectors:
            matchers = selector.group(2) or ""
            assert 'namespace=~"$namespace"' in matchers, selector.group(0)
            assert 'job="$job"' in matchers, selector.group(0)
            assert 'instance=~"$instance"' in matchers, selector.group(0)


def test_every_stat_panel_has_a_unit() -> None:
    stats = [p for p in panels() if p["type"] == "stat"]
    assert len(stats) >= 8
    for panel in stats:
        assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]


def test_the_alert_list_shows_the_selected_jobs_alerts_in_the_selected_namespaces() -> None:
    (alert_list,) = [p for p in panels() if p["type"] == "alertlist"]
    expected = '{namespace=~"${namespace:regex}", job="$job"}'
    assert expected == alert_list["options"]["alertInstanceLabelFilter"]
    assert alert_list["options"]["stateFilter"]["firing"] is True


def test_the_dashboard_answers_are_we_losing_data() -> None:
    """The reconcile's outcome, skipped offsets, total lag, the lag poll's age, the retention
    headroom, and the maintenance state are on it."""
    queried = " ".join(t["expr"] for p in panels() for t in p.get("targets", []))
    for metric in (
        "lakehouse_ingest_reconcile_checks_total",
        "lakehouse_ingest_reconcile_problems",
        "lakehouse_ingest_reconcile_last_check_timestamp_seconds",
        "lakehouse_ingest_reconcile_records_checked_total",
        "lakehouse_ingest_kafka_offsets_skipped_total",
        "lakehouse_ingest_kafka_offsets_behind_latest",
        "lakehouse_ingest_kafka_lag_polled_timestamp_seconds",
        "lakehouse_ingest_kafka_retention_headroom_records",
        "lakehouse_ingest_maintenance_failures_total",
        "lakehouse_ingest_maintenance_last_success_timestamp_seconds",
        "lakehouse_ingest_table_files",
        "lakehouse_ingest_jvm_memory_used_bytes",
        "lakehouse_ingest_jvm_memory_max_bytes",
        "lakehouse_ingest_jvm_gc_collection_seconds_total",
        "lakehouse_ingest_jvm_threads",
    ):
        assert re.search(rf"\b{metric}\{{", queried), metric


def test_lag_panels_say_the_lag_is_polled_against_the_checkpoint() -> None:
    lag_panels = [
        p
        for p in panels()
        if any("offsets_behind_latest" in t["expr"] for t in p.get("targets", []))
    ]
    assert lag_panels
    for panel in lag_panels:
        description = panel["description"]
        assert "polled by the driver" in description, panel["title"]
        assert "checkpoint" in description, panel["title"]
        assert "Spark's Kafka source" not in description, panel["title"]


def alert_threshold(alert: str, line_with: str) -> float:
    """The number an alert compares with, on the first line of its expression that holds
    ``line_with``."""
    (rule,) = [r for r in alert_rules() if r["alert"] == alert]
    line = next(line for line in rule["expr"].splitlines() if line_with in line)
    found = re.search(r"> ([0-9.]+)\s*$", line)
    assert found, line
    return float(found.group(1))


# Panel (by the metric and matcher it queries) → the alert threshold its line or red step is.
THRESHOLD_LINES = [
    ("lakehouse_ingest_kafka_max_offsets_behind_latest", "KafkaLagHigh", "offsets_behind"),
    ('basis="caught_up"', "FreshnessSLOBreached", 'basis="caught_up"'),
    ('basis="watermark"', "FreshnessSLOBreached", 'basis="watermark"'),
    ("lakehouse_ingest_quarantined_rows_total", "QuarantineSpike", ") > "),  # the ratio's
    ("lakehouse_ingest_kafka_lag_polled_timestamp_seconds", "KafkaLagStale", "polled"),
    ("lakehouse_ingest_jvm_gc_collection_seconds_total", "DriverHeapPressure", "gc_collection"),
    ("lakehouse_ingest_last_progress_timestamp_seconds", "NoProgress", "last_progress"),
    ("lakehouse_ingest_storage_heartbeat_timestamp_seconds", "StorageUnreachable", "heartbeat"),
    ("lakehouse_ingest_reconcile_last_check_timestamp_seconds", "ReconcileStale", "time()"),
]


@pytest.mark.parametrize(("queried", "alert", "line_with"), THRESHOLD_LINES)
def test_threshold_lines_are_the_alert_thresholds(queried: str, alert: str, line_with: str) -> None:
    matching = [
        p
        for p in panels()
        if p["type"] in {"timeseries", "stat"}
        and any(queried in t["expr"] for t in p.get("targets", []))
        and "thresholds" in p["fieldConfig"]["defaults"]
    ]
    assert matching, queried
    expected = alert_threshold(alert, line_with)
    for panel in matching:
        defaults = panel["fieldConfig"]["defaults"]
        red = [s["value"] for s in defaults["thresholds"]["steps"] if s["color"] == "red"]
        assert [expected] == red, panel["title"]
        if panel["type"] == "timeseries":
            assert {"mode": "line"} == defaults["custom"]["thresholdsStyle"], panel["title"]
