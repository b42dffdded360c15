"""The driver JVM's metrics and its executors: read from a real JVM through py4j, exported
from the last sample."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from prometheus_client import CollectorRegistry
from pyspark.sql import SparkSession

from service.driver.jvm import JvmSample, JvmSampler, read_executors, read_jvm
from service.driver.metrics import IngestMetrics, JvmMetrics


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


def test_local_mode_has_no_executor_but_the_driver(spark: SparkSession) -> None:
    assert 0 == read_executors(spark.sparkContext._jsc.sc().statusTracker())


def test_the_executors_are_those_the_status_tracker_lists_besides_the_driver() -> None:
    def tracker(infos: int) -> SimpleNamespace:
        return SimpleNamespace(getExecutorInfos=lambda: [object()] * infos)

    assert [0, 0, 2] == [read_executors(tracker(n)) for n in (0, 1, 3)]


class RecordingSink(JvmMetrics):
    """A `JvmMetrics` that says when a sample came."""

    def __init__(self) -> None:
        super().__init__()
        self.counted = threading.Event()

    def executors_counted(self, executors: int) -> None:
        super().executors_counted(executors)
        self.counted.set()


def test_the_sampler_reads_the_jvm_and_counts_the_executors(spark: SparkSession) -> None:
    context = spark.sparkContext
    sink = RecordingSink()
    sink.executors_counted(5)
    sink.counted.clear()
    sampler = JvmSampler(context._jvm, context._jsc.sc().statusTracker(), sink)
    sampler.start()
    try:
        assert sink.counted.wait(30), "the first sample is taken at start"
    finally:
        sampler.stop()
    registry = CollectorRegistry()
    registry.register(sink)
    assert 0 == registry.get_sample_value("lakehouse_ingest_executors")
    assert registry.get_sample_value("lakehouse_ingest_jvm_threads", {"state": "live"})


def test_executors_are_exported_from_the_start_and_the_expected_count_once_known() -> None:
    registry = CollectorRegistry()
    metrics = IngestMetrics(registry)

    def value(name: str) -> float | None:
        return registry.get_sample_value(f"lakehouse_ingest_{name}")

    assert (0, None) == (value("executors"), value("executors_expected"))
    metrics.jvm.executors_expected(2)
    assert (0, 2) == (value("executors"), value("executors_expected"))
    metrics.jvm.executors_counted(2)
    metrics.jvm.executors_counted(1)
    assert (1, 2) == (value("executors"), value("executors_expected"))
    # Local mode: no executor asked for, none registered.
    metrics.jvm.executors_expected(0)
    metrics.jvm.executors_counted(0)
    assert (0, 0) == (value("executors"), value("executors_expected"))
    # Dynamic allocation: the count is Spark's to choose, so none is exported.
    metrics.jvm.executors_expected(None)
    assert value("executors_expected") is None
