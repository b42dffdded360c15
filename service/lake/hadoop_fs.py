"""Small file operations on any Hadoop URI (file://, s3a://) through Spark's JVM."""

from __future__ import annotations

import time
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from service.lake.jvm import java_class


class HadoopFiles:
    """Read, write and list small files with the same FileSystem Spark itself uses."""

    def __init__(self, spark: SparkSession) -> None:
        self._new_path = java_class(spark, "org.apache.hadoop.fs.Path")
        self._io_utils = java_class(spark, "org.apache.commons.io.IOUtils")
        self._conf: Any = spark.sparkContext._jsc.hadoopConfiguration()

    def _path(self, uri: str) -> tuple[Any, Any]:
        path = self._new_path(uri)
        return path.getFileSystem(self._conf), path

    def exists(self, uri: str) -> bool:
        """Whether ``uri`` exists."""
        fs, path = self._path(uri)
        return bool(fs.exists(path))

    def list_names(self, uri: str) -> list[str]:
        """Names of the entries directly under ``uri`` (empty if it does not exist)."""
        fs, path = self._path(uri)
        if not fs.exists(path):
            return []
        return [status.getPath().getName() for status in fs.listStatus(path)]

    def write_text(self, uri: str, text: str) -> None:
        """Create or replace ``uri`` with ``text`` (UTF-8)."""
        fs, path = self._path(uri)
        stream = fs.create(path, True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()

    def read_text(self, uri: str, attempts: int = 5) -> str | None:
        """The UTF-8 content of ``uri``, or None if it does not exist.

        A file replaced while it is read (s3a reports the change) is read again.
        """
        fs, path = self._path(uri)
        attempt = 1
        while True:
            if not fs.exists(path):
                return None
            try:
                stream = fs.open(path)
                try:
                    data = self._io_utils.toByteArray(stream)
                finally:
                    stream.close()
                return bytes(data).decode("utf-8")
            except Py4JJavaError:
                if attempt >= attempts:
                    raise
            time.sleep(0.2 * attempt)
            attempt += 1
