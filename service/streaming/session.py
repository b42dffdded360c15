"""Build the one SparkSession: Delta, the Kafka source and s3a from explicit jars."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import structlog
from pyspark import SparkConf, SparkContext, java_gateway
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

from service.config import Settings, is_local_master
from service.errors import ConfigError
from service.logs import generated_file, jvm_log_config

log = structlog.get_logger(__name__)

_STDOUT, _STDERR = 1, 2
# How long the exit waits for the JVM to end and for its last lines; past it, PySpark's own
# exit handler kills the JVM.
_JVM_EXIT_SECONDS = 5.0

# Jars the Spark side needs (deploy/jvm/spark/pom.xml, and jvm/checker's); checked at start so a
# missing `make jars` fails with a hint instead of a ClassNotFoundException later.
REQUIRED_JAR_PREFIXES = (
    "delta-spark_",
    "delta-storage-",
    "spark-sql-kafka-0-10_",
    "spark-token-provider-kafka-0-10_",
    "kafka-clients-",
    "commons-pool2-",
    "hadoop-aws-",
    "bundle-",
    "lakehouse-ingest-checker-",
)


def runtime_jars(jars_dir: str) -> list[str]:
    """Return the jar paths to put on the classpath, or fail naming what is missing."""
    directory = Path(jars_dir)
    jars = sorted(str(p) for p in directory.glob("*.jar"))
    names = [Path(j).name for j in jars]
    missing = [p for p in REQUIRED_JAR_PREFIXES if not any(n.startswith(p) for n in names)]
    if missing:
        raise ConfigError(
            f"invalid configuration: INGEST_JARS_DIR: {jars_dir} lacks {', '.join(missing)}"
            " (run `make jars` to resolve them from Maven Central)"
        )
    return jars


# HotSpot options of every Spark JVM (`spark_conf`): JIT-compile methods of any size, and
# leave C2 the code a driver runs hot. C2's invocation thresholds are five times
# HotSpot's for a long-running driver: it runs Spark's planning code a few times per
# micro-batch, which under the defaults kept C2 compiling it minutes after the start
# (`make run`'s third to fifth minute: 10,572 methods, 72 s of C2's time); the hot loops
# over rows still reach C2 within a batch. A driver that drains and exits (`run
# --available-now`) has twenty times: at five, C2 took 59 s of a gold backlog's 202
# CPU-s compiling code (Janino, Java serialization, Scala's sort) that the run calls past
# them but that does not pay back before it ends; a long-running driver's small batches
# ran slower at twenty (docs/performance.md, "Starting a driver").
#
# HotSpot's own C2 thresholds (JDK 17): invocations, the least of them, invocations and
# loop iterations together, loop iterations alone (on-stack replacement).
_C2_INVOCATION, _C2_MIN_INVOCATION, _C2_COMPILE, _C2_BACK_EDGE = 5000, 600, 15000, 40000


def jit_options(drain: bool) -> str:
    """The HotSpot options of a driver (and its executors) that drains and exits, or not:
    C2's invocation thresholds at twenty or five times HotSpot's, its back-edge one at five."""
    scale = 20 if drain else 5
    return (
        f"-XX:-DontCompileHugeMethods -XX:Tier4InvocationThreshold={_C2_INVOCATION * scale}"
        f" -XX:Tier4MinInvocationThreshold={_C2_MIN_INVOCATION * scale}"
        f" -XX:Tier4CompileThreshold={_C2_COMPILE * scale}"
        f" -XX:Tier4BackEdgeThreshold={_C2_BACK_EDGE * 5}"
    )


def spark_conf(settings: Settings, drain: bool = False) -> dict[str, str]:
    """Return the Spark configuration for ``settings`` (pure: no session is touched), of a
    driver that drains and exits (``drain``: `jit_options`) or runs until stopped.

    The object store's is `StorageConnection.hadoop_options` (no credentials: s3a reads
    the standard ``AWS_*`` variables from the JVM's environment, so secrets never appear
    on a command line or in the UI).
    """
    jars = runtime_jars(settings.jars_dir)
    conf = {
        "spark.master": settings.spark_master,
        **_classpath_conf(settings, jars),
        "spark.driver.memory": settings.spark_driver_memory,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.shuffle.partitions": str(settings.spark_shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        # Ingest and gold queries run their jobs in two pools (service.streaming.runner), FAIR
        # between them: gold's five queries cannot starve the two ingest queries.
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": str(scheduler_pools_file()),
        "spark.ui.enabled": str(settings.spark_ui_enabled).lower(),
        "spark.ui.port": str(settings.spark_ui_port),
        "spark.ui.showConsoleProgress": "false",
        # Exactly-once on Delta needs synchronous offset commits.
        "spark.sql.streaming.asyncProgressTrackingEnabled": "false",
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # Per state store: 2 memtables of 16 MB + Spark's 8 MB block cache.
        "spark.sql.streaming.stateStore.rocksdb.writeBufferSizeMB": "16",
        "spark.sql.streaming.stateStore.rocksdb.maxWriteBufferNumber": "2",
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        # Parquet timestamps as INT64 microseconds, not Spark's default legacy INT96: Arrow
        # readers (delta-rs, Polars, DuckDB) read INT96 as nanoseconds, which overflow
        # outside 1677-2262 (a valid event_time may be in year 1).
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # Delta rebuilds a table's state (log replay) in a Spark job before every write;
        # its default of 50 partitions makes that job ~50 tasks, the largest fixed cost
        # of a small micro-batch. Sized like the shuffles instead.
        "spark.databricks.delta.snapshotPartitions": str(settings.spark_shuffle_partitions),
        # Delta's VACUUM lists a table in exactly this many tasks (Spark's default is
        # 10,000: ~30 s of empty tasks per VACUUM of a small table); sized like the shuffles.
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(
            settings.spark_shuffle_partitions
        ),
        # Generated classes are cached by their code; 7 queries' stages outgrow the
        # default 100 entries and recompile every micro-batch.
        "spark.sql.codegen.cache.maxEntries": "1000",
        # Validation's staged fields generate a method of 19,000 bytecodes, which
        # HotSpot never JIT-compiles by default: it ran interpreted (6.7 s for 300,000
        # readings), or per operator under Spark's advice for HotSpot
        # (`spark.sql.codegen.hugeMethodLimit` 8000: 5.4 s, each operator copying the
        # wide staged row). The JVMs compile it instead (`jit_options`): 3.8 s
        # (`cluster_conf` sets the executors' too). Default options: Spark puts a
        # deployment's extraJavaOptions after them.
        "spark.driver.defaultJavaOptions": jit_options(drain),
        **settings.storage.hadoop_options(),
        "spark.hadoop.fs.s3a.fast.upload": "true",
        # Ride out a storage outage of minutes and resume within seconds of its end: s3a's
        # own retries (around the SDK's attempts) back off exponentially, so with 10 of
        # them the one that finds the store back came up to minutes late (docs/guarantees.md).
        "spark.hadoop.fs.s3a.retry.limit": "3",
        "spark.hadoop.fs.s3a.attempts.maximum": "20",
    }
    if settings.compact_min_files is not None:
        # Small files from frequent micro-batches compacted by the writer itself, right
        # after its commit (a dataChange=false commit that stream readers skip): the
        # single writer stays the only writer (docs/guarantees.md, one driver per storage root).
        conf["spark.databricks.delta.autoCompact.enabled"] = "true"
        conf["spark.databricks.delta.autoCompact.minNumFiles"] = str(settings.compact_min_files)
    if settings.state_store_memory_mb is not None:
        # One budget for all stores of a JVM; Spark then reports 0 memory per store.
        conf["spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage"] = "true"
        conf["spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB"] = str(
            settings.state_store_memory_mb
        )
    if is_local_master(settings.spark_master):
        conf.update(_LOCAL_FILE_SYSTEM)
    conf.update(cluster_conf(settings, drain))
    return conf


# Hadoop's local file system, without its native library (which Spark does not ship),
# runs a `chmod` process for every file it creates and a `readlink` for every link status
# a FileContext rename asks for (Spark's checkpoint files, Delta's log): 35 ms and as
# much CPU per checkpoint file, some 33 processes a second in `make run`. The service's
# own (jvm/checker, lakehouse.ingest.fs) does both through java.nio: 0.9 ms
# (docs/performance.md). Local mode only, where the jar is on the JVM's class path.
_LOCAL_FILE_SYSTEM = {
    "spark.hadoop.fs.file.impl": "lakehouse.ingest.fs.NioLocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "lakehouse.ingest.fs.NioLocalFs",
}


# The pool of the driver's own jobs beside the queries' (the Delta checkpoints it writes).
MAINTENANCE_POOL = "maintenance"
# Pool name → (weight, minimum share in cores).
SCHEDULER_POOLS = {"ingest": (3, 1), "gold": (1, 0), MAINTENANCE_POOL: (1, 0)}


def scheduler_pools_file() -> Path:
    """Write the FAIR scheduler's pool definitions (SCHEDULER_POOLS); return the file."""
    pools = "".join(
        f'  <pool name="{name}"><schedulingMode>FAIR</schedulingMode>'
        f"<weight>{weight}</weight><minShare>{min_share}</minShare></pool>\n"
        for name, (weight, min_share) in SCHEDULER_POOLS.items()
    )
    text = f'<?xml version="1.0"?>\n<allocations>\n{pools}</allocations>\n'
    return generated_file("fairscheduler", ".xml", text)


def _classpath_conf(settings: Settings, jars: list[str]) -> dict[str, str]:
    """Add the jars to the executors' user classpath (after Spark's own), on a cluster.

    In local mode the executor lives in the driver's JVM, which has them on its own
    classpath (`local_mode_classpath`). On a cluster without ``spark_executor_jars_dir``
    the driver serves its jars to every executor; with it, ``local:`` URIs name the same
    jars at that path on every host (baked into the image, or a worker's cache), so a new
    executor does not first download the ~560 MB AWS SDK bundle from the driver. Each
    executor still copies them into its working directory, and without Spark's fetch
    cache only there (with it, once more into its local directory: a second ~680 MB per
    executor, for a copy from the same disk). Never extraClassPath: that would put the
    bundle's unshaded netty and slf4j 1.x ahead of Spark's.
    """
    if is_local_master(settings.spark_master):
        return {}
    if settings.spark_executor_jars_dir is None:
        return {"spark.jars": ",".join(jars)}
    directory = settings.spark_executor_jars_dir.rstrip("/")
    return {
        "spark.jars": ",".join(f"local:{directory}/{Path(jar).name}" for jar in jars),
        "spark.files.useFetchCache": "false",
    }


def local_mode_classpath(settings: Settings) -> list[str]:
    """The jars the driver JVM's classpath ends with in local mode (empty on a cluster).

    ``spark.jars`` would have every run copy them (~560 MB) into its temporary
    directory for the in-process executor, and a killed driver leaves that copy
    behind; Spark's launcher appends ``SPARK_DIST_CLASSPATH`` after its own jars instead.
    """
    return runtime_jars(settings.jars_dir) if is_local_master(settings.spark_master) else []


def cluster_conf(settings: Settings, drain: bool = False) -> dict[str, str]:
    """Return the executor-side settings for a cluster master (spark://, k8s://).

    Only the settings that are set appear; ``spark_extra_conf`` comes last and wins.
    """
    optional: dict[str, str | int | None] = {
        "spark.driver.host": settings.spark_driver_host,
        "spark.driver.bindAddress": settings.spark_driver_bind_address,
        "spark.driver.port": settings.spark_driver_port,
        "spark.driver.blockManager.port": settings.spark_driver_block_manager_port,
        "spark.executor.memory": settings.spark_executor_memory,
        "spark.executor.cores": settings.spark_executor_cores,
        "spark.executor.instances": settings.spark_executor_instances,
        "spark.cores.max": settings.spark_cores_max,
        "spark.local.dir": settings.spark_local_dir,
        # In local mode the executor is the driver's JVM.
        "spark.executor.defaultJavaOptions": (
            None if is_local_master(settings.spark_master) else jit_options(drain)
        ),
        "spark.kubernetes.container.image": settings.spark_kubernetes_container_image,
        "spark.kubernetes.namespace": settings.spark_kubernetes_namespace,
        "spark.kubernetes.authenticate.driver.serviceAccountName": (
            settings.spark_kubernetes_service_account
        ),
        "spark.kubernetes.executor.podTemplateFile": (
            settings.spark_kubernetes_executor_pod_template
        ),
    }
    conf = {key: str(value) for key, value in optional.items() if value is not None}
    conf.update(settings.spark_extra_conf)
    return conf


def expected_executors(settings: Settings) -> int | None:
    """How many executors ``settings`` ask Spark for; None when they do not say.

    0 in local mode (the driver runs the tasks); else, from the cluster configuration
    (``spark_extra_conf`` included), ``spark.executor.instances`` when set, and for a
    standalone master ``spark.cores.max // spark.executor.cores`` when both are set.
    With dynamic allocation the count is Spark's to choose: None.
    """
    if is_local_master(settings.spark_master):
        return 0
    conf = cluster_conf(settings)
    if conf.get("spark.dynamicAllocation.enabled", "").strip().lower() == "true":
        return None
    instances = _count(conf.get("spark.executor.instances"))
    if instances is not None:
        return instances
    cores_max = _count(conf.get("spark.cores.max"))
    cores = _count(conf.get("spark.executor.cores"))
    if settings.spark_master.startswith("spark://") and cores_max is not None and cores:
        return cores_max // cores
    return None


def _count(value: str | None) -> int | None:
    """A count of Spark's configuration; None when unset or not a whole number."""
    try:
        return None if value is None else max(0, int(value.strip()))
    except ValueError:
        return None


# Beside the Python packages whose jars it records: one per virtualenv (`make cds`).
DEFAULT_CDS_ARCHIVE = Path(sys.prefix) / "share" / "lakehouse-ingest" / "driver-classes.jsa"


def cds_archive(settings: Settings) -> Path | None:
    """The driver JVM's class-data-sharing archive to start with, if there is one.

    Built by ``make cds`` (deploy/local/cds.py) from a real driver run: mapping the
    classes it loaded instead of loading and verifying them again cuts a driver start
    by about a third of its CPU.
    """
    if settings.spark_cds_archive == "":
        return None
    path = Path(settings.spark_cds_archive or DEFAULT_CDS_ARCHIVE)
    return path if path.is_file() else None


def driver_java_options(extra: str, log_config: Path, archive: Path | None) -> str:
    """The driver JVM's options: ``extra`` (``spark.driver.extraJavaOptions``), the JSON
    log configuration and the class-data archive. An archive the JVM cannot use (other
    jars, another JDK) is skipped without a word, so stdout stays JSON lines."""
    options = [extra, f"-Dlog4j2.configurationFile=file:{log_config}"]
    if archive is not None:
        options += [
            f"-XX:SharedArchiveFile={archive}",
            "-Xshare:auto",
            "-Xlog:cds=off",
            "-Xlog:cds+dynamic=off",
        ]
    return " ".join(option for option in options if option)


def build_spark(
    settings: Settings,
    app_name: str = "lakehouse-ingest",
    jvm_log_target: str = "SYSTEM_OUT",
    drain: bool = False,
) -> SparkSession:
    """Create (or return) the process's SparkSession configured for ``settings``, of a
    driver that drains and exits (``drain``) or runs until stopped (`spark_conf`).

    The driver JVM logs JSON lines like the Python side (service/logs.py), to
    ``jvm_log_target`` (``SYSTEM_ERR`` for commands whose stdout is their report).
    """
    conf = spark_conf(settings, drain)
    conf["spark.app.name"] = app_name
    log_config = jvm_log_config(settings.log_format, settings.log_level, target=jvm_log_target)
    archive = cds_archive(settings)
    if archive is None and settings.spark_cds_archive:
        log.warning("cds_archive_missing", path=settings.spark_cds_archive)
    conf["spark.driver.extraJavaOptions"] = driver_java_options(
        conf.get("spark.driver.extraJavaOptions", ""), log_config, archive
    )
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    with _launcher_classpath(local_mode_classpath(settings)):
        relay_to = _STDOUT if jvm_log_target == "SYSTEM_OUT" else _STDERR
        _launch_jvm(conf, relay_to, as_json=settings.log_format == "json")
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN" if settings.log_level in ("DEBUG", "INFO") else "ERROR")
    return spark


def _launch_jvm(conf: dict[str, str], relay_to: int, as_json: bool) -> None:
    """Launch the driver JVM (unless this process has one already) with its stdout read by a
    thread of this process and written to the file descriptor ``relay_to``.

    Log4j writes JSON lines, which pass as they are; anything else the JVM prints (a
    library's own println, such as VACUUM's "Deleted N files", or a thread dump on SIGQUIT)
    becomes one JSON log line per line of text (``as_json``), so the service's output stays
    JSON lines. At exit, this process ends the JVM's stdin, waits for the JVM to end and
    the relay to drain what it still wrote (`_end_jvm`).

    The JVM ignores SIGTERM as PySpark makes it ignore SIGINT: a SIGTERM sent to the whole
    process group (``timeout``, ``kill -- -PGID``, systemd) is the driver's to act on, which
    stops the queries after their batches in flight and then the JVM; the JVM's own
    shutdown hook would stop Spark under them. The JVM still exits when this process does
    (PySpark's gateway ends at the end of its stdin).
    """
    if SparkContext._gateway is not None:
        return
    spark_conf = SparkConf(loadDefaults=False)
    for key, value in conf.items():
        spark_conf.set(key, value)
    popen = java_gateway.Popen  # type: ignore[attr-defined]
    setattr(java_gateway, "Popen", _popen_ignoring_sigterm)  # noqa: B010 (a module's name)
    try:
        gateway = launch_gateway(spark_conf, {"stdout": subprocess.PIPE})  # type: ignore[no-untyped-call]
    finally:
        setattr(java_gateway, "Popen", popen)  # noqa: B010
    SparkContext._ensure_initialized(gateway=gateway, conf=spark_conf)
    relay = threading.Thread(
        target=_relay_lines,
        args=(gateway.proc.stdout, relay_to, as_json),
        name="jvm-stdout",
        daemon=True,
    )
    relay.start()
    atexit.register(_end_jvm, gateway, relay)


def _end_jvm(gateway: Any, relay: threading.Thread) -> None:
    """At exit: shut Py4J's side of the gateway down, close the JVM's stdin (PySpark's
    gateway server exits at its end, running the JVM's shutdown hooks), then wait for the
    JVM and the relay, each at most `_JVM_EXIT_SECONDS`. Registered after PySpark's
    handler, so it runs before that one kills whatever is still alive.

    Shutting Py4J down first matters: its finalizer thread keeps telling the JVM which
    objects Python dropped, and one such call meeting the exiting JVM would log an error
    ("Exception while sending command.") after a clean stop.
    """
    gateway.shutdown()  # logs (at INFO) rather than raises when the JVM is gone already
    proc: subprocess.Popen[bytes] = gateway.proc
    if proc.stdin is not None:
        with contextlib.suppress(OSError):  # the JVM is gone already (a broken pipe)
            proc.stdin.close()
    try:
        proc.wait(timeout=_JVM_EXIT_SECONDS)
    except subprocess.TimeoutExpired:
        return
    relay.join(_JVM_EXIT_SECONDS)


def _popen_ignoring_sigterm(command: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen` for `launch_gateway`: its child runs PySpark's ``preexec_fn`` (which
    ignores SIGINT), then ignores SIGTERM too; the JVM keeps a signal ignored at its start."""
    inner = kwargs.pop("preexec_fn", None)

    def preexec() -> None:
        if inner is not None:
            inner()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    child: subprocess.Popen[bytes] = subprocess.Popen(command, preexec_fn=preexec, **kwargs)
    return child


def _relay_lines(stream: IO[bytes], fd: int, as_json: bool) -> None:
    """Copy ``stream``'s lines to ``fd`` until its end, each line that is not JSON as one."""
    for line in iter(stream.readline, b""):
        if as_json and not line.lstrip().startswith(b"{"):
            text = line.decode(errors="replace").rstrip("\r\n")
            if not text.strip():
                continue
            line = (json.dumps(_console_event(text)) + "\n").encode()
        os.write(fd, line)


def _console_event(text: str) -> dict[str, str]:
    """A line the JVM printed outside log4j, as the JVM's JSON log lines look."""
    return {
        "timestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "level": "info",
        "logger": "stdout",
        "event": text,
        "source": "jvm",
    }


@contextmanager
def _launcher_classpath(jars: list[str]) -> Iterator[None]:
    """Have Spark's launcher append ``jars`` to the JVM's classpath (``SPARK_DIST_CLASSPATH``,
    after Spark's own jars) while the session starts; the variable is restored after, so
    child processes do not inherit it."""
    name = "SPARK_DIST_CLASSPATH"
    inherited = os.environ.get(name)
    present = [p for p in (inherited or "").split(os.pathsep) if p]
    if jars:
        os.environ[name] = os.pathsep.join([*present, *(j for j in jars if j not in present)])
    try:
        yield
    finally:
        if inherited is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = inherited
