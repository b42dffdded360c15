"""The driver JVM's options: the JSON log configuration, the class-data archive, the JIT's."""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import SparkSession

from service.config import Settings
from service.streaming.session import DEFAULT_CDS_ARCHIVE, cds_archive, driver_java_options


def test_the_archive_is_the_virtualenv_s_unless_named_or_turned_off(tmp_path: Path) -> None:
    assert DEFAULT_CDS_ARCHIVE == Path(sys.prefix) / "share/lakehouse-ingest/driver-classes.jsa"
    named = tmp_path / "driver.jsa"
    assert cds_archive(Settings(spark_cds_archive=str(named))) is None, "not built: none"
    named.write_bytes(b"archive")
    assert named == cds_archive(Settings(spark_cds_archive=str(named)))
    assert cds_archive(Settings(spark_cds_archive="")) is None


def test_java_options_keep_the_operator_s_and_map_the_archive_quietly() -> None:
    log_config = Path("/run/log4j2.json")
    assert "-Xmx1g -Dlog4j2.configurationFile=file:/run/log4j2.json" == driver_java_options(
        "-Xmx1g", log_config, None
    )
    options = driver_java_options("", log_config, Path("/cache/driver-classes.jsa")).split()
    assert [
        "-Dlog4j2.configurationFile=file:/run/log4j2.json",
        "-XX:SharedArchiveFile=/cache/driver-classes.jsa",
        "-Xshare:auto",
        "-Xlog:cds=off",
        "-Xlog:cds+dynamic=off",
    ] == options


def test_the_driver_leaves_c2_the_hot_code(spark: SparkSession) -> None:
    """The driver JVM runs with C2's thresholds at five times HotSpot's (`jit_options`):
    the flags reach the live JVM, as HotSpot reads them."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    diagnostic = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    expected = {
        "Tier4InvocationThreshold": "25000",
        "Tier4MinInvocationThreshold": "3000",
        "Tier4CompileThreshold": "75000",
        "Tier4BackEdgeThreshold": "200000",
    }
    assert expected == {name: diagnostic.getVMOption(name).getValue() for name in expected}
