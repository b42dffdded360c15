"""The Helm chart: lint, render every CI values file, validate against Kubernetes schemas.

`helm` is the pinned build from `make tools`; the Kubernetes OpenAPI-derived JSON
schemas come from the kubernetes-validate package. Prometheus Operator objects
(CRDs, no bundled schema) are checked structurally, and their rules with promtool.
"""

from __future__ import annotations

import filecmp
import json
import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from pydantic import SecretStr

from service.config import Settings, default_cache_dir, env_name

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "lakehouse-ingest"
CI_VALUES = sorted((REPO / "helm" / "ci").glob("*-values.yaml"))
MONITORING_API = "monitoring.coreos.com/v1"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest bundled.
KUBERNETES_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())
NAMESPACE = "lakehouse"
# Rendering target, explicit so the output does not depend on how helm was built.
RENDER_KUBE_VERSION = "1.30.0"
SECRET_VALUES = ("minioadmin", "hunter2", "AKIA")


def helm() -> str:
    """The pinned helm binary (`make tools`)."""
    binary = default_cache_dir() / "bin" / "helm"
    if not binary.exists():
        pytest.fail(f"{binary} missing: run `make tools`")
    return str(binary)


@cache
def render(values: str | None, monitoring_api: bool) -> tuple[dict[str, Any], ...]:
    """`helm template` output as a list of manifests."""
    command = [helm(), "template", "ingest", str(CHART), "--namespace", NAMESPACE]
    command += ["--kube-version", RENDER_KUBE_VERSION]
    if values:
        command += ["--values", values]
    if monitoring_api:
        command += ["--api-versions", MONITORING_API]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert 0 == result.returncode, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def by_kind(manifests: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    """The manifests of one kind."""
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    """The single manifest of ``kind``."""
    (manifest,) = by_kind(manifests, kind)
    return manifest


def cases() -> Iterator[Any]:
    """(values file, monitoring API present) for the defaults and every CI values file."""
    yield pytest.param(None, False, id="defaults")
    yield pytest.param(None, True, id="defaults-with-monitoring-api")
    for path in CI_VALUES:
        api = path.name.startswith("monitoring")
        yield pytest.param(str(path), api, id=path.name.removesuffix("-values.yaml"))


CASES = list(cases())


def executor_pod_template(manifests: tuple[dict[str, Any], ...]) -> dict[str, Any] | None:
    """The executor pod template Spark reads, parsed out of its ConfigMap."""
    for config_map in by_kind(manifests, "ConfigMap"):
        if "executor-pod-template.yaml" in config_map.get("data", {}):
            template: dict[str, Any] = yaml.safe_load(
                config_map["data"]["executor-pod-template.yaml"]
            )
            return template
    return None


def test_helm_lint_is_clean_for_every_values_file() -> None:
    for values in [None, *map(str, CI_VALUES)]:
        command = [helm(), "lint", str(CHART), "--strict", "--namespace", NAMESPACE]
        command += ["--kube-version", RENDER_KUBE_VERSION]
        if values:
            command += ["--values", values]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        assert 0 == result.returncode, f"{values}:\n{result.stdout}{result.stderr}"


def test_ci_values_cover_local_executors_and_monitoring_on_and_off() -> None:
    names = {p.name for p in CI_VALUES}
    expected = {
        "local-values.yaml",
        "k8s-executors-values.yaml",
        "monitoring-values.yaml",
        "monitoring-off-values.yaml",
    }
    assert expected <= names


@pytest.mark.parametrize(("values", "api"), CASES)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_schemas(
    values: str | None, api: bool, version: str
) -> None:
    manifests = render(values, api)
    documents = list(manifests)
    if (template := executor_pod_template(manifests)) is not None:
        documents.append(template)
    for manifest in documents:
        if manifest["apiVersion"] == MONITORING_API:
            continue  # a CRD: checked in test_monitoring_objects_*
        kubernetes_validate.validate(manifest, version, strict=True)


@pytest.mark.parametrize(("values", "api"), CASES)
def test_one_driver_recreated_never_rolled(values: str | None, api: bool) -> None:
    manifests = render(values, api)
    deployment = one(manifests, "Deployment")
    assert 1 == deployment["spec"]["replicas"]
    assert {"type": "Recreate"} == deployment["spec"]["strategy"]
    kinds = {m["kind"] for m in manifests}
    assert not kinds & {"HorizontalPodAutoscaler", "PodDisruptionBudget", "StatefulSet"}


@pytest.mark.parametrize(("values", "api"), CASES)
def test_pods_run_non_root_read_only_without_capabilities(values: str | None, api: bool) -> None:
    manifests = render(values, api)
    pods = [one(manifests, "Deployment")["spec"]["template"]]
    if (template := executor_pod_template(manifests)) is not None:
        pods.append(template)
    for pod in pods:
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] > 0
        assert {"type": "RuntimeDefault"} == spec["securityContext"]["seccompProfile"]
        (container,) = spec["containers"]
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert ["ALL"] == context["capabilities"]["drop"]
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert "/tmp" in mounts
        assert "emptyDir" in volumes["tmp"]


@pytest.mark.parametrize(("values", "api"), CASES)
def test_driver_has_probes_scratch_ports_and_grace_period(values: str | None, api: bool) -> None:
    manifests = render(values, api)
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    (driver,) = pod["containers"]
    assert "/healthz" == driver["startupProbe"]["httpGet"]["path"]
    assert "/healthz" == driver["livenessProbe"]["httpGet"]["path"]
    assert "/readyz" == driver["readinessProbe"]["httpGet"]["path"]
    startup = driver["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, "JVM start-up time"
    assert "memory" in driver["resources"]["limits"]
    assert pod["terminationGracePeriodSeconds"] >= 60
    mounts = {m["mountPath"]: m["name"] for m in driver["volumeMounts"]}
    scratch = {v["name"]: v for v in pod["volumes"]}[mounts["/var/lib/lakehouse-ingest"]]
    assert "emptyDir" in scratch
    service = next(s for s in by_kind(manifests, "Service") if s["spec"].get("clusterIP") != "None")
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert {"http": 8080, "spark-ui": 4040} == ports


@pytest.mark.parametrize(("values", "api"), CASES)
def test_settings_are_real_and_credentials_only_secret_references(
    values: str | None, api: bool
) -> None:
    manifests = render(values, api)
    known = {env_name(field) for field in Settings.model_fields}
    config_map = next(
        m for m in by_kind(manifests, "ConfigMap") if "INGEST_STORAGE_ROOT" in m.get("data", {})
    )
    assert set() == set(config_map["data"]) - known
    secrets = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "INGEST_KAFKA_SASL_PASSWORD"}
    assert set() == set(config_map["data"]) & (secrets | {"INGEST_KAFKA_SASL_USERNAME"})
    assert [] == by_kind(manifests, "Secret"), "the chart references Secrets, never creates them"
    pods = [one(manifests, "Deployment")["spec"]["template"]]
    if (template := executor_pod_template(manifests)) is not None:
        pods.append(template)
    for pod in pods:
        for entry in pod["spec"]["containers"][0].get("env", []):
            if entry["name"] in secrets:
                assert "secretKeyRef" in entry["valueFrom"], entry
                assert "value" not in entry
    text = json.dumps(manifests)
    for literal in SECRET_VALUES:
        assert literal not in text


def test_kafka_sasl_credentials_and_ca_come_from_the_named_secrets() -> None:
    manifests = render(str(REPO / "helm/ci/k8s-executors-values.yaml"), False)
    driver = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
        for e in driver["env"]
        if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]
    }
    assert "lakehouse-kafka" == refs["INGEST_KAFKA_SASL_PASSWORD"]
    assert "lakehouse-s3" == refs["AWS_SECRET_ACCESS_KEY"]
    config = next(m for m in by_kind(manifests, "ConfigMap") if "INGEST_STORAGE_ROOT" in m["data"])
    ca_path = config["data"]["INGEST_KAFKA_SSL_CA_LOCATION"]
    mounts = {m["mountPath"] for m in driver["volumeMounts"]}
    assert str(Path(ca_path).parent) in mounts


@pytest.mark.parametrize(("values", "api"), CASES)
def test_executor_rbac_and_driver_service_exist_only_with_executors(
    values: str | None, api: bool
) -> None:
    manifests = render(values, api)
    enabled = values is not None and "k8s-executors" in values
    kinds = {m["kind"] for m in manifests}
    assert enabled == ("Role" in kinds) == ("RoleBinding" in kinds)
    headless = [s for s in by_kind(manifests, "Service") if s["spec"].get("clusterIP") == "None"]
    assert enabled == bool(headless)
    deployment = one(manifests, "Deployment")["spec"]["template"]["spec"]
    assert enabled == deployment["automountServiceAccountToken"]
    assert enabled == (executor_pod_template(manifests) is not None)
    config = next(m for m in by_kind(manifests, "ConfigMap") if "INGEST_STORAGE_ROOT" in m["data"])
    master = config["data"]["INGEST_SPARK_MASTER"]
    assert master.startswith("k8s://") if enabled else "local[*]" == master
    assert "ClusterRole" not in kinds, "executors need namespace rights only"


def test_executor_wiring_points_spark_at_the_driver_service_and_rbac_subject() -> None:
    manifests = render(str(REPO / "helm/ci/k8s-executors-values.yaml"), False)
    config = next(m for m in by_kind(manifests, "ConfigMap") if "INGEST_STORAGE_ROOT" in m["data"])
    data = config["data"]
    (headless,) = [s for s in by_kind(manifests, "Service") if s["spec"].get("clusterIP") == "None"]
    assert f"{headless['metadata']['name']}.{NAMESPACE}.svc" == data["INGEST_SPARK_DRIVER_HOST"]
    ports = {p["name"]: p["port"] for p in headless["spec"]["ports"]}
    assert str(ports["driver-rpc"]) == data["INGEST_SPARK_DRIVER_PORT"]
    assert str(ports["blockmanager"]) == data["INGEST_SPARK_DRIVER_BLOCK_MANAGER_PORT"]
    binding = one(manifests, "RoleBinding")
    service_account = one(manifests, "ServiceAccount")["metadata"]["name"]
    assert service_account == binding["subjects"][0]["name"]
    assert service_account == data["INGEST_SPARK_KUBERNETES_SERVICE_ACCOUNT"]
    rules = one(manifests, "Role")["rules"]
    assert {"pods", "services", "configmaps"} <= set(rules[0]["resources"])
    deployment = one(manifests, "Deployment")["spec"]["template"]["spec"]
    driver = deployment["containers"][0]
    assert service_account == deployment["serviceAccountName"]
    extra = next(e for e in driver["env"] if e["name"] == "INGEST_SPARK_EXTRA_CONF")
    conf = json.loads(extra["value"])
    assert "$(POD_NAME)" == conf["spark.kubernetes.driver.pod.name"]
    assert "1500m" == conf["spark.kubernetes.executor.request.cores"]
    template_path = data["INGEST_SPARK_KUBERNETES_EXECUTOR_POD_TEMPLATE"]
    mounts = {m["mountPath"] for m in driver["volumeMounts"]}
    assert str(Path(template_path).parent) in mounts
    # The same Settings the driver will build from this ConfigMap are valid.
    settings = Settings(
        **{
            field: data[env_name(field)]
            for field in Settings.model_fields
            if env_name(field) in data
        },
        spark_extra_conf=conf,
        # From the Secret the Deployment references.
        kafka_sasl_username="from-secret",
        kafka_sasl_password=SecretStr("from-secret"),
    )
    assert settings.spark_executor_instances == 3
    template = executor_pod_template(manifests)
    assert template is not None
    executor = template["spec"]["containers"][0]
    assert "/etc/lakehouse-ingest/spark/spark-executor.sh" in executor["command"]


@pytest.mark.parametrize(("values", "api"), CASES)
def test_monitoring_objects_only_when_enabled_and_the_api_exists(
    values: str | None, api: bool
) -> None:
    manifests = render(values, api)
    monitoring_off = values is not None and "monitoring-off" in values
    expected = api and not monitoring_off
    kinds = [m["kind"] for m in manifests]
    assert expected == ("ServiceMonitor" in kinds)
    assert expected == ("PrometheusRule" in kinds)
    dashboards = [
        m
        for m in by_kind(manifests, "ConfigMap")
        if m["metadata"]["labels"].get("grafana_dashboard") == "1"
    ]
    assert expected == bool(dashboards)
    if not expected:
        return
    monitor = one(manifests, "ServiceMonitor")
    assert "http" == monitor["spec"]["endpoints"][0]["port"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    service = next(s for s in by_kind(manifests, "Service") if s["spec"].get("clusterIP") != "None")
    assert selector.items() <= service["metadata"]["labels"].items()
    rule = one(manifests, "PrometheusRule")
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    for alert in alerts:
        assert {"severity"} <= set(alert["labels"])
        assert {"summary", "description", "runbook_url"} <= set(alert["annotations"])
    for config_map in dashboards:
        for body in config_map["data"].values():
            assert "panels" in json.loads(body)


def test_prometheus_rule_passes_promtool(tmp_path: Path) -> None:
    rule = one(render(None, True), "PrometheusRule")
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run(
        ["promtool", "check", "rules", str(rules_file)], capture_output=True, text=True, check=False
    )
    assert 0 == result.returncode, result.stdout + result.stderr


def test_chart_files_are_in_sync_with_deploy() -> None:
    dashboards = sorted((REPO / "deploy/grafana").rglob("*.json"))
    rules = [
        p
        for p in sorted((REPO / "deploy/prometheus").glob("*.y*ml"))
        if re.search(r"(?m)^groups:", p.read_text())
    ]
    for sources, copy_dir in ((dashboards, "dashboards"), (rules, "rules")):
        assert sources, f"nothing to ship as {copy_dir}"
        copies = sorted((CHART / "files" / copy_dir).iterdir())
        assert sorted(p.name for p in sources) == [p.name for p in copies], "make chart-files"
        for source in sources:
            copy = CHART / "files" / copy_dir / source.name
            assert filecmp.cmp(source, copy, shallow=False), f"{source.name}: make chart-files"


def test_values_schema_rejects_credentials_and_latest() -> None:
    bad = [
        ["--set", "config.AWS_SECRET_ACCESS_KEY=x"],
        ["--set", "config.INGEST_KAFKA_SASL_PASSWORD=x"],
        ["--set", "image.tag=latest"],
        ["--set", "kafka.securityProtocol=SASL_SSL"],
        ["--set", "securityContext.readOnlyRootFilesystem=false"],
    ]
    for args in bad:
        result = subprocess.run(
            [
                helm(),
                "template",
                "ingest",
                str(CHART),
                "--kube-version",
                RENDER_KUBE_VERSION,
                *args,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert 0 != result.returncode, args
        assert "values don't meet the specifications of the schema" in result.stderr, args
