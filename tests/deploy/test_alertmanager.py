"""The Alertmanager configuration Compose runs and the chart's AlertmanagerConfig is made
of: valid for the pinned amtool, every alert routed, and inhibit rules that make one
storage outage one page, on a real Alertmanager on loopback."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.alertmanager import (
    ALERTMANAGER_CONFIG,
    amtool,
    matcher,
    notified,
    shipped_config,
    webhook,
)
from tests.support.alertmanager import alertmanager as running_alertmanager
from tests.support.chart import CHART, MONITORING_API, template

RULES = CHART / "files" / "rules" / "alerts.yml"
ALERTMANAGER_CONFIG_API = "monitoring.coreos.com/v1alpha1/AlertmanagerConfig"


def alerts() -> dict[str, dict[str, Any]]:
    """The alert rules of the chart's rule file, by name."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def alertnames(matchers: list[str]) -> set[str]:
    """The alert names a list of matchers selects (`=` or an `=~` alternation)."""
    names: set[str] = set()
    for text in matchers:
        name, operator, value = matcher(text)
        if name == "alertname":
            assert operator in {"=", "=~"}, text
            names |= set(value.split("|"))
    return names


def test_amtool_accepts_the_configuration() -> None:
    result = amtool("check-config", str(ALERTMANAGER_CONFIG))
    assert 0 == result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize("name", sorted(alerts()))
def test_every_alert_reaches_the_on_call_receiver(name: str) -> None:
    severity = alerts()[name]["labels"]["severity"]
    result = amtool(
        "config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}",
        "--verify.receivers=on-call", f"alertname={name}", f"severity={severity}",
        "job=lakehouse-ingest",
    )  # fmt: skip
    assert 0 == result.returncode, result.stdout + result.stderr


def test_inhibit_rules_name_existing_alerts_and_stay_within_one_release() -> None:
    rules = shipped_config()["inhibit_rules"]
    assert rules
    for rule in rules:
        assert {"namespace", "job"} <= set(rule["equal"]), rule
        sources = alertnames(rule["source_matchers"])
        targets = alertnames(rule["target_matchers"])
        assert sources and targets and (sources | targets) <= set(alerts()), rule
        # Only a page inhibits: a warning never hides a critical alert.
        assert {"critical"} == {alerts()[s]["labels"]["severity"] for s in sources}, rule


def test_the_chart_ships_the_inhibit_rules_as_an_alertmanager_config() -> None:
    def render(*api: str) -> list[dict[str, Any]]:
        flags = tuple(f for a in api for f in ("--api-versions", a))
        result = template(None, True, flags=flags)
        assert 0 == result.returncode, result.stderr
        documents = yaml.safe_load_all(result.stdout)
        return [d for d in documents if d and d["kind"] == "AlertmanagerConfig"]

    assert [] == render(), "only where the cluster serves AlertmanagerConfig"
    (config,) = render(MONITORING_API, ALERTMANAGER_CONFIG_API)
    assert "monitoring.coreos.com/v1alpha1" == config["apiVersion"]

    def text(matchers: list[dict[str, str]]) -> list[str]:
        return [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in matchers]

    rendered = [
        {
            "source_matchers": text(r["sourceMatch"]),
            "target_matchers": text(r["targetMatch"]),
            "equal": r["equal"],
        }
        for r in config["spec"]["inhibitRules"]
    ]
    assert shipped_config()["inhibit_rules"] == rendered


@pytest.fixture
def notifications() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A webhook receiver on loopback: its URL and the notifications it received."""
    with webhook() as received:
        yield received


@pytest.fixture
def alertmanager(tmp_path: Path, notifications: tuple[str, list[dict[str, Any]]]) -> Iterator[int]:
    """The pinned Alertmanager with the shipped configuration, its receiver the webhook."""
    with running_alertmanager(tmp_path, notifications[0]) as port:
        yield port


def test_a_storage_outage_notifies_once_as_storage_unreachable(
    alertmanager: int, notifications: tuple[str, list[dict[str, Any]]]
) -> None:
    """What Prometheus sends in an outage: StorageUnreachable and its consequences, of one
    release; another release's NoProgress is not inhibited by it."""
    ours = {"job": "ingest-lakehouse-ingest", "namespace": "lakehouse"}
    firing = [
        {"alertname": "StorageUnreachable", "severity": "critical", "instance": "a:8080"},
        {"alertname": "NoProgress", "severity": "critical", "instance": "a:8080",
         "query": "ingest_sensors"},
        {"alertname": "FreshnessSLOBreached", "severity": "critical", "query": "ingest_sensors",
         "basis": "caught_up"},
        {"alertname": "QueryDown", "severity": "critical", "instance": "a:8080",
         "query": "gold_alerts"},
        {"alertname": "KafkaLagGrowing", "severity": "warning", "instance": "a:8080",
         "query": "ingest_sensors", "topic": "sensors"},
    ]  # fmt: skip
    other = {"alertname": "NoProgress", "severity": "critical", "job": "other-lakehouse-ingest",
             "namespace": "lakehouse", "instance": "b:8080", "query": "ingest_sensors"}  # fmt: skip
    body = json.dumps([{"labels": {**ours, **labels}} for labels in firing] + [{"labels": other}])
    request = urllib.request.Request(
        f"http://127.0.0.1:{alertmanager}/api/v2/alerts",
        data=body.encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=5).close()  # noqa: S310 - http on loopback

    received = notifications[1]
    deadline = time.monotonic() + 30
    while len(received) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)  # an inhibition that failed would be notified by now too

    assert [
        ("NoProgress", "other-lakehouse-ingest"),
        ("StorageUnreachable", "ingest-lakehouse-ingest"),
    ] == notified(received)
