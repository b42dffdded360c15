"""The Helm chart: lint, render every CI values file, validate against Kubernetes schemas.

`helm` is the pinned build from `make tools`; the Kubernetes OpenAPI-derived JSON
schemas come from the kubernetes-validate package. Prometheus Operator objects
(CRDs, no bundled schema) are checked structurally, and their rules with promtool:
the unit tests of deploy/prometheus/alerts_test.yml run against the chart's PrometheusRule
too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from pydantic import SecretStr

from service.config import Settings, env_name, load_settings
from service.contracts.loading import parse_contract, read_contract
from tests.support.chart import (
    CHART,
    MONITORING_API,
    NAMESPACE,
    RENDER_KUBE_VERSION,
    helm,
    render,
    template,
)
from tests.support.repo import REPO
from tests.support.runbooks import runbook_commands

CI_VALUES = sorted((REPO / "helm" / "ci").glob("*-values.yaml"))
EXECUTORS_VALUES = str(REPO / "helm/ci/k8s-executors-values.yaml")
PROMETHEUS = REPO / "deploy" / "prometheus"
# The alert rules' one copy (Compose and promtool read it there too).
RULES = CHART / "files" / "rules" / "alerts.yml"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest bundled.
KUBERNETES_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())
SECRET_VALUES = ("minioadmin", "hunter2", "AKIA")
# The release `render` installs: its Service name is the `job` of its series.
RELEASE_JOB = "ingest-lakehouse-ingest"
# The scrape job the alert rules and their tests name (Docker Compose's).
COMPOSE_JOB = "lakehouse-ingest"
METRIC_SELECTOR = re.compile(r"\b(lakehouse_ingest_[a-z_]+)(\{[^}]*\})?")


@cache
def chart_values() -> dict[str, Any]:
    """The chart's default values (values.yaml)."""
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


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


def of_component(manifests: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    """The single manifest of ``kind`` labelled app.kubernetes.io/component=``name``."""
    (manifest,) = [
        m
        for m in by_kind(manifests, kind)
        if m["metadata"]["labels"].get("app.kubernetes.io/component") == name
    ]
    return manifest


def driver_settings(manifests: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """The ConfigMap the driver's container takes its settings from (envFrom)."""
    (container,) = driver_deployment(manifests)["spec"]["template"]["spec"]["containers"]
    (name,) = [e["configMapRef"]["name"] for e in container["envFrom"]]
    (config_map,) = [m for m in by_kind(manifests, "ConfigMap") if m["metadata"]["name"] == name]
    return config_map


def driver_deployment(manifests: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """The driver's Deployment."""
    return of_component(manifests, "Deployment", "driver")


def toolbox_deployment(manifests: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """The toolbox's Deployment."""
    return of_component(manifests, "Deployment", "toolbox")


def driver_pod(manifests: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """The driver's pod template (metadata and spec) in the Deployment."""
    pod: dict[str, Any] = driver_deployment(manifests)["spec"]["template"]
    return pod


def spark_conf(manifests: tuple[dict[str, Any], ...]) -> dict[str, str]:
    """The spark.* settings the driver receives in INGEST_SPARK_EXTRA_CONF."""
    driver = driver_pod(manifests)["spec"]["containers"][0]
    (entry,) = [e for e in driver["env"] if e["name"] == "INGEST_SPARK_EXTRA_CONF"]
    conf: dict[str, str] = json.loads(entry["value"])
    return conf


def secret_mounts(pod: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
    """Mount path → (Secret name, keys) of the Secret volumes of a pod's only container."""
    volumes = {v["name"]: v["secret"] for v in pod["spec"]["volumes"] if "secret" in v}
    (container,) = pod["spec"]["containers"]
    return {
        m["mountPath"]: (
            volumes[m["name"]]["secretName"],
            [item["key"] for item in volumes[m["name"]].get("items", [])],
        )
        for m in container["volumeMounts"]
        if m["name"] in volumes
    }


def network_policies(manifests: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    """The NetworkPolicies by the component their pod selector picks (driver, executor)."""
    return {
        p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]: p["spec"]
        for p in by_kind(manifests, "NetworkPolicy")
    }


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector with only matchLabels picks a pod with ``labels``."""
    assert set(selector) == {"matchLabels"}, selector
    return bool(selector["matchLabels"].items() <= labels.items())


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
    deployment = driver_deployment(manifests)
    assert 1 == deployment["spec"]["replicas"]
    assert {"type": "Recreate"} == deployment["spec"]["strategy"]
    assert 0 == toolbox_deployment(manifests)["spec"]["replicas"], "the toolbox: on request"
    kinds = {m["kind"] for m in manifests}
    assert not kinds & {"HorizontalPodAutoscaler", "PodDisruptionBudget", "StatefulSet"}


@pytest.mark.parametrize(("values", "api"), CASES)
def test_pods_run_non_root_read_only_without_capabilities(values: str | None, api: bool) -> None:
    manifests = render(values, api)
    pods = [d["spec"]["template"] for d in by_kind(manifests, "Deployment")]
    assert 2 == len(pods), "the driver and the toolbox"
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
    pod = driver_deployment(manifests)["spec"]["template"]["spec"]
    (driver,) = pod["containers"]
    assert "/healthz" == driver["startupProbe"]["httpGet"]["path"]
    assert "/healthz" == driver["livenessProbe"]["httpGet"]["path"]
    assert "/readyz" == driver["readinessProbe"]["httpGet"]["path"]
    startup = driver["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, "JVM start-up time"
    assert "memory" in driver["resources"]["limits"]
    (settings_map,) = [e["configMapRef"]["name"] for e in driver["envFrom"]]
    config = next(
        c for c in by_kind(manifests, "ConfigMap") if c["metadata"]["name"] == settings_map
    )
    budget = int(config["data"]["INGEST_STOP_TIMEOUT_SECONDS"])
    assert pod["terminationGracePeriodSeconds"] == budget + 30, "the stop budget, then the JVM exit"
    mounts = {m["mountPath"]: m["name"] for m in driver["volumeMounts"]}
    scratch = {v["name"]: v for v in pod["volumes"]}[mounts["/var/lib/lakehouse-ingest"]]
    assert "emptyDir" in scratch
    container_ports = {p["name"]: p["containerPort"] for p in driver["ports"]}
    assert {"http": 8080, "spark-ui": 4040}.items() <= container_ports.items()
    service = next(s for s in by_kind(manifests, "Service") if s["spec"].get("clusterIP") != "None")
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert {"http": 8080} == ports, "the Spark UI is on the Service only on request"


def test_the_spark_ui_is_on_the_service_only_on_request() -> None:
    manifests = render(None, False, "service.exposeSparkUi=true")
    service = next(s for s in by_kind(manifests, "Service") if s["spec"].get("clusterIP") != "None")
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert {"http": (8080, "http"), "spark-ui": (4040, "spark-ui")} == ports


@pytest.mark.parametrize(("values", "api"), CASES)
def test_spark_ui_cannot_kill_jobs_in_any_shape(values: str | None, api: bool) -> None:
    assert "false" == spark_conf(render(values, api))["spark.ui.killEnabled"]


@pytest.mark.parametrize(("values", "api"), CASES)
def test_settings_are_real_and_credentials_only_secret_references(
    values: str | None, api: bool
) -> None:
    manifests = render(values, api)
    known = {env_name(field) for field in Settings.model_fields}
    config_maps = [
        m for m in by_kind(manifests, "ConfigMap") if "INGEST_STORAGE_ROOT" in m.get("data", {})
    ]
    assert 2 == len(config_maps), "the driver's settings and the toolbox's"
    secrets = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "INGEST_KAFKA_SASL_PASSWORD"}
    for config_map in config_maps:
        assert set() == set(config_map["data"]) - known
        assert set() == set(config_map["data"]) & (secrets | {"INGEST_KAFKA_SASL_USERNAME"})
    assert [] == by_kind(manifests, "Secret"), "the chart references Secrets, never creates them"
    pods = [d["spec"]["template"] for d in by_kind(manifests, "Deployment")]
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


# Numbers as a values file gives them (Helm reads them as floats) and as --set gives them.
LARGE_NUMBERS = {
    "INGEST_KAFKA_MAX_OFFSETS_PER_TRIGGER": (1000000, "1000000"),
    "INGEST_KAFKA_MAX_RECORDS_PER_TASK": (10000000000, "10000000000"),
    "INGEST_TRIGGER_INTERVAL_SECONDS": (0.5, "0.5"),
    "INGEST_ALERT_HEART_RATE_BPM": (1500000.5, "1500000.5"),
    "INGEST_GOLD_ENABLED": (False, "false"),
}


@pytest.mark.parametrize("source", ["values-file", "set"])
def test_config_numbers_reach_the_driver_exactly_and_the_settings_accept_them(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if source == "values-file":
        values = tmp_path / "values.yaml"
        config = {key: value for key, (value, _) in LARGE_NUMBERS.items()}
        values.write_text(yaml.safe_dump({"config": config}))
        result = template(str(values), False)
    else:
        settings = [f"config.{key}={text}" for key, (_, text) in LARGE_NUMBERS.items()]
        result = template(None, False, *settings)
    assert 0 == result.returncode, result.stderr
    manifests = tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)
    data = driver_settings(manifests)["data"]
    assert {key: text for key, (_, text) in LARGE_NUMBERS.items()} == {
        key: data[key] for key in LARGE_NUMBERS
    }
    # The driver reads exactly this environment (envFrom the ConfigMap).
    for name in [n for n in os.environ if n.startswith(("INGEST_", "AWS_"))]:
        monkeypatch.delenv(name)
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    settings_read = load_settings()
    assert 1000000 == settings_read.kafka_max_offsets_per_trigger
    assert 10000000000 == settings_read.kafka_max_records_per_task
    assert 0.5 == settings_read.trigger_interval_seconds
    assert 1500000.5 == settings_read.alert_heart_rate_bpm
    assert settings_read.gold_enabled is False


def test_kafka_sasl_credentials_ca_and_client_certificate_come_from_the_named_secrets() -> None:
    manifests = render(str(REPO / "helm/ci/k8s-executors-values.yaml"), False)
    driver = driver_deployment(manifests)["spec"]["template"]["spec"]["containers"][0]
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
        for e in driver["env"]
        if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]
    }
    assert "lakehouse-kafka" == refs["INGEST_KAFKA_SASL_PASSWORD"]
    assert "lakehouse-s3" == refs["AWS_SECRET_ACCESS_KEY"]
    config = driver_settings(manifests)
    mounts = {m["mountPath"] for m in driver["volumeMounts"]}
    for variable in ("INGEST_KAFKA_SSL_CA_LOCATION", "INGEST_KAFKA_SSL_KEYSTORE_LOCATION"):
        assert str(Path(config["data"][variable]).parent) in mounts


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
    deployment = driver_deployment(manifests)["spec"]["template"]["spec"]
    assert enabled == deployment["automountServiceAccountToken"]
    assert enabled == (executor_pod_template(manifests) is not None)
    config = driver_settings(manifests)
    master = config["data"]["INGEST_SPARK_MASTER"]
    assert master.startswith("k8s://") if enabled else "local[*]" == master
    assert "ClusterRole" not in kinds, "executors need namespace rights only"


def test_executor_wiring_points_spark_at_the_driver_service_and_rbac_subject() -> None:
    manifests = render(str(REPO / "helm/ci/k8s-executors-values.yaml"), False)
    config = driver_settings(manifests)
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
    deployment = driver_deployment(manifests)["spec"]["template"]["spec"]
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


def test_the_driver_role_grants_only_what_spark_does_with_executor_pods() -> None:
    manifests = render(EXECUTORS_VALUES, False)
    role_rules = one(manifests, "Role")["rules"]
    assert all([""] == rule["apiGroups"] for rule in role_rules), "the core API group only"
    assert all("resourceNames" not in rule for rule in role_rules)
    rules = {
        resource: sorted(rule["verbs"]) for rule in role_rules for resource in rule["resources"]
    }
    expected = {
        # Executor pods: created, watched and listed (snapshots), read (the driver's own
        # pod owns them), deleted one by one and by label at stop.
        "pods": sorted(["create", "get", "list", "watch", "delete", "deletecollection"]),
        # The executors' conf ConfigMap: created at start, deleted by label at stop.
        "configmaps": sorted(["create", "deletecollection"]),
    }
    assert expected == rules
    # The clean-ups Spark would otherwise try at stop, without rights on them.
    conf = spark_conf(manifests)
    assert "false" == conf["spark.kubernetes.driver.service.deleteOnTermination"]
    assert "false" == conf["spark.kubernetes.driver.ownPersistentVolumeClaim"]


@pytest.mark.parametrize(("values", "api"), CASES)
def test_rpc_is_authenticated_and_encrypted_exactly_when_executors_run(
    values: str | None, api: bool
) -> None:
    manifests = render(values, api)
    conf = spark_conf(manifests)
    executors = executor_pod_template(manifests) is not None
    security = {
        "spark.authenticate",
        "spark.network.crypto.enabled",
        "spark.io.encryption.enabled",
    }
    if executors:
        assert {key: "true" for key in security} == {key: conf[key] for key in security}
    else:
        assert set() == security & set(conf), "local[*] has no driver <-> executor traffic"


def test_executors_read_the_auth_key_and_the_kafka_tls_files_where_the_driver_does() -> None:
    manifests = render(EXECUTORS_VALUES, False)
    template = executor_pod_template(manifests)
    assert template is not None
    conf = spark_conf(manifests)
    key_file = Path(conf["spark.authenticate.secret.file"])
    config = driver_settings(manifests)
    ca_file = Path(config["data"]["INGEST_KAFKA_SSL_CA_LOCATION"])
    client_file = Path(config["data"]["INGEST_KAFKA_SSL_KEYSTORE_LOCATION"])
    expected = {
        str(key_file.parent): ("lakehouse-spark-auth", [key_file.name]),
        str(ca_file.parent): ("lakehouse-kafka-ca", [ca_file.name]),
        str(client_file.parent): ("lakehouse-kafka-client", [client_file.name]),
    }
    for pod in (driver_pod(manifests), template):
        mounts = secret_mounts(pod)
        assert expected == {path: mounts[path] for path in expected}


def test_the_auth_key_is_in_no_environment_variable_configmap_or_spark_setting() -> None:
    manifests = render(EXECUTORS_VALUES, False)
    template = executor_pod_template(manifests)
    assert template is not None
    conf = spark_conf(manifests)
    # A literal key (spark.authenticate.secret) would travel in the driver's environment;
    # with a key file Spark gives executors no _SPARK_AUTH_SECRET variable either.
    assert "spark.authenticate.secret" not in conf
    assert set() == {
        "spark.authenticate.secret.driver.file",
        "spark.authenticate.secret.executor.file",
    } & set(conf)
    for pod in (driver_pod(manifests), template):
        names = {e["name"] for e in pod["spec"]["containers"][0].get("env", [])}
        assert not {n for n in names if "AUTH" in n}, names
    for config_map in by_kind(manifests, "ConfigMap"):
        assert "spark.authenticate" not in json.dumps(config_map["data"])


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (["--set", "spark.executors.enabled=true"], "authSecret"),
        *(
            (
                ["--set-string", "spark.executors.extraConf." + key.replace(".", r"\.") + "=x"],
                f"invalid propertyName '{key}'",
            )
            for key in (
                "spark.authenticate",
                "spark.authenticate.secret",
                "spark.ui.killEnabled",
                "spark.network.crypto.enabled",
                "spark.io.encryption.enabled",
                "spark.kubernetes.driver.service.deleteOnTermination",
            )
        ),
    ],
)
def test_values_schema_requires_an_auth_secret_and_keeps_the_security_settings(
    flags: list[str], reason: str
) -> None:
    command = [helm(), "template", "ingest", str(CHART), "--kube-version", RENDER_KUBE_VERSION]
    result = subprocess.run([*command, *flags], capture_output=True, text=True, check=False)
    assert 0 != result.returncode, flags
    assert "values don't meet the specifications of the schema" in result.stderr, flags
    assert reason in result.stderr, result.stderr


@pytest.mark.parametrize(("values", "api"), CASES)
def test_network_policies_only_on_request(values: str | None, api: bool) -> None:
    manifests = render(values, api)
    enabled = values is not None and "k8s-executors" in values
    assert enabled == bool(by_kind(manifests, "NetworkPolicy"))


def test_network_policies_admit_the_scraper_and_the_release_pods_only() -> None:
    manifests = render(EXECUTORS_VALUES, False)
    policies = network_policies(manifests)
    assert {"driver", "executor", "toolbox"} == set(policies)
    driver = driver_pod(manifests)
    template = executor_pod_template(manifests)
    assert template is not None
    driver_labels = driver["metadata"]["labels"]
    executor_labels = template["metadata"]["labels"]
    values = yaml.safe_load(Path(EXECUTORS_VALUES).read_text())["networkPolicy"]

    spec = policies["driver"]
    assert selects(spec["podSelector"], driver_labels)
    assert not selects(spec["podSelector"], executor_labels)
    assert ["Ingress", "Egress"] == spec["policyTypes"]
    ingress = {tuple(p["port"] for p in rule["ports"]): rule["from"] for rule in spec["ingress"]}
    # Every rule names its peers and ports: nothing is open to the whole cluster.
    assert all(rule.get("from") and rule.get("ports") for rule in spec["ingress"])
    assert values["metricsFrom"] == ingress.pop(("http",))
    (executors,) = ingress.pop(("driver-rpc", "blockmanager"))
    assert selects(executors["podSelector"], executor_labels)
    assert not selects(executors["podSelector"], driver_labels)
    assert {} == ingress, "no rule for the Spark UI without networkPolicy.sparkUiFrom"
    driver_ports = {p["name"] for p in driver["spec"]["containers"][0]["ports"]}
    assert {"http", "driver-rpc", "blockmanager"} <= driver_ports

    spec = policies["executor"]
    assert selects(spec["podSelector"], executor_labels)
    assert not selects(spec["podSelector"], driver_labels)
    (rule,) = spec["ingress"]
    peers = [peer["podSelector"] for peer in rule["from"]]
    assert 2 == len(peers)
    assert any(selects(p, driver_labels) for p in peers)
    assert any(selects(p, executor_labels) for p in peers)
    assert all(set(peer) == {"podSelector"} for peer in rule["from"]), "this namespace only"

    spec = policies["toolbox"]
    toolbox_labels = toolbox_deployment(manifests)["spec"]["template"]["metadata"]["labels"]
    assert selects(spec["podSelector"], toolbox_labels)
    assert not selects(spec["podSelector"], driver_labels)
    assert [] == spec["ingress"], "kubectl exec only"
    for other in ("driver", "executor"):
        assert not selects(policies[other]["podSelector"], toolbox_labels)

    dns = {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}
    for component, spec in policies.items():
        assert dns in spec["egress"], component
        assert all(rule in spec["egress"] for rule in values["egress"]), component
        assert {} not in spec["egress"], "the CI values narrow egress to ports"
    (to_driver,) = [r for r in policies["executor"]["egress"] if "to" in r and "ports" in r]
    assert selects(to_driver["to"][0]["podSelector"], driver_labels)
    assert [7078, 7079] == [p["port"] for p in to_driver["ports"]]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_network_policy_without_executors_opens_the_ui_only_to_named_peers(version: str) -> None:
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}}
    manifests = render(
        None,
        False,
        "networkPolicy.enabled=true",
        "networkPolicy.sparkUiFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=ops",
    )
    policies = network_policies(manifests)
    assert {"driver", "toolbox"} == set(policies)
    for policy in by_kind(manifests, "NetworkPolicy"):
        kubernetes_validate.validate(policy, version, strict=True)
    ingress = {
        tuple(p["port"] for p in r["ports"]): r["from"] for r in policies["driver"]["ingress"]
    }
    assert {("http",), ("spark-ui",)} == set(ingress)
    assert [peer] == ingress[("spark-ui",)]
    assert [{}] == policies["driver"]["egress"][1:], "default: DNS, then any destination"


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


def alert_rules(manifests: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    """The alert rules of the chart's PrometheusRule by name."""
    groups = one(manifests, "PrometheusRule")["spec"]["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run promtool (Debian's prometheus package, `make prometheus`)."""
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool missing: run `make prometheus`")
    return subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, check=False)


def run_alert_tests(tmp_path: Path, rule: dict[str, Any], tests: list[dict[str, Any]]) -> None:
    """Run promtool unit tests ``tests`` against the groups of a PrometheusRule."""
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    unit = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "rules_test.yml").write_text(yaml.safe_dump(unit, sort_keys=False))
    result = promtool("test", "rules", "rules_test.yml", cwd=tmp_path)
    assert 0 == result.returncode, result.stdout + result.stderr


def test_prometheus_rule_scopes_every_selector_to_the_release_job_and_namespace() -> None:
    manifests = render(None, True)
    # The Prometheus Operator names the job of a ServiceMonitor's series after the
    # Service (no jobLabel) and adds the target's namespace.
    assert "jobLabel" not in one(manifests, "ServiceMonitor")["spec"]
    service = next(s for s in by_kind(manifests, "Service") if s["spec"].get("clusterIP") != "None")
    assert RELEASE_JOB == service["metadata"]["name"]
    rules = alert_rules(manifests)
    assert rules
    for name, rule in rules.items():
        selectors = list(METRIC_SELECTOR.finditer(rule["expr"]))
        assert selectors, name
        for selector in selectors:
            matchers = selector.group(2) or ""
            assert f'job="{RELEASE_JOB}"' in matchers, (name, selector.group(0))
            assert f'namespace="{NAMESPACE}"' in matchers, (name, selector.group(0))


def test_prometheus_rule_alerts_behave_as_tested_for_this_release(tmp_path: Path) -> None:
    """deploy/prometheus/alerts_test.yml, its Compose series moved to the release."""
    rule = one(render(None, True), "PrometheusRule")
    base = chart_values()["monitoring"]["alerts"]["runbookBaseUrl"]
    scope = f'job="{RELEASE_JOB}",namespace="{NAMESPACE}"'
    tests = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())["tests"]
    moved = 0
    for test in tests:
        for series in test["input_series"]:
            moved += f'job="{COMPOSE_JOB}"' in series["series"]
            series["series"] = series["series"].replace(f'job="{COMPOSE_JOB}"', scope)
        for case in test.get("alert_rule_test", []):
            for alert in case.get("exp_alerts") or []:
                if alert["exp_labels"].get("job") == COMPOSE_JOB:
                    alert["exp_labels"].update(job=RELEASE_JOB, namespace=NAMESPACE)
                annotations = alert["exp_annotations"]
                annotations["runbook_url"] = f"{base}/{case['alertname']}.md"
                annotations["description"] = annotations["description"].replace(
                    f"job {COMPOSE_JOB}", f"job {RELEASE_JOB} in namespace {NAMESPACE}"
                )
    assert moved >= len(tests)
    run_alert_tests(tmp_path, rule, tests)


def test_another_namespace_neither_hides_an_outage_nor_raises_alerts(tmp_path: Path) -> None:
    rule = one(render(None, True), "PrometheusRule")
    base = chart_values()["monitoring"]["alerts"]["runbookBaseUrl"]
    elsewhere = [
        # The same release name in another namespace, another release in this namespace.
        f'instance="a:8080",job="{RELEASE_JOB}",namespace="staging"',
        f'instance="b:8080",job="other-lakehouse-ingest",namespace="{NAMESPACE}"',
    ]
    series = [
        {"series": f'lakehouse_ingest_query_up{{{labels},query="ingest_users"}}', "values": "1x20"}
        for labels in elsewhere
    ] + [
        {
            "series": "lakehouse_ingest_kafka_max_offsets_behind_latest"
            f'{{{labels},query="ingest_users",topic="users"}}',
            "values": "500000x20",
        }
        for labels in elsewhere
    ]
    down = {
        "exp_labels": {"severity": "critical", "job": RELEASE_JOB, "namespace": NAMESPACE},
        "exp_annotations": {
            "summary": "lakehouse-ingest is down: no driver exports query metrics",
            "description": f"No driver of job {RELEASE_JOB} in namespace {NAMESPACE} exports"
            " query metrics: every query is down. Nothing is ingested from Kafka until it runs"
            " again.",
            "runbook_url": f"{base}/QueryDown.md",
        },
    }
    cases = [
        {"eval_time": "6m", "alertname": "QueryDown", "exp_alerts": [down]},
        {"eval_time": "15m", "alertname": "KafkaLagHigh", "exp_alerts": []},
    ]
    run_alert_tests(
        tmp_path, rule, [{"interval": "1m", "input_series": series, "alert_rule_test": cases}]
    )


def test_alert_thresholds_job_and_runbook_base_url_come_from_values() -> None:
    thresholds = {
        "noProgressSeconds": ("NoProgress", "420"),
        "kafkaLagRecords": ("KafkaLagHigh", "2500000"),
        "freshnessCaughtUpSeconds": ("FreshnessSLOBreached", "600"),
        "freshnessWatermarkSeconds": ("FreshnessSLOBreached", "2400"),
        "quarantineRatio": ("QuarantineSpike", "0.125"),
        "storageStaleSeconds": ("StorageUnreachable", "90"),
        "reconcileStaleSeconds": ("ReconcileStale", "3600"),
    }
    assert set(chart_values()["monitoring"]["alerts"]["thresholds"]) == set(thresholds)
    base = "https://runbooks.example.com/lakehouse"
    manifests = render(
        None,
        True,
        *(f"monitoring.alerts.thresholds.{key}={value}" for key, (_, value) in thresholds.items()),
        f"monitoring.alerts.runbookBaseUrl={base}/",
        "monitoring.alerts.job=lakehouse",
    )
    rules = alert_rules(manifests)
    for key, (alert, value) in thresholds.items():
        assert re.search(rf"> {re.escape(value)}\b", rules[alert]["expr"]), (key, alert)
    for name, rule in rules.items():
        assert f"{base}/{name}.md" == rule["annotations"]["runbook_url"]
        assert 'job="lakehouse",namespace="lakehouse"' in rule["expr"], name
    (dashboard,) = [
        json.loads(body)
        for m in by_kind(manifests, "ConfigMap")
        if m["metadata"]["labels"].get("grafana_dashboard") == "1"
        for body in m["data"].values()
    ]
    assert [base] == [link["url"] for link in dashboard["links"] if link["title"] == "Runbooks"]
    # The dashboard's threshold lines are the alerts' thresholds of this release.
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert "lakehouse" == variables["job"]["current"]["value"]
    red_steps = {
        first_metric(p): step["value"]
        for p in dashboard["panels"]
        for step in p.get("fieldConfig", {})
        .get("defaults", {})
        .get("thresholds", {})
        .get("steps", [])
        if step["color"] == "red"
    }
    assert 2500000 == red_steps["lakehouse_ingest_kafka_max_offsets_behind_latest"]
    assert 0.125 == red_steps["lakehouse_ingest_quarantined_rows_total"]
    assert 420 == red_steps["lakehouse_ingest_last_progress_timestamp_seconds"]
    assert 90 == red_steps["lakehouse_ingest_storage_heartbeat_timestamp_seconds"]
    assert 3600 == red_steps["lakehouse_ingest_reconcile_last_check_timestamp_seconds"]
    freshness = sorted(
        step["value"]
        for p in dashboard["panels"]
        if any("freshness_timestamp" in t["expr"] for t in p.get("targets", []))
        for step in p["fieldConfig"]["defaults"]["thresholds"]["steps"]
        if step["color"] == "red"
    )
    assert [600, 2400] == freshness


def first_metric(panel: dict[str, Any]) -> str:
    """The first of our metrics a dashboard panel queries."""
    found = METRIC_SELECTOR.search(panel["targets"][0]["expr"])
    assert found, panel["title"]
    return found.group(1)


def release_dashboards(release: str, namespace: str) -> dict[str, dict[str, Any]]:
    """The dashboard ConfigMaps' files (name → dashboard) of release ``release``."""
    command = [helm(), "template", release, str(CHART), "--namespace", namespace]
    command += ["--kube-version", RENDER_KUBE_VERSION, "--api-versions", MONITORING_API]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return {
        name: json.loads(body)
        for m in yaml.safe_load_all(result.stdout)
        if m and m["kind"] == "ConfigMap" and m["metadata"]["labels"].get("grafana_dashboard")
        for name, body in m["data"].items()
    }


def test_two_releases_dashboards_do_not_collide_in_the_grafana_sidecar() -> None:
    """The sidecar writes every ConfigMap file into one folder and Grafana keys dashboards
    by uid: each release's copy has its own file name, uid and title, and shows its job."""
    copies = [
        release_dashboards("ingest", "lakehouse"),
        release_dashboards("ingest", "staging"),
        release_dashboards("other", "lakehouse"),
    ]
    files = [name for copy in copies for name in copy]
    dashboards = [d for copy in copies for d in copy.values()]
    assert 3 == len(set(files))
    assert 3 == len({d["uid"] for d in dashboards})
    assert 3 == len({d["title"] for d in dashboards})
    assert all(len(d["uid"]) <= 40 for d in dashboards), "Grafana's uid limit"
    jobs = [{v["name"]: v for v in d["templating"]["list"]}["job"] for d in dashboards]
    assert ["ingest-lakehouse-ingest", "ingest-lakehouse-ingest", "other-lakehouse-ingest"] == [
        j["current"]["value"] for j in jobs
    ]
    (staging,) = copies[1].values()
    namespace = {v["name"]: v for v in staging["templating"]["list"]}["namespace"]
    assert ["staging"] == namespace["current"]["value"]
    assert "(staging/ingest)" in staging["title"]


def test_alerts_can_be_relabelled_retimed_and_switched_off_per_alert() -> None:
    default = alert_rules(render(None, True))
    manifests = render(
        None,
        True,
        "monitoring.alerts.labels.team=data-platform",
        "monitoring.alerts.rules.NoProgress.for=17m",
        "monitoring.alerts.rules.NoProgress.labels.severity=warning",
        "monitoring.alerts.rules.KafkaLagGrowing.enabled=false",
        "monitoring.alerts.rules.KafkaLagHigh.enabled=true",
    )
    rules = alert_rules(manifests)
    assert set(default) - {"KafkaLagGrowing"} == set(rules)
    assert "17m" == rules["NoProgress"]["for"]
    assert {"severity": "warning", "team": "data-platform"} == rules["NoProgress"]["labels"]
    for name, rule in rules.items():
        assert "data-platform" == rule["labels"]["team"], name
        if name != "NoProgress":
            assert default[name].get("for") == rule.get("for"), name
            assert default[name]["labels"]["severity"] == rule["labels"]["severity"], name
    # The PrometheusRule object's own labels (the Prometheus selector's) are separate.
    assert "team" not in one(manifests, "PrometheusRule")["metadata"]["labels"]


def test_an_override_of_an_alert_that_does_not_exist_fails_the_render() -> None:
    result = template(None, True, "monitoring.alerts.rules.QueryDwn.enabled=false")
    assert 0 != result.returncode
    assert "monitoring.alerts.rules.QueryDwn: no such alert" in result.stderr, result.stderr


def duration_seconds(text: str) -> int:
    """A one-unit Prometheus duration ("90s", "5m") in seconds."""
    number, unit = re.fullmatch(r"(\d+)([smh])", text).groups()  # type: ignore[union-attr]
    return int(number) * {"s": 1, "m": 60, "h": 3600}[unit]


@pytest.mark.parametrize("alert", ["QueryDown", "ExecutorsMissing"])
def test_a_starting_driver_alert_waits_out_the_drivers_start_up_budget(alert: str) -> None:
    """A driver exports no query while its JVM starts, and no executor until they
    register: neither QueryDown nor ExecutorsMissing may fire within the start-up budget
    the startupProbe gives it (periodSeconds times failureThreshold)."""
    for settings in [(), ("probes.startup.failureThreshold=180",)]:
        manifests = render(None, True, *settings)
        probe = driver_pod(manifests)["spec"]["containers"][0]["startupProbe"]
        budget = probe["periodSeconds"] * probe["failureThreshold"]
        rule = alert_rules(manifests)[alert]
        assert duration_seconds(rule["for"]) >= budget, settings
    # The default budget is the rules file's own `for` (5 minutes): they agree.
    source = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    (file_rule,) = [r for r in source if r.get("alert") == alert]
    probes = chart_values()["probes"]["startup"]
    assert probes["periodSeconds"] * probes["failureThreshold"] == duration_seconds(
        file_rule["for"]
    )
    # An explicit override wins.
    rules = alert_rules(render(None, True, f"monitoring.alerts.rules.{alert}.for=2m"))
    assert "2m" == rules[alert]["for"]


def test_chart_defaults_render_the_alerts_of_the_rules_file_for_the_release() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    source = {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}
    scope = f'job="{RELEASE_JOB}",namespace="{NAMESPACE}"'
    base = chart_values()["monitoring"]["alerts"]["runbookBaseUrl"]
    for rule in source.values():
        rule["expr"] = rule["expr"].replace(f'job="{COMPOSE_JOB}"', scope)
        rule["annotations"]["runbook_url"] = f"{base}/{rule['alert']}.md"
    assert source == alert_rules(render(None, True))


@pytest.mark.parametrize(
    ("before", "after", "message"),
    [
        (
            'latest{job="lakehouse-ingest"} > 100000',
            'latest{job="lakehouse-ingest"} > 50000',
            'alert KafkaLagHigh: expected "> 100000" once',
        ),
        (
            'changes(lakehouse_ingest_process_start_time_seconds{job="lakehouse-ingest"}',
            "changes(lakehouse_ingest_process_start_time_seconds{}",
            "DriverRestarting has no job=",
        ),
    ],
)
def test_the_chart_refuses_rules_it_cannot_scope_or_tune(
    tmp_path: Path, before: str, after: str, message: str
) -> None:
    chart = tmp_path / "lakehouse-ingest"
    shutil.copytree(CHART, chart)
    rules = chart / "files" / "rules" / "alerts.yml"
    text = rules.read_text()
    assert 1 == text.count(before)
    rules.write_text(text.replace(before, after))
    result = template(None, True, chart=chart)
    assert 0 != result.returncode
    assert message in result.stderr, result.stderr


def test_the_rules_and_dashboards_have_one_copy_in_git_inside_the_chart() -> None:
    """Compose, promtool and the chart read the chart's files; nothing is copied."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    rule_files = [
        path
        for path in tracked
        if path.endswith((".yml", ".yaml"))
        and re.search(r"(?m)^groups:", (REPO / path).read_text(errors="replace"))
    ]
    assert ["helm/lakehouse-ingest/files/rules/alerts.yml"] == rule_files
    dashboards = [p for p in tracked if p.endswith(".json") and "dashboard" in p]
    assert ["helm/lakehouse-ingest/files/dashboards/lakehouse-ingest.json"] == dashboards
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *rule_files, *dashboards],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "" == ignored.stdout, "the chart's files are committed, not generated"


def test_the_chart_renders_with_monitoring_from_a_fresh_git_clone(tmp_path: Path) -> None:
    """What Argo CD and Flux do: `helm template` of the committed chart, nothing generated.

    A clone has what HEAD has: commit a change to the chart before relying on this test.
    """
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "--quiet", "--depth", "1", f"file://{REPO}", str(clone)],
        capture_output=True,
        text=True,
        check=True,
    )
    result = template(None, True, chart=clone / "helm" / "lakehouse-ingest")
    assert 0 == result.returncode, result.stderr
    manifests = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    kinds = {m["kind"] for m in manifests}
    assert {"PrometheusRule", "ServiceMonitor"} <= kinds
    rule = one(tuple(manifests), "PrometheusRule")
    assert alert_rules((rule,)), "the clone's PrometheusRule has alerts"
    dashboards = [
        m
        for m in manifests
        if m["kind"] == "ConfigMap" and m["metadata"]["labels"].get("grafana_dashboard") == "1"
    ]
    assert dashboards, "the clone's chart renders its dashboards"


def test_values_schema_rejects_credentials_and_latest() -> None:
    bad = [
        ["--set", "config.AWS_SECRET_ACCESS_KEY=x"],
        ["--set", "config.INGEST_KAFKA_SASL_PASSWORD=x"],
        ["--set", "image.tag=latest"],
        ["--set", "kafka.securityProtocol=SASL_SSL"],
        ["--set", "kafka.clientSecret=kafka-client"],  # a client certificate without TLS
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


@pytest.mark.parametrize(
    ("flags", "where"),
    [
        (["--set", "replicaCount=2"], "/replicaCount"),
        (["--set", "replicaCount=-1"], "/replicaCount"),
        (["--set", "toolbox.replicaCount=2"], "/toolbox/replicaCount"),
        (
            ["--set", "extraEnv[0].name=AWS_SECRET_ACCESS_KEY", "--set", "extraEnv[0].value=x"],
            "/extraEnv/0",
        ),
        (["--set", "monitoring.alerts.rules.QueryDown.for=soon"], "/monitoring/alerts/rules"),
    ],
)
def test_values_schema_keeps_one_driver_and_credentials_out_of_extra_env(
    flags: list[str], where: str
) -> None:
    command = [helm(), "template", "ingest", str(CHART), "--kube-version", RENDER_KUBE_VERSION]
    result = subprocess.run([*command, *flags], capture_output=True, text=True, check=False)
    assert 0 != result.returncode, flags
    assert "values don't meet the specifications of the schema" in result.stderr, flags
    assert where in result.stderr, result.stderr


def test_a_values_file_may_stop_the_driver_but_not_run_two(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("replicaCount: 2\n")
    assert 0 != template(str(values), False).returncode
    values.write_text("replicaCount: 0\n")
    result = template(str(values), False)
    assert 0 == result.returncode, result.stderr
    manifests = tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)
    assert 0 == driver_deployment(manifests)["spec"]["replicas"]


def quantity_bytes(quantity: str) -> float:
    """A Kubernetes quantity such as 20Gi or 500M in bytes."""
    number, unit = re.fullmatch(r"([0-9.]+)([KMGTPE]i?|k|m)?", quantity).groups()  # type: ignore[union-attr]
    scale = {"": 1, "k": 1e3, "m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    scale |= {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    return float(number) * scale[unit or ""]


@pytest.mark.parametrize(("values", "api"), CASES)
def test_ephemeral_storage_requests_cover_the_size_limited_emptydirs(
    values: str | None, api: bool
) -> None:
    manifests = render(values, api)
    pods = [d["spec"]["template"] for d in by_kind(manifests, "Deployment")]
    if (template := executor_pod_template(manifests)) is not None:
        pods.append(template)
        local_dirs = [
            v for v in template["spec"]["volumes"] if v["name"].startswith("spark-local-dir-")
        ]
        assert local_dirs, "Spark's local dir on the executors is a size-limited emptyDir"
        (container,) = template["spec"]["containers"]
        mounted = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        for volume in local_dirs:
            assert volume["name"] in mounted
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        empty_dirs = [v["emptyDir"] for v in pod["spec"]["volumes"] if "emptyDir" in v]
        assert all("sizeLimit" in e for e in empty_dirs), pod["metadata"]
        on_disk = sum(
            quantity_bytes(str(e["sizeLimit"])) for e in empty_dirs if not e.get("medium")
        )
        request = container["resources"]["requests"]["ephemeral-storage"]
        assert quantity_bytes(str(request)) >= on_disk, pod["metadata"]


def test_extra_env_and_volumes_reach_the_driver_the_toolbox_and_the_executors() -> None:
    manifests = render(EXECUTORS_VALUES, False, *EXTRAS)
    template = executor_pod_template(manifests)
    assert template is not None
    pods = [d["spec"]["template"] for d in by_kind(manifests, "Deployment")] + [template]
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert {"name": "AWS_CA_BUNDLE", "value": "/etc/s3-ca/ca.crt"} == env["AWS_CA_BUNDLE"]
        assert {"secretKeyRef": {"name": "s3-token", "key": "token"}} == env["S3_TOKEN"][
            "valueFrom"
        ]
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert {"name": "s3-ca", "configMap": {"name": "s3-ca"}} == volumes["s3-ca"]
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert {"name": "s3-ca", "mountPath": "/etc/s3-ca", "readOnly": True} == mounts[
            "/etc/s3-ca"
        ]
    for version in KUBERNETES_VERSIONS:
        for manifest in [*by_kind(manifests, "Deployment"), template]:
            kubernetes_validate.validate(manifest, version, strict=True)


def rendered_notes(tmp_path: Path, *settings: str) -> str:
    """NOTES.txt as `helm install` prints it (with the monitoring API present), rendered
    through a copy of the chart that includes it in a ConfigMap (`helm template` skips it)."""
    chart = tmp_path / "lakehouse-ingest"
    if not chart.exists():
        shutil.copytree(CHART, chart)
        (chart / "templates" / "zz-notes.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
            '  NOTES.txt: {{ include (print $.Template.BasePath "/NOTES.txt") . | quote }}\n'
        )
    result = template(
        None, True, *settings, chart=chart, flags=("--show-only", "templates/zz-notes.yaml")
    )
    assert 0 == result.returncode, result.stderr
    notes: str = yaml.safe_load(result.stdout)["data"]["NOTES.txt"]
    return notes


def test_notes_warn_while_the_runbook_base_url_is_the_placeholder(tmp_path: Path) -> None:
    placeholder = chart_values()["monitoring"]["alerts"]["runbookBaseUrl"]
    warning = "WARNING: monitoring.alerts.runbookBaseUrl is still the chart's placeholder"
    notes = rendered_notes(tmp_path)
    assert warning in notes
    assert placeholder in notes
    notes = rendered_notes(tmp_path, "monitoring.alerts.runbookBaseUrl=https://wiki.example.net/rb")
    assert "runbookBaseUrl" not in notes
    assert "toolbox" in notes
    stopped = rendered_notes(tmp_path, "replicaCount=0")
    assert "It is stopped: replicaCount=0" in stopped


# What only a driver with Spark executors has: its cluster settings, the executors' pod
# template and the key of Spark's authentication. The toolbox runs local[*] without them.
CLUSTER_ONLY_SETTINGS = {
    "INGEST_SPARK_DRIVER_HOST",
    "INGEST_SPARK_DRIVER_BIND_ADDRESS",
    "INGEST_SPARK_DRIVER_PORT",
    "INGEST_SPARK_DRIVER_BLOCK_MANAGER_PORT",
    "INGEST_SPARK_EXECUTOR_INSTANCES",
    "INGEST_SPARK_EXECUTOR_CORES",
    "INGEST_SPARK_EXECUTOR_MEMORY",
    "INGEST_SPARK_KUBERNETES_CONTAINER_IMAGE",
    "INGEST_SPARK_KUBERNETES_NAMESPACE",
    "INGEST_SPARK_KUBERNETES_SERVICE_ACCOUNT",
    "INGEST_SPARK_KUBERNETES_EXECUTOR_POD_TEMPLATE",
}
CLUSTER_ONLY_VOLUMES = {"spark-auth", "spark-executor"}
EXTRAS = (
    "extraEnv[0].name=AWS_CA_BUNDLE",
    "extraEnv[0].value=/etc/s3-ca/ca.crt",
    "extraEnv[1].name=S3_TOKEN",
    "extraEnv[1].valueFrom.secretKeyRef.name=s3-token",
    "extraEnv[1].valueFrom.secretKeyRef.key=token",
    "extraVolumes[0].name=s3-ca",
    "extraVolumes[0].configMap.name=s3-ca",
    "extraVolumeMounts[0].name=s3-ca",
    "extraVolumeMounts[0].mountPath=/etc/s3-ca",
    "extraVolumeMounts[0].readOnly=true",
)


def toolbox_settings(manifests: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """The ConfigMap the toolbox's container takes its settings from (envFrom)."""
    (container,) = toolbox_deployment(manifests)["spec"]["template"]["spec"]["containers"]
    (name,) = [e["configMapRef"]["name"] for e in container["envFrom"]]
    (config_map,) = [m for m in by_kind(manifests, "ConfigMap") if m["metadata"]["name"] == name]
    return config_map


@pytest.mark.parametrize(
    "values", [None, *map(str, CI_VALUES)], ids=lambda v: Path(v or "defaults").stem
)
def test_the_toolbox_has_the_drivers_settings_secrets_volumes_and_account_with_local_spark(
    values: str | None,
) -> None:
    manifests = render(values, False, *EXTRAS)
    driver = driver_deployment(manifests)["spec"]["template"]["spec"]
    toolbox = toolbox_deployment(manifests)["spec"]["template"]["spec"]
    (driver_container,) = driver["containers"]
    (container,) = toolbox["containers"]
    assert driver_container["image"] == container["image"]
    assert driver["serviceAccountName"] == toolbox["serviceAccountName"]
    assert toolbox["automountServiceAccountToken"] is False, "it creates no executor pods"
    assert driver["securityContext"] == toolbox["securityContext"]
    assert driver_container["securityContext"] == container["securityContext"]
    # Its own, smaller requests (it schedules beside a running driver) and the driver's
    # memory limit, for the commands that start Spark once the driver is stopped.
    requests, driver_requests = (
        container["resources"]["requests"],
        driver_container["resources"]["requests"],
    )
    for resource in ("cpu", "memory", "ephemeral-storage"):
        assert quantity_bytes(str(requests[resource])) < quantity_bytes(
            str(driver_requests[resource])
        ), resource
    assert driver_container["resources"]["limits"] == container["resources"]["limits"]
    raised = render(values, False, "resources.limits.memory=6Gi")
    (raised_container,) = toolbox_deployment(raised)["spec"]["template"]["spec"]["containers"]
    assert {"memory": "6Gi"} == raised_container["resources"]["limits"]
    # Settings: the driver's, with Spark local[*] in the toolbox's own pod.
    settings = driver_settings(manifests)["data"]
    local = toolbox_settings(manifests)["data"]
    assert "local[*]" == local["INGEST_SPARK_MASTER"]
    expected = {k: v for k, v in settings.items() if k not in CLUSTER_ONLY_SETTINGS}
    assert {**expected, "INGEST_SPARK_MASTER": "local[*]"} == local
    # Secrets and extraEnv: the same references; Spark's settings without the cluster's.
    env = {e["name"]: e for e in container["env"]}
    driver_env = {e["name"]: e for e in driver_container["env"]}
    assert {"AWS_CA_BUNDLE", "S3_TOKEN"} <= set(env)
    conf = json.loads(env.pop("INGEST_SPARK_EXTRA_CONF")["value"])
    assert {"spark.ui.killEnabled": "false"} == conf
    driver_env.pop("INGEST_SPARK_EXTRA_CONF")
    driver_env.pop("POD_NAME", None)  # names the executors' owner
    assert driver_env == env
    # Volumes: the same Secrets, scratch and extras at the same paths.
    volumes = {v["name"]: v for v in toolbox["volumes"]}
    driver_volumes = {
        v["name"]: v for v in driver["volumes"] if v["name"] not in CLUSTER_ONLY_VOLUMES
    }
    scratch = volumes.pop("scratch")
    assert chart_values()["toolbox"]["scratchSizeLimit"] == scratch["emptyDir"]["sizeLimit"]
    assert {k: v for k, v in driver_volumes.items() if k != "scratch"} == volumes
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    driver_mounts = {
        m["mountPath"]: m
        for m in driver_container["volumeMounts"]
        if m["name"] not in CLUSTER_ONLY_VOLUMES
    }
    assert driver_mounts == mounts
    assert "/etc/s3-ca" in mounts
    # The same Settings the toolbox's commands build are valid, and local.
    read = Settings(
        **{
            field: local[env_name(field)]
            for field in Settings.model_fields
            if env_name(field) in local
        },
        kafka_sasl_username="from-secret",
        kafka_sasl_password=SecretStr("from-secret"),
    )
    assert "local[*]" == read.spark_master
    assert read.spark_driver_host is None


def test_the_toolbox_sleeps_under_tini_without_probes_ports_or_pods_by_default() -> None:
    manifests = render(None, False)
    deployment = toolbox_deployment(manifests)
    assert 0 == deployment["spec"]["replicas"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert ["tini", "--", "sleep", "infinity"] == container["command"] + container["args"]
    assert not {"ports", "startupProbe", "livenessProbe", "readinessProbe"} & set(container)
    # Nothing routes to it or scrapes it: the driver's Service and ServiceMonitor select
    # the driver only.
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for service in by_kind(manifests, "Service"):
        assert not selects({"matchLabels": service["spec"]["selector"]}, labels)
    driver_selector = driver_deployment(manifests)["spec"]["selector"]
    assert not selects(driver_selector, labels)
    assert not selects(deployment["spec"]["selector"], driver_pod(manifests)["metadata"]["labels"])
    started = render(None, False, "toolbox.replicaCount=1")
    assert 1 == toolbox_deployment(started)["spec"]["replicas"]
    assert [] == by_kind(render(None, False, "toolbox.enabled=false"), "Deployment")[1:]


def runbook_names(release: str) -> dict[str, str]:
    """The variables docs/runbooks/README.md has operators set, for release ``release``."""
    readme = (REPO / "docs/runbooks/README.md").read_text()
    names = dict(re.findall(r"^(NS|RELEASE|DEPLOY|TOOLBOX|PODS|CHART)=(\S+)", readme, re.M))
    assert {"NS", "RELEASE", "DEPLOY", "TOOLBOX", "PODS", "CHART"} == set(names)
    return {name: value.replace("<release>", release) for name, value in names.items()}


def label_selector(text: str) -> dict[str, Any]:
    """A `-l` equality selector (a=b,c=d) as a matchLabels selector."""
    return {"matchLabels": dict(pair.split("=") for pair in text.split(","))}


def test_the_runbook_pod_selector_picks_the_driver_only() -> None:
    """$PODS (`kubectl get/describe/wait pod -l "$PODS"`) matches the driver's pod and
    neither the executors' (their pod template) nor the toolbox's."""
    manifests = render(EXECUTORS_VALUES, False)
    driver = driver_deployment(manifests)
    release = driver["metadata"]["labels"]["app.kubernetes.io/instance"]
    selector = label_selector(runbook_names(release)["PODS"])
    template = executor_pod_template(manifests)
    assert template is not None
    assert selects(selector, driver["spec"]["template"]["metadata"]["labels"])
    assert not selects(selector, template["metadata"]["labels"])
    toolbox = toolbox_deployment(manifests)
    assert not selects(selector, toolbox["spec"]["template"]["metadata"]["labels"])
    # The executor pods also carry the labels Spark adds; none of them is the component.
    assert "executor" == template["metadata"]["labels"]["app.kubernetes.io/component"]


def test_runbook_commands_name_the_charts_resources() -> None:
    """Every kubectl and helm command of the runbooks names the namespace and the
    release's Deployments, pods and containers as the chart renders them."""
    manifests = render(None, False)
    deployment = driver_deployment(manifests)
    toolbox = toolbox_deployment(manifests)
    release = deployment["metadata"]["labels"]["app.kubernetes.io/instance"]
    names = runbook_names(release)
    assert release == names["RELEASE"]
    assert f"deploy/{deployment['metadata']['name']}" == names["DEPLOY"]
    assert f"deploy/{toolbox['metadata']['name']}" == names["TOOLBOX"]
    assert CHART == REPO / names["CHART"]
    containers = {
        c["name"]
        for d in (deployment, toolbox)
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    commands = runbook_commands()
    kubectl = [c for c in commands if c.words[0] == "kubectl"]
    assert len(kubectl) > 40
    for command in kubectl:
        words = (
            command.words[: command.words.index("--")] if "--" in command.words else command.words
        )
        assert ("-n", "$NS") == words[1:3], command.line
        literal = [w for w in words if w.startswith(("deploy/", "app.kubernetes.io"))]
        assert [] == literal, command.line
        if "-l" in words:
            assert "$PODS" == words[words.index("-l") + 1], command.line
        for flag in ("-c", "--container"):
            if flag in words:
                assert words[words.index(flag) + 1] in containers, command.line
        # No copies of the driver's pod (kubectl debug --copy-to keeps its probes or loses
        # its labels), no scaling by hand (Helm, Argo CD, Flux set replicas back).
        assert not {"debug", "scale"} & set(words), command.line
        if "exec" in words:
            assert {"$DEPLOY", "$TOOLBOX"} & set(words), command.line
    helm_commands = [c for c in commands if c.words[0] == "helm"]
    assert helm_commands
    for command in helm_commands:
        assert ("-n", "$NS") == command.words[1:3], command.line
        assert command.words[3] in {"upgrade", "history", "rollback"}, command.line
        assert "$RELEASE" == command.words[4], command.line
        if "upgrade" == command.words[3]:
            assert ("$CHART", "--reuse-values") == command.words[5:7], command.line


def test_the_runbooks_helm_upgrades_stop_the_driver_and_start_the_toolbox() -> None:
    """Each `--set` of the runbooks' `helm upgrade` renders and does what the pages say."""
    upgrades = {
        tuple(w for w in c.words[7:] if w != "--set")
        for c in runbook_commands()
        if c.words[:4] == ("helm", "-n", "$NS", "upgrade")
    }
    replicas = set()
    for settings in upgrades:
        if any(s.startswith("config.") for s in settings):
            continue  # a setting of the service: checked with the ConfigMap below
        manifests = render(None, False, *settings)
        replicas.add(
            (
                driver_deployment(manifests)["spec"]["replicas"],
                toolbox_deployment(manifests)["spec"]["replicas"],
            )
        )
    # Toolbox on; driver off (and toolbox on); back to normal.
    assert {(1, 1), (0, 1), (1, 0)} <= replicas
    for settings in upgrades:
        for setting in settings:
            if setting.startswith("config."):
                data = driver_settings(render(None, False, setting))["data"]
                key, _, value = setting.removeprefix("config.").partition("=")
                assert value == data[key]


# The pages whose driver may be restarting or stopped: every command they run in the
# service's image runs in the toolbox, except asking the driver's own HTTP port.
TOOLBOX_PAGES = {
    "QueryDown.md",
    "DriverRestarting.md",
    "CheckpointMismatch.md",
    "CheckpointCorrupt.md",
    "KafkaOffsetsLost.md",
    "FreshnessSLOBreached.md",
    "StorageUnreachable.md",
}


def test_pages_of_a_stopped_or_restarting_driver_run_their_commands_in_the_toolbox() -> None:
    commands = [c for c in runbook_commands() if c.page in TOOLBOX_PAGES and c.in_container]
    assert {c.page for c in commands} == TOOLBOX_PAGES
    for command in commands:
        assert command.in_container is not None
        asks_the_driver = any("localhost:8080" in word for word in command.in_container)
        target = "$DEPLOY" if asks_the_driver else "$TOOLBOX"
        assert target in command.words, f"{command.page}: {command.line}"
    replay = [
        c
        for c in runbook_commands()
        if c.in_container
        and c.in_container[:2] == ("lakehouse-ingest", "replay-quarantine")
        and "--dry-run" not in c.in_container
    ]
    assert replay
    for command in replay:  # it takes the driver lease: the driver is stopped
        assert "$TOOLBOX" in command.words, command.line


def _contract_files(manifests: tuple[dict[str, Any], ...]) -> dict[str, str]:
    (config_map,) = [
        m for m in by_kind(manifests, "ConfigMap") if m["metadata"]["name"].endswith("-contracts")
    ]
    files: dict[str, str] = config_map["data"]
    return files


def _block_values(contracts: dict[str, str]) -> str:
    """A values file giving each contract's text as a YAML block string (``name: |-``)."""
    lines = ["contracts:"]
    for name, text in contracts.items():
        lines.append(f"  {name}: |-")
        lines += [f"    {line}" for line in text.splitlines()]
    return "\n".join(lines) + "\n"


def _renamed(path: Path, name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    document["x-lakehouse"] = {**document["x-lakehouse"], "name": name, "topic": name,
                               "tables": {"bronze": f"bronze/{name}",
                                          "silver": f"silver/{name}"}}  # fmt: skip
    return document


def test_contracts_values_reach_both_pods_as_files_the_service_reads_unchanged(
    tmp_path: Path,
) -> None:
    # A file given with --set-file, and a file's text written in the values as a block.
    readings = _renamed(REPO / "service" / "contracts" / "sensors.json", "readings")
    readings_file = tmp_path / "readings.json"
    readings_file.write_text(json.dumps(readings, indent=2, ensure_ascii=False) + "\n")
    profiles = _renamed(REPO / "service" / "contracts" / "users.json", "profiles")
    profiles_text = json.dumps(profiles, indent=2)
    values = tmp_path / "contracts-values.yaml"
    values.write_text(_block_values({"profiles": profiles_text}))
    flags = ("--values", str(values), "--set-file", f"contracts.readings={readings_file}")
    result = template(None, False, flags=flags)
    assert 0 == result.returncode, result.stderr
    manifests = tuple(m for m in yaml.safe_load_all(result.stdout) if m)
    files = _contract_files(manifests)
    assert ["profiles.json", "readings.json"] == sorted(files)
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    for name, text in files.items():
        (mounted / name).write_bytes(text.encode())
    # Byte for byte: the properties in the file's order (not sorted), its non-ASCII
    # text and its last line break.
    assert readings_file.read_bytes() == (mounted / "readings.json").read_bytes()
    assert profiles_text.encode() == (mounted / "profiles.json").read_bytes()
    for name, document in (("readings", readings), ("profiles", profiles)):
        contract = read_contract(mounted / f"{name}.json")
        assert document == contract.document
        assert parse_contract(document, name, name, {}).fingerprint == contract.fingerprint
    assert (
        "/etc/lakehouse-ingest/contracts"
        == driver_settings(manifests)["data"]["INGEST_CONTRACTS_DIR"]
    )
    for deployment in (driver_deployment(manifests), toolbox_deployment(manifests)):
        pod = deployment["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["contracts"]["configMap"]["name"].endswith("-contracts")
        (container,) = pod["containers"]
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert ("/etc/lakehouse-ingest/contracts", True) == (
            mounts["contracts"]["mountPath"],
            mounts["contracts"]["readOnly"],
        )
    # A changed contract restarts the driver's pod (its template's checksum changes).
    readings["properties"]["unit"]["maxLength"] = 8
    readings_file.write_text(json.dumps(readings))
    changed = template(None, False, flags=flags)
    assert 0 == changed.returncode, changed.stderr
    checksum = "checksum/contracts"
    changed_driver = driver_deployment(tuple(m for m in yaml.safe_load_all(changed.stdout) if m))
    assert (
        changed_driver["spec"]["template"]["metadata"]["annotations"][checksum]
        != (driver_pod(manifests)["metadata"]["annotations"][checksum])
    )
    # Without contracts: no ConfigMap, no variable.
    default = render(None, False)
    assert "INGEST_CONTRACTS_DIR" not in driver_settings(default)["data"]
    assert not [m for m in by_kind(default, "ConfigMap") if "-contracts" in m["metadata"]["name"]]


def test_a_contract_written_as_yaml_values_is_refused_at_render_saying_how_to_give_it(
    tmp_path: Path,
) -> None:
    # Helm holds YAML values as a map with sorted keys: the properties would be reordered.
    readings = _renamed(REPO / "service" / "contracts" / "sensors.json", "readings")
    values = tmp_path / "contracts-values.yaml"
    values.write_text(yaml.safe_dump({"contracts": {"readings": readings}}))

    result = template(None, False, flags=("--values", str(values)))

    assert 1 == result.returncode
    assert (
        "contracts.readings: give the contract as its file's text, `--set-file"
        " contracts.readings=readings.json` or a YAML block string (`readings: |-` and the"
        " JSON below it), not as YAML values: Helm sorts their keys, which would reorder the"
        " contract's properties (docs/deploy.md)"
    ) in result.stderr


def test_each_release_commits_to_its_own_consumer_group_unless_config_names_one() -> None:
    group = "INGEST_KAFKA_CONSUMER_GROUP"
    data = driver_settings(render(None, False))["data"]
    assert f"{NAMESPACE}/{RELEASE_JOB}" == data[group]
    kept = driver_settings(render(None, False, f"config.{group}=lakehouse-ingest"))["data"]
    assert "lakehouse-ingest" == kept[group]
