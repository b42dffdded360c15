"""What a configuration asks of Spark: its executors (what lakehouse_ingest_executors_expected
exports), and a local driver's file system."""

from __future__ import annotations

from typing import Any

import pytest

from service.config import Settings
from service.streaming.session import expected_executors, spark_conf

STANDALONE = "spark://spark-master:7077"
KUBERNETES = "k8s://https://kubernetes.default.svc"


def settings(master: str, **spark: Any) -> Settings:
    """Settings on ``master`` with only the executor settings given."""
    unset: dict[str, Any] = {
        "spark_executor_instances": None,
        "spark_cores_max": None,
        "spark_executor_cores": None,
        "spark_kubernetes_container_image": "lakehouse-ingest:test",
        "spark_extra_conf": {},
    }
    return Settings(spark_master=master, **{**unset, **spark})


@pytest.mark.parametrize("master", ["local", "local[*]", "local[2]"])
def test_local_mode_expects_no_executor_whatever_the_executor_settings(master: str) -> None:
    assert 0 == expected_executors(settings(master, spark_executor_instances=3))


def test_executor_instances_are_the_count_on_any_cluster_master() -> None:
    assert 3 == expected_executors(settings(KUBERNETES, spark_executor_instances=3))
    assert 3 == expected_executors(
        settings(STANDALONE, spark_executor_instances=3, spark_cores_max=8, spark_executor_cores=2)
    )


def test_a_standalone_master_expects_the_cores_max_over_the_cores_of_an_executor() -> None:
    assert 2 == expected_executors(settings(STANDALONE, spark_cores_max=2, spark_executor_cores=1))
    assert 2 == expected_executors(settings(STANDALONE, spark_cores_max=5, spark_executor_cores=2))


@pytest.mark.parametrize(
    "spark",
    [
        {},
        {"spark_cores_max": 4},
        {"spark_executor_cores": 2},
    ],
)
def test_a_standalone_master_without_both_core_settings_expects_an_unknown_count(
    spark: dict[str, Any],
) -> None:
    assert expected_executors(settings(STANDALONE, **spark)) is None


def test_cores_max_counts_on_a_standalone_master_only() -> None:
    assert (
        expected_executors(settings(KUBERNETES, spark_cores_max=4, spark_executor_cores=2)) is None
    )


def test_dynamic_allocation_leaves_the_count_unknown() -> None:
    dynamic = {"spark.dynamicAllocation.enabled": "true"}
    assert (
        expected_executors(
            settings(KUBERNETES, spark_executor_instances=3, spark_extra_conf=dynamic)
        )
        is None
    )


def test_the_extra_spark_configuration_wins_as_it_does_for_spark() -> None:
    extra = {"spark.executor.instances": "5"}
    assert 5 == expected_executors(
        settings(KUBERNETES, spark_executor_instances=3, spark_extra_conf=extra)
    )
    garbled = {"spark.executor.instances": "several"}
    assert expected_executors(settings(KUBERNETES, spark_extra_conf=garbled)) is None


@pytest.mark.parametrize("master", ["local[2]", STANDALONE, KUBERNETES])
def test_only_a_local_driver_swaps_the_file_system_whose_jar_is_on_its_class_path(
    master: str,
) -> None:
    conf = spark_conf(settings(master))
    local = master.startswith("local")
    assert local == ("spark.hadoop.fs.file.impl" in conf)
    assert local == ("spark.hadoop.fs.AbstractFileSystem.file.impl" in conf)
    extra = {"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem"}
    assert (
        "org.apache.hadoop.fs.LocalFileSystem"
        == (spark_conf(settings(master, spark_extra_conf=extra))["spark.hadoop.fs.file.impl"])
    )


def _tier4(options: str) -> dict[str, str]:
    """The C2 thresholds that HotSpot ``options`` set, by flag name."""
    pairs = (o.removeprefix("-XX:").split("=") for o in options.split() if "=" in o)
    return {name: value for name, value in pairs if name.startswith("Tier4")}


@pytest.mark.parametrize("master", ["local[2]", STANDALONE])
def test_a_driver_that_drains_calls_c2_at_four_times_a_long_running_one_s_thresholds(
    master: str,
) -> None:
    """C2 compiles what a long-running driver calls 25,000 times, what a drain calls
    100,000 times; loops reach it at the same back-edge count. Executors run as their
    driver."""
    running, drain = spark_conf(settings(master)), spark_conf(settings(master), drain=True)
    thresholds = {  # a long-running driver's, a drain's
        "Tier4InvocationThreshold": ("25000", "100000"),
        "Tier4MinInvocationThreshold": ("3000", "12000"),
        "Tier4CompileThreshold": ("75000", "300000"),
        "Tier4BackEdgeThreshold": ("200000", "200000"),
    }
    assert {name: pair[0] for name, pair in thresholds.items()} == _tier4(
        running["spark.driver.defaultJavaOptions"]
    )
    assert {name: pair[1] for name, pair in thresholds.items()} == _tier4(
        drain["spark.driver.defaultJavaOptions"]
    )
    for conf in (running, drain):
        assert "-XX:-DontCompileHugeMethods" in conf["spark.driver.defaultJavaOptions"].split()
        executors = conf.get("spark.executor.defaultJavaOptions")
        local = master.startswith("local")
        assert (None if local else conf["spark.driver.defaultJavaOptions"]) == executors
    assert {k: v for k, v in running.items() if "JavaOptions" not in k} == {
        k: v for k, v in drain.items() if "JavaOptions" not in k
    }
