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

from service.config import Settings, default_cache_dir, env_name, load_settings
from tests.runbook_commands import runbook_commands

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "lakehouse-ingest"
CI_VALUES = sorted((REPO / "helm" / "ci").glob("*-values.yaml"))
EXECUTORS_VALUES = str(REPO / "helm/ci/k8s-executors-values.yaml")
PROMETHEUS = REPO / "deploy" / "prometheus"
# The alert rules' one copy (Compose and promtool read it there too).
RULES = CHART / "files" / "rules" / "alerts.yml"
MONITORING_API = "monitoring.coreos.com/v1"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest bundled.
KUBERNETES_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())
NAMESPACE = "lakehouse"
# Rendering target, explicit so the output does not depend on how helm was built.
RENDER_KUBE_VERSION = "1.30.0"
SECRET_VALUES = ("minioadmin", "hunter2", "AKIA")
# The release `render` installs: its Service name is the `job` of its series.
RELEASE_JOB = "ingest-lakehouse-ingest"
# The scrape job the alert rules and their tests name (Docker Compose's).
COMPOSE_JOB = "lakehouse-ingest"
METRIC_SELECTOR = re.compile(r"\b(lakehouse_ingest_[a-z_]+)(\{[^}]*\})?")


def helm() -> str:
    """The pinned helm binary (`make tools`)."""
    binary = default_cache_dir() / "bin" / "helm"
    if not binary.exists():
        pytest.fail(f"{binary} missing: run `make tools`")
    return str(binary)


def template(
    values: str | None, monitoring_api: bool, *settings: str, chart: Path = CHART
) -> subprocess.CompletedProcess[str]:
    """Run `helm template` of release "ingest" in NAMESPACE; ``settings`` are `--set` flags."""
    command = [helm(), "template", "ingest", str(chart), "--namespace", NAMESPACE]
    command += ["--kube-version", RENDER_KUBE_VERSION]
    if values:
        command += ["--values", values]
    if monitoring_api:
        command += ["--api-versions", MONITORING_API]
    for setting in settings:
        command += ["--set", setting]
    return subprocess.run(command, capture_output=True, text=True, check=False)


@cache
def render(values: str | None, monitoring_api: bool, *settings: str) -> tuple[dict[str, Any], ...]:
    """`helm template` output as a list of manifests."""
    result = template(values, monitoring_api, *settings)
    assert 0 == result.returncode, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


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


def driver_pod(manifests: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """The driver's pod template (metadata and spec) in the Deployment."""
    pod: dict[str, Any] = one(manifests, "Deployment")["spec"]["template"]
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
    data = next(m for m in by_kind(manifests, "ConfigMap") if "INGEST_STORAGE_ROOT" in m["data"])[
        "data"
    ]
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
    driver = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
        for e in driver["env"]
        if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]
    }
    assert "lakehouse-kafka" == refs["INGEST_KAFKA_SASL_PASSWORD"]
    assert "lakehouse-s3" == refs["AWS_SECRET_ACCESS_KEY"]
    config = next(m for m in by_kind(manifests, "ConfigMap") if "INGEST_STORAGE_ROOT" in m["data"])
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
    config = next(m for m in by_kind(manifests, "ConfigMap") if "INGEST_STORAGE_ROOT" in m["data"])
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
    assert {"driver", "executor"} == set(policies)
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
    assert {"driver"} == set(policies)
    kubernetes_validate.validate(one(manifests, "NetworkPolicy"), version, strict=True)
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
            "description": f"No driver of job {RELEASE_JOB} in namespace {NAMESPACE} has"
            " exported query metrics for 2 minutes: every query is down. Nothing is ingested"
            " from Kafka until it runs again.",
            "runbook_url": f"{base}/QueryDown.md",
        },
    }
    cases = [
        {"eval_time": "5m", "alertname": "QueryDown", "exp_alerts": [down]},
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


def test_runbook_commands_name_the_charts_resources() -> None:
    """Every kubectl command of the runbooks names the namespace and the release's
    Deployment, pods and container as the chart renders them (release "ops")."""
    readme = (REPO / "docs/runbooks/README.md").read_text()
    names = dict(re.findall(r"^(NS|DEPLOY|PODS)=(\S+)", readme, re.M))
    assert {"NS", "DEPLOY", "PODS"} == set(names)
    manifests = render(None, False)
    (deployment,) = [m for m in manifests if m["kind"] == "Deployment"]
    release = deployment["metadata"]["labels"]["app.kubernetes.io/instance"]
    deploy = names["DEPLOY"].replace("<release>", release)
    assert f"deploy/{deployment['metadata']['name']}" == deploy
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = names["PODS"].replace("<release>", release)
    wanted = dict(pair.split("=") for pair in selector.split(","))
    assert wanted.items() <= pod_labels.items()
    containers = {c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]}
    kubectl = [c for c in runbook_commands() if c.words[0] == "kubectl"]
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
        if "debug" in words:
            assert "--container=driver" in words and "driver" in containers, command.line
