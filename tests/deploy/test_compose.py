"""docker-compose.yml: valid Compose, pinned images, real settings, files that exist.

No Docker engine runs here: the file is validated against the Compose
Specification's JSON schema (shipped in the check-jsonschema package) and
cross-checked against the service's settings and the repo's pinned versions.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from service.config import Settings, env_name, load_settings
from tests.support.repo import REPO

COMPOSE_FILE = REPO / "docker-compose.yml"
SERVICE_IMAGE = "lakehouse-ingest"
INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def compose() -> dict[str, Any]:
    """The compose file as data (before variable interpolation)."""
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


def services() -> dict[str, dict[str, Any]]:
    """Compose services by name."""
    result: dict[str, dict[str, Any]] = compose()["services"]
    return result


def interpolate(value: object) -> str:
    """A value as Compose sees it with no variables set (``${X:-default}`` → default)."""
    return INTERPOLATION.sub(lambda m: m.group(2) or "", str(value))


def service_image_services() -> dict[str, dict[str, Any]]:
    """The services that run the lakehouse-ingest image (the service and the generator)."""
    return {
        name: svc
        for name, svc in services().items()
        if str(svc.get("image", "")).split(":")[0] == SERVICE_IMAGE
    }


def test_validates_against_the_compose_specification_schema() -> None:
    schema_file = (
        importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    )
    schema = json.loads(schema_file.read_text())
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator_cls(schema).iter_errors(compose())
    ]
    assert [] == errors


def test_has_the_whole_stack() -> None:
    expected = {"kafka", "minio", "minio-init", "ingest", "generator", "prometheus", "grafana"}
    assert expected <= set(services())
    assert services()["kafka"]["image"].startswith("apache/kafka:")
    assert "build" in services()["ingest"]
    generator = services()["generator"]
    assert "generate" == generator["command"][0] and "--rate" in generator["command"]
    # A new seed at each start: the same one would send the last run's event ids again.
    assert (
        "${GENERATOR_SEED:-random}"
        == generator["command"][generator["command"].index("--seed") + 1]
    )


def test_every_image_is_pinned_to_a_version_tag() -> None:
    for name, svc in services().items():
        image = str(svc["image"])
        repository, _, tag = image.rpartition(":")
        assert repository and tag and tag != "latest" and re.search(r"\d", tag), (name, image)


def test_versions_agree_with_the_rest_of_the_repo() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for name, svc in service_image_services().items():
        assert f"{SERVICE_IMAGE}:{version}" == svc["image"], name
    chart = yaml.safe_load((REPO / "helm/lakehouse-ingest/Chart.yaml").read_text())
    assert version == chart["appVersion"]
    kafka_pom = (REPO / "deploy/jvm/kafka/pom.xml").read_text()
    kafka_version = re.search(r"<kafka.version>([^<]+)</kafka.version>", kafka_pom)
    assert kafka_version is not None
    for name in ("kafka", "kafka-init"):
        assert f"apache/kafka:{kafka_version.group(1)}" == services()[name]["image"]


def test_every_ingest_and_aws_variable_is_a_real_setting() -> None:
    known = {env_name(field) for field in Settings.model_fields} | {"INGEST_CONFIG_FILE"}
    for name, svc in service_image_services().items():
        env = svc["environment"]
        assert isinstance(env, dict), "environment as a mapping"
        unknown = {k for k in env if k.startswith(("INGEST_", "AWS_")) and k not in known}
        assert set() == unknown, name


@pytest.mark.parametrize("name", ["ingest", "generator"])
def test_the_service_settings_it_sets_are_valid(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith(("INGEST_", "AWS_"))]:
        monkeypatch.delenv(var)
    for key, value in services()[name]["environment"].items():
        monkeypatch.setenv(key, interpolate(value))
    settings = load_settings()
    assert settings.uses_s3
    assert "kafka:9092" == settings.kafka_bootstrap_servers


def test_credentials_come_from_variables_not_literals() -> None:
    for name, svc in services().items():
        for key, value in (svc.get("environment") or {}).items():
            if re.search(r"SECRET|PASSWORD|ACCESS_KEY", key):
                assert INTERPOLATION.fullmatch(str(value)), (name, key)


def test_dependencies_wait_on_health_or_completion() -> None:
    svcs = services()
    for name, svc in svcs.items():
        for dependency, spec in (svc.get("depends_on") or {}).items():
            condition = spec["condition"]
            assert condition in {
                "service_healthy",
                "service_completed_successfully",
                "service_started",
            }
            if condition == "service_healthy":
                assert "healthcheck" in svcs[dependency], f"{name} waits on {dependency}"
            if condition == "service_completed_successfully":
                assert "no" == svcs[dependency].get("restart", "no")
    ingest = svcs["ingest"]["depends_on"]
    assert "service_completed_successfully" == ingest["minio-init"]["condition"]
    assert "service_completed_successfully" == ingest["kafka-init"]["condition"]
    for name in ("kafka", "minio", "ingest", "prometheus", "grafana"):
        assert "healthcheck" in svcs[name], name


def test_the_service_runs_hardened_with_a_grace_period_for_the_batch_in_flight() -> None:
    ingest = services()["ingest"]
    assert ingest["read_only"] is True
    assert ["/tmp"] == ingest["tmpfs"]
    assert ["ALL"] == ingest["cap_drop"]
    assert "10001:10001" == ingest["user"]
    budget = int(ingest["environment"]["INGEST_STOP_TIMEOUT_SECONDS"])
    assert int(str(ingest["stop_grace_period"]).rstrip("s")) == budget + 30


def test_every_bind_mount_source_exists() -> None:
    for name, svc in services().items():
        for volume in svc.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith("."):
                assert (REPO / source).exists(), f"{name}: {source}"


def test_prometheus_config_is_valid_and_loads_exactly_the_charts_rule_files() -> None:
    config = REPO / "deploy/compose/prometheus.yml"
    result = subprocess.run(
        ["promtool", "check", "config", "--syntax-only", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert 0 == result.returncode, result.stdout + result.stderr
    data = yaml.safe_load(config.read_text())
    assert ["ingest:8080"] == data["scrape_configs"][0]["static_configs"][0]["targets"]
    mounts = {
        str(v).split(":")[1]: str(v).split(":")[0] for v in services()["prometheus"]["volumes"]
    }
    rules_dir = REPO / mounts["/etc/prometheus/rules"]
    assert REPO / "helm/lakehouse-ingest/files/rules" == rules_dir.resolve()
    loaded = {
        path
        for pattern in data["rule_files"]
        for path in rules_dir.glob(str(Path(pattern).relative_to("/etc/prometheus/rules")))
    }
    # What the chart's PrometheusRule reads (templates/prometheusrule.yaml): every file.
    rule_files = set(rules_dir.glob("*.yml")) | set(rules_dir.glob("*.yaml"))
    assert rule_files, "no alert rules in helm/lakehouse-ingest/files/rules/"
    assert rule_files == loaded
    result = subprocess.run(
        ["promtool", "check", "rules", *sorted(map(str, loaded))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert 0 == result.returncode, result.stdout + result.stderr


def test_grafana_provisions_the_charts_dashboards_with_the_compose_prometheus() -> None:
    grafana = services()["grafana"]
    env = grafana["environment"]
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in grafana["volumes"]}
    repo_in_container = env["LAKEHOUSE_INGEST_REPO"]
    provisioning = Path(env["GF_PATHS_PROVISIONING"]).relative_to(repo_in_container)
    assert f"./{provisioning}" == mounts[env["GF_PATHS_PROVISIONING"]]
    assert (REPO / provisioning / "datasources").is_dir()
    providers = yaml.safe_load(
        (REPO / provisioning / "dashboards" / "lakehouse-ingest.yml").read_text()
    )["providers"]
    (path,) = [p["options"]["path"] for p in providers]
    in_container = path.replace("${LAKEHOUSE_INGEST_REPO}", repo_in_container)
    dashboards = REPO / mounts[in_container]
    assert REPO / "helm/lakehouse-ingest/files/dashboards" == dashboards.resolve()
    assert list(dashboards.glob("*.json")), "no dashboards to provision"
    datasources = "".join(p.read_text() for p in (REPO / provisioning / "datasources").iterdir())
    assert "${PROMETHEUS_URL}" in datasources
    assert "http://prometheus:9090" == env["PROMETHEUS_URL"]


def test_consoles_with_default_credentials_listen_on_loopback_only() -> None:
    """MinIO, Grafana and the Spark UI (and Prometheus, Kafka's host listener) are published
    on 127.0.0.1, not on every interface of the host."""
    published = {
        (name, str(port).rsplit(":", 1)[-1]): str(port)
        for name, svc in services().items()
        for port in svc.get("ports", [])
    }
    loopback = {
        ("minio", "9000"),
        ("minio", "9001"),
        ("grafana", "3000"),
        ("ingest", "4040"),
        ("prometheus", "9090"),
        ("kafka", "29092"),
    }
    assert loopback <= set(published)
    for key in loopback:
        assert published[key].startswith("127.0.0.1:"), published[key]
    spark_ui = int(services()["ingest"]["environment"]["INGEST_SPARK_UI_PORT"])
    assert f"127.0.0.1:{spark_ui}:{spark_ui}" in services()["ingest"]["ports"]


def test_prometheus_alerts_the_alertmanager_that_runs_the_charts_configuration() -> None:
    prometheus = yaml.safe_load((REPO / "deploy/compose/prometheus.yml").read_text())
    (target,) = prometheus["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert "alertmanager:9093" == target
    alertmanager = services()["alertmanager"]
    makefile = (REPO / "Makefile").read_text()
    pinned = re.search(r"^ALERTMANAGER_VERSION := (\S+)$", makefile, re.M)
    assert pinned is not None
    assert f"prom/alertmanager:{pinned.group(1)}" == alertmanager["image"]
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in alertmanager["volumes"]}
    config_dir = (REPO / mounts["/etc/alertmanager"]).resolve()
    assert REPO / "helm/lakehouse-ingest/files/alertmanager" == config_dir
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in alertmanager["command"]
    assert "127.0.0.1:9093:9093" in alertmanager["ports"]
    assert "service_healthy" == services()["prometheus"]["depends_on"]["alertmanager"]["condition"]
