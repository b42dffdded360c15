"""The driver JVM's memory, garbage collection and threads, and the executors registered
with it, sampled for the metrics.

The process metrics of prometheus_client describe the Python process; the Spark driver's
heap lives in its JVM, and so does its view of the executors (Spark's status tracker). A
`JvmSampler` reads both through py4j every few seconds in a thread of its own, so a
scrape never waits on the JVM (a JVM busy collecting garbage answers late, which is when
the numbers matter).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from service.background import PeriodicWorker

SAMPLE_SECONDS = 5.0


@dataclass(frozen=True)
class JvmSample:
    """One reading of the JVM: heap and non-heap in use, the heap's maximum (-1 when the
    JVM sets none), each collector's total collection time, and thread counts."""

    heap_used: int
    heap_max: int
    nonheap_used: int
    gc_seconds: Mapping[str, float]
    threads: int
    daemon_threads: int


def read_jvm(jvm: Any) -> JvmSample:
    """Read the management beans of the JVM behind the py4j view ``jvm``."""
    management = getattr(jvm, "java.lang.management.ManagementFactory")
    memory = management.getMemoryMXBean()
    heap, nonheap = memory.getHeapMemoryUsage(), memory.getNonHeapMemoryUsage()
    threads = management.getThreadMXBean()
    return JvmSample(
        heap_used=int(heap.getUsed()),
        heap_max=int(heap.getMax()),
        nonheap_used=int(nonheap.getUsed()),
        gc_seconds={
            str(gc.getName()): max(0, int(gc.getCollectionTime())) / 1000.0
            for gc in _items(management.getGarbageCollectorMXBeans())
        },
        threads=int(threads.getThreadCount()),
        daemon_threads=int(threads.getDaemonThreadCount()),
    )


def _items(java_list: Any) -> list[Any]:
    """The items of a py4j ``java.util.List`` by index: iterating it instead ends in a Java
    exception that PySpark's py4j error handler classifies in some twenty round trips."""
    return [java_list[i] for i in range(len(java_list))]


def read_executors(status_tracker: Any) -> int:
    """Count the executors registered with the driver, from the py4j view of its
    ``SparkStatusTracker``, whose list includes the driver itself (local mode: only it)."""
    return max(0, len(status_tracker.getExecutorInfos()) - 1)


class JvmSink(Protocol):
    """Where samples go (`service.driver.metrics.JvmMetrics`)."""

    def sampled(self, sample: JvmSample) -> None: ...
    def executors_counted(self, executors: int) -> None: ...


class JvmSampler:
    """Sample the JVM ``jvm`` and the executors its ``status_tracker`` lists every
    ``interval_seconds`` (a `PeriodicWorker`) into ``sink``."""

    def __init__(
        self,
        jvm: Any,
        status_tracker: Any,
        sink: JvmSink,
        interval_seconds: float = SAMPLE_SECONDS,
    ) -> None:
        self._jvm = jvm
        self._status_tracker = status_tracker
        self._sink = sink
        self._worker = PeriodicWorker(
            "jvm-sampler",
            interval_seconds,
            self._sample,
            failed_event="jvm_sample_failed",
            recovered_event="jvm_sample_recovered",
        )

    def _sample(self) -> list[str]:
        self._sink.sampled(read_jvm(self._jvm))
        self._sink.executors_counted(read_executors(self._status_tracker))
        return []

    def start(self) -> None:
        """Sample now and then every interval until `stop`."""
        self._worker.start()

    def stop(self) -> None:
        """Stop sampling."""
        self._worker.stop()
