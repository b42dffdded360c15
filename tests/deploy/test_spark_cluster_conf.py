"""Spark settings for a cluster master: what the chart and the cluster test rely on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.config import load_settings
from service.errors import ConfigError
from service.streaming.session import REQUIRED_JAR_PREFIXES, local_mode_classpath, spark_conf


@pytest.fixture
def jars_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [n for n in os.environ if n.startswith(("INGEST_", "AWS_"))]:
        monkeypatch.delenv(name)
    for prefix in REQUIRED_JAR_PREFIXES:
        (tmp_path / f"{prefix}1.0.jar").touch()
    monkeypatch.setenv("INGEST_JARS_DIR", str(tmp_path))
    return tmp_path


def test_local_mode_puts_the_jars_on_the_drivers_classpath_and_sets_no_cluster_settings(
    jars_dir: Path,
) -> None:
    settings = load_settings()
    conf = spark_conf(settings)
    assert sorted(str(p) for p in jars_dir.glob("*.jar")) == local_mode_classpath(settings)
    assert "spark.jars" not in conf  # each run would copy them to its temporary directory
    assert not [k for k in conf if k.startswith(("spark.executor.", "spark.kubernetes."))]
    assert "spark.driver.host" not in conf


def test_executor_jars_dir_names_the_same_jars_as_local_uris_on_every_host(
    jars_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INGEST_SPARK_MASTER", "spark://spark-master:7077")
    shipped = spark_conf(load_settings())["spark.jars"].split(",")
    assert sorted(str(p) for p in jars_dir.glob("*.jar")) == shipped  # served by the driver
    assert [] == local_mode_classpath(load_settings())
    monkeypatch.setenv("INGEST_SPARK_EXECUTOR_JARS_DIR", "/opt/lakehouse-ingest/jars/")
    conf = spark_conf(load_settings())
    expected = sorted(f"local:/opt/lakehouse-ingest/jars/{p.name}" for p in jars_dir.glob("*.jar"))
    assert expected == conf["spark.jars"].split(",")
    assert "spark.executor.extraClassPath" not in conf
    # Each executor copies them once, into its working directory, not also into a cache.
    assert "false" == conf["spark.files.useFetchCache"]


def test_cluster_settings_map_to_spark_properties(
    jars_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {
        "INGEST_SPARK_MASTER": "k8s://https://kubernetes.default.svc",
        "INGEST_SPARK_DRIVER_HOST": "ingest-driver.lakehouse.svc",
        "INGEST_SPARK_DRIVER_BIND_ADDRESS": "0.0.0.0",  # noqa: S104 - a pod binds all its interfaces
        "INGEST_SPARK_DRIVER_PORT": "7078",
        "INGEST_SPARK_DRIVER_BLOCK_MANAGER_PORT": "7079",
        "INGEST_SPARK_EXECUTOR_INSTANCES": "3",
        "INGEST_SPARK_EXECUTOR_CORES": "2",
        "INGEST_SPARK_EXECUTOR_MEMORY": "4g",
        "INGEST_SPARK_KUBERNETES_CONTAINER_IMAGE": "lakehouse-ingest:0.1.0",
        "INGEST_SPARK_KUBERNETES_NAMESPACE": "lakehouse",
        "INGEST_SPARK_KUBERNETES_SERVICE_ACCOUNT": "ingest",
        "INGEST_SPARK_KUBERNETES_EXECUTOR_POD_TEMPLATE": "/etc/t.yaml",
        "INGEST_SPARK_EXTRA_CONF": '{"spark.kubernetes.driver.pod.name": "ingest-0"}',
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    conf = spark_conf(load_settings())
    expected = {
        "spark.master": "k8s://https://kubernetes.default.svc",
        "spark.driver.host": "ingest-driver.lakehouse.svc",
        "spark.driver.bindAddress": "0.0.0.0",  # noqa: S104 - a pod binds all its interfaces
        "spark.driver.port": "7078",
        "spark.driver.blockManager.port": "7079",
        "spark.executor.instances": "3",
        "spark.executor.cores": "2",
        "spark.executor.memory": "4g",
        "spark.kubernetes.container.image": "lakehouse-ingest:0.1.0",
        "spark.kubernetes.namespace": "lakehouse",
        "spark.kubernetes.authenticate.driver.serviceAccountName": "ingest",
        "spark.kubernetes.executor.podTemplateFile": "/etc/t.yaml",
        "spark.kubernetes.driver.pod.name": "ingest-0",
        # Validation's large generated methods are JIT-compiled on the executors too, and
        # C2 left the hot code as on the driver.
        "spark.executor.defaultJavaOptions": "-XX:-DontCompileHugeMethods"
        " -XX:Tier4InvocationThreshold=25000 -XX:Tier4MinInvocationThreshold=3000"
        " -XX:Tier4CompileThreshold=75000 -XX:Tier4BackEdgeThreshold=200000",
    }
    assert expected == {k: conf[k] for k in expected}


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("INGEST_SPARK_EXTRA_CONF", '{"fs.s3a.access.key": "x"}', "INGEST_SPARK_EXTRA_CONF"),
        ("INGEST_SPARK_EXECUTOR_MEMORY", "lots", "INGEST_SPARK_EXECUTOR_MEMORY"),
        ("INGEST_SPARK_MASTER", "k8s://https://k", "INGEST_SPARK_KUBERNETES_CONTAINER_IMAGE"),
    ],
)
def test_invalid_cluster_settings_fail_naming_the_variable(
    jars_dir: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=message):
        load_settings()


def test_rocksdb_memory_is_bounded_per_store_or_by_one_budget(
    jars_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = "spark.sql.streaming.stateStore.rocksdb."
    conf = spark_conf(load_settings())
    assert ("16", "2") == (
        conf[f"{prefix}writeBufferSizeMB"],
        conf[f"{prefix}maxWriteBufferNumber"],
    )
    assert f"{prefix}boundedMemoryUsage" not in conf

    monkeypatch.setenv("INGEST_STATE_STORE_MEMORY_MB", "768")
    conf = spark_conf(load_settings())
    assert ("true", "768") == (
        conf[f"{prefix}boundedMemoryUsage"],
        conf[f"{prefix}maxMemoryUsageMB"],
    )
