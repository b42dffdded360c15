"""The alert rules and the dashboard (their one copy: helm/lakehouse-ingest/files): alerts
scoped to one job, summaries that say something, dashboard panels narrowed by namespace and
instance.

The alert logic itself is tested by promtool (deploy/prometheus/alerts_test.yml, run by
test_rules.py and, against the chart's PrometheusRule, by test_chart.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
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


def test_the_absent_case_has_a_summary_without_the_missing_query_label() -> None:
    (absent_case,) = [
        alert
        for test in unit_tests()
        for case in test.get("alert_rule_test", [])
        if case["alertname"] == "QueryDown"
        for alert in case.get("exp_alerts") or []
        if "query" not in alert["exp_labels"]
    ]
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
    assert '{namespace=~"$namespace"}' in variables["instance"]["definition"]
    names = [v["name"] for v in dashboard()["templating"]["list"]]
    assert names.index("namespace") < names.index("instance")


def test_every_panel_query_is_narrowed_by_namespace_and_instance() -> None:
    targets = [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]
    assert targets
    for expr in targets:
        selectors = list(METRIC_SELECTOR.finditer(expr))
        assert selectors, expr
        for selector in selectors:
            matchers = selector.group(2) or ""
            assert 'namespace=~"$namespace"' in matchers, selector.group(0)
            assert 'instance=~"$instance"' in matchers, selector.group(0)
