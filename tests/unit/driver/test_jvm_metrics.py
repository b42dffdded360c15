"""The driver JVM's metrics: read from a real JVM through py4j, exported from the last sample."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from pyspark.sql import SparkSession

from service.driver.jvm import JvmSample, read_jvm
from service.driver.metrics import IngestMetrics


def test_a_sample_of_the_jvm_reads_its_heap_collectors_and_threads(spark: SparkSession) -> None:
    sample = read_jvm(spark.sparkContext._jvm)

    assert 0 < sample.heap_used <= sample.heap_max
    assert sample.nonheap_used > 0
    assert sample.gc_seconds and all(s >= 0 for s in sample.gc_seconds.values())
    assert 0 < sample.daemon_threads <= sample.threads


def test_metrics_come_from_the_last_sample_and_none_before_the_first() -> None:
    registry = CollectorRegistry()
    metrics = IngestMetrics(registry)
    assert registry.get_sample_value("lakehouse_ingest_jvm_threads", {"state": "live"}) is None

    metrics.jvm.sampled(JvmSample(100, 1000, 50, {"G1 Young Generation": 1.5}, 30, 20))
    metrics.jvm.sampled(JvmSample(200, 1000, 60, {"G1 Young Generation": 2.0}, 31, 20))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(f"lakehouse_ingest_{name}", labels)

    assert (200, 60, 1000) == (
        value("jvm_memory_used_bytes", area="heap"),
        value("jvm_memory_used_bytes", area="nonheap"),
        value("jvm_memory_max_bytes", area="heap"),
    )
    assert 2.0 == value("jvm_gc_collection_seconds_total", gc="G1 Young Generation")
    assert (31, 20) == (value("jvm_threads", state="live"), value("jvm_threads", state="daemon"))
    # A JVM without a heap maximum (-1) exports none rather than a negative one.
    metrics.jvm.sampled(JvmSample(200, -1, 60, {}, 31, 20))
    assert value("jvm_memory_max_bytes", area="heap") is None
