"""Alert rules (promtool), their runbooks, and the dashboard's use of real metric names.

The rules and the dashboard have one copy each, inside the Helm chart (Helm reads only
the chart's files); the promtool unit tests are deploy/prometheus/alerts_test.yml, run
with Debian's promtool and with the one of the Prometheus compose pins (`make tools`).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from service.config import default_cache_dir
from service.driver.metrics import IngestMetrics, MetricsListener
from service.ingest.query import IngestQuery
from service.lake.tables import SHIPPED
from service.streaming.listener import progress_event
from tests.support.progress import recorded
from tests.support.repo import REPO

PROMETHEUS = REPO / "deploy" / "prometheus"
CHART_FILES = REPO / "helm" / "lakehouse-ingest" / "files"
RULES = CHART_FILES / "rules" / "alerts.yml"
DASHBOARD = CHART_FILES / "dashboards" / "lakehouse-ingest.json"
RUNBOOKS = REPO / "docs" / "runbooks"
REQUIRED_ALERTS = {
    "QueryDown",
    "NoProgress",
    "KafkaLagHigh",
    "KafkaLagGrowing",
    "BatchSlowerThanTrigger",
    "FreshnessSLOBreached",
    "QuarantineSpike",
    "DriverRestarting",
}


# Debian's promtool (2.x, `make prometheus`) and the one of the Prometheus compose pins
# (3.x, `make tools`): range selectors and staleness changed between them.
PROMTOOLS = ("debian", "pinned")


def promtool(*args: str, which: str = "debian") -> subprocess.CompletedProcess[str]:
    if which == "debian":
        binary = shutil.which("promtool")
        assert binary, "promtool not installed: run `make prometheus`"
    else:
        pinned = default_cache_dir() / "bin" / "promtool-3"
        assert pinned.exists(), f"{pinned} missing: run `make tools`"
        binary = str(pinned)
    return subprocess.run(
        [binary, *args], cwd=PROMETHEUS, capture_output=True, text=True, check=False
    )


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


@pytest.mark.parametrize("which", PROMTOOLS)
def test_promtool_check_rules_accepts_the_alert_rules(which: str) -> None:
    result = promtool("check", "rules", str(RULES), which=which)
    assert 0 == result.returncode, result.stdout + result.stderr


def test_the_promtool_unit_tests_load_the_charts_rule_file() -> None:
    unit = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())
    assert [RULES] == [(PROMETHEUS / path).resolve() for path in unit["rule_files"]]


@pytest.mark.parametrize("which", PROMTOOLS)
def test_promtool_unit_tests_of_the_alerts_pass(which: str) -> None:
    result = promtool("test", "rules", "alerts_test.yml", which=which)
    assert 0 == result.returncode, result.stdout + result.stderr


def test_the_pinned_promtool_is_the_prometheus_compose_runs() -> None:
    """Prometheus 3.M.P's Go module is tagged v0.(300+M).P."""
    makefile = (REPO / "Makefile").read_text()
    module = re.search(r"^PROMETHEUS_MODULE_VERSION := v0\.3(\d\d)\.(\d+)$", makefile, re.M)
    assert module is not None
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    image = compose["services"]["prometheus"]["image"]
    assert f"prom/prometheus:v3.{int(module.group(1))}.{module.group(2)}" == image


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    tests = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())["tests"]
    cases = [case for test in tests for case in test.get("alert_rule_test", [])]
    for name in {rule["alert"] for rule in alert_rules()}:
        outcomes = {bool(c.get("exp_alerts")) for c in cases if c["alertname"] == name}
        assert {True, False} == outcomes, f"{name}: needs a firing and a quiet case"


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: rule["alert"])
def test_alert_has_severity_annotations_and_a_runbook(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in {"critical", "warning"}
    assert {"summary", "description", "runbook_url"} <= set(rule["annotations"])
    url = rule["annotations"]["runbook_url"]
    assert url.endswith(f"/docs/runbooks/{rule['alert']}.md")
    runbook = (RUNBOOKS / f"{rule['alert']}.md").read_text()
    for section in ("## Meaning", "## Impact", "## Diagnosis", "## Mitigation"):
        assert section in runbook, f"{rule['alert']}.md lacks {section}"


def test_required_alerts_exist() -> None:
    assert REQUIRED_ALERTS <= {rule["alert"] for rule in alert_rules()}


# Families the service side of issue #42 adds, which the alerts and the dashboard use
# already: the driver JVM's memory, collections and threads (sampled from the JVM, so a
# registry without a JVM has no samples of them) and the consumer-group offset commits.
SERVICE_SIDE_METRICS = {
    "lakehouse_ingest_jvm_memory_used_bytes",
    "lakehouse_ingest_jvm_memory_max_bytes",
    "lakehouse_ingest_jvm_gc_collection_seconds_total",
    "lakehouse_ingest_jvm_threads",
    "lakehouse_ingest_consumer_group_commits_total",
}


def exported_names() -> set[str]:
    """Every sample name the service exports once queries ran (recorded fixtures)."""
    registry = CollectorRegistry()
    metrics = IngestMetrics(registry)
    listener = MetricsListener(metrics)
    for name in ("kafka_caught_up.json", "watermark_dropped_late_rows.json"):
        listener.onQueryProgress(progress_event(json.dumps(recorded(name)["progress"])))
    query = IngestQuery(SHIPPED.contracts["sensors"])
    metrics.query_declared(query.name, [t.name for t in query.tables], 10.0)
    metrics.batch_written(query.name, {"bronze/sensors": 1}, {}, 0)
    metrics.lag.kafka_lag_polled(query.name, query.topic, [0], 100)
    metrics.watch_storage(lambda: 0.0)
    metrics.watch_readiness(lambda: (True, "ok"))
    # The executors a local-mode configuration asks for (set at start, from the settings).
    metrics.jvm.executors_expected(0)
    # The families that exist only once something happened: a reconcile check, a skip at
    # start, a maintenance run.
    metrics.reconcile.reconcile_checked({"bronze/sensors": 1}, 0, 0.1)
    metrics.reconcile.reconcile_failed()
    metrics.offsets_skipped(query.topic, 1)
    metrics.maintenance.table_files_counted("bronze/sensors", 3)
    metrics.maintenance.maintenance_succeeded("bronze/sensors", 1.0)
    metrics.maintenance.maintenance_failed("bronze/sensors")
    return {sample.name for family in registry.collect() for sample in family.samples}


def referenced_names(promql: str) -> set[str]:
    return set(re.findall(r"\blakehouse_ingest_[a-z_]+\b", promql))


def test_every_dashboard_and_alert_expression_names_exported_metrics_only() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    targets = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    rules = [rule["expr"] for rule in alert_rules()]
    assert targets and rules, "the dashboard has no targets or alerts.yml no alert rules"
    exported = exported_names() | SERVICE_SIDE_METRICS
    # An expression naming none of our metrics (a misspelt prefix, say) is wrong too: it
    # shows up with an empty list of unexported names.
    wrong = {
        expr: sorted(names - exported)
        for expr in targets + rules
        if not (names := referenced_names(expr)) or names - exported
    }
    assert {} == wrong


def test_dashboard_has_a_query_variable_used_by_every_per_query_panel() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (
        'label_values(lakehouse_ingest_query_up{namespace=~"$namespace",job="$job",'
        'instance=~"$instance"}, query)' == variables["query"]["definition"]
    )
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            assert "${datasource}" == target["datasource"]["uid"]
            per_query = "query" in panel["title"].lower() or "by (query" in expr
            if per_query and "build_info" not in expr:
                assert 'query=~"$query"' in expr, f"{panel['title']}: {expr}"
