"""A bench script's Spark session: local[2], configured as the service's, on a new lake.

The scripts that measure one piece of the write path without Kafka (``merge_bench``,
``local_fs_bench``, ``gold_write_bench``) start the same session: the service's
configuration (`build_spark`), no UI, errors only in the log, a lake and checkpoints
under a new temporary directory.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pyspark.sql import SparkSession

from service.config import Settings
from service.streaming.session import build_spark


def local_session(prefix: str) -> tuple[Path, Settings, SparkSession]:
    """Return a new temporary root (named ``prefix``…), its settings and their session."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    settings = Settings(
        spark_master="local[2]",
        spark_ui_enabled=False,
        storage_root=str(root),
        checkpoint_root=str(root / "checkpoints"),
    )
    spark = build_spark(settings)
    spark.sparkContext.setLogLevel("ERROR")
    return root, settings, spark
